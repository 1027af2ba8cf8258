"""Topic administration over gRPC against a real broker: create, list, describe, grow,
delete; every refusal names its problem and changes nothing; topics survive restarts."""
from __future__ import annotations

import pytest

from eos.errors import ErrorCode
from eos.v1 import broker_pb2


def create_topics(stub, *topics, validate_only=False):
    request = broker_pb2.CreateTopicsRequest(validate_only=validate_only, topics=[
        broker_pb2.NewTopic(name=name, num_partitions=partitions, replication_factor=rf, configs=configs)
        for name, partitions, rf, configs in topics])
    return {t.name: t for t in stub.CreateTopics(request, timeout=30).topics}


COORDINATOR_TOPICS = {"__transaction_state", "__consumer_offsets"}  # created by the coordinators


def topic_names(stub, include_internal=False):
    response = stub.Metadata(broker_pb2.MetadataRequest(include_internal=include_internal), timeout=30)
    return sorted(t.name for t in response.topics if t.name not in COORDINATOR_TOPICS)


def test_create_list_describe_delete(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    results = create_topics(stub, ("orders", 3, 1, {"retention.ms": "60000"}), ("events", -1, -1, {}),
                            ("__internal_x", 1, -1, {}))
    assert {name: r.error_code for name, r in results.items()} == {
        "orders": ErrorCode.NONE, "events": ErrorCode.NONE, "__internal_x": ErrorCode.NONE}
    assert topic_names(stub) == ["events", "orders"]
    assert topic_names(stub, include_internal=True) == ["__internal_x", "events", "orders"]

    metadata = stub.Metadata(broker_pb2.MetadataRequest(topics=["orders", "events"]), timeout=30)
    orders, events = metadata.topics
    assert [p.partition for p in orders.partitions] == [0, 1, 2]
    assert len(events.partitions) == 1  # num.partitions default
    assert dict(orders.configs) == {"retention.ms": "60000"} and dict(events.configs) == {}
    for p in orders.partitions:
        assert (p.leader_id, p.leader_epoch, list(p.replica_ids), list(p.isr_ids)) == (0, 0, [0], [0])
    assert [(b.node_id, b.host, b.port) for b in metadata.brokers] == [(0, "127.0.0.1", inprocess_broker.port)]
    assert metadata.controller_id == 0 and metadata.cluster_id

    deleted = stub.DeleteTopics(broker_pb2.DeleteTopicsRequest(names=["orders", "missing"]), timeout=30)
    assert [(t.name, t.error_code) for t in deleted.topics] == [
        ("orders", ErrorCode.NONE), ("missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
    assert topic_names(stub) == ["events"]
    assert not any(p.name.startswith("orders-") for p in inprocess_broker.data_dir.iterdir())
    # the name is free again, and the new topic starts empty
    assert create_topics(stub, ("orders", 1, 1, {}))["orders"].error_code == ErrorCode.NONE


@pytest.mark.parametrize("name, code, words", [
    ("", ErrorCode.INVALID_TOPIC_EXCEPTION, "empty"),
    ("..", ErrorCode.INVALID_TOPIC_EXCEPTION, "cannot be"),
    ("has space", ErrorCode.INVALID_TOPIC_EXCEPTION, "a-zA-Z0-9"),
    ("x" * 250, ErrorCode.INVALID_TOPIC_EXCEPTION, "249"),
    ("dup", ErrorCode.TOPIC_ALREADY_EXISTS, "already exists"),
    ("d.up", ErrorCode.NONE, ""),
])
def test_refused_names(inprocess_broker, name, code, words):
    stub = inprocess_broker.broker_stub()
    create_topics(stub, ("dup", 1, 1, {}))
    result = create_topics(stub, (name, 1, 1, {}))[name]
    assert result.error_code == code
    assert words in result.error_message
    expected = ["dup"] + ([name] if code == ErrorCode.NONE else [])
    assert topic_names(stub) == sorted(expected)


def test_colliding_name_and_bad_configs_change_nothing(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topics(stub, ("a.b", 1, 1, {}))
    results = create_topics(
        stub, ("a_b", 1, 1, {}), ("c1", 1, 1, {"no.such.config": "1"}), ("c2", 1, 1, {"retention.ms": "soon"}),
        ("c3", 1, 1, {"segment.bytes": "1"}), ("c4", 1, 3, {}), ("c5", 1, -7, {}), ("c6", 100000, 1, {}))
    codes = {name: (r.error_code, r.error_message) for name, r in results.items()}
    assert codes["a_b"][0] == ErrorCode.INVALID_TOPIC_EXCEPTION and "collides" in codes["a_b"][1]
    assert codes["c1"][0] == ErrorCode.INVALID_CONFIG and "no.such.config" in codes["c1"][1]
    assert codes["c2"][0] == ErrorCode.INVALID_CONFIG and "retention.ms" in codes["c2"][1]
    assert codes["c3"][0] == ErrorCode.INVALID_CONFIG and "segment.bytes" in codes["c3"][1]
    assert codes["c4"][0] == ErrorCode.INVALID_REPLICATION_FACTOR
    assert codes["c5"][0] == ErrorCode.INVALID_REPLICATION_FACTOR
    assert codes["c6"][0] == ErrorCode.INVALID_PARTITIONS
    assert topic_names(stub) == ["a.b"]
    assert sorted(p.name for p in inprocess_broker.data_dir.iterdir() if p.name[:1] in "ac") == ["a.b-0"]


def test_validate_only_creates_nothing(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    results = create_topics(stub, ("t", 2, 1, {}), ("bad/", 1, 1, {}), validate_only=True)
    assert results["t"].error_code == ErrorCode.NONE
    assert results["bad/"].error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert topic_names(stub) == []


def test_create_partitions_grows_and_never_shrinks(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topics(stub, ("t", 2, 1, {}))
    grow = stub.CreatePartitions(broker_pb2.CreatePartitionsRequest(topics=[
        broker_pb2.NewPartitions(name="t", count=4)]), timeout=30)
    assert grow.topics[0].error_code == ErrorCode.NONE
    for count in (1, 4):
        refused = stub.CreatePartitions(broker_pb2.CreatePartitionsRequest(topics=[
            broker_pb2.NewPartitions(name="t", count=count)]), timeout=30)
        assert refused.topics[0].error_code == ErrorCode.INVALID_PARTITIONS
    unknown = stub.CreatePartitions(broker_pb2.CreatePartitionsRequest(topics=[
        broker_pb2.NewPartitions(name="nope", count=4)]), timeout=30)
    assert unknown.topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    [topic] = stub.Metadata(broker_pb2.MetadataRequest(topics=["t"]), timeout=30).topics
    assert len(topic.partitions) == 4
    # the coordinators' topics never grow: each group's place is its hash modulo their count
    offsets = inprocess_broker.server.registry.get("__consumer_offsets").partition_count
    internal = stub.CreatePartitions(broker_pb2.CreatePartitionsRequest(topics=[
        broker_pb2.NewPartitions(name="__consumer_offsets", count=offsets + 1)]), timeout=30)
    assert internal.topics[0].error_code == ErrorCode.INVALID_PARTITIONS
    assert "internal" in internal.topics[0].error_message
    assert inprocess_broker.server.registry.get("__consumer_offsets").partition_count == offsets


def test_metadata_for_unknown_and_invalid_topics(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    response = stub.Metadata(broker_pb2.MetadataRequest(topics=["nope", "bad name"]), timeout=30)
    assert [(t.name, t.error_code) for t in response.topics] == [
        ("nope", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), ("bad name", ErrorCode.INVALID_TOPIC_EXCEPTION)]
    assert "nope" in response.topics[0].error_message
    assert topic_names(stub) == []  # auto.create.topics.enable is off


def test_auto_create_when_enabled(inprocess_broker_factory):
    handle = inprocess_broker_factory(config={"auto.create.topics.enable": "true", "num.partitions": "3"})
    stub = handle.broker_stub()
    [topic] = stub.Metadata(broker_pb2.MetadataRequest(topics=["fresh"]), timeout=30).topics
    assert topic.error_code == ErrorCode.NONE and len(topic.partitions) == 3


def test_offsets_topic_num_partitions(inprocess_broker_factory):
    """offsets.topic.num.partitions sets the partitions of __consumer_offsets when the broker
    creates it; on a later start with another value the topic keeps the count its data was
    placed with."""
    handle = inprocess_broker_factory(config={"offsets.topic.num.partitions": "3"})
    [topic] = handle.broker_stub().Metadata(broker_pb2.MetadataRequest(topics=["__consumer_offsets"]),
                                            timeout=30).topics
    assert topic.is_internal and len(topic.partitions) == 3
    assert handle.server.group_coordinator.offsets_partitions == 3

    handle.stop()
    handle.config = {"offsets.topic.num.partitions": "7"}
    handle.start()
    [topic] = handle.broker_stub().Metadata(broker_pb2.MetadataRequest(topics=["__consumer_offsets"]),
                                            timeout=30).topics
    assert len(topic.partitions) == 3
    assert handle.server.group_coordinator.offsets_partitions == 3


def test_topics_survive_sigterm_and_kill(broker):
    stub = broker.broker_stub()
    create_topics(stub, ("kept", 3, 1, {"retention.ms": "3600000"}), ("gone", 1, 1, {}))
    stub.DeleteTopics(broker_pb2.DeleteTopicsRequest(names=["gone"]), timeout=30)
    cluster_id = stub.Metadata(broker_pb2.MetadataRequest(), timeout=30).cluster_id

    assert broker.stop() == 0
    for restart in (broker.start, lambda: (broker.kill(), broker.start())):
        restart()
        stub = broker.broker_stub()
        response = stub.Metadata(broker_pb2.MetadataRequest(), timeout=30)
        assert [t.name for t in response.topics] == ["kept"]
        assert len(response.topics[0].partitions) == 3
        assert dict(response.topics[0].configs) == {"retention.ms": "3600000"}
        assert response.cluster_id == cluster_id
    meta = (broker.data_dir / "meta.properties").read_text()
    assert f"cluster.id={cluster_id}" in meta and "node.id=0" in meta and "version=1" in meta

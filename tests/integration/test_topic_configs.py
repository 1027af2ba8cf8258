"""Topic configs on one broker: DescribeConfigs and IncrementalAlterConfigs (kafka-configs.sh
--entity-type topics), through eos.Admin. A change reaches the topic's open logs at once and
survives a restart; every refusal changes nothing."""
from __future__ import annotations

import pytest

import eos
from broker.topic_configs import altered_overrides
from eos.config import TopicConfig
from eos.config_resources import OP_APPEND, OP_DELETE, OP_SET, OP_SUBTRACT, RESOURCE_BROKER, RESOURCE_TOPIC
from eos.errors import EosError, ErrorCode, InvalidConfigError, InvalidRequestError, UnknownTopicOrPartitionError
from eos.v1 import broker_pb2, broker_pb2_grpc


def _alteration(name, op, value=""):
    return broker_pb2.AlterableConfig(name=name, config_operation=op, value=value)


def test_altered_overrides_applies_each_operation_and_validates_the_result():
    defaults = TopicConfig()
    current = {"retention.ms": "1000", "segment.bytes": "4096"}
    after = altered_overrides("t", current, [
        _alteration("retention.ms", OP_SET, "2000"), _alteration("segment.bytes", OP_DELETE),
        _alteration("cleanup.policy", OP_APPEND, "compact")], defaults)
    assert after == {"retention.ms": "2000", "cleanup.policy": "delete,compact"}
    assert current == {"retention.ms": "1000", "segment.bytes": "4096"}      # not touched
    assert altered_overrides("t", after, [_alteration("cleanup.policy", OP_SUBTRACT, "delete")],
                             defaults) == {"retention.ms": "2000", "cleanup.policy": "compact"}
    with pytest.raises(InvalidRequestError, match="duplicate"):
        altered_overrides("t", {}, [_alteration("retention.ms", OP_SET, "1"),
                                    _alteration("retention.ms", OP_DELETE)], defaults)
    with pytest.raises(InvalidConfigError, match="not a list"):
        altered_overrides("t", {}, [_alteration("retention.ms", OP_APPEND, "1")], defaults)
    with pytest.raises(InvalidConfigError, match="unknown topic config 'retention.mss'"):
        altered_overrides("t", {}, [_alteration("retention.mss", OP_SET, "1")], defaults)
    with pytest.raises(InvalidConfigError, match="unknown topic config 'retention.mss'"):
        altered_overrides("t", {}, [_alteration("retention.mss", OP_DELETE)], defaults)
    # an override eos does not know (another tool's) may be deleted, and only that way
    assert altered_overrides("t", {"foreign.key": "x", "retention.ms": "5"}, [_alteration("foreign.key", OP_DELETE)],
                             defaults) == {"retention.ms": "5"}
    with pytest.raises(InvalidConfigError, match="segment.bytes"):
        altered_overrides("t", {}, [_alteration("segment.bytes", OP_SET, "1")], defaults)
    with pytest.raises(InvalidRequestError, match="operation 7"):
        altered_overrides("t", {}, [_alteration("retention.ms", 7, "1")], defaults)
    with pytest.raises(InvalidConfigError, match="internal topic"):
        altered_overrides("__consumer_offsets", {}, [_alteration("cleanup.policy", OP_SET, "delete")], defaults)


def test_describe_names_every_config_with_its_source(inprocess_broker_factory):
    broker = inprocess_broker_factory({"log.retention.ms": "3600000"})
    with eos.Admin(broker.address) as admin:
        admin.create_topic("described", partitions=1, config={"segment.bytes": "1048576"})
        configs = admin.describe_configs("described")
        assert set(configs) == set(TopicConfig().to_kafka_names())
        assert configs["segment.bytes"] == {"value": "1048576", "source": "DYNAMIC_TOPIC_CONFIG",
                                            "read_only": False, "sensitive": False}
        assert configs["retention.ms"]["value"] == "3600000"
        assert configs["retention.ms"]["source"] == "STATIC_BROKER_CONFIG"
        assert configs["cleanup.policy"] == {"value": "delete", "source": "DEFAULT_CONFIG",
                                             "read_only": False, "sensitive": False}
        # only the names asked for; a name the broker does not know is left out
        assert set(admin.describe_configs("described", ["retention.ms", "no.such.config"])) == {"retention.ms"}
        internal = admin.describe_configs("__consumer_offsets", ["cleanup.policy"])
        assert internal["cleanup.policy"]["value"] == "compact"
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.describe_configs("missing")


def test_an_alteration_reaches_the_open_log_at_once(inprocess_broker):
    with eos.Admin(inprocess_broker.address) as admin, eos.Producer(inprocess_broker.address) as producer:
        admin.create_topic("rolled", partitions=1)
        log = inprocess_broker.server.log_manager.get_log("rolled", 0)
        producer.send("rolled", value=b"x" * 600).result(30)
        assert len(log.segments) == 1
        admin.incremental_alter_configs("rolled", set={"segment.bytes": 1024, "retention.ms": 86_400_000},
                                        append={"cleanup.policy": "compact"})
        assert (log.config.segment_bytes, log.config.retention_ms, log.config.cleanup_policy) == (
            1024, 86_400_000, "compact,delete")
        for _ in range(4):       # each 600-byte batch no longer fits beside the last: a roll each
            producer.send("rolled", value=b"x" * 600, key=b"k").result(30)
        assert len(log.segments) == 5
        configs = admin.describe_configs("rolled")
        assert configs["segment.bytes"] == {"value": "1024", "source": "DYNAMIC_TOPIC_CONFIG",
                                            "read_only": False, "sensitive": False}
        admin.incremental_alter_configs("rolled", delete=["segment.bytes"], subtract={"cleanup.policy": "compact"})
        assert (log.config.segment_bytes, log.config.cleanup_policy) == (TopicConfig().segment_bytes, "delete")
        after = admin.describe_configs("rolled")
        assert after["segment.bytes"]["source"] == "DEFAULT_CONFIG"
        assert admin.describe_topic("rolled")["configs"] == {"retention.ms": "86400000", "cleanup.policy": "delete"}


def test_refused_alterations_change_nothing(inprocess_broker):
    with eos.Admin(inprocess_broker.address) as admin:
        admin.create_topic("kept", partitions=1, config={"retention.ms": "5000"})
        before = admin.describe_configs("kept")
        log = inprocess_broker.server.log_manager.get_log("kept", 0)
        refusals = [
            # one bad value: none applied
            (dict(set={"retention.ms": "10", "segment.bytes": "3"}), ErrorCode.INVALID_CONFIG),
            (dict(set={"no.such.config": "1"}), ErrorCode.INVALID_CONFIG),
            (dict(set={"retention.ms": "10"}, delete=["retention.ms"]), ErrorCode.INVALID_REQUEST),
            (dict(append={"retention.ms": "10"}), ErrorCode.INVALID_CONFIG),
            (dict(set={"cleanup.policy": "shred"}), ErrorCode.INVALID_CONFIG),
        ]
        for alteration, code in refusals:
            with pytest.raises(EosError) as refused:
                admin.incremental_alter_configs("kept", **alteration)
            assert refused.value.code == code, (alteration, refused.value)
        admin.incremental_alter_configs("kept", set={"retention.ms": "10"}, validate_only=True)
        assert admin.describe_configs("kept") == before and log.config.retention_ms == 5000
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.incremental_alter_configs("missing", set={"retention.ms": "10"})
        with pytest.raises(InvalidConfigError, match="internal topic"):
            admin.incremental_alter_configs("__consumer_offsets", set={"cleanup.policy": "delete"})
    # the wire: a broker resource is not supported, a topic twice in one request is refused,
    # and each resource is answered on its own
    import grpc
    with grpc.insecure_channel(inprocess_broker.address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        response = stub.IncrementalAlterConfigs(broker_pb2.IncrementalAlterConfigsRequest(resources=[
            broker_pb2.AlterConfigsResource(resource_type=RESOURCE_BROKER, resource_name="1",
                                            configs=[_alteration("log.retention.ms", OP_SET, "1")]),
            broker_pb2.AlterConfigsResource(resource_type=RESOURCE_TOPIC, resource_name="kept",
                                            configs=[_alteration("retention.ms", OP_SET, "7000")]),
        ]))
        assert [r.error_code for r in response.results] == [ErrorCode.INVALID_REQUEST, ErrorCode.NONE]
        twice = stub.IncrementalAlterConfigs(broker_pb2.IncrementalAlterConfigsRequest(resources=[
            broker_pb2.AlterConfigsResource(resource_type=RESOURCE_TOPIC, resource_name="kept",
                                            configs=[_alteration("retention.ms", OP_SET, str(ms))])
            for ms in (8000, 9000)]))
        assert [r.error_code for r in twice.results] == [ErrorCode.INVALID_REQUEST] * 2
    assert log.config.retention_ms == 7000


def test_an_alteration_survives_a_restart(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("lasting", partitions=2)
        admin.incremental_alter_configs("lasting", set={"retention.ms": "123456", "max.message.bytes": "2000"})
    broker.restart()
    with eos.Admin(broker.address) as admin:
        configs = admin.describe_configs("lasting", ["retention.ms", "max.message.bytes"])
        assert {name: entry["value"] for name, entry in configs.items()} == {
            "retention.ms": "123456", "max.message.bytes": "2000"}
    with eos.Producer(broker.address, retries=0) as producer:
        with pytest.raises(EosError) as too_large:       # the reloaded limit holds
            producer.send("lasting", value=b"x" * 3000, partition=0).result(30)
        assert too_large.value.code in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE)


def test_the_cli_alters_and_describes_like_kafka_configs(inprocess_broker, capsys):
    from eos.cli import main as eos_main

    address = inprocess_broker.address
    with eos.Admin(address) as admin:
        admin.create_topic("cli-topic", partitions=1)
    base = ["configs", "--bootstrap-server", address]
    assert eos_main([*base, "--alter", "--entity-type", "topics", "--entity-name", "cli-topic", "--add-config",
                     "retention.ms=86400000,cleanup.policy=[compact,delete]"]) == 0
    assert capsys.readouterr().out.strip() == "Completed updating config for topic cli-topic."
    assert eos_main([*base, "--describe", "--entity-type", "topics", "--entity-name", "cli-topic"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Dynamic configs for topic cli-topic are:",
        "  cleanup.policy=compact,delete sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:cleanup.policy=compact,delete}",
        "  retention.ms=86400000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=86400000}"]
    assert eos_main([*base, "--alter", "--entity-type", "topics", "--entity-name", "cli-topic",
                     "--delete-config", "cleanup.policy"]) == 0
    capsys.readouterr()
    assert eos_main([*base, "--describe", "--entity-type", "topics", "--entity-name", "cli-topic", "--all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "All configs for topic cli-topic are:" and len(lines) == 1 + len(TopicConfig().to_kafka_names())
    assert "  cleanup.policy=delete sensitive=false synonyms={DEFAULT_CONFIG:cleanup.policy=delete}" in lines
    assert eos_main([*base, "--alter", "--entity-type", "topics", "--entity-name", "cli-topic",
                     "--add-config", "retention.mss=1"]) != 0
    assert "INVALID_CONFIG: cannot alter the configs of topic 'cli-topic': unknown topic config 'retention.mss'" in (
        capsys.readouterr().err)


def test_a_brokers_settings_are_described_by_that_broker(inprocess_broker_factory, capsys):
    from eos.cli import main as eos_main

    broker = inprocess_broker_factory({"log.retention.hours": "2", "num.partitions": "3"})
    with eos.Admin(broker.address) as admin:
        configs = admin.describe_broker_configs(0)
        assert configs["num.partitions"] == {"value": "3", "source": "STATIC_BROKER_CONFIG",
                                             "read_only": True, "sensitive": False}
        assert configs["log.retention.ms"]["value"] == "7200000"          # set by its hours form
        assert configs["log.retention.ms"]["source"] == "STATIC_BROKER_CONFIG"
        assert configs["log.segment.bytes"] == {"value": str(TopicConfig().segment_bytes), "source": "DEFAULT_CONFIG",
                                                "read_only": False, "sensitive": False}   # a dynamic one
        assert configs["auto.create.topics.enable"]["value"] == "false"
        assert set(admin.describe_broker_configs(0, ["num.partitions", "nope"])) == {"num.partitions"}
        # a topic's default follows the broker's setting it came from
        admin.create_topic("from-broker", partitions=1)
        assert admin.describe_configs("from-broker", ["retention.ms"])["retention.ms"] == {
            "value": "7200000", "source": "STATIC_BROKER_CONFIG", "read_only": False, "sensitive": False}
    import grpc
    with grpc.insecure_channel(broker.address) as channel:    # another broker's configs: ask that broker
        stub = broker_pb2_grpc.BrokerStub(channel)
        answer = stub.DescribeConfigs(broker_pb2.DescribeConfigsRequest(resources=[
            broker_pb2.ConfigResource(resource_type=RESOURCE_BROKER, resource_name="7"),
            broker_pb2.ConfigResource(resource_type=RESOURCE_TOPIC, resource_name="from-broker",
                                      config_names=["segment.bytes"])]))
        assert [r.error_code for r in answer.results] == [ErrorCode.INVALID_REQUEST, ErrorCode.NONE]
        assert [c.name for c in answer.results[1].configs] == ["segment.bytes"]
        defaults = stub.DescribeConfigs(broker_pb2.DescribeConfigsRequest(resources=[   # the cluster's dynamic
            broker_pb2.ConfigResource(resource_type=RESOURCE_BROKER, resource_name="")]))  # defaults: none
        assert (defaults.results[0].error_code, list(defaults.results[0].configs)) == (ErrorCode.NONE, [])
        altered = stub.IncrementalAlterConfigs(broker_pb2.IncrementalAlterConfigsRequest(resources=[
            broker_pb2.AlterConfigsResource(resource_type=RESOURCE_BROKER, resource_name="0", configs=[
                _alteration("num.partitions", OP_SET, "5")])]))
        assert altered.results[0].error_code == ErrorCode.INVALID_REQUEST
        assert "Cannot update these configs dynamically: ['num.partitions']" in altered.results[0].error_message
    base = ["configs", "--bootstrap-server", broker.address, "--describe", "--entity-type", "brokers"]
    assert eos_main([*base, "--entity-name", "0"]) == 0
    assert capsys.readouterr().out.splitlines() == ["Dynamic configs for broker 0 are:"]
    assert eos_main([*base, "--all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "All configs for broker 0 are:"
    assert "  num.partitions=3 sensitive=false synonyms={STATIC_BROKER_CONFIG:num.partitions=3}" in lines

"""Dynamic broker configs on one broker (kafka-configs --entity-type brokers --alter): the
topic defaults altered while it runs, for every broker (--entity-default) or this one; every
topic without its own override follows at once, the values survive a restart, and every
refusal changes nothing. The cluster's are in tests/cluster/test_cluster_admin.py."""
from __future__ import annotations

import grpc
import pytest

import eos
from broker.dynamic_config import FILE_NAME, TopicDefaultsFollower, altered, effective_defaults, sources, topic_sources
from broker.local_topic_admin import LocalTopicAdmin
from broker.storage.log_manager import LogManager
from broker.topics import TopicRegistry
from eos.config import TopicConfig
from eos.config_resources import (OP_APPEND, OP_DELETE, OP_SET, RESOURCE_BROKER, SOURCE_DYNAMIC_BROKER_CONFIG,
                                  SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG)
from eos.errors import EosError, ErrorCode, InvalidConfigError, InvalidRequestError
from eos.v1 import broker_pb2, broker_pb2_grpc


def _alteration(name, op, value=""):
    return broker_pb2.AlterableConfig(name=name, config_operation=op, value=value)


def test_the_rules_precedence_and_refusals():
    static = TopicConfig.from_overrides({"retention.ms": "7200000"})
    # the broker's own value over the cluster-wide one over the static setting
    assert effective_defaults(static, {}, {}).retention_ms == 7200000
    assert effective_defaults(static, {"log.retention.ms": "60000"}, {}).retention_ms == 60000
    both = effective_defaults(static, {"log.retention.ms": "60000", "log.segment.bytes": "4096"},
                              {"log.retention.ms": "30000"})
    assert (both.retention_ms, both.segment_bytes) == (30000, 4096)
    # other dynamic configs Kafka's tools keep in the same znodes are left alone
    foreign = {"leader.replication.throttled.rate": "1000"}
    assert effective_defaults(static, foreign, {"log.retention.ms": "5"}).retention_ms == 5
    assert sources(foreign, {"log.retention.ms": "5"}) == {"log.retention.ms": ("5", SOURCE_DYNAMIC_BROKER_CONFIG)}
    assert altered(foreign, [_alteration("log.retention.ms", OP_SET, "5")], static) == {
        **foreign, "log.retention.ms": "5"}
    current = {"log.retention.ms": "60000"}
    assert altered(current, [_alteration("log.segment.bytes", OP_SET, "4096"),
                             _alteration("log.retention.ms", OP_DELETE)], static) == {"log.segment.bytes": "4096"}
    assert current == {"log.retention.ms": "60000"}       # not touched
    with pytest.raises(InvalidRequestError, match=r"Cannot update these configs dynamically: \['num.partitions'\]"):
        altered({}, [_alteration("log.retention.ms", OP_SET, "1"), _alteration("num.partitions", OP_SET, "3")], static)
    with pytest.raises(InvalidRequestError, match="only SET and DELETE"):
        altered({}, [_alteration("log.cleanup.policy", OP_APPEND, "compact")], static)
    with pytest.raises(InvalidRequestError, match="more than once"):
        altered({}, [_alteration("log.retention.ms", OP_SET, "1"), _alteration("log.retention.ms", OP_DELETE)], static)
    with pytest.raises(InvalidConfigError, match="log.segment.bytes='3'"):
        altered({}, [_alteration("log.segment.bytes", OP_SET, "3")], static)
    # unclean.leader.election.enable is a dynamic one too (the controller takes it)
    assert altered({}, [_alteration("unclean.leader.election.enable", OP_SET, "true")], static) == {
        "unclean.leader.election.enable": "true"}
    assert effective_defaults(static, {"unclean.leader.election.enable": "true"}, {}).unclean_leader_election_enable
    with pytest.raises(InvalidConfigError, match="unclean.leader.election.enable='maybe'"):
        altered({}, [_alteration("unclean.leader.election.enable", OP_SET, "maybe")], static)


DEFAULT_SOURCE, OWN_SOURCE = SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG, SOURCE_DYNAMIC_BROKER_CONFIG


@pytest.mark.parametrize("static_forms, cluster_default, own, retention_ms, source", [
    ({}, {"log.retention.hours": "2"}, {}, 2 * 3_600_000, DEFAULT_SOURCE),
    ({}, {"log.retention.hours": "2"}, {"log.retention.minutes": "30"}, 30 * 60_000, OWN_SOURCE),
    # Kafka merges name by name, then the spellings' precedence picks: a dynamic .hours does
    # not outrank a static .ms (nor is it the source of the topics' retention.ms), a dynamic
    # .ms outranks a static .hours
    ({"log.retention.ms": "5000"}, {"log.retention.hours": "2"}, {}, 5000, None),
    ({"log.retention.hours": "24"}, {"log.retention.ms": "5000"}, {}, 5000, DEFAULT_SOURCE),
    ({"log.retention.hours": "24"}, {"log.retention.minutes": "-1"}, {}, -1, DEFAULT_SOURCE),
])
def test_the_time_defaults_spellings_merge_before_their_precedence(static_forms, cluster_default, own,
                                                                   retention_ms, source):
    from broker.config import BrokerConfig
    config = BrokerConfig.from_dict(static_forms)
    assert dict(config.time_defaults_given) == static_forms
    defaults = effective_defaults(config.topic_defaults, cluster_default, own, static_forms)
    assert defaults.retention_ms == retention_ms
    assert topic_sources(cluster_default, own, static_forms) == ({} if source is None else {"retention.ms": source})


def test_a_time_default_spelling_the_broker_refuses_changes_nothing():
    static = TopicConfig()
    with pytest.raises(InvalidConfigError, match="log.roll.hours='0'"):
        altered({}, [_alteration("log.roll.hours", OP_SET, "0")], static)
    with pytest.raises(InvalidConfigError, match="log.retention.minutes='soon'"):
        altered({}, [_alteration("log.retention.minutes", OP_SET, "soon")], static)
    assert altered({}, [_alteration("log.roll.hours", OP_SET, "1")], static) == {"log.roll.hours": "1"}
    assert effective_defaults(static, {"log.roll.hours": "1"}, {}).segment_ms == 3_600_000


def test_a_defaults_change_inside_a_topic_alteration_is_not_undone_in_the_open_logs(tmp_path):
    # A topic's alteration writes the registry, then pushes the config to the open logs. A
    # change of the broker defaults landing between the two pushes its own config first; the
    # alteration's push must not then hand the logs a config computed before that change.
    registry = TopicRegistry(tmp_path)
    follower = TopicDefaultsFollower(registry)
    logs = LogManager(str(tmp_path / "logs"))
    logs.load({})
    follower.logs_loaded(logs, {})
    admin = LocalTopicAdmin(registry, logs, node_id=0, notify=lambda tp: None)
    info = registry.prepare_create("t", 1, 1, {})
    logs.create_log("t", 0, info.config)
    registry.commit(info)
    commit = registry.commit

    def commit_then_a_defaults_change(topic):
        stored = commit(topic)
        follower.apply(TopicConfig.from_overrides({"segment.bytes": "4096"}))
        return stored

    registry.commit = commit_then_a_defaults_change
    admin.update_overrides("t", lambda overrides: {**overrides, "retention.ms": "60000"}, False)
    config = logs.get_log("t", 0).config
    assert (config.retention_ms, config.segment_bytes) == (60000, 4096)
    assert registry.get("t").config == config
    logs.shutdown()


def _retention(admin, topic):
    found = admin.describe_configs(topic, ["retention.ms"])["retention.ms"]
    return found["value"], found["source"]


def test_altered_defaults_reach_every_topic_without_an_override_and_survive_a_restart(inprocess_broker_factory):
    broker = inprocess_broker_factory({"log.retention.hours": "2"})
    with eos.Admin(broker.address) as admin:
        admin.create_topic("follows", partitions=1)
        admin.create_topic("own", partitions=1, config={"retention.ms": "1000"})
        assert admin.describe_broker_configs(None) == {}
        admin.alter_broker_configs(None, set={"log.retention.ms": 60000, "log.segment.bytes": 1024})
        assert {k: (v["value"], v["source"]) for k, v in admin.describe_broker_configs(None).items()} == {
            "log.retention.ms": ("60000", "DYNAMIC_DEFAULT_BROKER_CONFIG"),
            "log.segment.bytes": ("1024", "DYNAMIC_DEFAULT_BROKER_CONFIG")}
        assert admin.describe_broker_configs(0, ["log.retention.ms"])["log.retention.ms"] == {
            "value": "60000", "source": "DYNAMIC_DEFAULT_BROKER_CONFIG", "read_only": False, "sensitive": False}
        assert _retention(admin, "follows") == ("60000", "DYNAMIC_DEFAULT_BROKER_CONFIG")
        assert _retention(admin, "own") == ("1000", "DYNAMIC_TOPIC_CONFIG")
        # the open log has it: its segments roll at the new size
        assert broker.server._log_manager.get_log("follows", 0).config.retention_ms == 60000
        with eos.Producer(broker.address, config={"acks": "all"}) as producer:
            for _ in range(3):
                producer.send("follows", value=b"x" * 600).result(30)
        assert len(list((broker.data_dir / "follows-0").glob("*.log"))) >= 3
        # this broker's own value wins over the cluster-wide one; a new topic follows too
        admin.alter_broker_configs(0, set={"log.retention.ms": 30000})
        assert _retention(admin, "follows") == ("30000", "DYNAMIC_BROKER_CONFIG")
        admin.create_topic("later", partitions=1)
        assert _retention(admin, "later") == ("30000", "DYNAMIC_BROKER_CONFIG")
    assert (broker.data_dir / FILE_NAME).exists()

    broker.restart()
    with eos.Admin(broker.address) as admin:
        assert _retention(admin, "follows") == ("30000", "DYNAMIC_BROKER_CONFIG")
        assert broker.server._log_manager.get_log("follows", 0).config.retention_ms == 30000
        assert admin.describe_broker_configs(None)["log.segment.bytes"]["value"] == "1024"
        admin.alter_broker_configs(0, delete=["log.retention.ms"])       # back to the cluster-wide value
        assert _retention(admin, "follows") == ("60000", "DYNAMIC_DEFAULT_BROKER_CONFIG")
        admin.alter_broker_configs(None, delete=["log.retention.ms", "log.segment.bytes"])   # to the static one
        assert _retention(admin, "follows") == ("7200000", "STATIC_BROKER_CONFIG")
        assert broker.server._log_manager.get_log("follows", 0).config.retention_ms == 7200000
        assert admin.describe_broker_configs(None) == {}


def test_a_time_spelling_altered_on_a_running_broker_is_weighed_against_the_static_ones(inprocess_broker_factory):
    """Started with log.retention.ms and log.roll.hours: a dynamic log.retention.hours is
    outranked by the static .ms (the topics keep it, and name the static source), a dynamic
    log.roll.ms outranks the static .hours and the open logs take it."""
    broker = inprocess_broker_factory({"log.retention.ms": "5000000", "log.roll.hours": "2"})
    with eos.Admin(broker.address) as admin:
        admin.create_topic("timed", partitions=1)
        admin.alter_broker_configs(None, set={"log.retention.hours": 1, "log.roll.ms": 60000})
        described = admin.describe_configs("timed", ["retention.ms", "segment.ms"])
        assert (described["retention.ms"]["value"], described["retention.ms"]["source"]) == (
            "5000000", "STATIC_BROKER_CONFIG")
        assert (described["segment.ms"]["value"], described["segment.ms"]["source"]) == (
            "60000", "DYNAMIC_DEFAULT_BROKER_CONFIG")
        config = broker.server._log_manager.get_log("timed", 0).config
        assert (config.retention_ms, config.segment_ms) == (5000000, 60000)
        hours = admin.describe_broker_configs(0, ["log.retention.hours"])["log.retention.hours"]
        assert (hours["value"], hours["source"], hours["read_only"]) == ("1", "DYNAMIC_DEFAULT_BROKER_CONFIG", False)
        admin.alter_broker_configs(None, delete=["log.roll.ms"])      # back to the static .hours
        assert admin.describe_configs("timed", ["segment.ms"])["segment.ms"]["value"] == "7200000"


def test_refused_alterations_change_nothing(inprocess_broker_factory, capsys):
    from eos.cli import main as eos_main

    broker = inprocess_broker_factory()
    with eos.Admin(broker.address) as admin:
        admin.create_topic("steady", partitions=1)
        before = admin.describe_configs("steady")
        with pytest.raises(InvalidRequestError, match="Cannot update these configs dynamically"):
            admin.alter_broker_configs(None, set={"log.retention.ms": 5, "num.io.threads": 4})
        with pytest.raises(InvalidConfigError, match="log.retention.ms='soon'"):
            admin.alter_broker_configs(0, set={"log.retention.ms": "soon"})
        with pytest.raises(EosError, match="broker 7 is not in the cluster's metadata"):
            admin.alter_broker_configs(7, set={"log.retention.ms": 5})
        with grpc.insecure_channel(broker.address) as channel:     # asked of this broker all the same
            answer = broker_pb2_grpc.BrokerStub(channel).IncrementalAlterConfigs(
                broker_pb2.IncrementalAlterConfigsRequest(resources=[broker_pb2.AlterConfigsResource(
                    resource_type=RESOURCE_BROKER, resource_name="7",
                    configs=[_alteration("log.retention.ms", OP_SET, "5")])]))
            assert answer.results[0].error_code == ErrorCode.INVALID_REQUEST
            assert "ask that broker" in answer.results[0].error_message
        admin.alter_broker_configs(None, set={"log.retention.ms": 5}, validate_only=True)
        assert admin.describe_configs("steady") == before
        assert admin.describe_broker_configs(None) == {}
    assert not (broker.data_dir / FILE_NAME).exists()

    base = ["configs", "--bootstrap-server", broker.address]
    assert eos_main([*base, "--alter", "--entity-type", "brokers", "--entity-default",
                     "--add-config", "log.retention.ms=5000"]) == 0
    assert capsys.readouterr().out.splitlines() == ["Completed updating default config for brokers in the cluster."]
    assert eos_main([*base, "--describe", "--entity-type", "brokers", "--entity-default"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Default configs for brokers in the cluster are:",
        "  log.retention.ms=5000 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms=5000}"]
    assert eos_main([*base, "--alter", "--entity-type", "brokers", "--entity-name", "0",
                     "--add-config", "log.segment.bytes=2048"]) == 0
    assert capsys.readouterr().out.splitlines() == ["Completed updating config for broker 0."]
    assert eos_main([*base, "--describe", "--entity-type", "brokers", "--entity-name", "0"]) == 0
    assert capsys.readouterr().out.splitlines() == [      # its own, as kafka-configs lists them
        "Dynamic configs for broker 0 are:",
        "  log.segment.bytes=2048 sensitive=false synonyms={DYNAMIC_BROKER_CONFIG:log.segment.bytes=2048}"]
    assert eos_main([*base, "--describe", "--entity-type", "brokers", "--entity-name", "0", "--all"]) == 0
    assert ("  log.retention.ms=5000 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms=5000}"
            in capsys.readouterr().out.splitlines())
    assert eos_main([*base, "--alter", "--entity-type", "brokers", "--entity-name", "0",
                     "--add-config", "num.partitions=3"]) != 0
    assert "Cannot update these configs dynamically: ['num.partitions']" in capsys.readouterr().err


def test_the_file_read_at_start_keeps_what_eos_does_not_apply_and_a_damaged_one_stops_the_start(
        inprocess_broker_factory, tmp_path):
    import json

    from eos.files import write_json_document

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    # as another tool or version may leave it: a config eos does not apply, beside one it does
    write_json_document(data_dir / FILE_NAME, 1, {"entities": {"<default>": {
        "leader.replication.throttled.rate": "1000", "log.retention.ms": "5000"}}})
    broker = inprocess_broker_factory(data_dir=data_dir)
    with eos.Admin(broker.address) as admin:
        admin.create_topic("t", partitions=1)
        assert _retention(admin, "t") == ("5000", "DYNAMIC_DEFAULT_BROKER_CONFIG")
        admin.alter_broker_configs(None, set={"log.retention.ms": 6000})
    assert json.loads((data_dir / FILE_NAME).read_text())["entities"]["<default>"] == {
        "leader.replication.throttled.rate": "1000", "log.retention.ms": "6000"}
    broker.stop()
    (data_dir / FILE_NAME).write_text("{not json")
    with pytest.raises(InvalidConfigError, match="dynamic-broker-configs.json is damaged"):
        broker.start()

"""Cluster administration on real brokers and a real ZooKeeper: replica assignment, preferred
and unclean elections, partition reassignment under load, and bad input refused with a
named error and nothing changed."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import eos
from eos.errors import (EosError, ErrorCode, InvalidConfigError, InvalidPartitionsError, InvalidReplicaAssignmentError,
                        InvalidReplicationFactorError, NotEnoughReplicasError, UnknownTopicOrPartitionError)
from tests.cluster.test_cluster_failover import (CLUSTER_CONFIG, SteadyProducer, assert_exactly_once_in_order,
                                                 describe, read_all, wait_for_leader)
from tests.integration.test_delete_records import read_from_the_earliest
from tests.waits import wait_for


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory(CLUSTER_CONFIG)


def full_isr(admin, topic):
    return wait_for(lambda: (lambda ps: ps if all(len(p["isr"]) == len(p["replicas"]) and p["leader"] >= 0
                                                  for p in ps) else None)(describe(admin, topic)),
                    f"every partition of {topic} with a leader and a full ISR")


def test_assignment_spreads_leaders_and_refuses_too_many_replicas(cluster):
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("spread", partitions=6, replication_factor=3)
        partitions = full_isr(admin, "spread")
        assert all(sorted(p["replicas"]) == [0, 1, 2] for p in partitions)
        leaders = [p["leader"] for p in partitions]
        assert sorted(leaders.count(b) for b in range(3)) == [2, 2, 2]
        with pytest.raises(InvalidReplicationFactorError, match="larger than available brokers: 3"):
            admin.create_topic("too-many", partitions=1, replication_factor=4)
        assert "too-many" not in admin.list_topics()


def test_offsets_and_producers_asked_of_a_killed_leader_come_from_the_next_one(cluster):
    """ListOffsets and DescribeProducers go to each partition's leader. The leader is killed
    while the admin's metadata still names it: the answer must come from the leader elected
    next, within default.api.timeout.ms, not wait at the dead one's refused port. The
    request timeout is set past the api timeout, so an admin that kept retrying the dead
    broker until its request timeout would run out of time and raise."""
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("asked", partitions=1, replication_factor=3)
        full_isr(admin, "asked")
        with eos.Producer(cluster.bootstrap, config={"enable.idempotence": True, "acks": "all"}) as producer:
            producer.send_batch("asked", [b"v%d" % i for i in range(25)]).result(30)
        leader = describe(admin, "asked")[0]["leader"]
    config = {"request.timeout.ms": 120_000, "default.api.timeout.ms": 60_000}
    tp = eos.TopicPartition("asked", 0)
    with eos.Admin(bootstrap=cluster.bootstrap, config=config) as offsets_admin, \
            eos.Admin(bootstrap=cluster.bootstrap, config=config) as producers_admin:
        # each admin's metadata names the leader now, and each meets it dead first
        assert offsets_admin.list_offsets({tp: "latest"})[tp] == 25
        assert [p["last_sequence"] for p in producers_admin.describe_producers([tp])[tp]] == [24]
        cluster.kill(leader)
        assert offsets_admin.list_offsets({tp: "latest"})[tp] == 25
        assert [p["last_sequence"] for p in producers_admin.describe_producers([tp])[tp]] == [24]
        assert describe(offsets_admin, "asked")[0]["leader"] not in (leader, -1)


def test_preferred_election_puts_leaders_back_after_a_restart(cluster):
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("pref", partitions=3, replication_factor=3)
        before = full_isr(admin, "pref")
        victim = before[0]["replicas"][0]
        led = [p["partition"] for p in before if p["leader"] == victim]
        cluster.kill(victim)
        for partition in led:
            wait_for_leader(admin, "pref", partition, other_than=victim)
        # while the preferred replica is down, a preferred election is refused by name
        results = admin.elect_leaders("preferred", [("pref", led[0])])
        assert results[eos.TopicPartition("pref", led[0])].code == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
        cluster.restart(victim)
        full_isr(admin, "pref")
        results = admin.elect_leaders("preferred", [("pref", p) for p in range(3)])
        for p in range(3):
            error = results[eos.TopicPartition("pref", p)]
            assert error is None or error.code == ErrorCode.ELECTION_NOT_NEEDED, error
        # the election is done; its metadata reaches the brokers right after
        after = wait_for(lambda: (lambda ps: ps if [p["leader"] for p in ps] == [p["replicas"][0] for p in ps]
                                  else None)(describe(admin, "pref")), "the preferred leaders in the metadata")
        assert all(a["leader_epoch"] > b["leader_epoch"] for a, b in zip(after, before) if b["partition"] in led)


def offline_with_only_an_out_of_sync_replica_back(cluster, admin, unclean_by_topic: dict) -> None:
    """One single-partition topic per entry (its unclean.leader.election.enable, None: none of
    its own), leader 1 and follower 2; then broker 2 leaves the ISRs, broker 1 (the last
    in-sync replica) dies, every topic is offline, and broker 2, out of sync, is restarted."""
    # (a manual assignment fixes the places)
    admin.create_topics([{"name": topic, "assignments": {0: [1, 2]},
                          **({} if unclean is None else {"config": {"unclean.leader.election.enable": unclean}})}
                         for topic, unclean in unclean_by_topic.items()])
    for topic in unclean_by_topic:
        assert full_isr(admin, topic)[0]["leader"] == 1
    cluster.kill(2)          # the follower leaves the ISRs ...
    for topic in unclean_by_topic:
        wait_for(lambda: describe(admin, topic)[0]["isr"] == [1], f"{topic}'s ISR without broker 2")
    cluster.kill(1)          # ... then the last in-sync replica dies: all offline
    for topic in unclean_by_topic:
        wait_for(lambda: describe(admin, topic)[0]["leader"] == -1, f"{topic} offline")
    cluster.restart(2)       # an out-of-sync replica is back


def test_unclean_election_is_refused_unless_the_topic_allows_it(cluster):
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        offline_with_only_an_out_of_sync_replica_back(cluster, admin, {"strict": None, "lenient": "true"})
        lenient_now = wait_for(lambda: (lambda p: p if p["leader"] == 2 else None)(describe(admin, "lenient")[0]),
                               "the lenient topic to elect its out-of-sync replica")
        assert lenient_now["isr"] == [2]
        # the new leader says in its log that it may lack acknowledged records (the metadata
        # can reach the broker we asked before broker 2 has applied its LeaderAndIsr: wait)
        wait_for(lambda: re.search(r"lenient-0: leader at epoch \d+ through an UNCLEAN election",
                                   cluster.processes[2].log_path.read_text()),
                 "broker 2 to log its unclean leadership of lenient-0")
        strict_now = describe(admin, "strict")[0]
        assert strict_now["leader"] == -1, strict_now
        results = admin.elect_leaders("unclean", [("strict", 0)])
        assert results[eos.TopicPartition("strict", 0)].code == ErrorCode.POLICY_VIOLATION
        assert "unclean.leader.election.enable" in str(results[eos.TopicPartition("strict", 0)])
        assert describe(admin, "strict")[0]["leader"] == -1
        # turning the flag on for the topic elects at once, as Kafka's controller does
        admin.incremental_alter_configs("strict", set={"unclean.leader.election.enable": True})
        wait_for(lambda: describe(admin, "strict")[0]["leader"] == 2, "strict-0 to elect broker 2 once allowed")


def test_the_cluster_wide_unclean_default_turned_on_elects_the_topics_that_follow_it(cluster):
    """unclean.leader.election.enable as a dynamic broker config (kafka-configs --entity-type
    brokers --entity-default): the controller takes it, and turned on it elects the offline
    partitions of the topics without a value of their own, as Kafka's controller does; a
    topic that says false stays offline."""
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        offline_with_only_an_out_of_sync_replica_back(cluster, admin, {"follows": None, "says-no": "false"})
        # under the static default (false) both stay offline
        wait_for(lambda: 2 in admin.describe_cluster()["brokers"], "broker 2 back in the cluster")
        for topic in ("follows", "says-no"):
            assert describe(admin, topic)[0]["leader"] == -1
        admin.alter_broker_configs(None, set={"unclean.leader.election.enable": True})
        wait_for(lambda: describe(admin, "follows")[0]["leader"] == 2,
                 "follows-0 to elect broker 2 once the cluster-wide default allows it")
        assert describe(admin, "says-no")[0]["leader"] == -1
        found = admin.describe_configs("follows", ["unclean.leader.election.enable"])["unclean.leader.election.enable"]
        assert (found["value"], found["source"]) == ("true", "DYNAMIC_DEFAULT_BROKER_CONFIG")


def test_partitions_added_on_a_cluster_come_online_and_take_records(cluster):
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("growing", partitions=2, replication_factor=2)
        before = full_isr(admin, "growing")
        admin.create_partitions("growing", 3, validate_only=True)
        with pytest.raises(InvalidPartitionsError, match="never shrink"):
            admin.create_partitions("growing", 1)
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.create_partitions("nowhere", 3)
        assert len(describe(admin, "growing")) == 2
        admin.create_partitions("growing", 5)      # answered once the new partitions have leaders
        after = wait_for(lambda: (lambda ps: ps if len(ps) == 5 and all(len(p["isr"]) == 2 for p in ps)
                                  else None)(describe(admin, "growing")), "5 partitions of growing, each in sync")
        assert [p["replicas"] for p in after[:2]] == [p["replicas"] for p in before]
        assert all(len(set(p["replicas"])) == 2 and p["leader"] in p["replicas"] for p in after)
        assert len({p["leader"] for p in after}) > 1       # Kafka's placement spreads them
    with eos.Producer(cluster.bootstrap, config={"acks": "all", "enable.idempotence": True}) as producer:
        for partition in range(5):
            producer.send("growing", value=b"p%d" % partition, partition=partition).result(30)
    records = read_all(cluster.bootstrap, "growing", 5, 5)
    assert sorted((r.partition, r.value) for r in records) == [(p, b"p%d" % p) for p in range(5)]


def test_topic_configs_altered_through_one_broker_reach_every_replica(cluster):
    """Broker 0 is down while the change is made: it learns it when it is back."""
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("tuned", partitions=1, replication_factor=3, config={"retention.ms": "3600000"})
        full_isr(admin, "tuned")
    cluster.kill(0)
    with eos.Admin(bootstrap=cluster.processes[2].address) as admin:
        assert admin.describe_configs("tuned", ["retention.ms"])["retention.ms"]["source"] == "DYNAMIC_TOPIC_CONFIG"
        with pytest.raises(InvalidConfigError, match="segment.bytes"):     # one bad value: nothing applied
            admin.incremental_alter_configs("tuned", set={"segment.bytes": 3, "retention.ms": "1"})
        assert admin.describe_configs("tuned", ["retention.ms"])["retention.ms"]["value"] == "3600000"
        admin.incremental_alter_configs("tuned", set={"segment.bytes": 1024}, delete=["retention.ms"])
        configs = admin.describe_configs("tuned", ["segment.bytes", "retention.ms"])
        assert {k: (v["value"], v["source"]) for k, v in configs.items()} == {
            "segment.bytes": ("1024", "DYNAMIC_TOPIC_CONFIG"), "retention.ms": ("604800000", "DEFAULT_CONFIG")}
    cluster.restart(0)
    with eos.Admin(bootstrap=cluster.processes[2].address) as admin:
        full_isr(admin, "tuned")
    for broker_id, process in cluster.processes.items():     # every broker's metadata has it
        with eos.Admin(bootstrap=process.address) as admin:
            wait_for(lambda: admin.describe_topic("tuned")["configs"] == {"segment.bytes": "1024"},
                     f"broker {broker_id}'s metadata of tuned to hold the new overrides")
    with eos.Producer(cluster.bootstrap, config={"acks": "all"}) as producer:
        for _ in range(4):
            producer.send("tuned", value=b"x" * 600).result(30)
    # each replica, leader and followers, rolls its segments at the new size
    for broker_id, process in cluster.processes.items():
        wait_for(lambda: len(list((process.data_dir / "tuned-0").glob("*.log"))) >= 4,
                 f"broker {broker_id}'s tuned-0 to roll a segment per 600-byte batch")
    # each broker describes its own settings: the admin routes the request to it
    with eos.Admin(bootstrap=cluster.processes[0].address) as admin:
        for broker_id, process in cluster.processes.items():
            settings = admin.describe_broker_configs(broker_id, ["log.dirs", "replica.lag.time.max.ms"])
            assert settings["log.dirs"]["value"] == str(process.data_dir.resolve())
            assert settings["replica.lag.time.max.ms"]["source"] == "STATIC_BROKER_CONFIG"
    # the leader's acks=all check reads the new min.insync.replicas (more than the 3 replicas)
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.incremental_alter_configs("tuned", set={"min.insync.replicas": 4})
    config = {"acks": "all", "enable.idempotence": False, "retries": 0}
    with eos.Producer(cluster.bootstrap, config=config) as producer:
        def refused() -> bool:
            try:
                producer.send("tuned", value=b"y").result(30)
            except NotEnoughReplicasError:
                return True
            return False
        wait_for(refused, "acks=all refused as NOT_ENOUGH_REPLICAS once min.insync.replicas is 4")


def test_dynamic_broker_configs_live_in_zookeeper_and_every_broker_follows_them(cluster):
    """kafka-configs --entity-type brokers --entity-default through broker 1 reaches every
    broker's topics and replica logs (each applies /config/brokers/<default> when notified);
    --entity-name 2 reaches broker 2 only; a broker restarted reads them again."""
    with eos.Admin(bootstrap=cluster.processes[1].address) as admin:
        admin.create_topic("defaults", partitions=1, replication_factor=3)
        full_isr(admin, "defaults")
        admin.alter_broker_configs(None, set={"log.segment.bytes": 1024, "log.retention.ms": 60000})
        admin.alter_broker_configs(2, set={"log.retention.ms": 30000})
    expected = {0: ("60000", "DYNAMIC_DEFAULT_BROKER_CONFIG"), 1: ("60000", "DYNAMIC_DEFAULT_BROKER_CONFIG"),
                2: ("30000", "DYNAMIC_BROKER_CONFIG")}
    for broker_id, process in cluster.processes.items():
        with eos.Admin(bootstrap=process.address) as admin:
            def seen(admin=admin, broker_id=broker_id):
                found = admin.describe_broker_configs(broker_id, ["log.retention.ms"])["log.retention.ms"]
                return (found["value"], found["source"]) == expected[broker_id]
            wait_for(seen, f"broker {broker_id} to apply the dynamic broker configs")
            segment = admin.describe_configs("defaults", ["segment.bytes"])["segment.bytes"]
            assert (segment["value"], segment["source"]) == ("1024", "DYNAMIC_DEFAULT_BROKER_CONFIG")
    with eos.Producer(cluster.bootstrap, config={"acks": "all"}) as producer:
        for _ in range(4):
            producer.send("defaults", value=b"x" * 600).result(30)
    for broker_id, process in cluster.processes.items():     # leader and followers roll at the new size
        wait_for(lambda: len(list((process.data_dir / "defaults-0").glob("*.log"))) >= 4,
                 f"broker {broker_id}'s defaults-0 to roll a segment per 600-byte batch")
    cluster.restart(2)
    with eos.Admin(bootstrap=cluster.processes[2].address) as admin:
        def described():
            try:
                return admin.describe_broker_configs(2, ["log.retention.ms"])["log.retention.ms"]
            except EosError as exc:
                # A restarted broker's metadata names it once the controller's UpdateMetadata
                # has reached it; until then the Admin does not know where broker 2 is.
                if exc.code != ErrorCode.BROKER_NOT_AVAILABLE:
                    raise
                return None
        found = wait_for(described, "broker 2, restarted, in its own metadata")
        assert (found["value"], found["source"]) == ("30000", "DYNAMIC_BROKER_CONFIG")
        admin.alter_broker_configs(None, delete=["log.segment.bytes"])
    for broker_id, process in cluster.processes.items():
        with eos.Admin(bootstrap=process.address) as admin:
            wait_for(lambda admin=admin: admin.describe_configs("defaults", ["segment.bytes"])["segment.bytes"][
                "source"] == "DEFAULT_CONFIG", f"broker {broker_id} to drop the cluster-wide segment size")


def test_reassignment_under_load_loses_nothing(cluster, tmp_path):
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("moving", partitions=1, replication_factor=2, config={"min.insync.replicas": "1"})
        state = full_isr(admin, "moving")[0]
        source = state["replicas"]
        target = [b for b in (0, 1, 2) if b != source[0]][:1] + [b for b in (0, 1, 2) if b not in source]
        target = sorted(set(target))
        assert target != sorted(source)
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": "moving", "partition": 0, "replicas": target}]}))
        with SteadyProducer(cluster.bootstrap, "moving") as producer:
            wait_for(lambda: producer.acked_count() >= 200, "200 acknowledged records")
            cli = [sys.executable, "-m", "eos.cli", "partitions", "reassign", "--bootstrap-server",
                   cluster.bootstrap, "--plan", str(plan)]
            # throttled: the new replica gets at most 1 MB/s while it catches up
            executed = subprocess.run(cli + ["--execute", "--throttle", "1000000"], capture_output=True,
                                      text=True, timeout=60)
            assert executed.returncode == 0, executed.stderr
            wait_for(lambda: subprocess.run(cli + ["--verify"], capture_output=True, text=True,
                                            timeout=60).returncode == 0, "the reassignment to complete", 60)
            at_done = producer.acked_count()
            wait_for(lambda: producer.acked_count() >= at_done + 200, "200 more acknowledged records")
            producer.stop()
        final = describe(admin, "moving")[0]
        assert sorted(final["replicas"]) == target and final["leader"] in target
        assert producer.errors == []
        records = read_all(cluster.bootstrap, "moving", 1, len(producer.acked))
        assert_exactly_once_in_order(records, producer.acked)


def test_bad_plans_and_elections_are_refused_and_change_nothing(cluster):
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("fixed", partitions=2, replication_factor=2)
        before = full_isr(admin, "fixed")
        bad = {
            ("fixed", 0): [0, 0],          # duplicate replica
            ("fixed", 1): [0, 7],          # unknown broker
            ("ghost", 0): [0, 1],          # unknown topic
            ("fixed", 9): [0, 1],          # unknown partition
        }
        results = admin.alter_partition_reassignments(bad)
        assert results[eos.TopicPartition("fixed", 0)].code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
        assert "twice" in str(results[eos.TopicPartition("fixed", 0)])
        assert results[eos.TopicPartition("fixed", 1)].code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
        assert "7" in str(results[eos.TopicPartition("fixed", 1)])
        assert results[eos.TopicPartition("ghost", 0)].code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert results[eos.TopicPartition("fixed", 9)].code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert admin.list_partition_reassignments() == {}
        cancel = admin.alter_partition_reassignments({("fixed", 0): None})
        assert cancel[eos.TopicPartition("fixed", 0)].code == ErrorCode.NO_REASSIGNMENT_IN_PROGRESS
        assert describe(admin, "fixed") == before
        # a manual assignment naming an unknown broker is refused before anything is written
        with pytest.raises(InvalidReplicaAssignmentError):
            admin.create_topics([{"name": "manual", "assignments": {0: [0, 9]}}])
        assert "manual" not in admin.list_topics()


def _log_start_checkpointed(cluster, broker_id: int, topic: str, partition: int) -> int | None:
    path = cluster.processes[broker_id].data_dir / "log-start-offset-checkpoint"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    found = [int(line.split()[2]) for line in lines[2:] if line.split()[:2] == [topic, str(partition)]]
    return found[0] if found else None


def test_deleted_records_are_gone_from_every_replica_and_a_new_leader(cluster):
    """DeleteRecords at the leader is answered once the live followers took the new log start
    (a follower killed just before is not waited for once the controller counts it dead);
    the follower then leads with the same log start, and the killed one takes it when it is
    back."""
    tp = eos.TopicPartition("trim", 0)
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("trim", partitions=1, replication_factor=3, config={"segment.bytes": "4096"})
        partition = full_isr(admin, "trim")[0]
        with eos.Producer(cluster.bootstrap, acks="all", enable_idempotence=True) as producer:
            for start in range(0, 300, 20):
                producer.send_batch("trim", [b"t%04d" % i + b"." * 90 for i in range(start, start + 20)],
                                    partition=0).result(30)
        leader = partition["leader"]
        live_follower, killed_follower = [r for r in partition["replicas"] if r != leader]
        cluster.kill(killed_follower)
        assert admin.delete_records({tp: 150}) == {tp: 150}
        assert _log_start_checkpointed(cluster, live_follower, "trim", 0) == 150
        assert _log_start_checkpointed(cluster, killed_follower, "trim", 0) in (None, 0)   # never checkpointed, or 0

        cluster.kill(leader)
        wait_for_leader(admin, "trim", other_than=leader, timeout_s=60)
        assert describe(admin, "trim")[0]["leader"] == live_follower
        assert admin.list_offsets({tp: "earliest"}) == {tp: 150}
        cluster.restart(killed_follower)
        wait_for(lambda: _log_start_checkpointed(cluster, killed_follower, "trim", 0) == 150,
                 "the restarted follower to take the log start", timeout_s=60)
    assert read_from_the_earliest(cluster.bootstrap, tp) == list(range(150, 300))

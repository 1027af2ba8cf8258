"""A 3-broker cluster on a real ZooKeeper: leader failover, controller failover and fencing,
controlled shutdown, ZooKeeper restarts.

Every test starts its own brokers (real processes on 127.0.0.1) under its own ZooKeeper
chroot, on the module's one ZooKeeper server. Session timeouts are 6 s, as the issue
allows for tests; every wait is bounded.
"""
from __future__ import annotations

import threading
import time
import uuid

import pytest

import eos
from eos.errors import EosError, ErrorCode, TopicAlreadyExistsError
from eos.local_cluster import LocalCluster
from eos.net import open_channel
from eos.records.codec import encode_batch
from eos.v1 import broker_pb2, broker_pb2_grpc, cluster_pb2, cluster_pb2_grpc, group_pb2
from tests.waits import wait_for

SESSION_TIMEOUT_MS = 6000
CLUSTER_CONFIG = {
    "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    "replica.lag.time.max.ms": "10000",
    "controlled.shutdown.retry.backoff.ms": "500",
    "leader.imbalance.check.interval.seconds": "3600",
    "log.retention.check.interval.ms": "1000",
}


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory(CLUSTER_CONFIG)


def describe(admin: eos.Admin, topic: str, timeout_s: float = 30.0) -> list[dict]:
    """The topic's partitions. A retriable error is asked again (bounded): a broker just
    restarted answers UNKNOWN_TOPIC_OR_PARTITION until the controller's UpdateMetadata
    reaches it, as a Kafka broker in ZooKeeper mode does."""
    def known():
        try:
            return admin.describe_topic(topic)["partitions"]
        except EosError as exc:
            if not exc.retriable:
                raise
            return None
    return wait_for(known, f"the metadata of {topic}", timeout_s)


def wait_for_leader(admin, topic, partition=0, *, other_than=None, timeout_s=30.0) -> dict:
    def found():
        try:
            p = describe(admin, topic)[partition]
        except Exception:
            return None
        if p["leader"] < 0 or (other_than is not None and p["leader"] == other_than):
            return None
        return p
    return wait_for(found, f"a leader of {topic}-{partition} other than {other_than}", timeout_s)


def read_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout_s: float = 60.0) -> list:
    consumer = eos.Consumer(bootstrap=bootstrap, group_id=None, isolation_level="read_committed")
    try:
        consumer.assign([eos.TopicPartition(topic, p) for p in range(partitions)])
        for p in range(partitions):
            consumer.seek(eos.TopicPartition(topic, p), 0)
        records = []
        deadline = time.monotonic() + timeout_s
        while len(records) < expected and time.monotonic() < deadline:
            records.extend(consumer.poll(timeout_ms=500))
        return records
    finally:
        consumer.close()


class SteadyProducer:
    """An idempotent acks=all producer sending numbered records until stopped; keeps
    what was acknowledged and every error the application saw."""

    def __init__(self, bootstrap: str, topic: str):
        self.producer = eos.Producer(bootstrap=bootstrap, enable_idempotence=True, acks="all",
                                     linger_ms=1, delivery_timeout_ms=120_000, request_timeout_ms=10_000)
        self.topic = topic
        self.acked: list[int] = []
        self.errors: list[BaseException] = []
        self.sent = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            n = self.sent
            future = self.producer.send(self.topic, value=str(n).encode(), partition=0)
            future.add_done_callback(lambda f, n=n: self._done(f, n))
            self.sent += 1
            time.sleep(0.002)

    def _done(self, future, n):
        with self._lock:
            if future.exception() is None:
                self.acked.append(n)
            else:
                self.errors.append(future.exception())

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def __enter__(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(10)
        self.producer.flush(120)
        self.producer.close()

    def __exit__(self, *exc):
        if not self._stop.is_set():
            self.stop()


def assert_exactly_once_in_order(records, acked: list[int]):
    values = [int(r.value) for r in records]
    assert len(values) == len(set(values)), "a record was written twice"
    assert set(acked) <= set(values), f"acknowledged records missing: {sorted(set(acked) - set(values))[:10]}"
    assert values == sorted(values), "records out of order"


# ---- leader failover ------------------------------------------------------------------------------

@pytest.mark.parametrize("transport", ["grpc", "socket"])
def test_kill_leader_elects_new_leader_from_isr_and_loses_nothing(cluster_factory, transport):
    # socket: every broker also serves socket.transport.port (eos/socket_rpc.py, the default),
    # which the controller's metadata hands to the clients, so the produce streams go over it;
    # grpc: the port turned off (-1)
    cluster = cluster_factory({**CLUSTER_CONFIG, "socket.transport.port": "0" if transport == "socket" else "-1"})
    admin = eos.Admin(bootstrap=cluster.bootstrap)
    admin.create_topic("orders", partitions=1, replication_factor=3, config={"min.insync.replicas": "2"})
    before = wait_for(lambda: (lambda p: p if len(p["isr"]) == 3 else None)(describe(admin, "orders")[0]),
                      "the full ISR")
    with SteadyProducer(cluster.bootstrap, "orders") as producer:
        wait_for(lambda: producer.acked_count() >= 200, "200 acknowledged records")
        socket_ports = {b.node_id: b.socket_port for b in producer.producer._metadata.fetch().brokers}
        assert len(socket_ports) == 3
        if transport == "socket":
            assert all(socket_ports.values()) and len(set(socket_ports.values())) == 3
            assert producer.producer._metadata.socket_routes.channel_count, "the producer's calls went over a socket"
        else:
            assert set(socket_ports.values()) == {0}
        killed_at = time.monotonic()
        cluster.kill(before["leader"])
        after = wait_for_leader(admin, "orders", other_than=before["leader"])
        elected_after_s = time.monotonic() - killed_at
        acked_at_kill = producer.acked_count()
        wait_for(lambda: producer.acked_count() >= acked_at_kill + 200, "200 more acknowledged records")
        producer.stop()
    assert after["leader"] in before["isr"]
    assert after["leader_epoch"] > before["leader_epoch"]
    assert before["leader"] not in after["isr"]
    assert elected_after_s < SESSION_TIMEOUT_MS / 1000 + 1 + 5, elected_after_s   # + detection slack
    assert producer.errors == []
    records = read_all(cluster.bootstrap, "orders", 1, len(producer.acked))
    assert_exactly_once_in_order(records, producer.acked)
    admin.close()
    followed_over_socket = [broker_id for broker_id, proc in cluster.processes.items()
                            if "(socket port " in proc.log_path.read_text(errors="replace")]
    # the followers' Fetch goes over the leader's socket port too (broker/replica/fetcher.py)
    assert len(followed_over_socket) >= (2 if transport == "socket" else 0)
    if transport == "grpc":
        assert followed_over_socket == []


def test_clients_given_only_one_brokers_address_outlive_that_broker(cluster):
    # Kafka's clients use bootstrap.servers only to find the cluster: afterwards any broker
    # they learned of answers Metadata and FindCoordinator. Here the one broker the clients
    # were given leads the topic and coordinates the group, and is killed; the producer,
    # the group member and the admin carry on through the other two. (Before, they asked
    # only the dead address: the producer's records stayed undelivered; and the member kept
    # asking its dead coordinator until its session timed out.)
    admin = eos.Admin(bootstrap=cluster.bootstrap)
    group = "lone-group"

    def group_coordinator():
        try:        # the first lookup creates __consumer_offsets: retried until it has leaders
            return admin._metadata.coordinator_address(group, 10.0, key_type=group_pb2.GROUP)
        except EosError as exc:
            if not exc.retriable:
                raise
            return None
    coordinator_address = wait_for(group_coordinator, f"the coordinator of {group}")
    [victim] = [broker_id for broker_id, proc in cluster.processes.items() if proc.address == coordinator_address]
    others = [broker_id for broker_id in sorted(cluster.processes) if broker_id != victim]
    admin.create_topics([{"name": "lone", "partitions": 1, "replication_factor": 3,
                          "config": {"min.insync.replicas": "2"}, "assignments": {0: [victim, *others]}}])
    wait_for(lambda: (lambda p: p if len(p["isr"]) == 3 and p["leader"] == victim else None)(
        describe(admin, "lone")[0]), f"broker {victim} leading lone-0 with the full ISR")
    only = cluster.processes[victim].address
    lone_admin = eos.Admin(bootstrap=only)
    assert describe(lone_admin, "lone")[0]["leader"] == victim
    consumer = eos.Consumer(bootstrap=only, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
                            session_timeout_ms=45_000)
    consumer.subscribe(["lone"])
    read: set[int] = set()

    def read_at_least(count: int):
        read.update(int(r.value) for r in consumer.poll(timeout_ms=100))
        return len(read) >= count
    try:
        with SteadyProducer(only, "lone") as producer:
            wait_for(lambda: producer.acked_count() >= 100, "100 acknowledged records")
            wait_for(lambda: read_at_least(50), "the group member reading 50 records")
            consumer.commit()
            cluster.kill(victim)
            acked_at_kill = producer.acked_count()
            wait_for(lambda: producer.acked_count() >= acked_at_kill + 200, "200 records acknowledged after the kill")
            producer.stop()
        assert producer.errors == []
        wait_for(lambda: read_at_least(len(producer.acked)), "the member reading every acknowledged record")
        assert set(producer.acked) <= read
        # At the group's new coordinator: a failed Heartbeat or commit looks it up again at
        # once (as Kafka's clients do on a disconnect), not after the 45 s session timeout.
        consumer.commit(timeout_ms=15_000)
        end = consumer.position(eos.TopicPartition("lone", 0))
        assert consumer.committed([eos.TopicPartition("lone", 0)])[eos.TopicPartition("lone", 0)] == end
        assert describe(lone_admin, "lone")[0]["leader"] in others
    finally:
        consumer.close()
        lone_admin.close()
    records = read_all(cluster.bootstrap, "lone", 1, len(producer.acked))
    assert_exactly_once_in_order(records, producer.acked)
    admin.close()


def test_a_consumer_asking_offsets_while_its_partition_has_no_leader_gets_them_once_one_is_back(cluster):
    # Seen in CI's 3-broker demo: the consumer's ListOffsets failed at the dead leader, its
    # refresh cached "no leader" for the partition, and it retried that cached answer, never
    # refreshing again, until default.api.timeout.ms.
    tp = eos.TopicPartition("lonely", 0)
    consumer = eos.Consumer(bootstrap=cluster.bootstrap, group_id=None, default_api_timeout_ms=30_000)
    outcome: dict = {}

    def ask() -> None:
        try:
            outcome["offsets"] = consumer.beginning_offsets([tp])
        except Exception as exc:   # reported below
            outcome["error"] = exc
    try:
        with eos.Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topics([{"name": "lonely", "partitions": 1, "assignments": {0: [1]}}])
            wait_for(lambda: describe(admin, "lonely")[0]["leader"] == 1, "broker 1 leading lonely-0")
            assert consumer.beginning_offsets([tp]) == {tp: 0}       # the consumer caches leader 1
            cluster.kill(1)
            wait_for(lambda: describe(admin, "lonely")[0]["leader"] == -1, "lonely-0 without a leader", 60)
        asking = threading.Thread(target=ask)
        asking.start()
        wait_for(lambda: consumer._metadata.leader("lonely", 0) == -1, "the consumer's metadata without a leader")
        cluster.restart(1)
        asking.join(60)
    finally:
        consumer.close()
    assert outcome == {"offsets": {tp: 0}}, outcome


# ---- controller failover and fencing ------------------------------------------------------------------

def test_controller_failover_bumps_epoch_and_fences_the_old_controller(cluster):
    admin = eos.Admin(bootstrap=cluster.bootstrap)
    first = admin.describe_cluster()["controller_id"]
    old_epoch = _controller_epoch(cluster, first)
    cluster.pause(first)            # SIGSTOP past its session: ZooKeeper expires it
    try:
        survivors = [b for b in cluster.processes if b != first]
        # (wrapped in a list: broker 0 is a valid answer, and wait_for wants a truthy value)
        [new_controller] = wait_for(
            lambda: [c for c in [_controller_seen_by(cluster, survivors[0], exclude=first)] if c is not None],
            "a new controller", timeout_s=SESSION_TIMEOUT_MS / 1000 + 60)
        new_epoch = _controller_epoch(cluster, new_controller)
        assert new_epoch == old_epoch + 1
    finally:
        cluster.resume(first)
    # The old controller woke up, lost its session, re-registered; every broker, the old
    # controller included, hears from the new one ...
    for broker_id in cluster.processes:
        wait_for(lambda: _controller_seen_by(cluster, broker_id) == new_controller,
                 f"broker {broker_id} to learn of controller {new_controller}", timeout_s=30)
    # ... and refuses a request carrying the old epoch.
    for broker_id in cluster.processes:
        response = _leader_and_isr(cluster, broker_id, controller_id=first, controller_epoch=old_epoch)
        assert response.error_code == ErrorCode.STALE_CONTROLLER_EPOCH, broker_id
    admin.close()


def test_a_partition_state_that_moved_under_the_controller_is_read_again_and_the_cluster_goes_on(cluster):
    """A partition state written behind the controller's back (its znode version moves, as
    when a leader's own ISR change races the controller's write) makes the controller's
    next write of it conflict: the controller reads it again and decides again (Kafka's
    retry), and stays the controller. (It once took the conflict for a lost election and
    resigned while keeping /controller: the cluster had no controller ever after, which the
    chaos test found.)"""
    from kazoo.client import KazooClient
    admin = eos.Admin(bootstrap=cluster.bootstrap)
    admin.create_topic("moved", partitions=3, replication_factor=3)
    wait_for(lambda: all(len(p["isr"]) == 3 for p in describe(admin, "moved")), "full ISRs")
    controller = admin.describe_cluster()["controller_id"]
    epoch = _controller_epoch(cluster, controller)
    victim = next(p["leader"] for p in describe(admin, "moved") if p["leader"] != controller)
    zk = KazooClient(hosts=cluster.connect_string)
    zk.start(timeout=10)
    try:
        for partition in range(3):
            path = f"/brokers/topics/moved/partitions/{partition}/state"
            data, _ = zk.get(path)
            zk.set(path, data)          # same content, a newer version
    finally:
        zk.stop()
        zk.close()
    # the controlled shutdown makes the controller move the victim's leaderships: its first
    # writes conflict, the next ones succeed, and the shutdown moves every leadership away
    assert cluster.terminate(victim) == 0
    partitions = describe(admin, "moved")
    assert all(p["leader"] not in (victim, -1) for p in partitions), partitions
    assert admin.describe_cluster()["controller_id"] == controller
    assert _controller_epoch(cluster, controller) == epoch
    cluster.restart(victim)
    wait_for(lambda: all(len(p["isr"]) == 3 for p in describe(admin, "moved")),
             "the restarted broker back in every ISR", timeout_s=60)
    admin.close()


def _controller_seen_by(cluster, broker_id, exclude=None):
    # a probe: short timeouts, so one slow answer does not use up the caller's whole wait
    admin = eos.Admin(bootstrap=cluster.processes[broker_id].address, request_timeout_ms=2000,
                      default_api_timeout_ms=2000)
    try:
        controller = admin.describe_cluster()["controller_id"]
    except Exception:
        return None
    finally:
        admin.close()
    if controller < 0 or controller == exclude:
        return None
    return controller


def _controller_epoch(cluster, broker_id) -> int:
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=cluster.connect_string)
    zk.start(timeout=10)
    try:
        data, _ = zk.get("/controller_epoch")
        return int(data)
    finally:
        zk.stop()
        zk.close()


def _leader_and_isr(cluster, broker_id, *, controller_id, controller_epoch):
    channel = open_channel(cluster.processes[broker_id].address)
    try:
        return cluster_pb2_grpc.ClusterStub(channel).LeaderAndIsr(
            cluster_pb2.LeaderAndIsrRequest(controller_id=controller_id, controller_epoch=controller_epoch),
            timeout=10)
    finally:
        channel.close()


# ---- controlled shutdown --------------------------------------------------------------------------

def test_a_broker_that_no_longer_leads_names_the_new_leader_in_its_refusals(cluster):
    # KIP-951: a Produce or Fetch refused NOT_LEADER_OR_FOLLOWER carries the leader (and its
    # epoch) the refusing broker knows, so a client retries there without asking Metadata.
    admin = eos.Admin(bootstrap=cluster.bootstrap)
    first, second, third = sorted(cluster.processes)
    admin.create_topics([{"name": "hint", "partitions": 1, "replication_factor": 3,
                          "assignments": {0: [first, second, third]}}])
    wait_for(lambda: (lambda p: p if len(p["isr"]) == 3 and p["leader"] == first else None)(
        describe(admin, "hint")[0]), "the full ISR under the first replica")
    tp = eos.TopicPartition("hint", 0)
    assert admin.alter_partition_reassignments({("hint", 0): [second, first, third]}) == {tp: None}
    wait_for(lambda: describe(admin, "hint")[0]["replicas"] == [second, first, third], "the new replica order")
    assert admin.elect_leaders("preferred", [tp]) == {tp: None}
    moved = wait_for(lambda: (lambda p: p if p["leader"] == second else None)(describe(admin, "hint")[0]),
                     "the second replica leading")

    old_leader = broker_pb2_grpc.BrokerStub(open_channel(cluster.processes[first].address))
    produced = old_leader.Produce(broker_pb2.ProduceRequest(acks=1, timeout_ms=10_000, partitions=[
        broker_pb2.PartitionRecords(topic="hint", partition=0, records=encode_batch([b"x"]))]), timeout=10)
    fetched = old_leader.Fetch(broker_pb2.FetchRequest(max_wait_ms=0, max_bytes=1 << 20, partitions=[
        broker_pb2.FetchPartition(topic="hint", partition=0, fetch_offset=0, partition_max_bytes=1 << 20)]),
        timeout=10)
    for refusal in (produced.partitions[0], fetched.partitions[0]):
        assert refusal.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert refusal.HasField("current_leader")
        assert (refusal.current_leader.leader_id, refusal.current_leader.leader_epoch) == (
            second, moved["leader_epoch"])

    # A client that knew the old leader takes the hint in and goes to the new one at once.
    producer = eos.Producer(bootstrap=cluster.bootstrap, acks="all", enable_idempotence=True)
    metadata = producer._metadata
    metadata.refresh_topics(["hint"])
    assert metadata.leader("hint", 0) == second
    stale = metadata.topic("hint")._replace(leaders=(first,), leader_epochs=(moved["leader_epoch"] - 1,))
    metadata._snapshot = metadata._snapshot._replace(topics={**metadata._snapshot.topics, "hint": stale})
    assert metadata.learn_leader("hint", 0, produced.partitions[0].current_leader, first)
    assert metadata.leader("hint", 0) == second and "hint" not in metadata.stale_topics()
    assert producer.send("hint", value=b"after the move").result(30).offset >= 0
    producer.close()
    admin.close()


def test_a_topic_deleted_while_a_replica_is_down_is_deleted_there_too_before_the_name_is_reused(cluster):
    # Found by an exploratory run: deleted at once, the down broker's copy survived and,
    # back, it served the old records inside a new topic of the same name (acknowledged
    # records of the new topic lost, the replicas different for good). As in Kafka, the
    # deletion now waits for the broker, and the name is not free meanwhile.
    from eos.errors import RequestTimedOutError
    admin = eos.Admin(bootstrap=cluster.bootstrap)
    producer = _topic_of_old_records(cluster, admin, "ghost")
    down = describe(admin, "ghost")[0]["replicas"][-1]
    cluster.kill(down)
    wait_for(lambda: down not in describe(admin, "ghost")[0]["isr"], f"broker {down} out of the ISR")

    with pytest.raises(RequestTimedOutError, match="marked for deletion"):
        admin.delete_topic("ghost", timeout_ms=2_000)
    with pytest.raises(TopicAlreadyExistsError, match="marked for deletion"):
        admin.create_topic("ghost", partitions=1, replication_factor=2)
    ghost_dir = cluster.data_dir / f"broker-{down}" / "ghost-0"
    assert ghost_dir.exists()

    cluster.restart(down)
    wait_for(lambda: "ghost" not in admin.list_topics() and not ghost_dir.exists(),
             f"the deletion finished, broker {down}'s copy included")
    # (the name is free once every replica's confirmation reached the controller)
    _name_reused_holds_only_new_records(cluster, admin, producer, "ghost", first_replica=down)
    admin.close()


def test_a_topic_deleted_while_a_replica_is_dead_but_not_yet_noticed_keeps_its_name_until_that_copy_is_gone(cluster):
    # The broker is killed and the topic deleted at once, before its ZooKeeper session ends:
    # the controller still counts it live and sends it StopReplica, which never arrives (the
    # channel drops it when the session ends). Before, the name was freed at once, and the
    # broker, back, served its old copy inside the new topic of that name. Now the name is
    # held until every replica has confirmed it deleted its copy (Kafka's TopicDeletionManager).
    admin = eos.Admin(bootstrap=cluster.bootstrap)
    producer = _topic_of_old_records(cluster, admin, "ghost2")
    # a follower that is not the controller (the deletion is the controller's: killing it
    # would wait for the next one, which learns of the death from ZooKeeper first)
    controller = admin.describe_cluster()["controller_id"]
    state = describe(admin, "ghost2")[0]
    down = next(b for b in reversed(state["replicas"]) if b not in (controller, state["leader"]))
    cluster.kill(down)
    admin.delete_topic("ghost2")                 # at once: the controller still counts it live
    with pytest.raises(TopicAlreadyExistsError, match="marked for deletion"):
        admin.create_topic("ghost2", partitions=1, replication_factor=2)
    ghost_dir = cluster.data_dir / f"broker-{down}" / "ghost2-0"
    assert ghost_dir.exists()
    # its session ends (the StopReplica is dropped with its channel); the name stays taken
    wait_for(lambda: down not in admin.describe_cluster()["brokers"], f"the controller to see broker {down} gone")
    with pytest.raises(TopicAlreadyExistsError, match="marked for deletion"):
        admin.create_topic("ghost2", partitions=1, replication_factor=2)

    cluster.restart(down)                        # registered anew: told again, it deletes its copy
    wait_for(lambda: not ghost_dir.exists(), f"broker {down}'s copy deleted")
    _name_reused_holds_only_new_records(cluster, admin, producer, "ghost2", first_replica=down)
    admin.close()


def _topic_of_old_records(cluster, admin, name: str):
    """A topic of one partition on all three brokers, 50 records acknowledged by all; the
    producer that wrote them (for the topic that reuses the name)."""
    admin.create_topic(name, partitions=1, replication_factor=3)
    wait_for(lambda: len(describe(admin, name)[0]["isr"]) == 3, "the full ISR")
    producer = eos.Producer(bootstrap=cluster.bootstrap, acks="all", enable_idempotence=True)
    for i in range(50):
        producer.send(name, value=f"OLD-{i}".encode(), partition=0)
    producer.flush(30)
    return producer


def _name_reused_holds_only_new_records(cluster, admin, producer, name: str, *, first_replica: int) -> None:
    """Once the name is free: a new topic of it, led by `first_replica` (the broker whose old
    copy is in question), holds the 10 records written to it and nothing of the old topic."""
    replicas = [first_replica, *[b for b in sorted(cluster.processes) if b != first_replica]]
    wait_for(lambda: _created(admin, name, replicas), "the name free again")
    wait_for(lambda: (lambda p: p if len(p["isr"]) == 3 and p["leader"] >= 0 else None)(
        describe(admin, name)[0]), "the new topic's full ISR")
    for i in range(10):
        producer.send(name, value=f"NEW-{i}".encode(), partition=0)
    producer.flush(30)
    producer.close()
    values = [r.value for r in read_all(cluster.bootstrap, name, 1, 10)]
    assert values == [f"NEW-{i}".encode() for i in range(10)]


def _created(admin, name: str, replicas: list[int]) -> bool:
    """Create `name` with one partition on `replicas`; False while the name is still taken."""
    try:
        admin.create_topics([{"name": name, "partitions": 1, "replication_factor": len(replicas),
                              "assignments": {0: replicas}}])
    except TopicAlreadyExistsError:
        return False
    return True


def test_sigterm_moves_leaderships_away_before_exit(cluster):
    admin = eos.Admin(bootstrap=cluster.bootstrap)
    admin.create_topic("moves", partitions=6, replication_factor=3, config={"min.insync.replicas": "2"})
    wait_for(lambda: all(len(p["isr"]) == 3 for p in describe(admin, "moves")), "full ISRs")
    leaders = [p["leader"] for p in describe(admin, "moves")]
    victim = max(set(leaders), key=leaders.count)
    with SteadyProducer(cluster.bootstrap, "moves") as producer:
        wait_for(lambda: producer.acked_count() >= 100, "100 acknowledged records")
        assert cluster.terminate(victim) == 0
        # Leaderships moved during the shutdown, not after a session expiry.
        partitions = describe(admin, "moves")
        assert all(p["leader"] not in (victim, -1) for p in partitions), partitions
        at_exit = producer.acked_count()
        wait_for(lambda: producer.acked_count() >= at_exit + 100, "100 more acknowledged records")
        producer.stop()
    assert producer.errors == []
    records = read_all(cluster.bootstrap, "moves", 1, len(producer.acked))
    assert_exactly_once_in_order(records, producer.acked)
    admin.close()


# ---- ZooKeeper restart ---------------------------------------------------------------------------------

def test_zookeeper_restart_brokers_reregister_and_serve(zookeeper, tmp_path):
    if not hasattr(zookeeper, "restart") and not hasattr(zookeeper, "kill"):
        pytest.fail("the zookeeper fixture must be restartable")
    c = LocalCluster(tmp_path / "cluster", brokers=3, broker_config=dict(CLUSTER_CONFIG),
                     zookeeper_connect=zookeeper.connect_string, chroot=f"/eos-{uuid.uuid4().hex[:8]}")
    c.start()
    try:
        admin = eos.Admin(bootstrap=c.bootstrap)
        admin.create_topic("before", partitions=3, replication_factor=3)
        zookeeper.stop()
        zookeeper.start()
        zookeeper.wait_ready()
        c.wait_ready(timeout_s=60)

        def created():
            try:    # a broker whose session the restart expired answers REQUEST_TIMED_OUT once
                admin.create_topic("after", partitions=3, replication_factor=3)
            except TopicAlreadyExistsError:
                return True     # written before the answer was lost
            except EosError as exc:
                if not exc.retriable:
                    raise
                return False
            return True
        wait_for(created, "the topic created after the restart", 60)
        wait_for(lambda: all(p["leader"] >= 0 and len(p["isr"]) == 3 for p in describe(admin, "after")),
                 "the new topic online with full ISRs", timeout_s=60)
        producer = eos.Producer(bootstrap=c.bootstrap, enable_idempotence=True, acks="all")
        for i in range(50):
            producer.send("before", value=str(i).encode(), partition=i % 3)
        producer.flush(60)
        producer.close()
        records = read_all(c.bootstrap, "before", 3, 50)
        assert sorted(int(r.value) for r in records) == list(range(50))
        admin.close()
    finally:
        c.stop()


def test_sigterm_with_zookeeper_gone_gives_up_the_controlled_shutdown_and_stops(cluster, zookeeper):
    # Found by an exploratory run: asking ZooKeeper for the controller hung the broker for
    # good (kazoo queues the read until ZooKeeper is back) or ended it with ConnectionLoss.
    # As Kafka after controlled.shutdown.max.retries, it now stops without it, and without
    # ZooKeeper coming back: the session is closed before the controller's and the ISR
    # thread's reads are waited for (they held the stop until kazoo gave up). The victim is
    # the controller, whose event thread was one of those readers.
    import signal
    admin = eos.Admin(bootstrap=cluster.bootstrap)
    victim = admin.describe_cluster()["controller_id"]    # its event thread reads ZooKeeper too
    admin.close()
    process = cluster.processes[victim].process
    log_path = cluster.processes[victim].log_path
    zookeeper.stop()
    try:
        process.send_signal(signal.SIGTERM)
        # here 1.5 s of controlled-shutdown retries and 5 s of kazoo's stop; 38 s before the
        # session was closed first (the controller's thread waited for kazoo to give up)
        assert process.wait(25) == 0
    finally:
        zookeeper.start()            # the other brokers' stop in the teardown needs it
        zookeeper.wait_ready()
    log_text = log_path.read_text(errors="replace")
    assert "controlled shutdown did not finish" in log_text
    assert "Traceback" not in log_text


def test_the_brokers_metrics_show_isr_changes_elections_and_the_controller(cluster_factory):
    """Each broker's /metrics (read with prometheus_client's parser) through a follower's
    death and return, then its leader's death."""
    from tests.metrics import scrape

    cluster = cluster_factory({**CLUSTER_CONFIG, "replica.lag.time.max.ms": "2000"}, metrics_base_port=0)
    urls = {broker_id: proc.metrics_url for broker_id, proc in cluster.processes.items()}
    admin = eos.Admin(bootstrap=cluster.bootstrap)
    admin.create_topic("watched", partitions=1, replication_factor=3, config={"min.insync.replicas": "3"})
    full = wait_for(lambda: (lambda p: p if len(p["isr"]) == 3 else None)(describe(admin, "watched")[0]),
                    "the full ISR")
    leader, follower = full["leader"], next(b for b in full["replicas"] if b != full["leader"])
    scrapes = {broker_id: scrape(url) for broker_id, url in urls.items()}
    assert sum(s.value("eos_controller_active_controller") for s in scrapes.values()) == 1
    assert len({s.value("eos_controller_epoch") for s in scrapes.values()}) == 1
    assert scrapes[leader].value("eos_server_leader_partitions") >= 1
    assert scrapes[leader].value("eos_server_under_replicated_partitions") == 0

    cluster.kill(follower)      # the leader drops it from the ISR after replica.lag.time.max.ms
    shrunk = wait_for(lambda: (lambda s: s if s.value("eos_server_isr_shrinks_total") >= 1 else None)(
        scrape(urls[leader])), "the leader's ISR shrink")
    assert shrunk.value("eos_server_under_replicated_partitions") == 1
    assert shrunk.value("eos_server_under_min_isr_partitions") == 1
    cluster.restart(follower)   # it catches up and the leader takes it back
    back = wait_for(lambda: (lambda s: s if s.value("eos_server_isr_expands_total") >= 1 and
                             s.value("eos_server_under_replicated_partitions") == 0 else None)(scrape(urls[leader])),
                    "the leader's ISR expansion")
    assert back.value("eos_server_under_min_isr_partitions") == 0

    survivors = [b for b in urls if b != leader]
    elections_before = sum(scrape(urls[b]).value("eos_controller_leader_elections_total") for b in survivors)
    cluster.kill(leader)
    wait_for_leader(admin, "watched", other_than=leader)
    after = {b: scrape(urls[b]) for b in survivors}
    assert sum(s.value("eos_controller_leader_elections_total") for s in after.values()) > elections_before
    assert sum(s.value("eos_controller_active_controller") for s in after.values()) == 1
    assert sum(s.value("eos_controller_unclean_leader_elections_total") for s in after.values()) == 0
    admin.close()

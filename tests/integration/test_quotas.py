"""Client quotas on a real broker: set with eos.Admin and `eos configs`, kept across a
restart, answered with throttle_time_ms on Produce and Fetch (a throttled fetch comes back
without its records), held by client id and user, and honoured by eos's own producer and
consumer; altering them needs ALTER_CONFIGS on the cluster."""
from __future__ import annotations

import grpc
import pytest

import eos
from broker.server import BrokerServer
from eos.cli import main as eos_main
from eos.errors import ClusterAuthorizationFailedError, EosError, ErrorCode, InvalidConfigError
from eos.net import CLIENT_ID_METADATA_KEY
from eos.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from tests.storage_batches import make_batch
from tests.waits import wait_for

KB = 1024


@pytest.fixture
def broker(tmp_path):
    # Kafka's window is 11 samples of 1 s; 3 of 1 s measure the same way in less test time
    server = BrokerServer(tmp_path / "data", port=0, config={"group.initial.rebalance.delay.ms": "0",
                                                             "quota.window.num": "3"}).start()
    wait_for(lambda: server.txn_coordinator.ready, "the transaction coordinator loaded")
    yield server
    server.stop()


def _produce(stub, topic: str, client_id: str, value_bytes: int):
    request = broker_pb2.ProduceRequest(acks=1, timeout_ms=5000, partitions=[broker_pb2.PartitionRecords(
        topic=topic, partition=0, records=make_batch(1, value_bytes=value_bytes))])
    return stub.Produce(request, timeout=30, metadata=((CLIENT_ID_METADATA_KEY, client_id),))


def _fetch(stub, topic: str, client_id: str, offset: int = 0, max_bytes: int = 50 * 1024 * 1024):
    request = broker_pb2.FetchRequest(max_wait_ms=0, min_bytes=1, max_bytes=max_bytes,
                                      isolation_level=common_pb2.READ_UNCOMMITTED, partitions=[
                                          broker_pb2.FetchPartition(topic=topic, partition=0, fetch_offset=offset,
                                                                    partition_max_bytes=max_bytes)])
    return stub.Fetch(request, timeout=30, metadata=((CLIENT_ID_METADATA_KEY, client_id),))


def test_produce_and_fetch_over_their_quota_are_throttled_and_other_clients_are_not(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("q", partitions=1)
        admin.alter_client_quotas([({"client-id": "slow"}, {"producer_byte_rate": 10 * KB,
                                                            "consumer_byte_rate": 10 * KB})])
    with grpc.insecure_channel(broker.address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        # 10 KB/s over the 2 s minimum span (3 windows of 1 s): 20 KB pass, 40 KB more earn a throttle
        assert _produce(stub, "q", "slow", 15 * KB).throttle_time_ms == 0
        throttled = _produce(stub, "q", "slow", 40 * KB)
        assert throttled.partitions[0].error_code == 0 and throttled.throttle_time_ms > 1_000
        assert _produce(stub, "q", "fast", 300 * KB).throttle_time_ms == 0     # another client id
        assert _produce(stub, "q", "fast", 4 * KB).throttle_time_ms == 0       # offset 3
        # a fetch is cut to what the window allows (20 KB: the first batch only, 15 KB) ...
        first = _fetch(stub, "q", "slow")
        assert first.throttle_time_ms == 0 and 15 * KB < sum(len(p.records) for p in first.partitions) < 20 * KB
        # ... one that would take "slow" over its consumer rate comes back empty, throttled ...
        assert _fetch(stub, "q", "slow", offset=3).throttle_time_ms == 0        # 19 KB of the 20
        fetched = _fetch(stub, "q", "slow", offset=3)
        assert fetched.throttle_time_ms > 0 and all(not p.records for p in fetched.partitions)
        # ... but a batch larger than a whole window is delivered (else never), throttled to pay it back
        whole = _fetch(stub, "q", "slow", offset=1)
        assert whole.throttle_time_ms > 0 and sum(len(p.records) for p in whole.partitions) > 40 * KB
        full = _fetch(stub, "q", "fast")
        assert full.throttle_time_ms == 0 and sum(len(p.records) for p in full.partitions) > 350 * KB


def test_a_call_that_would_need_a_second_hold_is_refused_at_once_and_appends_nothing(broker):
    """A hold occupies a gRPC worker: one per client at a time. Two early calls of a throttled
    client at once: one waits, the other is refused THROTTLING_QUOTA_EXCEEDED, unwritten."""
    import threading
    with eos.Admin(broker.address) as admin:
        admin.create_topic("r", partitions=1)
        admin.alter_client_quotas([({"client-id": "greedy"}, {"producer_byte_rate": 10 * KB})])
    with grpc.insecure_channel(broker.address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        assert _produce(stub, "r", "greedy", 60 * KB).throttle_time_ms > 1_000    # throttled from here on
        answers = []
        callers = [threading.Thread(target=lambda: answers.append(_produce(stub, "r", "greedy", 1 * KB)))
                   for _ in range(2)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(60)
        held, refused = sorted(answers, key=lambda a: a.partitions[0].error_code)
        assert held.partitions[0].error_code == 0
        assert refused.partitions[0].error_code == ErrorCode.THROTTLING_QUOTA_EXCEEDED and refused.throttle_time_ms > 0
    with eos.Admin(broker.address) as admin:
        assert admin.list_offsets({("r", 0): "latest"})[eos.TopicPartition("r", 0)] == 2


def test_eos_clients_honour_their_throttle(broker, monkeypatch):
    """A producer and a consumer with client.id "slow" keep working under a quota the records
    exceed: everything arrives. They wait out their throttles themselves: the broker, which
    holds a request that comes too early, held them for much less than it throttled them."""
    quotas = broker._quotas
    held_s, throttled_ms = [], []

    class RecordingWait:                       # a hold records how long it would wait, and does not
        def wait(self, timeout_s):
            held_s.append(timeout_s)
            return False

        def set(self):
            pass
    monkeypatch.setattr(quotas, "_closing", RecordingWait())
    real_charge = quotas.charge
    monkeypatch.setattr(quotas, "charge",
                        lambda *a, **k: throttled_ms.append(real_charge(*a, **k)) or throttled_ms[-1])
    with eos.Admin(broker.address) as admin:
        admin.create_topic("h", partitions=1)
        admin.alter_client_quotas([({"client-id": "slow"}, {"producer_byte_rate": 100 * KB,
                                                            "consumer_byte_rate": 100 * KB})])
    values = [bytes([i % 256]) * (10 * KB) for i in range(40)]          # 400 KB: past the 200 KB burst
    # requests well under the quota's window (Kafka's advice), so each one fits once the rate allows
    with eos.Producer(broker.address, config={"client.id": "slow", "linger.ms": 5, "batch.size": 64 * KB}) as producer:
        futures = [producer.send("h", value=v) for v in values]
        producer.flush()
        assert all(f.result(timeout=60).offset >= 0 for f in futures)
    # the consumer's default fetch sizes (1 MB a partition) are over the window's 200 KB: the
    # broker cuts each fetch to it, or the consumer would be answered empty for good
    with eos.Consumer(broker.address, config={"client.id": "slow", "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([("h", 0)])
        read = []
        wait_for(lambda: read.extend(r.value for r in consumer.poll(500)) or len(read) >= len(values),
                 "the consumer read everything")
    assert read == values
    assert sum(throttled_ms) > 0, "the quota never throttled: the test proves nothing"
    assert sum(held_s) * 1000 < 0.5 * sum(throttled_ms), (sum(held_s), sum(throttled_ms))


def test_quotas_are_kept_across_a_restart_and_the_cli_alters_and_describes_them(tmp_path, capsys):
    data = tmp_path / "data"
    server = BrokerServer(data, port=0).start()
    try:
        address = server.address
        assert eos_main(["configs", "--bootstrap-server", address, "--alter", "--entity-type", "users",
                         "--entity-name", "alice", "--add-config", "producer_byte_rate=1024,consumer_byte_rate=2048"]) == 0
        assert eos_main(["configs", "--bootstrap-server", address, "--alter", "--entity-type", "users",
                         "--entity-default", "--entity-type", "clients", "--entity-name", "app",
                         "--add-config", "producer_byte_rate=4096"]) == 0
        assert eos_main(["configs", "--bootstrap-server", address, "--alter", "--entity-type", "users",
                         "--entity-name", "alice", "--delete-config", "consumer_byte_rate"]) == 0
        with eos.Admin(address) as admin:      # all or nothing: bob's good entry is not applied either
            with pytest.raises(EosError, match="unknown quota 'request_rate'"):
                admin.alter_client_quotas([({"user": "bob"}, {"producer_byte_rate": 1024}),
                                           ({"user": "alice"}, {"request_rate": 5})])
            with pytest.raises(EosError, match="whole number"):
                admin.alter_client_quotas([({"user": "bob"}, {"producer_byte_rate": 1.5})])
            assert all(entity.get("user") != "bob" for entity, _ in admin.describe_client_quotas())
    finally:
        server.stop()
    server = BrokerServer(data, port=0).start()
    try:
        with eos.Admin(server.address) as admin:
            assert sorted(admin.describe_client_quotas(), key=str) == sorted([
                ({"user": "alice"}, {"producer_byte_rate": 1024.0}),
                ({"user": "<default>", "client-id": "app"}, {"producer_byte_rate": 4096.0})], key=str)
        capsys.readouterr()
        assert eos_main(["configs", "--bootstrap-server", server.address, "--describe", "--entity-type", "users"]) == 0
        out = capsys.readouterr().out
        assert "Quota configs for user-principal 'alice' are producer_byte_rate=1024.0" in out
        assert "user-principal '<default>', client-id 'app' are producer_byte_rate=4096.0" in out
    finally:
        server.stop()
    (data / "client-quotas.json").write_text("{not json")
    with pytest.raises(InvalidConfigError, match="unreadable client quotas"):
        BrokerServer(data, port=0).start()


def test_altering_quotas_needs_alter_configs_on_the_cluster(tmp_path):
    config = {"authorizer.class.name": "eos.AclAuthorizer", "allow.everyone.if.no.acl.found": "false"}
    server = BrokerServer(tmp_path / "data", port=0, config=config).start()
    try:
        with eos.Admin(server.address) as anonymous:
            with pytest.raises(ClusterAuthorizationFailedError):
                anonymous.alter_client_quotas([({"user": "alice"}, {"producer_byte_rate": 1024})])
            with pytest.raises(ClusterAuthorizationFailedError):
                anonymous.describe_client_quotas()
    finally:
        server.stop()


def test_a_request_time_quota_throttles_a_busy_client_and_no_other(broker):
    """request_percentage (KIP-124): a client id whose requests take more than its share of a
    request thread gets throttle_time_ms and its next call held; another client id does not,
    and eos's producer (a produce stream) still delivers every record under the quota."""
    with eos.Admin(broker.address) as admin:
        admin.create_topic("rt", partitions=1)
        admin.alter_client_quotas([({"client-id": "busy"}, {"request_percentage": 0.5}),
                                   ({"client-id": "busy-reader"}, {"request_percentage": 0.5})])
    channel = grpc.insecure_channel(broker.address)
    try:
        stub = broker_pb2_grpc.BrokerStub(channel)
        # 0.5% of one thread over the 2 s minimum span is 10 ms of handler CPU time
        throttles = []
        for _ in range(2000):
            throttles.append(_produce(stub, "rt", "busy", 64 * KB).throttle_time_ms)
            if throttles[-1] > 0:
                break
        assert throttles[-1] > 0, "the busy client was never throttled: the test proves nothing"
        assert throttles[-1] <= 1000                     # capped at one window, as Kafka caps it
        assert all(_produce(stub, "rt", "idle", 64 * KB).throttle_time_ms == 0 for _ in range(20))
        # a consumer's fetches are charged too (only a follower's, is_replica, are not)
        fetch_throttles = []
        for _ in range(2000):
            # 1 MB: how much the busy producer wrote before its throttle depends on the CPU, and
            # a larger answer could pass gRPC's 4 MiB client limit
            fetch_throttles.append(_fetch(stub, "rt", "busy-reader", max_bytes=1024 * 1024).throttle_time_ms)
            if fetch_throttles[-1] > 0:
                break
        assert fetch_throttles[-1] > 0, "fetches were never charged"
    finally:
        channel.close()
    with eos.Producer(broker.address, config={"client.id": "busy", "linger.ms": 0}) as producer:
        futures = [producer.send("rt", value=b"v%d" % i) for i in range(50)]
        producer.flush()
        offsets = [f.result(timeout=30).offset for f in futures]
    assert offsets == list(range(offsets[0], offsets[0] + 50))

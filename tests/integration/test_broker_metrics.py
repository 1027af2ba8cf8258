"""The broker's Prometheus metrics (broker/metrics.py) under a small real workload, read
from its /metrics endpoint with prometheus_client's parser; a storage error logged once per
partition and counted; the gRPC health service NOT_SERVING while the logs load.

The cluster's own figures (ISR shrinks and expands, elections, the active controller) are
tests/cluster/test_cluster_failover.py's."""
from __future__ import annotations

import errno
import logging
import subprocess
import sys
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import eos
from broker.server import BrokerServer
from eos.errors import ErrorCode
from eos.records.codec import encode_batch
from eos.types import TopicPartition
from eos.v1 import broker_pb2, broker_pb2_grpc
from tests.integration.test_broker_produce_fetch import fetch, produce
from tests.metrics import scrape
from tests.waits import wait_for

# Every family the issue names, as the endpoint shows them (counters with their _total).
BROKER_FAMILIES = {
    "eos_network_requests", "eos_network_request_duration_seconds",
    "eos_server_bytes_in", "eos_server_messages_in", "eos_server_bytes_out", "eos_server_messages_out",
    "eos_log_log_start_offset", "eos_log_log_end_offset", "eos_log_high_watermark", "eos_log_last_stable_offset",
    "eos_log_size_bytes", "eos_log_segments", "eos_log_offline_log_directories", "eos_log_storage_errors",
    "eos_server_partitions", "eos_server_leader_partitions", "eos_server_under_replicated_partitions",
    "eos_server_under_min_isr_partitions", "eos_server_isr_shrinks", "eos_server_isr_expands",
    "eos_controller_active_controller", "eos_controller_epoch", "eos_controller_offline_partitions",
    "eos_controller_leader_elections", "eos_controller_unclean_leader_elections",
    "eos_server_purgatory_size",
    "eos_transaction_coordinator_transactions", "eos_transaction_coordinator_markers_pending",
    "eos_transaction_coordinator_completed",
    "eos_group_coordinator_groups", "eos_group_coordinator_rebalances", "eos_group_consumer_lag",
    "eos_log_cleaner_passes", "eos_log_cleaner_bytes_read", "eos_log_cleaner_bytes_written",
    "eos_log_cleaner_recopy_percent", "eos_log_cleaner_last_pass_seconds",
    "eos_server_ready", "process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    broker = BrokerServer(tmp_path_factory.mktemp("metrics-broker"), port=0,
                          config={"metrics.port": "0", "log.retention.check.interval.ms": "3600000",
                                  "group.initial.rebalance.delay.ms": "0", "log.cleaner.backoff.ms": "3600000"})
    broker.start()
    try:
        wait_for(lambda: broker.ready, "the broker to be ready")
        yield broker
    finally:
        broker.stop()


def url_of(server: BrokerServer) -> str:
    return f"http://127.0.0.1:{server.metrics_port}/metrics"


def test_every_metric_appears_and_moves_under_a_produce_and_group_consume_workload(server):
    url = url_of(server)
    admin = eos.Admin(server.address)
    admin.create_topic("m-orders", partitions=2)
    before = scrape(url)
    assert BROKER_FAMILIES <= before.families, sorted(BROKER_FAMILIES - before.families)
    assert before.value("eos_server_ready") == 1

    # produce: 100 idempotent records over two partitions
    with eos.Producer(server.address, enable_idempotence=True) as producer:
        for i in range(100):
            producer.send("m-orders", b"order-%03d" % i, partition=i % 2)
        producer.flush()
    after_produce = scrape(url)
    assert after_produce.value("eos_server_messages_in_total", topic="m-orders") == 100
    assert after_produce.value("eos_server_bytes_in_total", topic="m-orders") > 100 * len(b"order-000")
    for partition in ("0", "1"):
        labels = {"topic": "m-orders", "partition": partition}
        assert after_produce.value("eos_log_log_end_offset", **labels) == 50
        assert after_produce.value("eos_log_high_watermark", **labels) == 50
        assert after_produce.value("eos_log_last_stable_offset", **labels) == 50
        assert after_produce.value("eos_log_size_bytes", **labels) > 0
    produced_requests = (after_produce.total("eos_network_requests_total", request="ProduceStream")
                         + after_produce.total("eos_network_requests_total", request="Produce"))
    assert produced_requests >= 1
    assert after_produce.total("eos_network_request_duration_seconds_count", request="InitProducerId") >= 1

    # a refused request is counted under its error
    with grpc.insecure_channel(server.address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        assert produce(stub, "m-missing", 0, encode_batch([b"x"])).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert scrape(url).value("eos_network_requests_total", request="Produce",
                             error="UNKNOWN_TOPIC_OR_PARTITION") == 1

    # consume in a group, commit part of it: lag against the LSO is what is left
    with eos.Consumer(server.address, group_id="m-group", auto_offset_reset="earliest",
                      fetch_max_wait_ms=100) as consumer:
        consumer.subscribe(["m-orders"])
        records = []
        wait_for(lambda: records.extend(consumer.poll(timeout_ms=200)) or len(records) >= 100, "100 records")
        consumer.commit({TopicPartition("m-orders", 0): 50, TopicPartition("m-orders", 1): 40})
        in_group = scrape(url)
        assert in_group.value("eos_group_coordinator_groups", state="Stable") == 1
        assert in_group.value("eos_group_coordinator_rebalances_total") >= 1
        assert in_group.value("eos_group_consumer_lag", group="m-group", topic="m-orders", partition="0") == 0
        assert in_group.value("eos_group_consumer_lag", group="m-group", topic="m-orders", partition="1") == 10
        assert in_group.value("eos_server_messages_out_total", topic="m-orders") == 100
        assert in_group.value("eos_server_bytes_out_total", topic="m-orders") >= \
            after_produce.value("eos_server_bytes_in_total", topic="m-orders")
        consumer.commit({TopicPartition("m-orders", 1): 50})
        assert scrape(url).value("eos_group_consumer_lag", group="m-group", topic="m-orders", partition="1") == 0
    assert scrape(url).value("eos_group_coordinator_groups", state="Empty") == 1   # the member left
    admin.close()


def test_transactions_and_partition_offsets_move_with_a_transactional_workload(server):
    url = url_of(server)
    admin = eos.Admin(server.address)
    # transactions: one committed, one aborted, one left open (the LSO stays at its start)
    admin.create_topic("m-txn", partitions=1)
    with eos.Producer(server.address, transactional_id="m-tx") as producer:
        producer.init_transactions()
        with producer.transaction():
            producer.send("m-txn", b"kept")
        producer.begin_transaction()
        producer.send("m-txn", b"dropped")
        producer.flush()
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("m-txn", b"open")
        producer.flush()
        open_txn = scrape(url)
        assert open_txn.value("eos_transaction_coordinator_transactions", state="Ongoing") == 1
        assert open_txn.value("eos_transaction_coordinator_completed_total", result="commit") == 1
        assert open_txn.value("eos_transaction_coordinator_completed_total", result="abort") == 1
        labels = {"topic": "m-txn", "partition": "0"}
        # kept, its marker, dropped, its marker, open: the open transaction starts at 4
        assert open_txn.value("eos_log_log_end_offset", **labels) == 5
        assert open_txn.value("eos_log_last_stable_offset", **labels) == 4
        producer.commit_transaction()
    done = scrape(url)
    assert done.value("eos_transaction_coordinator_transactions", state="Ongoing") == 0
    assert done.value("eos_transaction_coordinator_completed_total", result="commit") == 2
    assert done.value("eos_transaction_coordinator_markers_pending") == 0
    assert done.value("eos_log_last_stable_offset", topic="m-txn", partition="0") == 6
    assert done.value("process_resident_memory_bytes") > 0 and done.value("process_open_fds") > 0

    # one broker cannot give a topic two in-sync replicas: it is under its min ISR
    assert done.value("eos_server_under_min_isr_partitions") == 0
    admin.create_topic("m-strict", partitions=1, config={"min.insync.replicas": "2"})
    assert scrape(url).value("eos_server_under_min_isr_partitions") == 1
    admin.close()


def test_a_long_poll_shows_in_the_fetch_purgatory(server):
    url = url_of(server)
    eos.Admin(server.address).create_topic("m-quiet", partitions=1)
    with grpc.insecure_channel(server.address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        waiting = threading.Thread(target=fetch, args=(stub, "m-quiet", 0, 0),
                                   kwargs={"max_wait_ms": 30000, "min_bytes": 1})
        waiting.start()
        try:
            wait_for(lambda: scrape(url).value("eos_server_purgatory_size", delayed_operation="Fetch") == 1,
                     "the long poll in the purgatory")
            assert produce(stub, "m-quiet", 0, encode_batch([b"wake"])).error_code == ErrorCode.NONE
            waiting.join(30)
        finally:
            waiting.join(30)
    assert scrape(url).value("eos_server_purgatory_size", delayed_operation="Fetch") == 0


def test_the_cleaner_reports_its_passes(server):
    url = url_of(server)
    eos.Admin(server.address).create_topic("m-compacted", partitions=1,
                                           config={"cleanup.policy": "compact", "segment.bytes": "1024",
                                                   "min.cleanable.dirty.ratio": "0.01"})
    with eos.Producer(server.address) as producer:
        for i in range(200):
            producer.send("m-compacted", b"v%d" % i, key=b"k%d" % (i % 5))
            producer.flush()         # one small batch each: segments roll
    before = scrape(url)
    assert server.log_cleaner.clean_once() is not None
    after = scrape(url)
    assert after.value("eos_log_cleaner_passes_total") == before.value("eos_log_cleaner_passes_total") + 1
    assert after.value("eos_log_cleaner_bytes_read_total") > after.value("eos_log_cleaner_bytes_written_total") > 0
    assert 0 < after.value("eos_log_cleaner_recopy_percent") < 100


def test_a_full_disk_is_logged_once_per_partition_and_counted(server, monkeypatch, caplog):
    """The issue's case: every produce answered KAFKA_STORAGE_ERROR and nothing logged. The
    disk is broken on purpose: every segment write fails with ENOSPC."""
    from broker.storage import segment

    url = url_of(server)
    eos.Admin(server.address).create_topic("m-full", partitions=2)

    def no_space(fd, buf):
        raise OSError(errno.ENOSPC, "No space left on device")

    with grpc.insecure_channel(server.address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        monkeypatch.setattr(segment, "_write_all", no_space)
        with caplog.at_level(logging.ERROR, logger="eos.broker"):
            for attempt in range(3):
                for partition in (0, 1):
                    result = produce(stub, "m-full", partition, encode_batch([b"x"]))
                    assert result.error_code == ErrorCode.KAFKA_STORAGE_ERROR
                    assert "No space left on device" in result.error_message
        logged = [r.getMessage() for r in caplog.records if "storage error" in r.getMessage()]
        assert len(logged) == 2, logged                     # once per partition, not per request
        assert all("No space left on device" in line for line in logged)
        counted = scrape(url)
        log_dir = str(server.data_dir)
        for partition in ("0", "1"):
            assert counted.value("eos_log_storage_errors_total", topic="m-full", partition=partition,
                                 log_dir=log_dir) == 3
        monkeypatch.undo()                                  # the disk has room again
        assert produce(stub, "m-full", 0, encode_batch([b"y"])).error_code == ErrorCode.NONE
        # it fills up again: partition 0 recovered in between, so it is logged again; 1 was not
        monkeypatch.setattr(segment, "_write_all", no_space)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="eos.broker"):
            for partition in (0, 1):
                assert produce(stub, "m-full", partition, encode_batch([b"z"])).error_code == \
                    ErrorCode.KAFKA_STORAGE_ERROR
        again = [r.getMessage() for r in caplog.records if "storage error" in r.getMessage()]
        assert len(again) == 1 and "m-full-0" in again[0], again
        monkeypatch.undo()

    # the console shows it, from DescribeLogDirs (the dir itself stays online)
    from eos.console import create_app
    with eos.Admin(server.address) as admin:
        [described] = admin.describe_log_dirs()[0].values()
        assert described["error"] is None and described["storage_errors"] == 8
        assert "No space left on device" in described["last_storage_error"]
        page = create_app(admin, hanging_after_ms=60_000).test_client().get("/", follow_redirects=True)
    assert page.status_code == 200
    text = page.get_data(as_text=True)
    assert "8 request(s) answered KAFKA_STORAGE_ERROR" in text and "No space left on device" in text


def test_health_is_not_serving_while_the_logs_load_and_serving_after(tmp_path, monkeypatch):
    """A recovering broker answers its health check NOT_SERVING and every other call
    UNAVAILABLE, then SERVING. The log load is held on purpose, so the test sees the window."""
    from broker.storage.log_dirs import LogDirs

    data_dir = tmp_path / "recovering"
    with BrokerServer(data_dir, port=0) as first:
        eos.Admin(first.address).create_topic("h-big", partitions=1)
        with grpc.insecure_channel(first.address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            for _ in range(20):
                assert produce(stub, "h-big", 0, encode_batch([b"r" * 1000] * 50)).error_code == ErrorCode.NONE

    loading, release = threading.Event(), threading.Event()
    real_load = LogDirs.load

    def held_load(self, *args, **kwargs):
        loading.set()
        release.wait(60)
        return real_load(self, *args, **kwargs)

    monkeypatch.setattr(LogDirs, "load", held_load)
    second = BrokerServer(data_dir, port=0)
    starting = threading.Thread(target=second.start)
    starting.start()
    try:
        assert loading.wait(30), "the broker never began loading its logs"
        address = second.address
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
                health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.RpcError) as refused:
                broker_pb2_grpc.BrokerStub(channel).Metadata(broker_pb2.MetadataRequest(), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and "starting" in refused.value.details()
            cli = subprocess.run([sys.executable, "-m", "eos.cli", "broker", "health", "--bootstrap-server", address],
                                 capture_output=True, text=True, timeout=60)
            assert cli.returncode == 1 and "NOT_SERVING" in cli.stdout, cli
            release.set()
            starting.join(60)
            wait_for(lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=5).status ==
                     health_pb2.HealthCheckResponse.SERVING, "health SERVING")
            assert health.Check(health_pb2.HealthCheckRequest(service="eos.v1.Broker"), timeout=5).status == \
                health_pb2.HealthCheckResponse.SERVING
            stub = broker_pb2_grpc.BrokerStub(channel)
            assert fetch(stub, "h-big", 0, 0).error_code == ErrorCode.NONE
            cli = subprocess.run([sys.executable, "-m", "eos.cli", "broker", "health", "--bootstrap-server", address],
                                 capture_output=True, text=True, timeout=60)
            assert cli.returncode == 0 and f"{address}: SERVING" in cli.stdout, cli
    finally:
        release.set()
        starting.join(60)
        second.stop()


def test_a_scrape_answers_while_the_group_coordinator_loads(tmp_path, monkeypatch):
    """The offsets replay holds the group coordinator's lock for its whole length; a scrape
    in that window answers at once (not ready, no groups) instead of waiting it out."""
    from broker.group.coordinator import GroupCoordinator

    loading, release = threading.Event(), threading.Event()
    real_load = GroupCoordinator._load_everything

    def held_load(self):
        loading.set()
        release.wait(60)
        return real_load(self)

    monkeypatch.setattr(GroupCoordinator, "_load_everything", held_load)
    broker = BrokerServer(tmp_path / "slow-groups", port=0, config={"metrics.port": "0"})
    starting = threading.Thread(target=broker.start)
    starting.start()
    try:
        assert loading.wait(30), "the group coordinator never began loading"
        during = scrape(f"http://127.0.0.1:{broker.metrics_port}/metrics")      # urlopen's 10 s bound
        assert during.value("eos_server_ready") == 0
        assert during.value("eos_group_coordinator_groups", state="Stable") == 0
        release.set()
        starting.join(60)
        wait_for(lambda: broker.ready, "the broker to be ready")
        assert scrape(f"http://127.0.0.1:{broker.metrics_port}/metrics").value("eos_server_ready") == 1
    finally:
        release.set()
        starting.join(60)
        broker.stop()

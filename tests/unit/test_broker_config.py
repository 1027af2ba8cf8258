"""BrokerConfig.from_dict: Kafka's broker names parsed into typed settings; a bad value or
an unknown name is an error that names it, never a silent default."""
from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from eos.errors import InvalidConfigError


def test_defaults():
    config = BrokerConfig.from_dict(None)
    assert config.offsets_topic_num_partitions == 50
    assert config.transaction_state_log_num_partitions == 50
    assert config.transaction_max_timeout_ms == 900_000
    assert config.transactional_id_expiration_ms == 604_800_000


@pytest.mark.parametrize("name, raw, attribute, value", [
    ("offsets.topic.num.partitions", "3", "offsets_topic_num_partitions", 3),
    ("offsets.topic.num.partitions", " 1 ", "offsets_topic_num_partitions", 1),
    ("transaction.state.log.num.partitions", "5", "transaction_state_log_num_partitions", 5),
    ("num.partitions", "4", "num_partitions", 4),
    ("transaction.max.timeout.ms", "30000", "transaction_max_timeout_ms", 30000),
    ("transactional.id.expiration.ms", "3600000", "transactional_id_expiration_ms", 3600000),
])
def test_values_are_parsed(name, raw, attribute, value):
    assert getattr(BrokerConfig.from_dict({name: raw}), attribute) == value


@pytest.mark.parametrize("name, raw, words", [
    ("offsets.topic.num.partitions", "0", "must be >= 1"),
    ("offsets.topic.num.partitions", "-2", "must be >= 1"),
    ("offsets.topic.num.partitions", "many", "not an integer"),
    ("offsets.topics.num.partitions", "3", "unknown broker config"),
])
def test_bad_values_name_the_problem(name, raw, words):
    with pytest.raises(InvalidConfigError) as raised:
        BrokerConfig.from_dict({name: raw})
    assert words in str(raised.value) and name in str(raised.value)



def test_the_coordinator_refuses_timeouts_over_transaction_max_timeout_ms(tmp_path):
    import grpc
    from broker.server import BrokerServer
    from eos.errors import ErrorCode
    from eos.v1 import txn_pb2, txn_pb2_grpc
    import time

    with BrokerServer(tmp_path, port=0, config={"transaction.max.timeout.ms": "30000"}) as server:
        deadline = time.monotonic() + 30
        while not server.txn_coordinator.ready:       # it loads its log after the server is up
            assert time.monotonic() < deadline, "the transaction coordinator did not load in 30 s"
            time.sleep(0.05)
        with grpc.insecure_channel(server.address) as channel:
            stub = txn_pb2_grpc.TxnCoordinatorStub(channel)
            def init(timeout_ms):
                return stub.InitProducerId(txn_pb2.InitProducerIdRequest(
                    transactional_id="t", transaction_timeout_ms=timeout_ms, producer_id=-1, producer_epoch=-1),
                    timeout=30).error_code
            assert init(30001) == ErrorCode.INVALID_TRANSACTION_TIMEOUT
            assert init(30000) == ErrorCode.NONE


HOUR_MS = 3_600_000


@pytest.mark.parametrize("settings, retention_ms, segment_ms", [
    ({}, 604_800_000, 604_800_000),                                       # Kafka's 168 hours
    ({"log.retention.hours": "1"}, HOUR_MS, 604_800_000),
    ({"log.retention.minutes": "30", "log.retention.hours": "5"}, 1_800_000, 604_800_000),
    ({"log.retention.ms": "1234", "log.retention.minutes": "30", "log.retention.hours": "5"}, 1234, 604_800_000),
    ({"log.retention.hours": "-1"}, -1, 604_800_000),                      # forever
    ({"log.retention.minutes": "-1", "log.retention.hours": "2"}, -1, 604_800_000),
    ({"log.roll.hours": "2"}, 604_800_000, 2 * HOUR_MS),
    ({"log.roll.ms": "500", "log.roll.hours": "2"}, 604_800_000, 500),
])
def test_time_defaults_follow_kafkas_precedence(settings, retention_ms, segment_ms):
    defaults = BrokerConfig.from_dict(settings).topic_defaults
    assert (defaults.retention_ms, defaults.segment_ms) == (retention_ms, segment_ms)


@pytest.mark.parametrize("name, raw", [
    ("log.retention.hours", "an hour"), ("log.roll.hours", "0"), ("log.retention.minutes", "-7"),
])
def test_an_outranked_time_form_is_still_validated(name, raw):
    with pytest.raises(InvalidConfigError) as raised:
        BrokerConfig.from_dict({"log.retention.ms": "1000", "log.roll.ms": "1000", name: raw})
    assert name in str(raised.value)


def test_log_retention_check_interval_ms_is_parsed():
    assert BrokerConfig.from_dict({"log.retention.check.interval.ms": "250"}).log_retention_check_interval_ms == 250


def test_log_retention_hours_deletes_a_segment_older_than_an_hour(tmp_path):
    from broker.storage import LogManager
    from tests.storage_batches import make_batch
    now = [0]
    manager = LogManager(str(tmp_path), now_ms_fn=lambda: now[0])
    manager.load({})
    defaults = BrokerConfig.from_dict({"log.retention.hours": "1", "log.roll.hours": "1",
                                       "log.segment.delete.delay.ms": "0"}).topic_defaults
    log = manager.create_log("events", 0, defaults)
    log.append_as_leader(make_batch(1, timestamp_ms=0), now_ms=0)
    # log.roll.hours=1: the next append, an hour on, starts a new segment
    log.append_as_leader(make_batch(1, timestamp_ms=HOUR_MS + 1), now_ms=HOUR_MS + 1)
    assert [s.base_offset for s in log.segments] == [0, 1]
    manager.run_housekeeping(now_ms=HOUR_MS)            # the first segment is exactly an hour old
    assert log.log_start_offset == 0
    manager.run_housekeeping(now_ms=HOUR_MS + 1)        # ... and now older than an hour
    assert log.log_start_offset == 1


def test_thread_settings_size_the_rpc_pool_and_its_queue():
    from broker import server
    held = (server.FETCH_WAITERS_MAX + server.GROUP_PARKED_REQUESTS_MAX + server.PRODUCE_STREAMS_MAX
            + server.TXN_PARKED_REQUESTS_MAX)
    assert server.rpc_pool_limits(BrokerConfig.from_dict({})) == (held + 16, held + 16 + 500)
    config = BrokerConfig.from_dict({"num.io.threads": "4", "queued.max.requests": "20"})
    assert server.rpc_pool_limits(config) == (held + 4, held + 24)


@pytest.mark.parametrize("name, raw, words", [
    ("num.io.threads", "0", "must be between 1 and 1024"),
    ("queued.max.requests", "0", "must be >= 1"),
    ("num.network.threads", "3", "gRPC's C core does the network I/O"),
])
def test_thread_settings_refuse_what_eos_cannot_do(name, raw, words):
    with pytest.raises(InvalidConfigError, match=words):
        BrokerConfig.from_dict({name: raw})


def test_a_call_beyond_the_servers_queue_is_a_retriable_error():
    # A real gRPC server with room for one call at a time, as a broker's pool is bounded by
    # rpc_pool_limits: the second concurrent call is refused before any handler runs.
    import threading
    from concurrent import futures

    import grpc

    from eos import net

    release = threading.Event()
    entered = threading.Event()

    def hold(request, context):
        entered.set()
        release.wait(30)
        return request

    handler = grpc.method_handlers_generic_handler("t.T", {"Hold": grpc.unary_unary_rpc_method_handler(hold)})
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler],
                              maximum_concurrent_rpcs=1)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/t.T/Hold")
            first = call.future(b"a", timeout=30)
            assert entered.wait(30)
            with pytest.raises(grpc.RpcError) as refused:
                call(b"b", timeout=30)
            error = net.error_from_rpc(refused.value, "Produce")
            release.set()
            assert first.result(30) == b"a"
        assert error.retriable and "queued.max.requests" in str(error)
    finally:
        release.set()
        grpc_server.stop(0)


def test_log_dirs_wins_over_log_dir_in_either_order():
    for settings in ({"log.dirs": "/a,/b", "log.dir": "/c"}, {"log.dir": "/c", "log.dirs": "/a,/b"}):
        assert BrokerConfig.from_dict(settings).log_dirs == ("/a", "/b")
    assert BrokerConfig.from_dict({"log.dir": "/c"}).log_dirs == ("/c",)


def test_described_settings_hold_the_values_in_force():
    from broker.config import describe_settings

    given = {"log.retention.hours": "2", "allow.plaintext.remote": " TRUE ", "num.partitions": "4"}
    described = describe_settings(BrokerConfig.from_dict(given), given, ["/data", "/disk2"])
    assert described["log.retention.ms"] == ("7200000", True)       # the winning form, in ms
    assert described["log.retention.hours"] == ("2", True) and described["log.retention.minutes"] == (None, False)
    assert described["allow.plaintext.remote"] == ("true", True)    # as the broker reads it
    assert described["num.partitions"] == ("4", True) and described["log.segment.bytes"][1] is False
    assert described["log.dirs"] == ("/data,/disk2", False)
    assert described["sasl.enabled.mechanisms"] == ("SCRAM-SHA-256,SCRAM-SHA-512", False)

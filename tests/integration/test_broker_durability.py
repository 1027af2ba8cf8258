"""A real broker process stopped with SIGTERM and killed with kill -9: topics, data and
producer ids survive; acknowledged records are there once, in order; a torn tail, lost
indexes and stray logs are dealt with at start; a second broker cannot share a data dir."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

from eos.errors import ErrorCode
from eos.records.codec import encode_batch, iter_decoded
from eos.v1 import broker_pb2, txn_pb2

from tests.conftest import REPO_ROOT, BrokerProcess


def create_topic(stub, name, partitions=1, **configs):
    [result] = stub.CreateTopics(broker_pb2.CreateTopicsRequest(topics=[
        broker_pb2.NewTopic(name=name, num_partitions=partitions, configs=configs)]), timeout=30).topics
    assert result.error_code == ErrorCode.NONE, result.error_message


def produce(stub, topic, partition, values, acks=-1):
    [result] = stub.Produce(broker_pb2.ProduceRequest(acks=acks, partitions=[
        broker_pb2.PartitionRecords(topic=topic, partition=partition, records=encode_batch(values))]),
        timeout=30).partitions
    assert result.error_code == ErrorCode.NONE, result.error_message
    return result.base_offset


def read_all(stub, topic, partition):
    values, offset = [], 0
    while True:
        [result] = stub.Fetch(broker_pb2.FetchRequest(partitions=[
            broker_pb2.FetchPartition(topic=topic, partition=partition, fetch_offset=offset)]), timeout=30).partitions
        assert result.error_code == ErrorCode.NONE, result.error_message
        records = [r for r in iter_decoded(result.records, topic, partition) if r.offset >= offset]
        assert [r.offset for r in records] == list(range(offset, offset + len(records)))
        values += [r.value for r in records]
        offset += len(records)
        if offset >= result.high_watermark:
            return values


def new_producer_ids(stub, count):
    ids = []
    for _ in range(count):
        response = stub.InitProducerId(txn_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1), timeout=30)
        assert response.error_code == ErrorCode.NONE and response.producer_epoch == 0
        ids.append(response.producer_id)
    return ids


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "kill-9"])
def test_data_survives_restart(broker, crash):
    stub = broker.broker_stub()
    create_topic(stub, "d", 3, **{"segment.bytes": "2048"})  # several segments per partition
    expected = {p: [] for p in range(3)}
    for i in range(40):
        for p in range(3):
            values = [b"%d-%d-%d" % (p, i, j) * 5 for j in range(4)]
            produce(stub, "d", p, values)
            expected[p] += values
    if crash:
        broker.kill()
    else:
        assert broker.stop() == 0
    broker.start()
    stub = broker.broker_stub()
    for p in range(3):
        assert read_all(stub, "d", p) == expected[p]
    # and the log carries on where it was
    assert produce(stub, "d", 0, [b"next"]) == len(expected[0])


def test_kill_during_acks_all_stream_loses_no_acknowledged_record(broker):
    stub = broker.broker_stub()
    partitions = 3
    create_topic(stub, "stream", partitions, **{"segment.bytes": "4096"})
    acknowledged = {p: [] for p in range(partitions)}
    in_flight: dict[int, list] = {}
    enough = threading.Event()
    errors = []

    def stream():
        producer_stub = broker.broker_stub()
        n = 0
        while True:
            p = n % partitions
            values = [b"v%07d" % (n * 10 + j) for j in range(10)]
            in_flight[p] = values
            try:
                [result] = producer_stub.Produce(broker_pb2.ProduceRequest(acks=-1, partitions=[
                    broker_pb2.PartitionRecords(topic="stream", partition=p, records=encode_batch(values))]),
                    timeout=10).partitions
            except (grpc.RpcError, ValueError):
                # the broker is gone (ValueError: kill() closed the fixture's channels, and
                # gRPC refuses a call on a closed channel)
                return
            if result.error_code != ErrorCode.NONE:
                errors.append(result.error_message)
                return
            acknowledged[p] += values
            in_flight.pop(p)
            n += 1
            if n >= 300:
                enough.set()

    thread = threading.Thread(target=stream)
    thread.start()
    assert enough.wait(120), "the producer did not get going"
    broker.kill()
    thread.join(60)
    assert not thread.is_alive() and not errors
    broker.start()
    stub = broker.broker_stub()
    for p in range(partitions):
        stored = read_all(stub, "stream", p)
        # every acknowledged record, once, in order; at most the one unanswered batch after
        assert stored in (acknowledged[p], acknowledged[p] + in_flight.get(p, [])), p


def _segment_files(data_dir, partition_dir, suffix):
    directory = data_dir / partition_dir
    return sorted(directory / name for name in os.listdir(directory) if name.endswith(suffix))


def test_torn_tail_lost_indexes_and_stray_files_after_kill(broker):
    stub = broker.broker_stub()
    create_topic(stub, "torn", 1, **{"segment.bytes": "4096"})
    values = [b"r%04d" % i * 20 for i in range(200)]
    for i in range(0, 200, 4):
        produce(stub, "torn", 0, values[i:i + 4])
    broker.kill()

    logs = _segment_files(broker.data_dir, "torn-0", ".log")
    assert len(logs) > 2
    last = logs[-1]
    size = last.stat().st_size
    assert size > 40
    with open(last, "r+b") as f:
        f.truncate(size - 17)  # cut the last batch in the middle
    for index in _segment_files(broker.data_dir, "torn-0", ".index")[:2]:
        index.unlink()
    (broker.data_dir / "torn-0" / "notes.txt").write_text("not ours")

    broker.start()
    stub = broker.broker_stub()
    stored = read_all(stub, "torn", 0)
    assert stored == values[:len(stored)]
    assert len(stored) == 196  # the torn batch of 4 is gone, everything before it is whole
    assert produce(stub, "torn", 0, [b"after"]) == 196
    assert read_all(stub, "torn", 0)[-1] == b"after"


def test_start_sweeps_logs_against_the_registry(broker):
    stub = broker.broker_stub()
    create_topic(stub, "kept", 2)
    produce(stub, "kept", 0, [b"x"])
    assert broker.stop() == 0
    # a delete cut short by a crash leaves a log no topic names; a lost directory leaves
    # a topic without its log
    shutil.copytree(broker.data_dir / "kept-0", broker.data_dir / "ghost-0")
    shutil.rmtree(broker.data_dir / "kept-1")
    broker.start()
    stub = broker.broker_stub()
    assert not (broker.data_dir / "ghost-0").exists()
    assert (broker.data_dir / "kept-1").is_dir()
    assert read_all(stub, "kept", 0) == [b"x"]
    assert produce(stub, "kept", 1, [b"y"]) == 0
    names = [t.name for t in stub.Metadata(broker_pb2.MetadataRequest(), timeout=30).topics]
    assert names == ["kept"]


def test_producer_ids_never_repeat_across_restarts(broker):
    seen = new_producer_ids(broker.txn_stub(), 5)
    broker.kill()
    broker.start()
    seen += new_producer_ids(broker.txn_stub(), 5)
    assert broker.stop() == 0
    broker.start()
    seen += new_producer_ids(broker.txn_stub(), 5)
    broker.kill()
    broker.start()
    seen += new_producer_ids(broker.txn_stub(), 1)
    assert len(set(seen)) == len(seen) == 16
    assert seen[:5] == sorted(seen[:5])


def _init_transactional(broker, transactional_id):
    deadline = time.monotonic() + 30
    while True:
        response = broker.txn_stub().InitProducerId(txn_pb2.InitProducerIdRequest(
            transactional_id=transactional_id, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1),
            timeout=30)
        if response.error_code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS or time.monotonic() > deadline:
            assert response.error_code == ErrorCode.NONE, response.error_message
            return response.producer_id, response.producer_epoch
        time.sleep(0.05)   # the coordinator replays its log after start; retry as a client does


def test_transactional_ids_survive_kill_9(broker):
    producer_id, epoch = _init_transactional(broker, "app-1")
    broker.kill()
    broker.start()
    # the coordinator replayed __transaction_state: same id, the next epoch (fencing the old one)
    assert _init_transactional(broker, "app-1") == (producer_id, epoch + 1)


def test_a_second_broker_cannot_share_the_data_dir_or_port(broker, tmp_path):
    second = BrokerProcess(broker.data_dir, port=0, log_path=tmp_path / "second.log")
    with pytest.raises(RuntimeError, match="exited with code 1"):
        second.start(timeout_s=20)
    assert "in use by another broker" in second.log_tail()

    same_port = subprocess.run(
        [sys.executable, "-m", "broker", "--data-dir", str(tmp_path / "other"), "--port", str(broker.port)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert same_port.returncode == 1
    assert "cannot listen" in same_port.stderr
    # the first broker is unharmed
    assert broker.broker_stub().Metadata(broker_pb2.MetadataRequest(), timeout=30).cluster_id


def test_bad_config_refuses_to_start(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "broker", "--data-dir", str(tmp_path / "d"), "--port", "0",
         "--config", "log.segment.bytes=tiny"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "segment.bytes" in result.stderr


def test_housekeeping_applies_retention(broker_factory):
    broker = broker_factory(config={"log.retention.check.interval.ms": "50"})
    stub = broker.broker_stub()
    create_topic(stub, "short", 1, **{"segment.bytes": "1024", "retention.bytes": "2048",
                                      "file.delete.delay.ms": "0"})
    for i in range(60):
        produce(stub, "short", 0, [b"%03d" % i * 30])
    deadline = time.monotonic() + 30
    while True:
        [earliest] = stub.ListOffsets(broker_pb2.ListOffsetsRequest(partitions=[
            broker_pb2.ListOffsetsPartition(topic="short", partition=0, timestamp=-2)]), timeout=30).partitions
        if earliest.offset > 0:
            break
        assert time.monotonic() < deadline, "retention never deleted a segment"
        time.sleep(0.05)
    # retention may still be moving the start; what is left is always the newest records
    start, values = read_from_log_start(stub, "short", 0)
    assert start > 0
    assert values == [b"%03d" % i * 30 for i in range(start, 60)]


def read_from_log_start(stub, topic, partition):
    """(log start offset, values from it to the end), restarting if retention moves the start."""
    for _ in range(100):
        [earliest] = stub.ListOffsets(broker_pb2.ListOffsetsRequest(partitions=[
            broker_pb2.ListOffsetsPartition(topic=topic, partition=partition, timestamp=-2)]), timeout=30).partitions
        start = offset = earliest.offset
        values = []
        while True:
            [result] = stub.Fetch(broker_pb2.FetchRequest(partitions=[
                broker_pb2.FetchPartition(topic=topic, partition=partition, fetch_offset=offset)]),
                timeout=30).partitions
            if result.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                break  # retention moved the start under us: begin again
            assert result.error_code == ErrorCode.NONE, result.error_message
            records = [r for r in iter_decoded(result.records, topic, partition) if r.offset >= offset]
            values += [r.value for r in records]
            offset += len(records)
            if offset >= result.high_watermark:
                return start, values
    raise AssertionError("retention kept moving the log start")


def test_sigint_stops_cleanly(broker):
    broker._process.send_signal(signal.SIGINT)
    assert broker._process.wait(30) == 0
    assert broker.stop() == 0

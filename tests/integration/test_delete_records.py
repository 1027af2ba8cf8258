"""DeleteRecords on one broker (a real broker process): records before the offset are gone
for every reader, ListOffsets earliest moves, old segments are deleted, the log start
survives a crash, refusals change nothing, and `eos delete-records` works as
kafka-delete-records.sh does."""
from __future__ import annotations

import json

import pytest

import eos
from eos.errors import ErrorCode, InvalidTopicError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from eos.v1 import broker_pb2

RECORDS = 300


def _produce(address: str, topic: str, partitions: int = 1) -> None:
    """RECORDS records into each partition, in batches of 20 (several segments of 4 KiB)."""
    with eos.Producer(address, linger_ms=0) as producer:
        for start in range(0, RECORDS, 20):
            futures = [producer.send(topic, value=b"r%04d" % i + b"." * 90, partition=p)
                       for p in range(partitions) for i in range(start, start + 20)]
            for future in futures:
                future.result(30)


def read_from_the_earliest(address: str, tp: eos.TopicPartition) -> list[int]:
    """The offsets a consumer reads from offset 0 (out of range below the log start: reset to
    the earliest), up to RECORDS - 1."""
    consumer = eos.Consumer(address, auto_offset_reset="earliest")
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)       # below the log start: out of range, reset to the earliest
        offsets: list[int] = []
        for _ in range(50):
            offsets += [r.offset for r in consumer.poll(timeout_ms=100)]
            if offsets and offsets[-1] == RECORDS - 1:
                break
        return offsets
    finally:
        consumer.close()


def _segment_bases(broker, topic: str, partition: int) -> list[int]:
    directory = broker.data_dir / f"{topic}-{partition}"
    return sorted(int(path.name.split(".")[0]) for path in directory.iterdir() if path.name.endswith(".log"))


def test_records_before_the_offset_are_gone_for_every_reader_and_stay_gone_after_a_crash(broker):
    tp = eos.TopicPartition("trimmed", 0)
    with eos.Admin(broker.address) as admin:
        admin.create_topic("trimmed", partitions=2, config={"segment.bytes": "4096"})
        _produce(broker.address, "trimmed", partitions=2)
        segments_before = _segment_bases(broker, "trimmed", 0)
        assert len(segments_before) > 3

        assert admin.delete_records({tp: 150}) == {tp: 150}
        assert admin.list_offsets({tp: "earliest", ("trimmed", 1): "earliest"}) == {tp: 150, ("trimmed", 1): 0}
        assert admin.list_offsets({tp: "latest"}) == {tp: RECORDS}
    assert read_from_the_earliest(broker.address, tp) == list(range(150, RECORDS))
    # the segments wholly before 150 are gone; the one holding 150 stays
    remaining = _segment_bases(broker, "trimmed", 0)
    assert remaining[0] <= 150 and remaining[0] > 0
    assert [base for base in segments_before if base >= remaining[0]] == remaining
    # the epoch covering the new log start starts there (Kafka's leader-epoch-checkpoint format)
    epochs = (broker.data_dir / "trimmed-0" / "leader-epoch-checkpoint").read_text().split("\n")
    assert epochs[1] == "1" and epochs[2].split()[1] == "150"

    broker.kill()                 # no clean shutdown: the checkpoint written at the deletion holds it
    broker.start()
    with eos.Admin(broker.address) as admin:
        assert admin.list_offsets({tp: "earliest"}) == {tp: 150}
        assert admin.delete_records({tp: 100}) == {tp: 150}          # behind the log start: nothing to do
        assert admin.delete_records({tp: -1}) == {tp: RECORDS}       # -1: up to the high watermark
        assert admin.list_offsets({tp: "earliest", ("trimmed", 1): "earliest"}) == {
            tp: RECORDS, ("trimmed", 1): 0}
    assert read_from_the_earliest(broker.address, tp) == []


def test_refused_deletions_change_nothing(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("kept", partitions=1)
        admin.create_topic("kept-compacted", partitions=1, config={"cleanup.policy": "compact"})
        _produce(broker.address, "kept")
        tp = eos.TopicPartition("kept", 0)
        answers = admin.delete_records({tp: RECORDS + 1, ("kept-compacted", 0): 0, ("__consumer_offsets", 0): 0,
                                        ("kept", 7): 1, ("no-such-topic", 0): 1})
        assert isinstance(answers[tp], OffsetOutOfRangeError) and "high watermark 300" in str(answers[tp])
        assert answers[eos.TopicPartition("kept-compacted", 0)].code == ErrorCode.POLICY_VIOLATION
        assert isinstance(answers[eos.TopicPartition("__consumer_offsets", 0)], InvalidTopicError)
        assert isinstance(answers[eos.TopicPartition("kept", 7)], UnknownTopicOrPartitionError)
        assert isinstance(answers[eos.TopicPartition("no-such-topic", 0)], UnknownTopicOrPartitionError)
        with pytest.raises(ValueError):
            admin.delete_records({tp: -2})
        # the raw RPC: -2 is no offset
        answer = broker.broker_stub().DeleteRecords(broker_pb2.DeleteRecordsRequest(partitions=[
            broker_pb2.DeleteRecordsPartition(topic="kept", partition=0, offset=-2)]))
        assert answer.partitions[0].error_code == ErrorCode.OFFSET_OUT_OF_RANGE
        assert admin.list_offsets({tp: "earliest", ("kept-compacted", 0): "earliest"}) == {
            tp: 0, ("kept-compacted", 0): 0}
    assert read_from_the_earliest(broker.address, tp) == list(range(RECORDS))


def test_the_cli_reads_kafkas_offset_file_and_prints_each_partition(broker, tmp_path, capsys):
    from eos.cli import main as eos_main

    with eos.Admin(broker.address) as admin:
        admin.create_topic("cli-trim", partitions=2)
    _produce(broker.address, "cli-trim", partitions=2)
    plan = tmp_path / "offsets.json"
    plan.write_text(json.dumps({"partitions": [{"topic": "cli-trim", "partition": 0, "offset": 120},
                                               {"topic": "cli-trim", "partition": 1, "offset": 9999}],
                                "version": 1}))
    assert eos_main(["delete-records", "--bootstrap-server", broker.address, "--offset-json-file", str(plan)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "Executing records delete operation",
        "Records delete operation completed:",
        "partition: cli-trim-0\tlow_watermark: 120",
        "partition: cli-trim-1\terror: OFFSET_OUT_OF_RANGE: cli-trim-1: cannot delete records before 9999, "
        "past the high watermark 300"]
    # a malformed file is refused whole before anything is deleted
    plan.write_text(json.dumps({"partitions": [{"topic": "cli-trim", "partition": 1, "offset": 10},
                                               {"topic": "cli-trim", "partition": 1}]}))
    assert eos_main(["delete-records", "--bootstrap-server", broker.address, "--offset-json-file", str(plan)]) == 2
    assert "partition entry 1 must have a topic, a partition >= 0 and an offset >= -1" in capsys.readouterr().err
    with eos.Admin(broker.address) as admin:
        assert admin.list_offsets({("cli-trim", 0): "earliest", ("cli-trim", 1): "earliest"}) == {
            ("cli-trim", 0): 120, ("cli-trim", 1): 0}

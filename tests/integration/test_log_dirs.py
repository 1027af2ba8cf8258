"""Several log directories (log.dirs, JBOD): placement by fewest partitions, and a failed
directory taking only its own partitions offline, with the broker saying which."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

import pytest

from broker.server import BrokerServer
from broker.storage.log_dirs import LogDirs
from eos.config import TopicConfig
from eos.errors import ErrorCode, StorageError
from eos.records.codec import encode_batch
from tests.integration.test_broker_produce_fetch import create_topic, fetch, produce
from tests.storage_batches import make_batch


def homes(log_dirs: LogDirs) -> dict[str, list[str]]:
    """Which partition directories each log dir holds, by listing the disks."""
    return {d: sorted(n for n in os.listdir(d) if n.startswith("t")) for d in log_dirs.data_dirs}


def test_new_partitions_go_to_the_directory_with_the_fewest(tmp_path):
    dirs = [str(tmp_path / name) for name in ("a", "b", "c")]
    log_dirs = LogDirs(dirs)
    log_dirs.load({})
    log_dirs.create_log("t1", 0, TopicConfig())
    log_dirs.create_log("t1", 1, TopicConfig())
    assert [len(v) for v in homes(log_dirs).values()] == [1, 1, 0]
    for partition in range(2, 7):
        log_dirs.create_log("t1", partition, TopicConfig())
    assert [len(v) for v in homes(log_dirs).values()] == [3, 2, 2]
    log_dirs.delete_log("t1", 1)                    # b now has the fewest
    log_dirs.create_log("t2", 0, TopicConfig())
    assert "t2-0" in homes(log_dirs)[dirs[1]]
    assert log_dirs.create_log("t2", 0, TopicConfig()) is log_dirs.get_log("t2", 0)   # not placed twice
    log_dirs.shutdown()
    again = LogDirs(dirs)                           # placement is where the files are
    again.load({})
    assert again.get_log("t2", 0).directory.startswith(dirs[1])
    again.shutdown()


def test_a_directory_failing_while_a_partition_is_created_hands_out_no_log(tmp_path):
    """The housekeeping probe fails the directory between the placement and the log's
    creation (here: inside it, deterministically); the new log must not be handed out."""
    log_dirs = LogDirs([str(tmp_path / "a"), str(tmp_path / "b")])
    log_dirs.load({})
    first = next(m for m in log_dirs._managers if m.data_dir == str(tmp_path / "a"))
    real_create = first.create_log

    def create_while_failing(*args, **kwargs):
        log_dirs._fail(first, "the disk went away")        # what a concurrent probe does
        return real_create(*args, **kwargs)

    first.create_log = create_while_failing
    with pytest.raises(StorageError, match="offline.*the disk went away"):
        log_dirs.create_log("t", 0, TopicConfig())
    assert log_dirs.get_log("t", 0) is None and "the disk went away" in log_dirs.offline_reason("t", 0)
    assert log_dirs.create_log("u", 0, TopicConfig()).directory.startswith(str(tmp_path / "b"))
    log_dirs.shutdown()


def test_a_partition_deleted_while_housekeeping_flushes_it_does_not_fail_its_directory(tmp_path):
    """delete_log closes and removes a log whose segments the housekeeping is fsyncing
    outside the log's lock; the fsync's error is the deletion's, not a failing disk."""
    log_dirs = LogDirs([str(tmp_path / "a")])
    log_dirs.load({})
    doomed = log_dirs.create_log("t", 0, TopicConfig(flush_ms=1000))
    doomed.append_as_leader(make_batch(5), now_ms=0)
    segment = doomed._segments[-1]
    real_flush = segment.flush

    def flush_while_deleted():
        log_dirs.delete_log("t", 0)                    # what a concurrent DeleteTopics does
        real_flush()
        raise FileNotFoundError("the segment's files were removed")   # a flush that lost the race

    segment.flush = flush_while_deleted
    log_dirs.create_log("u", 0, TopicConfig(flush_ms=1000)).append_as_leader(make_batch(1), now_ms=0)
    log_dirs.run_housekeeping(now_ms=10**13)          # long past flush.ms: both logs are flushed
    assert log_dirs.offline_dirs == {} and log_dirs.get_log("t", 0) is None
    assert log_dirs.get_log("u", 0).recovery_point == 1
    log_dirs.shutdown()


def test_a_partition_in_two_directories_is_refused_at_load(tmp_path):
    first = LogDirs([str(tmp_path / "a")])
    first.load({})
    first.create_log("t", 0, TopicConfig()).append_as_leader(make_batch(1), now_ms=0)
    first.shutdown()
    shutil.copytree(tmp_path / "a" / "t-0", tmp_path / "b" / "t-0")
    with pytest.raises(StorageError, match="in two log dirs"):
        LogDirs([str(tmp_path / "a"), str(tmp_path / "b")]).load({})


def test_a_removed_directory_takes_only_its_partitions_offline(tmp_path, caplog):
    dirs = [tmp_path / "a", tmp_path / "b"]
    server = BrokerServer(dirs[0], port=0, config={"log.dirs": ",".join(map(str, dirs)),
                                                   "log.retention.check.interval.ms": "3600000"})
    server.start()
    try:
        import grpc
        from eos.v1 import broker_pb2_grpc
        with grpc.insecure_channel(server.address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            create_topic(stub, "t", partitions=4)
            on_b = sorted(int(n.rsplit("-", 1)[1]) for n in os.listdir(dirs[1]) if n.startswith("t-"))
            on_a = sorted(int(n.rsplit("-", 1)[1]) for n in os.listdir(dirs[0]) if n.startswith("t-"))
            assert len(on_a) == len(on_b) == 2
            for partition in range(4):
                assert produce(stub, "t", partition, encode_batch([b"before"])).error_code == ErrorCode.NONE
            shutil.rmtree(dirs[1])                  # the disk is gone
            with caplog.at_level(logging.ERROR, logger="broker.storage.log_dirs"):
                server._log_manager.run_housekeeping()     # the broker's tick, run now
            [failure] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            # the partitions are listed after the last ": " (the path may hold "t-2": pytest-211)
            assert str(dirs[1]) in failure and failure.rsplit(": ", 1)[1].split(", ") == [f"t-{p}" for p in on_b]
            for partition in on_b:
                result = produce(stub, "t", partition, encode_batch([b"after"]))
                assert result.error_code == ErrorCode.KAFKA_STORAGE_ERROR and "offline" in result.error_message
                assert fetch(stub, "t", partition, 0).error_code == ErrorCode.KAFKA_STORAGE_ERROR
            for partition in on_a:                  # the other directory serves on
                assert produce(stub, "t", partition, encode_batch([b"after"])).error_code == ErrorCode.NONE
                assert fetch(stub, "t", partition, 0).error_code == ErrorCode.NONE
            # a new topic goes to the directory that is still online
            create_topic(stub, "t9", partitions=2)
            assert sorted(n for n in os.listdir(dirs[0]) if n.startswith("t9-")) == ["t9-0", "t9-1"]
    finally:
        server.stop()


def test_a_deletion_whose_log_start_checkpoint_fails_is_answered_as_a_storage_error(tmp_path, monkeypatch):
    """DeleteRecords answers NONE only once the new log start is checkpointed (it must
    survive a crash); a checkpoint that cannot be written takes the dir offline, and the
    answer says so instead of NONE."""
    import grpc
    from eos.v1 import broker_pb2, broker_pb2_grpc
    server = BrokerServer(tmp_path / "a", port=0, config={"log.retention.check.interval.ms": "3600000"})
    server.start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            create_topic(stub, "t", partitions=1)
            for _ in range(3):
                assert produce(stub, "t", 0, encode_batch([b"x", b"y"])).error_code == ErrorCode.NONE
            [manager] = server._log_manager._managers

            def disk_full(offsets):
                raise OSError(28, "No space left on device")
            monkeypatch.setattr(manager._start_checkpoint, "write", disk_full)
            [result] = stub.DeleteRecords(broker_pb2.DeleteRecordsRequest(partitions=[
                broker_pb2.DeleteRecordsPartition(topic="t", partition=0, offset=4)]), timeout=30).partitions
            assert result.error_code == ErrorCode.KAFKA_STORAGE_ERROR
            assert "offline" in result.error_message and "No space left" in result.error_message
            assert result.low_watermark == -1
    finally:
        server.stop()


def topic_over_two_dirs(tmp_path):
    """A broker run once over log dirs a and b with a topic "t" of two partitions, stopped:
    (the dirs, the broker config, the name of the partition directory that went to b)."""
    import grpc
    from eos.v1 import broker_pb2_grpc
    dirs = [tmp_path / "a", tmp_path / "b"]
    config = {"log.dirs": ",".join(map(str, dirs))}
    server = BrokerServer(dirs[0], port=0, config=config)
    server.start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            create_topic(broker_pb2_grpc.BrokerStub(channel), "t", partitions=2)
    finally:
        server.stop()
    [on_b] = [n for n in os.listdir(dirs[1]) if n.startswith("t-")]
    return dirs, config, on_b


def test_a_partition_missing_while_a_directory_is_offline_is_not_recreated(tmp_path):
    dirs, config, on_b = topic_over_two_dirs(tmp_path)
    shutil.rmtree(dirs[1])
    dirs[1].write_text("not a directory any more")  # the mount point is broken
    server = BrokerServer(dirs[0], port=0, config=config)
    server.start()                                  # the other directory is enough to start
    try:
        import grpc
        from eos.v1 import broker_pb2_grpc
        partition = int(on_b.rsplit("-", 1)[1])
        with grpc.insecure_channel(server.address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            result = produce(stub, "t", partition, encode_batch([b"x"]))
            assert result.error_code == ErrorCode.KAFKA_STORAGE_ERROR, result
            assert produce(stub, "t", 1 - partition, encode_batch([b"x"])).error_code == ErrorCode.NONE
        # not created again on the online directory, where it would restart from offset 0
        assert not (dirs[0] / on_b).exists()
    finally:
        server.stop()
    dirs[1].unlink()


def test_cli_takes_several_data_dirs(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    process = subprocess.Popen([sys.executable, "-m", "eos.cli", "broker", "start", "--port", "0",
                                "--data-dir", str(dirs[0]), "--data-dir", str(dirs[1])],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = process.stdout.readline()
        assert "eos broker listening on" in line, line
        assert (dirs[1] / "meta.properties").read_text().split("cluster.id=")[1].split()[0] == \
            (dirs[0] / "meta.properties").read_text().split("cluster.id=")[1].split()[0]
    finally:
        process.terminate()
        process.wait(30)
    assert process.returncode == 0


def test_a_known_log_dir_found_empty_is_offline_not_formatted_again(tmp_path):
    # An unmounted disk leaves its empty mount point: formatting it would let the start-up
    # sweep create its partitions again, empty, from offset 0.
    dirs, config, on_b = topic_over_two_dirs(tmp_path)
    shutil.rmtree(dirs[1])
    dirs[1].mkdir()                                  # the empty mount point
    server = BrokerServer(dirs[0], port=0, config=config)
    server.start()
    try:
        import grpc
        from eos.v1 import broker_pb2_grpc
        with grpc.insecure_channel(server.address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            partition = int(on_b.rsplit("-", 1)[1])
            assert produce(stub, "t", partition, encode_batch([b"x"])).error_code == ErrorCode.KAFKA_STORAGE_ERROR
            # nor can the topic be deleted while a partition's files are out of reach
            from eos.v1 import broker_pb2
            [result] = stub.DeleteTopics(broker_pb2.DeleteTopicsRequest(names=["t"]), timeout=30).topics
            assert result.error_code == ErrorCode.KAFKA_STORAGE_ERROR and "offline" in result.error_message
        assert not (dirs[1] / "meta.properties").exists() and not (dirs[1] / on_b).exists()
    finally:
        server.stop()


def test_several_log_dirs_are_refused_on_a_zookeeper_cluster(tmp_path):
    from eos.errors import InvalidConfigError
    with pytest.raises(InvalidConfigError, match="LogDirEventNotification"):
        BrokerServer(tmp_path / "a", port=0, config={"log.dirs": f"{tmp_path / 'a'},{tmp_path / 'b'}",
                                                     "zookeeper.connect": "127.0.0.1:2181"})

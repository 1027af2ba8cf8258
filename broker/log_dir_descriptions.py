"""Kafka's DescribeLogDirs answer of one broker: its log directories and the replicas in them.

Theory of operation
-------------------
What is asked of `broker.storage.log_dirs.LogDirs` through its public face, nothing else:
`data_dirs` (the directories opened at start), `offline_dirs` (directory -> why it failed,
including those that could not even be opened) and `all_logs()` (the online replicas). A
replica's directory is the parent of its partition directory, which is where its files are;
LogDirs records placement no other way either.

Each directory becomes one `LogDirDescription`: an online one with its replicas (filtered by
the request's topics and partitions; none asked means all, Kafka's null) and the file
system's total and usable bytes (KIP-827); an offline one with KAFKA_STORAGE_ERROR, the
cause as its message, no replicas and -1 for the sizes, as Kafka answers for a failed dir.

A replica's `size_bytes` is its segments' bytes (Kafka's Log.size: no indexes). `offset_lag`
is Kafka's for a current (not future) replica: max(0, high watermark - log end offset), which
is 0 for a leader. eos never moves a replica between directories, so `is_future` is false.

Each directory also carries eos's own count of storage errors answered for its replicas and
the last one's message (the Broker service's `StorageErrors`): a full disk fails writes
without taking its directory offline, and the console shows it from here.

The authorization check (DESCRIBE on the cluster) is the servicer's; this module only reads.
"""
from __future__ import annotations

import os
import shutil

from eos.errors import ErrorCode
from eos.v1 import broker_pb2

UNKNOWN_BYTES = -1     # KIP-827's answer when a directory's file system cannot be asked


def describe_log_dirs(log_dirs, request: broker_pb2.DescribeLogDirsRequest,
                      storage_errors: dict[str, tuple[int, str]] | None = None) -> broker_pb2.DescribeLogDirsResponse:
    """The answer for `request` from `log_dirs` (a LogDirs) and `storage_errors` ({log dir:
    (errors, last message)}); see the module doc."""
    storage_errors = storage_errors or {}
    wanted = _wanted_partitions(request)
    offline = log_dirs.offline_dirs
    by_dir: dict[str, dict[str, list[broker_pb2.LogDirPartition]]] = {
        d: {} for d in log_dirs.data_dirs if d not in offline}
    for partition_log in log_dirs.all_logs():
        topic, partition = partition_log.topic, partition_log.partition
        if wanted is not None and partition not in wanted.get(topic, ()):
            continue
        topics = by_dir.get(os.path.dirname(partition_log.directory))
        if topics is None:      # its directory failed while we listed: it is answered offline
            continue
        topics.setdefault(topic, []).append(broker_pb2.LogDirPartition(
            partition=partition, size_bytes=partition_log.size_bytes,
            offset_lag=max(0, partition_log.high_watermark - partition_log.log_end_offset), is_future=False))
    results = []
    for directory, topics in by_dir.items():
        total_bytes, usable_bytes = _disk_bytes(directory)
        error_count, last_error = storage_errors.get(directory, (0, ""))
        results.append(broker_pb2.LogDirDescription(
            error_code=ErrorCode.NONE, log_dir=directory, total_bytes=total_bytes, usable_bytes=usable_bytes,
            storage_error_count=error_count, last_storage_error=last_error,
            topics=[broker_pb2.LogDirTopic(name=name, partitions=sorted(partitions, key=lambda p: p.partition))
                    for name, partitions in sorted(topics.items())]))
    for directory, reason in sorted(offline.items()):
        error_count, last_error = storage_errors.get(directory, (0, ""))
        results.append(broker_pb2.LogDirDescription(
            error_code=ErrorCode.KAFKA_STORAGE_ERROR, error_message=reason, log_dir=directory,
            total_bytes=UNKNOWN_BYTES, usable_bytes=UNKNOWN_BYTES,
            storage_error_count=error_count, last_storage_error=last_error))
    return broker_pb2.DescribeLogDirsResponse(error_code=ErrorCode.NONE, results=results)


def _wanted_partitions(request: broker_pb2.DescribeLogDirsRequest) -> dict[str, set[int]] | None:
    if not request.topics:
        return None
    wanted: dict[str, set[int]] = {}
    for topic in request.topics:
        wanted.setdefault(topic.topic, set()).update(topic.partitions)
    return wanted


def _disk_bytes(directory: str) -> tuple[int, int]:
    """(total, usable) bytes of the directory's file system; usable is what a non-root
    writer may still take (statvfs f_bavail), as Java's File.getUsableSpace."""
    try:
        usage = shutil.disk_usage(directory)
    except OSError:      # it vanished since the last probe: the next housekeeping fails it
        return UNKNOWN_BYTES, UNKNOWN_BYTES
    return usage.total, usage.free

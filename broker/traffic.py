"""What the Broker service counts for operators: bytes and records in and out per topic
(Kafka's BrokerTopicMetrics), and storage errors per partition and log dir.

Plain counting, no metrics library: the broker's metrics (broker/metrics.py) read the
snapshots when scraped. Locks keep concurrent requests' counts exact (`+=` on a shared
list is not atomic).

`TopicTraffic` is counted once per partition of a request, never per record: `produced`
after an append, `fetched` for what a consumer's fetch returns (a follower's fetch is
replication, which Kafka counts apart, and is not counted here). The service keeps one only
when the broker has metrics.

`StorageErrors` is always kept: a broker whose disk is full answers KAFKA_STORAGE_ERROR to
every produce, and an operator must see it without a log line per request. `record` says
whether this partition and log dir has just begun failing (then the caller logs it at
ERROR, once) and counts it either way; it keeps each log dir's last message for
DescribeLogDirs (the console). `recovered` says a partition took a write again (the caller
logs that at INFO), so a disk that fills up again later is logged again.
"""
from __future__ import annotations

import threading
from typing import NamedTuple


class TopicCounts(NamedTuple):
    bytes_in: int
    records_in: int
    bytes_out: int
    records_out: int


class TopicTraffic:
    """See the module doc."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}     # topic -> [bytes_in, records_in, bytes_out, records_out]

    def _add(self, topic: str, first: int, size_bytes: int, records: int) -> None:
        with self._lock:
            counts = self._counts.get(topic)
            if counts is None:
                counts = self._counts[topic] = [0, 0, 0, 0]
            counts[first] += size_bytes
            counts[first + 1] += records

    def produced(self, topic: str, size_bytes: int, records: int) -> None:
        self._add(topic, 0, size_bytes, records)

    def fetched(self, topic: str, size_bytes: int, records: int) -> None:
        self._add(topic, 2, size_bytes, records)

    def forget(self, topic: str) -> None:
        """A deleted topic's counts go with it (its label would otherwise stay forever)."""
        with self._lock:
            self._counts.pop(topic, None)

    def snapshot(self) -> dict[str, TopicCounts]:
        with self._lock:
            return {topic: TopicCounts(*counts) for topic, counts in self._counts.items()}


class StorageErrors:
    """See the module doc."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int, str], int] = {}    # (topic, partition, log dir) -> errors
        self._last_message: dict[str, str] = {}               # log dir -> its last error's message
        # partitions failing now: read without the lock on every write, so that a broker
        # whose disks are fine pays one truthiness test
        self.failing: set[tuple[str, int]] = set()

    def record(self, topic: str, partition: int, log_dir: str, message: str) -> bool:
        """Count one; True when this partition was not failing (the first error, or the first
        since it recovered)."""
        key = (topic, partition, log_dir)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
            self._last_message[log_dir] = message
            began = (topic, partition) not in self.failing
            self.failing.add((topic, partition))
        return began

    def recovered(self, topic: str, partition: int) -> bool:
        """The partition took a write: True when it was failing until now."""
        with self._lock:
            if (topic, partition) not in self.failing:
                return False
            self.failing.discard((topic, partition))
            return True

    def by_log_dir(self) -> dict[str, tuple[int, str]]:
        """{log dir: (errors, the last one's message)}."""
        with self._lock:
            totals: dict[str, int] = {}
            for (_, _, log_dir), count in self._counts.items():
                totals[log_dir] = totals.get(log_dir, 0) + count
            return {log_dir: (count, self._last_message[log_dir]) for log_dir, count in totals.items()}

    def snapshot(self) -> dict[tuple[str, int, str], int]:
        with self._lock:
            return dict(self._counts)

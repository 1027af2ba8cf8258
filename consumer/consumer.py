"""`eos.Consumer`: Kafka's KafkaConsumer over gRPC (manual assignment for now).

Theory of operation
-------------------
The consumer is driven by the application's thread: `poll()` hands out records the
`Fetcher` has received, sends the next Fetch calls before it returns (so the broker works
on the next response while the application processes this one), and otherwise waits for
an answer up to its timeout. A partition without a position gets one from ListOffsets by
auto.offset.reset ("latest" by default, as in Kafka; "earliest"; "none" raises), lazily,
on the first poll() or position() that needs it.

Configuration uses Kafka's names: the keyword arguments of the constructor, any other
setting as a keyword argument with dots turned into underscores, or a dict of Kafka names
in `config`. A keyword argument left at its default does not override the dict.

Groups (subscribe, commit, group_metadata) arrive with the consumer groups work; until
then `group_id` must be None for anything that needs a group, and those methods raise
NotImplementedError. Like Kafka's consumer, one consumer is used by one thread.
"""
from __future__ import annotations

import time
from typing import Iterable

from eos import net
from eos.errors import EosError
from eos.types import Record, TopicPartition
from eos.v1.common_pb2 import IsolationLevel
from consumer.fetcher import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    OFFSET_RESET_STRATEGIES,
    Fetcher,
    NoOffsetForPartitionError,
)

__all__ = ["Consumer", "NoOffsetForPartitionError"]

RESET_BUDGET_MIN_MS = 1000
GROUPS_NOT_YET = ("consumer groups are not implemented yet (they arrive with issue 5); "
                  "use group_id=None with assign()")


def _isolation(name: str, value) -> int:
    text = str(value).strip().lower()
    if text == "read_uncommitted":
        return IsolationLevel.READ_UNCOMMITTED
    if text == "read_committed":
        return IsolationLevel.READ_COMMITTED
    raise ValueError(f"{name} must be read_uncommitted or read_committed, got {value!r}")


def _offset_reset(name: str, value) -> str:
    text = str(value).strip().lower()
    if text not in OFFSET_RESET_STRATEGIES:
        raise ValueError(f"{name} must be one of {', '.join(OFFSET_RESET_STRATEGIES)}, got {value!r}")
    return text


CONSUMER_CONFIG: dict[str, net.ConfigSpec] = {
    "bootstrap.servers": net.ConfigSpec(None, net.as_optional_str),
    "client.id": net.ConfigSpec("", net.as_str),
    "group.id": net.ConfigSpec(None, net.as_optional_str),
    "isolation.level": net.ConfigSpec(IsolationLevel.READ_UNCOMMITTED, _isolation),
    "auto.offset.reset": net.ConfigSpec("latest", _offset_reset),
    "fetch.min.bytes": net.ConfigSpec(1, net.as_int(0)),
    "fetch.max.wait.ms": net.ConfigSpec(500, net.as_int(0)),
    "fetch.max.bytes": net.ConfigSpec(52428800, net.as_int(1)),
    "max.partition.fetch.bytes": net.ConfigSpec(1048576, net.as_int(1)),
    "max.poll.records": net.ConfigSpec(500, net.as_int(1)),
    "enable.auto.commit": net.ConfigSpec(False, net.as_bool),
    "auto.commit.interval.ms": net.ConfigSpec(5000, net.as_int(0)),
    "check.crcs": net.ConfigSpec(True, net.as_bool),
    "request.timeout.ms": net.ConfigSpec(30000, net.as_int(1)),
    "default.api.timeout.ms": net.ConfigSpec(60000, net.as_int(1)),
    "retry.backoff.ms": net.ConfigSpec(100, net.as_int(0)),
    "retry.backoff.max.ms": net.ConfigSpec(1000, net.as_int(0)),
    "metadata.max.age.ms": net.ConfigSpec(300000, net.as_int(1)),
}

_NAMED_DEFAULTS = {
    "group_id": None, "isolation_level": "read_uncommitted", "auto_offset_reset": "latest",
    "fetch_min_bytes": 1, "fetch_max_wait_ms": 500, "fetch_max_bytes": 52428800,
    "max_partition_fetch_bytes": 1048576, "max_poll_records": 500, "enable_auto_commit": False,
}


def _as_tp(tp) -> TopicPartition:
    if isinstance(tp, TopicPartition):
        return tp
    try:
        topic, partition = tp
    except (TypeError, ValueError):
        raise TypeError(f"expected a TopicPartition or (topic, partition), got {tp!r}") from None
    if not isinstance(topic, str) or isinstance(partition, bool) or not isinstance(partition, int):
        raise TypeError(f"expected (str topic, int partition), got {tp!r}")
    return TopicPartition(topic, partition)


class Consumer:
    """``Consumer(bootstrap, *, group_id=None, isolation_level="read_uncommitted",
    auto_offset_reset="latest", fetch_min_bytes=1, fetch_max_wait_ms=500,
    fetch_max_bytes=52428800, max_partition_fetch_bytes=1048576, max_poll_records=500,
    enable_auto_commit=False, config=None, **kwargs)``"""

    def __init__(self, bootstrap: str = net.DEFAULT_BOOTSTRAP, *, group_id: str | None = None,
                 isolation_level: str = "read_uncommitted", auto_offset_reset: str = "latest",
                 fetch_min_bytes: int = 1, fetch_max_wait_ms: int = 500,
                 fetch_max_bytes: int = 52428800, max_partition_fetch_bytes: int = 1048576,
                 max_poll_records: int = 500, enable_auto_commit: bool = False,
                 config: dict | None = None, **kwargs):
        named = dict(group_id=group_id, isolation_level=isolation_level,
                     auto_offset_reset=auto_offset_reset, fetch_min_bytes=fetch_min_bytes,
                     fetch_max_wait_ms=fetch_max_wait_ms, fetch_max_bytes=fetch_max_bytes,
                     max_partition_fetch_bytes=max_partition_fetch_bytes,
                     max_poll_records=max_poll_records, enable_auto_commit=enable_auto_commit)
        for name, value in named.items():
            if value != _NAMED_DEFAULTS[name]:
                kwargs[name] = value
        settings, _ = net.resolve_config("consumer", CONSUMER_CONFIG, config, kwargs)
        if settings["enable.auto.commit"] and settings["group.id"] is None:
            raise ValueError("enable.auto.commit cannot be true without a group.id")
        self.config = settings
        if settings["bootstrap.servers"]:
            bootstrap = settings["bootstrap.servers"]
        self.group_id = settings["group.id"]
        self._max_poll_records = settings["max.poll.records"]
        self._default_api_timeout_ms = settings["default.api.timeout.ms"]
        self._metadata = net.ClusterMetadata(
            bootstrap, request_timeout_ms=settings["request.timeout.ms"],
            retry_backoff_ms=settings["retry.backoff.ms"],
            retry_backoff_max_ms=settings["retry.backoff.max.ms"],
            metadata_max_age_ms=settings["metadata.max.age.ms"])
        self._fetcher = Fetcher(
            self._metadata, isolation_level=settings["isolation.level"],
            auto_offset_reset=settings["auto.offset.reset"],
            fetch_min_bytes=settings["fetch.min.bytes"],
            fetch_max_wait_ms=settings["fetch.max.wait.ms"],
            fetch_max_bytes=settings["fetch.max.bytes"],
            max_partition_fetch_bytes=settings["max.partition.fetch.bytes"],
            check_crcs=settings["check.crcs"], request_timeout_ms=settings["request.timeout.ms"],
            backoff=net.Backoff(settings["retry.backoff.ms"], settings["retry.backoff.max.ms"]))
        self._closed = False

    @property
    def isolation_level(self) -> str:
        return ("read_committed" if self._fetcher.isolation_level == IsolationLevel.READ_COMMITTED
                else "read_uncommitted")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this consumer is closed")

    # ---- assignment ----------------------------------------------------------------------

    def assign(self, partitions: Iterable) -> None:
        """Read exactly these partitions (replacing any earlier assignment)."""
        self._check_open()
        self._fetcher.assign([_as_tp(tp) for tp in partitions])

    def assignment(self) -> set[TopicPartition]:
        return set(self._fetcher.states)

    def unsubscribe(self) -> None:
        self._fetcher.assign([])

    def subscribe(self, topics, listener=None) -> None:
        raise NotImplementedError(GROUPS_NOT_YET)

    def commit(self, offsets=None) -> None:
        raise NotImplementedError(GROUPS_NOT_YET)

    def committed(self, partitions) -> dict:
        raise NotImplementedError(GROUPS_NOT_YET)

    def group_metadata(self):
        raise NotImplementedError(GROUPS_NOT_YET)

    # ---- positions -----------------------------------------------------------------------

    def seek(self, tp, offset: int) -> None:
        """The next poll() returns records of `tp` from `offset` on."""
        self._check_open()
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be a non-negative int, got {offset!r}")
        self._fetcher.state(_as_tp(tp)).seek(offset)

    def seek_to_beginning(self, *partitions) -> None:
        """Move to the earliest offset (of these partitions, or of all assigned), lazily."""
        self._seek_to(partitions, "earliest")

    def seek_to_end(self, *partitions) -> None:
        """Move to the end (the last stable offset under read_committed), lazily."""
        self._seek_to(partitions, "latest")

    def _seek_to(self, partitions, strategy: str) -> None:
        self._check_open()
        if len(partitions) == 1 and not isinstance(partitions[0], (TopicPartition, tuple)):
            partitions = tuple(partitions[0])   # a list passed as one argument
        tps = [_as_tp(tp) for tp in partitions] or list(self._fetcher.states)
        for tp in tps:
            self._fetcher.state(tp).request_reset(strategy)

    def position(self, tp, timeout_ms: int | None = None) -> int:
        """The offset of the next record poll() returns for `tp` (resolving a pending
        reset with ListOffsets, up to `timeout_ms`, default default.api.timeout.ms)."""
        self._check_open()
        state = self._fetcher.state(_as_tp(tp))
        if state.position is None:
            self._fetcher.reset_positions(timeout_ms if timeout_ms is not None else self._default_api_timeout_ms)
        if state.position is None:
            raise EosError(f"no position for {tp} after the reset")
        return state.position

    def beginning_offsets(self, partitions, timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        return self._list(partitions, EARLIEST_TIMESTAMP, timeout_ms)

    def end_offsets(self, partitions, timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        """The end of each partition: the high watermark, or the last stable offset under
        read_committed."""
        return self._list(partitions, LATEST_TIMESTAMP, timeout_ms)

    def offsets_for_times(self, timestamps: dict, timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        """The earliest offset whose timestamp is >= the given one (-1 where none is)."""
        self._check_open()
        return self._fetcher.list_offsets(
            {_as_tp(tp): int(ts) for tp, ts in timestamps.items()},
            timeout_ms if timeout_ms is not None else self._default_api_timeout_ms)

    def _list(self, partitions, timestamp: int, timeout_ms: int | None) -> dict[TopicPartition, int]:
        self._check_open()
        return self._fetcher.list_offsets(
            {_as_tp(tp): timestamp for tp in partitions},
            timeout_ms if timeout_ms is not None else self._default_api_timeout_ms)

    # ---- polling -------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[Record]:
        """Records of the assigned partitions, at most `max_records` (max.poll.records),
        waiting up to `timeout_ms` for some to arrive; [] when none did."""
        self._check_open()
        if max_records is None:
            max_records = self._max_poll_records
        elif max_records < 1:
            raise ValueError(f"max_records must be at least 1, got {max_records}")
        fetcher = self._fetcher
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        while True:
            fetcher.handle_arrivals()
            records = fetcher.collect(max_records)
            if records:
                fetcher.send_fetches()     # the next responses travel while these are processed
                return records
            fetcher.raise_pending_error()
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if any(s.position is None for s in fetcher.states.values()):
                # Within the poll's time (at least a second, so that poll(0) can finish a
                # reset against a live broker); a broker that is away is tried again later.
                try:
                    fetcher.reset_positions(max(remaining_ms, RESET_BUDGET_MIN_MS))
                except EosError as exc:
                    if not exc.retriable:
                        raise
            fetcher.wakeup.clear()
            fetcher.send_fetches()
            fetcher.handle_arrivals()
            if fetcher.has_pending_error:
                fetcher.raise_pending_error()
            remaining_ms = (deadline - time.monotonic()) * 1000
            if remaining_ms <= 0:
                return []
            if fetcher._arrived:
                continue
            # Wait for a Fetch to finish, or (nothing in flight: leaders unknown, backing
            # off) a short while before trying again.
            wait_s = remaining_ms / 1000 if fetcher.has_in_flight else min(remaining_ms / 1000, 0.05)
            fetcher.wakeup.wait(wait_s)

    # ---- shutdown ------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fetcher.close()
        self._metadata.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

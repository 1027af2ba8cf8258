"""`eos.Consumer`: Kafka's KafkaConsumer over gRPC: manual assignment or consumer groups.

Theory of operation
-------------------
The consumer is driven by the application's thread: `poll()` hands out records the
`Fetcher` has received, sends the next Fetch calls, and otherwise waits for an answer up to
its timeout. When the next Fetch goes out depends on what the last response said
(`Fetcher.has_records_waiting`): if a partition is behind its log end, at once, before the
records in hand are decoded, so the broker reads the next chunk while the application
works through this one (Kafka's pipelining); if every partition has caught up, at the next
poll(). That Fetch would only wait at the broker for the next write, and sending it costs
the records in hand a socket send before they are returned: 0.1-0.4 ms of wake-ups on a
busy 2-core host, about a fifth of the end-to-end latency (bench e2e-latency, idempotent
p50: 1.84 -> 1.45 ms). A partition not fetched yet (its log end unknown) is fetched at once.

A partition without a position gets one lazily, on the first
poll() or position() that needs it: a group consumer's from the group's committed offset
(OffsetFetch with require_stable, so never from inside an open transaction), and otherwise,
or when nothing is committed, from ListOffsets by auto.offset.reset ("latest" by default,
as in Kafka; "earliest"; "none" raises).

Groups: with a `group_id`, `subscribe()` hands the choice of partitions to the group
(`consumer.group.ConsumerCoordinator`): each poll() first advances the membership protocol
(join, sync, rebalance listener calls, auto-commit) and fetches only while the member is
stable (eager protocol), or, under the cooperative protocol (partition.assignment.strategy
["cooperative-sticky"]), also through a rebalance, from the partitions it keeps; a
background thread heartbeats, and leaves the group when poll() is not called within
max.poll.interval.ms. `assign()` with a `group_id` reads the given partitions and
commits outside group management, as Kafka's consumer does. subscribe() and assign()
exclude each other until unsubscribe().

Configuration uses Kafka's names: the keyword arguments of the constructor, any other
setting as a keyword argument with dots turned into underscores, or a dict of Kafka names
in `config`. A keyword argument left at its default does not override the dict. Like
Kafka's consumer, one consumer is used by one thread.

Metrics (`metrics=True`, or a prometheus_client CollectorRegistry): eos/client_metrics.py's
consumer families, labelled with client.id; counted by the fetcher per poll and per Fetch
response, by the group client per OffsetCommit, and each assigned partition's lag is read
from its state when the registry is collected.
"""
from __future__ import annotations

import itertools
import re
import time
from typing import Iterable

from eos import net
from eos.allocator import CLIENT_THRESHOLD_BYTES, keep_large_buffers_in_the_heap
from eos.client_config import (CLIENT_SECURITY_CONFIG, ConfigSpec, as_bool, as_int, as_int32, as_optional_str,
                               as_str, channel_security, resolve_config)
from eos.client_metrics import ConsumerMetrics, metrics_setting
from eos.errors import EosError, ErrorCode, error_for
from eos.types import Record, TopicPartition
from eos.v1.common_pb2 import IsolationLevel
from consumer.fetcher import (
    COMMITTED,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    OFFSET_RESET_STRATEGIES,
    Fetcher,
    NoOffsetForPartitionError,
)
from consumer.group import ConsumerCoordinator, ConsumerGroupMetadata, OffsetAndMetadata, assignor_names

__all__ = ["Consumer", "NoOffsetForPartitionError"]

RESET_BUDGET_MIN_MS = 1000
GROUP_WAIT_S = 0.1          # poll() looks at a rebalance in progress at least this often
CLOSE_TIMEOUT_MS = 30_000   # Kafka's default close timeout
_client_numbers = itertools.count(1)


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


CONSUMER_CONFIG: dict[str, ConfigSpec] = {
    "bootstrap.servers": ConfigSpec(None, as_optional_str),
    "client.id": ConfigSpec("", as_str),
    "group.id": ConfigSpec(None, as_optional_str),
    "isolation.level": ConfigSpec(IsolationLevel.READ_UNCOMMITTED, _isolation),
    "auto.offset.reset": ConfigSpec("latest", _offset_reset),
    "fetch.min.bytes": ConfigSpec(1, as_int32(0)),
    "fetch.max.wait.ms": ConfigSpec(500, as_int32(0)),
    "fetch.max.bytes": ConfigSpec(52428800, as_int32(1)),
    "max.partition.fetch.bytes": ConfigSpec(1048576, as_int32(1)),
    "max.poll.records": ConfigSpec(500, as_int32(1)),
    "enable.auto.commit": ConfigSpec(False, as_bool),
    "auto.commit.interval.ms": ConfigSpec(5000, as_int32(0)),
    "check.crcs": ConfigSpec(True, as_bool),
    "request.timeout.ms": ConfigSpec(30000, as_int32(1)),
    "default.api.timeout.ms": ConfigSpec(60000, as_int32(1)),
    "retry.backoff.ms": ConfigSpec(100, as_int(0)),
    "retry.backoff.max.ms": ConfigSpec(1000, as_int(0)),
    "metadata.max.age.ms": ConfigSpec(300000, as_int(1)),
    "group.instance.id": ConfigSpec(None, as_optional_str),
    "session.timeout.ms": ConfigSpec(45000, as_int32(1)),
    "heartbeat.interval.ms": ConfigSpec(3000, as_int32(1)),
    "max.poll.interval.ms": ConfigSpec(300000, as_int32(1)),
    "partition.assignment.strategy": ConfigSpec(("range",), assignor_names),
    # eos's: report the client metrics (eos/client_metrics.py) through prometheus_client's
    # default REGISTRY (true) or the CollectorRegistry given; false, the default, costs nothing.
    "metrics": ConfigSpec(False, metrics_setting),
    **CLIENT_SECURITY_CONFIG,
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


def _tps_of(partitions: tuple) -> list[TopicPartition]:
    """Partitions given as arguments, or as one list argument."""
    if len(partitions) == 1 and not isinstance(partitions[0], (TopicPartition, tuple)):
        partitions = tuple(partitions[0])
    return [_as_tp(tp) for tp in partitions]


class Consumer:
    """``Consumer(bootstrap, *, group_id=None, isolation_level="read_uncommitted",
    auto_offset_reset="latest", fetch_min_bytes=1, fetch_max_wait_ms=500,
    fetch_max_bytes=52428800, max_partition_fetch_bytes=1048576, max_poll_records=500,
    enable_auto_commit=False, config=None, **kwargs)``

    Group settings (Kafka's names, as keyword arguments): group_instance_id (static
    membership), session_timeout_ms=45000, heartbeat_interval_ms=3000,
    max_poll_interval_ms=300000, partition_assignment_strategy=["range"] ("roundrobin",
    "sticky", "cooperative-sticky"), auto_commit_interval_ms=5000, metadata_max_age_ms=300000 (how often a pattern
    subscription and the leader's partition counts are looked at)."""

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
        settings, _ = resolve_config("consumer", CONSUMER_CONFIG, config, kwargs)
        # fetch answers (up to fetch.max.bytes) are read and freed again and again: from the
        # heap, not from fresh pages (eos/allocator.py)
        keep_large_buffers_in_the_heap(CLIENT_THRESHOLD_BYTES)
        if settings["enable.auto.commit"] and settings["group.id"] is None:
            raise ValueError("enable.auto.commit cannot be true without a group.id")
        if settings["group.instance.id"] is not None and settings["group.id"] is None:
            raise ValueError("group.instance.id cannot be set without a group.id")
        if settings["group.id"] == "":
            raise ValueError("group.id must not be empty (None means no group)")
        if settings["group.instance.id"] == "":
            raise ValueError("group.instance.id must not be empty (None means a dynamic member)")
        if settings["heartbeat.interval.ms"] >= settings["session.timeout.ms"]:
            raise ValueError(f"heartbeat.interval.ms ({settings['heartbeat.interval.ms']}) must be lower than "
                             f"session.timeout.ms ({settings['session.timeout.ms']})")
        if not settings["client.id"]:
            number = next(_client_numbers)
            settings["client.id"] = (f"consumer-{settings['group.id']}-{number}" if settings["group.id"]
                                     else f"consumer-{number}")
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
            metadata_max_age_ms=settings["metadata.max.age.ms"],
            security=channel_security(settings))
        self._metrics = ConsumerMetrics(settings["metrics"], settings["client.id"]) if settings["metrics"] else None
        self._fetches_due = False    # the next poll() sends the Fetches first
        self._fetcher = Fetcher(
            self._metadata, isolation_level=settings["isolation.level"],
            auto_offset_reset=settings["auto.offset.reset"],
            fetch_min_bytes=settings["fetch.min.bytes"],
            fetch_max_wait_ms=settings["fetch.max.wait.ms"],
            fetch_max_bytes=settings["fetch.max.bytes"],
            max_partition_fetch_bytes=settings["max.partition.fetch.bytes"],
            check_crcs=settings["check.crcs"], request_timeout_ms=settings["request.timeout.ms"],
            backoff=net.Backoff(settings["retry.backoff.ms"], settings["retry.backoff.max.ms"]),
            client_id=settings["client.id"], metrics=self._metrics)
        self._group: ConsumerCoordinator | None = None
        if self.group_id is not None:
            self._group = ConsumerCoordinator(
                self._metadata, group_id=self.group_id, group_instance_id=settings["group.instance.id"],
                client_id=settings["client.id"], assignors=settings["partition.assignment.strategy"],
                session_timeout_ms=settings["session.timeout.ms"],
                heartbeat_interval_ms=settings["heartbeat.interval.ms"],
                max_poll_interval_ms=settings["max.poll.interval.ms"],
                request_timeout_ms=settings["request.timeout.ms"],
                backoff=net.Backoff(settings["retry.backoff.ms"], settings["retry.backoff.max.ms"]),
                enable_auto_commit=settings["enable.auto.commit"],
                auto_commit_interval_ms=settings["auto.commit.interval.ms"],
                metadata_max_age_ms=settings["metadata.max.age.ms"],
                assign_partitions=lambda tps: self._fetcher.assign(tps, initial_reset=COMMITTED),
                positions=self._positions, wakeup=self._fetcher.wakeup, metrics=self._metrics)
        self._manually_assigned = False
        self._closing = False
        self._closed = False

    @property
    def isolation_level(self) -> str:
        return ("read_committed" if self._fetcher.isolation_level == IsolationLevel.READ_COMMITTED
                else "read_uncommitted")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this consumer is closed")

    # ---- assignment and subscription -----------------------------------------------------

    def assign(self, partitions: Iterable) -> None:
        """Read exactly these partitions (replacing any earlier assignment). With a group_id,
        positions start at the group's committed offsets and commits carry no generation."""
        self._check_open()
        if self._group is not None and self._group.subscribed:
            raise RuntimeError("this consumer is subscribed: subscribe() and assign() exclude each other; "
                               "call unsubscribe() first")
        tps = [_as_tp(tp) for tp in partitions]
        self._fetcher.assign(tps, initial_reset=COMMITTED if self._group is not None else None)
        self._manually_assigned = bool(tps)

    def assignment(self) -> set[TopicPartition]:
        return set(self._fetcher.states)

    def subscribe(self, topics, listener=None) -> None:
        """Join the group (group_id) for `topics`: a list of topic names, or a compiled regular
        expression (`re.compile("orders-.*")`) matched in full against the cluster's topics,
        again every metadata.max.age.ms. `listener` may have on_partitions_revoked(partitions),
        on_partitions_assigned(partitions) and on_partitions_lost(partitions), called from
        poll() (eager protocol: everything is revoked before each rebalance; cooperative
        protocol: only the partitions that move to another member are revoked, and
        on_partitions_assigned gets only the newly added ones; lost means the generation was
        gone, so commits were no longer possible). An empty list unsubscribes."""
        self._check_open()
        group = self._require_group("subscribe()")
        if self._manually_assigned:
            raise RuntimeError("this consumer has a manual assignment: subscribe() and assign() exclude each "
                               "other; call unsubscribe() first")
        if listener is not None:
            for name in ("on_partitions_revoked", "on_partitions_assigned"):
                if not callable(getattr(listener, name, None)):
                    raise TypeError(f"the rebalance listener must have a callable {name}(partitions)")
        if isinstance(topics, re.Pattern):
            group.subscribe(pattern=topics, listener=listener)
            return
        if isinstance(topics, (str, bytes)) or not isinstance(topics, Iterable):
            raise TypeError(f"subscribe() takes a list of topic names or a compiled re pattern, got {topics!r}")
        names = list(topics)
        for name in names:
            if not isinstance(name, str) or not name:
                raise TypeError(f"topic names are non-empty strings, got {name!r}")
        if not names:
            self.unsubscribe()
            return
        group.subscribe(topics=names, listener=listener)

    def subscription(self) -> set[str]:
        """The topics subscribed to (for a pattern: those it matches now)."""
        return self._group.subscription if self._group is not None else set()

    def unsubscribe(self) -> None:
        """Drop the subscription (revoking the partitions, leaving the group) or the manual
        assignment."""
        self._check_open()
        if self._group is not None and self._group.subscribed:
            self._group.unsubscribe()
        self._fetcher.assign([])
        self._manually_assigned = False

    def _require_group(self, what: str) -> ConsumerCoordinator:
        if self._group is None:
            raise EosError(f"{what} needs a consumer group: construct the Consumer with group_id=...",
                           ErrorCode.INVALID_GROUP_ID)
        return self._group

    def partitions_for(self, topic: str, timeout_ms: int | None = None) -> list[TopicPartition]:
        """Kafka's partitionsFor: the topic's partitions, from one fresh Metadata answer
        (within `timeout_ms`, default.api.timeout.ms): [] for a topic that does not exist,
        and a partition without a leader is listed all the same."""
        self._check_open()
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"topic must be a non-empty str, got {topic!r}")
        return self._topics_answer([topic], timeout_ms).get(topic, [])

    def list_topics(self, timeout_ms: int | None = None) -> dict[str, list[TopicPartition]]:
        """Kafka's listTopics: every topic the cluster lets this client see, the internal
        ones included, each with its partitions."""
        self._check_open()
        return self._topics_answer(None, timeout_ms)

    def _topics_answer(self, topics: list[str] | None, timeout_ms: int | None) -> dict[str, list[TopicPartition]]:
        response = self._metadata.fetch(topics, include_internal=True, timeout_ms=(
            timeout_ms if timeout_ms is not None else self._default_api_timeout_ms))
        found = {}
        for t in response.topics:
            if t.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                continue
            if not t.partitions and t.error_code != ErrorCode.NONE:
                raise error_for(t.error_code, f"the metadata of topic {t.name!r}: {t.error_message}")
            found[t.name] = [TopicPartition(t.name, p.partition) for p in sorted(t.partitions, key=lambda p: p.partition)]
        return found

    def group_metadata(self) -> ConsumerGroupMetadata:
        """group_id, generation_id, member_id and group_instance_id of this member now, for
        Producer.send_offsets_to_transaction (KIP-447: a stale generation is fenced)."""
        self._check_open()
        return self._require_group("group_metadata()").group_metadata()

    # ---- offsets of the group --------------------------------------------------------------

    def _positions(self) -> dict[TopicPartition, int]:
        return {tp: s.position for tp, s in self._fetcher.states.items() if s.position is not None}

    def _offsets_to_commit(self, offsets) -> dict[TopicPartition, OffsetAndMetadata]:
        if offsets is None:
            return {tp: OffsetAndMetadata(o) for tp, o in self._positions().items()}
        result = {}
        for tp, value in dict(offsets).items():
            if isinstance(value, OffsetAndMetadata):
                om = value
            elif isinstance(value, tuple) and len(value) == 2:
                om = OffsetAndMetadata(*value)
            else:
                om = OffsetAndMetadata(value)
            if isinstance(om.offset, bool) or not isinstance(om.offset, int) or om.offset < 0:
                raise ValueError(f"the offset to commit for {tp} must be a non-negative int, got {om.offset!r}")
            if not isinstance(om.metadata, str):
                raise ValueError(f"the commit metadata for {tp} must be a str, got {om.metadata!r}")
            result[_as_tp(tp)] = om
        return result

    def commit(self, offsets=None, asynchronous: bool = False, *, timeout_ms: int | None = None) -> None:
        """Commit `offsets` ({tp: offset of the next record to read}, or OffsetAndMetadata
        values), by default the current position of every assigned partition. Synchronous
        commits retry coordinator errors up to `timeout_ms` (default.api.timeout.ms) and raise
        CommitFailedError when the group rebalanced away from this member."""
        self._check_open()
        group = self._require_group("commit()")
        to_commit = self._offsets_to_commit(offsets)
        if asynchronous:
            group.commit_async(to_commit)
            return
        group.commit_sync(to_commit, timeout_ms if timeout_ms is not None else self._default_api_timeout_ms)

    def commit_async(self, callback=None, offsets=None) -> None:
        """Commit without waiting; `callback(offsets, error_or_None)` runs in a later poll(),
        commit() or close() on this thread."""
        self._check_open()
        self._require_group("commit_async()").commit_async(self._offsets_to_commit(offsets), callback)

    def committed(self, partitions, timeout_ms: int | None = None) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None: nothing committed). Asks with
        require_stable and waits out (with backoff, up to `timeout_ms`) a transactional commit
        still pending, as exactly-once copiers need."""
        self._check_open()
        group = self._require_group("committed()")
        if isinstance(partitions, TopicPartition):
            partitions = [partitions]
        return group.fetch_committed([_as_tp(tp) for tp in partitions],
                                     timeout_ms if timeout_ms is not None else self._default_api_timeout_ms)

    def _positions_from_committed(self, timeout_ms: int, *, raise_on_timeout: bool) -> None:
        """Give partitions awaiting their committed offset a position (or hand them to
        auto.offset.reset when the group has none)."""
        if self._group is None:
            return
        states = self._fetcher.states
        pending = [tp for tp, s in states.items() if s.position is None and s.reset_strategy == COMMITTED]
        if not pending:
            return
        committed = self._group.fetch_committed(pending, timeout_ms, raise_on_timeout=raise_on_timeout)
        for tp, offset in (committed or {}).items():
            state = states.get(tp)
            if state is None or state.position is not None or state.reset_strategy != COMMITTED:
                continue   # re-assigned or sought meanwhile
            if offset is None:
                state.reset_strategy = None
            else:
                state.seek(offset)

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
        tps = _tps_of(partitions) or list(self._fetcher.states)
        for tp in tps:
            self._fetcher.state(tp).request_reset(strategy)

    def pause(self, *partitions) -> None:
        """Kafka's pause(): poll() hands out no records of these (assigned) partitions and no
        Fetch asks for them until resume(); their positions and the records already received
        are kept, and the group is not rebalanced. A partition not assigned raises ValueError,
        and then none is paused. A partition revoked by a rebalance forgets its pause."""
        self._set_paused(partitions, True)

    def resume(self, *partitions) -> None:
        """Undo pause() for these partitions: their records come again from their positions."""
        self._set_paused(partitions, False)

    def paused(self) -> set[TopicPartition]:
        """The assigned partitions paused now."""
        return {tp for tp, state in self._fetcher.states.items() if state.paused}

    def _set_paused(self, partitions, paused: bool) -> None:
        self._check_open()
        states = [self._fetcher.state(tp) for tp in _tps_of(partitions)]    # all checked first
        for state in states:
            state.paused = paused

    def position(self, tp, timeout_ms: int | None = None) -> int:
        """The offset of the next record poll() returns for `tp` (resolving a pending
        reset with ListOffsets, up to `timeout_ms`, default default.api.timeout.ms)."""
        self._check_open()
        state = self._fetcher.state(_as_tp(tp))
        if state.position is None:
            timeout_ms = timeout_ms if timeout_ms is not None else self._default_api_timeout_ms
            self._positions_from_committed(timeout_ms, raise_on_timeout=True)
            self._fetcher.reset_positions(timeout_ms)
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
        group = self._group
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        if self._fetches_due:
            self._fetches_due = False
            fetcher.send_fetches()
        while True:
            if group is not None:
                fetcher.wakeup.clear()
                group.poll(int(deadline * 1000))
                if not group.ready():
                    # A rebalance in progress: its RPCs finish in the background and wake us.
                    remaining_s = deadline - time.monotonic()
                    if remaining_s <= 0:
                        return []
                    fetcher.wakeup.wait(min(remaining_s, GROUP_WAIT_S))
                    continue
            # The next Fetch: at once if a partition is behind its log end, else at the
            # next poll() (see the module doc).
            if fetcher.handle_arrivals() and fetcher.has_records_waiting():
                fetcher.send_fetches()
            records = fetcher.collect(max_records)
            if records:
                if fetcher.has_records_waiting():
                    fetcher.send_fetches()     # partitions that collect() made fetchable again
                else:
                    self._fetches_due = True
                return records
            fetcher.raise_pending_error()
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if any(s.position is None for s in fetcher.states.values()):
                # Within the poll's time (at least a second, so that poll(0) can finish a
                # reset against a live broker); a broker that is away is tried again later.
                try:
                    self._positions_from_committed(max(remaining_ms, RESET_BUDGET_MIN_MS), raise_on_timeout=False)
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
            if group is not None and (not group.ready() or group.rebalance_step_due()):
                # The heartbeat thread asked for a rejoin, or a JoinGroup/SyncGroup was answered
                # (their wakeups may be cleared above); a cooperative member keeps fetching
                # through a rebalance, so it must not sleep on its fetches meanwhile.
                continue
            # Wait for a Fetch to finish, or (nothing in flight: leaders unknown, backing
            # off) a short while before trying again.
            wait_s = remaining_ms / 1000 if fetcher.has_in_flight else min(remaining_ms / 1000, 0.05)
            fetcher.wait(wait_s)

    # ---- shutdown ------------------------------------------------------------------------

    def close(self, timeout_ms: int | None = None) -> None:
        """Commit (enable.auto.commit), revoke, leave the group (a static member stays until
        its session times out), and release everything; bounded by `timeout_ms` (30 s)."""
        if self._closed or self._closing:
            return
        self._closing = True    # the listener may still use the consumer (commit on revoke)
        try:
            if self._group is not None:
                self._group.close(timeout_ms if timeout_ms is not None else CLOSE_TIMEOUT_MS)
        finally:
            self._closed = True
            self._fetcher.close()
            self._metadata.close()
            if self._metrics is not None:
                self._metrics.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

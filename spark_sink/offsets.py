"""Offsets and read planning for the eos Spark source: pure functions, no I/O, no Spark.

Theory of operation
-------------------
The source reads the partitions of the subscribed topics. Everything it decides is
decided here, from numbers the caller fetched (the partitions of each topic, their
earliest offsets and their *upper bounds*: the last stable offset under read_committed,
the high watermark under read_uncommitted):

- `parse_options` turns Spark's string options into a checked `SourceOptions`, naming the
  option and the problem for any bad value; nothing is contacted before they are valid.
- An offset position is a dict {TopicPartition: offset}. On the wire to Spark (the offset
  log of a streaming query, and the startingOffsets / endingOffsets options) it is JSON
  {"topic": {"0": 23, "1": 42}}, as in Spark's Kafka source; `to_json_dict` and
  `from_json_dict` convert. In options, -2 means earliest and -1 latest (Kafka's
  sentinels); offsets Spark hands back to us are always concrete.
- `resolve_offsets` turns a spec (earliest, latest or per-partition JSON) into concrete
  offsets for the partitions that exist now.
- `check_start` applies failOnDataLoss: a start below the earliest offset (retention
  deleted records not yet read), a start above the upper bound (the topic was recreated),
  or a partition that vanished, raise `DataLossError` -- or, with failOnDataLoss=false,
  are moved to where reading can go on, and reported.
- `limit_by_records` is the admission control of maxRecordsPerTrigger: the records
  admitted are shared among the partitions in proportion to what each has waiting
  (largest remainders first, so the total is exact and a trigger always makes progress).
  An offset span is an upper bound on the records in it: under read_committed, markers
  and aborted records take offsets but are never read.
- `plan_ranges` cuts [start, end) of every partition into `OffsetRange`s; a range of more
  than maxRecordsPerPartition offsets is split into even pieces. `plan_tasks` turns them
  into Spark tasks: one range each (as Spark's Kafka source does), split further until
  there are minPartitions (Kafka's option: the largest range is halved, again and again);
  or, with numPartitions (eos's), exactly that many tasks of near-equal offset counts, the
  ranges packed into them in order and cut where a task is full. Packing matters when a
  batch is small next to Spark's cost per task: 3 partitions on 2 cores are 2 waves of
  tasks, numPartitions=2 makes them one; and a topic of 50 partitions need not be 50 tasks.
  With none of the three task options, a batch of more ranges than the session has task
  slots (`task_slots`: Spark's default parallelism, which `spark_sink.register` reads from
  the session) is packed into that many tasks, so it runs in one wave; a batch of fewer
  ranges keeps one task per range, as Spark's Kafka source does.

The end of a batch never passes the upper bound the caller passes in, so under
read_committed an open transaction in the input holds the batch boundary back: its
records, and everything after them, wait for the next trigger after the decision.
"""
from __future__ import annotations

import json
from typing import Mapping, NamedTuple

from eos.client_config import security_settings
from eos.errors import OffsetOutOfRangeError
from eos.types import TopicPartition

EARLIEST = -2   # Kafka's sentinel in startingOffsets / endingOffsets JSON
LATEST = -1

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
POLL_TIMEOUT_MS_DEFAULT = 120_000     # as Spark's kafkaConsumer.pollTimeoutMs
OFFSET_LIMIT = 2**63 - 1

KNOWN_OPTIONS = (
    "bootstrap", "subscribe", "startingOffsets", "endingOffsets", "maxRecordsPerTrigger",
    "maxRecordsPerPartition", "minPartitions", "numPartitions", "isolation", "failOnDataLoss",
    "pollTimeoutMs",
)


CLIENT_OPTION_PREFIX = "kafka."


class SourceOptionError(ValueError):
    """An option of the eos source is missing or malformed; the message names it."""


class DataLossError(OffsetOutOfRangeError):
    """Records the query should read are gone (failOnDataLoss=true, the default)."""


class OffsetSpec(NamedTuple):
    """"earliest", "latest", or "specific" with {TopicPartition: offset or sentinel}."""

    kind: str
    offsets: dict

    @classmethod
    def earliest(cls) -> OffsetSpec:
        return cls("earliest", {})

    @classmethod
    def latest(cls) -> OffsetSpec:
        return cls("latest", {})


class SourceOptions(NamedTuple):
    bootstrap: str
    topics: tuple[str, ...]
    starting: OffsetSpec
    ending: OffsetSpec | None          # batch reads only
    max_records_per_trigger: int | None
    max_records_per_partition: int | None
    isolation: str
    fail_on_data_loss: bool
    poll_timeout_ms: int
    min_partitions: int | None = None
    num_partitions: int | None = None
    # Spark's Kafka source convention: kafka.<setting> options carry the clients' security
    # settings (kafka.security.protocol, kafka.ssl.ca.location, kafka.sasl.username, ...).
    client_config: tuple[tuple[str, str], ...] = ()
    # The session's default parallelism (None: unknown; spark_sink.register sets it, no
    # option does); see plan_tasks.
    task_slots: int | None = None


class OffsetRange(NamedTuple):
    """One Spark task's work: offsets [start_offset, end_offset_exclusive) of a partition."""

    topic: str
    partition: int
    start_offset: int
    end_offset_exclusive: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def offset_count(self) -> int:
        return self.end_offset_exclusive - self.start_offset


# ---- options ------------------------------------------------------------------------------

def _lookup(options: Mapping[str, str]) -> dict[str, str]:
    """Options by lower-case name (Spark's option names are case-insensitive)."""
    folded: dict[str, str] = {}
    for name, value in options.items():
        folded[str(name).lower()] = value
    return folded


def _positive_int(name: str, text) -> int:
    try:
        number = int(str(text).strip())
    except ValueError:
        raise SourceOptionError(f"option {name} must be a positive integer, got {text!r}") from None
    if number < 1:
        raise SourceOptionError(f"option {name} must be a positive integer, got {text!r}")
    return number


def _boolean(name: str, text) -> bool:
    value = str(text).strip().lower()
    if value not in ("true", "false"):
        raise SourceOptionError(f"option {name} must be true or false, got {text!r}")
    return value == "true"


def parse_topics(text) -> tuple[str, ...]:
    topics = tuple(t.strip() for t in str(text).split(","))
    if not topics or any(not t for t in topics):
        raise SourceOptionError(
            f"option subscribe must be a comma-separated list of topic names, got {text!r}")
    duplicates = sorted({t for t in topics if topics.count(t) > 1})
    if duplicates:
        raise SourceOptionError(f"option subscribe names {', '.join(duplicates)} more than once")
    return topics


def parse_offset_spec(name: str, text, *, sentinels: tuple[int, ...]) -> OffsetSpec:
    """ "earliest" | "latest" | JSON {"topic": {"partition": offset}}. `sentinels` are the
    negative values the JSON may use (-2 earliest, -1 latest)."""
    raw = str(text).strip()
    lowered = raw.lower()
    if lowered == "earliest" and EARLIEST in sentinels:
        return OffsetSpec.earliest()
    if lowered == "latest" and LATEST in sentinels:
        return OffsetSpec.latest()
    allowed = " or ".join([w for w, s in (("earliest", EARLIEST), ("latest", LATEST)) if s in sentinels])
    try:
        document = json.loads(raw)
    except ValueError as exc:
        raise SourceOptionError(
            f"option {name} must be {allowed} or JSON like {{\"topic\": {{\"0\": 23}}}}; "
            f"{raw!r} is neither ({exc})") from None
    offsets = from_json_dict(document, what=f"option {name}", sentinels=sentinels)
    return OffsetSpec("specific", offsets)


def from_json_dict(document, *, what: str = "offsets", sentinels: tuple[int, ...] = ()) -> dict:
    """{"topic": {"0": 23}} (parsed JSON) -> {TopicPartition: offset}, every value checked."""
    if not isinstance(document, dict):
        raise SourceOptionError(f"{what} must be a JSON object of topics, got {document!r}")
    offsets: dict[TopicPartition, int] = {}
    for topic, partitions in document.items():
        if not isinstance(topic, str) or not topic:
            raise SourceOptionError(f"{what}: topic names must be non-empty strings, got {topic!r}")
        if not isinstance(partitions, dict):
            raise SourceOptionError(
                f"{what}: topic {topic!r} must map partition numbers to offsets, got {partitions!r}")
        for partition_text, offset in partitions.items():
            try:
                partition = int(partition_text)
            except (TypeError, ValueError):
                partition = -1
            if partition < 0 or str(partition) != str(partition_text).strip():
                raise SourceOptionError(
                    f"{what}: partition {partition_text!r} of topic {topic!r} is not a partition number")
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise SourceOptionError(
                    f"{what}: offset of {topic}-{partition} must be an integer, got {offset!r}")
            if offset < 0 and offset not in sentinels:
                meanings = ", ".join(f"{s} ({'earliest' if s == EARLIEST else 'latest'})" for s in sentinels)
                raise SourceOptionError(
                    f"{what}: offset {offset} of {topic}-{partition} is negative"
                    + (f"; the only negative values allowed here are {meanings}" if meanings else ""))
            if offset > OFFSET_LIMIT:
                raise SourceOptionError(f"{what}: offset {offset} of {topic}-{partition} is too large")
            offsets[TopicPartition(topic, partition)] = offset
    return offsets


def to_json_dict(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """{TopicPartition: offset} -> {"topic": {"0": offset}}, sorted, as Spark stores it."""
    document: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        document.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return document


def parse_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Check every option of a read (`streaming` for readStream) before anything runs."""
    given = _lookup(options)
    known = {name.lower(): name for name in KNOWN_OPTIONS}
    client_config = {name[len(CLIENT_OPTION_PREFIX):]: value for name, value in given.items()
                     if name.startswith(CLIENT_OPTION_PREFIX)}
    try:
        security_settings("the eos source's kafka.* options", client_config)
    except ValueError as exc:
        raise SourceOptionError(str(exc)) from None
    # Spark adds "path" for load(path); we have no use for it and say so.
    unknown = sorted(name for name in set(given) - set(known) if not name.startswith(CLIENT_OPTION_PREFIX))
    if unknown:
        raise SourceOptionError(
            f"unknown option(s) of the eos source: {', '.join(unknown)} "
            f"(known: {', '.join(KNOWN_OPTIONS)}, and kafka.<security setting>)")
    bootstrap = str(given.get("bootstrap", "")).strip()
    if not bootstrap:
        raise SourceOptionError(
            'option bootstrap is required: the broker address, e.g. .option("bootstrap", "127.0.0.1:9092")')
    if "subscribe" not in given:
        raise SourceOptionError(
            'option subscribe is required: the topics to read, e.g. .option("subscribe", "orders,payments")')
    topics = parse_topics(given["subscribe"])

    if "startingoffsets" in given:
        starting = parse_offset_spec("startingOffsets", given["startingoffsets"], sentinels=(EARLIEST, LATEST))
    else:
        # Spark's Kafka source: a new stream starts at the end, a batch read at the beginning.
        starting = OffsetSpec.latest() if streaming else OffsetSpec.earliest()
    ending = None
    if "endingoffsets" in given:
        if streaming:
            raise SourceOptionError("option endingOffsets is for batch reads (spark.read); "
                                    "a stream has no end")
        ending = parse_offset_spec("endingOffsets", given["endingoffsets"], sentinels=(LATEST,))
    elif not streaming:
        ending = OffsetSpec.latest()
    if ending is not None and starting.kind == "latest":
        raise SourceOptionError("option startingOffsets=latest makes a batch read empty; "
                                "use earliest or JSON offsets")

    max_per_trigger = None
    if "maxrecordspertrigger" in given:
        if not streaming:
            raise SourceOptionError("option maxRecordsPerTrigger is for streaming reads (spark.readStream)")
        max_per_trigger = _positive_int("maxRecordsPerTrigger", given["maxrecordspertrigger"])
    max_per_partition = None
    if "maxrecordsperpartition" in given:
        max_per_partition = _positive_int("maxRecordsPerPartition", given["maxrecordsperpartition"])
    min_partitions = num_partitions = None
    if "minpartitions" in given:
        min_partitions = _positive_int("minPartitions", given["minpartitions"])
    if "numpartitions" in given:
        num_partitions = _positive_int("numPartitions", given["numpartitions"])
        others = [name for name, value in (("minPartitions", min_partitions),
                                           ("maxRecordsPerPartition", max_per_partition)) if value is not None]
        if others:
            raise SourceOptionError(f"option numPartitions sets the number of tasks itself; it cannot be "
                                    f"combined with {' or '.join(others)}")
    isolation = str(given.get("isolation", "read_committed")).strip().lower()
    if isolation not in ISOLATION_LEVELS:
        raise SourceOptionError(f"option isolation must be read_committed or read_uncommitted, "
                                f"got {given['isolation']!r}")
    fail_on_data_loss = _boolean("failOnDataLoss", given.get("failondataloss", "true"))
    poll_timeout_ms = _positive_int("pollTimeoutMs", given.get("polltimeoutms", POLL_TIMEOUT_MS_DEFAULT))
    return SourceOptions(bootstrap, topics, starting, ending, max_per_trigger, max_per_partition,
                         isolation, fail_on_data_loss, poll_timeout_ms, min_partitions, num_partitions,
                         tuple(sorted(client_config.items())))


# ---- resolving and checking offsets -------------------------------------------------------

def resolve_offsets(spec: OffsetSpec, partitions: list[TopicPartition], earliest: Mapping,
                    latest: Mapping, *, option: str) -> dict[TopicPartition, int]:
    """Concrete offsets for `partitions` from a spec. JSON must name every partition of the
    subscribed topics and nothing else (as Spark's Kafka source requires)."""
    if spec.kind == "earliest":
        return {tp: earliest[tp] for tp in partitions}
    if spec.kind == "latest":
        return {tp: latest[tp] for tp in partitions}
    wanted = set(partitions)
    named = set(spec.offsets)
    extra = sorted(named - wanted)
    if extra:
        raise SourceOptionError(
            f"option {option} names {_names(extra)}, which the query does not read "
            f"(not subscribed, or no such partition)")
    missing = sorted(wanted - named)
    if missing:
        raise SourceOptionError(
            f"option {option} must give an offset for every partition of the subscribed topics; "
            f"missing: {_names(missing)} (use -2 for earliest, -1 for latest)")
    resolved = {}
    for tp in partitions:
        offset = spec.offsets[tp]
        resolved[tp] = earliest[tp] if offset == EARLIEST else latest[tp] if offset == LATEST else offset
    return resolved


def _names(tps) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in tps)


class StartCheck(NamedTuple):
    start: dict            # {tp: offset} to read from
    problems: list         # what was lost, one sentence each (empty when nothing was)


def check_start(start: Mapping[TopicPartition, int], partitions: list[TopicPartition],
                earliest: Mapping, upper: Mapping, *, fail_on_data_loss: bool) -> StartCheck:
    """Where reading can begin for each current partition, applying failOnDataLoss.

    A partition in `partitions` but not in `start` was added after the query began: it is
    read from offset 0, as every partition starts there (if retention already deleted its
    head, that is a loss too). A partition in `start` that no longer exists is a loss."""
    adjusted: dict[TopicPartition, int] = {}
    problems: list[str] = []
    for tp in partitions:
        offset = start.get(tp, 0)
        if offset < earliest[tp]:
            problems.append(
                f"{tp.topic}-{tp.partition}: offsets {offset}..{earliest[tp] - 1} were deleted "
                f"(the earliest offset is now {earliest[tp]}) before the query read them")
            offset = earliest[tp]
        elif offset > upper[tp]:
            problems.append(
                f"{tp.topic}-{tp.partition}: the query is at offset {offset} but the partition "
                f"ends at {upper[tp]} (was the topic deleted and created again?)")
            offset = upper[tp]
        adjusted[tp] = offset
    gone = sorted(set(start) - set(partitions))
    if gone:
        problems.append(f"partition(s) {_names(gone)} no longer exist")
    if problems and fail_on_data_loss:
        raise DataLossError(
            "eos source: data the query has not read is gone: " + "; ".join(problems)
            + ". Set option failOnDataLoss=false to skip what is lost and carry on.")
    return StartCheck(adjusted, problems)


# ---- admission control and splitting ------------------------------------------------------

def limit_by_records(start: Mapping[TopicPartition, int], available_end: Mapping[TopicPartition, int],
                     max_records: int) -> dict[TopicPartition, int]:
    """End offsets admitting at most `max_records` offsets past `start` in all, shared in
    proportion to what each partition has waiting. Deterministic; exact total
    min(max_records, waiting); each partition's end stays within [start, available_end]."""
    if max_records < 1:
        raise SourceOptionError(f"maxRecordsPerTrigger must be positive, got {max_records}")
    waiting = {tp: max(0, available_end[tp] - start.get(tp, 0)) for tp in available_end}
    total = sum(waiting.values())
    if total <= max_records:
        return dict(available_end)
    shares = {tp: lag * max_records // total for tp, lag in waiting.items()}
    left = max_records - sum(shares.values())
    # Largest remainder first; ties by partition so the answer is the same on every call.
    order = sorted(waiting, key=lambda tp: (-(waiting[tp] * max_records % total), tp))
    for tp in order[:left]:
        shares[tp] += 1
    end = {}
    for tp, available in available_end.items():
        begin = start.get(tp, 0)
        end[tp] = available if waiting[tp] == 0 else begin + shares[tp]
    return end


def plan_ranges(start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int],
                max_records_per_partition: int | None = None) -> list[OffsetRange]:
    """The tasks of a batch: [start, end) per partition, empty ranges dropped, ranges over
    `max_records_per_partition` offsets split into near-equal pieces. A partition missing
    from `start` starts at 0 (it was added after `start` was taken)."""
    ranges: list[OffsetRange] = []
    for tp in sorted(end):
        begin = start.get(tp, 0)
        finish = end[tp]
        count = finish - begin
        if count <= 0:
            continue
        pieces = 1
        if max_records_per_partition is not None and count > max_records_per_partition:
            pieces = -(-count // max_records_per_partition)
        size, extra = divmod(count, pieces)
        offset = begin
        for index in range(pieces):
            length = size + (1 if index < extra else 0)
            ranges.append(OffsetRange(tp.topic, tp.partition, offset, offset + length))
            offset += length
    return ranges


def plan_tasks(start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int], *,
               max_records_per_partition: int | None = None, min_partitions: int | None = None,
               num_partitions: int | None = None,
               task_slots: int | None = None) -> list[tuple[OffsetRange, ...]]:
    """The Spark tasks of a batch, each the ranges it reads in order (see the module doc).
    Together they cover every offset of `plan_ranges(start, end)` once."""
    ranges = plan_ranges(start, end, max_records_per_partition)
    if num_partitions is not None:
        return _pack(ranges, num_partitions)
    if (task_slots is not None and len(ranges) > task_slots
            and min_partitions is None and max_records_per_partition is None):
        # Each task pays for a Python worker, a consumer and (behind an eos sink) a
        # participant producer: one wave of fuller tasks beats two waves of smaller ones.
        return _pack(ranges, task_slots)
    if min_partitions is not None:
        while len(ranges) < min_partitions:
            largest = max(range(len(ranges)), key=lambda i: ranges[i].offset_count, default=None)
            if largest is None or ranges[largest].offset_count < 2:
                break       # nothing left to split
            r = ranges[largest]
            middle = r.start_offset + r.offset_count // 2
            ranges[largest:largest + 1] = [r._replace(end_offset_exclusive=middle), r._replace(start_offset=middle)]
    return [(r,) for r in ranges]


def _pack(ranges: list[OffsetRange], tasks: int) -> list[tuple[OffsetRange, ...]]:
    """`tasks` tasks of near-equal offset counts (fewer when there are fewer offsets), the
    ranges taken in order and cut where a task is full."""
    total = sum(r.offset_count for r in ranges)
    tasks = min(tasks, total)
    if tasks <= 0:
        return []
    size, extra = divmod(total, tasks)
    planned: list[tuple[OffsetRange, ...]] = []
    pending = list(ranges)
    for index in range(tasks):
        room = size + (1 if index < extra else 0)
        task: list[OffsetRange] = []
        while room > 0:
            r = pending.pop(0)
            if r.offset_count > room:
                cut = r.start_offset + room
                task.append(r._replace(end_offset_exclusive=cut))
                pending.insert(0, r._replace(start_offset=cut))
                room = 0
            else:
                task.append(r)
                room -= r.offset_count
        planned.append(tuple(task))
    return planned

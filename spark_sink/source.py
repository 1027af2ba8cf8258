"""The Spark data source "eos": `spark.read.format("eos")` and `spark.readStream.format("eos")`.

Theory of operation
-------------------
A PySpark Python Data Source (pyspark >= 4.2, for admission control). Three places run
code, and each does one job:

- The *planner* (a Python worker next to Spark's driver) decides offsets. It asks the
  broker, through `eos.Admin`, for the partitions of the subscribed topics, their earliest
  offsets and their *upper bounds* -- ListOffsets "latest" at the query's isolation level,
  which the broker answers with the last stable offset under read_committed -- and hands
  the numbers to the pure planning functions of `spark_sink.offsets`. A batch end never
  passes the upper bound, so an open transaction in the input holds the boundary back.
  A subscribed topic it has seen exist, which a broker now calls unknown (one that has
  just restarted answers so until the controller's metadata reaches it), is asked again
  for up to TOPIC_REAPPEAR_WAIT_S; a topic never seen fails at once.
- The *executors* read. Each `EosInputPartition` is one or more offset ranges [start, end)
  (one per topic partition by default; `spark_sink.offsets.plan_tasks`); its task opens
  its own `eos.Consumer` (no group), assigns all the partitions of its ranges at once,
  seeks each to its start and polls until each one's position reaches its end (ranges of
  one partition in turn). Under read_committed, markers and aborted records take
  offsets but are never returned, so the task stops on the position, never on a count.
  A poll asks for no more records than the longest range still needs, and the consumer
  decodes a batch only as far as it hands it out: a range that ends inside a batch of
  thousands does not decode the rest. Records go to Spark as Arrow record batches, built
  column by column, one partition's records each. No record ever passes through the
  driver.
- Spark's streaming engine keeps the offsets: the JSON {topic: {partition: offset}} that
  `latestOffset` returns is written to the query's offset log, and a restarted query
  replays a batch from exactly the same range. `commit` keeps nothing: the exactly-once
  sink commits the input offsets inside its own transaction.

Options (names are case-insensitive, as Spark's are):

  bootstrap               broker "host:port[,host:port]" (required)
  subscribe               comma-separated topics (required)
  startingOffsets         earliest | latest | JSON {"t": {"0": 23, "1": -2}} (-2 earliest,
                          -1 latest); default latest for streams, earliest for batch reads
  endingOffsets           batch reads: latest (default) | JSON (-1 latest)
  maxRecordsPerTrigger    streams: at most this many offsets per micro-batch, shared
                          among the partitions in proportion to what each has waiting
  maxRecordsPerPartition  a range of more offsets than this is split into several Spark
                          partitions (tasks) of near-equal size
  minPartitions           at least this many tasks (Kafka's option): the largest ranges
                          are split until there are
  numPartitions           exactly this many tasks of near-equal offset counts, ranges packed
                          into them (eos's; e.g. the executors' cores, so that a small
                          micro-batch runs in one wave); not with the two above
  (none of these three)   one task per partition; but a batch of more partitions than the
                          session's default parallelism (spark_sink.register reads it) is
                          packed into that many tasks. minPartitions=1 keeps one task per
                          partition always, as Spark's Kafka source does
  isolation               read_committed (default) | read_uncommitted
  failOnDataLoss          true (default): raise when records the query has not read were
                          deleted, or a partition vanished; false: skip them and go on
  pollTimeoutMs           a task that makes no progress for this long fails (120000)

Known limit: Spark calls `initialOffset` again when a query restarts before its first
batch committed; with startingOffsets=latest the first batch may then begin later than
it first did (Spark's Kafka source keeps the first start in its checkpoint; the Python
API gives a source no checkpoint directory). Use earliest or JSON offsets where that
matters.
"""
from __future__ import annotations

import collections
import itertools
import logging
import operator
import time
from typing import Iterator

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from eos.errors import EosError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from eos.types import TopicPartition
from spark_sink.offsets import (
    DataLossError,
    OffsetRange,
    SourceOptionError,
    SourceOptions,
    check_start,
    from_json_dict,
    limit_by_records,
    parse_options,
    plan_tasks,
    resolve_offsets,
    to_json_dict,
)
from spark_sink.worker_heap import freeze_worker_heap

log = logging.getLogger("eos.spark.source")

SOURCE_NAME = "eos"
HEADERS_TYPE = ArrayType(StructType([
    StructField("key", StringType(), True),
    StructField("value", BinaryType(), True),
]), True)
SCHEMA = StructType([
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("topic", StringType(), True),
    StructField("partition", IntegerType(), True),
    StructField("offset", LongType(), True),
    StructField("timestamp", TimestampType(), True),
    StructField("timestampType", IntegerType(), True),
    StructField("headers", HEADERS_TYPE, True),
])

# Records per poll, and so per Arrow batch handed to Spark: big enough that the per-batch
# cost of Arrow disappears, small enough to stay a few MB.
RECORDS_PER_POLL_MAX = 8192
# One poll waits at most this long; the task then checks its position again (a range
# that ends in markers is finished by the consumer's position without any record).
POLL_SLICE_MS = 100
# A task reads offsets below the upper bound the planner saw, so the broker always has them:
# a long poll never helps it. It would only hold the prefetch of a partition that just
# finished at the broker (fetch.max.wait.ms, 500 ms) while the partitions still being read
# wait behind it (one Fetch in flight per broker).
FETCH_MAX_WAIT_MS = 10
# How long the planner asks again for a topic it has seen exist that a broker now calls
# unknown (a broker just restarted, its metadata not yet in), and how often.
TOPIC_REAPPEAR_WAIT_S = 30.0
TOPIC_REAPPEAR_BACKOFF_S = 0.1


class EosInputPartition(InputPartition):
    """One task's work: `OffsetRange`s read in order (picklable; sent to the executor)."""

    def __init__(self, offset_ranges: tuple[OffsetRange, ...]):
        super().__init__(tuple(tuple(r) for r in offset_ranges))
        self.offset_ranges = tuple(offset_ranges)

    def __repr__(self) -> str:
        shown = ", ".join(f"{r.topic}-{r.partition} [{r.start_offset}, {r.end_offset_exclusive})"
                          for r in self.offset_ranges)
        return f"EosInputPartition({shown})"


def _tasks(options: SourceOptions, start, end) -> list[EosInputPartition]:
    return [EosInputPartition(task) for task in plan_tasks(
        start, end, max_records_per_partition=options.max_records_per_partition,
        min_partitions=options.min_partitions, num_partitions=options.num_partitions,
        task_slots=options.task_slots)]


class EosDataSource(DataSource):
    """`spark.dataSource.register(EosDataSource)`, then `.format("eos")`.

    `spark_sink.register(spark)` registers a subclass whose `task_slots` is the session's
    default parallelism (see `spark_sink.offsets.plan_tasks`)."""

    task_slots: int | None = None

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return EosBatchReader(parse_options(self.options, streaming=False)._replace(task_slots=self.task_slots))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return EosStreamReader(parse_options(self.options, streaming=True)._replace(task_slots=self.task_slots))


# ---- the planner's view of the broker -----------------------------------------------------

class _BrokerOffsets:
    """Partitions, earliest offsets and upper bounds, from the broker (planner side only).

    Owns one `eos.Admin`, opened on first use and never pickled: the readers that hold
    this object are shipped to the executors, which do not need it."""

    def __init__(self, options: SourceOptions):
        self.options = options
        self._admin = None
        self._described: set[str] = set()        # topics this planner has seen exist

    def _client(self):
        if self._admin is None:
            from eos.admin import Admin
            self._admin = Admin(self.options.bootstrap, config=dict(self.options.client_config))
        return self._admin

    def partitions(self) -> list[TopicPartition]:
        admin = self._client()
        found: list[TopicPartition] = []
        for topic in self.options.topics:
            # A topic seen before is asked again for a while: a broker that has just
            # restarted answers "unknown topic" until the controller's metadata reaches it.
            # A topic never seen fails at once.
            deadline = time.monotonic() + (TOPIC_REAPPEAR_WAIT_S if topic in self._described else 0)
            while True:
                try:
                    described = admin.describe_topic(topic)
                    break
                except UnknownTopicOrPartitionError:
                    if time.monotonic() >= deadline:
                        raise UnknownTopicOrPartitionError(
                            f"eos source: topic {topic!r} (option subscribe) does not exist on "
                            f"{self.options.bootstrap}") from None
                    time.sleep(TOPIC_REAPPEAR_BACKOFF_S)
            self._described.add(topic)
            found.extend(TopicPartition(topic, p["partition"]) for p in described["partitions"])
        return found

    def earliest(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return self._client().list_offsets({tp: "earliest" for tp in partitions},
                                            isolation_level=self.options.isolation)

    def upper(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The exclusive offset a reader may go to: the LSO under read_committed."""
        return self._client().list_offsets({tp: "latest" for tp in partitions},
                                           isolation_level=self.options.isolation)

    def close(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            admin.close()

    def __getstate__(self):
        return {"options": self.options, "_admin": None, "_described": set()}


# ---- batch reads --------------------------------------------------------------------------

class EosBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions):
        self.options = options
        self._broker = _BrokerOffsets(options)

    def partitions(self) -> list[EosInputPartition]:
        options = self.options
        try:
            tps = self._broker.partitions()
            earliest = self._broker.earliest(tps)
            upper = self._broker.upper(tps)
        finally:
            self._broker.close()
        start = resolve_offsets(options.starting, tps, earliest, upper, option="startingOffsets")
        end = resolve_offsets(options.ending, tps, earliest, upper, option="endingOffsets")
        for tp in tps:
            if end[tp] > upper[tp]:
                raise SourceOptionError(
                    f"option endingOffsets: offset {end[tp]} of {tp.topic}-{tp.partition} is past "
                    f"the end of the partition ({upper[tp]} under {options.isolation})")
            if start[tp] > end[tp]:
                raise SourceOptionError(
                    f"{tp.topic}-{tp.partition}: startingOffsets {start[tp]} is after "
                    f"endingOffsets {end[tp]}")
        checked = check_start(start, tps, earliest, upper, fail_on_data_loss=options.fail_on_data_loss)
        for problem in checked.problems:
            log.warning("eos source: data loss (failOnDataLoss=false): %s", problem)
        return _tasks(options, checked.start, end)

    def read(self, partition: EosInputPartition) -> Iterator:
        return read_ranges(self.options, partition.offset_ranges)


# ---- streaming reads ----------------------------------------------------------------------

class EosStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions):
        self.options = options
        self._broker = _BrokerOffsets(options)
        self._available_now_end: dict[TopicPartition, int] | None = None
        self._last_upper: dict[TopicPartition, int] | None = None

    def __getstate__(self):
        # Shipped to executors for read(): they need the options only.
        return {"options": self.options, "_broker": _BrokerOffsets(self.options),
                "_available_now_end": None, "_last_upper": None}

    def _snapshot(self):
        tps = self._broker.partitions()
        earliest = self._broker.earliest(tps)
        upper = self._broker.upper(tps)
        self._last_upper = upper
        return tps, earliest, upper

    def initialOffset(self) -> dict:
        tps, earliest, upper = self._snapshot()
        start = resolve_offsets(self.options.starting, tps, earliest, upper, option="startingOffsets")
        checked = check_start(start, tps, earliest, upper, fail_on_data_loss=self.options.fail_on_data_loss)
        return to_json_dict(checked.start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger is not None:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # What "available now" means: the upper bounds at this moment. Later batches never
        # pass them, so the query drains what was there and stops. (The earliest offsets
        # are not needed here: latestOffset checks its start against them.)
        upper = self._broker.upper(self._broker.partitions())
        self._last_upper = upper
        self._available_now_end = dict(upper)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        start_offsets = from_json_dict(start, what="start offset from Spark's offset log")
        tps, earliest, upper = self._snapshot()
        checked = check_start(start_offsets, tps, earliest, upper,
                              fail_on_data_loss=self.options.fail_on_data_loss)
        for problem in checked.problems:
            log.warning("eos source: data loss (failOnDataLoss=false): %s", problem)
        available = dict(upper)
        if self._available_now_end is not None:
            for tp in available:
                # A partition added after the query began drains only to its bound at
                # preparation time too (0 when it did not exist then).
                available[tp] = max(checked.start[tp], min(available[tp], self._available_now_end.get(tp, 0)))
        if isinstance(limit, ReadMaxRows):
            end = limit_by_records(checked.start, available, limit.max_rows)
        else:
            end = available
        return to_json_dict(end)

    def reportLatestOffset(self) -> dict | None:
        return None if self._last_upper is None else to_json_dict(self._last_upper)

    def partitions(self, start: dict, end: dict) -> list[EosInputPartition]:
        start_offsets = from_json_dict(start, what="start offset from Spark's offset log")
        end_offsets = from_json_dict(end, what="end offset from Spark's offset log")
        return _tasks(self.options, start_offsets, end_offsets)

    def read(self, partition: EosInputPartition) -> Iterator:
        return read_ranges(self.options, partition.offset_ranges)

    def commit(self, end: dict) -> None:
        # Nothing to keep: offsets live in Spark's offset log, and the exactly-once sink
        # commits them to the consumer group inside its transaction.
        pass

    def stop(self) -> None:
        self._broker.close()


# ---- the executor side --------------------------------------------------------------------

def read_ranges(options: SourceOptions, offset_ranges) -> Iterator:
    """The records of every [start, end) of a task, as Arrow record batches, through one
    consumer.

    The task's partitions are read together: all assigned at once, so one Fetch brings
    data for each of them and no range waits for the one before it (read in turn, each
    range paid its own round trips, and the prefetch of a finished partition held the next
    one's first Fetch up). A partition that reaches its end leaves the assignment. Ranges
    of one partition are read in offset order, adjacent ones as one. Batches of different
    partitions interleave; within a partition, records keep their order."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from consumer import Consumer

    freeze_worker_heap()
    queues = _ranges_by_partition(offset_ranges)
    if not queues:
        return
    arrow_schema = to_arrow_schema(SCHEMA, timezone="UTC")
    consumer = Consumer(options.bootstrap, isolation_level=options.isolation,
                        auto_offset_reset="none", fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
                        config=dict(options.client_config))
    try:
        yield from _read_together(consumer, options, queues, arrow_schema, pa)
    finally:
        consumer.close()


def _ranges_by_partition(offset_ranges) -> dict[TopicPartition, collections.deque]:
    """The non-empty ranges as {partition: deque of [start, end) in offset order}, a range
    that starts where the one before it ends merged into it."""
    queues: dict[TopicPartition, collections.deque] = {}
    for offset_range in sorted((r for r in offset_ranges if r.start_offset < r.end_offset_exclusive),
                               key=lambda r: (r.topic, r.partition, r.start_offset)):
        queue = queues.setdefault(offset_range.tp, collections.deque())
        if queue and queue[-1][1] == offset_range.start_offset:
            queue[-1] = (queue[-1][0], offset_range.end_offset_exclusive)
        else:
            queue.append((offset_range.start_offset, offset_range.end_offset_exclusive))
    return queues


class _RangeRead:
    """Where one partition's current range stands (the reader's own bookkeeping)."""

    __slots__ = ("start", "end", "position", "last_progress")

    def __init__(self, start: int, end: int, position: int, now: float):
        self.start = start
        self.end = end
        self.position = position
        self.last_progress = now


def _read_together(consumer, options: SourceOptions, queues: dict, arrow_schema, pa) -> Iterator:
    headers_type = arrow_schema.field("headers").type
    earliest = consumer.beginning_offsets(list(queues))
    consumer.assign(list(queues))
    reading: dict[TopicPartition, _RangeRead] = {}

    def start_next_range(tp: TopicPartition) -> None:
        start, end = queues[tp].popleft()
        position = _start_position(options, tp, start, earliest[tp])
        consumer.seek(tp, position)
        reading[tp] = _RangeRead(start, end, position, time.monotonic())

    for tp in queues:
        start_next_range(tp)
    while reading:
        # No more records per poll than the longest range still needs: the consumer decodes
        # a batch only as far as it hands it out, so what lies past a range's end in a big
        # batch is then mostly never decoded.
        wanted = max(range_read.end - range_read.position for range_read in reading.values())
        try:
            records = consumer.poll(timeout_ms=POLL_SLICE_MS, max_records=min(wanted, RECORDS_PER_POLL_MAX))
        except OffsetOutOfRangeError as exc:
            # Retention deleted the rest of a range while we read it.
            _skip_lost(consumer, options, reading, consumer.beginning_offsets(list(reading)), exc)
            continue
        # A poll's records come in runs of one partition each.
        for tp_key, run in itertools.groupby(records, key=_PARTITION_OF):
            tp = TopicPartition(*tp_key)
            range_read = reading.get(tp)
            if range_read is None:
                continue
            run = list(run)
            if run[-1].offset >= range_read.end:
                run = [r for r in run if r.offset < range_read.end]
            if run:
                yield _arrow_batch(run, tp, arrow_schema, headers_type, pa)
        now = time.monotonic()
        finished = []
        for tp, range_read in reading.items():
            # Under read_committed, markers and aborted records move the position without
            # a record: the position, never a count, says where a range stands.
            new_position = consumer.position(tp)
            if new_position > range_read.position:
                range_read.position = new_position
                range_read.last_progress = now
            if range_read.position >= range_read.end:
                finished.append(tp)
            elif (now - range_read.last_progress) * 1000 > options.poll_timeout_ms:
                raise EosError(
                    f"eos source: reading {tp.topic}-{tp.partition} offsets [{range_read.start}, "
                    f"{range_read.end}) made no progress for {options.poll_timeout_ms} ms at offset "
                    f"{range_read.position} ({options.isolation}; option pollTimeoutMs)")
        if finished:
            for tp in finished:
                del reading[tp]
                if queues[tp]:
                    start_next_range(tp)
            if set(reading) != consumer.assignment():
                consumer.assign(list(reading))


_PARTITION_OF = operator.itemgetter(0, 1)      # a Record's (topic, partition)


def _start_position(options: SourceOptions, tp: TopicPartition, start: int, earliest: int) -> int:
    if start >= earliest:
        return start
    message = (f"eos source: {tp.topic}-{tp.partition} offsets {start}..{earliest - 1} were deleted "
               f"(the earliest offset is now {earliest}) before the query read them")
    if options.fail_on_data_loss:
        raise DataLossError(message + ". Set option failOnDataLoss=false to skip what is lost and carry on.")
    log.warning("%s; skipping them (failOnDataLoss=false)", message)
    return earliest


def _skip_lost(consumer, options: SourceOptions, reading: dict, earliest: dict, error: Exception) -> None:
    """After OffsetOutOfRange: the partitions whose position fell below the earliest offset
    lost records; raise (failOnDataLoss) or move them to what is left."""
    lost = [tp for tp, range_read in reading.items() if range_read.position < earliest[tp]]
    if not lost:
        raise error
    if options.fail_on_data_loss:
        tp = lost[0]
        raise DataLossError(
            f"eos source: {tp.topic}-{tp.partition} offset {reading[tp].position} is gone while the query "
            f"read up to {reading[tp].end} ({error}). Set option failOnDataLoss=false to skip what is lost "
            f"and carry on.")
    for tp in lost:
        range_read = reading[tp]
        log.warning("eos source: %s-%d offsets %d..%d deleted while reading; skipping them "
                    "(failOnDataLoss=false)", tp.topic, tp.partition, range_read.position, earliest[tp] - 1)
        range_read.position = earliest[tp]
        consumer.seek(tp, range_read.position)


def _arrow_batch(records: list, tp: TopicPartition, arrow_schema, headers_type, pa):
    """Records -> one Arrow record batch of SCHEMA, a column at a time."""
    count = len(records)
    _, _, offsets, keys, values, timestamps_ms, headers, timestamp_types = zip(*records)
    if any(headers):
        header_column = pa.array(
            [[{"key": k, "value": v} for k, v in h] if h else [] for h in headers], type=headers_type)
    else:
        # Headers are rare: an all-empty list column costs one offsets buffer.
        header_column = pa.ListArray.from_arrays(
            pa.array([0] * (count + 1), pa.int32()), pa.array([], headers_type.value_type),
            type=headers_type)
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.repeat(pa.scalar(tp.topic, pa.string()), count),
        pa.repeat(pa.scalar(tp.partition, pa.int32()), count),
        pa.array(offsets, pa.int64()),
        pa.array(timestamps_ms, pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(
            arrow_schema.field("timestamp").type),
        pa.array(timestamp_types, pa.int32()),
        header_column,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema)

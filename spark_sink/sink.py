"""`ExactlyOnceSink`: a foreachBatch sink whose micro-batches reach eos exactly once.

Theory of operation
-------------------
Design (a) of issue 6, written up in docs/architecture.md: the executors are *participant*
producers in ONE transaction that the driver owns; the coordinator decides it once.

    df.writeStream.foreachBatch(ExactlyOnceSink(bootstrap, "out", transactional_id="t",
                                                group_id="g", checkpoint_location=cp))
      .option("checkpointLocation", cp).start()

Per micro-batch (`__call__(df, batch_id)`, on the driver):

1. The first call initialises the transactional.id (InitProducerId). The epoch bump fences
   a previous driver that crashed and aborts its open transaction with every participant.
2. The batch's input end offsets are read from Spark's offset log, written before the
   batch ran: `<checkpoint>/offsets/<batch_id>`, one JSON line per source; the lines of eos
   sources are `{topic: {partition: offset}}`. The query id comes from `<checkpoint>/metadata`.
3. Replay check: the group's committed offsets (OffsetFetch, require_stable) carry metadata
   `{"sink": "eos", "query": <query id>, "batch": <id>}`. If this query already committed
   this batch id (or a later one), the batch was written before a crash; nothing is written.
4. Write: `df.mapInArrow(TaskWrite(...)).collect()` -- one Spark job whose tasks each run
   one participant producer on the executors (`spark_sink.participant` over
   `eos.Producer.participant`; records never pass through the driver). A task yields a
   single row, its participant id and record count, only after its producer's flush
   succeeded. `collect()` returns the row of the one attempt per partition that Spark
   counted as successful (the scheduler drops the result of a second, speculative attempt
   of a finished partition, and a failed attempt has none), so a failed or duplicate
   attempt's participant is never accepted.
   Why not a Python data source writer (`df.write.format(...)`, the first version): its
   `writer()` and `commit()` each run in a Python worker beside the driver. On a busy
   machine that was 100-150 ms and 50 ms of every micro-batch on the driver's critical
   path (690 ms -> 571 ms per 10,000-record batch); on a quiet one the same (336 vs
   339 ms). Either way a query's first batch waited for those two Python processes to
   start (first batch 2.6 s -> 0.5 s quiet, 10.8 s -> 1.8 s busy). The map is Spark's
   public `DataFrame.mapInArrow` (it checks on the driver that pandas is installed, hence
   pandas in the `spark` extra; the tasks use pyarrow only).
5. Commit: AddOffsetsToTxn + TxnOffsetCommit of the end offsets with the metadata above,
   then EndTxn(commit, accepted participants) -- the one decision: outputs and input
   offsets become visible together or not at all. Any error before the decision aborts
   the transaction and re-raises (the query fails; a restart replays the batch).

The group's offsets are ordinary committed offsets, so `eos groups describe` shows the
pipeline's lag. `metrics=True` (or a prometheus_client CollectorRegistry) reports each
micro-batch's write and commit times, records written and batches committed or skipped
(eos/client_metrics.py's sink families, client_id the transactional.id) from the driver,
where foreachBatch runs; the executors' producers report nothing. `AtLeastOnceSink` is the same write path without a transaction (the
baseline for benchmarks): no producer id, no offsets, no replay check.

Crash tests: the environment variable EOS_SINK_CRASH_AT="<point>:<batch_id>[,...]" makes
the driver kill itself with SIGKILL at a point of a batch -- before_write, after_write
(outputs written, nothing committed), after_offsets, after_commit (decided, but Spark has
not recorded the batch) -- its whole process group when it leads one (the JVM and the
Python workers die with it).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import signal
import time
from pathlib import Path

from eos.client_config import security_settings
from eos.client_metrics import SinkMetrics, metrics_setting
from eos.errors import EosError, ErrorCode
from eos.types import TopicPartition
from spark_sink.owner import TRANSACTION_TIMEOUT_MS_DEFAULT, TransactionOwner
from spark_sink.participant import TIMEOUT_MS_DEFAULT, OwnerIdentity, producer_settings, write_arrow_batches
from spark_sink.worker_heap import freeze_worker_heap

log = logging.getLogger("eos.spark.sink")

CRASH_ENV = "EOS_SINK_CRASH_AT"
CRASH_POINTS = ("before_write", "after_write", "after_offsets", "after_commit")
STATS_KEPT_MAX = 10_000


# ---- the executor side: one task's write -----------------------------------------------------------

# The column types a task takes as they are (string as its UTF-8 bytes, converted in Arrow);
# any other type goes through Spark's CAST to binary first (which refuses what it cannot
# cast, an int under ANSI mode, with Spark's own error).
TASK_COLUMN_TYPES = ("binary", "string")


def _task_result_type():
    """A task's one row, "producer_id long, records long", as a StructType: built here, where
    the DDL string would be parsed by the JVM (one more round trip on every micro-batch)."""
    from pyspark.sql.types import LongType, StructField, StructType

    return StructType([StructField("producer_id", LongType(), False), StructField("records", LongType(), False)])


def _quoted(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"


@dataclasses.dataclass(frozen=True)
class TaskWrite:
    """The function each Spark task runs over its partition of the batch, as Arrow record
    batches holding `value_column` and, if present, `key_column` (binary or string;
    picklable: shipped to the executors): write them through one participant (or plain)
    writer, then yield one row -- the participant id (-1 when the task wrote nothing) and
    the records written. No row unless every record is written."""

    owner: OwnerIdentity
    topic: str
    transactional: bool
    timeout_ms: int
    producer_config: dict
    key_column: str = "key"
    value_column: str = "value"

    def __call__(self, batches):
        import pyarrow as pa

        freeze_worker_heap()
        result = write_arrow_batches(self.owner, self.topic, batches, key_column=self.key_column,
                                     value_column=self.value_column, transactional=self.transactional,
                                     timeout_ms=self.timeout_ms, producer_config=self.producer_config)
        yield pa.RecordBatch.from_pydict({"producer_id": pa.array([result.producer_id], pa.int64()),
                                          "records": pa.array([result.records], pa.int64())})


def tasks_report(rows) -> dict:
    """What the driver takes from the collected task rows: the accepted participant ids
    (sorted, without the -1 of tasks that wrote nothing), the records and the task count."""
    return {"participants": sorted(row[0] for row in rows if row[0] >= 0),
            "records": sum(row[1] for row in rows), "tasks": len(rows)}


# ---- Spark's checkpoint, read ----------------------------------------------------------------------

def local_checkpoint_path(location: str) -> Path:
    """A checkpoint location as a local path ("file:" URIs too); other file systems are refused."""
    text = str(location)
    if text.startswith("file://"):
        text = text[len("file://"):]
    elif text.startswith("file:"):
        text = text[len("file:"):]
    elif "://" in text:
        raise ValueError(f"checkpoint location {location!r}: only local checkpoints are supported by the "
                         f"exactly-once sink")
    return Path(text)


def query_id(checkpoint_location: str) -> str:
    """The id Spark keeps for the query in `<checkpoint>/metadata` (stable across restarts)."""
    path = local_checkpoint_path(checkpoint_location) / "metadata"
    try:
        return json.loads(path.read_text().splitlines()[0])["id"]
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise EosError(f"cannot read the query id from {path}: {exc}", ErrorCode.INVALID_REQUEST) from None


def parse_offset_log(text: str) -> dict[TopicPartition, int]:
    """The eos source offsets of one offset-log file: every source line shaped
    {topic: {partition: offset}} (other sources' lines are skipped)."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("v"):
        raise ValueError("not a Spark offset log file (no version line)")
    offsets: dict[TopicPartition, int] = {}
    for line in lines[2:]:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if not isinstance(value, dict) or not value:
            continue
        if not all(isinstance(parts, dict) and all(str(p).isdigit() and isinstance(o, int) and not isinstance(o, bool)
                                                   for p, o in parts.items()) for parts in value.values()):
            continue
        for topic, parts in value.items():
            for partition, offset in parts.items():
                offsets[TopicPartition(topic, int(partition))] = offset
    return offsets


def batch_end_offsets(checkpoint_location: str, batch_id: int) -> dict[TopicPartition, int]:
    path = local_checkpoint_path(checkpoint_location) / "offsets" / str(batch_id)
    try:
        return parse_offset_log(path.read_text())
    except (OSError, ValueError) as exc:
        raise EosError(f"cannot read the offsets of batch {batch_id} from {path}: {exc}",
                       ErrorCode.INVALID_REQUEST) from None


def batch_metadata(query: str, batch_id: int) -> str:
    return json.dumps({"sink": "eos", "query": query, "batch": batch_id}, separators=(",", ":"))


def committed_batch(committed: dict[TopicPartition, tuple[int, str]], query: str) -> int | None:
    """The highest batch id this query committed, by the metadata of the group's offsets."""
    found = None
    for _, metadata in committed.values():
        try:
            value = json.loads(metadata)
        except (TypeError, ValueError):
            continue
        if isinstance(value, dict) and value.get("sink") == "eos" and value.get("query") == query \
                and isinstance(value.get("batch"), int):
            found = value["batch"] if found is None else max(found, value["batch"])
    return found


def _crash_if_asked(point: str, batch_id: int, transactional_id: str) -> None:
    wanted = os.environ.get(CRASH_ENV)
    if not wanted:
        return
    for item in wanted.split(","):
        name, _, batch = item.strip().partition(":")
        if name == point and batch.strip() == str(batch_id):
            log.warning("%s=%s: killing the driver at %s of batch %d of %r", CRASH_ENV, wanted, point, batch_id,
                        transactional_id)
            for handler in logging.getLogger().handlers:
                handler.flush()
            if os.getpgid(0) == os.getpid():
                os.killpg(os.getpid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


# ---- the sinks -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BatchReport:
    """What the sink did with one micro-batch."""

    batch_id: int
    skipped: bool              # a replay of a batch already committed: nothing written
    records: int
    participants: int
    write_ms: float            # the executors' writes (the Spark job)
    commit_ms: float           # offsets + the decision (EndTxn) on the driver


class _SinkBase:
    def __init__(self, bootstrap: str, topic: str, *, key_column: str, value_column: str,
                 task_timeout_ms: int, producer_config: dict | None, client_config: dict | None):
        self.bootstrap = bootstrap
        self.topic = topic
        self.key_column = key_column
        self.value_column = value_column
        self.task_timeout_ms = task_timeout_ms
        # The security settings every client of the sink uses (driver and tasks).
        self.client_config = security_settings("client_config", client_config)
        self.producer_config = {**self.client_config, **(producer_config or {})}
        producer_settings(task_timeout_ms, self.producer_config)     # bad settings fail here, not in the tasks
        self.reports: collections.deque[BatchReport] = collections.deque(maxlen=STATS_KEPT_MAX)
        self._topic_checked = False

    def _key_value(self, df) -> tuple:
        """(the DataFrame the tasks map, its key column, its value column). Each call to the
        JVM costs a round trip on the driver's critical path, once per micro-batch (a
        select and its casts built column by column were 20 ms of a 600 ms batch), so: the
        DataFrame itself when it holds nothing but the value and key columns, as binary or
        string (the tasks take a string's UTF-8 bytes); else one selectExpr that casts both
        to binary."""
        fields = df.schema.fields      # one call to the JVM; the other lookups are local
        types = {field.name: field.dataType.typeName() for field in fields}
        if self.value_column not in types:
            raise EosError(f"the DataFrame has no value column {self.value_column!r} (columns: "
                           f"{', '.join(types)}); pass value_column=", ErrorCode.INVALID_REQUEST)
        wanted = {self.key_column, self.value_column}
        if set(types) <= wanted and all(types[name] in TASK_COLUMN_TYPES for name in types):
            return df, self.key_column, self.value_column
        key = (f"CAST({_quoted(self.key_column)} AS BINARY) AS key" if self.key_column in types
               else "CAST(NULL AS BINARY) AS key")
        return df.selectExpr(key, f"CAST({_quoted(self.value_column)} AS BINARY) AS value"), "key", "value"

    def _check_topic(self) -> None:
        """Once, on the driver: a missing output topic is named here, not after the tasks
        have waited for its metadata."""
        if self._topic_checked:
            return
        from eos.admin import Admin
        from eos.errors import UnknownTopicOrPartitionError

        with Admin(self.bootstrap, config=self.client_config) as admin:
            try:
                admin.describe_topic(self.topic)
            except UnknownTopicOrPartitionError:
                raise UnknownTopicOrPartitionError(
                    f"the sink's topic {self.topic!r} does not exist on {self.bootstrap}; create it first") from None
        self._topic_checked = True

    def _write(self, df, batch_id: int, owner: OwnerIdentity, transactional: bool) -> dict:
        """Run the Spark job that writes the batch (one participant per task); returns
        `tasks_report` of the successful tasks' rows."""
        self._check_topic()
        mapped, key_column, value_column = self._key_value(df)
        write = TaskWrite(owner, self.topic, transactional, self.task_timeout_ms, dict(self.producer_config),
                          key_column, value_column)
        return tasks_report(mapped.mapInArrow(write, _task_result_type()).collect())


class ExactlyOnceSink(_SinkBase):
    """A foreachBatch function that writes each micro-batch to `topic` exactly once (see the
    module doc). `checkpoint_location` is the query's checkpointLocation; when None the sink
    looks it up from the running query (needs the query to be active in this session)."""

    def __init__(self, bootstrap: str, topic: str, *, transactional_id: str, group_id: str,
                 checkpoint_location: str | None = None, key_column: str = "key", value_column: str = "value",
                 transaction_timeout_ms: int = TRANSACTION_TIMEOUT_MS_DEFAULT,
                 task_timeout_ms: int = TIMEOUT_MS_DEFAULT, producer_config: dict | None = None,
                 client_config: dict | None = None, metrics=False):
        if not group_id:
            raise ValueError("group_id must be a non-empty string: the input offsets are committed to it")
        super().__init__(bootstrap, topic, key_column=key_column, value_column=value_column,
                         task_timeout_ms=task_timeout_ms, producer_config=producer_config, client_config=client_config)
        self.transactional_id = transactional_id
        self.group_id = group_id
        self.checkpoint_location = checkpoint_location
        registry = metrics_setting("metrics", metrics)
        self._metrics = SinkMetrics(registry, transactional_id) if registry else None
        self._owner = TransactionOwner(bootstrap, transactional_id, transaction_timeout_ms=transaction_timeout_ms,
                                       client_config=self.client_config)
        self._initialised = False

    def __call__(self, df, batch_id: int) -> None:
        started = time.perf_counter()
        checkpoint = self.checkpoint_location or _running_checkpoint(df)
        query = query_id(checkpoint)
        end_offsets = batch_end_offsets(checkpoint, batch_id)
        if not self._initialised:
            self._owner.init()
            self._initialised = True
        if end_offsets:
            done = committed_batch(self._owner.committed(self.group_id, sorted(end_offsets)), query)
            if done is not None and done >= batch_id:
                log.info("batch %d of query %s was committed before (up to batch %d): writing nothing",
                         batch_id, query, done)
                self._report(BatchReport(batch_id, True, 0, 0, 0.0, 0.0))
                return
        else:
            log.warning("batch %d: no eos source offsets in the checkpoint; a replay of this batch cannot "
                        "be recognised", batch_id)
        _crash_if_asked("before_write", batch_id, self.transactional_id)
        try:
            report = self._write(df, batch_id, self._owner.identity(), transactional=True)
            written = time.perf_counter()
            _crash_if_asked("after_write", batch_id, self.transactional_id)
            if end_offsets:
                self._owner.commit_offsets(self.group_id, end_offsets, batch_metadata(query, batch_id))
            _crash_if_asked("after_offsets", batch_id, self.transactional_id)
            self._owner.commit(report["participants"])
        except BaseException:
            self._abort_quietly(batch_id)
            raise
        committed = time.perf_counter()
        self._report(BatchReport(batch_id, False, report["records"], len(report["participants"]),
                                 (written - started) * 1000, (committed - written) * 1000))
        _crash_if_asked("after_commit", batch_id, self.transactional_id)

    def _report(self, report: BatchReport) -> None:
        self.reports.append(report)
        metrics = self._metrics
        if metrics is None:
            return
        if report.skipped:
            metrics.batches_skipped.inc()
            return
        metrics.batch_write_seconds.observe(report.write_ms / 1000)
        metrics.batch_commit_seconds.observe(report.commit_ms / 1000)
        metrics.records_written.inc(report.records)
        metrics.batches_committed.inc()

    def _abort_quietly(self, batch_id: int) -> None:
        # The next batch starts with a fresh InitProducerId whatever happens here: it fences
        # and aborts anything this attempt left open, and recovers from a lost epoch (a
        # transaction that timed out, or an EndTxn whose outcome is unknown).
        self._initialised = False
        try:
            self._owner.abort()
        except Exception as exc:   # fenced or unreachable: the next init (or the timeout) aborts it
            log.warning("batch %d: aborting the transaction of %r failed: %s", batch_id, self.transactional_id, exc)

    def close(self) -> None:
        self._owner.close()
        if self._metrics is not None:
            self._metrics.close()


class AtLeastOnceSink(_SinkBase):
    """The same executor write path without a transaction: a retried or replayed batch is
    written again. The baseline the exactly-once sink is measured against."""

    def __init__(self, bootstrap: str, topic: str, *, key_column: str = "key", value_column: str = "value",
                 task_timeout_ms: int = TIMEOUT_MS_DEFAULT, producer_config: dict | None = None,
                 client_config: dict | None = None):
        super().__init__(bootstrap, topic, key_column=key_column, value_column=value_column,
                         task_timeout_ms=task_timeout_ms, producer_config=producer_config, client_config=client_config)

    def __call__(self, df, batch_id: int) -> None:
        started = time.perf_counter()
        report = self._write(df, batch_id, OwnerIdentity(self.bootstrap, "", -1, -1), transactional=False)
        self.reports.append(BatchReport(batch_id, False, report["records"], 0,
                                        (time.perf_counter() - started) * 1000, 0.0))

    def close(self) -> None:
        pass


def _running_checkpoint(df) -> str:
    """The checkpoint root of the query running this foreachBatch (best effort)."""
    session = df.sparkSession
    query_id_text = session.sparkContext.getLocalProperty("sql.streaming.queryId")
    for query in session.streams.active:
        if query.id == query_id_text:
            return query._jsq.streamingQuery().resolvedCheckpointRoot()
    raise EosError("ExactlyOnceSink: cannot find the running query's checkpoint; pass checkpoint_location= "
                   "(the query's checkpointLocation)", ErrorCode.INVALID_REQUEST)


__all__ = ["AtLeastOnceSink", "BatchReport", "ExactlyOnceSink", "TaskWrite", "batch_end_offsets",
           "committed_batch", "parse_offset_log", "query_id", "tasks_report"]

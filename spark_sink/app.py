"""`eos.App`: pipelines of decorator stages, each an exactly-once streaming query.

Theory of operation
-------------------
    app = eos.App(bootstrap="127.0.0.1:9092")

    @app.stage(source="orders", sink="orders_enriched", group="enricher")
    def enrich(orders: DataFrame) -> DataFrame:
        return orders.join(customers, ...).select("key", "value")

    app.run()                      # until stopped (stop(), SIGTERM, Ctrl-C)
    app.run(available_now=True)    # drain what is there now, then stop

A stage is a `DataFrame -> DataFrame` function. Its input is the eos source on `source`
(read_committed; columns key, value, topic, partition, offset, timestamp, timestampType,
headers); its output's `key` and `value` columns (binary or string) go to `sink` through an
`ExactlyOnceSink` owned by the stage: transactional.id `eos-app.<group>.<stage>`, input
offsets committed to `group`, checkpoint `<checkpoint_dir>/<stage>`. The decorator returns
the function unchanged, so it can be tested on static DataFrames.

Stages chain through topics: a stage whose source is another stage's sink runs after it.
`run(available_now=True)` runs the stages one after the other in that order, each draining
its input (trigger availableNow), so a downstream stage sees everything its upstream
wrote; `run()` starts them all together and returns when they are stopped (or raises when
one fails, after stopping the others).

Where a stage starts: a query resuming from its checkpoint goes on from Spark's offset
log. A stage with a new checkpoint starts from its group's committed offsets (earliest
where the group has none), so a lost checkpoint does not replay what the group already
committed. Sink topics that do not exist are created with the source's partition count
(or `sink_partitions`).

`metrics=True` (or a prometheus_client CollectorRegistry) gives every stage's sink metrics
(`spark_sink.sink`), labelled with the stage's transactional.id.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading
import time
from typing import Callable

from eos import net
from eos.client_config import security_settings
from eos.client_metrics import metrics_setting
from eos.types import TopicPartition
from spark_sink.spark_home import prepare_python_workers

log = logging.getLogger("eos.spark.app")

STAGE_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
WAIT_SLICE_S = 0.5


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    function: Callable
    source: str
    sink: str
    group: str
    transactional_id: str
    key_column: str
    value_column: str
    max_records_per_trigger: int | None
    sink_partitions: int | None
    output_mode: str


class App:
    """A pipeline of stages on one eos cluster and one SparkSession (see the module doc)."""

    def __init__(self, bootstrap: str = net.DEFAULT_BOOTSTRAP, *, spark=None,
                 checkpoint_dir: str = "eos-checkpoints", master: str = "local[2]",
                 trigger_interval: str | None = None, max_records_per_trigger: int | None = None,
                 transaction_timeout_ms: int = 60_000, spark_config: dict | None = None,
                 client_config: dict | None = None, metrics=False):
        net.parse_bootstrap(bootstrap)
        self.bootstrap = bootstrap
        # security.protocol, ssl.*, sasl.*: for the source (as kafka.* options), the sinks and the app's admin
        self.client_config = security_settings("client_config", client_config)
        self.checkpoint_dir = str(checkpoint_dir)
        self.master = master
        self.trigger_interval = trigger_interval
        self.max_records_per_trigger = max_records_per_trigger
        self.transaction_timeout_ms = transaction_timeout_ms
        self.metrics = metrics_setting("metrics", metrics)      # False, or the sinks' registry
        self.spark_config = dict(spark_config or {})
        self._spark = spark
        self._stages: dict[str, Stage] = {}
        self.sinks: dict[str, object] = {}        # stage name -> its ExactlyOnceSink (reports)
        self._queries: list = []
        self._stop = threading.Event()

    # ---- declaring -------------------------------------------------------------------------------

    def stage(self, *, source: str, sink: str, group: str, name: str | None = None,
              transactional_id: str | None = None, key_column: str = "key", value_column: str = "value",
              max_records_per_trigger: int | None = None, sink_partitions: int | None = None,
              output_mode: str = "update"):
        """Decorate a `DataFrame -> DataFrame` function as a stage from `source` to `sink`."""
        for what, value in (("source", source), ("sink", sink), ("group", group)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"stage {what} must be a non-empty string, got {value!r}")
        if source == sink:
            raise ValueError(f"stage source and sink are the same topic {source!r}")
        if output_mode not in ("append", "update", "complete"):
            raise ValueError(f"output_mode must be append, update or complete, got {output_mode!r}")

        def register(function: Callable) -> Callable:
            stage_name = name or function.__name__
            if not stage_name or not set(stage_name) <= STAGE_NAME_CHARS:
                raise ValueError(f"stage name {stage_name!r} may only hold letters, digits, '.', '_' and '-'")
            if stage_name in self._stages:
                raise ValueError(f"a stage named {stage_name!r} is already declared")
            if any(s.sink == sink for s in self._stages.values()):
                raise ValueError(f"topic {sink!r} is already the sink of another stage")
            self._stages[stage_name] = Stage(
                stage_name, function, source, sink, group, transactional_id or f"eos-app.{group}.{stage_name}",
                key_column, value_column, max_records_per_trigger or self.max_records_per_trigger,
                sink_partitions, output_mode)
            return function

        return register

    @property
    def stages(self) -> list[Stage]:
        """The stages in the order they run: every stage after the stages that feed it."""
        ordered: list[Stage] = []
        remaining = dict(self._stages)
        while remaining:
            ready = [s for s in remaining.values()
                     if not any(other.sink == s.source for other in remaining.values() if other is not s)]
            if not ready:
                cycle = ", ".join(f"{s.name} ({s.source} -> {s.sink})" for s in remaining.values())
                raise ValueError(f"the stages feed each other in a cycle: {cycle}")
            for s in ready:
                ordered.append(s)
                del remaining[s.name]
        return ordered

    def checkpoint_of(self, stage: Stage) -> str:
        return os.path.join(self.checkpoint_dir, stage.name)

    # ---- running ---------------------------------------------------------------------------------

    def session(self):
        """The SparkSession (made on first use when none was given), with eos registered."""
        if self._spark is None:
            prepare_python_workers(spark_home="spark.pyspark.python" not in self.spark_config,
                                   fork_server=self.master.startswith("local"))
            from pyspark.sql import SparkSession

            builder = (SparkSession.builder.master(self.master).appName("eos-app")
                       .config("spark.ui.enabled", "false")
                       .config("spark.ui.showConsoleProgress", "false")
                       .config("spark.sql.shuffle.partitions", "2")
                       .config("spark.default.parallelism", "2")
                       .config("spark.python.worker.reuse", "true")
                       .config("spark.sql.streaming.stopTimeout", "30000"))
            for key, value in self.spark_config.items():
                builder = builder.config(key, value)
            self._spark = builder.getOrCreate()
            self._spark.sparkContext.setLogLevel("WARN")
        import spark_sink

        spark_sink.register(self._spark)
        return self._spark

    def run(self, *, available_now: bool = False, timeout_s: float | None = None) -> None:
        """Run every stage: until stopped, or (available_now) until each drained its input."""
        stages = self.stages
        if not stages:
            raise ValueError("the app has no stages; decorate a function with @app.stage(...)")
        self._stop.clear()
        spark = self.session()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        restore = self._handle_sigterm()
        try:
            if available_now:
                for stage in stages:
                    query = self._start(spark, stage, available_now=True)
                    self._await([query], deadline, until_all_done=True)
            else:
                queries = [self._start(spark, stage, available_now=False) for stage in stages]
                self._await(queries, deadline, until_all_done=False)
        finally:
            self._stop_queries()
            restore()

    def stop(self) -> None:
        """Ask run() to stop its queries and return (callable from any thread)."""
        self._stop.set()

    def _await(self, queries: list, deadline: float | None, *, until_all_done: bool) -> None:
        while True:
            for query in queries:
                error = query.exception()
                if error is not None:
                    raise RuntimeError(f"stage {query.name!r} failed: {error}") from None
            if until_all_done and not any(q.isActive for q in queries):
                return
            if not until_all_done and not all(q.isActive for q in queries):
                stopped = [q.name for q in queries if not q.isActive]
                if not self._stop.is_set():
                    log.warning("stage(s) %s stopped; stopping the app", ", ".join(stopped))
                return
            if self._stop.is_set():
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the app's stages did not finish in time: "
                                   f"{', '.join(q.name for q in queries if q.isActive)}")
            queries[0].awaitTermination(WAIT_SLICE_S)

    def _stop_queries(self) -> None:
        queries, self._queries = self._queries, []
        for query in queries:
            try:
                query.stop()
            except Exception as exc:
                log.warning("stopping query %s: %s", getattr(query, "name", "?"), exc)

    def _handle_sigterm(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, lambda signum, frame: self.stop())
        return lambda: signal.signal(signal.SIGTERM, previous)

    def _start(self, spark, stage: Stage, *, available_now: bool):
        from spark_sink.sink import ExactlyOnceSink

        self._ensure_sink_topic(stage)
        checkpoint = self.checkpoint_of(stage)
        stream = (spark.readStream.format("eos").option("bootstrap", self.bootstrap)
                  .option("subscribe", stage.source)
                  .option("startingOffsets", self._starting_offsets(stage, checkpoint))
                  .options(**{f"kafka.{name}": str(value) for name, value in self.client_config.items()}))
        if stage.max_records_per_trigger:
            stream = stream.option("maxRecordsPerTrigger", str(stage.max_records_per_trigger))
        output = stage.function(stream.load())
        sink = self.sinks.get(stage.name)
        if sink is None:
            sink = self.sinks[stage.name] = ExactlyOnceSink(
                self.bootstrap, stage.sink, transactional_id=stage.transactional_id, group_id=stage.group,
                checkpoint_location=checkpoint, key_column=stage.key_column, value_column=stage.value_column,
                transaction_timeout_ms=self.transaction_timeout_ms, client_config=self.client_config,
                metrics=self.metrics)
        writer = (output.writeStream.foreachBatch(sink).queryName(stage.name)
                  .option("checkpointLocation", checkpoint).outputMode(stage.output_mode))
        if available_now:
            writer = writer.trigger(availableNow=True)
        elif self.trigger_interval:
            writer = writer.trigger(processingTime=self.trigger_interval)
        query = writer.start()
        self._queries.append(query)
        log.info("stage %s started: %s -> %s (group %s, checkpoint %s)", stage.name, stage.source, stage.sink,
                 stage.group, checkpoint)
        return query

    def _partitions(self, topic: str) -> list[TopicPartition] | None:
        from eos.admin import Admin
        from eos.errors import UnknownTopicOrPartitionError

        with Admin(self.bootstrap, config=self.client_config) as admin:
            try:
                described = admin.describe_topic(topic)
            except UnknownTopicOrPartitionError:
                return None
        return [TopicPartition(topic, p["partition"]) for p in described["partitions"]]

    def _ensure_sink_topic(self, stage: Stage) -> None:
        if self._partitions(stage.sink) is not None:
            return
        from eos.admin import Admin

        count = stage.sink_partitions or len(self._partitions(stage.source) or [None])
        with Admin(self.bootstrap, config=self.client_config) as admin:
            try:
                admin.create_topic(stage.sink, partitions=count)
                log.info("created sink topic %s with %d partitions", stage.sink, count)
            except Exception as exc:   # created meanwhile by another stage or app
                if self._partitions(stage.sink) is None:
                    raise
                log.debug("sink topic %s appeared meanwhile: %s", stage.sink, exc)

    def _starting_offsets(self, stage: Stage, checkpoint: str) -> str:
        """For a new checkpoint: the group's committed offsets, earliest elsewhere."""
        from spark_sink.owner import group_offsets
        from spark_sink.sink import local_checkpoint_path

        offsets_dir = local_checkpoint_path(checkpoint) / "offsets"
        if offsets_dir.is_dir() and any(offsets_dir.iterdir()):
            return "earliest"      # Spark resumes from its offset log and ignores this
        partitions = self._partitions(stage.source)
        if not partitions:
            return "earliest"
        committed = group_offsets(self.bootstrap, stage.group, partitions, client_config=self.client_config)
        if not committed:
            return "earliest"
        return json.dumps({stage.source: {str(tp.partition): committed.get(tp, -2) for tp in partitions}})


__all__ = ["App", "Stage"]

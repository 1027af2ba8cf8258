"""The Spark side of eos: the data source "eos", the exactly-once sink, pipeline stages.

`register(spark)` makes `spark.read.format("eos")` and `spark.readStream.format("eos")`
available in a session.
`ExactlyOnceSink`, `AtLeastOnceSink` and `App` are handed out lazily: pyspark is imported
only when they are used, so importing `spark_sink` costs nothing where Spark is not installed.
"""
from __future__ import annotations

import importlib

_LAZY = {
    "ExactlyOnceSink": ("spark_sink.sink", "ExactlyOnceSink"),
    "AtLeastOnceSink": ("spark_sink.sink", "AtLeastOnceSink"),
    "App": ("spark_sink.app", "App"),
}


def register(spark) -> None:
    """Register the eos data source (`spark_sink.source.EosDataSource`) with a SparkSession
    (the sinks need nothing registered: their tasks run through `mapInArrow`).

    The source's planner runs in a Python worker that cannot see the session, so the
    session's default parallelism is read here and travels with the registered class: a
    batch of more partitions than that is packed into that many tasks
    (`spark_sink.offsets.plan_tasks`)."""
    from spark_sink.source import EosDataSource

    slots = _default_parallelism(spark)
    if slots is None:
        spark.dataSource.register(EosDataSource)
        return
    # A class made here is pickled by value (cloudpickle), its task_slots with it.
    packed = type("EosDataSource", (EosDataSource,), {"task_slots": slots})
    spark.dataSource.register(packed)


def _default_parallelism(spark) -> int | None:
    """spark.default.parallelism, else the SparkContext's (local[N]: N), else None (Spark
    Connect has no SparkContext on the client)."""
    configured = spark.conf.get("spark.default.parallelism", None)
    if configured:
        return max(1, int(configured))
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:   # Spark Connect: no SparkContext here
        return None


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'spark_sink' has no attribute {name!r}")
    value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value
    return value


__all__ = ["register", *sorted(_LAZY)]

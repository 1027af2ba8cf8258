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
    (the sinks need nothing registered: their tasks run through `mapInArrow`)."""
    from spark_sink.source import EosDataSource

    spark.dataSource.register(EosDataSource)


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'spark_sink' has no attribute {name!r}")
    value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value
    return value


__all__ = ["register", *sorted(_LAZY)]

"""The Spark side of eos: the data source "eos", the exactly-once sink, pipeline stages.

`register(spark)` makes `spark.read.format("eos")` and `spark.readStream.format("eos")`
available in a session. pyspark is imported only when it is called, so importing
`spark_sink` costs nothing where Spark is not installed.
"""
from __future__ import annotations


def register(spark) -> None:
    """Register the eos data source (`spark_sink.source.EosDataSource`) with a SparkSession."""
    from spark_sink.source import EosDataSource

    spark.dataSource.register(EosDataSource)


__all__ = ["register"]

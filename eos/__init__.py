"""eos: transactional, exactly-once streaming for PySpark pipelines.

The kernel (`eos.records`, `eos.errors`, `eos.config`, `eos.v1`) is imported by everyone;
the public face (`Producer`, `Consumer`, `Admin`, `App`) is handed out lazily so that
`import eos.records` from the broker does not drag in the clients or Spark.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "Producer": ("producer", "Producer"),
    "RecordMetadata": ("producer", "RecordMetadata"),
    "Consumer": ("consumer", "Consumer"),
    "ConsumerGroupMetadata": ("consumer", "ConsumerGroupMetadata"),
    "OffsetAndMetadata": ("consumer", "OffsetAndMetadata"),
    "Record": ("eos.types", "Record"),
    "TopicPartition": ("eos.types", "TopicPartition"),
    "Admin": ("eos.admin", "Admin"),
    "App": ("spark_sink.app", "App"),
}


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'eos' has no attribute {name!r}")
    value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value
    return value


__all__ = sorted(_LAZY)

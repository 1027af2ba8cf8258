"""The garbage collector of the Python worker processes that run eos's Spark tasks.

Theory of operation
-------------------
With spark.python.worker.reuse (Spark's default) one Python worker process runs task after
task, and pyspark's daemon calls `gc.collect()` after every one of them (pyspark/daemon.py).
A full collection walks every object the collector tracks, and most of a worker's objects
are what it imported once and keeps: pyspark, pyarrow, eos, grpc. In the bench's Spark
stage (python -m bench --only spark: 3 partitions, micro-batches of 10,000 records, two
tasks for the source and two for the sink each batch) py-spy put 62% of the workers' active
samples in those collections, about 1 s of CPU per 100,000 records, on a machine whose two
cores the JVM and the broker share.

`freeze_worker_heap()` is called at the start of each eos task (the source's reads, the
sink's writes). The first call in a daemon worker moves every object alive then into the
collector's permanent generation (`gc.freeze()`, which exists for this): later collections
skip them and walk only what later tasks made. It does nothing after that, nor outside a
worker forked by pyspark's daemon (a test calling the task function in its own process, a
driver): only there does a collection follow every task.

The cost: the frozen objects are still freed when their reference counts reach zero, but a
reference cycle among them is never collected. At the first task those are the imports and
what that task's own set-up made, once per process.
"""
from __future__ import annotations

import gc
import sys

PYSPARK_DAEMON_MODULE = "pyspark.daemon"


def in_daemon_worker() -> bool:
    """Whether this process is a Python worker forked by pyspark's daemon (`python -m
    pyspark.daemon`), the one that collects after every task."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == PYSPARK_DAEMON_MODULE


def freeze_worker_heap() -> bool:
    """At a daemon worker's first eos task, freeze what is alive (see the module doc).
    Returns whether this call froze anything."""
    if gc.get_freeze_count() or not in_daemon_worker():
        return False
    gc.freeze()
    return True


__all__ = ["freeze_worker_heap", "in_daemon_worker"]

"""The broker's memory after the run: its process's peak RSS (both systems) and, for Kafka,
the JVM heap in use.

Theory of operation
-------------------
Registered last, so it runs after every other workload of the run, on the same broker
process. The peak RSS is the kernel's high-water mark of the process (`VmHWM` in
/proc/<pid>/status): the most resident memory the broker ever had since it started, which
covers every workload before this one, whatever --only selected. Kafka's JVM is started with
-Xmx1g and keeps heap it has touched, so its RSS says little about what it needs; the heap
in use at the end (`jcmd <pid> GC.heap_info`, from the JDK beside the `java` that ran it)
is the figure issue #15 asks to report beside eos's peak RSS. eos has no heap apart from
its RSS. A system whose process cannot be read (no pid, no /proc, no jcmd) reports the
figures it can and says why in the note.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

from bench.workloads import Metric, NotAvailable, RunContext, Workload, register

JCMD_TIMEOUT_S = 30.0
_HEAP_USED = re.compile(r"\bused (\d+)K")


def status_kib(pid: int, field: str) -> int:
    """A `kB` field of /proc/<pid>/status (VmHWM, VmRSS)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise NotAvailable(f"/proc/{pid}/status has no {field}")


def _peak_rss(ctx: RunContext) -> Metric:
    if ctx.broker_pid is None:
        raise NotAvailable("the broker's process id is unknown")
    peak_kib = status_kib(ctx.broker_pid, "VmHWM")
    now_kib = status_kib(ctx.broker_pid, "VmRSS")
    return Metric("memory.peak_rss_mb", "broker process: peak RSS over the run", round(peak_kib / 1024, 1),
                  "MB", False, f"VmHWM of pid {ctx.broker_pid} after every workload of the run; "
                               f"RSS at the end {now_kib / 1024:,.0f} MB")


def heap_used_kib(pid: int) -> int:
    """The JVM's heap in use now, from `jcmd <pid> GC.heap_info` (the JDK of `java` on PATH)."""
    java = shutil.which("java")
    jcmd = os.path.join(os.path.dirname(os.path.realpath(java)), "jcmd") if java else None
    if jcmd is None or not os.access(jcmd, os.X_OK):
        raise NotAvailable("no jcmd beside java (a JRE without the JDK tools)")
    out = subprocess.run([jcmd, str(pid), "GC.heap_info"], capture_output=True, text=True,
                         timeout=JCMD_TIMEOUT_S).stdout
    match = _HEAP_USED.search(out)
    if match is None:
        raise NotAvailable(f"jcmd GC.heap_info printed no heap use: {out.strip()[:200]!r}")
    return int(match.group(1))


def eos_memory(ctx: RunContext) -> list[Metric]:
    return [_peak_rss(ctx)]


def kafka_memory(ctx: RunContext) -> list[Metric]:
    metrics = [_peak_rss(ctx)]
    try:
        used_kib = heap_used_kib(ctx.broker_pid)
    except NotAvailable as exc:
        ctx.progress(f"  Kafka's heap in use is not reported: {exc}")
        return metrics
    metrics.append(Metric("memory.kafka_heap_used_mb", "Kafka JVM: heap in use at the end",
                          round(used_kib / 1024, 1), "MB", False,
                          "jcmd GC.heap_info after every workload of the run (-Xmx1g)"))
    return metrics


register(Workload("memory", "Broker memory after the run (peak RSS; Kafka's heap in use)",
                  {"kafka": kafka_memory, "eos": eos_memory}))

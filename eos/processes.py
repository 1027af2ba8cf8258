"""Hard kills of a process tree, for the demo, the benchmarks and the kill tests.

Theory of operation
-------------------
A Spark driver started with ``start_new_session=True`` leads its own process group, but
PySpark's Python worker daemons call ``setsid`` and so leave that group: a ``killpg`` alone
leaves them running until they notice the JVM is gone, which is not the instantaneous
crash a kill test means to cause. `kill_tree` therefore takes a snapshot of the parent
links in /proc first (a process killed first would re-parent its children to init and hide
them), then SIGKILLs the group and every descendant found.
"""
from __future__ import annotations

import collections
import os
import signal
import subprocess
from pathlib import Path


def descendants(parents: dict[int, int], root: int) -> set[int]:
    """Every process below `root` in a {pid: parent pid} table (root itself excluded)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid, parent in parents.items():
        children[parent].append(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found and child != root:
                found.add(child)
                stack.append(child)
    return found


def process_parents() -> dict[int, int]:
    """{pid: parent pid} of every process now, from /proc (empty where there is none)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue          # the process ended while we looked
        # pid (comm) state ppid ...; comm may hold spaces and parentheses
        fields = text[text.rindex(")") + 2:].split()
        parents[int(stat.parent.name)] = int(fields[1])
    return parents


def kill_tree(process: subprocess.Popen, wait_s: float = 30.0) -> None:
    """SIGKILL `process` (a process-group leader), its group and every descendant at once,
    then reap it (bounded by `wait_s`)."""
    doomed = descendants(process_parents(), process.pid)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        process.wait(wait_s)
    except subprocess.TimeoutExpired:
        pass

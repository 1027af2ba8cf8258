"""Hard kills of a process tree, for the demo, the benchmarks and the kill tests.

Theory of operation
-------------------
A Spark driver started with ``start_new_session=True`` leads its own process group, but
PySpark's Python worker daemons call ``setsid`` and so leave that group: a ``killpg`` alone
leaves them running until they notice the JVM is gone, which is not the instantaneous
crash a kill test means to cause. `kill_tree` therefore finds the tree from the parent
links in /proc, freezing it with SIGSTOP as it goes (the daemon forks a worker per task,
and a process forked between a snapshot and the kill would escape; a process killed first
would re-parent its children to init and hide them), until a snapshot finds no new member,
and only then SIGKILLs the group and every member found.
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


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), or None when there is no such
    live process (a zombie counts as gone: it has exited, only its parent has not reaped
    it). With the pid, it names one process: a pid reused later starts at another time."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text[text.rindex(")") + 2:].split()     # state is fields[0], starttime fields[19]
    return None if fields[0] in ("Z", "X") else int(fields[19])


def kill_tree(process: subprocess.Popen, wait_s: float = 30.0, max_rounds: int = 10) -> None:
    """SIGKILL `process` (a process-group leader), its group and every descendant at once,
    then reap it (bounded by `wait_s`)."""
    if process.poll() is not None:
        # Already reaped, so its pid may be reused and its tree cannot be walked; a pid
        # stays reserved while it names a live process group, so the group is still safe.
        _signal_group(process.pid, signal.SIGKILL)
        return
    frozen: set[int] = {process.pid}      # itself too, in case it leads no group
    _signal(process.pid, signal.SIGSTOP)
    for _ in range(max_rounds):
        _signal_group(process.pid, signal.SIGSTOP)
        found = descendants(process_parents(), process.pid) - frozen
        if not found:
            break
        for pid in found:
            _signal(pid, signal.SIGSTOP)
        frozen |= found
    _signal_group(process.pid, signal.SIGKILL)
    for pid in frozen:
        _signal(pid, signal.SIGKILL)
    try:
        process.wait(wait_s)
    except subprocess.TimeoutExpired:
        pass


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass

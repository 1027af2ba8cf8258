"""eos.processes: the hard kill of a process tree used by the demo, the Spark kill tests and
the Spark benchmark."""
from __future__ import annotations

import os
import subprocess
import sys

from eos.processes import descendants, kill_tree, process_parents
from tests.waits import wait_for


def test_descendants_are_every_generation_below_the_root_and_nothing_else():
    parents = {10: 1, 11: 10, 12: 10, 13: 12, 14: 13, 20: 1, 21: 20, 30: 99}
    assert descendants(parents, 10) == {11, 12, 13, 14}
    assert descendants(parents, 13) == {14}
    assert descendants(parents, 14) == set()
    assert descendants({5: 5, 6: 5}, 5) == {6}          # a self-parented entry does not loop


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_kill_tree_takes_a_child_that_left_the_process_group(tmp_path):
    # The child calls setsid, as PySpark's worker daemons do: a killpg alone misses it.
    pid_file = tmp_path / "child.pid"
    child = ("import os, time; os.setsid(); "
             f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)")
    parent = subprocess.Popen(
        [sys.executable, "-c",
         f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(120)"],
        start_new_session=True)
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout_s=30,
                 what="the child to write its pid")
        child_pid = int(pid_file.read_text())
        assert os.getpgid(child_pid) != parent.pid          # really outside the group
        assert child_pid in descendants(process_parents(), parent.pid)
        kill_tree(parent)
        assert parent.returncode == -9
        wait_for(lambda: not _alive(child_pid), timeout_s=30, what="the setsid child to die")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(30)
        if pid_file.exists() and pid_file.read_text().strip():
            try:
                os.kill(int(pid_file.read_text()), 9)      # the setsid child, if the test failed early
            except ProcessLookupError:
                pass

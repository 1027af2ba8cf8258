"""`eos cluster stop` finds the `cluster start` to signal through <data-dir>/cluster.pid: only
a live process that started when the file says names it (a dead process, a zombie, a pid
reused since, or a damaged file name none)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from eos.cli_cluster import CLUSTER_PID_FILE, _running_cluster, _write_pid_file
from eos.processes import start_ticks
from tests.waits import wait_for


def test_the_pid_file_names_this_live_process_and_nothing_else(tmp_path):
    path = tmp_path / CLUSTER_PID_FILE
    assert _running_cluster(path) is None                       # no file
    _write_pid_file(path)
    assert _running_cluster(path) == os.getpid()
    recorded = json.loads(path.read_text())
    path.write_text(json.dumps({**recorded, "start_ticks": recorded["start_ticks"] + 1}))
    assert _running_cluster(path) is None                       # the pid, reused by another process
    path.write_text("{not json")
    assert _running_cluster(path) is None


def test_an_exited_process_is_gone_even_before_it_is_reaped(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])

    def state() -> str:
        with open(f"/proc/{child.pid}/stat") as stat:
            text = stat.read()
        return text[text.rindex(")") + 2]
    wait_for(lambda: state() == "Z", "the child exited (a zombie: not waited for yet)")
    assert start_ticks(child.pid) is None
    path = tmp_path / CLUSTER_PID_FILE
    path.write_text(json.dumps({"pid": child.pid, "start_ticks": 12345}))
    assert _running_cluster(path) is None
    child.wait(10)
    assert start_ticks(os.getpid()) is not None

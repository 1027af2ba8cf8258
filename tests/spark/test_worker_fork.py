"""The fork server of Spark's planner workers (spark_sink/worker_fork.py) and its launcher
(spark_sink/fork_launcher.py): real processes, a real Unix socket, and a real streaming
query whose source runner is forked."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spark_sink import fork_launcher, worker_fork
from tests.spark.helpers import produce, run_available_now
from tests.waits import wait_for

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
PROBE = "tests.spark.fork_probe"
WAIT_S = 30


@pytest.fixture
def server():
    started = worker_fork.start_fork_server(modules=PROBE)
    try:
        wait_for(started.socket_path.exists, "the fork server to listen", WAIT_S)
        yield started
    finally:
        started.stop()


def launch(server, *args: str, modules: str | None = None, socket_path: str | None = None,
           extra_env: dict | None = None, **popen) -> subprocess.Popen:
    """The launcher as Spark runs it: `<PYSPARK_PYTHON> -m <module> ...`."""
    env = {**os.environ, **worker_fork.launcher_env(server), "FORK_PROBE": "from-the-launcher",
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "no-such-dir"), str(REPO_ROOT)])}
    for name, value in (extra_env or {}).items():      # None: not set
        env.pop(name, None)
        if value is not None:
            env[name] = value
    if modules is not None:
        env[fork_launcher.MODULES_ENV] = modules
    if socket_path is not None:
        env[fork_launcher.SOCKET_ENV] = socket_path
    return subprocess.Popen([str(server.launcher), "-m", PROBE, *args], cwd=REPO_ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def report_of(process: subprocess.Popen) -> dict:
    return json.loads(process.stdout.readline())


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_forked_worker_takes_on_the_launchers_stdio_cwd_environment_and_path(server):
    process = launch(server, "stdin", "3")
    out, err = process.communicate(b"a line for the worker\n", timeout=WAIT_S)
    report = json.loads(out.splitlines()[0])
    assert process.returncode == 3
    assert report["ppid"] == server.process.pid          # a child of the warm server
    assert report["argv"] == ["stdin", "3"] and report["cwd"] == str(REPO_ROOT)
    assert report["probe"] == "from-the-launcher"
    assert report["stdin"] == "a line for the worker"
    assert b"to stderr" in err
    # sys.path as a fresh `python -m` there: cwd, then PYTHONPATH's entries in order
    assert report["path"] == [str(REPO_ROOT), str(REPO_ROOT / "no-such-dir")]
    assert f"forked {report['pid']} for -m {PROBE}" in server.log_path.read_text()


def test_other_modules_and_a_missing_server_exec_the_real_interpreter(server, tmp_path):
    for process in (launch(server, "5", modules="pyspark.sql.worker."),
                    launch(server, "5", socket_path=str(tmp_path / "nobody-listens"))):
        out, _ = process.communicate(timeout=WAIT_S)
        report = json.loads(out.splitlines()[0])
        assert process.returncode == 5
        assert report["pid"] == process.pid and report["ppid"] == os.getpid()   # exec'd in place
        assert report["probe"] == "from-the-launcher"
    assert "forked" not in server.log_path.read_text()


def test_the_worker_starts_as_a_fresh_interpreter_would_or_is_not_forked(server):
    """PYTHONUNBUFFERED (Spark sets it) is applied to the forked child's stdio; a hash seed
    other than the server's cannot be, so that call runs in a fresh interpreter."""
    reports = {}
    for name, extra in (("unbuffered", {"PYTHONUNBUFFERED": "YES", "PYTHONHASHSEED": "0"}),
                        ("buffered", {"PYTHONUNBUFFERED": None, "PYTHONHASHSEED": "0"}),
                        ("seed", {"PYTHONHASHSEED": "123"})):
        process = launch(server, "0", extra_env=extra)
        out, _ = process.communicate(timeout=WAIT_S)
        assert process.returncode == 0
        reports[name] = json.loads(out.splitlines()[0])
    assert reports["unbuffered"]["ppid"] == reports["buffered"]["ppid"] == server.process.pid
    assert reports["unbuffered"]["write_through"] and not reports["buffered"]["write_through"]
    assert reports["seed"]["ppid"] == os.getpid()          # exec'd: the server would not fork it
    assert "would start otherwise than this one: PYTHONHASHSEED" in server.log_path.read_text()
    # the forked children hash as a fresh interpreter with the server's seed does
    fresh = subprocess.run([sys.executable, "-c", "print(hash('fork-probe'))"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": "0"}, check=True)
    assert reports["buffered"]["hash"] == int(fresh.stdout)


def test_a_signal_to_the_launcher_reaches_the_worker(server):
    process = launch(server, "sleep")
    report = report_of(process)
    assert report["ppid"] == server.process.pid
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=WAIT_S) == 128 + signal.SIGTERM
    wait_for(lambda: gone(report["pid"]), "the worker to end", WAIT_S)


def test_a_killed_launcher_takes_its_worker_down(server):
    process = launch(server, "sleep")
    report = report_of(process)
    process.kill()
    process.wait(timeout=WAIT_S)
    wait_for(lambda: gone(report["pid"]), "the server to kill the orphaned worker", WAIT_S)
    assert f"the launcher of {report['pid']} went away" in server.log_path.read_text()


def test_the_server_stops_and_cleans_up_when_its_driver_is_gone(server):
    process = launch(server, "sleep")
    report = report_of(process)
    server.process.stdin.close()              # what a driver killed outright leaves
    assert server.process.wait(timeout=WAIT_S) == 0
    wait_for(lambda: gone(report["pid"]), "the server to kill its worker", WAIT_S)
    assert process.wait(timeout=WAIT_S) != 0
    assert not server.directory.exists()


def test_a_malformed_call_is_refused_and_the_server_goes_on(server):
    import socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(server.socket_path))
        body = json.dumps({"argv": ["not", "-m"], "cwd": "/", "env": {}}).encode()
        socket.send_fds(sock, [len(body).to_bytes(4, "big") + body], [0, 1, 2])
        answer = json.loads(sock.makefile("rb").readline())
    assert "error" in answer and "malformed" in answer["error"]
    process = launch(server, "0")
    assert report_of(process)["ppid"] == server.process.pid
    assert process.wait(timeout=WAIT_S) == 0


def test_a_streaming_querys_source_runner_is_forked_by_the_sessions_server(spark, eos_broker, admin, tmp_path):
    """The session (tests/spark/conftest.py) was made after prepare_python_workers(): Spark
    launches its planner workers through the server, and the query reads what it should."""
    started = worker_fork.use_fork_server()
    assert started is not None and os.environ["PYSPARK_PYTHON"] == str(started.launcher)
    before = started.log_path.read_text().count("python_streaming_source_runner")
    admin.create_topic("forked-runner", partitions=2)
    produced = produce(eos_broker.address, "forked-runner", {0: 10, 1: 7})
    batches = run_available_now(spark, eos_broker.address, "forked-runner", str(tmp_path / "cp"),
                                startingOffsets="earliest")
    assert sorted((p, o, v) for _, rows in batches for p, o, v in rows) == sorted(
        (p, o, value) for (p, o), (_, value, _) in produced.items())
    assert started.log_path.read_text().count("python_streaming_source_runner") == before + 1
    assert sys.executable == os.environ[fork_launcher.REAL_PYTHON_ENV]

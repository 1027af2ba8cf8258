"""The fork server of Spark's planner workers (spark_sink/worker_fork.py) and its launcher
(spark_sink/fork_launcher.py): real processes, a real Unix socket, and a real streaming
query whose source runner is forked."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from spark_sink import fork_launcher, worker_fork
from tests.spark.helpers import produce, run_available_now
from tests.waits import wait_for

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
PROBE = "tests.spark.fork_probe"
WAIT_S = 30


FORKED = re.compile(r"forked (\d+) for -m ")


@pytest.fixture
def private_tempdir(monkeypatch):
    """The fork servers' directories go under a directory of this test's own. A server's
    start sweeps the system temp dir for abandoned ones, and pytest-xdist runs another test at
    the same time: its sweep would remove a server this test killed on purpose before the
    test looked (failed once in CI at 7862515). (Short: a Unix socket's path has a limit.)"""
    parent = tempfile.mkdtemp(prefix="eos-fork-test-")
    monkeypatch.setattr(tempfile, "tempdir", parent)
    yield Path(parent)
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
def server(tmp_path, private_tempdir):
    started = worker_fork.start_fork_server(worker_fork.launcher_script(tmp_path / "cache"), modules=PROBE)
    assert started.directory.parent == private_tempdir
    try:
        wait_for(started.socket_path.exists, "the fork server to listen", WAIT_S)
        yield started
    finally:
        started.stop()


@pytest.fixture
def launched():
    """Every launcher a test starts; killed at the end if a test left one running."""
    processes: list[subprocess.Popen] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def launch(launched, server, *args: str, modules: str | None = None, socket_path: str | None = None,
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
    process = subprocess.Popen([str(server.launcher), "-m", PROBE, *args], cwd=REPO_ROOT, env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
    launched.append(process)
    return process


def report_of(process: subprocess.Popen) -> dict:
    line = process.stdout.readline()
    if not line:     # the worker printed nothing: say what it said on stderr, and how it ended
        try:
            _, err = process.communicate(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            err = b"(still running)"
        raise AssertionError(f"no report on stdout; exit code {process.returncode}, stderr: {err!r}")
    return json.loads(line)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_forked_worker_takes_on_the_launchers_stdio_cwd_environment_and_path(launched, server):
    process = launch(launched, server, "stdin", "3")
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
    assert b"probe atexit ran" in err                    # the worker ends as an interpreter does


def test_other_modules_and_a_missing_server_exec_the_real_interpreter(launched, server, tmp_path):
    for process in (launch(launched, server, "5", modules="pyspark.sql.worker."),
                    launch(launched, server, "5", socket_path=str(tmp_path / "nobody-listens"))):
        out, _ = process.communicate(timeout=WAIT_S)
        report = json.loads(out.splitlines()[0])
        assert process.returncode == 5
        assert report["pid"] == process.pid and report["ppid"] == os.getpid()   # exec'd in place
        assert report["probe"] == "from-the-launcher"
    assert not FORKED.search(server.log_path.read_text())


def test_the_worker_starts_as_a_fresh_interpreter_would_or_is_not_forked(launched, server):
    """PYTHONUNBUFFERED (Spark sets it) is applied to the forked child's stdio; a hash seed
    other than the server's cannot be, so that call runs in a fresh interpreter."""
    reports = {}
    for name, extra in (("unbuffered", {"PYTHONUNBUFFERED": "YES", "PYTHONHASHSEED": "0"}),
                        ("buffered", {"PYTHONUNBUFFERED": None, "PYTHONHASHSEED": "0"}),
                        ("seed", {"PYTHONHASHSEED": "123"})):
        process = launch(launched, server, "0", extra_env=extra)
        out, err = process.communicate(timeout=WAIT_S)
        assert process.returncode == 0, (name, err.decode(errors="replace"), server.log_path.read_text())
        reports[name] = json.loads(out.splitlines()[0])
    assert reports["unbuffered"]["ppid"] == reports["buffered"]["ppid"] == server.process.pid
    assert reports["unbuffered"]["write_through"] and not reports["buffered"]["write_through"]
    assert reports["seed"]["ppid"] == os.getpid()          # exec'd: the server would not fork it
    assert "would start otherwise than this one: PYTHONHASHSEED" in server.log_path.read_text()
    # the forked children hash as a fresh interpreter with the server's seed does
    fresh = subprocess.run([sys.executable, "-c", "print(hash('fork-probe'))"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": "0"}, check=True)
    assert reports["buffered"]["hash"] == int(fresh.stdout)


def test_a_signal_to_the_launcher_reaches_the_worker(launched, server):
    process = launch(launched, server, "sleep")
    report = report_of(process)
    assert report["ppid"] == server.process.pid
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=WAIT_S) == 128 + signal.SIGTERM
    wait_for(lambda: gone(report["pid"]), "the worker to end", WAIT_S)


def test_a_killed_launcher_takes_its_worker_down(launched, server):
    process = launch(launched, server, "sleep")
    report = report_of(process)
    process.kill()
    process.wait(timeout=WAIT_S)
    wait_for(lambda: gone(report["pid"]), "the server to kill the orphaned worker", WAIT_S)
    assert f"the launcher of {report['pid']} went away" in server.log_path.read_text()


def test_the_server_stops_and_cleans_up_when_its_driver_is_gone(launched, server):
    process = launch(launched, server, "sleep")
    report = report_of(process)
    server.process.stdin.close()              # what a driver killed outright leaves
    assert server.process.wait(timeout=WAIT_S) == 0
    wait_for(lambda: gone(report["pid"]), "the server to kill its worker", WAIT_S)
    assert process.wait(timeout=WAIT_S) != 0
    assert not server.directory.exists()


def test_a_message_exit_and_an_ignored_sigint_are_as_in_a_fresh_interpreter(launched, server):
    """sys.exit("text") prints it and exits 1; SIGINT ignored where Spark starts its workers
    (pyspark starts the JVM with it ignored) stays ignored in the forked child."""
    process = launch(launched, server, "text")
    out, err = process.communicate(timeout=WAIT_S)
    assert process.returncode == 1 and b"the probe failed on purpose" in err
    assert json.loads(out.splitlines()[0])["ppid"] == server.process.pid
    process = launch(launched, server, "0", preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    report = report_of(process)
    assert report["ppid"] == server.process.pid and report["sigint_ignored"]
    assert process.wait(timeout=WAIT_S) == 0
    assert not report_of(launch(launched, server, "0"))["sigint_ignored"]


def test_workers_outlive_a_dead_server_and_later_ones_start_fresh(launched, server):
    running = launch(launched, server, "sleep")
    report = report_of(running)
    server.process.kill()                         # not its driver's end: the server itself
    server.process.wait(timeout=WAIT_S)
    assert not gone(report["pid"])                # the worker goes on
    os.kill(report["pid"], signal.SIGTERM)
    assert running.wait(timeout=WAIT_S) == 1      # its launcher waited for its end
    later = launch(launched, server, "4")        # the launcher is still there; nobody forks
    out, _ = later.communicate(timeout=WAIT_S)
    assert later.returncode == 4 and json.loads(out.splitlines()[0])["ppid"] == os.getpid()


def test_the_directory_of_a_server_killed_with_its_driver_is_removed_by_the_next(server):
    server.process.kill()                    # kill -9 of the whole process tree
    server.process.wait(timeout=WAIT_S)
    assert server.directory.exists()         # nobody was left to remove it
    live = worker_fork.start_fork_server(server.launcher, modules=PROBE)     # sweeps first
    try:
        assert not server.directory.exists()
        assert live.directory not in worker_fork.remove_abandoned_directories()
        assert live.directory.exists()
    finally:
        live.stop()


def test_a_server_that_stops_removes_the_directory_of_one_killed_meanwhile(server):
    live = worker_fork.start_fork_server(server.launcher, modules=PROBE)     # swept before the kill
    server.process.kill()                    # kill -9 of another driver's tree
    server.process.wait(timeout=WAIT_S)
    assert server.directory.exists()
    live.stop()
    assert not server.directory.exists() and not live.directory.exists()


def test_the_directory_of_a_server_left_a_zombie_is_removed_too(tmp_path):
    """A server killed with its driver passes to pid 1, which may not reap it: its pid still
    answers os.kill(pid, 0), but it has exited."""
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])      # exits; not waited for yet
    try:
        wait_for(lambda: Path(f"/proc/{zombie.pid}/stat").read_bytes().rsplit(b")", 1)[1][1:2] == b"Z",
                 "the child to exit unreaped", timeout_s=WAIT_S)
        abandoned = tmp_path / f"{worker_fork.DIRECTORY_PREFIX}zombie"
        abandoned.mkdir()
        (abandoned / worker_fork.PID_NAME).write_text(str(zombie.pid))
        running = tmp_path / f"{worker_fork.DIRECTORY_PREFIX}running"
        running.mkdir()
        (running / worker_fork.PID_NAME).write_text(str(os.getpid()))
        assert worker_fork.remove_abandoned_directories(tmp_path) == [abandoned]
        assert not abandoned.exists() and running.exists()
    finally:
        zombie.wait(timeout=WAIT_S)


def test_a_malformed_call_is_refused_and_the_server_goes_on(launched, server):
    import socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(server.socket_path))
        socket.send_fds(sock, [fork_launcher.encode_frame({"argv": ["not", "-m"], "cwd": "/", "env": {}})],
                        [0, 1, 2])
        answer, _ = fork_launcher.read_frame(sock, b"")
    assert "error" in answer and "malformed" in answer["error"]
    process = launch(launched, server, "0")
    assert report_of(process)["ppid"] == server.process.pid
    assert process.wait(timeout=WAIT_S) == 0


def test_a_forked_workers_first_steps_import_nothing(launched, server):
    """A module looked up on sys.path in a child makes zipimport read the spark-core jar
    Spark puts there (worker_fork's PRELOADED_MODULES): the runner's first steps find
    everything preloaded."""
    process = launch(launched, server, "first-steps", "0")
    report = report_of(process)
    assert report["ppid"] == server.process.pid          # forked, not a fresh interpreter
    assert report["first_steps_imported"] == []
    assert process.wait(timeout=WAIT_S) == 0


def test_the_launcher_imports_only_c_modules():
    """Every query's start waits for the launcher: a Python-level import (json, socket,
    signal) would add milliseconds to each (fork_launcher's doc)."""
    launcher_dir = Path(fork_launcher.__file__).resolve().parent
    probe = ("import sys; before = set(sys.modules); sys.path.insert(0, sys.argv[1]); import fork_launcher; "
             "print(','.join(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe, str(launcher_dir)], capture_output=True,
                         text=True, timeout=WAIT_S, check=True).stdout.strip()
    loaded = set(out.split(","))
    assert "fork_launcher" in loaded
    os_and_its_parts = {"os", "os.path", "posixpath", "genericpath", "stat", "_stat", "_collections_abc"}
    c_modules = {"_socket", "_struct", "select", "marshal", "_signal", "time"}
    assert loaded - {"fork_launcher"} - os_and_its_parts - c_modules == set()


def test_a_streaming_querys_source_runner_is_forked_by_the_sessions_server(spark, eos_broker, admin, tmp_path):
    """The session (tests/spark/conftest.py) was made after prepare_python_workers(): Spark
    launches its planner workers through the server, and the query reads what it should."""
    started = worker_fork._started
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

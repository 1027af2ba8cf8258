"""A warm interpreter that forks Spark's planner workers: a query's start without a Python start.

Theory of operation
-------------------
Each streaming query on a Python data source makes Spark start a Python process for its
source (`python -m pyspark.sql.streaming.python_streaming_source_runner`), and each planner
step of a Python data source one more (`pyspark.sql.worker.*`). Every one starts an
interpreter and imports pyspark, pyarrow and the source's modules: about 0.3 s on this
project's VM, against 0.07 s for a query's whole start on Spark's JVM Kafka source. Spark's
own fork server (`pyspark.daemon`) serves only tasks.

`use_fork_server()` (called by `spark_home.prepare_python_workers`, before the JVM starts)
starts this module's server as a child of the driver, `python -m spark_sink.worker_fork
<directory>` (a private one, which the server removes when it stops): it imports those modules once, freezes the heap (`gc.freeze`, so children share
its pages and their collections skip them) and listens on a Unix socket in a private
directory. It points PYSPARK_PYTHON at a launcher script that runs
`spark_sink/fork_launcher.py`; a launched planner worker's call arrives here with its
argv, cwd, environment and stdio descriptors, and the server forks a child that takes them
on (the descriptors as 0, 1 and 2; sys.path rebuilt as a fresh `python -m` there would have
it: cwd, PYTHONPATH, then the interpreter's own) and runs the module as `__main__`. The
worker thus talks to the JVM exactly as a started one would, from a process that had
nothing left to import.

The server owns its children: it reports each one's exit status to its launcher, kills a
child whose launcher went away (Spark destroyed the worker with SIGKILL), and, when its
parent dies (its stdin, a pipe from the driver, ends), kills what is left and exits. It is
one thread: a selector over the listening socket, stdin, each live child's launcher
connection and a self-pipe written on SIGCHLD. Anything the server cannot do for a call
(a malformed request, a failed fork) is answered {"error"}, and the launcher then execs the
real interpreter: a worker never depends on the server to exist.
"""
from __future__ import annotations

import atexit
import gc
import importlib
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from spark_sink import fork_launcher

log = logging.getLogger(__name__)

# What the server imports before it forks anything: the planner workers' modules and the
# eos source they unpickle.
PRELOADED_MODULES = (
    "pyspark.sql.streaming.python_streaming_source_runner",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.plan_data_source_read",
    "spark_sink.source",
)
# The modules whose workers are forked (a trailing dot: every module under that package).
FORKED_MODULES = "pyspark.sql.streaming.python_streaming_source_runner,pyspark.sql.worker."
DISABLE_ENV = "EOS_SPARK_FORK_SERVER"        # "0": start Spark's workers as Spark does
# Variables an interpreter reads as it starts: a call whose values differ from the server's
# is not forked (the launcher execs a fresh interpreter), since the child would not have them.
STARTUP_ENV = ("PYTHONOPTIMIZE", "PYTHONDEVMODE", "PYTHONMALLOC", "PYTHONUTF8", "PYTHONIOENCODING",
               "PYTHONWARNINGS", "PYTHONSAFEPATH", "PYTHONHOME", "PYTHONPLATLIBDIR", "PYTHONNOUSERSITE",
               "PYTHONUSERBASE", "PYTHONINTMAXSTRDIGITS", "PYTHONFAULTHANDLER", "PYTHONTRACEMALLOC",
               "PYTHONCOERCECLOCALE", "PYTHONEXECUTABLE", "LC_ALL", "LC_CTYPE", "LANG")
# Spark's workers hash strings with this seed unless told otherwise (pyspark's context.py):
# the server runs with it, and a call that sets another is not forked.
SPARK_HASH_SEED = "0"
REQUEST_BYTES_MAX = 16 * 1024 * 1024
SOCKET_NAME = "server.sock"

_started: "ForkServerProcess | None" = None


# ---------------------------------------------------------------- the driver's side

class ForkServerProcess:
    """The running server, its launcher script and their private directory."""

    def __init__(self, directory: Path, process: subprocess.Popen, launcher: Path, socket_path: Path):
        self.modules = FORKED_MODULES
        self.directory = directory
        self.process = process
        self.launcher = launcher
        self.socket_path = socket_path

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()          # the server's cue: its parent is done
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        elif self.process.stdin is not None:
            self.process.stdin.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def start_fork_server(modules: str = FORKED_MODULES) -> ForkServerProcess:
    """Start a server (its own private directory, launcher script and log) and return it;
    the environment is left alone (see `use_fork_server`)."""
    directory = Path(tempfile.mkdtemp(prefix="eos-spark-fork-"))
    launcher = directory / "python"
    launcher.write_text("#!/bin/sh\n"
                        f"exec '{sys.executable}' -I -S '{Path(fork_launcher.__file__).resolve()}' \"$@\"\n")
    launcher.chmod(0o755)
    env = {**os.environ, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", SPARK_HASH_SEED)}
    with open(directory / "server.log", "ab") as server_log:
        process = subprocess.Popen([sys.executable, "-m", "spark_sink.worker_fork", str(directory)],
                                   stdin=subprocess.PIPE, stdout=server_log, stderr=subprocess.STDOUT, env=env)
    server = ForkServerProcess(directory, process, launcher, directory / SOCKET_NAME)
    server.modules = modules
    atexit.register(server.stop)
    return server


def launcher_env(server: ForkServerProcess) -> dict[str, str]:
    """The variables that make `server.launcher` fork through `server`."""
    return {fork_launcher.REAL_PYTHON_ENV: sys.executable, fork_launcher.SOCKET_ENV: str(server.socket_path),
            fork_launcher.MODULES_ENV: server.modules}


def use_fork_server() -> ForkServerProcess | None:
    """Start the server once per process and point PYSPARK_PYTHON at its launcher; call it
    before the SparkSession is made, only when the workers run this interpreter. Returns
    the server, or None where it is off (EOS_SPARK_FORK_SERVER=0, no fork or Unix sockets)."""
    global _started
    if os.environ.get(DISABLE_ENV, "1") == "0" or not hasattr(os, "fork") or not hasattr(socket, "AF_UNIX"):
        return None
    if _started is None or _started.process.poll() is not None:
        _started = start_fork_server()
    os.environ.update(launcher_env(_started))
    os.environ["PYSPARK_PYTHON"] = str(_started.launcher)
    return _started


def launches_this_interpreter(python: str) -> bool:
    """Whether `python` is the launcher `use_fork_server` set (it runs this interpreter)."""
    return _started is not None and python == str(_started.launcher)


# ---------------------------------------------------------------- the server

def _pythonpath_entries(env: dict) -> list[str]:
    return [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]


class ForkServer:
    """The server's loop (see the module doc); `serve()` returns when its parent is gone."""

    def __init__(self, socket_path: str):
        self.socket_path = socket_path
        # sys.path as every `python -m` has it after its own first entries: the
        # interpreter's (stdlib, site-packages), without this process's cwd and PYTHONPATH.
        own = {os.getcwd(), ""} | set(_pythonpath_entries(dict(os.environ)))
        self.base_path = [entry for entry in sys.path if entry not in own]
        self.startup_env = dict(os.environ)
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, socket.socket] = {}       # pid -> its launcher's connection
        self.listener: socket.socket | None = None
        self.wake_read, self.wake_write = os.pipe()

    def serve(self) -> None:
        for fd in (self.wake_read, self.wake_write):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)     # wakes the selector through the pipe
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        listener = self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.socket_path + ".new")
        listener.listen(64)
        os.rename(self.socket_path + ".new", self.socket_path)   # whole or absent to a launcher
        self.selector.register(listener, selectors.EVENT_READ, "accept")
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
        self.selector.register(self.wake_read, selectors.EVENT_READ, "signal")
        log.info("serving %s (%d modules preloaded)", self.socket_path, len(PRELOADED_MODULES))
        try:
            while True:
                for key, _ in self.selector.select():
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "parent":
                        if not os.read(sys.stdin.fileno(), 4096):
                            log.info("the driver is gone: stopping")
                            return
                    elif key.data == "signal":
                        while True:
                            try:
                                if not os.read(self.wake_read, 4096):
                                    break
                            except BlockingIOError:
                                break
                        self._reap()
                    else:
                        self._launcher_closed(key.data)
        finally:
            for pid in list(self.children):
                _kill(pid)
            self._reap()

    def _accept(self) -> None:
        connection, _ = self.listener.accept()
        fds: list[int] = []
        try:
            connection.settimeout(fork_launcher.CONNECT_TIMEOUT_S)
            request, fds = _receive_request(connection)
            pid = self._fork(request, fds)
        except Exception as exc:     # anything wrong with the call: the launcher execs instead
            log.warning("a launcher's call was not forked: %s", exc)
            _send(connection, {"error": str(exc)})
            connection.close()
            return
        finally:
            for fd in fds:
                os.close(fd)
        connection.settimeout(None)
        self.children[pid] = connection
        self.selector.register(connection, selectors.EVENT_READ, pid)
        _send(connection, {"pid": pid})
        log.info("forked %d for -m %s", pid, request["argv"][1])

    def _fork(self, request: dict, fds: list[int]) -> int:
        argv, cwd, env = request["argv"], request["cwd"], request["env"]
        if (len(fds) != 3 or not isinstance(argv, list) or len(argv) < 2 or argv[0] != "-m"
                or not isinstance(cwd, str) or not isinstance(env, dict)):
            raise ValueError(f"a malformed call: argv {argv!r}, {len(fds)} descriptors")
        differing = [name for name in STARTUP_ENV if env.get(name) != self.startup_env.get(name)]
        seed = env.get("PYTHONHASHSEED")
        if seed is not None and seed != self.startup_env.get("PYTHONHASHSEED"):
            differing.append("PYTHONHASHSEED")
        if differing:
            raise ValueError(f"the worker's interpreter would start otherwise than this one: {', '.join(differing)}")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = self._become_worker(argv, cwd, env, fds)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:
                import traceback
                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        return pid

    def _become_worker(self, argv: list, cwd: str, env: dict, fds: list[int]) -> int:
        """In the child: take on the launched process's stdio, cwd, environment and sys.path,
        drop the server's state, and run the module as `__main__`."""
        import runpy

        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)     # as a fresh interpreter
        self.selector.close()
        self.listener.close()
        for connection in self.children.values():
            connection.close()
        for fd in (self.wake_read, self.wake_write, sys.stdin.fileno()):
            try:
                os.close(fd)
            except OSError:
                pass
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        _reopen_stdio(bool(env.get("PYTHONUNBUFFERED")))
        sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = [cwd] + _pythonpath_entries(env) + self.base_path
        importlib.invalidate_caches()
        sys.argv = list(argv[1:])
        # Run as a fresh process would: the module's code as __main__ (its imports are all
        # in memory). Its preloaded copy leaves sys.modules first, or runpy would warn that
        # the module was imported before it ran.
        sys.modules.pop(argv[1], None)
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0

    def _reap(self) -> None:
        # Every exited child, also those killed after their launcher went (no longer in
        # self.children): left unreaped they would stay as zombies.
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            connection = self.children.pop(pid, None)
            if connection is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            self.selector.unregister(connection)
            _send(connection, {"exit": code})
            connection.close()

    def _launcher_closed(self, pid: int) -> None:
        """A child's launcher connection became readable: it never sends after its request,
        so this is its end (the launcher was killed): the child goes too."""
        connection = self.children.get(pid)
        if connection is None:
            return
        try:
            data = connection.recv(1, socket.MSG_PEEK)
        except OSError:
            data = b""
        if data:
            return
        log.info("the launcher of %d went away: killing it", pid)
        self.selector.unregister(connection)
        connection.close()
        self.children.pop(pid, None)
        _kill(pid)


def _reopen_stdio(unbuffered: bool) -> None:
    """sys.stdin/stdout/stderr on descriptors 0-2 as a fresh interpreter opens them there:
    stdout block-buffered (line-buffered on a terminal) unless PYTHONUNBUFFERED (Spark sets
    it for its workers), stderr line-buffered or write-through."""
    import io

    def text(fd: int, mode: str, **options) -> io.TextIOWrapper:
        binary = open(fd, mode, buffering=0 if unbuffered and "w" in mode else -1, closefd=False)
        return io.TextIOWrapper(binary, encoding=sys.stdout.encoding, errors=options.pop("errors"), **options)

    interactive = os.isatty(1)
    sys.stdin = text(0, "rb", errors=sys.stdin.errors)
    sys.stdout = text(1, "wb", errors=sys.stdout.errors, line_buffering=interactive and not unbuffered,
                      write_through=unbuffered)
    sys.stderr = text(2, "wb", errors="backslashreplace", line_buffering=not unbuffered, write_through=unbuffered)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def _receive_request(connection: socket.socket) -> tuple[dict, list[int]]:
    message, fds, _flags, _addr = socket.recv_fds(connection, 65536, 3)
    if len(message) < 4:
        raise ValueError("a call without its length")
    size = struct.unpack(">I", message[:4])[0]
    if size > REQUEST_BYTES_MAX:
        raise ValueError(f"a call of {size} bytes")
    body = bytearray(message[4:])
    while len(body) < size:
        chunk = connection.recv(min(65536, size - len(body)))
        if not chunk:
            raise ValueError("the call ended early")
        body += chunk
    return json.loads(bytes(body[:size])), list(fds)


def _send(connection: socket.socket, answer: dict) -> None:
    try:
        connection.sendall(json.dumps(answer).encode() + b"\n")
    except OSError:
        pass       # the launcher is gone; its child is reaped or killed on its own


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if len(argv) != 1:
        print("usage: python -m spark_sink.worker_fork <directory>", file=sys.stderr)
        return 2
    directory = Path(argv[0])
    try:
        for name in PRELOADED_MODULES:
            importlib.import_module(name)
        if threading.active_count() > 1:
            # fork copies only the calling thread: a lock another thread held stays held
            log.warning("%d threads after the imports: forked workers may deadlock", threading.active_count())
        gc.collect()
        gc.freeze()
        ForkServer(str(directory / SOCKET_NAME)).serve()
    finally:
        # The directory is this server's: a driver killed outright cannot remove it.
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

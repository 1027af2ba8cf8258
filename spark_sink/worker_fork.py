"""A warm interpreter that forks Spark's planner workers: a query's start without a Python start.

Theory of operation
-------------------
Each streaming query on a Python data source makes Spark start a Python process for its
source (`python -m pyspark.sql.streaming.python_streaming_source_runner`), and each planner
step of a Python data source one more (`pyspark.sql.worker.*`). Every one starts an
interpreter and imports pyspark, pyarrow and the source's modules: about 0.3 s on this
project's VM, against 0.07 s for a query's whole start on Spark's JVM Kafka source. Spark's
own fork server (`pyspark.daemon`) serves only tasks.

`use_fork_server()` (called by `spark_home.prepare_python_workers` for a local master,
before the JVM starts) starts this module's server, `python -m spark_sink.worker_fork
<directory>`, as a child of the driver in a session of its own (a terminal's Ctrl-C is the
driver's to handle, not the server's). The server imports those modules once, freezes its
heap (`gc.freeze`: children share its pages and their collections skip them), and listens
on a Unix socket in its private directory, which it removes when it stops (a server killed
outright leaves it: the next server's start, or another's stop, removes those whose
server.pid has exited).
PYSPARK_PYTHON then names a launcher script in eos's cache, which runs
`spark_sink/fork_launcher.py`
(written once per interpreter and checkout, never removed by a server: a session whose
server died still starts its workers). A launched planner worker's call arrives with its
argv, cwd, environment, ignored signals and stdio descriptors, and the server forks a child
that takes them on (the descriptors as 0, 1 and 2, reopened with PYTHONUNBUFFERED's
buffering; sys.path rebuilt as a fresh `python -m` there would have it: cwd, PYTHONPATH,
then the interpreter's own) and runs the module as `__main__`, then exits as an interpreter
does (threads joined, atexit handlers run). The worker thus talks to the JVM exactly as a
started one would, from a process that had nothing left to import.

A call is refused (the launcher then execs a fresh interpreter) when the child could not
start as that interpreter would: another value of a variable read at start-up (STARTUP_ENV:
the hash seed, optimisation level, locale, ... and variables libraries read at import).

The server owns its children: it reports each one's exit status to its launcher, kills a
child whose launcher went away (Spark destroyed the worker with SIGKILL), and, when its
parent dies (its stdin, a pipe from the driver, ends) or on SIGTERM, kills and reaps what is
left and exits. Its loop is one Python thread: a selector over the listening socket, stdin,
each live child's launcher connection and a self-pipe written on SIGCHLD. (The imports start
native threads -- pyarrow's jemalloc, numpy's OpenBLAS -- which is why forking is safe only
for libraries that re-arm themselves in the child: both register pthread_atfork handlers.)
"""
from __future__ import annotations

import atexit
import gc
import hashlib
import importlib
import logging
import os
import re
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from spark_sink import fork_launcher

log = logging.getLogger("eos.spark.fork_server")

# What the server imports before it forks anything: the planner workers' modules, the eos
# source they unpickle, and what the two import on their first steps. A child must import
# nothing that is not already here: Spark puts its spark-core jar on the workers'
# PYTHONPATH, so a module found on sys.path makes zipimport read that jar's directory (6,000
# entries, 17 ms), and pyspark's invalidate_caches() once the child adds Spark's files
# directory reads it again. encodings.idna (and stringprep) come from pyspark connecting to
# "127.0.0.1" (getaddrinfo encodes the host name), eos.admin (with grpc: imported, not
# initialised, it starts no thread), eos.sasl and secrets from the source's first Admin.
PRELOADED_MODULES = (
    "pyspark.sql.streaming.python_streaming_source_runner",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.plan_data_source_read",
    "spark_sink.source",
    "encodings.idna",
    "eos.admin",
    "eos.sasl",
    "secrets",
)
# The modules whose workers are forked (a trailing dot: every module under that package).
FORKED_MODULES = "pyspark.sql.streaming.python_streaming_source_runner,pyspark.sql.worker."
DISABLE_ENV = "EOS_SPARK_FORK_SERVER"        # "0": start Spark's workers as Spark does
# Variables read as an interpreter starts, or as the preloaded libraries import: a call whose
# values differ from the server's is not forked, since the child would not have them.
STARTUP_ENV = ("PYTHONOPTIMIZE", "PYTHONDEVMODE", "PYTHONMALLOC", "PYTHONUTF8", "PYTHONIOENCODING",
               "PYTHONWARNINGS", "PYTHONSAFEPATH", "PYTHONHOME", "PYTHONPLATLIBDIR", "PYTHONNOUSERSITE",
               "PYTHONUSERBASE", "PYTHONINTMAXSTRDIGITS", "PYTHONFAULTHANDLER", "PYTHONTRACEMALLOC",
               "PYTHONCOERCECLOCALE", "PYTHONEXECUTABLE", "PYTHONPYCACHEPREFIX", "PYTHONVERBOSE",
               "PYTHONNODEBUGRANGES", "PYTHONPROFILEIMPORTTIME", "PYTHONCASEOK", "LC_ALL", "LC_CTYPE", "LANG",
               "PYSPARK_ENABLE_NAMEDTUPLE_PATCH", "SPARK_TESTING", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
               "MKL_NUM_THREADS")
# Spark's workers hash strings with this seed unless told otherwise (pyspark's context.py):
# the server runs with it, and a call that sets another is not forked. (A call that sets
# none gets it too: a fresh interpreter would pick one at random.)
SPARK_HASH_SEED = "0"
DIRECTORY_PREFIX = "eos-spark-fork-"
SOCKET_NAME = "server.sock"
LOG_NAME = "server.log"
PID_NAME = "server.pid"
LAUNCHERS_DIR = "spark-fork-launchers"
SERVER_STOP_TIMEOUT_S = 5.0
CALL_READ_TIMEOUT_S = 2.0
REQUEST_BYTES_MAX = 16 * 1024 * 1024

_started: "ForkServerProcess | None" = None


# ---------------------------------------------------------------- the driver's side

class ForkServerProcess:
    """A running server: its process, its private directory (socket, log) and the launcher
    script that forks through it."""

    def __init__(self, directory: Path, process: subprocess.Popen, launcher: Path, modules: str):
        self.directory = directory
        self.process = process
        self.launcher = launcher
        self.modules = modules

    @property
    def socket_path(self) -> Path:
        return self.directory / SOCKET_NAME

    @property
    def log_path(self) -> Path:
        return self.directory / LOG_NAME

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()          # the server's cue: its parent is done
            try:
                self.process.wait(timeout=SERVER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        elif not self.process.stdin.closed:
            self.process.stdin.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        # and those of servers killed since this one started (a driver killed beside this
        # one, as the bench's and the demo's kill runs do), rather than at the next start
        remove_abandoned_directories(self.directory.parent)


def launcher_script(cache_dir: Path) -> Path:
    """The executable PYSPARK_PYTHON names: runs fork_launcher.py with this interpreter
    (`-I -S`: stdlib only, no site, a few milliseconds). One per interpreter and checkout,
    written once under `cache_dir` (atomically: concurrent drivers share it)."""
    text = ("#!/bin/sh\n"
            f"exec {shlex.quote(sys.executable)} -I -S "
            f"{shlex.quote(str(Path(fork_launcher.__file__).resolve()))} \"$@\"\n")
    directory = cache_dir / LAUNCHERS_DIR
    path = directory / f"python-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    if path.is_file() and os.access(path, os.X_OK):
        return path
    directory.mkdir(parents=True, exist_ok=True)
    # A staging file of its own, not eos.files.write_file_atomically's fixed "<path>.tmp":
    # two drivers starting at once (test processes) would unlink each other's.
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    staging = Path(name)
    try:
        # closed before the rename: an executable still open for writing cannot be run (ETXTBSY)
        with os.fdopen(fd, "w") as script:
            script.write(text)
        staging.chmod(0o755)
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)
    return path


def remove_abandoned_directories(parent: Path | None = None) -> list[Path]:
    """Remove the directories of servers that died without removing their own (killed
    outright with their driver, as `kill -9` of a process tree does); returns them. A
    directory is abandoned when its server's pid (`server.pid`) names no running process."""
    removed = []
    for directory in Path(parent or tempfile.gettempdir()).glob(f"{DIRECTORY_PREFIX}*"):
        try:
            pid = int((directory / PID_NAME).read_text())
        except (OSError, ValueError):
            continue               # being set up, or not ours to judge
        if _running(pid):
            continue               # (its server, or a process that took its pid)
        shutil.rmtree(directory, ignore_errors=True)
        removed.append(directory)
    return removed


def _running(pid: int) -> bool:
    """Whether `pid` names a process that has not exited. A zombie has: a server killed
    with its driver (kill -9 of the tree) passes to pid 1, which may reap it late or never,
    and until then the pid still answers os.kill(pid, 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True                # another user's process (EPERM): alive, not ours
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True                # no /proc to tell: as os.kill said
    # "pid (comm) state ...": the state follows the last ")" (comm may hold one)
    state_at = stat.rindex(b")") + 2
    return stat[state_at:state_at + 1] != b"Z"


def start_fork_server(launcher: Path, modules: str = FORKED_MODULES) -> ForkServerProcess:
    """Start a server in a new private directory; the environment is left alone (see
    `use_fork_server`)."""
    remove_abandoned_directories()
    directory = Path(tempfile.mkdtemp(prefix=DIRECTORY_PREFIX))
    env = {**os.environ, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", SPARK_HASH_SEED)}
    with open(directory / LOG_NAME, "ab") as server_log:
        process = subprocess.Popen([sys.executable, "-m", "spark_sink.worker_fork", str(directory)],
                                   stdin=subprocess.PIPE, stdout=server_log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    (directory / PID_NAME).write_text(str(process.pid))
    server = ForkServerProcess(directory, process, launcher, modules)
    atexit.register(server.stop)
    return server


def launcher_env(server: ForkServerProcess) -> dict[str, str]:
    """The variables that make `server.launcher` fork through `server`."""
    return {fork_launcher.REAL_PYTHON_ENV: sys.executable, fork_launcher.SOCKET_ENV: str(server.socket_path),
            fork_launcher.MODULES_ENV: server.modules}


def use_fork_server() -> ForkServerProcess | None:
    """Start the server once per process and point PYSPARK_PYTHON at its launcher; call it
    before the SparkSession is made, only when the workers run this interpreter on this
    machine. Returns the server, or None where it is off (EOS_SPARK_FORK_SERVER=0, no fork
    or Unix sockets, no writable cache for the launcher)."""
    global _started
    if os.environ.get(DISABLE_ENV, "1") == "0" or not hasattr(os, "fork") or not hasattr(socket, "AF_UNIX"):
        return None
    if _started is None or _started.process.poll() is not None:
        from eos.maven import cache_root     # (eos's cache: where the Maven jars live too)
        try:
            launcher = launcher_script(cache_root())
        except OSError as exc:
            log.warning("Spark's planner workers start as fresh interpreters: cannot write a launcher (%s)", exc)
            return None
        _started = start_fork_server(launcher)
    os.environ.update(launcher_env(_started))
    os.environ["PYSPARK_PYTHON"] = str(_started.launcher)
    return _started


def launches_this_interpreter(python: str) -> bool:
    """Whether `python` is the launcher `use_fork_server` set (it runs this interpreter)."""
    return _started is not None and python == str(_started.launcher)


# ---------------------------------------------------------------- the server

def _pythonpath_entries(env: dict) -> list[str]:
    return [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]


class _Stop(Exception):
    """SIGTERM: leave the loop the way a driver's end does."""


class ForkServer:
    """The server's loop (see the module doc); `serve()` returns when its parent is gone."""

    def __init__(self, socket_path: str):
        self.socket_path = socket_path
        self.startup_env = dict(os.environ)
        # sys.path as every `python -m` has it after its own first entries: the
        # interpreter's (stdlib, site-packages), without this process's cwd and PYTHONPATH.
        own = {os.getcwd(), ""} | set(_pythonpath_entries(self.startup_env))
        self.base_path = [entry for entry in sys.path if entry not in own]
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, socket.socket] = {}       # pid -> its launcher's connection
        self.listener: socket.socket | None = None
        self.wake_read, self.wake_write = os.pipe()

    def serve(self) -> None:
        for fd in (self.wake_read, self.wake_write):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)     # wakes the selector through the pipe
        signal.signal(signal.SIGTERM, _raise_stop)
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
                    try:
                        if not self._handle(key.data):
                            return
                    except (_Stop, KeyboardInterrupt):
                        raise
                    except Exception:       # one event's failure must not stop the others
                        log.exception("fork server: handling %r failed", key.data)
        except _Stop:
            log.info("SIGTERM: stopping")
        finally:
            self._stop_children()

    def _handle(self, what) -> bool:
        """One ready event; False when the server should stop."""
        if what == "accept":
            self._accept()
        elif what == "parent":
            if not os.read(sys.stdin.fileno(), 4096):
                log.info("the driver is gone: stopping")
                return False
        elif what == "signal":
            while True:
                try:
                    if not os.read(self.wake_read, 4096):
                        break
                except BlockingIOError:
                    break
            self._reap()
        else:
            self._launcher_readable(what)
        return True

    def _accept(self) -> None:
        try:
            connection, _ = self.listener.accept()
        except (BlockingIOError, ConnectionAbortedError):
            return
        try:
            connection.settimeout(CALL_READ_TIMEOUT_S)
            request, fds = _receive_request(connection)
        except Exception as exc:
            _refuse(connection, "could not be read", exc)
            return
        try:
            pid = self._fork(request, fds, connection)
        except Exception as exc:
            _refuse(connection, "was not forked", exc)
            return
        finally:
            for fd in fds:
                os.close(fd)
        connection.settimeout(None)
        self.children[pid] = connection
        self.selector.register(connection, selectors.EVENT_READ, pid)
        _send(connection, {"pid": pid})
        log.info("forked %d for -m %s", pid, request["argv"][1])

    def _fork(self, request: dict, fds: list[int], connection: socket.socket) -> int:
        argv, cwd, env = request.get("argv"), request.get("cwd"), request.get("env")
        ignored = request.get("ignored_signals", [])
        if (len(fds) != 3 or not isinstance(argv, list) or len(argv) < 2 or argv[0] != "-m"
                or not isinstance(cwd, str) or not isinstance(env, dict) or not isinstance(ignored, list)
                or not set(ignored) <= {int(signum) for signum in fork_launcher.FORWARDED_SIGNALS}):
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
            try:
                connection.close()     # the launcher's end must see EOF if this server dies
                self._become_worker(argv, cwd, env, fds, ignored)
            finally:
                os._exit(1)            # (not reached: _become_worker exits)
        return pid

    def _become_worker(self, argv: list, cwd: str, env: dict, fds: list[int], ignored: list[int]) -> None:
        """In the child: take on the launched process's stdio, cwd, environment, signals and
        sys.path, drop the server's state, run the module as `__main__` and exit."""
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)     # as a fresh interpreter
        for signum in ignored:                 # ignored across the launcher's exec, as they would be
            signal.signal(signum, signal.SIG_IGN)
        for handler in log.handlers:
            handler.close()
        log.handlers.clear()
        atexit._clear()                        # the server's exit handlers are not the worker's
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
        first = [] if env.get("PYTHONSAFEPATH") else [cwd]
        sys.path[:] = first + _pythonpath_entries(env) + self.base_path
        importlib.invalidate_caches()
        sys.argv = list(argv[1:])
        # Run as a fresh process would: the module's code as __main__ (its imports are all
        # in memory). Its preloaded copy leaves sys.modules first, or runpy would warn that
        # the module was imported before it ran.
        sys.modules.pop(argv[1], None)
        _run_as_main(argv[1])

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
            self.selector.unregister(connection)
            _send(connection, {"exit": os.waitstatus_to_exitcode(status)})
            connection.close()

    def _launcher_readable(self, pid: int) -> None:
        """A child's launcher connection became readable: it sends nothing after its call,
        so this is its end (the launcher was killed) and the child goes too. Stray bytes
        are read and dropped (left there, the selector would report them forever)."""
        connection = self.children.get(pid)
        if connection is None:
            return
        try:
            if connection.recv(4096):
                return
        except OSError:
            pass
        log.info("the launcher of %d went away: killing it", pid)
        self.selector.unregister(connection)
        connection.close()
        self.children.pop(pid, None)
        _kill(pid)

    def _stop_children(self) -> None:
        """Kill every child left and wait for each (not left to init as zombies)."""
        for pid, connection in list(self.children.items()):
            _kill(pid)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            connection.close()
        self.children.clear()
        self._reap()


def _raise_stop(_signum, _frame):
    raise _Stop()


def _run_as_main(module: str) -> None:
    """runpy's `python -m module`, then the end of an interpreter: threads joined, atexit
    handlers run, stdio flushed, the exit status as Python would set it."""
    import runpy
    import traceback

    code = 0
    interrupted = False
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        if interrupted:                  # as CPython ends on an uncaught KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code & 0xFF)


def _reopen_stdio(unbuffered: bool) -> None:
    """sys.stdin/stdout/stderr on descriptors 0-2 as a fresh interpreter opens them there:
    stdout block-buffered (line-buffered on a terminal) unless PYTHONUNBUFFERED (Spark sets
    it for its workers), stderr line-buffered or write-through."""
    import io

    encoding = sys.stdout.encoding

    def text(fd: int, mode: str, errors: str, **options) -> io.TextIOWrapper:
        binary = open(fd, mode, buffering=0 if unbuffered and "w" in mode else -1, closefd=False)
        return io.TextIOWrapper(binary, encoding=encoding, errors=errors, **options)

    interactive = os.isatty(1)
    sys.stdin = text(0, "rb", sys.stdin.errors)
    sys.stdout = text(1, "wb", sys.stdout.errors, line_buffering=interactive and not unbuffered,
                      write_through=unbuffered)
    sys.stderr = text(2, "wb", "backslashreplace", line_buffering=not unbuffered, write_through=unbuffered)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def _receive_request(connection: socket.socket) -> tuple[dict, list[int]]:
    """The call and its descriptors; on any failure the descriptors are closed here (held,
    they would keep the JVM's pipes of that worker open)."""
    message, fds, _flags, _addr = socket.recv_fds(connection, 65536, 3)
    try:
        if len(message) < fork_launcher.FRAME_HEAD.size:
            raise ValueError("a call without its length")
        (size,) = fork_launcher.FRAME_HEAD.unpack_from(message)
        if size > REQUEST_BYTES_MAX:
            raise ValueError(f"a call of {size} bytes")
        body = bytearray(message[fork_launcher.FRAME_HEAD.size:])
        while len(body) < size:
            chunk = connection.recv(min(65536, size - len(body)))
            if not chunk:
                raise ValueError("the call ended early")
            body += chunk
        # marshal, not json: the launcher must not pay json's imports (fork_launcher's doc)
        return fork_launcher.decode_frame_body(bytes(body[:size]), "call"), list(fds)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _refuse(connection: socket.socket, why: str, exc: Exception) -> None:
    """A call not forked: the launcher, told so, execs the real interpreter instead."""
    log.warning("a launcher's call %s: %s", why, exc)
    _send(connection, {"error": str(exc)})
    connection.close()


def _send(connection: socket.socket, answer: dict) -> None:
    try:
        connection.sendall(fork_launcher.encode_frame(answer))
    except OSError:
        pass       # the launcher is gone; its child is reaped or killed on its own


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _native_threads() -> int:
    try:
        return int(re.search(r"^Threads:\s+(\d+)", Path("/proc/self/status").read_text(), re.M).group(1))
    except (OSError, AttributeError, ValueError):
        return threading.active_count()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m spark_sink.worker_fork <directory>", file=sys.stderr)
        return 2
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    directory = Path(argv[0])
    try:
        for name in PRELOADED_MODULES:
            importlib.import_module(name)
        if threading.active_count() > 1:
            # fork copies only the calling thread: a lock another Python thread held stays held
            log.warning("%d Python threads after the imports: forked workers may deadlock",
                        threading.active_count())
        log.info("%d native threads after the imports (see the module doc)", _native_threads())
        gc.collect()
        gc.freeze()
        ForkServer(str(directory / SOCKET_NAME)).serve()
    finally:
        # The directory is this server's: a driver killed outright cannot remove it.
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

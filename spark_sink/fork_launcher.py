"""The Python executable Spark starts for its planner workers: run them as forks of a warm
interpreter (spark_sink/worker_fork.py), or else exec the real one.

Theory of operation
-------------------
Spark starts a new Python process, `<pythonExec> -m <module>`, for each streaming query's
Python source (`pyspark.sql.streaming.python_streaming_source_runner`) and for each planner
step of a Python data source (`pyspark.sql.worker.*`); each pays an interpreter's start and
pyspark's imports (about 0.3 s here) before it answers the JVM. `worker_fork.use_fork_server`
points PYSPARK_PYTHON at a script that runs this file with `python -I -S` (stdlib only, no
site: a few milliseconds), which:

- for a module named in EOS_SPARK_FORK_MODULES, when the fork server at
  EOS_SPARK_FORK_SOCKET answers: sends it the call (argv, cwd, environment) with this
  process's stdin, stdout and stderr (SCM_RIGHTS), so the forked child talks to the JVM's
  pipes directly; then waits for the child's exit status and exits with it. SIGTERM,
  SIGINT and SIGHUP sent to this process (Spark's `destroy()` of a worker) are passed on
  to the child; if this process is killed outright, the server sees the connection close
  and kills the child;
- otherwise (another module, such as `pyspark.daemon`; no server; a refused call):
  `os.execv`s the real interpreter (EOS_SPARK_REAL_PYTHON) with the same arguments, so the
  worker is what it would have been, a few milliseconds later.

The wire: one request, a 4-byte big-endian length and a JSON object {"argv", "cwd", "env"},
sent with the three descriptors; the server answers JSON lines: {"pid": n} once forked, then
{"exit": code} (a negative code: killed by that signal) or {"error": "..."} (not forked: the
launcher falls back to exec).
"""
import json
import os
import signal
import socket
import struct
import sys

SOCKET_ENV = "EOS_SPARK_FORK_SOCKET"
MODULES_ENV = "EOS_SPARK_FORK_MODULES"
REAL_PYTHON_ENV = "EOS_SPARK_REAL_PYTHON"
CONNECT_TIMEOUT_S = 2.0
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def forked_module(argv, modules_text):
    """The module of `-m <module>` in `argv` when it is one the server should fork, else None."""
    if len(argv) < 2 or argv[0] != "-m" or not modules_text:
        return None
    module = argv[1]
    for entry in modules_text.split(","):
        entry = entry.strip()
        if entry and (module == entry or (entry.endswith(".") and module.startswith(entry))):
            return module
    return None


def exec_real_python(argv):
    real = os.environ.get(REAL_PYTHON_ENV)
    if not real:
        sys.stderr.write(f"eos fork launcher: {REAL_PYTHON_ENV} is not set\n")
        os._exit(127)
    os.execv(real, [real] + list(argv))


def _read_line(sock, buffer):
    while b"\n" not in buffer:
        chunk = sock.recv(4096)
        if not chunk:
            return None, buffer
        buffer += chunk
    line, _, rest = buffer.partition(b"\n")
    return json.loads(line), rest


def run_forked(argv, socket_path):
    """Have the server fork the worker; the child's exit code, or None when it was not
    forked (the caller execs the real interpreter instead)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(socket_path)
        request = json.dumps({"argv": list(argv), "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        socket.send_fds(sock, [struct.pack(">I", len(request)) + request], [0, 1, 2])
        answer, buffer = _read_line(sock, b"")
    except (OSError, ValueError):
        sock.close()
        return None
    if answer is None or "pid" not in answer:
        sock.close()
        return None
    child = answer["pid"]

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except OSError:
            pass

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    sock.settimeout(None)
    while True:
        try:
            answer, buffer = _read_line(sock, buffer)
        except InterruptedError:
            continue
        except (OSError, ValueError):
            answer = None
        if answer is None:
            return 1          # the server went away: the child is gone with it
        if "exit" in answer:
            code = answer["exit"]
            return 128 - code if code < 0 else code


def main():
    argv = sys.argv[1:]
    socket_path = os.environ.get(SOCKET_ENV)
    if socket_path and forked_module(argv, os.environ.get(MODULES_ENV, "")):
        code = run_forked(argv, socket_path)
        if code is not None:
            sys.stdout.flush()
            os._exit(code)
    exec_real_python(argv)


if __name__ == "__main__":
    main()

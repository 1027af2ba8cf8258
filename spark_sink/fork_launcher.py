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
  to the child, except those ignored when it started (they stay ignored in the child, as
  across an exec); if this process is killed outright, the server sees the connection
  close and kills the child. If the server dies, the child lives on and this process
  waits for its end;
- otherwise (another module, such as `pyspark.daemon`; no server; a refused call):
  `os.execv`s the real interpreter (EOS_SPARK_REAL_PYTHON) with the same arguments, so the
  worker is what it would have been, a few milliseconds later.

The wire: frames of a 4-byte big-endian length and a `marshal`led dict (both ends are this
interpreter: the launcher script names it). One request {"argv", "cwd", "env",
"ignored_signals"}, sent with the three descriptors; the server answers {"pid": n} once
forked, then {"exit": code} (a negative code: killed by that signal), or {"error": "..."}
(not forked: the launcher falls back to exec). Only that explicit refusal, or a failure
before the request is sent, falls back: after it, a child may already run on the
descriptors, and a second worker beside it would be worse than a failed one.

Every query's start waits for this process, so it imports no Python module beyond what
the interpreter loads to start: `json` (with `re` and `enum`) and `socket`, `signal` and
`struct` (their Python layers import `enum`, `selectors`, ...) cost 20 ms here, twice the
interpreter's own start. It uses the C modules under them (`_socket`, `_signal`,
`_struct`, `select`) and `marshal`, which load in well under a millisecond.
"""
import _signal
import _socket
import _struct
import marshal
import os
import select
import sys
import time

SOCKET_ENV = "EOS_SPARK_FORK_SOCKET"
MODULES_ENV = "EOS_SPARK_FORK_MODULES"
REAL_PYTHON_ENV = "EOS_SPARK_REAL_PYTHON"
CONNECT_TIMEOUT_S = 2.0
FORWARDED_SIGNALS = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP)
FRAME_HEAD = _struct.Struct(">I")      # a frame's length, before its marshalled dict
FRAME_BYTES_MAX = 1 << 20              # an answer is a few bytes; anything this long is not one


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


def encode_frame(message):
    body = marshal.dumps(message)
    return FRAME_HEAD.pack(len(body)) + body


def decode_frame_body(body, what):
    """The dict a frame's body holds (`what`: "call" or "answer", for the error); ValueError
    for anything else. Both ends are the same interpreter (marshal's format is its own);
    the socket is in the server's private directory, so only its user can send one."""
    try:
        message = marshal.loads(body)
    except (EOFError, TypeError, ValueError) as exc:
        raise ValueError(f"an unreadable {what}: {exc}") from None
    if not isinstance(message, dict):
        raise ValueError(f"a {what} that is not a dict")
    return message


def read_frame(sock, buffer):
    """(the next answer, the bytes after it), or (None, ...) at the end of the connection.
    ValueError for a frame that is not an answer."""
    while True:
        if len(buffer) >= FRAME_HEAD.size:
            (size,) = FRAME_HEAD.unpack_from(buffer)
            if size > FRAME_BYTES_MAX:
                raise ValueError(f"an answer of {size} bytes")
            end = FRAME_HEAD.size + size
            if len(buffer) >= end:
                return decode_frame_body(buffer[FRAME_HEAD.size:end], "answer"), buffer[end:]
        chunk = sock.recv(4096)
        if not chunk:
            return None, buffer
        buffer += chunk


class _Child:
    """The forked worker as this launcher sees it: signals that arrive before its pid is
    known are kept and sent once it is; sent through a pidfd where there is one, so a
    signal can never reach another process that reused the pid."""

    def __init__(self):
        self.pid = None
        self.pidfd = None
        self.pending = []

    def adopt(self, pid):
        self.pid = pid
        try:
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.pidfd = None        # no pidfd here, or it has exited already
        pending, self.pending = self.pending, []
        for signum in pending:
            self.send(signum)

    def send(self, signum):
        if self.pid is None:
            self.pending.append(signum)
            return
        try:
            if self.pidfd is not None:
                _signal.pidfd_send_signal(self.pidfd, signum)
            else:
                os.kill(self.pid, signum)
        except OSError:
            pass       # it has exited: its status is on its way

    def wait_gone(self):
        """Until the child has exited (the server that would report it is gone)."""
        if self.pidfd is not None:
            select.select([self.pidfd], [], [])
            return
        while True:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return
            except OSError:
                pass
            time.sleep(0.05)


def run_forked(argv, socket_path):
    """Have the server fork the worker; the child's exit code, or None when it was not
    forked (the caller execs the real interpreter instead).

    Falling back is safe only while the server cannot have forked: before the request is
    sent, or on its explicit {"error"}. Once it is sent, a child may be running on these
    descriptors, so every other failure ends this launcher instead of starting a second
    worker beside it."""
    child = _Child()
    # Signals ignored at start stay ignored (pyspark starts the JVM with SIGINT ignored, so
    # its workers ignore a terminal's Ctrl-C); the others are handed to the child, kept
    # until its pid is known.
    ignored = [signum for signum in FORWARDED_SIGNALS if _signal.getsignal(signum) == _signal.SIG_IGN]
    for signum in FORWARDED_SIGNALS:
        if signum not in ignored:
            _signal.signal(signum, lambda signum, _frame: child.send(signum))
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    message = encode_frame({"argv": list(argv), "cwd": os.getcwd(), "env": dict(os.environ),
                            "ignored_signals": [int(signum) for signum in ignored]})
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(socket_path)
        sock.settimeout(None)
        # stdin, stdout and stderr ride with the first bytes (socket.send_fds, without socket.py)
        sent = sock.sendmsg([message], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, _struct.pack("3i", 0, 1, 2))])
    except OSError:
        sock.close()
        return 128 + child.pending[0] if child.pending else None
    try:
        if sent < len(message):
            # (only then: a send of nothing still fails with EPIPE once the server has
            # closed, and a server that refused at once -- a PYTHONHASHSEED it cannot give --
            # closes right after its answer, which the launcher then never read)
            sock.sendall(message[sent:])
        answer, buffer = read_frame(sock, b"")
    except (OSError, ValueError) as exc:
        answer, buffer = {"lost": str(exc)}, b""
    if answer is not None and "error" in answer:
        sock.close()
        if child.pending:      # told to end while it asked: end, rather than exec a worker
            return 128 + child.pending[0]
        return None
    if answer is None or "pid" not in answer:
        sys.stderr.write(f"eos fork launcher: the fork server ended the call without forking it ({answer})\n")
        return 1
    child.adopt(answer["pid"])
    while True:
        try:
            answer, buffer = read_frame(sock, buffer)
        except (OSError, ValueError):
            answer = None
        if answer is None:
            # The server went away: the worker lives on without it; wait for its end
            # (its exit status went with the server).
            child.wait_gone()
            return 1
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

"""A worker module for the fork server's tests: prints what it runs with, as JSON, then
exits with the code in its arguments ("text": with a message), or sleeps ("sleep") until it
is signalled. Its atexit handler writes to stderr, as a worker's own handlers would."""
import atexit
import json
import os
import signal
import sys
import time


def first_steps_imports():
    """What the source runner's first steps import beyond what the worker started with:
    pyspark's connection to the JVM (getaddrinfo of "127.0.0.1") and the source's first
    Admin (spark_sink/worker_fork.py's PRELOADED_MODULES)."""
    import socket
    before = set(sys.modules)
    socket.getaddrinfo("127.0.0.1", 0, socket.AF_UNSPEC, socket.SOCK_STREAM)
    import eos.admin  # noqa: F401
    import eos.sasl  # noqa: F401
    import secrets  # noqa: F401
    return sorted(set(sys.modules) - before)


def main():
    atexit.register(lambda: print("probe atexit ran", file=sys.stderr, flush=True))
    imported = first_steps_imports() if "first-steps" in sys.argv else None
    print(json.dumps({"first_steps_imported": imported, "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "argv": sys.argv[1:],
                      "probe": os.environ.get("FORK_PROBE"), "path": sys.path[:2],
                      "write_through": sys.stdout.write_through, "hash": hash("fork-probe"),
                      "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
                      "stdin": sys.stdin.readline().strip() if "stdin" in sys.argv else None}), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if "sleep" in sys.argv:
        time.sleep(120)
    if "text" in sys.argv:
        return "the probe failed on purpose"
    return int(sys.argv[-1]) if sys.argv[-1].isdigit() else 0


if __name__ == "__main__":
    sys.exit(main())

"""An eos broker subprocess for benchmarks, on a free 127.0.0.1 port and a temp data dir.

Theory of operation
-------------------
`EosBroker` runs ``python -m broker --data-dir DIR --port N`` with the interpreter of the
running benchmark (so the virtualenv's eos is the one measured). A reader thread copies the
broker's stdout and stderr into ``server.log`` and sets an event when the line
``eos broker listening on`` appears. Readiness is bounded: that line before
`start_timeout_s` (or, failing it, an open port at the deadline: the port is bound before
start-up has finished, so it is only a fallback). A broker that exits early raises with the
tail of its log. Stopping sends SIGTERM (the broker shuts down cleanly on it), waits, then
SIGKILL; the temp dir is removed in every case.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.kafka import TempFiles, free_port, port_accepts, stop_process

READY_LINE = "eos broker listening on"
START_TIMEOUT_S = 60.0
REPO_ROOT = Path(__file__).resolve().parent.parent


class EosUnavailable(RuntimeError):
    """The eos broker could not be started; the message says why."""


def broker_available() -> str | None:
    """None if `python -m broker` can run here, else the reason it cannot."""
    if not (REPO_ROOT / "broker" / "__main__.py").exists():
        return "broker/__main__.py does not exist yet"
    return None


class EosBroker(TempFiles):
    """with EosBroker() as eos_broker: eos_broker.bootstrap, eos_broker.data_dir"""

    def __init__(self, *, base_dir: str | None = None, extra_args: tuple[str, ...] = (),
                 start_timeout_s: float = START_TIMEOUT_S):
        self.base_dir = base_dir
        self.extra_args = extra_args
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.tmp: Path | None = None
        self.port = 0
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        if self.tmp is None:
            raise EosUnavailable("the broker is not started")
        return self.tmp / "data"

    @property
    def server_log(self) -> Path:
        if self.tmp is None:
            raise EosUnavailable("the broker is not started")
        return self.tmp / "server.log"

    def start(self) -> "EosBroker":
        reason = broker_available()
        if reason:
            raise EosUnavailable(reason)
        self.tmp = Path(tempfile.mkdtemp(prefix="eos-bench-eos-", dir=self.base_dir))
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.port = free_port()
        self.data_dir.mkdir()
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "--data-dir", str(self.data_dir),
             "--port", str(self.port), *self.extra_args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=REPO_ROOT, env=env, start_new_session=True)
        self._reader = threading.Thread(target=self._pump, args=(self.proc,), daemon=True,
                                        name="eos-broker-log")
        self._reader.start()
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            if self._ready.wait(timeout=0.2):
                break
        else:
            # No banner: accept an open port from a live process (the wording may have
            # changed), but not sooner, since the port is bound before start-up finishes.
            if not port_accepts("127.0.0.1", self.port):
                raise EosUnavailable(f"the eos broker was not ready within "
                                     f"{self.start_timeout_s:.0f} s:\n{self._tail()}")
        self.check_alive()

    def check_alive(self) -> None:
        """EosUnavailable with the log's tail if the broker process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            if self._reader is not None:
                self._reader.join(timeout=2)
            raise EosUnavailable(f"the eos broker exited with code {self.proc.returncode}:"
                                 f"\n{self._tail()}")

    def _pump(self, proc: subprocess.Popen) -> None:
        if proc.stdout is None or self.tmp is None:
            return
        with open(self.tmp / "server.log", "wb") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if not self._ready.is_set() and READY_LINE.encode() in line:
                    self._ready.set()

    def _tail(self, lines: int = 30) -> str:
        try:
            text = self.server_log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, *, keep_files: bool = False) -> None:
        """SIGTERM, SIGKILL after a bound; the temp dir is removed unless `keep_files` (then
        `remove_files()` later)."""
        try:
            if self.proc is not None:
                stop_process(self.proc)
                if self._reader is not None:
                    self._reader.join(timeout=5)
                if self.proc.stdout is not None:
                    self.proc.stdout.close()
        finally:
            self.proc = None
            if not keep_files:
                self.remove_files()

    def __enter__(self) -> "EosBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

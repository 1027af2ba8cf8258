"""Shared fixtures: real brokers for integration tests.

Fixtures (function scope, always cleaned up, even when the test fails):

`broker` -> BrokerProcess
    A real broker subprocess, `python -m broker --data-dir <tmp>/data --port <free>`,
    ready when it has printed its listening line and answered a Metadata RPC (<= 20 s).
    .address "127.0.0.1:PORT" (stable across restarts), .host, .port, .data_dir (Path),
    .pid, .log_path (its stderr), .is_running(),
    .kill()              SIGKILL and reap (a crash: no clean shutdown)
    .stop(timeout_s=20)  SIGTERM, wait; returns the exit code (fails the test if it hangs)
    .restart()           stop() if running (use kill() first for a crash), start again on
                         the same port and data dir, wait until ready
    .start()             start a stopped or killed broker
    .channel()           a grpc.Channel to it (100 MiB messages), closed at teardown
    .broker_stub(), .txn_stub()  eos.v1 Broker / TxnCoordinator stubs on that channel

`broker_factory(config=None, data_dir=None, port=0) -> BrokerProcess`
    More brokers, or one with broker config (Kafka names, e.g. {"log.segment.bytes": "4096"}).
    Started and ready when returned; all killed at teardown.

`inprocess_broker` -> InProcessBroker
    broker.server.BrokerServer running inside the test process (no subprocess start-up
    cost; cannot be kill -9'd). Same .address, .port, .data_dir, .channel(), .broker_stub(),
    .txn_stub(), .stop(), .restart(), .start(); plus .server (the BrokerServer).

`inprocess_broker_factory(config=None, data_dir=None) -> InProcessBroker`  likewise, with config.

Parallel runs (`./run tests` runs two pytest-xdist workers, `--dist loadgroup`): each
test module is one unit of work, so a module's shared fixtures (its ZooKeeper, its broker)
start once, on one worker; every Spark module is in one unit ("spark"), so one worker
starts Spark, first thing (pyspark's gateway launch runs Python in a forked child, which
must not happen in a process already full of gRPC and kazoo threads). The units that take
minutes are handed out first (`LONG_UNITS_FIRST`), so no worker is left with one at the end.
"""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 20.0
GRPC_MESSAGE_BYTES_MAX = 100 * 1024 * 1024
_LISTENING_LINE = re.compile(r"^eos broker listening on (?P<host>\S+):(?P<port>\d+) \(data dir ")
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX),
]

SPARK_UNIT = "spark"
# The units of work that take minutes (CI's --durations), longest first; the rest follow in
# collection order. The Spark unit goes first: see the module doc.
LONG_UNITS_FIRST = [SPARK_UNIT, "tests/cluster/test_cluster_chaos.py", "tests/integration/test_compaction_broker.py",
                    "tests/cluster/test_replication.py", "tests/cluster/test_cluster_failover.py"]


def _unit_of(item) -> str:
    path = Path(item.path).resolve().relative_to(REPO_ROOT).as_posix()
    return SPARK_UNIT if path.startswith("tests/spark/") else path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Group each test into its unit of work (pytest-xdist's xdist_group, read under
    --dist loadgroup) and hand out the long units first (the module doc)."""
    rank = {unit: index for index, unit in enumerate(LONG_UNITS_FIRST)}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_unit_of(item)))
    items.sort(key=lambda item: rank.get(_unit_of(item), len(rank)))   # stable: modules keep their order


class _Channels:
    """Channels handed out for one broker; closed when it stops and at teardown."""

    def __init__(self):
        self._channels: list[grpc.Channel] = []
        self._current: grpc.Channel | None = None

    def get(self, address: str) -> grpc.Channel:
        if self._current is None:
            self._current = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
            self._channels.append(self._current)
        return self._current

    def close_all(self) -> None:
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        self._current = None


def _wait_for_metadata(address: str, deadline: float, is_alive=lambda: True) -> None:
    from eos.v1 import broker_pb2, broker_pb2_grpc

    last_error: Exception | None = None
    with grpc.insecure_channel(address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        while time.monotonic() < deadline and is_alive():
            try:
                stub.Metadata(broker_pb2.MetadataRequest(), timeout=max(0.1, min(2.0, deadline - time.monotonic())))
                return
            except grpc.RpcError as exc:
                last_error = exc
                time.sleep(0.05)
    raise TimeoutError(f"broker at {address} did not answer Metadata in time: {last_error}")


class BrokerProcess:
    """One broker subprocess (see the module doc). Not thread-safe; one test drives it."""

    def __init__(self, data_dir: Path, *, port: int = 0, config: dict[str, str] | None = None,
                 log_path: Path | None = None, host: str = "127.0.0.1"):
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port              # 0 until the first start picks one
        self.config = dict(config or {})
        self.log_path = Path(log_path) if log_path else self.data_dir.parent / f"{self.data_dir.name}-broker.log"
        self._process: subprocess.Popen | None = None
        self._channels = _Channels()

    @property
    def address(self) -> str:
        if not self.port:
            raise RuntimeError("the broker has not been started yet")
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> "BrokerProcess":
        if self.is_running():
            raise RuntimeError("the broker is already running")
        command = [sys.executable, "-m", "broker", "--data-dir", str(self.data_dir),
                   "--host", self.host, "--port", str(self.port)]
        for name, value in self.config.items():
            command += ["--config", f"{name}={value}"]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            self._process = subprocess.Popen(
                command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=log_file, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        try:
            self._wait_ready(time.monotonic() + timeout_s)
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_ready(self, deadline: float) -> None:
        lines: queue.Queue = queue.Queue()
        stdout = self._process.stdout

        def pump():  # keeps draining stdout so the broker can never block on a full pipe
            try:
                for raw in iter(stdout.readline, b""):
                    lines.put(raw.decode("utf-8", "replace"))
            finally:
                stdout.close()  # EOF: the process is gone
                lines.put(None)

        threading.Thread(target=pump, name="broker-stdout", daemon=True).start()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"broker did not say it was listening within the time limit\n{self.log_tail()}")
            try:
                line = lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            if line is None:
                self._process.wait(5)
                raise RuntimeError(f"broker exited with code {self._process.returncode} before it was ready\n"
                                   f"{self.log_tail()}")
            match = _LISTENING_LINE.match(line)
            if match:
                self.port = int(match.group("port"))
                break
        _wait_for_metadata(self.address, deadline, self.is_running)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no broker log)"
        return "--- broker log (tail) ---\n" + "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait for a clean exit; return its exit code. A broker that does not
        stop in time is killed and the test fails: a hanging shutdown is a bug."""
        self._channels.close_all()
        if self._process is None:
            return 0
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"broker did not stop within {timeout_s} s of SIGTERM\n{self.log_tail()}")
        return self._process.returncode

    def kill(self) -> None:
        """SIGKILL (kill -9) and reap: the broker gets no chance to clean up."""
        self._channels.close_all()
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(STOP_TIMEOUT_S)

    def restart(self, timeout_s: float = READY_TIMEOUT_S) -> "BrokerProcess":
        if self.is_running():
            self.stop()
        return self.start(timeout_s)

    def channel(self) -> grpc.Channel:
        return self._channels.get(self.address)

    def broker_stub(self):
        from eos.v1 import broker_pb2_grpc
        return broker_pb2_grpc.BrokerStub(self.channel())

    def txn_stub(self):
        from eos.v1 import txn_pb2_grpc
        return txn_pb2_grpc.TxnCoordinatorStub(self.channel())

    def close(self) -> None:
        """Teardown: kill whatever still runs and close the channels (the stdout pipe is
        closed by its reader at EOF)."""
        self.kill()


class InProcessBroker:
    """A BrokerServer inside the test process (see the module doc)."""

    def __init__(self, data_dir: Path, *, config: dict[str, str] | None = None):
        self.data_dir = Path(data_dir)
        self.config = dict(config or {})
        self.host = "127.0.0.1"
        self.port = 0
        self.server = None
        self._channels = _Channels()

    @property
    def address(self) -> str:
        if not self.port:
            raise RuntimeError("the broker has not been started yet")
        return f"{self.host}:{self.port}"

    def is_running(self) -> bool:
        return self.server is not None

    def start(self) -> "InProcessBroker":
        from broker.server import BrokerServer

        if self.server is not None:
            raise RuntimeError("the broker is already running")
        server = BrokerServer(self.data_dir, host=self.host, port=self.port, config=self.config)
        server.start()
        self.server = server
        self.port = server.port
        return self

    def stop(self) -> None:
        self._channels.close_all()
        if self.server is not None:
            server, self.server = self.server, None
            server.stop()

    def restart(self) -> "InProcessBroker":
        self.stop()
        return self.start()

    def channel(self) -> grpc.Channel:
        return self._channels.get(self.address)

    def broker_stub(self):
        from eos.v1 import broker_pb2_grpc
        return broker_pb2_grpc.BrokerStub(self.channel())

    def txn_stub(self):
        from eos.v1 import txn_pb2_grpc
        return txn_pb2_grpc.TxnCoordinatorStub(self.channel())

    close = stop


@pytest.fixture
def broker_factory(tmp_path_factory):
    started: list[BrokerProcess] = []

    def make(config: dict[str, str] | None = None, data_dir: Path | None = None,
             port: int = 0) -> BrokerProcess:
        if data_dir is None:
            data_dir = tmp_path_factory.mktemp("broker") / "data"
        process = BrokerProcess(Path(data_dir), port=port, config=config)
        started.append(process)
        return process.start()

    yield make
    for process in started:
        process.close()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    return broker_factory()


@pytest.fixture
def inprocess_broker_factory(tmp_path_factory):
    started: list[InProcessBroker] = []

    def make(config: dict[str, str] | None = None, data_dir: Path | None = None) -> InProcessBroker:
        if data_dir is None:
            data_dir = tmp_path_factory.mktemp("broker") / "data"
        handle = InProcessBroker(Path(data_dir), config=config)
        started.append(handle)
        return handle.start()

    yield make
    for handle in started:
        handle.close()


@pytest.fixture
def inprocess_broker(inprocess_broker_factory) -> InProcessBroker:
    return inprocess_broker_factory()

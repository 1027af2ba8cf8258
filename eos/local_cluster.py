"""A local cluster on one machine: ZooKeeper and N broker processes on 127.0.0.1.

Theory of operation
-------------------
`LocalCluster` is what `eos cluster start`, the cluster tests and the cluster benchmarks
share: it starts Apache ZooKeeper (`eos.zookeeper`, jars fetched and cached on first use)
and then each broker as its own process (`python -m broker` with `zookeeper.connect`),
broker ids 0..N-1 on consecutive ports from `base_port` (0: free ports picked at start),
each with its data dir `<data_dir>/broker-<id>` and its log file beside it. A broker is
ready when it printed its "listening" line; the cluster is ready when a Metadata answer
lists every broker (the controller has sent its UpdateMetadata).

Faults are process-level and real: `kill(id)` is SIGKILL (no controlled shutdown: the
session expires and the controller moves the leaderships), `terminate(id)` is SIGTERM (a
controlled shutdown first), `pause`/`resume` are SIGSTOP/SIGCONT, `restart(id)` starts the
same broker again on the same port and data dir. Every wait is bounded; `stop()` ends every
process it started, whatever state it is in, and is safe to call twice.

TLS: with `listener_protocol="SSL"` each broker has one listener, `SSL://127.0.0.1:<port>`,
which clients and the other brokers use alike (mutual TLS: `broker_config` carries the
broker's certificate, key and CA, `client_config` the settings of the cluster's own client
-- the readiness check -- such as `eos.tls_certs.LocalTls.client_config("admin")`).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from eos.errors import EosError, ErrorCode

BROKER_START_TIMEOUT_S = 60.0
PORT_ATTEMPTS = 3               # a broker whose free port was taken before it bound starts on another
BROKER_STOP_TIMEOUT_S = 60.0
READY_LINE = "eos broker listening on"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class BrokerProcess:
    broker_id: int
    port: int
    data_dir: Path
    log_path: Path
    process: subprocess.Popen | None = None
    paused: bool = False
    metrics_port: int | None = None     # its Prometheus endpoint, kept across restarts

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str | None:
        return None if self.metrics_port is None else f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class LocalCluster:
    data_dir: Path
    brokers: int = 3
    base_port: int = 0
    zookeeper_port: int = 0
    broker_config: dict[str, str] = field(default_factory=dict)
    zookeeper: object | None = None     # eos.zookeeper.ZooKeeperServer, or an outside one's connect string
    zookeeper_connect: str = ""
    chroot: str = ""
    listener_protocol: str = "PLAINTEXT"     # or SSL: see the module doc
    client_config: dict[str, str] = field(default_factory=dict)
    # broker i serves Prometheus metrics on metrics_base_port + i; 0: on free ports; -1: none
    metrics_base_port: int = -1
    processes: dict[int, BrokerProcess] = field(default_factory=dict)

    def __post_init__(self):
        self.data_dir = Path(self.data_dir).resolve()
        if self.brokers < 1:
            raise EosError(f"a cluster needs at least one broker, got {self.brokers}", ErrorCode.INVALID_CONFIG)
        if self.listener_protocol not in ("PLAINTEXT", "SSL"):
            raise EosError(f"listener_protocol must be PLAINTEXT or SSL, got {self.listener_protocol!r}",
                           ErrorCode.INVALID_CONFIG)

    # ---- start ------------------------------------------------------------------------------

    def start(self, *, progress=None) -> "LocalCluster":
        if self.processes:
            # A second start would spawn a second set of brokers and, failing on the data
            # dirs' locks, stop only that set: the first would be left running.
            raise EosError("this LocalCluster is started already (`with LocalCluster(...)` starts it)",
                           ErrorCode.INVALID_REQUEST)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            if not self.zookeeper_connect:
                from eos.zookeeper import ZooKeeperServer
                port = self.zookeeper_port or free_port()
                self.zookeeper = ZooKeeperServer(self.data_dir / "zookeeper", port=port)
                self.zookeeper.start()
                self.zookeeper.wait_ready()
                self.zookeeper_connect = self.zookeeper.connect_string
            if self.chroot:
                _ensure_chroot(self.zookeeper_connect, self.chroot)
            for broker_id in range(self.brokers):
                port = self.base_port + broker_id if self.base_port else free_port()
                data_dir = self.data_dir / f"broker-{broker_id}"
                self.processes[broker_id] = BrokerProcess(broker_id, port, data_dir,
                                                          self.data_dir / f"broker-{broker_id}.log")
            for broker_id in self.processes:
                self._spawn(broker_id)
            for broker_id in self.processes:
                self._wait_started_moving_port(broker_id)
                if progress is not None:
                    progress(broker_id)
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def connect_string(self) -> str:
        return self.zookeeper_connect + self.chroot

    def _spawn(self, broker_id: int) -> None:
        proc = self.processes[broker_id]
        proc.data_dir.mkdir(parents=True, exist_ok=True)
        config = {"zookeeper.connect": self.connect_string, **self.broker_config}
        if self.listener_protocol != "PLAINTEXT":
            config["listeners"] = f"{self.listener_protocol}://127.0.0.1:{proc.port}"
        if self.metrics_base_port >= 0:
            if proc.metrics_port is None:
                proc.metrics_port = self.metrics_base_port + broker_id if self.metrics_base_port else free_port()
            config["metrics.port"] = str(proc.metrics_port)
        args = [sys.executable, "-m", "broker", "--data-dir", str(proc.data_dir), "--host", "127.0.0.1",
                "--port", str(proc.port), "--node-id", str(broker_id)]
        for name, value in config.items():
            args += ["--config", f"{name}={value}"]
        log = open(proc.log_path, "ab")
        try:
            proc.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        finally:
            log.close()
        proc.paused = False

    def _wait_started_moving_port(self, broker_id: int) -> None:
        """A free port found before the broker binds it can be taken meanwhile by another
        process: a broker that could not listen starts again on another free port (unless
        the ports were given)."""
        for attempt in range(PORT_ATTEMPTS):
            try:
                self.wait_broker_started(broker_id)
                return
            except EosError as exc:
                proc = self.processes[broker_id]
                if self.base_port or "cannot listen on" not in str(exc) or attempt == PORT_ATTEMPTS - 1:
                    raise
                proc.port = free_port()
                proc._log_offset = proc.log_path.stat().st_size
                self._spawn(broker_id)

    def wait_broker_started(self, broker_id: int, timeout_s: float = BROKER_START_TIMEOUT_S) -> None:
        proc = self.processes[broker_id]
        deadline = time.monotonic() + timeout_s
        start_offset = getattr(proc, "_log_offset", 0)
        while time.monotonic() < deadline:
            text = proc.log_path.read_bytes()[start_offset:].decode("utf-8", "replace")
            if f"{READY_LINE} {proc.address}" in text:
                return
            if proc.process is not None and proc.process.poll() is not None:
                raise EosError(f"broker {broker_id} exited with {proc.process.returncode} while starting:\n"
                               f"{_tail(proc.log_path)}", ErrorCode.BROKER_NOT_AVAILABLE)
            time.sleep(0.05)
        raise EosError(f"broker {broker_id} did not start within {timeout_s} s:\n{_tail(proc.log_path)}",
                       ErrorCode.REQUEST_TIMED_OUT)

    def wait_ready(self, timeout_s: float = BROKER_START_TIMEOUT_S, brokers: set[int] | None = None) -> None:
        """Until a Metadata answer from a running broker lists `brokers` (default: every
        running one) as live."""
        import grpc

        from eos.client_config import security_of
        from eos.net import open_channel
        from eos.v1 import broker_pb2, broker_pb2_grpc

        security = security_of(self.client_config)
        wanted = brokers if brokers is not None else {b for b, p in self.processes.items() if p.running}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for proc in self.processes.values():
                if not proc.running or proc.paused:
                    continue
                channel = open_channel(proc.address, security)
                try:
                    response = broker_pb2_grpc.BrokerStub(channel).Metadata(broker_pb2.MetadataRequest(), timeout=2)
                    if wanted <= {b.node_id for b in response.brokers} and response.controller_id >= 0:
                        return
                except grpc.RpcError:
                    pass
                finally:
                    channel.close()
            time.sleep(0.1)
        raise EosError(f"the cluster did not list brokers {sorted(wanted)} within {timeout_s} s",
                       ErrorCode.REQUEST_TIMED_OUT)

    @property
    def bootstrap(self) -> str:
        return ",".join(p.address for p in self.processes.values())

    # ---- faults ---------------------------------------------------------------------------

    def kill(self, broker_id: int) -> None:
        """SIGKILL: no controlled shutdown, the ZooKeeper session just expires."""
        proc = self.processes[broker_id]
        if proc.process is not None and proc.process.poll() is None:
            os.killpg(proc.process.pid, signal.SIGKILL)
            proc.process.wait(BROKER_STOP_TIMEOUT_S)
        proc.paused = False

    def terminate(self, broker_id: int, timeout_s: float = BROKER_STOP_TIMEOUT_S) -> int:
        """SIGTERM (controlled shutdown) and wait; returns the exit code."""
        proc = self.processes[broker_id]
        if proc.process is None or proc.process.poll() is not None:
            return -1 if proc.process is None else proc.process.returncode
        if proc.paused:
            self.resume(broker_id)
        proc.process.send_signal(signal.SIGTERM)
        try:
            return proc.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill(broker_id)
            raise EosError(f"broker {broker_id} did not stop within {timeout_s} s after SIGTERM",
                           ErrorCode.REQUEST_TIMED_OUT) from None

    def pause(self, broker_id: int) -> None:
        proc = self.processes[broker_id]
        os.killpg(proc.process.pid, signal.SIGSTOP)
        proc.paused = True

    def resume(self, broker_id: int) -> None:
        proc = self.processes[broker_id]
        os.killpg(proc.process.pid, signal.SIGCONT)
        proc.paused = False

    def restart(self, broker_id: int, *, wait: bool = True) -> None:
        proc = self.processes[broker_id]
        if proc.running:
            self.kill(broker_id)
        proc._log_offset = proc.log_path.stat().st_size if proc.log_path.exists() else 0
        self._spawn(broker_id)
        if wait:
            self.wait_broker_started(broker_id)

    # ---- stop ------------------------------------------------------------------------------

    def stop(self) -> None:
        for broker_id, proc in self.processes.items():
            if proc.process is None or proc.process.poll() is not None:
                continue
            try:
                if proc.paused:
                    self.resume(broker_id)
                proc.process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + BROKER_STOP_TIMEOUT_S
        for broker_id, proc in self.processes.items():
            if proc.process is None:
                continue
            try:
                proc.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(broker_id)
        if self.zookeeper is not None:
            self.zookeeper.stop()
            self.zookeeper = None

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def _ensure_chroot(connect: str, chroot: str) -> None:
    """A chroot's node must exist before clients rooted in it can create anything (Kafka's
    brokers create it the same way)."""
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=connect)
    zk.start(timeout=30)
    try:
        zk.ensure_path(chroot)
    finally:
        zk.stop()
        zk.close()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"

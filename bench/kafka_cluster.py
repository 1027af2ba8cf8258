"""Apache Kafka as the cluster peer: N KRaft nodes (broker + controller each) on 127.0.0.1.

Theory of operation
-------------------
The jars come from `bench.kafka.resolve_kafka` (Maven Central, cached). Every node gets its
own log dir, a PLAINTEXT port and a CONTROLLER port; the voter set is static
(`controller.quorum.voters`), and each log dir is formatted with the same cluster id, as
`kafka-storage.sh format` does for a new cluster. Session settings are the ones the cluster
benchmark compares at (`broker.session.timeout.ms`, the heartbeat), so that eos's
`zookeeper.session.timeout.ms` has a like-for-like peer. Every wait is bounded; `stop()`
ends every node and removes the temp dir (unless `keep_files`: then `remove_files()`),
whatever state the nodes are in.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bench.kafka import KafkaDist, KafkaUnavailable, TempFiles, free_port, port_accepts, stop_process

START_TIMEOUT_S = 120.0
HEAP = "-Xmx512m"


class KafkaCluster(TempFiles):
    def __init__(self, dist: KafkaDist, *, brokers: int = 3, base_dir: str | None = None,
                 session_timeout_ms: int = 6000, extra: dict | None = None):
        self.dist = dist
        self.count = brokers
        self.base_dir = base_dir
        self.session_timeout_ms = session_timeout_ms
        self.extra = dict(extra or {})
        self.tmp: Path | None = None
        self.ports: dict[int, int] = {}
        self.controller_ports: dict[int, int] = {}
        self.procs: dict[int, subprocess.Popen | None] = {}

    @property
    def node_ids(self) -> list[int]:
        return list(range(1, self.count + 1))

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.ports[n]}" for n in self.node_ids)

    def address(self, node: int) -> str:
        return f"127.0.0.1:{self.ports[node]}"

    def _properties(self, node: int) -> str:
        voters = ",".join(f"{n}@127.0.0.1:{self.controller_ports[n]}" for n in self.node_ids)
        replication = str(min(3, self.count))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.ports[node]},CONTROLLER://127.0.0.1:{self.controller_ports[node]}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.ports[node]}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dir(node)),
            "num.partitions": "1",
            "offsets.topic.replication.factor": replication,
            "transaction.state.log.replication.factor": replication,
            "transaction.state.log.min.isr": str(min(2, self.count)),
            "min.insync.replicas": str(min(2, self.count)),
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "broker.session.timeout.ms": str(self.session_timeout_ms),
            "broker.heartbeat.interval.ms": str(max(100, self.session_timeout_ms // 6)),
            **self.extra,
        }
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def log_dir(self, node: int) -> Path:
        return self.tmp / f"node-{node}" / "data"

    def _java(self, main: str, *args: str, heap: str = "-Xmx256m") -> list[str]:
        return ["java", heap, "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", self.dist.classpath,
                main, *args]

    def start(self) -> "KafkaCluster":
        self.tmp = Path(tempfile.mkdtemp(prefix="eos-bench-kafka-cluster-", dir=self.base_dir))
        try:
            used: set[int] = set()
            for node in self.node_ids:
                for table in (self.ports, self.controller_ports):
                    port = free_port()
                    while port in used:
                        port = free_port()
                    used.add(port)
                    table[node] = port
            uuid_run = subprocess.run(self._java("kafka.tools.StorageTool", "random-uuid"),
                                      capture_output=True, text=True, timeout=60)
            cluster_id = uuid_run.stdout.strip().splitlines()[-1] if uuid_run.stdout.strip() else ""
            if uuid_run.returncode != 0 or not cluster_id:
                raise KafkaUnavailable(f"kafka-storage random-uuid failed: {uuid_run.stderr[-2000:]}")
            for node in self.node_ids:
                (self.tmp / f"node-{node}").mkdir()
                self.log_dir(node).mkdir()
                config = self.tmp / f"node-{node}" / "server.properties"
                config.write_text(self._properties(node))
                formatted = subprocess.run(
                    self._java("kafka.tools.StorageTool", "format", "--config", str(config),
                               "--cluster-id", cluster_id), capture_output=True, text=True, timeout=120)
                if formatted.returncode != 0:
                    raise KafkaUnavailable(f"kafka-storage format failed: {(formatted.stdout + formatted.stderr)[-2000:]}")
            for node in self.node_ids:
                self._spawn(node)
            self.wait_ready(set(self.node_ids))
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, node: int) -> None:
        config = self.tmp / f"node-{node}" / "server.properties"
        with open(self.tmp / f"node-{node}" / "server.log", "ab") as log:
            self.procs[node] = subprocess.Popen(self._java("kafka.Kafka", str(config), heap=HEAP), stdout=log,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                cwd=self.tmp, start_new_session=True)

    def wait_ready(self, nodes: set[int], timeout_s: float = START_TIMEOUT_S) -> None:
        """Until the metadata lists `nodes` as brokers."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout_s
        live = [n for n in self.node_ids if self.procs.get(n) is not None and self.procs[n].poll() is None]
        while not all(port_accepts("127.0.0.1", self.ports[n]) for n in nodes):
            self._check_alive()
            if time.monotonic() > deadline:
                raise KafkaUnavailable(f"Kafka nodes {sorted(nodes)} did not open their ports")
            time.sleep(0.1)
        admin = AdminClient({"bootstrap.servers": ",".join(self.address(n) for n in live), "log_level": 0})
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                brokers = set(admin.list_topics(timeout=5).brokers)
                if nodes <= brokers:
                    return
            except Exception:
                pass
            time.sleep(0.1)
        raise KafkaUnavailable(f"the Kafka cluster did not list nodes {sorted(nodes)} in {timeout_s} s")

    def _check_alive(self) -> None:
        for node, proc in self.procs.items():
            if proc is not None and proc.poll() is not None and proc.returncode not in (0, -9, 137, 143, -15):
                raise KafkaUnavailable(f"Kafka node {node} exited with {proc.returncode}")

    def pid(self, node: int) -> int:
        return self.procs[node].pid

    def kill(self, node: int) -> None:
        proc = self.procs.get(node)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)

    def terminate(self, node: int, timeout_s: float = 120.0) -> int | None:
        proc = self.procs.get(node)
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill(node)
            return None

    def restart(self, node: int) -> None:
        self.kill(node)
        self._spawn(node)
        self.wait_ready({node})

    def stop(self, *, keep_files: bool = False) -> None:
        try:
            for node, proc in self.procs.items():
                if proc is not None:
                    stop_process(proc)
        finally:
            self.procs = {}
            if not keep_files:
                self.remove_files()

    def __enter__(self) -> "KafkaCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

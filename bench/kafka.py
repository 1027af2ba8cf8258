"""Apache Kafka as the peer: jars from Maven Central, one KRaft node on 127.0.0.1.

Theory of operation
-------------------
Nothing from Kafka is committed. `resolve_pinned_kafka()` fetches a pinned 4.4.0 with
`eos.maven` (no Maven needed: what tests use, and what "latest" falls back to without
`mvn`). `resolve_kafka()` writes a throwaway pom into the cache
directory (``$EOS_BENCH_CACHE`` or ``~/.cache/eos-bench``) that depends on
``org.apache.kafka:kafka_2.13:<version>`` plus an SLF4J binding, and lets Maven copy the
whole runtime classpath into ``kafka-<version>/libs``. A marker file says the copy finished,
so later runs reuse it without touching the network.

"latest" asks Maven's own version metadata (a version range makes it fetch
``maven-metadata.xml``) for the 4.x releases and takes the newest one whose dependencies
all resolve: a release can appear in the metadata before every module of it is on the
mirror. The chosen version is remembered in ``kafka-latest.txt``.

The Maven steps (`maven_pom`, `released_versions`, `copy_dependencies`) take any
artifact: the Spark workload resolves Spark's Kafka connector with them.

`KafkaBroker` is a context manager around one combined broker+controller process
(``process.roles=broker,controller``) with a static one-voter quorum. Start-up is the same
two steps as Kafka's scripts: ``kafka.tools.StorageTool format`` (what ``kafka-storage.sh
format`` runs) writes ``meta.properties`` and the bootstrap metadata into the log dir, then
``kafka.Kafka server.properties`` (what ``kafka-server-start.sh`` runs). Readiness is
bounded: the listener port must accept a connection and an AdminClient metadata call must
answer. Stopping sends SIGTERM, waits, then SIGKILL; the temp dir goes in every case.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

KAFKA_GROUP = "org.apache.kafka"
KAFKA_ARTIFACT = "kafka_2.13"
# Kafka 4.x logs through SLF4J 1.7; without a binding it logs nothing at all, which makes a
# broker that fails to start impossible to diagnose. slf4j-simple needs no config file.
SLF4J_VERSION = "1.7.36"
MAVEN_TIMEOUT_S = 600
HEAP = "-Xmx1g"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0


# The Kafka that tests and a machine without Maven use: its broker's runtime classpath (what
# `mvn dependency:copy-dependencies` resolved for kafka_2.13 4.4.0 plus slf4j-simple) and
# kafka-tools (DumpLogSegments), pinned, fetched by eos.maven without Maven.
PINNED_KAFKA_VERSION = "4.4.0"
PINNED_KAFKA_JARS: tuple[tuple[str, str, str], ...] = (
    ("org.hdrhistogram", "HdrHistogram", "2.2.2"),
    ("net.sourceforge.argparse4j", "argparse4j", "0.7.0"),
    ("com.github.ben-manes.caffeine", "caffeine", "3.2.0"),
    ("commons-beanutils", "commons-beanutils", "1.11.0"),
    ("commons-collections", "commons-collections", "3.2.2"),
    ("commons-digester", "commons-digester", "2.1"),
    ("commons-logging", "commons-logging", "1.3.5"),
    ("commons-validator", "commons-validator", "1.10.1"),
    ("com.dynatrace.hash4j", "hash4j", "0.22.0"),
    ("com.fasterxml.jackson.core", "jackson-annotations", "2.21"),
    ("com.fasterxml.jackson.core", "jackson-core", "2.21.7"),
    ("com.fasterxml.jackson.core", "jackson-databind", "2.21.7"),
    ("com.fasterxml.jackson.dataformat", "jackson-dataformat-yaml", "2.21.7"),
    ("com.fasterxml.jackson.datatype", "jackson-datatype-jdk8", "2.21.7"),
    ("net.sf.jopt-simple", "jopt-simple", "5.0.4"),
    ("org.bitbucket.b_c", "jose4j", "0.9.6"),
    ("org.jspecify", "jspecify", "1.0.0"),
    ("org.apache.kafka", "kafka-clients", PINNED_KAFKA_VERSION),
    ("org.apache.kafka", "kafka-coordinator-common", PINNED_KAFKA_VERSION),
    ("org.apache.kafka", "kafka-group-coordinator", PINNED_KAFKA_VERSION),
    ("org.apache.kafka", "kafka-group-coordinator-api", PINNED_KAFKA_VERSION),
    ("org.apache.kafka", "kafka-metadata", PINNED_KAFKA_VERSION),
    ("org.apache.kafka", "kafka-raft", PINNED_KAFKA_VERSION),
    ("org.apache.kafka", "kafka-server", PINNED_KAFKA_VERSION),
    ("org.apache.kafka", "kafka-server-common", PINNED_KAFKA_VERSION),
    ("org.apache.kafka", "kafka-share-coordinator", PINNED_KAFKA_VERSION),
    ("org.apache.kafka", "kafka-storage", PINNED_KAFKA_VERSION),
    ("org.apache.kafka", "kafka-storage-api", PINNED_KAFKA_VERSION),
    ("org.apache.kafka", "kafka-tools-api", PINNED_KAFKA_VERSION),
    ("org.apache.kafka", "kafka-transaction-coordinator", PINNED_KAFKA_VERSION),
    ("org.apache.kafka", "kafka_2.13", PINNED_KAFKA_VERSION),
    ("org.apache.logging.log4j", "log4j-api", "2.25.5"),
    ("org.apache.logging.log4j", "log4j-core", "2.25.5"),
    ("at.yawk.lz4", "lz4-java", "1.11.2"),
    ("com.yammer.metrics", "metrics-core", "2.2.0"),
    ("org.pcollections", "pcollections", "4.0.2"),
    ("com.google.re2j", "re2j", "1.8"),
    ("org.scala-lang", "scala-library", "2.13.18"),
    ("com.typesafe.scala-logging", "scala-logging_2.13", "3.9.6"),
    ("org.scala-lang", "scala-reflect", "2.13.18"),
    ("org.slf4j", "slf4j-api", "1.7.36"),
    ("org.slf4j", "slf4j-simple", "1.7.36"),
    ("org.yaml", "snakeyaml", "2.5"),
    ("org.xerial.snappy", "snappy-java", "1.1.10.7"),
    ("com.github.luben", "zstd-jni", "1.5.7-17"),
    ("org.apache.kafka", "kafka-tools", PINNED_KAFKA_VERSION),
)


class KafkaUnavailable(RuntimeError):
    """Kafka could not be resolved or started; the message says why."""


def cache_dir() -> Path:
    root = os.environ.get("EOS_BENCH_CACHE") or os.path.join(Path.home(), ".cache", "eos-bench")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def maven_pom(artifact_id: str, dependencies: list[tuple[str, str, str]],
              managed: list[tuple[str, str, str]] = ()) -> str:
    """A throwaway pom whose runtime classpath is `dependencies` ((group, artifact, version)
    each); `managed` pins the version of transitive dependencies (dependencyManagement)."""
    def entries(items) -> str:
        return "".join(f"""
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>
    </dependency>""" for group, artifact, version in items)

    management = (f"""
  <dependencyManagement>
    <dependencies>{entries(managed)}
    </dependencies>
  </dependencyManagement>""" if managed else "")
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- generated by bench/ at run time; throwaway, not committed -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>eos.bench</groupId>
  <artifactId>{artifact_id}</artifactId>
  <version>0</version>
  <packaging>pom</packaging>{management}
  <dependencies>{entries(dependencies)}
  </dependencies>
</project>
"""


def _pom(version: str) -> str:
    return maven_pom("kafka-runtime", [(KAFKA_GROUP, KAFKA_ARTIFACT, version),
                                       ("org.slf4j", "slf4j-simple", SLF4J_VERSION)])


def _run_maven(workdir: Path, goal_args: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            ["mvn", "-q", "-B", *goal_args],
            cwd=workdir, capture_output=True, text=True, timeout=MAVEN_TIMEOUT_S,
        )
    except FileNotFoundError as exc:
        raise KafkaUnavailable("mvn is not installed (apt-get install maven)") from exc
    except subprocess.TimeoutExpired as exc:
        raise KafkaUnavailable(f"mvn took longer than {MAVEN_TIMEOUT_S} s in {workdir}") from exc


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def released_versions(group: str, artifact: str, major: int = 4) -> list[str]:
    """Release versions `major`.x.y of group:artifact per Maven's metadata, newest first."""
    probe = cache_dir() / f"{artifact}-probe"
    probe.mkdir(exist_ok=True)
    (probe / "pom.xml").write_text(
        maven_pom("probe", [(group, artifact, f"[{major}.0.0,{major + 1}.0.0)")]))
    # Resolving a range makes Maven download maven-metadata.xml; whether the newest
    # version then resolves completely does not matter here.
    _run_maven(probe, ["dependency:resolve", f"-DincludeArtifactIds={artifact}"])
    local_repo = Path.home() / ".m2" / "repository" / Path(*group.split(".")) / artifact
    versions: set[str] = set()
    for meta in local_repo.glob("maven-metadata*.xml"):
        try:
            tree = ET.parse(meta)
        except ET.ParseError:
            continue
        for node in tree.iter("version"):
            text = (node.text or "").strip()
            if re.fullmatch(rf"{major}\.\d+\.\d+", text):
                versions.add(text)
    return sorted(versions, key=_version_key, reverse=True)


def _released_4x_versions() -> list[str]:
    """4.x release versions of kafka_2.13 per Maven's metadata, newest first."""
    return released_versions(KAFKA_GROUP, KAFKA_ARTIFACT)


def copy_dependencies(home: Path, pom: str, expect_glob: str) -> Path | None:
    """Let Maven copy the runtime classpath of `pom` into home/libs, once: a marker file
    says the copy finished. None (and home/maven.log) if Maven cannot, or if no jar in
    libs matches `expect_glob`."""
    libs = home / "libs"
    done = home / ".complete"
    if done.exists():
        return libs
    home.mkdir(parents=True, exist_ok=True)
    if libs.exists():
        shutil.rmtree(libs)
    (home / "pom.xml").write_text(pom)
    result = _run_maven(home, ["dependency:copy-dependencies", f"-DoutputDirectory={libs}"])
    if result.returncode != 0 or not any(libs.glob(expect_glob)):
        (home / "maven.log").write_text(result.stdout + result.stderr)
        return None
    done.write_text(pom)
    return libs


def _copy_runtime(version: str) -> Path | None:
    """Resolve one version's classpath into the cache; None if Maven cannot."""
    return copy_dependencies(cache_dir() / f"kafka-{version}", _pom(version),
                             f"{KAFKA_ARTIFACT}-*.jar")


@dataclass(frozen=True)
class KafkaDist:
    version: str
    libs: Path

    @property
    def classpath(self) -> str:
        return str(self.libs / "*")


def resolve_pinned_kafka(progress=None) -> KafkaDist:
    """Kafka PINNED_KAFKA_VERSION's jars, downloaded without Maven on first use."""
    from eos import maven
    try:
        home = maven.fetch_jars(maven.cache_root() / f"kafka-{PINNED_KAFKA_VERSION}", PINNED_KAFKA_JARS,
                                marker_text=PINNED_KAFKA_VERSION, progress=progress)
    except maven.JarsUnavailable as exc:
        raise KafkaUnavailable(str(exc)) from None
    return KafkaDist(PINNED_KAFKA_VERSION, home)


def resolve_kafka(version: str = "latest", refresh: bool = False) -> KafkaDist:
    """Jars for Kafka `version` ("latest" = newest 4.x that resolves), cached. Without
    Maven on the machine, "latest" is the pinned version, fetched without it."""
    if version == "latest" and shutil.which("mvn") is None:
        return resolve_pinned_kafka()
    if version != "latest":
        libs = _copy_runtime(version)
        if libs is None:
            raise KafkaUnavailable(
                f"Maven could not resolve {KAFKA_GROUP}:{KAFKA_ARTIFACT}:{version}; "
                f"see {cache_dir() / f'kafka-{version}' / 'maven.log'}")
        return KafkaDist(version, libs)
    remembered = cache_dir() / "kafka-latest.txt"
    if remembered.exists() and not refresh:
        known = remembered.read_text().strip()
        if (cache_dir() / f"kafka-{known}" / ".complete").exists():
            return KafkaDist(known, cache_dir() / f"kafka-{known}" / "libs")
    candidates = _released_4x_versions()
    if not candidates:
        raise KafkaUnavailable("Maven metadata lists no 4.x release of kafka_2.13 "
                               "(is Maven Central reachable?)")
    tried = []
    for candidate in candidates[:4]:
        tried.append(candidate)
        libs = _copy_runtime(candidate)
        if libs is not None:
            remembered.write_text(candidate + "\n")
            return KafkaDist(candidate, libs)
    raise KafkaUnavailable(f"none of Kafka {', '.join(tried)} resolved from Maven Central")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_accepts(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_until(condition, what: str, timeout_s: float, interval_s: float = 0.05):
    """`condition()`'s first truthy value, asked every `interval_s`; TimeoutError after
    `timeout_s` (the bench's one bounded wait)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


class TempFiles:
    """A server's temp dir (`self.tmp`), removed by `remove_files()`: at stop, or once a
    benchmark has run every system (a mass removal slows the next one's file creation:
    bench/README, "Files kept to the end, a session's waiter, the metadata index")."""

    tmp: Path | None = None

    def remove_files(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


def stop_process(proc: subprocess.Popen, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
    """SIGTERM, a bounded wait, then SIGKILL. Returns the exit code."""
    if proc.poll() is not None:
        return proc.returncode
    try:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(timeout=10)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class KafkaSsl(NamedTuple):
    """PEM files of an SSL listener: the server's certificate and key, the CA clients chain to."""
    certificate_path: Path
    key_path: Path
    ca_path: Path
    client_auth: str = "none"          # Kafka's ssl.client.auth: none | required


class KafkaBroker(TempFiles):
    """One Kafka 4.x node in KRaft mode (broker + controller) on free 127.0.0.1 ports.

    with KafkaBroker(dist) as kafka:
        kafka.bootstrap      # "127.0.0.1:PORT"
        kafka.log_dir        # where partitions live, for on-disk byte counts
    """

    def __init__(self, dist: KafkaDist, *, heap: str = HEAP, base_dir: str | None = None,
                 start_timeout_s: float = START_TIMEOUT_S, ssl: "KafkaSsl | None" = None):
        self.dist = dist
        self.heap = heap
        self.base_dir = base_dir
        self.start_timeout_s = start_timeout_s
        self.ssl = ssl                     # an SSL listener beside PLAINTEXT (bench/tls.py)
        self.proc: subprocess.Popen | None = None
        self.tmp: Path | None = None
        self.port = 0
        self.controller_port = 0
        self.ssl_port = 0

    @property
    def ssl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.ssl_port}"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_dir(self) -> Path:
        if self.tmp is None:
            raise KafkaUnavailable("the broker is not started")
        return self.tmp / "data"

    @property
    def server_log(self) -> Path:
        if self.tmp is None:
            raise KafkaUnavailable("the broker is not started")
        return self.tmp / "server.log"

    def _properties(self) -> str:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            # A static one-voter quorum: format needs no --standalone/--initial-controllers.
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
                         f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "50",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
        }
        if self.ssl is not None:
            # PEM stores (KIP-651): the key (PKCS#8, unencrypted) and its certificate in one file.
            keystore = self.tmp / "server-keystore.pem"
            keystore.write_bytes(self.ssl.key_path.read_bytes() + self.ssl.certificate_path.read_bytes())
            props.update({
                "listeners": props["listeners"] + f",SSL://127.0.0.1:{self.ssl_port}",
                "advertised.listeners": props["advertised.listeners"] + f",SSL://127.0.0.1:{self.ssl_port}",
                "listener.security.protocol.map": props["listener.security.protocol.map"] + ",SSL:SSL",
                "ssl.keystore.type": "PEM", "ssl.keystore.location": str(keystore),
                "ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.ssl.ca_path),
                "ssl.client.auth": self.ssl.client_auth,
            })
        return "".join(f"{key}={value}\n" for key, value in props.items())

    def _java(self, main: str, *args: str, heap: str = "-Xmx256m") -> list[str]:
        return ["java", heap, "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-cp", self.dist.classpath, main, *args]

    def start(self) -> "KafkaBroker":
        self.tmp = Path(tempfile.mkdtemp(prefix="eos-bench-kafka-", dir=self.base_dir))
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.port, self.controller_port = free_port(), free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        if self.ssl is not None:
            self.ssl_port = free_port()
            while self.ssl_port in (self.port, self.controller_port):
                self.ssl_port = free_port()
        self.log_dir.mkdir()
        config = self.tmp / "server.properties"
        config.write_text(self._properties())
        cluster_id = subprocess.run(
            self._java("kafka.tools.StorageTool", "random-uuid"),
            capture_output=True, text=True, timeout=60)
        uuid = cluster_id.stdout.strip().splitlines()[-1] if cluster_id.stdout.strip() else ""
        if cluster_id.returncode != 0 or not uuid:
            raise KafkaUnavailable(f"kafka-storage random-uuid failed: {cluster_id.stderr[-2000:]}")
        formatted = subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "--config", str(config),
                       "--cluster-id", uuid),
            capture_output=True, text=True, timeout=120)
        if formatted.returncode != 0:
            raise KafkaUnavailable(f"kafka-storage format failed: "
                                   f"{(formatted.stdout + formatted.stderr)[-2000:]}")
        with open(self.server_log, "wb") as log:
            self.proc = subprocess.Popen(
                self._java("kafka.Kafka", str(config), heap=self.heap),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.tmp, start_new_session=True)
        self._wait_ready()

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + self.start_timeout_s
        while not port_accepts("127.0.0.1", self.port):
            self.check_alive()
            if time.monotonic() > deadline:
                raise KafkaUnavailable(f"Kafka did not open port {self.port} within "
                                       f"{self.start_timeout_s:.0f} s:\n{_tail(self.server_log)}")
            time.sleep(0.2)
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                metadata = admin.list_topics(timeout=5)
                if metadata.brokers:
                    return
            except Exception as exc:  # KafkaException while the broker comes up
                last_error = exc
            time.sleep(0.2)
        raise KafkaUnavailable(f"Kafka answered no metadata request within "
                               f"{self.start_timeout_s:.0f} s ({last_error}):\n"
                               f"{_tail(self.server_log)}")

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise KafkaUnavailable(f"Kafka exited with code {self.proc.returncode}:\n"
                                   f"{_tail(self.server_log)}")

    def stop(self, *, keep_files: bool = False) -> None:
        """SIGTERM (a clean shutdown, which flushes and closes every log), SIGKILL after a
        bound; the temp dir is removed unless `keep_files` (then `remove_files()` later)."""
        try:
            if self.proc is not None:
                stop_process(self.proc)
        finally:
            self.proc = None
            if not keep_files:
                self.remove_files()

    def __enter__(self) -> "KafkaBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

"""Apache ZooKeeper for eos clusters: its jars from Maven Central, run with the local Java.

Theory of operation
-------------------
Nothing from ZooKeeper is committed. `resolve_zookeeper()` fetches the server's runtime
jars (the list below: ZooKeeper 3.9.3 and what its pom needs at run time, pinned) with
`eos.maven.fetch_jars` (Maven Central over HTTPS, each checked against its published SHA-1,
no Maven needed) into ``$EOS_CACHE/zookeeper-<version>/`` (default ``~/.cache/eos``).

`ZooKeeperServer` runs one standalone server (`ZooKeeperServerMain`) on 127.0.0.1 with a
`zoo.cfg` in its data dir: a 500 ms tick, so sessions may be as short as 1 s (Kafka's tests
use 6 s), the admin server off, the `ruok`/`srvr`/`stat`/`mntr` four-letter words on.
Readiness is bounded: `srvr` must name the server's mode (`ruok` answers imok before the
database is loaded, even when loading fails); a server that exits while starting fails
with the tail of its log. `stop()` is SIGTERM then SIGKILL after a bound; `kill()` is
SIGKILL (tests restart ZooKeeper); `start()` again on the same data dir keeps the data.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from eos import maven

ZOOKEEPER_VERSION = "3.9.3"
# The server's runtime classpath, from zookeeper-3.9.3.pom and its parent (compile and
# runtime scopes; Jetty, Jackson and jline are "provided" and only serve the admin server and
# the CLI, which eos does not use).
_NETTY = "4.1.113.Final"
RUNTIME_JARS: tuple[tuple[str, str, str], ...] = (
    ("org.apache.zookeeper", "zookeeper", ZOOKEEPER_VERSION),
    ("org.apache.zookeeper", "zookeeper-jute", ZOOKEEPER_VERSION),
    ("org.apache.yetus", "audience-annotations", "0.12.0"),
    ("io.netty", "netty-handler", _NETTY),
    ("io.netty", "netty-common", _NETTY),
    ("io.netty", "netty-buffer", _NETTY),
    ("io.netty", "netty-transport", _NETTY),
    ("io.netty", "netty-resolver", _NETTY),
    ("io.netty", "netty-codec", _NETTY),
    ("io.netty", "netty-transport-native-unix-common", _NETTY),
    ("io.netty", "netty-transport-classes-epoll", _NETTY),
    ("org.slf4j", "slf4j-api", "1.7.30"),
    ("ch.qos.logback", "logback-classic", "1.2.13"),
    ("ch.qos.logback", "logback-core", "1.2.13"),
    ("commons-io", "commons-io", "2.17.0"),
    # "provided" in the pom, but the server's default metrics provider loads it at start
    ("io.dropwizard.metrics", "metrics-core", "4.1.12.1"),
    # likewise: snapshot file names go through its stream classes
    ("org.xerial.snappy", "snappy-java", "1.1.10.5"),
)
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
HEAP = "-Xmx256m"
_LOGBACK_XML = """<configuration>
  <appender name="OUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{ISO8601} %-5level [%thread] %logger{36}: %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="OUT"/></root>
</configuration>
"""


class ZooKeeperUnavailable(RuntimeError):
    """ZooKeeper could not be fetched or started; the message says why."""


def resolve_zookeeper(progress=None) -> Path:
    """The directory holding ZooKeeper's runtime jars, downloading them on first use.
    `progress(index, total, name)` is called before each download."""
    try:
        return maven.fetch_jars(maven.cache_root() / f"zookeeper-{ZOOKEEPER_VERSION}", RUNTIME_JARS,
                                marker_text=ZOOKEEPER_VERSION, progress=progress,
                                extra_files={"logback.xml": _LOGBACK_XML})
    except maven.JarsUnavailable as exc:
        raise ZooKeeperUnavailable(str(exc)) from None


def four_letter_word(host: str, port: int, word: str, timeout_s: float = 2.0) -> str:
    """Send a four-letter command; the answer, or '' when the server does not answer."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(word.encode("ascii"))
            chunks = []
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return ""


class ZooKeeperServer:
    """One standalone ZooKeeper on 127.0.0.1:`port` with its data under `data_dir`."""

    def __init__(self, data_dir: str | os.PathLike, port: int = 2181, *, tick_time_ms: int = 500,
                 max_session_timeout_ms: int = 60_000, heap: str = HEAP):
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.tick_time_ms = tick_time_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.heap = heap
        self.process: subprocess.Popen | None = None

    @property
    def connect_string(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "zookeeper.log"

    def _write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "data").mkdir(exist_ok=True)
        config = self.data_dir / "zoo.cfg"
        config.write_text("\n".join([
            f"tickTime={self.tick_time_ms}",
            f"dataDir={self.data_dir / 'data'}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            f"minSessionTimeout={2 * self.tick_time_ms}",
            f"maxSessionTimeout={self.max_session_timeout_ms}",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,stat,mntr",
            "",
        ]))
        return config

    def start(self, progress=None) -> "ZooKeeperServer":
        if self.process is not None and self.process.poll() is None:
            raise ZooKeeperUnavailable(f"ZooKeeper on port {self.port} is already running")
        home = resolve_zookeeper(progress)
        config = self._write_config()
        classpath = os.pathsep.join(str(p) for p in sorted(home.glob("*.jar")))
        args = ["java", self.heap, f"-Dlogback.configurationFile={home / 'logback.xml'}",
                "-Dzookeeper.admin.enableServer=false", "-cp", classpath,
                "org.apache.zookeeper.server.ZooKeeperServerMain", str(config)]
        with open(self.log_path, "ab") as log:
            try:
                self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)
            except FileNotFoundError:
                raise ZooKeeperUnavailable("java is not installed (ZooKeeper needs Java 17)") from None
        return self

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            # `ruok` answers imok as soon as the port is open, even while the database has not
            # loaded (or failed to); `srvr` names the mode only once the server serves.
            if "Mode:" in four_letter_word("127.0.0.1", self.port, "srvr"):
                return
            if self.process is not None and self.process.poll() is not None:
                raise ZooKeeperUnavailable(
                    f"ZooKeeper exited with code {self.process.returncode}:\n{self._tail()}")
            time.sleep(0.1)
        raise ZooKeeperUnavailable(f"ZooKeeper was not serving within {timeout_s} s:\n{self._tail()}")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout_s)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(STOP_TIMEOUT_S)

    def restart(self) -> None:
        self.stop()
        self.start()
        self.wait_ready()

    def _tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> "ZooKeeperServer":
        self.start()
        self.wait_ready()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def run_zookeeper(data_dir: str, port: int = 2181) -> int:
    """`eos zookeeper start`: fetch (with progress on stderr), start, print the listening
    line, stay in the foreground until SIGTERM/SIGINT, then stop the server."""
    import threading

    def show(index: int, total: int, name: str) -> None:
        print(f"fetching ZooKeeper {ZOOKEEPER_VERSION} jars from Maven Central: {index}/{total} {name}",
              file=sys.stderr, flush=True)

    stop_requested = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop_requested.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    server = ZooKeeperServer(data_dir, port)
    try:
        server.start(progress=show)
        server.wait_ready()
        print(f"eos zookeeper listening on {server.connect_string} (data dir {server.data_dir})", flush=True)
        while not stop_requested.wait(0.5):
            if server.process is None or server.process.poll() is not None:
                print(f"ZooKeeper exited; see {server.log_path}", file=sys.stderr, flush=True)
                return 1
    except ZooKeeperUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0

"""The cluster's metadata in ZooKeeper, in Kafka's ZooKeeper-mode layout (kazoo).

Theory of operation
-------------------
`ZkStore` reads and writes the znodes a Kafka cluster in ZooKeeper mode keeps, with Kafka's
paths and JSON, so an operator who knows Kafka's layout reads eos's:

    /cluster/id                                   {"version":"1","id":...}
    /brokers/ids/<id>              (ephemeral)    {"version":5,"host","port","rack","endpoints",
                                                   "listener_security_protocol_map",...}
    /controller                    (ephemeral)    {"version":1,"brokerid":N,"timestamp":...}
    /controller_epoch                             "N"  (bumped by compare-and-set)
    /brokers/topics/<t>                           {"version":2,"partitions":{"0":[1,2]},"adding_replicas","removing_replicas"}
    /brokers/topics/<t>/partitions/<p>/state      {"controller_epoch","leader","version":1,"leader_epoch","isr"}
    /config/topics/<t>                            {"version":1,"config":{...}}
    /config/changes/config_change_N  (sequential) {"version":2,"entity_path":"topics/<t>"}
    /admin/delete_topics/<t>, /admin/reassign_partitions, /admin/preferred_replica_election
    /isr_change_notification/isr_change_N (sequential) {"version":1,"partitions":[...]}

It holds no policy: the controller decides, this class does the I/O. The JSON codecs are
pure functions (tested without ZooKeeper). Writes by the controller are fenced: each goes
in one ZooKeeper transaction with a check of /controller_epoch's version, so a controller
whose epoch was superseded changes nothing and gets ControllerMoved (NOT_CONTROLLER). A
leader's own ISR change is checked only against the state znode's version (Kafka's leader
wrote ISR changes itself in ZooKeeper mode).

Watches are kazoo's one-shot watches: a callback runs once, on kazoo's thread, and the
caller must only enqueue work there and read again with a new watch. Sessions: kazoo
reconnects by itself; when a session expires the ephemeral znodes go with it, so the store
remembers this broker's registration and writes it again when a new session starts (on a
thread of its own, not kazoo's), then tells the session listeners "connected".
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from broker.metadata.types import BrokerInfo as BrokerRegistration
from broker.metadata.types import ListenerEndpoint, format_host_port
from broker.metadata.types import LeaderIsr
from eos.errors import EosError, ErrorCode, TopicAlreadyExistsError, UnknownTopicOrPartitionError

log = logging.getLogger("eos.zookeeper")

CONFIG_CAS_ATTEMPTS = 20     # a config change that keeps losing to other writers gives up

TP = tuple[str, int]
CLUSTER_ID_PATH = "/cluster/id"
BROKER_IDS_PATH = "/brokers/ids"
TOPICS_PATH = "/brokers/topics"
CONTROLLER_PATH = "/controller"
CONTROLLER_EPOCH_PATH = "/controller_epoch"
CONFIG_TOPICS_PATH = "/config/topics"
CONFIG_CHANGES_PATH = "/config/changes"
DELETE_TOPICS_PATH = "/admin/delete_topics"
REASSIGN_PATH = "/admin/reassign_partitions"
PREFERRED_ELECTION_PATH = "/admin/preferred_replica_election"
ISR_CHANGE_PATH = "/isr_change_notification"
ISR_CHANGE_PREFIX = "isr_change_"
CONFIG_CHANGE_PREFIX = "config_change_"
PERSISTENT_PATHS = ("/brokers/ids", "/brokers/topics", "/brokers/seqid", "/config/topics", "/config/changes",
                    "/config/brokers", "/config/users", "/config/clients", "/admin/delete_topics",
                    "/isr_change_notification", "/cluster",
                    # ACLs (broker/zk_acls.py): literal, prefixed, and their change notifications
                    "/kafka-acl", "/kafka-acl-extended/prefixed", "/kafka-acl-changes", "/kafka-acl-extended-changes")
WRITE_BATCH_OPS = 500
START_TIMEOUT_S = 15.0


class ControllerMoved(EosError):
    """A controller write was fenced: another controller took over (its epoch is newer)."""

    code = ErrorCode.NOT_CONTROLLER


class StateVersionConflict(EosError):
    """A partition state changed since it was read (its znode version moved)."""

    code = ErrorCode.NOT_CONTROLLER


class BrokerIdInUse(EosError):
    code = ErrorCode.INVALID_CONFIG


@dataclass(frozen=True)
class TopicAssignment:
    partitions: dict[int, tuple[int, ...]]
    adding: dict[int, tuple[int, ...]] = field(default_factory=dict)
    removing: dict[int, tuple[int, ...]] = field(default_factory=dict)


# ---- codecs (pure) -------------------------------------------------------------------------------

def _dumps(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


def _loads(data: bytes):
    return json.loads(data.decode("utf-8"))


def encode_broker(reg: BrokerRegistration, timestamp_ms: int) -> bytes:
    endpoints = reg.endpoints or (ListenerEndpoint("PLAINTEXT", "PLAINTEXT", reg.host, reg.port),)
    return _dumps({"features": {}, "listener_security_protocol_map": {e.name: e.security_protocol for e in endpoints},
                   "endpoints": [f"{e.name}://{format_host_port(e.host, e.port)}" for e in endpoints], "jmx_port": -1,
                   "port": reg.port, "host": reg.host, "version": 5, "timestamp": str(timestamp_ms),
                   "rack": reg.rack, **({"eos_socket_port": reg.socket_port} if reg.socket_port else {})})


def decode_broker(broker_id: int, data: bytes, epoch: int) -> BrokerRegistration:
    value = _loads(data)
    protocols = value.get("listener_security_protocol_map") or {}
    endpoints = []
    for text in value.get("endpoints") or ():
        name, _, address = str(text).partition("://")
        host, _, port = address.rpartition(":")
        endpoints.append(ListenerEndpoint(name, protocols.get(name, name), host.strip("[]"), int(port)))
    # eos_socket_port: eos's own field (Kafka's readers ignore fields they do not know)
    return BrokerRegistration(broker_id, value["host"], int(value["port"]), value.get("rack"), epoch,
                              tuple(endpoints), int(value.get("eos_socket_port") or 0))


def encode_config(config) -> bytes:
    """A /config/<type>/<name> znode (topics, users, clients): {"version":1,"config":{...}}."""
    return _dumps({"version": 1, "config": dict(sorted(config.items()))})


def decode_config(data: bytes) -> dict[str, str]:
    return {str(k): str(v) for k, v in (_loads(data) if data else {}).get("config", {}).items()}


def config_change(entity_path: str) -> bytes:
    """A /config/changes notification naming the entity that changed ("topics/t", "users/alice")."""
    return _dumps({"version": 2, "entity_path": entity_path})


def encode_leader_isr(state: LeaderIsr) -> bytes:
    return _dumps({"controller_epoch": state.controller_epoch, "leader": state.leader, "version": 1,
                   "leader_epoch": state.leader_epoch, "isr": list(state.isr)})


def decode_leader_isr(data: bytes) -> LeaderIsr:
    value = _loads(data)
    return LeaderIsr(int(value["leader"]), int(value["leader_epoch"]), tuple(int(b) for b in value["isr"]),
                     int(value["controller_epoch"]))


def encode_assignment(assignment: TopicAssignment) -> bytes:
    def as_json(mapping):
        return {str(p): list(r) for p, r in sorted(mapping.items())}
    return _dumps({"version": 2, "partitions": as_json(assignment.partitions),
                   "adding_replicas": as_json(assignment.adding), "removing_replicas": as_json(assignment.removing)})


def decode_assignment(data: bytes) -> TopicAssignment:
    value = _loads(data)

    def from_json(mapping):
        return {int(p): tuple(int(b) for b in r) for p, r in (mapping or {}).items()}
    return TopicAssignment(from_json(value["partitions"]), from_json(value.get("adding_replicas")),
                           from_json(value.get("removing_replicas")))


def encode_partitions_list(partitions: Iterable[TP], **extra) -> bytes:
    return _dumps({"version": 1, "partitions": [{"topic": t, "partition": p} for t, p in sorted(partitions)],
                   **extra})


def decode_partitions_list(data: bytes) -> list[TP]:
    return [(str(e["topic"]), int(e["partition"])) for e in _loads(data).get("partitions", [])]


def encode_reassignment(plan: dict[TP, tuple[int, ...]]) -> bytes:
    return _dumps({"version": 1, "partitions": [{"topic": t, "partition": p, "replicas": list(r)}
                                                 for (t, p), r in sorted(plan.items())]})


def decode_reassignment(data: bytes) -> dict[TP, tuple[int, ...]]:
    return {(str(e["topic"]), int(e["partition"])): tuple(int(b) for b in e["replicas"])
            for e in _loads(data).get("partitions", [])}


def state_path(topic: str, partition: int) -> str:
    return f"{TOPICS_PATH}/{topic}/partitions/{partition}/state"


# ---- the store --------------------------------------------------------------------------------------

class ZkStore:
    """See the module doc. Synchronous; safe to call from several threads."""

    def __init__(self, connect: str, *, session_timeout_ms: int = 18_000, connection_timeout_ms: int = 10_000):
        from kazoo.client import KazooClient
        from kazoo.retry import KazooRetry

        self.connect = connect
        self.session_timeout_ms = session_timeout_ms
        self._connection_timeout_s = connection_timeout_ms / 1000.0
        self.client = KazooClient(
            hosts=connect, timeout=session_timeout_ms / 1000.0,
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0),
            command_retry=KazooRetry(max_tries=5, delay=0.1, max_delay=1.0, deadline=30.0))
        self._listeners: list[Callable[[str], None]] = []
        self._registration: BrokerRegistration | None = None
        self._lost = False
        self._closed = False
        self._reregister = threading.Event()
        self._session_thread: threading.Thread | None = None

    # ---- session --------------------------------------------------------------------------

    def start(self) -> None:
        from kazoo.handlers.threading import KazooTimeoutError

        try:
            self.client.start(timeout=max(self._connection_timeout_s, START_TIMEOUT_S))
        except KazooTimeoutError:
            self.client.stop()
            self.client.close()
            raise EosError(f"cannot connect to ZooKeeper at {self.connect} within "
                           f"{max(self._connection_timeout_s, START_TIMEOUT_S):.0f} s",
                           ErrorCode.BROKER_NOT_AVAILABLE) from None
        self.client.add_listener(self._on_state)
        self._session_thread = threading.Thread(target=self._session_loop, name="eos-zk-session", daemon=True)
        self._session_thread.start()

    def close(self) -> None:
        """End the session (its ephemeral znodes go with it); once: later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        self._reregister.set()
        try:
            self.client.stop()
            self.client.close()
        except Exception as exc:   # closing must not raise over a broken connection
            log.info("closing the ZooKeeper client: %s", exc)

    def add_session_listener(self, fn: Callable[[str], None]) -> None:
        self._listeners.append(fn)

    def _on_state(self, state) -> None:
        # kazoo's thread: only note and hand over
        from kazoo.protocol.states import KazooState

        if state == KazooState.LOST:
            self._lost = True
            self._notify("lost")
        elif state == KazooState.SUSPENDED:
            self._notify("suspended")
        elif state == KazooState.CONNECTED and self._lost:
            self._lost = False
            self._reregister.set()

    def _session_loop(self) -> None:
        while not self._closed:
            self._reregister.wait()
            self._reregister.clear()
            if self._closed:
                return
            for attempt in range(1, 100):
                try:
                    if self._registration is not None:
                        self._create_registration(self._registration)
                    break
                except Exception as exc:
                    log.warning("re-registering after a new ZooKeeper session failed (attempt %d): %s", attempt, exc)
                    time.sleep(min(1.0, 0.1 * attempt))
            log.info("new ZooKeeper session; registration restored")
            self._notify("connected")

    def _notify(self, state: str) -> None:
        for fn in list(self._listeners):
            try:
                fn(state)
            except Exception:
                log.exception("ZooKeeper session listener failed")

    def ensure_paths(self) -> None:
        for path in PERSISTENT_PATHS:
            self.client.ensure_path(path)

    def get_or_create_cluster_id(self, proposed: str) -> str:
        from kazoo.exceptions import NodeExistsError

        try:
            self.client.create(CLUSTER_ID_PATH, _dumps({"version": "1", "id": proposed}), makepath=True)
            return proposed
        except NodeExistsError:
            data, _ = self.client.get(CLUSTER_ID_PATH)
            return str(_loads(data)["id"])

    # ---- brokers --------------------------------------------------------------------------

    def register_broker(self, reg: BrokerRegistration) -> int:
        """Create /brokers/ids/<id> (ephemeral); the broker epoch (its czxid)."""
        epoch = self._create_registration(reg)
        self._registration = reg
        return epoch

    def _create_registration(self, reg: BrokerRegistration) -> int:
        from kazoo.exceptions import NodeExistsError, NoNodeError

        path = f"{BROKER_IDS_PATH}/{reg.broker_id}"
        data = encode_broker(reg, int(time.time() * 1000))
        deadline = time.monotonic() + self.session_timeout_ms / 1000.0 + 5
        while True:
            try:
                self.client.create(path, data, ephemeral=True, makepath=True)
                _, stat = self.client.get(path)
                return stat.czxid
            except NodeExistsError:
                try:
                    _, stat = self.client.get(path)
                except NoNodeError:
                    continue      # the old session expired just now: create it again at once
                if stat.ephemeralOwner == self.client.client_id[0]:
                    return stat.czxid     # ours already (a retried create)
                # An old session of this broker may still hold it until it expires
                # (Kafka waits the same way); anyone else holding it past that is a clash.
                if time.monotonic() > deadline:
                    raise BrokerIdInUse(f"broker id {reg.broker_id} is already registered in ZooKeeper "
                                        f"by another live broker") from None
                time.sleep(0.5)

    def live_brokers(self, watch: Callable | None = None) -> dict[int, BrokerRegistration]:
        from kazoo.exceptions import NoNodeError

        children = self.client.get_children(BROKER_IDS_PATH, watch=watch)
        brokers = {}
        for child in children:
            try:
                data, stat = self.client.get(f"{BROKER_IDS_PATH}/{child}")
            except NoNodeError:
                continue   # gone between the listing and the read
            brokers[int(child)] = decode_broker(int(child), data, stat.czxid)
        return brokers

    # ---- controller -----------------------------------------------------------------------

    def controller_id(self, watch: Callable | None = None) -> int | None:
        stat = self.client.exists(CONTROLLER_PATH, watch=watch)
        if stat is None:
            return None
        from kazoo.exceptions import NoNodeError
        try:
            data, _ = self.client.get(CONTROLLER_PATH)
        except NoNodeError:
            return None
        return int(_loads(data)["brokerid"])

    def controller_epoch(self) -> tuple[int, int]:
        from kazoo.exceptions import NoNodeError
        try:
            data, stat = self.client.get(CONTROLLER_EPOCH_PATH)
        except NoNodeError:
            return 0, -1
        return int(data.decode("ascii")), stat.version

    def try_become_controller(self, broker_id: int) -> tuple[int, int] | None:
        """Create /controller; if won, bump /controller_epoch by compare-and-set and return
        (epoch, its znode version). None when someone else is (or just became) controller."""
        from kazoo.exceptions import BadVersionError, NodeExistsError

        try:
            self.client.create(CONTROLLER_PATH, _dumps({"version": 1, "brokerid": broker_id,
                                                        "timestamp": str(int(time.time() * 1000))}), ephemeral=True)
        except NodeExistsError:
            return None
        epoch, version = self.controller_epoch()
        try:
            if version < 0:
                self.client.create(CONTROLLER_EPOCH_PATH, b"1")
                return 1, 0
            stat = self.client.set(CONTROLLER_EPOCH_PATH, str(epoch + 1).encode("ascii"), version=version)
            return epoch + 1, stat.version
        except (BadVersionError, NodeExistsError):
            self.resign_controller(broker_id)
            return None

    def resign_controller(self, broker_id: int) -> None:
        from kazoo.exceptions import NoNodeError
        try:
            data, stat = self.client.get(CONTROLLER_PATH)
            if int(_loads(data)["brokerid"]) == broker_id:
                self.client.delete(CONTROLLER_PATH, version=stat.version)
        except NoNodeError:
            pass

    def _fenced(self, epoch_zk_version: int, ops: Callable) -> list:
        """Run `ops(transaction)` in one transaction with the controller-epoch check."""
        from kazoo.exceptions import BadVersionError, NoNodeError, RolledBackError

        transaction = self.client.transaction()
        transaction.check(CONTROLLER_EPOCH_PATH, epoch_zk_version)
        ops(transaction)
        results = transaction.commit()
        if results and isinstance(results[0], (BadVersionError, NoNodeError)):
            raise ControllerMoved(f"the controller epoch moved past version {epoch_zk_version}: "
                                  "another controller took over")
        for result in results[1:]:
            if isinstance(result, Exception) and not isinstance(result, RolledBackError):
                raise result
        return results[1:]

    # ---- topics ---------------------------------------------------------------------------

    def topics(self, watch: Callable | None = None) -> list[str]:
        return sorted(self.client.get_children(TOPICS_PATH, watch=watch))

    def create_topic(self, topic: str, assignment: dict[int, tuple[int, ...]], config: dict[str, str]) -> None:
        from kazoo.exceptions import NodeExistsError

        transaction = self.client.transaction()
        config_path = f"{CONFIG_TOPICS_PATH}/{topic}"
        if self.client.exists(config_path) is None:
            transaction.create(config_path, _dumps({"version": 1, "config": dict(config)}))
        else:
            transaction.set_data(config_path, _dumps({"version": 1, "config": dict(config)}))
        transaction.create(f"{TOPICS_PATH}/{topic}", encode_assignment(TopicAssignment(dict(assignment))))
        results = transaction.commit()
        if any(isinstance(r, NodeExistsError) for r in results):
            raise TopicAlreadyExistsError(f"topic {topic!r} already exists")
        for result in results:
            if isinstance(result, Exception) and type(result).__name__ != "RolledBackError":
                raise result

    def topic_assignment(self, topic: str, watch: Callable | None = None) -> tuple[TopicAssignment, int] | None:
        from kazoo.exceptions import NoNodeError
        try:
            data, stat = self.client.get(f"{TOPICS_PATH}/{topic}", watch=watch)
        except NoNodeError:
            return None
        return decode_assignment(data), stat.version

    def add_partitions(self, topic: str, assignment: TopicAssignment, *, expected_version: int) -> None:
        """Kafka's AdminZkClient.addPartitions: the topic's assignment with its new partitions,
        written under the version it was read at (kazoo's BadVersionError when another writer
        came first); the controller's watch on the znode sees them."""
        self.client.set(f"{TOPICS_PATH}/{topic}", encode_assignment(assignment), version=expected_version)

    def set_topic_assignment(self, topic: str, assignment: TopicAssignment, *, expected_version: int,
                             epoch_zk_version: int) -> int:
        results = self._fenced(epoch_zk_version, lambda t: t.set_data(
            f"{TOPICS_PATH}/{topic}", encode_assignment(assignment), version=expected_version))
        return results[0].version

    def topic_config(self, topic: str) -> dict[str, str]:
        from kazoo.exceptions import NoNodeError
        try:
            data, _ = self.client.get(f"{CONFIG_TOPICS_PATH}/{topic}")
        except NoNodeError:
            return {}
        return decode_config(data)

    def alter_topic_config(self, topic: str, change: Callable[[dict[str, str]], dict[str, str]]) -> bool:
        """Kafka's AdminZkClient.changeTopicConfig: /config/topics/<topic> becomes
        `change(current overrides)`, written under the version it was read at together with
        a /config/changes notification naming the topic, in one transaction (the controller
        cannot miss a change that was made); another writer in between makes it read again.
        True when the overrides changed; UnknownTopicOrPartitionError when the topic's config
        znode is gone (a topic deleted meanwhile: it is not made again)."""
        from kazoo.exceptions import BadVersionError, NoNodeError, RolledBackError

        path = f"{CONFIG_TOPICS_PATH}/{topic}"
        for _ in range(CONFIG_CAS_ATTEMPTS):
            try:
                data, stat = self.client.get(path)
            except NoNodeError:
                raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist") from None
            current = decode_config(data)
            wanted = change(current)
            if wanted == current:
                return False
            transaction = self.client.transaction()
            transaction.set_data(path, encode_config(wanted), version=stat.version)
            transaction.create(f"{CONFIG_CHANGES_PATH}/{CONFIG_CHANGE_PREFIX}", config_change(f"topics/{topic}"),
                               sequence=True)
            results = transaction.commit()
            failed = [r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
            if not failed:
                return True
            if not isinstance(failed[0], (BadVersionError, NoNodeError)):
                raise failed[0]
        raise EosError(f"the config of topic {topic!r} kept changing under this write; retry",
                       ErrorCode.REQUEST_TIMED_OUT)

    def _config_changes(self, watch: Callable | None) -> dict[int, str]:
        """/config/changes' notifications: number -> znode name."""
        return {int(child[len(CONFIG_CHANGE_PREFIX):]): child
                for child in self.client.get_children(CONFIG_CHANGES_PATH, watch=watch)
                if child.startswith(CONFIG_CHANGE_PREFIX)}

    def last_config_change(self, watch: Callable | None = None) -> int:
        """The highest /config/changes notification number (-1: none), read from the names."""
        return max(self._config_changes(watch), default=-1)

    def topic_config_changes(self, after: int, watch: Callable | None = None) -> tuple[int, set[str]]:
        """The topics named by /config/changes notifications numbered above `after`, and the
        highest number seen (`after` when there is none): what the controller has not yet
        told the brokers."""
        from kazoo.exceptions import NoNodeError

        newer = {number: child for number, child in self._config_changes(watch).items() if number > after}
        topics = set()
        for child in newer.values():
            try:
                data, _ = self.client.get(f"{CONFIG_CHANGES_PATH}/{child}")
                entity = str(_loads(data).get("entity_path", ""))
            except NoNodeError:     # expired meanwhile: its change is older than any reader
                continue
            except (ValueError, AttributeError) as exc:
                log.error("%s/%s is not a config change notification (%s); ignored", CONFIG_CHANGES_PATH, child, exc)
                continue
            kind, _, name = entity.partition("/")
            if kind == "topics" and name:
                topics.add(name)
        return max(newer, default=after), topics

    def topics_to_delete(self, watch: Callable | None = None) -> list[str]:
        return sorted(self.client.get_children(DELETE_TOPICS_PATH, watch=watch))

    def request_topic_deletion(self, topic: str) -> None:
        from kazoo.exceptions import NodeExistsError
        try:
            self.client.create(f"{DELETE_TOPICS_PATH}/{topic}", b"", makepath=True)
        except NodeExistsError:
            pass

    def delete_topic(self, topic: str, *, epoch_zk_version: int) -> None:
        """Remove the topic's znodes (assignment, states, config, deletion mark); fenced."""
        paths = []

        def walk(path):
            for child in self.client.get_children(path):
                walk(f"{path}/{child}")
            paths.append(path)
        from kazoo.exceptions import NoNodeError
        try:
            walk(f"{TOPICS_PATH}/{topic}")
        except NoNodeError:
            pass
        for extra in (f"{CONFIG_TOPICS_PATH}/{topic}", f"{DELETE_TOPICS_PATH}/{topic}"):
            if self.client.exists(extra) is not None:
                paths.append(extra)
        for start in range(0, len(paths), WRITE_BATCH_OPS):
            chunk = paths[start:start + WRITE_BATCH_OPS]
            self._fenced(epoch_zk_version, lambda t, chunk=chunk: [t.delete(p) for p in chunk])

    # ---- partition states ------------------------------------------------------------------

    def partition_state(self, topic: str, partition: int) -> tuple[LeaderIsr, int] | None:
        return self.partition_states([(topic, partition)])[(topic, partition)]

    def partition_states(self, partitions: Iterable[TP]) -> dict[TP, tuple[LeaderIsr, int] | None]:
        from kazoo.exceptions import NoNodeError

        partitions = list(partitions)
        pending = [(tp, self.client.get_async(state_path(*tp))) for tp in partitions]
        found: dict[TP, tuple[LeaderIsr, int] | None] = {}
        for tp, async_result in pending:
            try:
                data, stat = async_result.get(timeout=30)
            except NoNodeError:
                found[tp] = None
                continue
            found[tp] = (decode_leader_isr(data), stat.version)
        return found

    def create_partition_states(self, states: dict[TP, LeaderIsr], *,
                                epoch_zk_version: int) -> dict[TP, int | Exception]:
        from kazoo.exceptions import NodeExistsError

        results: dict[TP, int | Exception] = {}
        # The partitions' parent znodes, created pipelined: ensure_path one partition at a
        # time was a round trip or more each (1,000 partitions: 3.0 s against 0.2 s here,
        # most of a new topic's way to every broker's metadata).
        for topic in {topic for topic, _ in states}:
            self.client.ensure_path(f"{TOPICS_PATH}/{topic}/partitions")
        pending = [self.client.create_async(f"{TOPICS_PATH}/{topic}/partitions/{partition}")
                   for topic, partition in states]
        for async_result in pending:
            try:
                async_result.get(timeout=30)
            except NodeExistsError:
                pass     # a partition created before (a retry, a controller's failover)
        items = list(states.items())
        for start in range(0, len(items), WRITE_BATCH_OPS):
            chunk = items[start:start + WRITE_BATCH_OPS]
            try:
                self._fenced(epoch_zk_version, lambda t, chunk=chunk: [
                    t.create(state_path(*tp), encode_leader_isr(state)) for tp, state in chunk])
                for tp, _ in chunk:
                    results[tp] = 0
            except ControllerMoved:
                raise
            except Exception:
                # one failed op rolls the whole batch back: write them one at a time
                for tp, state in chunk:
                    try:
                        self._fenced(epoch_zk_version, lambda t, tp=tp, state=state: t.create(
                            state_path(*tp), encode_leader_isr(state)))
                        results[tp] = 0
                    except ControllerMoved:
                        raise
                    except NodeExistsError as exc:
                        results[tp] = exc
                    except Exception as exc:
                        results[tp] = exc
        return results

    def update_partition_states(self, updates: dict[TP, tuple[LeaderIsr, int]], *,
                                epoch_zk_version: int | None) -> dict[TP, int | Exception]:
        """Conditional on each state's version; per-partition results (new version, or the
        error: StateVersionConflict when it moved). Fenced by the controller epoch unless
        `epoch_zk_version` is None (a leader's own ISR change)."""
        from kazoo.exceptions import BadVersionError, NoNodeError

        results: dict[TP, int | Exception] = {}
        if epoch_zk_version is None:
            pending = [(tp, self.client.set_async(state_path(*tp), encode_leader_isr(state), version=version))
                       for tp, (state, version) in updates.items()]
            for tp, async_result in pending:
                try:
                    results[tp] = async_result.get(timeout=30).version
                except (BadVersionError, NoNodeError) as exc:
                    results[tp] = StateVersionConflict(f"{tp[0]}-{tp[1]}: state changed meanwhile ({type(exc).__name__})")
            return results
        items = list(updates.items())
        for start in range(0, len(items), WRITE_BATCH_OPS):
            chunk = items[start:start + WRITE_BATCH_OPS]
            try:
                written = self._fenced(epoch_zk_version, lambda t, chunk=chunk: [
                    t.set_data(state_path(*tp), encode_leader_isr(state), version=version)
                    for tp, (state, version) in chunk])
                for (tp, _), stat in zip(chunk, written):
                    results[tp] = stat.version
            except ControllerMoved:
                raise
            except (BadVersionError, NoNodeError):
                for tp, (state, version) in chunk:
                    try:
                        [stat] = self._fenced(epoch_zk_version, lambda t, tp=tp, state=state, version=version:
                                              t.set_data(state_path(*tp), encode_leader_isr(state), version=version))
                        results[tp] = stat.version
                    except ControllerMoved:
                        raise
                    except (BadVersionError, NoNodeError) as exc:
                        results[tp] = StateVersionConflict(
                            f"{tp[0]}-{tp[1]}: state changed meanwhile ({type(exc).__name__})")
        return results

    # ---- admin requests ---------------------------------------------------------------------

    def reassignment_request(self, watch: Callable | None = None) -> dict[TP, tuple[int, ...]] | None:
        from kazoo.exceptions import NoNodeError
        if self.client.exists(REASSIGN_PATH, watch=watch) is None:
            return None
        try:
            data, _ = self.client.get(REASSIGN_PATH)
        except NoNodeError:
            return None
        return decode_reassignment(data)

    def set_reassignment_request(self, plan: dict[TP, tuple[int, ...]] | None, *, epoch_zk_version: int) -> None:
        """The controller's rewrite of what is left to reassign (None: all done); fenced."""
        if not plan:
            if self.client.exists(REASSIGN_PATH) is not None:
                self._fenced(epoch_zk_version, lambda t: t.delete(REASSIGN_PATH))
            return
        if self.client.exists(REASSIGN_PATH) is None:
            self.client.ensure_path(REASSIGN_PATH.rsplit("/", 1)[0])
            self._fenced(epoch_zk_version, lambda t: t.create(REASSIGN_PATH, encode_reassignment(plan)))
        else:
            self._fenced(epoch_zk_version, lambda t: t.set_data(REASSIGN_PATH, encode_reassignment(plan)))

    def preferred_election_request(self, watch: Callable | None = None) -> list[TP] | None:
        from kazoo.exceptions import NoNodeError
        if self.client.exists(PREFERRED_ELECTION_PATH, watch=watch) is None:
            return None
        try:
            data, _ = self.client.get(PREFERRED_ELECTION_PATH)
        except NoNodeError:
            return None
        return decode_partitions_list(data)

    def set_preferred_election_request(self, partitions: Iterable[TP]) -> None:
        self.client.create(PREFERRED_ELECTION_PATH, encode_partitions_list(partitions), makepath=True)

    def delete_preferred_election_request(self, *, epoch_zk_version: int) -> None:
        if self.client.exists(PREFERRED_ELECTION_PATH) is not None:
            self._fenced(epoch_zk_version, lambda t: t.delete(PREFERRED_ELECTION_PATH))

    def write_isr_change_notification(self, partitions: Iterable[TP]) -> None:
        self.client.create(f"{ISR_CHANGE_PATH}/{ISR_CHANGE_PREFIX}", encode_partitions_list(partitions),
                           sequence=True, makepath=True)

    def isr_change_notifications(self, watch: Callable | None = None) -> list[str]:
        return sorted(c for c in self.client.get_children(ISR_CHANGE_PATH, watch=watch)
                      if c.startswith(ISR_CHANGE_PREFIX))

    def read_isr_changes(self, names: list[str]) -> set[TP]:
        """The partitions the notifications `names` announce (a notification gone is skipped)."""
        from kazoo.exceptions import NoNodeError
        changed: set[TP] = set()
        for name in names:
            try:
                data, _ = self.client.get(f"{ISR_CHANGE_PATH}/{name}")
            except NoNodeError:
                continue
            changed.update(decode_partitions_list(data))
        return changed

    def delete_isr_changes(self, names: list[str], *, epoch_zk_version: int) -> None:
        """Fenced, as Kafka's controller deletes them: a controller that lost its term (paused
        past its session, say) must not take notifications away from the one that replaced it."""
        paths = [f"{ISR_CHANGE_PATH}/{name}" for name in names]
        for start in range(0, len(paths), WRITE_BATCH_OPS):
            chunk = [path for path in paths[start:start + WRITE_BATCH_OPS] if self.client.exists(path) is not None]
            if chunk:
                self._fenced(epoch_zk_version, lambda t, chunk=chunk: [t.delete(path) for path in chunk])

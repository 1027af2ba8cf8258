"""Topic administration on a cluster: CreateTopics, DeleteTopics, CreatePartitions and topic
configs go to ZooKeeper.

Theory of operation
-------------------
On a cluster any broker takes an admin request (Kafka's ZooKeeper-mode AdminZkClient).
The broker validates it (name, configs, partition count, replication factor against the
live brokers, a manual assignment's broker ids), computes the replica assignment with
Kafka's algorithm (`broker.controller.assignment`), and writes the topic's config and
assignment znodes. It does not create logs: the controller sees the new topic, elects
leaders and sends LeaderAndIsr to the replicas, which create their logs then. The request
is answered once this broker's metadata cache shows every partition with a leader, or
after the request's timeout (then REQUEST_TIMED_OUT: the topic exists and will come online;
Kafka answers the same way).

CreatePartitions grows a topic's assignment znode (compare-and-set on its version; Kafka's
placement of the new partitions, `plan_growth`); the controller's watch on that znode sees the
new partitions and brings them online as it does a new topic's, and the request is answered
once this broker's metadata shows them with leaders. A topic in the middle of a reassignment
and the coordinators' internal topics are refused.

A topic's configs are read from /config/topics/<name> (DescribeConfigs, as Kafka's ZooKeeper
mode reads them), and altered there by compare-and-set with a /config/changes notification
(`broker/topic_configs.py` checks the change first). The controller follows the
notifications: it reads the changed topics again (an unclean.leader.election.enable turned on
elects their offline partitions) and sends every broker an UpdateMetadata of their
partitions, which carries the new configs to each broker's registry and open logs.

Deletion marks the topic under /admin/delete_topics; the controller stops and deletes the
replicas and removes the znodes. Refusals change nothing in ZooKeeper.

Producer ids on a cluster come from blocks reserved in /latest_producer_id_block by
compare-and-set (Kafka's ZooKeeper mode), so no two brokers ever hand out the same id.
"""
from __future__ import annotations

import collections
import contextlib
import json
import logging
import random
import threading
import time
from typing import Callable

from broker import topic_configs
from broker.topics import (PARTITIONS_PER_TOPIC_MAX, PROTECTED_INTERNAL_TOPICS, check_growth, topic_config_of,
                           validate_topic_name)
from eos.config import TopicConfig
from eos.errors import (
    EosError,
    ErrorCode,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidRequestError,
    ReassignmentInProgressError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from eos.v1 import broker_pb2

log = logging.getLogger("eos.broker.admin")

CREATE_WAIT_DEFAULT_MS = 30_000
GROW_ATTEMPTS = 5            # a grow that keeps losing its compare-and-set to other writers gives up
WAIT_POLL_S = 0.05


def _describe(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, EosError):
        return int(exc.code), str(exc)
    if type(exc).__module__.startswith("kazoo"):
        # ZooKeeper away for a moment (ConnectionLoss, SessionExpiredError while the session
        # is renewed): nothing was decided, and the client may ask again
        return int(ErrorCode.REQUEST_TIMED_OUT), f"ZooKeeper did not complete the change ({type(exc).__name__}); retry"
    log.exception("topic administration failed unexpectedly", exc_info=exc)
    return int(ErrorCode.UNKNOWN_SERVER_ERROR), f"{type(exc).__name__}: {exc}"


class ClusterTopicAdmin(topic_configs.TopicConfigRequests):
    """Topic changes through ZooKeeper; see the module doc."""

    def __init__(self, store, metadata, *, default_num_partitions: int, default_replication_factor: int,
                 default_config: Callable[[], TopicConfig], rng: random.Random | None = None):
        self._store = store
        self._metadata = metadata
        self._default_num_partitions = default_num_partitions
        self._default_replication_factor = default_replication_factor
        self._default_config = default_config     # the registry's, which dynamic broker configs change
        self._rng = rng or random.Random()
        self._lock = threading.Lock()

    # ---- CreateTopics ------------------------------------------------------------------------

    def plan_topic(self, new_topic: broker_pb2.NewTopic) -> tuple[dict[int, tuple[int, ...]], dict[str, str]]:
        """Validate a new topic and compute its assignment; nothing is written."""
        from broker.controller.assignment import BrokerMeta, assign_replicas, validate_assignment

        validate_topic_name(new_topic.name)
        overrides = {str(k): str(v) for k, v in new_topic.configs.items()}
        TopicConfig.from_overrides(overrides, base=self._default_config())   # raises InvalidConfigError
        live = self._store.live_brokers()
        if new_topic.assignments:
            assignment = {a.partition: tuple(a.broker_ids) for a in new_topic.assignments}
            if sorted(assignment) != list(range(len(assignment))):
                raise InvalidReplicaAssignmentError(
                    f"a manual assignment must name partitions 0..{len(assignment) - 1}, got {sorted(assignment)}")
            if new_topic.num_partitions > 0 and new_topic.num_partitions != len(assignment):
                raise InvalidRequestError("give either a partition count or a manual assignment, not both")
            validate_assignment(assignment, set(live), expected_partitions=len(assignment))
            return assignment, overrides
        partitions = new_topic.num_partitions if new_topic.num_partitions > 0 else self._default_num_partitions
        if new_topic.num_partitions < -1:
            raise InvalidPartitionsError(f"number of partitions must be at least 1, got {new_topic.num_partitions}")
        if partitions > PARTITIONS_PER_TOPIC_MAX:
            raise InvalidPartitionsError(
                f"{partitions} partitions asked for, the limit per topic is {PARTITIONS_PER_TOPIC_MAX}")
        factor = (new_topic.replication_factor if new_topic.replication_factor > 0
                  else self._default_replication_factor)
        brokers = [BrokerMeta(b.broker_id, b.rack) for b in live.values()]
        return assign_replicas(brokers, partitions, factor, rng=self._rng), overrides

    def create_topics(self, request: broker_pb2.CreateTopicsRequest) -> broker_pb2.CreateTopicsResponse:
        counts = collections.Counter(t.name for t in request.topics)
        results = []
        created = []
        for new_topic in request.topics:
            try:
                if counts[new_topic.name] > 1:
                    raise InvalidRequestError(
                        f"topic {new_topic.name!r} appears {counts[new_topic.name]} times in one request")
                with self._lock:
                    if new_topic.name in self._store.topics():
                        if new_topic.name in self._store.topics_to_delete():
                            # Kafka's words: a broker holding a replica is down, and the old
                            # copy must be deleted before a new topic may take the name
                            raise TopicAlreadyExistsError(f"Topic {new_topic.name!r} is marked for deletion.")
                        raise TopicAlreadyExistsError(f"topic {new_topic.name!r} already exists")
                    assignment, overrides = self.plan_topic(new_topic)
                    if not request.validate_only:
                        self._store.create_topic(new_topic.name, assignment, overrides)
                        created.append(new_topic.name)
                        log.info("created topic %s with assignment %s", new_topic.name,
                                 {p: list(r) for p, r in sorted(assignment.items())})
            except Exception as exc:
                code, message = _describe(exc)
                results.append(broker_pb2.TopicResult(name=new_topic.name, error_code=code, error_message=message))
                continue
            results.append(broker_pb2.TopicResult(name=new_topic.name, error_code=ErrorCode.NONE))
        if created:
            timeout_ms = request.timeout_ms if request.timeout_ms > 0 else CREATE_WAIT_DEFAULT_MS
            online = self._wait_until(lambda: all(self._online(name) for name in created), timeout_ms)
            if not online:
                for result in results:
                    if result.name in created and not self._online(result.name):
                        result.error_code = ErrorCode.REQUEST_TIMED_OUT
                        result.error_message = (f"topic {result.name!r} is created, but not every partition had a "
                                                f"leader within {timeout_ms} ms")
        return broker_pb2.CreateTopicsResponse(topics=results)

    def _online(self, topic: str) -> bool:
        partitions = self._metadata.snapshot.topics().get(topic)
        return bool(partitions) and all(p.leader >= 0 for p in partitions)

    @staticmethod
    def _wait_until(predicate: Callable[[], bool], timeout_ms: int) -> bool:
        deadline = time.monotonic() + timeout_ms / 1000.0
        while not predicate():
            if time.monotonic() >= deadline:
                return False
            time.sleep(WAIT_POLL_S)
        return True

    # ---- DeleteTopics --------------------------------------------------------------------------

    def delete_topics(self, request: broker_pb2.DeleteTopicsRequest) -> broker_pb2.DeleteTopicsResponse:
        results = []
        deleting = []
        for name in request.names:
            try:
                if name in PROTECTED_INTERNAL_TOPICS:
                    raise InvalidRequestError(f"topic {name!r} is internal: the coordinators keep their state in it")
                if name not in self._store.topics():
                    raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
                self._store.request_topic_deletion(name)
                deleting.append(name)
            except Exception as exc:
                code, message = _describe(exc)
                results.append(broker_pb2.TopicResult(name=name, error_code=code, error_message=message))
                continue
            results.append(broker_pb2.TopicResult(name=name, error_code=ErrorCode.NONE))
        if deleting:
            timeout_ms = request.timeout_ms if request.timeout_ms > 0 else CREATE_WAIT_DEFAULT_MS
            gone = lambda: not any(name in self._metadata.snapshot.topics() for name in deleting)  # noqa: E731
            if not self._wait_until(gone, timeout_ms):
                for result in results:
                    if result.name in deleting and result.name in self._metadata.snapshot.topics():
                        result.error_code = ErrorCode.REQUEST_TIMED_OUT
                        result.error_message = f"topic {result.name!r} is marked for deletion; not gone within {timeout_ms} ms"
        return broker_pb2.DeleteTopicsResponse(topics=results)

    # ---- CreatePartitions ----------------------------------------------------------------------

    def create_partitions(self, request: broker_pb2.CreatePartitionsRequest) -> broker_pb2.CreatePartitionsResponse:
        counts = collections.Counter(t.name for t in request.topics)
        results = []
        grown: dict[str, tuple[int, int]] = {}     # topic -> (partitions before, after)
        for grow in request.topics:
            try:
                if counts[grow.name] > 1:
                    raise InvalidRequestError(f"topic {grow.name!r} appears {counts[grow.name]} times in one request")
                before = self._grow(grow.name, grow.count, request.validate_only)
                if before is not None:
                    grown[grow.name] = (before, grow.count)
            except Exception as exc:
                code, message = _describe(exc)
                results.append(broker_pb2.TopicResult(name=grow.name, error_code=code, error_message=message))
                continue
            results.append(broker_pb2.TopicResult(name=grow.name, error_code=ErrorCode.NONE))
        if grown:
            # answered once this broker's metadata shows every new partition with a leader
            # (the old ones may be offline: Kafka waits for the new ones only)
            def online(name: str) -> bool:
                before, after = grown[name]
                new = [p for p in self._metadata.snapshot.topics().get(name) or () if p.partition >= before]
                return len(new) == after - before and all(p.leader >= 0 for p in new)

            if not self._wait_until(lambda: all(online(name) for name in grown), CREATE_WAIT_DEFAULT_MS):
                for result in results:
                    if result.name in grown and not online(result.name):
                        result.error_code = ErrorCode.REQUEST_TIMED_OUT
                        result.error_message = (f"topic {result.name!r} has {grown[result.name][1]} partitions, but "
                                                f"not every new one had a leader within {CREATE_WAIT_DEFAULT_MS} ms")
        return broker_pb2.CreatePartitionsResponse(topics=results)

    def _grow(self, name: str, count: int, validate_only: bool) -> int | None:
        """Write the grown assignment of `name` (compare-and-set; another writer in between
        makes it plan again); the partition count before, or None when only validating."""
        from kazoo.exceptions import BadVersionError

        with self._lock:
            for attempt in range(GROW_ATTEMPTS):
                assignment, version, before = self.plan_growth(name, count)
                if validate_only:
                    return None
                try:
                    self._store.add_partitions(name, assignment, expected_version=version)
                    break
                except BadVersionError:
                    if attempt == GROW_ATTEMPTS - 1:
                        raise
        log.info("topic %s grows to %d partitions: %s", name, count,
                 {p: list(r) for p, r in sorted(assignment.partitions.items())})
        return before

    def plan_growth(self, name: str, count: int):
        """The assignment of `name` grown to `count` partitions, the version of the
        assignment znode it was read at, and the partition count before; nothing is
        written. The new partitions are placed as Kafka's AdminZkClient places them: its
        replica assignment algorithm, continued from the topic's partition count, starting
        at the broker that leads partition 0's replica list, with partition 0's replication
        factor."""
        from broker.controller.assignment import BrokerMeta, assign_replicas
        from broker.metadata.zk_store import TopicAssignment

        found = self._store.topic_assignment(name)
        if found is None or name in self._store.topics_to_delete():
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist"
                                               + (" (it is marked for deletion)" if found is not None else ""))
        current, version = found
        if current.adding or current.removing:
            raise ReassignmentInProgressError(
                f"topic {name!r} has a partition reassignment in progress; add partitions once it is done")
        check_growth(name, len(current.partitions), count)
        live = self._store.live_brokers()
        ids = sorted(live)
        first_replicas = current.partitions[0]
        start_index = next((i for i, broker_id in enumerate(ids) if broker_id >= first_replicas[0]), 0)
        added = assign_replicas([BrokerMeta(b, live[b].rack) for b in ids], count - len(current.partitions),
                                len(first_replicas), rng=self._rng, start_partition_id=len(current.partitions),
                                fixed_start_index=start_index)
        return TopicAssignment({**current.partitions, **added}), version, len(current.partitions)

    # ---- topic configs (broker/topic_configs.py's TopicConfigStore, on ZooKeeper) ----------------

    @property
    def default_config(self) -> TopicConfig:
        return self._default_config()

    def topic_overrides(self, name: str) -> dict[str, str]:
        with _zookeeper_errors():
            if name not in self._store.topics():
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            return self._store.topic_config(name)

    def topic_config(self, name: str) -> TopicConfig:
        return topic_config_of(name, self.topic_overrides(name), self._default_config())

    def update_overrides(self, name: str, change, validate_only: bool) -> None:
        with _zookeeper_errors():
            if name not in self._store.topics():
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            if validate_only:
                change(self._store.topic_config(name))
            elif self._store.alter_topic_config(name, change):
                log.info("topic %s: config overrides changed in ZooKeeper", name)


@contextlib.contextmanager
def _zookeeper_errors():
    """ZooKeeper's failures as the EosError `_describe` names (an EosError passes as it is)."""
    try:
        yield
    except EosError:
        raise
    except Exception as exc:
        code, message = _describe(exc)
        raise EosError(message, code) from exc


# ---- producer ids -----------------------------------------------------------------------------------

PRODUCER_ID_BLOCK_PATH = "/latest_producer_id_block"
PRODUCER_ID_BLOCK_SIZE = 1000
PRODUCER_ID_BLOCK_ATTEMPTS = 20


class ZkProducerIdManager:
    """Producer ids from blocks reserved in ZooKeeper by compare-and-set (Kafka's
    ProducerIdManager in ZooKeeper mode: {"version":1,"broker":N,"block_start":"S","block_end":"E"})."""

    def __init__(self, kazoo_client, broker_id: int, *, block_size: int = PRODUCER_ID_BLOCK_SIZE):
        self._zk = kazoo_client
        self._broker_id = broker_id
        self._block_size = block_size
        self._next = 0
        self._end_exclusive = 0
        self._lock = threading.Lock()

    def next_id(self) -> int:
        with self._lock:
            if self._next >= self._end_exclusive:
                self._reserve_block()
            value = self._next
            self._next += 1
            return value

    def _reserve_block(self) -> None:
        from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

        for _ in range(PRODUCER_ID_BLOCK_ATTEMPTS):
            try:
                data, stat = self._zk.get(PRODUCER_ID_BLOCK_PATH)
                current = json.loads(data.decode("utf-8"))
                start = int(current["block_end"]) + 1
                version = stat.version
            except NoNodeError:
                start, version = 0, None
            end = start + self._block_size - 1
            value = json.dumps({"version": 1, "broker": self._broker_id, "block_start": str(start),
                                "block_end": str(end)}).encode("utf-8")
            try:
                if version is None:
                    self._zk.create(PRODUCER_ID_BLOCK_PATH, value, makepath=True)
                else:
                    self._zk.set(PRODUCER_ID_BLOCK_PATH, value, version=version)
            except (BadVersionError, NodeExistsError):
                continue   # another broker took this block: read again
            self._next, self._end_exclusive = start, end + 1
            log.info("reserved producer ids %d..%d", start, end)
            return
        raise EosError("could not reserve a producer id block in ZooKeeper (too much contention)",
                       ErrorCode.COORDINATOR_NOT_AVAILABLE)

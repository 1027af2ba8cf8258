"""Topic administration on a cluster of one: CreateTopics, DeleteTopics, CreatePartitions,
topic configs (DescribeConfigs, IncrementalAlterConfigs) and auto-creation, against the topic
registry and the partition logs.

Theory of operation
-------------------
On a ZooKeeper cluster the controller owns topics and `broker/cluster_admin.py`'s
ClusterTopicAdmin answers these calls; on a single broker `LocalTopicAdmin` does, with the
same methods, so the Broker servicer hands either the request. One lock orders topic
changes (registry and logs change together). The order of the two is what keeps a crash
harmless: a topic is created logs first, registry second (it is visible only once its logs
exist; logs no topic names are removed by the broker's start-up sweep), and deleted registry
first, logs second. A request is answered per topic: one refused or failed topic does not
stop the others. A config change is written to the registry first and then given to the
topic's open logs (`Log.update_config`): it applies at once, as Kafka's does (a new
segment.bytes at the next roll, a new retention.ms at the next retention pass), and a crash
in between leaves the registry's value, which the logs are opened with. The ACL checks are
the Broker service's: a topic the caller may not change never reaches this class.
"""
from __future__ import annotations

import collections
import functools
import logging
import threading
from typing import Callable

from broker import topic_configs
from broker.topics import PROTECTED_INTERNAL_TOPICS, TopicInfo, TopicRegistry, validate_topic_name
from eos.config import TopicConfig
from eos.errors import (EosError, ErrorCode, InvalidRequestError, StorageError, UnknownTopicOrPartitionError,
                        error_code_and_message)
from eos.types import TopicPartition
from eos.v1 import broker_pb2

log = logging.getLogger("eos.broker")


def _log_error(rpc: str, topic: str, partition: int, exc: BaseException) -> None:
    if isinstance(exc, EosError):
        log.debug("%s %s-%d: %s", rpc, topic, partition, exc)
    else:
        log.exception("%s %s-%d failed unexpectedly", rpc, topic, partition, exc_info=exc)


class LocalTopicAdmin(topic_configs.TopicConfigRequests):
    """Topic changes on a single broker (see the module doc)."""

    def __init__(self, registry: TopicRegistry, log_manager, *, node_id: int,
                 notify: Callable[[TopicPartition], None]):
        """`notify(tp)` wakes the long polls of a deleted topic's partitions. The ACL checks
        are the Broker service's, made before a request gets here."""
        self._registry = registry
        self._log_manager = log_manager
        self._node_id = node_id
        self._notify = notify
        self._admin_lock = threading.Lock()   # one topic change at a time (registry + logs)

    def auto_create(self, name: str) -> TopicInfo:
        """auto.create.topics.enable: make a topic with the defaults (off by default)."""
        validate_topic_name(name)
        with self._admin_lock:
            existing = self._registry.get(name)
            if existing is not None:
                return existing
            info = self._registry.prepare_create(name, -1, -1, {})
            self._create_topic_logs(info, range(info.partition_count))
            self._commit(info)
        log.info("auto-created topic %s with %d partitions", name, info.partition_count)
        return info

    def _commit(self, info: TopicInfo) -> TopicInfo:
        """The registry's commit; the topic's logs made from `info` take the config it was
        stored with when that differs (the dynamic broker configs changed meanwhile)."""
        committed = self._registry.commit(info)
        if committed.config != info.config:
            self._push_config(info.name)
        return committed

    def _push_config(self, name: str) -> None:
        """The topic's open logs take its config as the registry holds it now."""
        self._registry.push_config(name, functools.partial(self._log_manager.update_config, name))

    def _create_topic_logs(self, info: TopicInfo, partitions) -> None:
        """Create the logs of `partitions` (their directories fsynced once, after them all);
        on failure delete the ones made, then raise."""
        created = []
        try:
            for partition in partitions:
                self._log_manager.create_log(info.name, partition, info.config, sync_directory=False)
                created.append(partition)
            offline = self._log_manager.sync_directories([(info.name, p) for p in created])
            if offline:
                raise StorageError(next(iter(offline.values())))
        except BaseException:
            for partition in created:
                try:
                    self._log_manager.delete_log(info.name, partition)
                except Exception:
                    log.exception("could not remove log %s-%d after a failed create", info.name, partition)
            raise

    def create_topics(self, request: broker_pb2.CreateTopicsRequest) -> broker_pb2.CreateTopicsResponse:
        counts = collections.Counter(t.name for t in request.topics)
        results = []
        # Kafka: CREATE on the cluster, or else CREATE on each topic.
        for new_topic in request.topics:
            try:
                if counts[new_topic.name] > 1:
                    raise InvalidRequestError(
                        f"topic {new_topic.name!r} appears {counts[new_topic.name]} times in one request")
                strangers = sorted({b for a in new_topic.assignments for b in a.broker_ids} - {self._node_id})
                if strangers:
                    raise EosError(f"the assignment of topic {new_topic.name!r} names brokers {strangers}; this "
                                   f"cluster is broker {self._node_id} alone", ErrorCode.INVALID_REPLICA_ASSIGNMENT)
                with self._admin_lock:
                    # Logs first, registry second: a topic is visible only once its logs
                    # exist, and a crash in between leaves logs the start-up sweep removes.
                    info = self._registry.prepare_create(
                        new_topic.name, new_topic.num_partitions, new_topic.replication_factor,
                        dict(new_topic.configs))
                    if not request.validate_only:
                        self._create_topic_logs(info, range(info.partition_count))
                        try:
                            self._commit(info)
                        except BaseException:
                            for partition in range(info.partition_count):
                                self._log_manager.delete_log(info.name, partition)
                            raise
                if not request.validate_only:
                    log.info("created topic %s with %d partitions, overrides %s",
                             info.name, info.partition_count, dict(info.config_overrides))
            except Exception as exc:
                code, message = error_code_and_message(exc)
                _log_error("CreateTopics", new_topic.name, -1, exc)
                results.append(broker_pb2.TopicResult(name=new_topic.name, error_code=code,
                                                      error_message=message))
                continue
            results.append(broker_pb2.TopicResult(name=new_topic.name, error_code=ErrorCode.NONE))
        return broker_pb2.CreateTopicsResponse(topics=results)

    def delete_topics(self, request: broker_pb2.DeleteTopicsRequest) -> broker_pb2.DeleteTopicsResponse:
        results = []
        for name in request.names:
            try:
                if name in PROTECTED_INTERNAL_TOPICS:
                    raise InvalidRequestError(
                        f"topic {name!r} is internal: the coordinators keep their state in it")
                with self._admin_lock:
                    # A partition on a failed log dir keeps its files there: deleting the
                    # topic now (and creating it again) would leave two copies for the next
                    # start to refuse. It waits until the directory is back.
                    topic = self._registry.get(name)
                    for partition in range(topic.partition_count if topic is not None else 0):
                        offline = self._log_manager.offline_reason(name, partition)
                        if offline is not None:
                            raise StorageError(f"topic {name!r} cannot be deleted while partition {partition} "
                                               f"is offline: {offline}")
                    # Registry first: once the topic is gone from it nothing reads or writes
                    # the logs; a crash before the logs are deleted leaves them to the
                    # start-up sweep.
                    info = self._registry.remove(name)
                    for partition in range(info.partition_count):
                        self._log_manager.delete_log(name, partition)
                for partition in range(info.partition_count):
                    # long polls on the topic re-read now and see it is gone
                    self._notify(TopicPartition(name, partition))
                log.info("deleted topic %s", name)
            except Exception as exc:
                code, message = error_code_and_message(exc)
                _log_error("DeleteTopics", name, -1, exc)
                results.append(broker_pb2.TopicResult(name=name, error_code=code, error_message=message))
                continue
            results.append(broker_pb2.TopicResult(name=name, error_code=ErrorCode.NONE))
        return broker_pb2.DeleteTopicsResponse(topics=results)

    def create_partitions(self, request: broker_pb2.CreatePartitionsRequest) -> broker_pb2.CreatePartitionsResponse:
        counts = collections.Counter(t.name for t in request.topics)
        results = []
        for grow in request.topics:
            try:
                if counts[grow.name] > 1:
                    raise InvalidRequestError(
                        f"topic {grow.name!r} appears {counts[grow.name]} times in one request")
                with self._admin_lock:
                    current = self._registry.get(grow.name)
                    info = self._registry.prepare_grow(grow.name, grow.count)
                    if not request.validate_only:
                        new_partitions = range(current.partition_count, info.partition_count)
                        self._create_topic_logs(info, new_partitions)
                        try:
                            self._commit(info)
                        except BaseException:
                            for partition in new_partitions:
                                self._log_manager.delete_log(info.name, partition)
                            raise
                if not request.validate_only:
                    log.info("topic %s now has %d partitions", info.name, info.partition_count)
            except Exception as exc:
                code, message = error_code_and_message(exc)
                _log_error("CreatePartitions", grow.name, -1, exc)
                results.append(broker_pb2.TopicResult(name=grow.name, error_code=code, error_message=message))
                continue
            results.append(broker_pb2.TopicResult(name=grow.name, error_code=ErrorCode.NONE))
        return broker_pb2.CreatePartitionsResponse(topics=results)

    # ---- topic configs (broker/topic_configs.py's TopicConfigStore) ------------------------------

    @property
    def default_config(self) -> TopicConfig:
        return self._registry.default_config

    def _existing(self, name: str) -> TopicInfo:
        info = self._registry.get(name)
        if info is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return info

    def topic_overrides(self, name: str):
        return self._existing(name).config_overrides

    def topic_config(self, name: str) -> TopicConfig:
        return self._existing(name).config

    def update_overrides(self, name: str, change, validate_only: bool) -> None:
        with self._admin_lock:
            current = self._existing(name)
            info = self._registry.prepare_reconfigure(name, change(dict(current.config_overrides)))
            if validate_only or dict(info.config_overrides) == dict(current.config_overrides):
                return
            # Registry first (the truth a restart opens the logs with), then the open logs.
            self._registry.commit(info)
            self._push_config(name)
        log.info("topic %s: config overrides now %s", name, dict(info.config_overrides))

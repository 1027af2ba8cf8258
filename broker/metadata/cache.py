"""What one broker knows of the cluster: brokers, the controller, every partition's leader.

Theory of operation
-------------------
In Kafka's ZooKeeper mode a broker never reads partition leadership from ZooKeeper to
answer a client: the controller pushes it with UpdateMetadata, and the broker answers
Metadata from its cache. `MetadataCache` is that cache and the one owner of it. It holds an
immutable `ClusterSnapshot` (live brokers, controller id and epoch, per partition the
leader, leader epoch, replicas, ISR and offline replicas, per topic its config overrides)
and replaces it whole on every update, so a reader takes no lock and always sees one
consistent picture, never half of an update.

Updates carry the controller epoch: one from an older controller than the newest seen is
refused (STALE_CONTROLLER_EPOCH) and changes nothing. A `full` update replaces the
partitions; a partial one merges them (the controller sends a partial update after a
leader change, a full one when a broker joins or a controller takes over).

A cluster of one (no ZooKeeper) has no controller and no cache: the Broker service answers
Metadata from its topic registry, every partition led by itself at epoch 0.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Iterable, Mapping

from broker.metadata.types import BrokerInfo as BrokerEndpoint
from eos.errors import StaleControllerEpochError

NO_LEADER = -1


@dataclass(frozen=True)
class PartitionInfo:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()


@dataclass(frozen=True)
class ClusterSnapshot:
    brokers: Mapping[int, BrokerEndpoint] = field(default_factory=dict)
    controller_id: int = -1
    controller_epoch: int = 0
    partitions: Mapping[tuple[str, int], PartitionInfo] = field(default_factory=dict)
    topic_configs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def topics(self) -> Mapping[str, tuple[PartitionInfo, ...]]:
        """Partitions by topic, each in partition order (read-only)."""
        return self._by_topic

    @cached_property
    def _by_topic(self) -> Mapping[str, tuple[PartitionInfo, ...]]:
        # Built once a snapshot, at its first use: a Metadata answer, and each partition of
        # a LeaderAndIsr (partition_count), would otherwise sort every partition of the
        # cluster again.
        by_topic: dict[str, list[PartitionInfo]] = {}
        for (topic, _), info in sorted(self.partitions.items()):
            by_topic.setdefault(topic, []).append(info)
        return MappingProxyType({topic: tuple(infos) for topic, infos in by_topic.items()})

    def partition_count(self, topic: str) -> int:
        return len(self._by_topic.get(topic, ()))


class MetadataCache:
    """The broker's copy of the cluster metadata; see the module doc."""

    def __init__(self, snapshot: ClusterSnapshot | None = None):
        self._snapshot = snapshot or ClusterSnapshot()
        self._lock = threading.Lock()   # serialises writers; readers take the snapshot

    @property
    def snapshot(self) -> ClusterSnapshot:
        return self._snapshot

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        return self._snapshot.partitions.get((topic, partition))

    def broker(self, broker_id: int) -> BrokerEndpoint | None:
        return self._snapshot.brokers.get(broker_id)

    def replace(self, snapshot: ClusterSnapshot) -> None:
        with self._lock:
            self._snapshot = snapshot

    def update(self, *, controller_id: int, controller_epoch: int, brokers: Iterable[BrokerEndpoint],
               partitions: Iterable[PartitionInfo], topic_configs: Mapping[str, Mapping[str, str]],
               full: bool, deleted_topics: Iterable[str] = ()) -> ClusterSnapshot:
        """Apply an UpdateMetadata; raise StaleControllerEpochError (changing nothing) when
        it comes from a controller older than the newest one seen."""
        with self._lock:
            current = self._snapshot
            if controller_epoch < current.controller_epoch:
                raise StaleControllerEpochError(
                    f"UpdateMetadata from controller {controller_id} at epoch {controller_epoch}; "
                    f"this broker has seen epoch {current.controller_epoch}")
            deleted = set(deleted_topics)
            merged = {} if full else {tp: p for tp, p in current.partitions.items() if tp[0] not in deleted}
            configs = {} if full else {t: c for t, c in current.topic_configs.items() if t not in deleted}
            for info in partitions:
                merged[(info.topic, info.partition)] = info
            for topic, config in topic_configs.items():
                configs[topic] = dict(config)
            snapshot = ClusterSnapshot(
                brokers={b.broker_id: b for b in brokers}, controller_id=controller_id,
                controller_epoch=controller_epoch, partitions=merged, topic_configs=configs)
            self._snapshot = snapshot
            return snapshot


"""The values the cluster's metadata is made of, shared by the ZooKeeper store, the
controller's core and the brokers' metadata cache (one definition each)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BrokerInfo:
    """A registered broker: where it listens, its rack, and its broker epoch (the czxid of
    its /brokers/ids znode; -1 when not read from ZooKeeper)."""

    broker_id: int
    host: str
    port: int
    rack: str | None = None
    epoch: int = -1


@dataclass(frozen=True)
class LeaderIsr:
    """A partition's state znode: leader (-1: none), leader epoch, ISR, and the epoch of the
    controller that wrote it."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int

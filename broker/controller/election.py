"""Kafka's leader-election strategies and leader-imbalance check, as pure functions.

Theory of operation
-------------------
The controller elects a partition's leader in four situations (the seeds' article on the
controller names them; Kafka's PartitionLeaderElectionAlgorithms):

- offline partition: the leader died. The first replica, in assignment order, that is
  alive and in the ISR; the new ISR is the live part of the old one. With no live ISR
  member the partition stays offline -- unless unclean.leader.election.enable, then the
  first live replica leads alone, and records it never had may be lost (`unclean=True`).
- reassignment: the first replica of the *target* replicas that is alive and in the ISR.
- preferred replica: only the first replica of the assignment, if it is alive and in the
  ISR (auto.leader.rebalance.enable and `eos leader-election --election-type preferred`).
- controlled shutdown: the first replica alive, in the ISR and not shutting down; the
  shutting-down brokers leave the ISR.

Each returns an `ElectionResult` or None when nobody may lead. Nothing here reads a clock
or does I/O; the controller core calls these with its model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterable, Mapping, Sequence


@dataclass(frozen=True)
class ElectionResult:
    leader: int
    isr: tuple[int, ...]
    unclean: bool = False


def offline_partition_leader(assignment: Sequence[int], isr: Collection[int], live: Collection[int], *,
                             unclean_enabled: bool) -> ElectionResult | None:
    live_isr = tuple(b for b in isr if b in live)
    for replica in assignment:
        if replica in live and replica in isr:
            return ElectionResult(replica, _leader_first(replica, live_isr))
    if unclean_enabled:
        for replica in assignment:
            if replica in live:
                return ElectionResult(replica, (replica,), unclean=True)
    return None


def reassign_partition_leader(target_replicas: Sequence[int], isr: Collection[int],
                              live: Collection[int]) -> ElectionResult | None:
    for replica in target_replicas:
        if replica in live and replica in isr:
            return ElectionResult(replica, _leader_first(replica, tuple(b for b in isr if b in live)))
    return None


def preferred_replica_leader(assignment: Sequence[int], isr: Collection[int],
                             live: Collection[int]) -> ElectionResult | None:
    if not assignment:
        return None
    preferred = assignment[0]
    if preferred in live and preferred in isr:
        return ElectionResult(preferred, _leader_first(preferred, tuple(b for b in isr if b in live)))
    return None


def controlled_shutdown_leader(assignment: Sequence[int], isr: Collection[int], live: Collection[int],
                               shutting_down: Collection[int]) -> ElectionResult | None:
    remaining_isr = tuple(b for b in isr if b in live and b not in shutting_down)
    for replica in assignment:
        if replica in remaining_isr:
            return ElectionResult(replica, _leader_first(replica, remaining_isr))
    return None


def _leader_first(leader: int, isr: tuple[int, ...]) -> tuple[int, ...]:
    """The ISR keeps its order; the leader is always in it."""
    return isr if leader in isr else (leader, *isr)


def imbalanced_brokers(assignments: Mapping[tuple[str, int], Sequence[int]], leaders: Mapping[tuple[str, int], int],
                       live: Collection[int], percentage: int) -> dict[int, list[tuple[str, int]]]:
    """Kafka's checkAndTriggerAutoLeaderRebalance: for each live broker, the partitions it
    is the preferred replica of but does not lead; a broker is imbalanced when those are
    more than `percentage` % of the partitions it prefers. Returns only imbalanced brokers."""
    preferred_of: dict[int, list[tuple[str, int]]] = {}
    for tp, replicas in assignments.items():
        if replicas:
            preferred_of.setdefault(replicas[0], []).append(tp)
    result = {}
    for broker, tps in preferred_of.items():
        if broker not in live:
            continue
        not_led = [tp for tp in tps if leaders.get(tp) != broker]
        if tps and len(not_led) * 100 > percentage * len(tps):
            result[broker] = sorted(not_led)
    return result


def live_ordered(replicas: Iterable[int], live: Collection[int]) -> tuple[int, ...]:
    return tuple(b for b in replicas if b in live)

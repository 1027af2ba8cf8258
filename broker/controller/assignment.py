"""Kafka's replica assignment (AdminUtils.assignReplicasToBrokers), pure.

Theory of operation
-------------------
Without racks: brokers sorted by id; a random start index; the first replica of partition
p is broker (start + p) mod n; the followers sit at a shift from it that starts random and
grows by one every n partitions, (first + 1 + (shift + j) mod (n - 1)) mod n, so the
followers of one broker's partitions spread over the others and leaderships spread evenly.

With racks (every broker has broker.rack): brokers are first interleaved rack by rack
(r1-b0, r2-b0, r3-b0, r1-b1, ...), the first replica placed as above on that list, and each
follower taken from the shifted position onwards, skipping a broker whose rack already has
a replica of the partition (until every rack has one) or that already has one; so with as
many racks as replicas each replica is on its own rack. Some brokers with a rack and some
without is refused, as Kafka refuses it.

`validate_assignment` checks a manual assignment or a reassignment plan: no empty replica
list, no duplicate broker in a partition, only known brokers, one replication factor.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

from eos.errors import InvalidPartitionsError, InvalidReplicaAssignmentError, InvalidReplicationFactorError


@dataclass(frozen=True)
class BrokerMeta:
    broker_id: int
    rack: str | None = None


def assign_replicas(brokers: Sequence[BrokerMeta], num_partitions: int, replication_factor: int, *,
                    rng: random.Random, start_partition_id: int = 0,
                    fixed_start_index: int = -1) -> dict[int, tuple[int, ...]]:
    if num_partitions <= 0:
        raise InvalidPartitionsError(f"number of partitions must be larger than 0, got {num_partitions}")
    if replication_factor <= 0:
        raise InvalidReplicationFactorError(f"replication factor must be larger than 0, got {replication_factor}")
    if replication_factor > len(brokers):
        raise InvalidReplicationFactorError(
            f"Replication factor: {replication_factor} larger than available brokers: {len(brokers)}.")
    with_rack = [b for b in brokers if b.rack]
    if with_rack and len(with_rack) != len(brokers):
        raise InvalidReplicaAssignmentError(
            "Not all brokers have rack information: "
            f"{sorted(b.broker_id for b in brokers if not b.rack)} have none")
    if with_rack:
        return _rack_aware(brokers, num_partitions, replication_factor, rng, start_partition_id, fixed_start_index)
    ids = sorted(b.broker_id for b in brokers)
    n = len(ids)
    start_index = fixed_start_index if fixed_start_index >= 0 else rng.randrange(n)
    next_shift = fixed_start_index if fixed_start_index >= 0 else rng.randrange(n)
    current = max(start_partition_id, 0)
    result: dict[int, tuple[int, ...]] = {}
    for _ in range(num_partitions):
        if current > 0 and current % n == 0:
            next_shift += 1
        first = (current + start_index) % n
        replicas = [ids[first]]
        for j in range(replication_factor - 1):
            replicas.append(ids[_replica_index(first, next_shift, j, n)])
        result[current] = tuple(replicas)
        current += 1
    return result


def _replica_index(first: int, shift: int, j: int, n: int) -> int:
    return (first + 1 + (shift + j) % (n - 1)) % n


def _interleaved_by_rack(brokers: Sequence[BrokerMeta]) -> list[int]:
    by_rack: dict[str, list[int]] = {}
    for b in sorted(brokers, key=lambda b: b.broker_id):
        by_rack.setdefault(b.rack, []).append(b.broker_id)
    racks = sorted(by_rack)
    result = []
    for i in range(max(len(v) for v in by_rack.values())):
        for rack in racks:
            if i < len(by_rack[rack]):
                result.append(by_rack[rack][i])
    return result


def _rack_aware(brokers, num_partitions, replication_factor, rng, start_partition_id, fixed_start_index):
    rack_of = {b.broker_id: b.rack for b in brokers}
    ordered = _interleaved_by_rack(brokers)
    n = len(ordered)
    racks = len(set(rack_of.values()))
    start_index = fixed_start_index if fixed_start_index >= 0 else rng.randrange(n)
    next_shift = fixed_start_index if fixed_start_index >= 0 else rng.randrange(n)
    current = max(start_partition_id, 0)
    result = {}
    for _ in range(num_partitions):
        if current > 0 and current % n == 0:
            next_shift += 1
        first = (current + start_index) % n
        leader = ordered[first]
        replicas = [leader]
        racks_with = {rack_of[leader]}
        brokers_with = {leader}
        k = 0
        for _ in range(replication_factor - 1):
            while True:
                broker = ordered[_replica_index(first, next_shift * racks, k, n)]
                k += 1
                rack = rack_of[broker]
                if broker in brokers_with:
                    continue
                if rack in racks_with and len(racks_with) < racks:
                    continue
                replicas.append(broker)
                racks_with.add(rack)
                brokers_with.add(broker)
                break
        result[current] = tuple(replicas)
        current += 1
    return result


def validate_assignment(assignment: Mapping[int, Sequence[int]], live_broker_ids: Collection[int], *,
                        expected_partitions: int | None = None) -> None:
    if not assignment:
        raise InvalidReplicaAssignmentError("the assignment names no partition")
    if expected_partitions is not None and len(assignment) != expected_partitions:
        raise InvalidReplicaAssignmentError(
            f"the assignment names {len(assignment)} partitions, expected {expected_partitions}")
    factors = set()
    for partition, replicas in sorted(assignment.items()):
        if not replicas:
            raise InvalidReplicaAssignmentError(f"partition {partition} has an empty replica list")
        if len(set(replicas)) != len(replicas):
            raise InvalidReplicaAssignmentError(
                f"partition {partition} names a broker twice: {list(replicas)}")
        unknown = sorted(set(replicas) - set(live_broker_ids))
        if unknown:
            raise InvalidReplicaAssignmentError(
                f"partition {partition} names unknown or offline brokers {unknown}; live brokers are "
                f"{sorted(live_broker_ids)}")
        factors.add(len(replicas))
    if len(factors) > 1:
        raise InvalidReplicaAssignmentError(
            f"all partitions must have the same replication factor, found {sorted(factors)}")

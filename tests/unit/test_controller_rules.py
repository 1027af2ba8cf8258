"""The controller's pure rules: replica assignment, the election strategies, the state tables."""
from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.controller.assignment import BrokerMeta, assign_replicas, validate_assignment
from broker.controller.election import (controlled_shutdown_leader, imbalanced_brokers, offline_partition_leader,
                                        preferred_replica_leader, reassign_partition_leader)
from broker.controller.states import (PARTITION_VALID_PREVIOUS, REPLICA_VALID_PREVIOUS, PartitionState,
                                      PartitionStates, ReplicaState, ReplicaStates)
from eos.errors import InvalidPartitionsError, InvalidReplicaAssignmentError, InvalidReplicationFactorError

# ---- assignment ----------------------------------------------------------------------------------


def brokers(n, racks=None):
    return [BrokerMeta(i, None if racks is None else racks[i % len(racks)]) for i in range(n)]


def test_fixed_start_matches_kafkas_layout():
    # Kafka's AdminUtils with startIndex = 0, nextReplicaShift = 0 on brokers 0..4:
    # partition p leads on p % 5, its followers follow right after it.
    assignment = assign_replicas(brokers(5), 10, 3, rng=random.Random(1), fixed_start_index=0)
    assert assignment[0] == (0, 1, 2)
    assert assignment[1] == (1, 2, 3)
    assert assignment[4] == (4, 0, 1)
    assert assignment[5] == (0, 2, 3)      # the shift grows after every n partitions


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 9), partitions=st.integers(1, 60), data=st.data())
def test_every_partition_gets_distinct_replicas_and_leaders_spread(n, partitions, data):
    factor = data.draw(st.integers(1, n))
    assignment = assign_replicas(brokers(n), partitions, factor, rng=random.Random(data.draw(st.integers(0, 99))))
    assert sorted(assignment) == list(range(partitions))
    for replicas in assignment.values():
        assert len(replicas) == factor and len(set(replicas)) == factor
        assert set(replicas) <= set(range(n))
    leaders = Counter(r[0] for r in assignment.values())
    counts = [leaders.get(b, 0) for b in range(n)]
    assert max(counts) - min(counts) <= 1


@settings(max_examples=100, deadline=None)
@given(racks=st.integers(2, 4), per_rack=st.integers(1, 3), partitions=st.integers(1, 30), seed=st.integers(0, 99))
def test_rack_aware_puts_each_replica_on_its_own_rack(racks, per_rack, partitions, seed):
    rack_names = [f"r{i}" for i in range(racks)]
    members = [BrokerMeta(i, rack_names[i % racks]) for i in range(racks * per_rack)]
    factor = min(racks, len(members))
    rack_of = {b.broker_id: b.rack for b in members}
    for replicas in assign_replicas(members, partitions, factor, rng=random.Random(seed)).values():
        assert len({rack_of[r] for r in replicas}) == factor
        assert len(set(replicas)) == factor


def test_assignment_refusals_name_the_problem():
    with pytest.raises(InvalidReplicationFactorError, match="3 larger than available brokers: 2"):
        assign_replicas(brokers(2), 1, 3, rng=random.Random(0))
    with pytest.raises(InvalidPartitionsError):
        assign_replicas(brokers(2), 0, 1, rng=random.Random(0))
    with pytest.raises(InvalidReplicaAssignmentError, match="Not all brokers have rack information"):
        assign_replicas([BrokerMeta(0, "a"), BrokerMeta(1)], 1, 1, rng=random.Random(0))


@pytest.mark.parametrize("assignment, message", [
    ({0: [0, 0]}, "twice"),
    ({0: [0, 5]}, "unknown"),
    ({0: []}, "empty"),
    ({0: [0, 1], 1: [1]}, "same replication factor"),
])
def test_validate_assignment(assignment, message):
    with pytest.raises(InvalidReplicaAssignmentError, match=message):
        validate_assignment(assignment, {0, 1, 2})


# ---- elections ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("assignment, isr, live, unclean, expected", [
    ((1, 2, 3), (1, 2, 3), {2, 3}, False, (2, (2, 3), False)),   # first live ISR member in assignment order
    ((1, 2, 3), (3, 2), {2, 3}, False, (2, (3, 2), False)),      # assignment order, not ISR order
    ((1, 2, 3), (1,), {2, 3}, False, None),                      # no live ISR member: offline
    ((1, 2, 3), (1,), {2, 3}, True, (2, (2,), True)),            # ... unless unclean is allowed
    ((1, 2, 3), (1,), set(), True, None),                        # nobody alive at all
])
def test_offline_partition_leader(assignment, isr, live, unclean, expected):
    result = offline_partition_leader(assignment, isr, live, unclean_enabled=unclean)
    assert (None if result is None else (result.leader, result.isr, result.unclean)) == expected


def test_reassign_preferred_and_shutdown_leaders():
    assert reassign_partition_leader((3, 4), isr=(1, 3, 4), live={1, 3, 4}).leader == 3
    assert reassign_partition_leader((3, 4), isr=(1,), live={1, 3, 4}) is None
    assert preferred_replica_leader((2, 1), isr=(1, 2), live={1, 2}).leader == 2
    assert preferred_replica_leader((2, 1), isr=(1,), live={1, 2}) is None        # not in the ISR
    assert preferred_replica_leader((2, 1), isr=(1, 2), live={1}) is None         # not alive
    result = controlled_shutdown_leader((1, 2, 3), isr=(1, 2, 3), live={1, 2, 3}, shutting_down={1})
    assert (result.leader, result.isr) == (2, (2, 3))
    assert controlled_shutdown_leader((1,), isr=(1,), live={1}, shutting_down={1}) is None


def test_imbalance_counts_partitions_a_broker_prefers_but_does_not_lead():
    assignments = {("t", p): ((0, 1) if p < 4 else (1, 0)) for p in range(8)}
    leaders = {("t", p): 1 for p in range(8)}            # broker 1 leads everything
    assert imbalanced_brokers(assignments, leaders, {0, 1}, 10) == {0: [("t", p) for p in range(4)]}
    leaders.update({("t", p): 0 for p in range(4)})
    assert imbalanced_brokers(assignments, leaders, {0, 1}, 10) == {}
    assert imbalanced_brokers(assignments, {("t", p): 1 for p in range(8)}, {1}, 10) == {}   # 0 is down


# ---- state tables ---------------------------------------------------------------------------------

def test_partition_transitions_follow_the_table():
    states = PartitionStates()
    tp = ("t", 0)
    assert states.transition([tp], PartitionState.ONLINE) == [tp]           # NonExistent -> Online: illegal
    assert states.get(tp) is PartitionState.NON_EXISTENT
    for target in (PartitionState.NEW, PartitionState.ONLINE, PartitionState.OFFLINE, PartitionState.NON_EXISTENT):
        assert states.transition([tp], target) == []
        assert states.get(tp) is target


def test_replica_deletion_path():
    states = ReplicaStates()
    key = (("t", 0), 1)
    for target in (ReplicaState.NEW, ReplicaState.ONLINE, ReplicaState.OFFLINE, ReplicaState.DELETION_STARTED,
                   ReplicaState.DELETION_SUCCESSFUL, ReplicaState.NON_EXISTENT):
        assert states.transition([key], target) == [], target
    assert states.transition([key], ReplicaState.DELETION_STARTED) == [key]   # only from Offline


def test_every_state_has_a_row():
    assert set(PARTITION_VALID_PREVIOUS) == set(PartitionState)
    assert set(REPLICA_VALID_PREVIOUS) == set(ReplicaState)

"""Kafka's partition and replica state machines, with their transitions as data.

Theory of operation
-------------------
The controller tracks each partition (PartitionStateMachine) and each replica of it
(ReplicaStateMachine) through a few states. Which moves are legal is a table here: for
each state, the states it may be entered from (Kafka's validPreviousStates). The
controller core asks `transition(keys, target)`; the keys whose current state allows the
move go to `target`, the others stay put and are returned as refused, as Kafka logs an
illegal transition and leaves the state alone. `force` sets a state without a check: it is
for loading the model when a controller takes over, where the state is read, not reached.

    partition:  NonExistent -> New -> Online <-> Offline -> NonExistent
    replica:    NonExistent -> New -> Online <-> Offline -> DeletionStarted
                -> DeletionSuccessful -> NonExistent   (DeletionIneligible on a failed delete)
"""
from __future__ import annotations

import enum
from typing import Hashable, Iterable


class PartitionState(enum.Enum):
    NON_EXISTENT = "NonExistentPartition"
    NEW = "NewPartition"
    ONLINE = "OnlinePartition"
    OFFLINE = "OfflinePartition"


class ReplicaState(enum.Enum):
    NON_EXISTENT = "NonExistentReplica"
    NEW = "NewReplica"
    ONLINE = "OnlineReplica"
    OFFLINE = "OfflineReplica"
    DELETION_STARTED = "ReplicaDeletionStarted"
    DELETION_SUCCESSFUL = "ReplicaDeletionSuccessful"
    DELETION_INELIGIBLE = "ReplicaDeletionIneligible"


P = PartitionState
R = ReplicaState

PARTITION_VALID_PREVIOUS: dict[PartitionState, frozenset[PartitionState]] = {
    P.NEW: frozenset({P.NON_EXISTENT}),
    P.ONLINE: frozenset({P.NEW, P.ONLINE, P.OFFLINE}),
    P.OFFLINE: frozenset({P.NEW, P.ONLINE, P.OFFLINE}),
    P.NON_EXISTENT: frozenset({P.OFFLINE}),
}

REPLICA_VALID_PREVIOUS: dict[ReplicaState, frozenset[ReplicaState]] = {
    R.NEW: frozenset({R.NON_EXISTENT}),
    R.ONLINE: frozenset({R.NEW, R.ONLINE, R.OFFLINE, R.DELETION_INELIGIBLE}),
    R.OFFLINE: frozenset({R.NEW, R.ONLINE, R.OFFLINE, R.DELETION_INELIGIBLE}),
    R.DELETION_STARTED: frozenset({R.OFFLINE}),
    R.DELETION_SUCCESSFUL: frozenset({R.DELETION_STARTED}),
    R.DELETION_INELIGIBLE: frozenset({R.DELETION_STARTED}),
    R.NON_EXISTENT: frozenset({R.DELETION_SUCCESSFUL}),
}


class _StateTable:
    """Current state per key; moves checked against a table of valid previous states."""

    def __init__(self, valid_previous: dict, initial):
        self._valid_previous = valid_previous
        self._initial = initial
        self._states: dict[Hashable, object] = {}

    def get(self, key: Hashable):
        return self._states.get(key, self._initial)

    def force(self, key: Hashable, state) -> None:
        self._states[key] = state

    def forget(self, key: Hashable) -> None:
        self._states.pop(key, None)

    def transition(self, keys: Iterable[Hashable], target) -> list[Hashable]:
        """Move each key to `target` where legal; return the refused keys (state kept)."""
        refused = []
        for key in keys:
            if self.get(key) in self._valid_previous[target]:
                self._states[key] = target
            else:
                refused.append(key)
        return refused

    def in_state(self, state) -> list[Hashable]:
        return sorted(k for k, s in self._states.items() if s == state)


class PartitionStates(_StateTable):
    def __init__(self):
        super().__init__(PARTITION_VALID_PREVIOUS, PartitionState.NON_EXISTENT)


class ReplicaStates(_StateTable):
    def __init__(self):
        super().__init__(REPLICA_VALID_PREVIOUS, ReplicaState.NON_EXISTENT)

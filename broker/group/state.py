"""Consumer group membership: Kafka's classic group protocol as a pure state machine.

Theory of operation
-------------------
A group moves through five states (Kafka's GroupMetadata/ClassicGroupState):

    Empty --join--> PreparingRebalance --all joined | rebalance timeout--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup written--> Stable
    Stable | CompletingRebalance --join (new member, new metadata, the leader), leave,
                                   session expiry--> PreparingRebalance
    PreparingRebalance --every member gone--> Empty;   any --deleted | unloaded--> Dead

`VALID_PREVIOUS_STATES` is that table as data; `_transition` refuses anything else with
InvariantError (a bug, never bad input: bad input gets a Kafka error code first).

`GroupCoordinatorCore` holds every group of one coordinator. It does no I/O, starts no
threads and never reads a clock: each method takes `now_ms` and returns an `Outcome`:

    outcome.response   the answer to send now, or None when the request is parked;
    outcome.token      when parked: the token under which its answer will come later;
    outcome.completed  [Completed(token, response)]: answers to other requests, parked
                       earlier, that this call settled (a request settled within its own
                       call is answered in `response`, never parked);
    outcome.writes     [GroupWrite]: group metadata records to append to the group's
                       `__consumer_offsets` partition.

JoinGroup and SyncGroup complete asynchronously, as in Kafka: a JoinGroup waits until every
member has rejoined (or the rebalance times out), a follower's SyncGroup waits for the
leader's. How a service shell drives the core (one lock around the core):

    with lock:
        outcome = core.join(..., now_ms=clock())
        if outcome.token is not None:
            future = futures[outcome.token] = Future()      # register before unlocking
        resolve(outcome.completed)                           # futures[t].set_result(resp)
        for write in outcome.writes:                         # append, then report back
            append(write.partition, *write.record())         # key, value (None: tombstone)
            resolve(core.write_completed(write.write_id, clock(), error).completed) # and its writes
    reply(outcome.response if outcome.token is None else future.result(timeout=bound))

and a timer thread calls `core.tick(clock())` (at `core.next_deadline_ms()` or every ~100 ms)
and handles its Outcome the same way: that is where session timeouts, rebalance timeouts,
the initial rebalance delay and pending-sync timeouts fire (earliest deadline first, each at
its own time, so a late tick replays what would have happened in time). Every token is completed exactly
once (a request superseded by a newer one from the same member is answered
REBALANCE_IN_PROGRESS; a removed member's parked requests UNKNOWN_MEMBER_ID; a fenced static
member's FENCED_INSTANCE_ID; an unloaded group's NOT_COORDINATOR), so no parked thread leaks.
Send `outcome.response` only after carrying out `outcome.writes`.

Writes: the leader's SyncGroup is answered (and the group becomes Stable) only when the
group record with the new assignment is in the log (`write_completed`); a failed write
sends the members back to rejoin. A static member replaced without a rebalance is answered
after its record is written; if that fails the replacement is undone. A group that becomes
Empty is recorded too. `replay` loads groups from the log on start (Stable with their
members, or Empty); their members must heartbeat within their session timeout.

Rules (Kafka's, looked up in GroupCoordinator / GroupMetadataManager):
- KIP-394: a dynamic member joining without a member id is given one with
  MEMBER_ID_REQUIRED and must rejoin with it; until it does (or its session timeout passes)
  the join phase waits for it.
- KIP-345 static membership: a known group.instance.id joining without a member id replaces
  the old member id (which is fenced: FENCED_INSTANCE_ID from then on, and its parked
  JoinGroup or SyncGroup is answered so). In a Stable group, when the group's protocol choice
  would not change, there is no rebalance: it keeps the generation and its assignment (it gets
  it with SyncGroup). Its metadata is not compared (Kafka's rule): a restarted sticky member's
  always differs, as it owns nothing yet. A new subscription is therefore not seen until the
  client rejoins with its member id (the client does when its assignment names a topic it no
  longer subscribes to) or the group rebalances for another reason. While PreparingRebalance
  the new member id simply joins the next generation; while CompletingRebalance the group
  rebalances again (the leader may be assigning to the old member id). Static members that
  miss a rebalance are not dropped at the rebalance timeout; only their session timeout
  removes them.
- Rebalance triggers: a member joins, leaves, dies (session timeout), rejoins with its member
  id and other metadata (bytes compared, static or not), or the leader rejoins (how a
  consumer leader that sees a partition count change asks for a new assignment: the
  coordinator never reads topic metadata).
- The generation goes up by one each time a join phase completes; the leader is the first
  member to join and is kept while it rejoins in time.
- The protocol (assignor) is chosen by vote among the protocols every member supports; each
  member votes for the first of its own it can; ties go to the first member's preference.
- Errors: UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS, FENCED_INSTANCE_ID,
  INCONSISTENT_GROUP_PROTOCOL, INVALID_SESSION_TIMEOUT (outside group.min/max.session.timeout.ms),
  GROUP_MAX_SIZE_REACHED, COORDINATOR_NOT_AVAILABLE for a Dead group.
- `validate_offset_commit` applies the OffsetCommit/TxnOffsetCommit membership rules (KIP-447).

Group instance ids may be given as "" (the proto default) or None: both mean dynamic.
"""
from __future__ import annotations

import dataclasses
import enum
import itertools
import uuid
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence, Union

from broker.group.records import (OFFSETS_TOPIC_PARTITIONS, GroupMetadataValue, MemberMetadata,
                                  group_metadata_record, partition_for_group)
from eos.errors import ErrorCode, InvariantError

__all__ = ["GroupState", "VALID_PREVIOUS_STATES", "GroupCoordinatorCore", "Outcome", "Completed", "GroupWrite",
           "JoinResponse", "JoinedMember", "SyncResponse", "Reply", "GroupDescription", "MemberDescription",
           "GroupListing", "Group", "Member"]

UNKNOWN_MEMBER_ID = ""
NO_GENERATION = -1
GROUP_MIN_SESSION_TIMEOUT_MS = 6_000          # group.min.session.timeout.ms
GROUP_MAX_SESSION_TIMEOUT_MS = 1_800_000      # group.max.session.timeout.ms
GROUP_INITIAL_REBALANCE_DELAY_MS = 3_000      # group.initial.rebalance.delay.ms
GROUP_MAX_SIZE = 2**31 - 1                    # group.max.size
NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000          # Kafka's fixed timeout for a parked first join
_TIMER_ROUNDS_MAX = 1_000                     # bound on cascading timer firings in one call


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"

    @classmethod
    def from_name(cls, name: str) -> "GroupState":
        for state in cls:
            if state.value.lower() == name.lower():
                return state
        raise ValueError(f"unknown group state {name!r}; known: {', '.join(s.value for s in cls)}")


S = GroupState
VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    S.EMPTY: frozenset({S.PREPARING_REBALANCE}),
    S.PREPARING_REBALANCE: frozenset({S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY}),
    S.COMPLETING_REBALANCE: frozenset({S.PREPARING_REBALANCE}),
    S.STABLE: frozenset({S.COMPLETING_REBALANCE}),
    S.DEAD: frozenset({S.STABLE, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.EMPTY, S.DEAD}),
}


# ---- answers ---------------------------------------------------------------------------------

class JoinedMember(NamedTuple):
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclasses.dataclass(frozen=True)
class JoinResponse:
    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = UNKNOWN_MEMBER_ID
    members: tuple[JoinedMember, ...] = ()      # the leader's only
    skip_assignment: bool = False               # a replaced static leader: keep the current assignment


@dataclasses.dataclass(frozen=True)
class SyncResponse:
    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclasses.dataclass(frozen=True)
class Reply:
    """The answer of Heartbeat, LeaveGroup, DeleteGroups and validate_offset_commit."""

    error: ErrorCode = ErrorCode.NONE
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.NONE


Response = Union[JoinResponse, SyncResponse, Reply]


@dataclasses.dataclass(frozen=True)
class Completed:
    token: int
    response: Union[JoinResponse, SyncResponse]


@dataclasses.dataclass(frozen=True)
class GroupWrite:
    """Append `record()` to `__consumer_offsets`-`partition`, then call write_completed(write_id)."""

    write_id: int
    group_id: str
    partition: int
    value: GroupMetadataValue | None            # None: a tombstone (the group is deleted)

    def record(self) -> tuple[bytes, bytes | None]:
        return group_metadata_record(self.group_id, self.value)


@dataclasses.dataclass
class Outcome:
    response: Response | None = None
    token: int | None = None
    completed: list[Completed] = dataclasses.field(default_factory=list)
    writes: list[GroupWrite] = dataclasses.field(default_factory=list)

    @property
    def parked(self) -> bool:
        return self.token is not None


class MemberDescription(NamedTuple):
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


class GroupDescription(NamedTuple):
    group_id: str
    error: ErrorCode
    state: str
    protocol_type: str
    protocol: str
    generation_id: int
    members: tuple[MemberDescription, ...]


class GroupListing(NamedTuple):
    group_id: str
    protocol_type: str
    state: str


# ---- the group -------------------------------------------------------------------------------

@dataclasses.dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""
    join_token: int | None = None               # a parked JoinGroup
    sync_token: int | None = None               # a parked SyncGroup
    heartbeat_deadline_ms: int | None = None    # None: no expiry pending (the member is in a rebalance)
    is_new: bool = False                        # joined, not yet through a completed join phase

    @property
    def awaiting_join(self) -> bool:
        return self.join_token is not None

    def metadata(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def vote(self, candidates: set[str]) -> str:
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise InvariantError(f"member {self.member_id} supports none of the candidate protocols {sorted(candidates)}")


@dataclasses.dataclass
class Group:
    group_id: str
    state: GroupState
    state_timestamp_ms: int
    previous_state: GroupState = S.DEAD
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation_id: int = 0
    leader_id: str | None = None
    members: dict[str, Member] = dataclasses.field(default_factory=dict)       # in join order
    static_members: dict[str, str] = dataclasses.field(default_factory=dict)   # instance id -> member id
    pending_join_members: dict[str, int] = dataclasses.field(default_factory=dict)  # member id -> expiry ms
    pending_sync_members: set[str] = dataclasses.field(default_factory=set)
    join_deadline_ms: int | None = None
    initial_delay: tuple[int, int] | None = None   # (delay_ms, remaining_ms) while the initial delay runs
    new_member_added: bool = False
    sync_deadline_ms: int | None = None

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def has_all_members_joined(self) -> bool:
        return all(m.awaiting_join for m in self.members.values()) and not self.pending_join_members

    def supported_by_all(self) -> set[str]:
        members = list(self.members.values())
        if not members:
            return set()
        common = {name for name, _ in members[0].protocols}
        for m in members[1:]:
            common &= {name for name, _ in m.protocols}
        return common

    def supports_protocols(self, protocol_type: str, names: Sequence[str]) -> bool:
        if self.state is S.EMPTY:
            return bool(protocol_type) and bool(names)
        if not self.members:
            return protocol_type == self.protocol_type and bool(names)
        return protocol_type == self.protocol_type and bool(self.supported_by_all() & set(names))

    def select_protocol(self) -> str:
        if not self.members:
            raise InvariantError(f"cannot select a protocol for the empty group {self.group_id!r}")
        candidates = self.supported_by_all()
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = m.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        first_preference = [name for name, _ in next(iter(self.members.values())).protocols]
        return max(votes, key=lambda name: (votes[name], -first_preference.index(name)))

    def is_vacant(self) -> bool:
        """Never completed a generation and holds nobody: nothing worth keeping."""
        return (self.state is S.EMPTY and self.generation_id == 0 and not self.members
                and not self.pending_join_members)


def _transition(group: Group, new_state: GroupState, now_ms: int) -> None:
    if group.state not in VALID_PREVIOUS_STATES[new_state]:
        raise InvariantError(f"illegal group transition {group.state.value} -> {new_state.value} "
                             f"for {group.group_id!r}")
    group.previous_state, group.state, group.state_timestamp_ms = group.state, new_state, now_ms


def _default_member_id(client_id: str, group_instance_id: str | None) -> str:
    return f"{group_instance_id if group_instance_id is not None else client_id}-{uuid.uuid4()}"


_APPEND_ERROR_TO_RESPONSE = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.INVALID_FETCH_SIZE: ErrorCode.UNKNOWN_SERVER_ERROR,
}


@dataclasses.dataclass(frozen=True)
class _PendingWrite:
    kind: str                       # "sync" | "empty" | "static" | "delete"
    group_id: str
    generation_id: int
    assignment: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    # for "static": what to restore if the write fails
    instance_id: str | None = None
    old_member_id: str = ""
    new_member_id: str = ""
    old_protocols: tuple = ()
    old_rebalance_timeout_ms: int = 0
    old_session_timeout_ms: int = 0
    token: int | None = None


class _JoinRequest(NamedTuple):
    group_instance_id: str | None
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str
    client_host: str


class _Effects:
    def __init__(self):
        self.completed: list[Completed] = []
        self.writes: list[GroupWrite] = []


class GroupCoordinatorCore:
    """All groups of one coordinator. Methods take `now_ms` and return an Outcome."""

    def __init__(self, *, initial_rebalance_delay_ms: int = GROUP_INITIAL_REBALANCE_DELAY_MS,
                 min_session_timeout_ms: int = GROUP_MIN_SESSION_TIMEOUT_MS,
                 max_session_timeout_ms: int = GROUP_MAX_SESSION_TIMEOUT_MS,
                 max_group_size: int = GROUP_MAX_SIZE,
                 new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS,
                 offsets_partitions: int = OFFSETS_TOPIC_PARTITIONS,
                 member_id_factory: Callable[[str, str | None], str] = _default_member_id):
        if initial_rebalance_delay_ms < 0:
            raise ValueError(f"group.initial.rebalance.delay.ms {initial_rebalance_delay_ms} is negative")
        if not 0 < min_session_timeout_ms <= max_session_timeout_ms:
            raise ValueError(f"group.min.session.timeout.ms {min_session_timeout_ms} must be positive and at most "
                             f"group.max.session.timeout.ms {max_session_timeout_ms}")
        if max_group_size < 1:
            raise ValueError(f"group.max.size {max_group_size} must be at least 1")
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.max_group_size = max_group_size
        self.new_member_join_timeout_ms = new_member_join_timeout_ms
        self.offsets_partitions = offsets_partitions
        self.member_id_factory = member_id_factory
        self.groups: dict[str, Group] = {}
        # rebalances that ended with a new generation of members (Kafka's group coordinator
        # "rebalance-total"), for the broker's metrics
        self.rebalances_completed = 0
        self._tokens = itertools.count(1)
        self._open_tokens: set[int] = set()
        self._write_ids = itertools.count(1)
        self._writes: dict[int, _PendingWrite] = {}

    # ---- tokens, effects -----------------------------------------------------------------------

    def _park(self) -> int:
        token = next(self._tokens)
        self._open_tokens.add(token)
        return token

    def _complete(self, fx: _Effects, token: int | None, response: JoinResponse | SyncResponse) -> None:
        if token is None:
            return
        if token not in self._open_tokens:
            raise InvariantError(f"request token {token} completed twice")
        self._open_tokens.remove(token)
        fx.completed.append(Completed(token, response))

    def _complete_join(self, fx: _Effects, member: Member, response: JoinResponse) -> bool:
        if member.join_token is None:
            return False
        token, member.join_token = member.join_token, None
        self._complete(fx, token, response)
        return True

    def _complete_sync(self, fx: _Effects, member: Member, response: SyncResponse) -> bool:
        if member.sync_token is None:
            return False
        token, member.sync_token = member.sync_token, None
        self._complete(fx, token, response)
        return True

    def _write(self, fx: _Effects, pending: _PendingWrite, value: GroupMetadataValue | None) -> None:
        write_id = next(self._write_ids)
        self._writes[write_id] = pending
        fx.writes.append(GroupWrite(write_id, pending.group_id,
                                    partition_for_group(pending.group_id, self.offsets_partitions), value))

    def _finish(self, fx: _Effects, response: Response | None = None, token: int | None = None) -> Outcome:
        if token is not None:
            for i, done in enumerate(fx.completed):
                if done.token == token:      # settled within this very call: answer at once
                    del fx.completed[i]
                    return Outcome(done.response, None, fx.completed, fx.writes)
        return Outcome(response, token, fx.completed, fx.writes)

    def open_tokens(self) -> set[int]:
        """Tokens of parked requests not yet answered (for the shell's bookkeeping and tests)."""
        return set(self._open_tokens)

    # ---- helpers --------------------------------------------------------------------------------

    @staticmethod
    def _validate_member(group: Group, member_id: str, group_instance_id: str | None) -> Reply | None:
        if group_instance_id is not None:
            existing = group.static_members.get(group_instance_id)
            if existing is None:
                return Reply(ErrorCode.UNKNOWN_MEMBER_ID,
                             f"group.instance.id {group_instance_id!r} is not a member of {group.group_id!r}")
            if existing != member_id:
                return Reply(ErrorCode.FENCED_INSTANCE_ID,
                             f"member {member_id!r} of group.instance.id {group_instance_id!r} is fenced by "
                             f"{existing!r}")
        if member_id not in group.members:
            return Reply(ErrorCode.UNKNOWN_MEMBER_ID, f"member {member_id!r} is not in group {group.group_id!r}")
        return None

    @staticmethod
    def _join_error(error: ErrorCode, message: str, member_id: str = UNKNOWN_MEMBER_ID) -> JoinResponse:
        return JoinResponse(error=error, message=message, member_id=member_id)

    def _join_result(self, group: Group, member_id: str, *, skip_assignment: bool = False,
                     leader: str | None = None) -> JoinResponse:
        is_leader = group.leader_id == member_id
        members = ()
        if is_leader:
            members = tuple(JoinedMember(m.member_id, m.group_instance_id, m.metadata(group.protocol_name))
                            for m in group.members.values())
        return JoinResponse(generation_id=group.generation_id, protocol_type=group.protocol_type,
                            protocol_name=group.protocol_name,
                            leader=(leader if leader is not None else group.leader_id) or "",
                            member_id=member_id, members=members, skip_assignment=skip_assignment and is_leader)

    def _group_value(self, group: Group, assignment: Mapping[str, bytes]) -> GroupMetadataValue:
        return GroupMetadataValue(
            group.protocol_type or "", group.generation_id, group.protocol_name, group.leader_id,
            group.state_timestamp_ms,
            tuple(MemberMetadata(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                                 m.session_timeout_ms, m.metadata(group.protocol_name), assignment.get(m.member_id, b""))
                  for m in group.members.values()))

    def _reschedule_heartbeat(self, member: Member, now_ms: int, timeout_ms: int | None = None) -> None:
        member.heartbeat_deadline_ms = now_ms + (member.session_timeout_ms if timeout_ms is None else timeout_ms)

    def _add(self, group: Group, member: Member) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in group.static_members:
                raise InvariantError(f"static member {member.group_instance_id!r} is already in {group.group_id!r}")
            group.static_members[member.group_instance_id] = member.member_id
        if not group.members:
            group.protocol_type = member.protocol_type
        if group.protocol_type != member.protocol_type:
            raise InvariantError(f"protocol type {member.protocol_type!r} differs from the group's")
        if group.leader_id is None:
            group.leader_id = member.member_id
        group.members[member.member_id] = member
        group.pending_join_members.pop(member.member_id, None)

    def _remove(self, group: Group, member_id: str) -> None:
        member = group.members.pop(member_id, None)
        if member is not None and member.group_instance_id is not None:
            if group.static_members.get(member.group_instance_id) == member_id:
                del group.static_members[member.group_instance_id]
        if group.leader_id == member_id:
            group.leader_id = next(iter(group.members), None)
        group.pending_join_members.pop(member_id, None)
        group.pending_sync_members.discard(member_id)

    def _drop_if_vacant(self, group: Group) -> None:
        if group.is_vacant() and self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]

    # ---- rebalance machinery (Kafka's prepareRebalance / completeJoin) --------------------------

    def _can_rebalance(self, group: Group) -> bool:
        return group.state in VALID_PREVIOUS_STATES[S.PREPARING_REBALANCE]

    def _maybe_prepare_rebalance_or_complete_join(self, group: Group, fx: _Effects, now_ms: int) -> None:
        if self._can_rebalance(group):
            self._prepare_rebalance(group, fx, now_ms)
        else:
            self._maybe_complete_join_phase(group, fx, now_ms)

    def _maybe_complete_join_phase(self, group: Group, fx: _Effects, now_ms: int) -> None:
        # The initial rebalance of a new group completes only when its delay runs out, so that
        # members starting together land in one generation.
        if (group.state is S.PREPARING_REBALANCE and group.has_all_members_joined()
                and group.previous_state is not S.EMPTY):
            self._complete_join_phase(group, fx, now_ms)

    def _prepare_rebalance(self, group: Group, fx: _Effects, now_ms: int) -> None:
        if group.state is S.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_error(group, fx, now_ms, ErrorCode.REBALANCE_IN_PROGRESS,
                                                       "the group is rebalancing; rejoin")
        group.pending_sync_members.clear()
        group.sync_deadline_ms = None
        initial = group.state is S.EMPTY
        _transition(group, S.PREPARING_REBALANCE, now_ms)
        if initial:
            group.new_member_added = False
            delay_ms = self.initial_rebalance_delay_ms
            group.initial_delay = (delay_ms, max(group.rebalance_timeout_ms - delay_ms, 0))
            group.join_deadline_ms = now_ms + delay_ms
        elif group.has_all_members_joined():
            self._complete_join_phase(group, fx, now_ms)
        else:
            group.initial_delay = None
            group.join_deadline_ms = now_ms + group.rebalance_timeout_ms

    def _complete_join_phase(self, group: Group, fx: _Effects, now_ms: int) -> None:
        group.join_deadline_ms = None
        group.initial_delay = None
        # Dynamic members that did not rejoin in time are gone; static ones stay (their session
        # timeout decides), so a slow static restart does not lose its place.
        for member in [m for m in group.members.values() if not m.awaiting_join and m.group_instance_id is None]:
            self._complete_sync(fx, member, SyncResponse(ErrorCode.UNKNOWN_MEMBER_ID, "removed from the group"))
            self._remove(group, member.member_id)
        if group.state is S.DEAD:
            return
        if not self._maybe_elect_new_joined_leader(group) and group.members:
            # Nobody rejoined: wait another rebalance timeout for the session timeouts to clear them.
            group.join_deadline_ms = now_ms + group.rebalance_timeout_ms
            return
        group.generation_id += 1
        if group.members:
            self.rebalances_completed += 1
            group.protocol_name = group.select_protocol()
            _transition(group, S.COMPLETING_REBALANCE, now_ms)
        else:
            group.protocol_name = None
            _transition(group, S.EMPTY, now_ms)
        group.pending_sync_members.clear()
        if group.state is S.EMPTY:
            self._write(fx, _PendingWrite("empty", group.group_id, group.generation_id), self._group_value(group, {}))
            return
        for member in group.members.values():
            self._complete_join(fx, member, self._join_result(group, member.member_id))
            self._reschedule_heartbeat(member, now_ms)
            member.is_new = False
            group.pending_sync_members.add(member.member_id)
        group.sync_deadline_ms = now_ms + group.rebalance_timeout_ms

    @staticmethod
    def _maybe_elect_new_joined_leader(group: Group) -> bool:
        if group.leader_id is None:
            return False
        if group.members[group.leader_id].awaiting_join:
            return True
        for member in group.members.values():
            if member.awaiting_join:
                group.leader_id = member.member_id
                return True
        return False

    def _reset_and_propagate_assignment_error(self, group: Group, fx: _Effects, now_ms: int,
                                              error: ErrorCode, message: str) -> None:
        if group.state is not S.COMPLETING_REBALANCE:
            raise InvariantError(f"group {group.group_id!r} must be CompletingRebalance to reset its assignment")
        for member in group.members.values():
            member.assignment = b""
            if self._complete_sync(fx, member, SyncResponse(error, message)):
                self._reschedule_heartbeat(member, now_ms)

    def _set_and_propagate_assignment(self, group: Group, fx: _Effects, now_ms: int,
                                      assignment: Mapping[str, bytes]) -> None:
        if group.state is not S.COMPLETING_REBALANCE:
            raise InvariantError(f"group {group.group_id!r} must be CompletingRebalance to set its assignment")
        for member in group.members.values():
            member.assignment = assignment.get(member.member_id, b"")
            response = SyncResponse(assignment=member.assignment, protocol_type=group.protocol_type,
                                    protocol_name=group.protocol_name)
            if self._complete_sync(fx, member, response):
                self._reschedule_heartbeat(member, now_ms)

    def _remove_member_and_update_group(self, group: Group, member: Member, fx: _Effects, now_ms: int,
                                        reason: str) -> None:
        self._complete_join(fx, member, self._join_error(ErrorCode.UNKNOWN_MEMBER_ID, reason))
        self._complete_sync(fx, member, SyncResponse(ErrorCode.UNKNOWN_MEMBER_ID, reason))
        self._remove(group, member.member_id)
        if group.state in (S.STABLE, S.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance_or_complete_join(group, fx, now_ms)
        elif group.state is S.PREPARING_REBALANCE and group.has_all_members_joined():
            self._complete_join_phase(group, fx, now_ms)

    # ---- timers ---------------------------------------------------------------------------------

    def _run_timers(self, group: Group, fx: _Effects, now_ms: int) -> None:
        # Bounded work per call: whatever is still due after the bound fires on the next call.
        for _ in range(_TIMER_ROUNDS_MAX):
            if not self._fire_one_timer(group, fx, now_ms):
                break
        self._drop_if_vacant(group)

    def _fire_one_timer(self, group: Group, fx: _Effects, now_ms: int) -> bool:
        """Fire the earliest timer of the group due at `now_ms` (earliest first, so a late tick
        replays what would have happened in time). Returns False when none is due."""
        if group.state is S.DEAD:
            return False
        due: list[tuple[int, int, str]] = []          # (deadline, kind order, key)
        if group.join_deadline_ms is not None and group.join_deadline_ms <= now_ms:
            due.append((group.join_deadline_ms, 0, ""))
        if group.sync_deadline_ms is not None and group.sync_deadline_ms <= now_ms:
            due.append((group.sync_deadline_ms, 1, ""))
        due += [(m.heartbeat_deadline_ms, 2, m.member_id) for m in group.members.values()
                if m.heartbeat_deadline_ms is not None and m.heartbeat_deadline_ms <= now_ms]
        due += [(expiry_ms, 3, member_id) for member_id, expiry_ms in group.pending_join_members.items()
                if expiry_ms <= now_ms]
        if not due:
            return False
        at_ms, kind, key = min(due)
        if kind == 0:
            self._join_deadline(group, fx, at_ms)
        elif kind == 1:
            self._sync_deadline(group, fx, at_ms)
        elif kind == 2:
            member = group.members[key]
            if not member.is_new and (member.awaiting_join or member.sync_token is not None):
                member.heartbeat_deadline_ms = None   # in a rebalance: its heartbeat is not due
            else:
                self._remove_member_and_update_group(
                    group, member, fx, at_ms,
                    f"session timeout of member {key!r} ({member.session_timeout_ms} ms) expired")
        else:
            del group.pending_join_members[key]
            if group.state is S.PREPARING_REBALANCE and group.has_all_members_joined():
                self._complete_join_phase(group, fx, at_ms)
        return True

    def _join_deadline(self, group: Group, fx: _Effects, now_ms: int) -> None:
        if group.state is not S.PREPARING_REBALANCE:
            group.join_deadline_ms = None
            return
        if group.initial_delay is not None:
            delay_ms, remaining_ms = group.initial_delay
            if group.new_member_added and remaining_ms != 0:
                # Someone joined during the delay: wait one more delay, within the rebalance timeout.
                group.new_member_added = False
                next_delay_ms = min(self.initial_rebalance_delay_ms, remaining_ms)
                group.initial_delay = (next_delay_ms, max(remaining_ms - delay_ms, 0))
                group.join_deadline_ms = now_ms + next_delay_ms
                return
        self._complete_join_phase(group, fx, now_ms)

    def _sync_deadline(self, group: Group, fx: _Effects, now_ms: int) -> None:
        group.sync_deadline_ms = None
        missing = [group.members[m] for m in sorted(group.pending_sync_members) if m in group.members]
        if group.state in (S.COMPLETING_REBALANCE, S.STABLE) and missing:
            for member in missing:
                self._complete_sync(fx, member, SyncResponse(ErrorCode.UNKNOWN_MEMBER_ID, "no SyncGroup in time"))
                self._remove(group, member.member_id)
            self._prepare_rebalance(group, fx, now_ms)

    def tick(self, now_ms: int) -> Outcome:
        """Fire every timer due at `now_ms`: session and rebalance timeouts, the initial delay."""
        fx = _Effects()
        for group in list(self.groups.values()):
            self._run_timers(group, fx, now_ms)
        return self._finish(fx)

    def next_deadline_ms(self) -> int | None:
        """The earliest time `tick` has something to do (None: nothing scheduled)."""
        deadlines = []
        for group in self.groups.values():
            deadlines += [d for d in (group.join_deadline_ms, group.sync_deadline_ms) if d is not None]
            deadlines += [m.heartbeat_deadline_ms for m in group.members.values() if m.heartbeat_deadline_ms is not None]
            deadlines += list(group.pending_join_members.values())
        return min(deadlines, default=None)

    # ---- JoinGroup ------------------------------------------------------------------------------

    def join(self, group_id: str, member_id: str, group_instance_id: str | None, protocol_type: str,
             protocols: Iterable[tuple[str, bytes]], session_timeout_ms: int, rebalance_timeout_ms: int,
             now_ms: int, *, client_id: str = "", client_host: str = "") -> Outcome:
        fx = _Effects()
        group_instance_id = group_instance_id or None
        protocols = tuple((str(name), bytes(metadata)) for name, metadata in protocols)
        if not group_id:
            return self._finish(fx, self._join_error(ErrorCode.INVALID_GROUP_ID, "the group id is empty", member_id))
        if not self.min_session_timeout_ms <= session_timeout_ms <= self.max_session_timeout_ms:
            return self._finish(fx, self._join_error(
                ErrorCode.INVALID_SESSION_TIMEOUT,
                f"session.timeout.ms {session_timeout_ms} is outside the broker's "
                f"{self.min_session_timeout_ms}..{self.max_session_timeout_ms}", member_id))
        if rebalance_timeout_ms <= 0:
            return self._finish(fx, self._join_error(
                ErrorCode.INVALID_REQUEST, f"rebalance timeout (max.poll.interval.ms) {rebalance_timeout_ms} "
                                           f"must be positive", member_id))
        if len({name for name, _ in protocols}) != len(protocols):
            return self._finish(fx, self._join_error(ErrorCode.INVALID_REQUEST, "a protocol is named twice", member_id))
        is_unknown = member_id == UNKNOWN_MEMBER_ID
        group = self.groups.get(group_id)
        if group is None:
            if not is_unknown:
                return self._finish(fx, self._join_error(ErrorCode.UNKNOWN_MEMBER_ID,
                                                         f"group {group_id!r} does not exist", member_id))
            group = self.groups[group_id] = Group(group_id, S.EMPTY, now_ms)
        self._run_timers(group, fx, now_ms)
        group = self.groups.setdefault(group_id, group)   # the timers may have dropped a vacant group
        request = _JoinRequest(group_instance_id, protocol_type, protocols, session_timeout_ms, rebalance_timeout_ms,
                               client_id, client_host)
        if not self._accept_joining_member(group, member_id):
            member = group.members.get(member_id)
            if member is not None:
                self._remove_member_and_update_group(group, member, fx, now_ms, "the group is over group.max.size")
            response: Response | None = self._join_error(
                ErrorCode.GROUP_MAX_SIZE_REACHED, f"group {group_id!r} has reached group.max.size {self.max_group_size}")
            token = None
        elif is_unknown:
            response, token = self._join_new_member(group, request, fx, now_ms)
        else:
            response, token = self._join_existing_member(group, member_id, request, fx, now_ms)
        self._run_timers(group, fx, now_ms)
        return self._finish(fx, response, token)

    def _accept_joining_member(self, group: Group, member_id: str) -> bool:
        if group.state in (S.EMPTY, S.DEAD):
            return True
        if group.state is S.PREPARING_REBALANCE:
            existing = group.members.get(member_id)
            awaiting = sum(1 for m in group.members.values() if m.awaiting_join)
            return (existing is not None and existing.awaiting_join) or awaiting < self.max_group_size
        return member_id in group.members or len(group.members) < self.max_group_size

    def _join_new_member(self, group: Group, request: _JoinRequest, fx: _Effects, now_ms: int):
        group_instance_id, protocols = request.group_instance_id, request.protocols
        if group.state is S.DEAD:
            return self._join_error(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"group {group.group_id!r} is being removed"), None
        if not group.supports_protocols(request.protocol_type, [name for name, _ in protocols]):
            return self._join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                                    self._inconsistency(group, request.protocol_type, protocols)), None
        new_member_id = self.member_id_factory(request.client_id, group_instance_id)
        if group_instance_id is not None:
            existing = group.static_members.get(group_instance_id)
            if existing is not None:
                return self._update_static_member(group, existing, new_member_id, request, fx, now_ms)
            return self._add_member_and_rebalance(group, new_member_id, request, fx, now_ms)
        # KIP-394: hand out the id and let the member come back with it.
        group.pending_join_members[new_member_id] = now_ms + request.session_timeout_ms
        return self._join_error(ErrorCode.MEMBER_ID_REQUIRED, "rejoin with the member id given", new_member_id), None

    @staticmethod
    def _inconsistency(group: Group, protocol_type: str, protocols) -> str:
        if not protocol_type or not protocols:
            return "the join names no protocol type or no protocols"
        if group.protocol_type is not None and protocol_type != group.protocol_type:
            return f"protocol type {protocol_type!r} differs from the group's {group.protocol_type!r}"
        return (f"none of the protocols {[n for n, _ in protocols]} is supported by every member "
                f"(common: {sorted(group.supported_by_all())})")

    def _join_existing_member(self, group: Group, member_id: str, request: _JoinRequest, fx: _Effects, now_ms: int):
        group_instance_id, protocol_type, protocols = request.group_instance_id, request.protocol_type, request.protocols
        if group.state is S.DEAD:
            return self._join_error(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"group {group.group_id!r} is being removed",
                                    member_id), None
        if not group.supports_protocols(protocol_type, [name for name, _ in protocols]):
            return self._join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                                    self._inconsistency(group, protocol_type, protocols), member_id), None
        if member_id in group.pending_join_members:
            if group_instance_id is not None:
                return self._join_error(ErrorCode.INVALID_REQUEST,
                                        f"member id {member_id!r} was given to a dynamic member; it cannot join "
                                        f"with group.instance.id {group_instance_id!r}", member_id), None
            return self._add_member_and_rebalance(group, member_id, request, fx, now_ms)
        refusal = self._validate_member(group, member_id, group_instance_id)
        if refusal is not None:
            return self._join_error(refusal.error, refusal.message, member_id), None
        member = group.members[member_id]
        if group.state is S.PREPARING_REBALANCE:
            return self._update_member_and_rebalance(group, member, request, fx, now_ms)
        if group.state is S.COMPLETING_REBALANCE:
            if member.protocols == protocols:
                # A retry of a join whose answer was lost: the same answer again.
                return self._join_result(group, member_id), None
            return self._update_member_and_rebalance(group, member, request, fx, now_ms)
        if group.state is S.STABLE:
            if group.leader_id == member_id or member.protocols != protocols:
                return self._update_member_and_rebalance(group, member, request, fx, now_ms)
            return self._join_result(group, member_id), None
        return self._join_error(ErrorCode.UNKNOWN_MEMBER_ID, f"group {group.group_id!r} is empty; rejoin",
                                member_id), None

    def _park_join(self, member: Member, fx: _Effects) -> int:
        self._complete_join(fx, member, self._join_error(ErrorCode.REBALANCE_IN_PROGRESS,
                                                         "superseded by a newer JoinGroup of the same member",
                                                         member.member_id))
        member.join_token = self._park()
        return member.join_token

    def _add_member_and_rebalance(self, group: Group, member_id: str, request: _JoinRequest, fx: _Effects,
                                  now_ms: int):
        member = Member(member_id, request.group_instance_id, request.client_id, request.client_host,
                        request.rebalance_timeout_ms, request.session_timeout_ms, request.protocol_type,
                        request.protocols, is_new=True)
        if group.state is S.PREPARING_REBALANCE and group.previous_state is S.EMPTY:
            group.new_member_added = True
        self._add(group, member)
        token = self._park_join(member, fx)
        # A parked first join cannot heartbeat; if the client vanished it must not hold the
        # group forever, so new members expire after the (long) new-member join timeout.
        self._reschedule_heartbeat(member, now_ms, self.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance_or_complete_join(group, fx, now_ms)
        return None, token

    def _update_member(self, member: Member, protocols, rebalance_timeout_ms: int, session_timeout_ms: int) -> None:
        member.protocols = protocols
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms

    def _update_member_and_rebalance(self, group: Group, member: Member, request: _JoinRequest, fx: _Effects,
                                     now_ms: int):
        self._update_member(member, request.protocols, request.rebalance_timeout_ms, request.session_timeout_ms)
        token = self._park_join(member, fx)
        self._maybe_prepare_rebalance_or_complete_join(group, fx, now_ms)
        return None, token

    def _replace_static_member(self, group: Group, instance_id: str, old_member_id: str, new_member_id: str,
                               fx: _Effects) -> Member:
        old = group.members.pop(old_member_id)
        fenced = f"group.instance.id {instance_id!r} rejoined as {new_member_id!r}"
        self._complete_join(fx, old, self._join_error(ErrorCode.FENCED_INSTANCE_ID, fenced, old_member_id))
        self._complete_sync(fx, old, SyncResponse(ErrorCode.FENCED_INSTANCE_ID, fenced))
        new = dataclasses.replace(old, member_id=new_member_id, join_token=None, sync_token=None)
        group.members[new_member_id] = new
        if group.leader_id == old_member_id:
            group.leader_id = new_member_id
        if old_member_id in group.pending_sync_members:
            group.pending_sync_members.discard(old_member_id)
            group.pending_sync_members.add(new_member_id)
        group.static_members[instance_id] = new_member_id
        return new

    def _update_static_member(self, group: Group, old_member_id: str, new_member_id: str, request: _JoinRequest,
                              fx: _Effects, now_ms: int):
        instance_id, protocols = request.group_instance_id, request.protocols
        old = group.members[old_member_id]
        old_settings = (old.protocols, old.rebalance_timeout_ms, old.session_timeout_ms)
        new = self._replace_static_member(group, instance_id, old_member_id, new_member_id, fx)
        self._reschedule_heartbeat(new, now_ms)
        self._update_member(new, protocols, request.rebalance_timeout_ms, request.session_timeout_ms)
        token = self._park_join(new, fx)
        if group.state is S.STABLE:
            if group.select_protocol() == group.protocol_name:
                # Kafka's rule: only a change of the group's protocol choice rebalances. The
                # metadata bytes are not compared: a restarted member's differ as a rule (the
                # sticky subscription carries the partitions owned and their generation, which
                # a fresh process does not have). Keep the generation, record the new member
                # id and metadata, and answer once that is in the log.
                pending = _PendingWrite("static", group.group_id, group.generation_id, instance_id=instance_id,
                                        old_member_id=old_member_id, new_member_id=new_member_id,
                                        old_protocols=old_settings[0], old_rebalance_timeout_ms=old_settings[1],
                                        old_session_timeout_ms=old_settings[2], token=token)
                assignment = {m.member_id: m.assignment for m in group.members.values()}
                self._write(fx, pending, self._group_value(group, assignment))
                return None, token
            self._maybe_prepare_rebalance_or_complete_join(group, fx, now_ms)
        elif group.state is S.COMPLETING_REBALANCE:
            # The leader may already be assigning to the old member id: start over.
            self._prepare_rebalance(group, fx, now_ms)
        elif group.state in (S.EMPTY, S.DEAD):
            raise InvariantError(f"static member {instance_id!r} known to group {group.group_id!r} in state "
                                 f"{group.state.value}")
        else:
            self._maybe_complete_join_phase(group, fx, now_ms)
        return None, token

    # ---- SyncGroup ------------------------------------------------------------------------------

    def sync(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
             assignments: Mapping[str, bytes], now_ms: int) -> Outcome:
        fx = _Effects()
        group_instance_id = group_instance_id or None
        group = self.groups.get(group_id)
        if group is None:
            return self._finish(fx, SyncResponse(ErrorCode.UNKNOWN_MEMBER_ID, f"group {group_id!r} does not exist"))
        self._run_timers(group, fx, now_ms)
        response, token = self._sync(group, generation_id, member_id, group_instance_id, assignments, fx, now_ms)
        return self._finish(fx, response, token)

    def _sync(self, group: Group, generation_id: int, member_id: str, group_instance_id: str | None,
              assignments: Mapping[str, bytes], fx: _Effects, now_ms: int):
        if group.state is S.DEAD:
            return SyncResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"group {group.group_id!r} is being removed"), None
        refusal = self._validate_member(group, member_id, group_instance_id)
        if refusal is not None:
            return SyncResponse(refusal.error, refusal.message), None
        if generation_id != group.generation_id:
            return SyncResponse(ErrorCode.ILLEGAL_GENERATION,
                                f"generation {generation_id} is not the group's {group.generation_id}"), None
        if group.state is S.EMPTY:
            return SyncResponse(ErrorCode.UNKNOWN_MEMBER_ID, f"group {group.group_id!r} is empty"), None
        if group.state is S.PREPARING_REBALANCE:
            return SyncResponse(ErrorCode.REBALANCE_IN_PROGRESS, "the group is rebalancing; rejoin"), None
        member = group.members[member_id]
        group.pending_sync_members.discard(member_id)
        if not group.pending_sync_members:
            group.sync_deadline_ms = None
        if group.state is S.STABLE:
            return SyncResponse(assignment=member.assignment, protocol_type=group.protocol_type,
                                protocol_name=group.protocol_name), None
        # CompletingRebalance: wait for the leader's assignment to be written.
        self._complete_sync(fx, member, SyncResponse(ErrorCode.REBALANCE_IN_PROGRESS,
                                                     "superseded by a newer SyncGroup of the same member"))
        member.sync_token = token = self._park()
        if group.leader_id == member_id:
            # Members the leader left out get an empty assignment; ids not in the group are ignored.
            assignment = {m: bytes(assignments.get(m, b"")) for m in group.members}
            self._write(fx, _PendingWrite("sync", group.group_id, group.generation_id, assignment),
                        self._group_value(group, assignment))
        return None, token

    # ---- the write protocol ---------------------------------------------------------------------

    def write_completed(self, write_id: int, now_ms: int, error: ErrorCode = ErrorCode.NONE) -> Outcome:
        """The append of GroupWrite `write_id` finished (error NONE: it is in the log)."""
        fx = _Effects()
        error = ErrorCode(error)
        pending = self._writes.pop(write_id, None)
        if pending is None:
            raise InvariantError(f"group write {write_id} is not pending")
        group = self.groups.get(pending.group_id)
        response_error = _APPEND_ERROR_TO_RESPONSE.get(error, error)
        if pending.kind == "sync":
            # The group may have moved on while the record was written: act only if it has not.
            if group is not None and group.state is S.COMPLETING_REBALANCE and group.generation_id == pending.generation_id:
                if error is ErrorCode.NONE:
                    self._set_and_propagate_assignment(group, fx, now_ms, pending.assignment)
                    _transition(group, S.STABLE, now_ms)
                else:
                    self._reset_and_propagate_assignment_error(group, fx, now_ms, response_error,
                                                               f"storing the assignment failed: {error.name}")
                    self._maybe_prepare_rebalance_or_complete_join(group, fx, now_ms)
        elif pending.kind == "static":
            self._static_write_completed(group, pending, fx, now_ms, error, response_error)
        # "empty" and "delete" need nothing more: the log now agrees with memory (or, after a
        # failure, an older record of a group with no live members stays, which is harmless).
        if group is not None:
            self._run_timers(group, fx, now_ms)
        return self._finish(fx)

    def _static_write_completed(self, group: Group | None, pending: _PendingWrite, fx: _Effects, now_ms: int,
                                error: ErrorCode, response_error: ErrorCode) -> None:
        member = group.members.get(pending.new_member_id) if group is not None else None
        still_waiting = member is not None and member.join_token == pending.token
        if error is ErrorCode.NONE:
            if still_waiting:
                self._complete_join(fx, member, self._join_result(group, member.member_id, skip_assignment=True))
            return
        if not still_waiting:
            return
        token, member.join_token = member.join_token, None
        if group.static_members.get(pending.instance_id) == pending.new_member_id and group.state is S.STABLE:
            self._update_member(member, pending.old_protocols, pending.old_rebalance_timeout_ms,
                                pending.old_session_timeout_ms)
            restored = self._replace_static_member(group, pending.instance_id, pending.new_member_id,
                                                   pending.old_member_id, fx)
            self._reschedule_heartbeat(restored, now_ms)
        self._complete(fx, token, self._join_error(response_error, f"recording the rejoin failed: {error.name}"))

    # ---- Heartbeat, LeaveGroup, DeleteGroups ----------------------------------------------------

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                  now_ms: int) -> Outcome:
        fx = _Effects()
        group_instance_id = group_instance_id or None
        group = self.groups.get(group_id)
        if group is None:
            return self._finish(fx, Reply(ErrorCode.UNKNOWN_MEMBER_ID, f"group {group_id!r} does not exist"))
        self._run_timers(group, fx, now_ms)
        if group.state is S.DEAD:
            return self._finish(fx, Reply(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"group {group_id!r} is being removed"))
        refusal = self._validate_member(group, member_id, group_instance_id)
        if refusal is not None:
            return self._finish(fx, refusal)
        if generation_id != group.generation_id:
            return self._finish(fx, Reply(ErrorCode.ILLEGAL_GENERATION,
                                          f"generation {generation_id} is not the group's {group.generation_id}"))
        if group.state is S.EMPTY:
            return self._finish(fx, Reply(ErrorCode.UNKNOWN_MEMBER_ID, f"group {group_id!r} is empty"))
        member = group.members[member_id]
        self._reschedule_heartbeat(member, now_ms)
        if group.state is S.PREPARING_REBALANCE:
            return self._finish(fx, Reply(ErrorCode.REBALANCE_IN_PROGRESS, "the group is rebalancing; rejoin"))
        return self._finish(fx, Reply())

    def leave(self, group_id: str, member_id: str, group_instance_id: str | None, now_ms: int) -> Outcome:
        fx = _Effects()
        group_instance_id = group_instance_id or None
        group = self.groups.get(group_id)
        if group is None:
            return self._finish(fx, Reply(ErrorCode.UNKNOWN_MEMBER_ID, f"group {group_id!r} does not exist"))
        self._run_timers(group, fx, now_ms)
        if group.state is S.DEAD:
            return self._finish(fx, Reply(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"group {group_id!r} is being removed"))
        if member_id == UNKNOWN_MEMBER_ID:
            # An administrator removing a static member by its instance id.
            current = group.static_members.get(group_instance_id) if group_instance_id is not None else None
            if current is None:
                return self._finish(fx, Reply(ErrorCode.UNKNOWN_MEMBER_ID,
                                              f"no member of {group_id!r} has group.instance.id {group_instance_id!r}"))
            member_id = current
        elif member_id in group.pending_join_members:
            del group.pending_join_members[member_id]
            if group.state is S.PREPARING_REBALANCE and group.has_all_members_joined():
                self._complete_join_phase(group, fx, now_ms)
            self._run_timers(group, fx, now_ms)
            return self._finish(fx, Reply())
        else:
            refusal = self._validate_member(group, member_id, group_instance_id)
            if refusal is not None:
                return self._finish(fx, refusal)
        self._remove_member_and_update_group(group, group.members[member_id], fx, now_ms,
                                             f"member {member_id!r} left the group")
        self._run_timers(group, fx, now_ms)
        return self._finish(fx, Reply())

    def delete_group(self, group_id: str, now_ms: int) -> Outcome:
        """DeleteGroups: only an Empty group; writes its tombstone (delete its offsets too)."""
        fx = _Effects()
        group = self.groups.get(group_id)
        if group is None or group.state is S.DEAD:
            return self._finish(fx, Reply(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group_id!r} does not exist"))
        self._run_timers(group, fx, now_ms)
        if group.state is not S.EMPTY:
            return self._finish(fx, Reply(ErrorCode.NON_EMPTY_GROUP,
                                          f"group {group_id!r} is {group.state.value}; only an Empty group can be deleted"))
        _transition(group, S.DEAD, now_ms)
        del self.groups[group_id]
        self._write(fx, _PendingWrite("delete", group_id, group.generation_id), None)
        return self._finish(fx, Reply())

    def unload_partition(self, partition: int, now_ms: int) -> Outcome:
        """This coordinator no longer owns `__consumer_offsets`-`partition`: answer every parked
        request of its groups NOT_COORDINATOR and forget them."""
        fx = _Effects()
        for group in [g for g in self.groups.values()
                      if partition_for_group(g.group_id, self.offsets_partitions) == partition]:
            for member in group.members.values():
                self._complete_join(fx, member, self._join_error(ErrorCode.NOT_COORDINATOR, "the coordinator moved",
                                                                 member.member_id))
                self._complete_sync(fx, member, SyncResponse(ErrorCode.NOT_COORDINATOR, "the coordinator moved"))
            _transition(group, S.DEAD, now_ms)
            del self.groups[group.group_id]
        # Writes still in flight find no group when they complete and change nothing.
        return self._finish(fx)

    # ---- offsets --------------------------------------------------------------------------------

    def validate_offset_commit(self, group_id: str, generation_id: int, member_id: str,
                               group_instance_id: str | None, *, transactional: bool = False) -> Reply:
        """May this OffsetCommit (or TxnOffsetCommit, KIP-447) commit for the group? Changes nothing.
        A group that does not exist behaves as an Empty group without members."""
        group_instance_id = group_instance_id or None
        group = self.groups.get(group_id) or Group(group_id, S.EMPTY, 0)
        if group.state is S.DEAD:
            return Reply(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"group {group_id!r} is being removed")
        if generation_id < 0 and group.state is S.EMPTY:
            return Reply()    # a commit outside group management (a "simple" consumer or an admin)
        if generation_id >= 0 or member_id or group_instance_id is not None:
            refusal = self._validate_member(group, member_id, group_instance_id)
            if refusal is not None:
                return refusal
            if generation_id != group.generation_id:
                return Reply(ErrorCode.ILLEGAL_GENERATION,
                             f"generation {generation_id} of member {member_id!r} is not the group's "
                             f"{group.generation_id}")
        elif not transactional and group.state is not S.EMPTY:
            return Reply(ErrorCode.UNKNOWN_MEMBER_ID,
                         f"group {group_id!r} has members; a commit without member id and generation is refused")
        if not transactional and group.state is S.COMPLETING_REBALANCE:
            return Reply(ErrorCode.REBALANCE_IN_PROGRESS, "the group is completing a rebalance; commit after SyncGroup")
        return Reply()

    # ---- loading --------------------------------------------------------------------------------

    def replay(self, group_id: str, value: GroupMetadataValue | None, now_ms: int) -> None:
        """Load a group from its `__consumer_offsets` record (None: a tombstone, the group is gone).
        A group with members comes back Stable and its members' sessions start at `now_ms`."""
        old = self.groups.pop(group_id, None)
        if old is not None and (old.pending_join_members or any(m.join_token or m.sync_token for m in old.members.values())):
            raise InvariantError(f"replay of group {group_id!r} over live requests")
        if value is None:
            return
        state = S.STABLE if value.members else S.EMPTY
        group = Group(group_id, state, value.current_state_timestamp_ms if value.current_state_timestamp_ms >= 0 else now_ms,
                      protocol_type=value.protocol_type or None, protocol_name=value.protocol,
                      generation_id=value.generation_id)
        for m in value.members:
            member = Member(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                            m.session_timeout_ms, value.protocol_type, ((value.protocol or "", m.subscription),),
                            assignment=m.assignment)
            group.members[m.member_id] = member
            if m.group_instance_id is not None:
                group.static_members[m.group_instance_id] = m.member_id
            self._reschedule_heartbeat(member, now_ms)
        if value.members:
            group.leader_id = value.leader if value.leader in group.members else next(iter(group.members))
        self.groups[group_id] = group

    # ---- reads ----------------------------------------------------------------------------------

    def describe(self, group_id: str) -> GroupDescription:
        group = self.groups.get(group_id)
        if group is None:
            return GroupDescription(group_id, ErrorCode.GROUP_ID_NOT_FOUND, S.DEAD.value, "", "", NO_GENERATION, ())
        stable = group.state is S.STABLE
        members = tuple(MemberDescription(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                          m.metadata(group.protocol_name) if stable else b"",
                                          m.assignment if stable else b"")
                        for m in group.members.values())
        return GroupDescription(group_id, ErrorCode.NONE, group.state.value, group.protocol_type or "",
                                (group.protocol_name or "") if stable else "", group.generation_id, members)

    def list(self, states: Iterable[str | GroupState] = ()) -> list[GroupListing]:
        wanted = {s if isinstance(s, GroupState) else GroupState.from_name(s) for s in states}
        return [GroupListing(g.group_id, g.protocol_type or "", g.state.value)
                for g in sorted(self.groups.values(), key=lambda g: g.group_id)
                if not wanted or g.state in wanted]

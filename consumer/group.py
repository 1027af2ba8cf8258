"""Consumer groups, the member's side: Kafka's classic group protocol (JoinGroup, SyncGroup,
Heartbeat, LeaveGroup) and, through consumer/offsets.py, committed offsets (OffsetCommit, OffsetFetch).

Theory of operation
-------------------
`ConsumerCoordinator` is the member's half of the protocol whose other half is
`broker/group`. Like Kafka's ConsumerCoordinator it is driven from two threads:

- The application's thread, inside `Consumer.poll()` (`poll()` here). It finds the group's
  coordinator, starts a rebalance when one is needed (commit if auto-commit is on; eager
  protocol: `on_partitions_revoked` with everything owned, then JoinGroup), advances it as
  its RPCs finish (JoinGroup; the leader assigns with the chosen assignor; SyncGroup; the
  new assignment goes to the fetcher, then `on_partitions_assigned`), commits automatically
  every auto.commit.interval.ms, runs the callbacks of asynchronous commits, and every
  metadata.max.age.ms looks at the topics: a pattern subscription that now matches other
  topics, or (leader only) a topic of the group whose partition count differs from the one
  the assignment was made with, asks for a rejoin. JoinGroup and SyncGroup travel as gRPC
  futures, so `poll(timeout_ms)` never blocks longer than its timeout on a rebalance; the
  next poll picks the answer up. The fetcher and the listener are only ever touched here.
- The heartbeat thread. While the member has a generation (SYNCING or STABLE) it sends a
  Heartbeat every heartbeat.interval.ms. REBALANCE_IN_PROGRESS asks for a rejoin;
  ILLEGAL_GENERATION and UNKNOWN_MEMBER_ID drop the generation (the partitions are lost);
  FENCED_INSTANCE_ID is fatal (the next poll raises it). It also watches the application:
  when poll() has not been called for max.poll.interval.ms the member leaves the group (a
  dynamic member sends LeaveGroup), so its partitions go to members that still work; the
  next poll rejoins.

Member state (`_lock` guards it and everything the two threads share; no RPC is made while
holding it):

    UNJOINED --poll--> JOINING --JoinGroup ok--> SYNCING --SyncGroup ok--> STABLE
    STABLE --rejoin asked (heartbeat, metadata, subscribe)--> (poll revokes) JOINING
    SYNCING | STABLE --ILLEGAL_GENERATION | UNKNOWN_MEMBER_ID | poll timeout--> UNJOINED

A member whose generation is dropped (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, poll timeout)
has lost its partitions: the next poll calls `on_partitions_lost` (or, when the listener has
none, `on_partitions_revoked`, as Kafka's default does) and commits nothing. A
REBALANCE_IN_PROGRESS answer to JoinGroup or SyncGroup only asks for another join (Kafka's
rule): the generation, and a cooperative member's partitions, stay.

Cooperative protocol (KIP-429; every configured assignor supports it, i.e. only
"cooperative-sticky", see `consumer.assignors.rebalance_protocol`): a rebalance does not
stop the member. Before rejoining it revokes only the partitions of topics it no longer
subscribes to; it keeps fetching the rest while JOINING and SYNCING (`ready()` stays true
while its generation is valid) and claims them in its subscription. After SyncGroup
(`incremental_change`) it commits the positions of the partitions it lost (auto-commit),
calls `on_partitions_revoked(lost ones)` if there are any and then rejoins at once, so that
the coordinator starts the second rebalance in which the leader hands them on; the
assignment goes to the fetcher (kept partitions keep their positions) and
`on_partitions_assigned(newly added)` is called, as Kafka's, even when nothing was added.

Subscription metadata (Kafka's ConsumerProtocol, consumer/assignors.py): the subscribed
topics and, for the sticky assignor, the partitions owned in the last generation with
that generation's id; for cooperative-sticky, the partitions owned now under the
cooperative protocol and none under the eager one (they were all given up, so none is in
transfer: Kafka's). (The eager protocol revokes everything before rejoining; Kafka's
eager sticky assignor therefore carries the previous assignment in its user data, ours
reads it from owned_partitions.) A restarted static member's sticky metadata therefore
differs from what it sent before (it owns nothing yet); that does not matter: the
coordinator gives a restarted static member its old assignment back without a rebalance
unless the group's protocol choice changes (Kafka's rule), whatever the bytes.

Static membership (group.instance.id): close() and a missed poll interval do not send
LeaveGroup, so a member restarted within session.timeout.ms keeps its partitions.
FENCED_INSTANCE_ID (another process took over the instance id) is fatal.

Offsets: the coordinator's `OffsetCommitter` commits and fetches them (consumer/offsets.py).
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import re
import threading
from typing import Callable, Iterable, Mapping, NamedTuple

import grpc

from consumer.assignors import (
    CONSUMER_PROTOCOL_TYPE,
    DEFAULT_GENERATION,
    Assignment,
    RebalanceProtocol,
    Subscription,
    assignor_for,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    incremental_change,
    partitions_not_subscribed,
    rebalance_protocol,
)
# OffsetAndMetadata, CommitFailedError: re-exported (consumer/__init__.py, consumer.py and tests import them from here)
from consumer.offsets import CommitFailedError, MemberAccess, OffsetAndMetadata, OffsetCommitter
from eos import net
from eos.client_metrics import ConsumerMetrics
from eos.errors import EosError, ErrorCode, InvariantError, Reaction, error_for, reaction_for
from eos.types import TopicPartition
from eos.v1 import group_pb2, group_pb2_grpc

log = logging.getLogger("eos.consumer.group")

__all__ = ["ConsumerCoordinator", "ConsumerGroupMetadata", "OffsetAndMetadata", "CommitFailedError",
           "FencedInstanceIdError", "MemberState", "CLIENT_ID_METADATA_KEY", "NO_GENERATION", "NO_MEMBER_ID"]

NO_GENERATION = -1
NO_MEMBER_ID = ""
CLIENT_ID_METADATA_KEY = net.CLIENT_ID_METADATA_KEY    # re-exported: tests and tools import it from here
JOIN_TIMEOUT_MARGIN_MS = 5_000          # JoinGroup/SyncGroup wait the rebalance timeout plus this (Kafka's)
LEAVE_TIMEOUT_MS = 5_000                # a LeaveGroup on close or poll timeout is best effort
HEARTBEAT_IDLE_WAIT_S = 1.0             # the heartbeat thread looks at the state at least this often
REBALANCE_STEPS_MAX = 8                 # state changes one poll() makes at most before returning

_COORDINATOR_MOVED = {ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE}
# A coordinator call that failed on the way (the connection broke or could not be made):
# Kafka's clients mark the coordinator unknown on such a disconnect and look it up again at
# once, rather than asking a dead broker until session.timeout.ms. (A call that only timed
# out is retried at the same coordinator: a loaded broker is not a lost one.)
_COORDINATOR_UNREACHABLE = {ErrorCode.NETWORK_EXCEPTION}
_COORDINATOR_LOST = _COORDINATOR_MOVED | _COORDINATOR_UNREACHABLE
_SPECIAL_ASSIGNOR_NAMES = {"rangeassignor": "range", "roundrobinassignor": "roundrobin",
                           "stickyassignor": "sticky", "cooperativestickyassignor": "cooperative-sticky"}


# ---- values handed to applications -------------------------------------------------------------

class ConsumerGroupMetadata(NamedTuple):
    """The consumer's group membership, as a transactional producer passes it to
    TxnOffsetCommit (KIP-447) so that a zombie member's offsets are fenced."""

    group_id: str
    generation_id: int = NO_GENERATION
    member_id: str = NO_MEMBER_ID
    group_instance_id: str | None = None


class FencedInstanceIdError(EosError):
    """Another consumer joined with this group.instance.id: this one is fenced for good."""

    code = ErrorCode.FENCED_INSTANCE_ID


class MemberState(enum.Enum):
    UNJOINED = "unjoined"
    JOINING = "joining"
    SYNCING = "syncing"
    STABLE = "stable"


def assignor_names(name: str, value) -> tuple[str, ...]:
    """partition.assignment.strategy: a list or a comma-separated string of assignor names
    ("range", "roundrobin", "sticky", "cooperative-sticky"; Kafka's class names are accepted too)."""
    items = value.split(",") if isinstance(value, str) else value
    try:
        raw = [str(item).strip() for item in items]
    except TypeError:
        raise ValueError(f"{name} must be a list of assignor names, got {value!r}") from None
    names = []
    for item in raw:
        if not item:
            continue
        short = item.rsplit(".", 1)[-1]
        short = _SPECIAL_ASSIGNOR_NAMES.get(short.lower(), short)
        assignor_for(short)   # raises ValueError naming the known ones
        if short not in names:
            names.append(short)
    if not names:
        raise ValueError(f"{name} names no assignor")
    return tuple(names)


# ---- the coordinator client ----------------------------------------------------------------------

class _Call(NamedTuple):
    kind: str                  # "join" | "sync"
    future: object             # a grpc future
    generation_id: int         # for "sync": the generation the JoinGroup gave
    member_id: str


class _Subscription(NamedTuple):
    topics: frozenset          # the topics subscribed (for a pattern: those it matches now)
    pattern: re.Pattern | None
    listener: object | None


class ConsumerCoordinator:
    """The consumer's group membership and, through its OffsetCommitter, committed offsets
    (see the module docstrings).

    `assign_partitions(list)` hands an assignment to the fetcher; `positions()` answers the
    current position of each assigned partition (what a default commit commits). Both are
    called on the application's thread only."""

    def __init__(self, metadata: net.ClusterMetadata, *, group_id: str, group_instance_id: str | None,
                 client_id: str, assignors: Iterable[str] = ("range",), session_timeout_ms: int = 45_000,
                 heartbeat_interval_ms: int = 3_000, max_poll_interval_ms: int = 300_000,
                 request_timeout_ms: int = 30_000, backoff: net.Backoff | None = None,
                 enable_auto_commit: bool = False, auto_commit_interval_ms: int = 5_000,
                 metadata_max_age_ms: int = 300_000,
                 assign_partitions: Callable[[list[TopicPartition]], None],
                 positions: Callable[[], dict[TopicPartition, int]],
                 wakeup: threading.Event | None = None, clock: Callable[[], int] = net.now_ms,
                 sleep_ms: Callable[[int], None] | None = None, stub_for: Callable[[str], object] | None = None,
                 start_heartbeat_thread: bool = True, metrics: ConsumerMetrics | None = None):
        if not group_id:
            raise ValueError("group.id must be a non-empty string")
        if heartbeat_interval_ms >= session_timeout_ms:
            raise ValueError(f"heartbeat.interval.ms ({heartbeat_interval_ms}) must be lower than "
                             f"session.timeout.ms ({session_timeout_ms})")
        self.group_id = group_id
        self.group_instance_id = group_instance_id or None
        self.client_id = client_id
        self.assignors = tuple(assignors)
        # EAGER or COOPERATIVE for the life of the consumer (raises on an unknown name).
        self.rebalance_protocol = rebalance_protocol(self.assignors)
        self._cooperative = self.rebalance_protocol is RebalanceProtocol.COOPERATIVE
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_poll_interval_ms = max_poll_interval_ms
        self.request_timeout_ms = request_timeout_ms
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self._metadata = metadata
        self._backoff = backoff or net.Backoff(100, 1000)
        self._assign_partitions = assign_partitions
        self._positions = positions
        self.wakeup = wakeup or threading.Event()
        self._clock = clock
        self._sleep_ms = sleep_ms or (lambda ms: threading.Event().wait(ms / 1000))
        # the client's stub there (cached; over the broker's socket port when it has one)
        self._stub_for = stub_for or (lambda address: metadata.stub_at(address, group_pb2_grpc.GroupCoordinatorStub))
        self._start_heartbeat_thread = start_heartbeat_thread
        self._call_metadata = net.client_id_metadata(client_id)

        # Shared with the heartbeat thread (under _lock).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._state = MemberState.UNJOINED
        self._generation_id = NO_GENERATION
        self._member_id = NO_MEMBER_ID
        self._protocol: str | None = None
        self._rejoin_needed = True
        self._fatal: EosError | None = None
        self._coordinator: str | None = None       # address of the group's coordinator
        self._last_poll_ms = clock()
        self._last_heartbeat_sent_ms = 0
        self._last_heartbeat_ok_ms = 0
        self._heartbeat_retry_at_ms = 0
        self._closed = False
        self._heartbeat_thread: threading.Thread | None = None

        # Application thread only.
        self._subscription: _Subscription | None = None
        self._join_call: _Call | None = None
        self._join_retry_at_ms = 0
        self._join_attempts = 0
        self._needs_join_prepare = True
        self._owned: list[TopicPartition] = []               # the assignment handed to the fetcher
        self._sticky_owned: list[TopicPartition] = []        # claimed in the next join (sticky only)
        self._owned_generation = DEFAULT_GENERATION          # the generation they were assigned in
        self._leader_topics: frozenset | None = None          # leader: every topic of the group
        self._assignment_snapshot: dict[str, int] | None = None   # leader: partition counts assigned with
        self._next_metadata_check_ms = 0
        self._offsets = OffsetCommitter(
            MemberAccess(commit_generation=self._commit_generation, commit_refused=self._after_commit_refused,
                         instance_fenced=self._fenced_by_commit, coordinator_address=self._coordinator_address,
                         coordinator_stub=self._coordinator_stub,
                         forget_lost_coordinator=self._forget_lost_coordinator, stub_for=self._stub_for,
                         rpc_timeout_s=self._rpc_timeout_s, sleep_backoff=self._sleep_backoff),
            group_id=group_id, request_timeout_ms=request_timeout_ms, max_poll_interval_ms=max_poll_interval_ms,
            enable_auto_commit=enable_auto_commit, auto_commit_interval_ms=auto_commit_interval_ms,
            positions=positions, wakeup=self.wakeup, clock=clock, metrics=metrics)

    # ---- what others read ----------------------------------------------------------------------

    @property
    def state(self) -> MemberState:
        return self._state

    @property
    def subscribed(self) -> bool:
        return self._subscription is not None

    @property
    def subscription(self) -> set[str]:
        return set(self._subscription.topics) if self._subscription is not None else set()

    def group_metadata(self) -> ConsumerGroupMetadata:
        with self._lock:
            return ConsumerGroupMetadata(self.group_id, self._generation_id, self._member_id, self.group_instance_id)

    def ready(self) -> bool:
        """True when the member may fetch: not subscribed, or STABLE with its assignment handed
        out (and no rejoin asked that poll has yet to start), or, under the cooperative
        protocol, whenever its generation is valid: it reads what it owns through a rebalance."""
        if self._subscription is None:
            return True
        with self._lock:
            if self._state is MemberState.STABLE and not self._needs_join_prepare_now():
                return True
            return self._cooperative and self._owned_validly_locked()

    def rebalance_step_due(self) -> bool:
        """True when poll() would move the membership protocol on now: a JoinGroup or SyncGroup
        has been answered, or a rejoin is waiting to start. (The consumer's fetch loop asks,
        so that a cooperative member, which keeps fetching, does not sleep on its fetches
        while a rebalance waits for it.)"""
        call = self._join_call
        if call is not None:
            return call.future.done()
        if self._subscription is None or self._clock() < self._join_retry_at_ms:
            return False
        with self._lock:
            return self._fatal is None and self._coordinator is not None and self._needs_join_prepare_now()

    def _needs_join_prepare_now(self) -> bool:
        return self._rejoin_needed or self._state is MemberState.UNJOINED

    def _owned_validly_locked(self) -> bool:
        """Are the partitions handed to the fetcher still this member's? Eager: only while
        STABLE. Cooperative: until the generation is dropped (or a fatal error), through
        JOINING and SYNCING and a JoinGroup retried after a transport error."""
        if not self._cooperative:
            return self._state is MemberState.STABLE
        return self._generation_id != NO_GENERATION and self._fatal is None

    # ---- subscription --------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str] | None = None, pattern: re.Pattern | None = None,
                  listener=None) -> None:
        if (topics is None) == (pattern is None):
            raise InvariantError("subscribe takes topics or a pattern")
        current = self._subscription
        if pattern is not None:
            # Resolved against the cluster's topics at the next poll.
            keep = current.topics if current is not None and current.pattern == pattern else frozenset()
            self._subscription = _Subscription(keep, pattern, listener)
            self._next_metadata_check_ms = 0
        else:
            self._subscription = _Subscription(frozenset(topics), None, listener)
        if current is None or current.topics != self._subscription.topics or pattern is not None:
            self._request_rejoin("the subscription changed")

    def _request_rejoin(self, reason: str) -> None:
        with self._lock:
            if not self._rejoin_needed:
                log.info("group %s: rejoin requested: %s", self.group_id, reason)
            self._rejoin_needed = True
        self.wakeup.set()

    def unsubscribe(self) -> None:
        """Give up the subscription: revoke (the listener hears it), leave the group."""
        if self._subscription is None:
            return
        try:
            self._revoke_or_lose()
        finally:
            self._leave_group("the consumer unsubscribed")
            self._subscription = None
            self._cancel_join_call()

    # ---- the application's thread: poll -----------------------------------------------------

    def poll(self, deadline_ms: int) -> None:
        """One step of the group protocol (see the module docstring); raises a fatal error."""
        now = self._clock()
        with self._lock:
            self._last_poll_ms = now
            fatal = self._fatal
        if fatal is not None:
            raise fatal
        self._offsets.run_commit_callbacks()
        if self._subscription is not None:
            if self._coordinator is None and not self._find_coordinator(deadline_ms):
                return
            self._maybe_check_metadata(now)
            self._advance_rebalance()
        self._offsets.maybe_auto_commit(
            now, assignment_settled=self._subscription is None or self._state is MemberState.STABLE)
        with self._lock:
            fatal = self._fatal
        if fatal is not None:
            raise fatal

    def _advance_rebalance(self) -> None:
        for _ in range(REBALANCE_STEPS_MAX):
            call = self._join_call
            if call is not None:
                if not call.future.done():
                    return
                self._join_call = None
                if call.kind == "join":
                    self._handle_join(call)
                else:
                    self._handle_sync(call)
                continue
            with self._lock:
                needed = self._needs_join_prepare_now()
            if not needed or self._fatal is not None or self._clock() < self._join_retry_at_ms:
                return
            if self._coordinator is None:
                return
            if self._needs_join_prepare:
                self._on_join_prepare()
            if self._cooperative:
                self._lose_if_generation_dropped()
            self._send_join()

    def _on_join_prepare(self) -> None:
        """Commit (auto-commit), then, eager: give up everything before rejoining;
        cooperative: give up only the partitions of topics no longer subscribed."""
        with self._lock:
            generation_valid = self._state is MemberState.STABLE
        if generation_valid and self.enable_auto_commit and self._owned:
            self._offsets.auto_commit_sync("before rejoining")
        self._needs_join_prepare = False
        if not self._cooperative:
            self._revoke_or_lose()
            return
        if not self._lose_if_generation_dropped():
            unsubscribed = partitions_not_subscribed(self._owned, self._subscription.topics)
            if unsubscribed:
                self._give_up(unsubscribed)

    def _lose_if_generation_dropped(self) -> bool:
        """Cooperative: partitions kept into a rebalance are lost when the generation is
        dropped on the way (another member may be given them). True if that happened."""
        with self._lock:
            valid = self._owned_validly_locked()
        if valid or not self._owned:
            return False
        self._revoke_or_lose()
        return True

    def _give_up(self, partitions) -> None:
        """Cooperative: revoke some partitions (listener first, while the fetcher still holds
        them, as Kafka's), keep the rest."""
        gone = set(partitions)
        listener = self._subscription.listener if self._subscription is not None else None
        if listener is not None:
            listener.on_partitions_revoked(sorted(gone))
        self._owned = [tp for tp in self._owned if tp not in gone]
        self._sticky_owned = list(self._owned)
        self._assign_partitions(list(self._owned))

    def _revoke_or_lose(self) -> None:
        owned, self._owned = self._owned, []
        with self._lock:
            generation_valid = self._owned_validly_locked()
            self._assignment_snapshot = None
            self._leader_topics = None
        self._assign_partitions([])
        if not generation_valid:
            # Lost, not revoked: another member may own them now, so they are not claimed.
            self._sticky_owned, self._owned_generation = [], DEFAULT_GENERATION
        if not owned:
            return
        listener = self._subscription.listener if self._subscription is not None else None
        if listener is None:
            return
        if not generation_valid and hasattr(listener, "on_partitions_lost"):
            listener.on_partitions_lost(list(owned))
        else:
            listener.on_partitions_revoked(list(owned))

    def _subscription_bytes(self, assignor: str) -> bytes:
        topics = tuple(sorted(self._subscription.topics))
        if assignor == "sticky":
            return encode_subscription(Subscription(topics, owned_partitions=tuple(self._sticky_owned),
                                                    generation_id=self._owned_generation))
        if assignor == "cooperative-sticky" and self._cooperative:
            return encode_subscription(Subscription(topics, owned_partitions=tuple(self._owned),
                                                    generation_id=self._owned_generation))
        return encode_subscription(Subscription(topics))

    def _send_join(self) -> None:
        with self._lock:
            self._state = MemberState.JOINING
            member_id = self._member_id
            address = self._coordinator
        if address is None:
            return
        request = group_pb2.JoinGroupRequest(
            group_id=self.group_id, session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.max_poll_interval_ms, member_id=member_id,
            group_instance_id=self.group_instance_id or "", protocol_type=CONSUMER_PROTOCOL_TYPE,
            protocols=[group_pb2.GroupProtocol(name=name, metadata=self._subscription_bytes(name))
                       for name in self.assignors])
        future = self._stub_for(address).JoinGroup.future(
            request, timeout=(self.max_poll_interval_ms + JOIN_TIMEOUT_MARGIN_MS) / 1000,
            metadata=self._call_metadata)
        self._join_call = _Call("join", future, NO_GENERATION, member_id)
        future.add_done_callback(lambda _f: self.wakeup.set())

    def _call_result(self, call: _Call, what: str):
        """The response of a finished call, or None after a transport failure (handled here)."""
        try:
            return call.future.result()
        except grpc.FutureCancelledError:
            return None
        except grpc.RpcError as exc:
            error = net.error_from_rpc(exc, f"{what} of group {self.group_id}")
            log.info("%s", error)
            self._retry_join_later(coordinator_moved=True)
            return None

    def _retry_join_later(self, *, coordinator_moved: bool = False) -> None:
        self._join_attempts += 1
        self._join_retry_at_ms = self._clock() + self._backoff.delay_ms(self._join_attempts)
        with self._lock:
            self._state = MemberState.UNJOINED
            self._rejoin_needed = True
            if coordinator_moved:
                self._coordinator = None

    def _handle_join(self, call: _Call) -> None:
        response = self._call_result(call, "JoinGroup")
        if response is None:
            return
        code = response.error_code
        if code == ErrorCode.NONE:
            with self._lock:
                if self._state is not MemberState.JOINING:
                    return   # closed or reset meanwhile
                self._generation_id = response.generation_id
                self._member_id = response.member_id
                self._protocol = response.protocol_name
                self._state = MemberState.SYNCING
                self._rejoin_needed = False
                now = self._clock()
                self._last_heartbeat_ok_ms = now
                self._last_heartbeat_sent_ms = now
                self._cond.notify_all()
            self._join_attempts = 0
            self._ensure_heartbeat_thread()
            assignments: Mapping[str, bytes] = {}
            if response.leader == response.member_id:
                assignments = self._assign_as_leader(response.protocol_name, response.members,
                                                     response.skip_assignment)
            self._send_sync(response.generation_id, response.member_id, assignments)
            return
        self._on_join_or_sync_error("JoinGroup", code, response.error_message, response.member_id)

    def _on_join_or_sync_error(self, what: str, code: int, message: str, member_id_given: str = "") -> None:
        code = ErrorCode(code)
        log.info("group %s: %s answered %s: %s", self.group_id, what, code.name, message)
        if code is ErrorCode.MEMBER_ID_REQUIRED:
            # KIP-394: rejoin at once with the id the coordinator handed out.
            with self._lock:
                self._member_id = member_id_given
                self._state = MemberState.UNJOINED
                self._rejoin_needed = True
            return
        if code is ErrorCode.UNKNOWN_MEMBER_ID:
            self._reset_generation(reset_member_id=True)
            return
        if code is ErrorCode.ILLEGAL_GENERATION:
            self._reset_generation(reset_member_id=False)
            return
        if code is ErrorCode.REBALANCE_IN_PROGRESS:
            # Another join phase began under us: join it. The generation stays valid (Kafka's
            # requestRejoin), so a cooperative member keeps reading what it owns.
            with self._lock:
                self._state = MemberState.UNJOINED
                self._rejoin_needed = True
                self._cond.notify_all()
            self.wakeup.set()
            return
        if code is ErrorCode.FENCED_INSTANCE_ID:
            self._set_fatal(FencedInstanceIdError(
                f"group {self.group_id}: group.instance.id {self.group_instance_id!r} was taken over by "
                f"another consumer ({message})"))
            return
        if code in _COORDINATOR_MOVED:
            self._retry_join_later(coordinator_moved=True)
            return
        if reaction_for(code) is Reaction.RETRY:
            self._retry_join_later()
            return
        # INVALID_SESSION_TIMEOUT, INCONSISTENT_GROUP_PROTOCOL, GROUP_MAX_SIZE_REACHED, ...:
        # configuration the application must fix.
        text = f"group {self.group_id}: {what} refused: {message or code.name}"
        if code is ErrorCode.INCONSISTENT_GROUP_PROTOCOL:
            text += (f". This member's partition.assignment.strategy is {list(self.assignors)} "
                     f"({self.rebalance_protocol.name} rebalancing); every member of a group must share at least "
                     f"one assignor, so eager-only assignors (range, roundrobin, sticky) and cooperative-sticky "
                     f"alone cannot be mixed. To move a group to cooperative rebalancing, first give every member "
                     f"['cooperative-sticky', <the old assignor>], then, once all run that, ['cooperative-sticky']")
        self._set_fatal(error_for(code, text))

    def _set_fatal(self, error: EosError) -> None:
        with self._lock:
            if self._fatal is None:
                self._fatal = error
            self._state = MemberState.UNJOINED
            self._cond.notify_all()
        self.wakeup.set()

    def _reset_generation(self, *, reset_member_id: bool) -> None:
        with self._lock:
            self._reset_generation_locked(reset_member_id)
        self.wakeup.set()

    def _reset_generation_locked(self, reset_member_id: bool) -> None:
        self._generation_id = NO_GENERATION
        self._protocol = None
        if reset_member_id:
            self._member_id = NO_MEMBER_ID
        self._state = MemberState.UNJOINED
        self._rejoin_needed = True
        self._cond.notify_all()

    def _assign_as_leader(self, protocol: str, members, skip_assignment: bool) -> dict[str, bytes]:
        subscriptions: dict[str, Subscription] = {}
        for m in members:
            try:
                sub = decode_subscription(m.metadata)
            except ValueError as exc:
                log.warning("group %s: member %s sent a subscription that does not decode (%s); it gets "
                            "nothing", self.group_id, m.member_id, exc)
                sub = Subscription(())
            subscriptions[m.member_id] = dataclasses.replace(sub, group_instance_id=m.group_instance_id or None)
        topics = frozenset(t for s in subscriptions.values() for t in s.topics)
        counts = self._partition_counts(topics)
        self._leader_topics = topics
        self._assignment_snapshot = counts
        if skip_assignment:
            # A static leader that restarted: the coordinator keeps the current assignment.
            return {}
        plan = assignor_for(protocol).assign(counts, subscriptions)
        log.info("group %s: leader assigned %s with %s", self.group_id,
                 {m: len(tps) for m, tps in plan.items()}, protocol)
        return {m: encode_assignment(Assignment(tuple(tps))) for m, tps in plan.items()}

    def _partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        names = sorted(topics)
        if names:
            try:
                self._metadata.fetch(names)
            except EosError as exc:
                log.info("group %s: metadata refresh failed (%s); assigning with what is known", self.group_id, exc)
        counts = {}
        for name in names:
            count = self._metadata.partition_count(name)
            if count is not None:
                counts[name] = count
        return counts

    def _send_sync(self, generation_id: int, member_id: str, assignments: Mapping[str, bytes]) -> None:
        with self._lock:
            address = self._coordinator
        if address is None:
            self._retry_join_later()
            return
        request = group_pb2.SyncGroupRequest(
            group_id=self.group_id, generation_id=generation_id, member_id=member_id,
            group_instance_id=self.group_instance_id or "",
            assignments=[group_pb2.SyncGroupAssignment(member_id=m, assignment=a)
                         for m, a in sorted(assignments.items())])
        future = self._stub_for(address).SyncGroup.future(
            request, timeout=(self.max_poll_interval_ms + JOIN_TIMEOUT_MARGIN_MS) / 1000,
            metadata=self._call_metadata)
        self._join_call = _Call("sync", future, generation_id, member_id)
        future.add_done_callback(lambda _f: self.wakeup.set())

    def _handle_sync(self, call: _Call) -> None:
        response = self._call_result(call, "SyncGroup")
        if response is None:
            return
        code = response.error_code
        if code != ErrorCode.NONE:
            with self._lock:
                current = self._generation_id == call.generation_id and self._state is MemberState.SYNCING
            if current:
                self._on_join_or_sync_error("SyncGroup", code, response.error_message, call.member_id)
            return
        try:
            assignment = decode_assignment(response.assignment) if response.assignment else Assignment(())
        except ValueError as exc:
            self._set_fatal(EosError(f"group {self.group_id}: the assignment does not decode: {exc}",
                                     ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
            return
        subscribed = self._subscription.topics if self._subscription is not None else frozenset()
        partitions = sorted(dict.fromkeys(tp for tp in assignment.partitions if tp.topic in subscribed))
        if len(partitions) != len(assignment.partitions):
            # The leader assigned a topic we did not ask for (its view was older): rejoin.
            log.info("group %s: assignment names unsubscribed topics; rejoining", self.group_id)
        with self._lock:
            if self._state is not MemberState.SYNCING or self._generation_id != call.generation_id:
                return   # the heartbeat thread dropped the generation meanwhile
            self._state = MemberState.STABLE
            if len(partitions) != len(assignment.partitions):
                self._rejoin_needed = True
            generation_id = self._generation_id
        log.info("group %s: generation %d, member %s assigned %s", self.group_id, generation_id,
                 call.member_id, partitions)
        self._needs_join_prepare = True
        if self._cooperative:
            self._complete_cooperative(partitions, generation_id)
            return
        self._take_assignment(partitions, generation_id, newly_added=partitions)

    def _take_assignment(self, partitions: list[TopicPartition], generation_id: int,
                         newly_added: list[TopicPartition]) -> None:
        """Own `partitions` in `generation_id`, hand them to the fetcher, tell the listener
        which are new (all of them, eager; the added ones, cooperative)."""
        self._owned = list(partitions)
        self._sticky_owned = list(partitions)
        self._owned_generation = generation_id
        self._offsets.restart_auto_commit_timer()
        self._assign_partitions(list(partitions))
        listener = self._subscription.listener if self._subscription is not None else None
        if listener is not None:
            listener.on_partitions_assigned(list(newly_added))

    def _complete_cooperative(self, partitions: list[TopicPartition], generation_id: int) -> None:
        """Apply a cooperative assignment: commit and revoke only what was lost, rejoin if
        anything was (the second rebalance hands it on), keep fetching the rest."""
        change = incremental_change(self._owned, partitions)
        if change.revoked:
            if self.enable_auto_commit:
                # The member kept fetching during the rebalance: commit where it got to on the
                # partitions it gives up, so that their next owner starts there.
                positions = self._positions()
                offsets = {tp: OffsetAndMetadata(positions[tp]) for tp in change.revoked if tp in positions}
                if offsets:
                    try:
                        self.commit_sync(offsets, min(self.max_poll_interval_ms, self.request_timeout_ms))
                    except EosError as exc:
                        log.warning("group %s: auto-commit of revoked partitions failed: %s", self.group_id, exc)
            log.info("group %s: generation %d revokes %s and rejoins", self.group_id, generation_id,
                     list(change.revoked))
            self._give_up(change.revoked)
            self._request_rejoin(f"revoked {len(change.revoked)} partitions for other members")
        self._take_assignment(partitions, generation_id, newly_added=list(change.added))

    def _cancel_join_call(self) -> None:
        call, self._join_call = self._join_call, None
        if call is not None:
            call.future.cancel()

    # ---- metadata: patterns and partition counts --------------------------------------------------

    def _maybe_check_metadata(self, now: int) -> None:
        if now < self._next_metadata_check_ms:
            return
        self._next_metadata_check_ms = now + self.metadata_max_age_ms
        sub = self._subscription
        if sub is not None and sub.pattern is not None:
            try:
                response = self._metadata.fetch(None)
            except EosError as exc:
                log.info("group %s: metadata for the pattern subscription failed: %s", self.group_id, exc)
                self._next_metadata_check_ms = now + self._backoff.max_ms
                return
            matched = frozenset(t.name for t in response.topics
                                if t.error_code == ErrorCode.NONE and not t.is_internal
                                and sub.pattern.fullmatch(t.name))
            if matched != sub.topics:
                self._subscription = sub._replace(topics=matched)
                self._request_rejoin(f"pattern {sub.pattern.pattern!r} now matches {sorted(matched)}")
        snapshot, topics = self._assignment_snapshot, self._leader_topics
        if snapshot is not None and topics is not None and self._state is MemberState.STABLE:
            counts = self._partition_counts(topics)
            if counts != snapshot:
                self._assignment_snapshot = None
                self._request_rejoin(f"partition counts changed from {snapshot} to {counts}")

    # ---- coordinator lookup --------------------------------------------------------------------

    def _find_coordinator(self, deadline_ms: int) -> bool:
        """FindCoordinator through a bootstrap broker (the next one after a failed call),
        retried until `deadline_ms` (at least one attempt). True when the coordinator is known."""
        attempt = 0
        while True:
            address = self._lookup_once(deadline_ms)
            if address is not None:
                with self._lock:
                    self._coordinator = address
                return True
            attempt += 1
            if not self._sleep_backoff(attempt, deadline_ms):
                return False

    def _lookup_once(self, deadline_ms: int) -> str | None:
        any_broker = self._metadata.any_broker_address
        request = group_pb2.FindCoordinatorRequest(key_type=group_pb2.GROUP, keys=[self.group_id])
        try:
            response = self._stub_for(any_broker).FindCoordinator(request, timeout=self._rpc_timeout_s(deadline_ms))
        except grpc.RpcError as exc:
            log.info("%s", net.error_from_rpc(exc, f"FindCoordinator for group {self.group_id}"))
            # that broker may be down for good: the next attempt asks another one
            self._metadata.next_any_broker()
            return None
        for found in response.coordinators:
            if found.key != self.group_id:
                continue
            if found.error_code != ErrorCode.NONE:
                if reaction_for(found.error_code) is not Reaction.RETRY:
                    self._set_fatal(error_for(found.error_code, f"FindCoordinator for group {self.group_id}: "
                                                                f"{found.error_message}"))
                return None
            return self._metadata.coordinator_channel_address(found.host, found.port,
                                                              self._rpc_timeout_s(deadline_ms))
        return None

    def _coordinator_stub(self, deadline_ms: int):
        with self._lock:
            address = self._coordinator
        if address is None:
            if not self._find_coordinator(deadline_ms):
                raise EosError(f"the coordinator of group {self.group_id} was not found in time",
                               ErrorCode.COORDINATOR_NOT_AVAILABLE)
            with self._lock:
                address = self._coordinator
        return self._stub_for(address)

    def _coordinator_address(self) -> str | None:
        """The coordinator's address, None while it is unknown."""
        with self._lock:
            return self._coordinator

    def _forget_lost_coordinator(self, code: ErrorCode) -> bool:
        """True when `code` (an answer's, or a failed call's) says the coordinator moved or
        could not be reached; it is then looked up again (`_COORDINATOR_LOST`)."""
        if code not in _COORDINATOR_LOST:
            return False
        with self._lock:
            self._coordinator = None
        self.wakeup.set()        # a poll() waiting on its fetches looks the coordinator up now
        return True

    def _rpc_timeout_s(self, deadline_ms: int) -> float:
        return max(0.001, min(self.request_timeout_ms, max(1, deadline_ms - self._clock()))) / 1000

    def _sleep_backoff(self, attempt: int, deadline_ms: int) -> bool:
        """Back off before attempt `attempt + 1`; False when the deadline leaves no time."""
        delay_ms = self._backoff.delay_ms(attempt)
        if self._clock() + delay_ms >= deadline_ms:
            return False
        self._sleep_ms(delay_ms)
        return True

    # ---- committed offsets: consumer/offsets.py ------------------------------------------------

    def commit_sync(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], timeout_ms: int) -> None:
        self._offsets.commit_sync(offsets, timeout_ms)

    def commit_async(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], callback=None) -> None:
        self._offsets.commit_async(offsets, callback)

    def fetch_committed(self, partitions: Iterable[TopicPartition], timeout_ms: int, *,
                        raise_on_timeout: bool = True) -> dict[TopicPartition, int | None] | None:
        return self._offsets.fetch_committed(partitions, timeout_ms, raise_on_timeout=raise_on_timeout)

    # ---- what the OffsetCommitter asks of the member (MemberAccess) ----------------------------
    # (and, above, _coordinator_address, _coordinator_stub, _forget_lost_coordinator,
    # _rpc_timeout_s, _sleep_backoff)

    def _commit_generation(self) -> tuple[int, str, str]:
        """(generation, member id, instance id) a commit carries, or CommitFailedError."""
        if self._subscription is None:
            return NO_GENERATION, NO_MEMBER_ID, ""   # manual assignment: outside group management
        with self._lock:
            state = self._state
            if state is MemberState.STABLE:
                return self._generation_id, self._member_id, self.group_instance_id or ""
        if state in (MemberState.JOINING, MemberState.SYNCING):
            raise CommitFailedError(f"group {self.group_id} is rebalancing: the commit cannot be completed; "
                                    f"poll() to rejoin, then process and commit again", ErrorCode.REBALANCE_IN_PROGRESS)
        raise CommitFailedError(f"this consumer is not a member of group {self.group_id} any more (its "
                                f"partitions may have moved); poll() to rejoin", ErrorCode.UNKNOWN_MEMBER_ID)

    def _after_commit_refused(self, code: ErrorCode, generation_id: int) -> None:
        if self._subscription is None:
            return
        with self._lock:
            if self._generation_id != generation_id:
                return
            if code is ErrorCode.REBALANCE_IN_PROGRESS:
                self._rejoin_needed = True
            else:
                self._reset_generation_locked(reset_member_id=code is ErrorCode.UNKNOWN_MEMBER_ID)
        self.wakeup.set()

    def _fenced_by_commit(self, message: str) -> EosError:
        """A commit was answered FENCED_INSTANCE_ID: fatal (the next poll raises it); the error to raise."""
        error = FencedInstanceIdError(message)
        self._set_fatal(error)
        return error

    # ---- the heartbeat thread ------------------------------------------------------------------

    def _ensure_heartbeat_thread(self) -> None:
        if not self._start_heartbeat_thread or self._heartbeat_thread is not None:
            return
        self._heartbeat_thread = threading.Thread(target=self._run_heartbeats, daemon=True,
                                                  name=f"eos-heartbeat-{self.client_id or self.group_id}")
        self._heartbeat_thread.start()

    def _run_heartbeats(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                action, wait_s = self.heartbeat_step(self._clock())
                if action is None:
                    self._cond.wait(wait_s)
                    continue
            action()

    def heartbeat_step(self, now: int):
        """(action to run without the lock, None) or (None, seconds to wait). Called with the lock."""
        if self._fatal is not None or self._state not in (MemberState.SYNCING, MemberState.STABLE):
            return None, HEARTBEAT_IDLE_WAIT_S
        if now - self._last_poll_ms > self.max_poll_interval_ms:
            generation = (self._generation_id, self._member_id)
            return (lambda: self._leave_for_poll_timeout(generation)), None
        if self._coordinator is None:
            return None, min(HEARTBEAT_IDLE_WAIT_S, self._backoff.base_ms / 1000)
        if now - self._last_heartbeat_ok_ms > self.session_timeout_ms:
            # No answer for a whole session: look for the coordinator again (Kafka's rule).
            log.info("group %s: no heartbeat answered within session.timeout.ms %d", self.group_id,
                     self.session_timeout_ms)
            self._coordinator = None
            self._last_heartbeat_ok_ms = now
            self.wakeup.set()
            return None, min(HEARTBEAT_IDLE_WAIT_S, self._backoff.base_ms / 1000)
        due = max(self._last_heartbeat_sent_ms + self.heartbeat_interval_ms, self._heartbeat_retry_at_ms)
        poll_due = self._last_poll_ms + self.max_poll_interval_ms + 1
        if now < due:
            return None, max(0.001, (min(due, poll_due) - now) / 1000)
        request = group_pb2.HeartbeatRequest(group_id=self.group_id, generation_id=self._generation_id,
                                             member_id=self._member_id,
                                             group_instance_id=self.group_instance_id or "")
        address = self._coordinator
        self._last_heartbeat_sent_ms = now
        return (lambda: self._send_heartbeat(address, request)), None

    def _send_heartbeat(self, address: str, request: group_pb2.HeartbeatRequest) -> None:
        try:
            response = self._stub_for(address).Heartbeat(
                request, timeout=min(self.request_timeout_ms, self.session_timeout_ms) / 1000)
        except grpc.RpcError as exc:
            error = net.error_from_rpc(exc, f"Heartbeat of group {self.group_id}")
            log.info("%s", error)
            with self._lock:
                self._heartbeat_retry_at_ms = self._clock() + self._backoff.base_ms
            self._forget_lost_coordinator(error.code)
            return
        except ValueError:
            return   # the channel was closed under us: the consumer is closing
        self.handle_heartbeat_response(request.generation_id, request.member_id, response.error_code,
                                       response.error_message)

    def handle_heartbeat_response(self, generation_id: int, member_id: str, code: int, message: str = "") -> None:
        code = ErrorCode(code)
        with self._lock:
            if (self._generation_id, self._member_id) != (generation_id, member_id) or self._closed:
                return   # an answer for a generation this member has left behind
            now = self._clock()
            if code is ErrorCode.NONE:
                self._last_heartbeat_ok_ms = now
                return
            log.info("group %s: heartbeat answered %s: %s", self.group_id, code.name, message)
            if code is ErrorCode.REBALANCE_IN_PROGRESS:
                self._last_heartbeat_ok_ms = now
                self._rejoin_needed = True
            elif code is ErrorCode.ILLEGAL_GENERATION:
                self._reset_generation_locked(reset_member_id=False)
            elif code is ErrorCode.UNKNOWN_MEMBER_ID:
                self._reset_generation_locked(reset_member_id=True)
            elif code is ErrorCode.FENCED_INSTANCE_ID:
                self._fatal = FencedInstanceIdError(
                    f"group {self.group_id}: group.instance.id {self.group_instance_id!r} was taken over by "
                    f"another consumer ({message})")
                self._state = MemberState.UNJOINED
            elif code in _COORDINATOR_MOVED:
                self._coordinator = None
            elif reaction_for(code) is Reaction.RETRY:
                self._heartbeat_retry_at_ms = now + self._backoff.base_ms
            else:
                self._fatal = error_for(code, f"group {self.group_id}: heartbeat refused: {message or code.name}")
                self._state = MemberState.UNJOINED
        self.wakeup.set()

    def _leave_for_poll_timeout(self, generation: tuple[int, str]) -> None:
        with self._lock:
            if (self._generation_id, self._member_id) != generation or self._closed:
                return
            log.warning("group %s: poll() was not called within max.poll.interval.ms %d; leaving the group so "
                        "that its partitions move to live members", self.group_id, self.max_poll_interval_ms)
            address, member_id = self._coordinator, self._member_id
            self._reset_generation_locked(reset_member_id=True)
        if self.group_instance_id is None and address is not None and member_id:
            self._send_leave(address, member_id)
        self.wakeup.set()

    def _send_leave(self, address: str, member_id: str) -> None:
        try:
            response = self._stub_for(address).LeaveGroup(
                group_pb2.LeaveGroupRequest(group_id=self.group_id, member_id=member_id),
                timeout=min(self.request_timeout_ms, LEAVE_TIMEOUT_MS) / 1000)
        except (grpc.RpcError, ValueError) as exc:
            log.info("group %s: LeaveGroup failed: %s", self.group_id, exc)
            return
        if response.error_code != ErrorCode.NONE:
            log.info("group %s: LeaveGroup answered %s", self.group_id, ErrorCode(response.error_code).name)

    def _leave_group(self, reason: str) -> None:
        """Leave (a dynamic member sends LeaveGroup; a static one stays until its session
        times out, so that a restart keeps its partitions) and drop the generation."""
        with self._lock:
            address, member_id = self._coordinator, self._member_id
            joined = self._state is not MemberState.UNJOINED or self._join_call is not None
            self._reset_generation_locked(reset_member_id=True)
        if self.group_instance_id is None and address is not None and member_id and joined:
            log.info("group %s: member %s leaves: %s", self.group_id, member_id, reason)
            self._send_leave(address, member_id)

    # ---- shutdown ------------------------------------------------------------------------------

    def close(self, timeout_ms: int) -> None:
        """Commit (auto-commit), revoke, leave the group (dynamic members), stop the heartbeat thread."""
        try:
            if self.enable_auto_commit and (self._subscription is None or self._state is MemberState.STABLE):
                self._offsets.auto_commit_sync("on close")
            self._offsets.wait_for_async_commits(min(timeout_ms, self.request_timeout_ms))
            if self._subscription is not None:
                try:
                    self._revoke_or_lose()
                finally:
                    self._cancel_join_call()
                    self._leave_group("the consumer is closing")
        finally:
            with self._lock:
                self._closed = True
                self._cond.notify_all()
            thread = self._heartbeat_thread
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=min(timeout_ms, self.request_timeout_ms) / 1000)

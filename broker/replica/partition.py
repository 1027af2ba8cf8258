"""The leader's view of one partition's replication: follower positions, ISR, high watermark. Pure.

Theory of operation
-------------------
`LeaderState` is Kafka's Partition as its leader keeps it, without I/O and without a clock
of its own (`now_ms` comes in with each event): the replicas, the ISR and an ISR change in
flight, the leader epoch and the offset where it started, each follower's log end offset
and when it last caught up, and the high watermark. The replica manager (the shell) feeds
it events under its partition lock and carries out what it answers.

Followers. A follower's fetch offset is its log end offset (LEO). Kafka's rule for
"caught up" (Replica.updateFetchState): a fetch at or past the leader's log end as of this
fetch catches up now; a fetch at or past the leader's log end as of the follower's
*previous* fetch catches up as of that previous fetch. So a follower that fetches
continuously but is always behind stops catching up and, after replica.lag.time.max.ms,
is a shrink candidate -- unless its LEO equals the leader's (nothing to catch up on). A
fetch past the leader's log end comes from a diverged follower (it will be answered
OFFSET_OUT_OF_RANGE and truncate); it changes nothing here.

High watermark. HW = the smallest LEO over the ISR, the leader's own log end included, and
it never goes down. While an ISR change is in flight the HW is computed over the *maximal*
ISR (the current ISR plus any replica being added; a replica being removed still counts),
as Kafka's AlterPartition does (KIP-497): a record is never counted as committed by a set
of replicas that may not be the ISR once the write lands. A member whose LEO is not known
yet (this broker just became leader) holds the HW where it is until it fetches.

ISR changes are proposals, one at a time. A follower outside the ISR whose LEO reaches the
HW and the start offset of this leader's epoch (Kafka's isFollowerInSync) is proposed for
expansion by `on_follower_fetch`; `shrink_candidates` proposes the ISR without lagging
followers. `propose_isr` turns either into the write to do (`IsrProposal`: leader, leader
epoch, ISR, and the state znode version it expects); the shell writes it and reports
`isr_write_succeeded(new_version)` or `isr_write_failed()`. After a conflict (BadVersion)
the shell reads the znode again and calls `isr_reloaded(isr, version)`, or `become_leader`
if the leadership changed. The ISR-change state machine is a table (`ISR_TRANSITIONS`):

    COMMITTED --propose (adds)----> PENDING_EXPAND --succeeded | failed | reloaded--> COMMITTED
    COMMITTED --propose (removes)-> PENDING_SHRINK --succeeded | failed | reloaded--> COMMITTED
    any       --become_leader | reloaded--> COMMITTED

acks=all: `enough_replicas(min.insync.replicas)` before appending (the committed ISR, as
Kafka counts it), `acked(offset_exclusive)` once the HW has passed the request's records.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from broker.metadata.types import LeaderIsr
from eos.errors import InvariantError

UNKNOWN_OFFSET = -1


class IsrState(enum.Enum):
    COMMITTED = "committed"            # no change in flight: the ISR is what ZooKeeper holds
    PENDING_EXPAND = "pending-expand"  # a write adding replicas is in flight
    PENDING_SHRINK = "pending-shrink"  # a write removing replicas is in flight


class IsrEvent(enum.Enum):
    PROPOSE_EXPAND = "propose-expand"
    PROPOSE_SHRINK = "propose-shrink"
    WRITE_SUCCEEDED = "write-succeeded"
    WRITE_FAILED = "write-failed"
    RELOADED = "reloaded"
    BECAME_LEADER = "became-leader"


_C, _PE, _PS = IsrState.COMMITTED, IsrState.PENDING_EXPAND, IsrState.PENDING_SHRINK
# (state, event) -> next state; a pair not in the table is a caller bug (InvariantError).
ISR_TRANSITIONS: dict[tuple[IsrState, IsrEvent], IsrState] = {
    (_C, IsrEvent.PROPOSE_EXPAND): _PE,
    (_C, IsrEvent.PROPOSE_SHRINK): _PS,
    (_PE, IsrEvent.WRITE_SUCCEEDED): _C,
    (_PS, IsrEvent.WRITE_SUCCEEDED): _C,
    (_PE, IsrEvent.WRITE_FAILED): _C,
    (_PS, IsrEvent.WRITE_FAILED): _C,
    **{(state, IsrEvent.RELOADED): _C for state in IsrState},
    **{(state, IsrEvent.BECAME_LEADER): _C for state in IsrState},
}


def _next_isr_state(state: IsrState, event: IsrEvent) -> IsrState:
    try:
        return ISR_TRANSITIONS[(state, event)]
    except KeyError:
        raise InvariantError(f"ISR change: {event.value} is not possible in state {state.value}") from None


@dataclass
class _Follower:
    log_end_offset: int = UNKNOWN_OFFSET
    last_caught_up_time_ms: int = 0
    last_fetch_time_ms: int = 0
    leader_end_at_last_fetch: int = UNKNOWN_OFFSET

    @property
    def last_caught_up_ms(self) -> int:   # the first name the shell used
        return self.last_caught_up_time_ms


@dataclass(frozen=True)
class FetchUpdate:
    """What a follower's fetch changed."""

    high_watermark: int | None           # the new HW, when it moved
    expand_isr: tuple[int, ...] | None   # a proposed ISR with the follower added


@dataclass(frozen=True)
class IsrProposal:
    """An ISR change to write to the partition's state znode, expecting its version."""

    isr: tuple[int, ...]
    expected_zk_version: int
    leader: int = -1
    leader_epoch: int = -1

    def as_leader_isr(self, controller_epoch: int) -> LeaderIsr:
        """The znode value (Kafka keeps the controller epoch of the last controller write)."""
        return LeaderIsr(self.leader, self.leader_epoch, self.isr, controller_epoch)


class LeaderState:
    """See the module doc. Not thread-safe: the replica manager calls it under a lock."""

    def __init__(self, broker_id: int, *, replicas, isr, leader_epoch: int, zk_version: int, leader_log_end: int,
                 high_watermark: int, now_ms: int, epoch_start_offset: int | None = None):
        self.broker_id = broker_id
        self.high_watermark = high_watermark
        self.leader_epoch = -1
        self.replicas: tuple[int, ...] = ()
        self.isr: tuple[int, ...] = ()
        self.isr_state = IsrState.COMMITTED
        self.followers: dict[int, _Follower] = {}
        # The HW is not advanced here: the shell's first on_leader_append reports it.
        self._take_leadership(replicas, isr, leader_epoch, zk_version, leader_log_end, now_ms, epoch_start_offset)

    # ---- leadership ---------------------------------------------------------------------------

    def become_leader(self, *, replicas, isr, leader_epoch: int, zk_version: int, leader_log_end: int,
                      now_ms: int, epoch_start_offset: int | None = None) -> int | None:
        """Take (again) the leadership the controller gave (Kafka's makeLeader). A new
        epoch starts at `epoch_start_offset` (default: the log end now) and forgets what
        the followers had (their LEOs are unknown until they fetch; the ISR members count
        as caught up now, so they get replica.lag.time.max.ms to show it). The same epoch
        again (a changed replica set or ISR) keeps what is known. Returns the new HW if it
        moved (a single-replica ISR commits at once)."""
        self._take_leadership(replicas, isr, leader_epoch, zk_version, leader_log_end, now_ms, epoch_start_offset)
        return self._advance_high_watermark()

    def _take_leadership(self, replicas, isr, leader_epoch: int, zk_version: int, leader_log_end: int, now_ms: int,
                         epoch_start_offset: int | None) -> None:
        if leader_epoch < self.leader_epoch:
            raise InvariantError(f"broker {self.broker_id}: leader epoch {leader_epoch} is older than "
                                 f"{self.leader_epoch}; the shell fences stale LeaderAndIsr requests")
        replicas = tuple(replicas)
        isr = tuple(isr) if self.broker_id in isr else (self.broker_id, *isr)
        new_epoch = leader_epoch > self.leader_epoch
        self.replicas = replicas
        self.isr = isr
        self.zk_version = zk_version
        self.leader_log_end = leader_log_end
        self.isr_state = _next_isr_state(self.isr_state, IsrEvent.BECAME_LEADER)
        self.pending_isr: tuple[int, ...] | None = None
        if new_epoch:
            self.leader_epoch = leader_epoch
            # Kafka's rule: a follower joins the ISR only once it has this epoch's start.
            self.epoch_start_offset = leader_log_end if epoch_start_offset is None else epoch_start_offset
            self.followers = {r: _Follower(last_caught_up_time_ms=now_ms if r in isr else 0)
                              for r in replicas if r != self.broker_id}
        else:
            kept = self.followers
            self.followers = {r: kept.get(r) or _Follower(last_caught_up_time_ms=now_ms if r in isr else 0)
                              for r in replicas if r != self.broker_id}

    # ---- events -------------------------------------------------------------------------------

    def on_leader_append(self, leader_log_end: int) -> int | None:
        """The leader's log grew to `leader_log_end`; returns the new HW if it moved."""
        self.leader_log_end = leader_log_end
        return self._advance_high_watermark()

    def on_follower_fetch(self, replica_id: int, fetch_offset: int, leader_log_end: int, now_ms: int) -> FetchUpdate:
        """Follower `replica_id` fetched at `fetch_offset` (its LEO) while the leader's log
        ended at `leader_log_end`."""
        self.leader_log_end = leader_log_end
        follower = self.followers.get(replica_id)
        if follower is None or fetch_offset > leader_log_end or fetch_offset < 0:
            # not a replica of this epoch, or a diverged follower about to truncate
            return FetchUpdate(None, None)
        if fetch_offset >= leader_log_end:
            follower.last_caught_up_time_ms = max(follower.last_caught_up_time_ms, now_ms)
        elif follower.leader_end_at_last_fetch >= 0 and fetch_offset >= follower.leader_end_at_last_fetch:
            follower.last_caught_up_time_ms = max(follower.last_caught_up_time_ms, follower.last_fetch_time_ms)
        follower.leader_end_at_last_fetch = leader_log_end
        follower.last_fetch_time_ms = now_ms
        follower.log_end_offset = fetch_offset
        new_hw = self._advance_high_watermark()
        expand = None
        if (self.isr_state is IsrState.COMMITTED and replica_id not in self.isr
                and fetch_offset >= self.high_watermark and fetch_offset >= self.epoch_start_offset):
            expand = (*self.isr, replica_id)
        return FetchUpdate(new_hw, expand)

    def shrink_candidates(self, now_ms: int, replica_lag_time_max_ms: int) -> tuple[int, ...] | None:
        """The ISR without the followers that are out of sync (Kafka's rule: LEO not the
        leader's and not caught up within `replica_lag_time_max_ms`), or None when none
        is or a change is already in flight."""
        if self.isr_state is not IsrState.COMMITTED:
            return None
        lagging = {r for r in self.isr if r != self.broker_id and self._out_of_sync(r, now_ms, replica_lag_time_max_ms)}
        if not lagging:
            return None
        return tuple(r for r in self.isr if r not in lagging)

    def _out_of_sync(self, replica_id: int, now_ms: int, replica_lag_time_max_ms: int) -> bool:
        follower = self.followers.get(replica_id) or _Follower()
        return (follower.log_end_offset != self.leader_log_end
                and now_ms - follower.last_caught_up_time_ms > replica_lag_time_max_ms)

    # ---- ISR changes --------------------------------------------------------------------------

    def propose_isr(self, isr) -> IsrProposal | None:
        """Start writing `isr` (an expansion or a shrink of the current one); None when a
        change is already in flight or `isr` is the current ISR."""
        isr = tuple(isr)
        if self.isr_state is not IsrState.COMMITTED or isr == self.isr:
            return None
        if self.broker_id not in isr:
            raise InvariantError(f"proposed ISR {list(isr)} of leader {self.broker_id} leaves the leader out")
        if len(set(isr)) != len(isr) or not set(isr) <= set(self.replicas):
            raise InvariantError(f"proposed ISR {list(isr)} is not a set of replicas {list(self.replicas)}")
        adds, removes = set(isr) - set(self.isr), set(self.isr) - set(isr)
        if adds and removes:
            raise InvariantError(f"proposed ISR {list(isr)} both adds {sorted(adds)} to and removes "
                                 f"{sorted(removes)} from {list(self.isr)}; a change does one or the other")
        self.isr_state = _next_isr_state(self.isr_state,
                                         IsrEvent.PROPOSE_EXPAND if adds else IsrEvent.PROPOSE_SHRINK)
        self.pending_isr = isr
        return IsrProposal(isr, self.zk_version, self.broker_id, self.leader_epoch)

    def isr_write_succeeded(self, new_zk_version: int) -> None:
        """The proposed ISR is in ZooKeeper at `new_zk_version`. A shrink may let the HW
        advance: the shell asks `recompute_high_watermark()` next."""
        self.isr_state = _next_isr_state(self.isr_state, IsrEvent.WRITE_SUCCEEDED)
        self.isr = self.pending_isr
        self.pending_isr = None
        self.zk_version = new_zk_version

    def isr_write_failed(self) -> None:
        """The write did not happen: the ISR stays; a later event may propose again."""
        self.isr_state = _next_isr_state(self.isr_state, IsrEvent.WRITE_FAILED)
        self.pending_isr = None

    def isr_reloaded(self, isr, zk_version: int) -> int | None:
        """After a version conflict, the state znode as read again (same leader and epoch):
        its ISR and version replace ours; returns the new HW if it moved."""
        isr = tuple(isr)
        if self.broker_id not in isr:
            raise InvariantError(f"reloaded ISR {list(isr)} leaves leader {self.broker_id} out; the shell "
                                 f"stops leading instead")
        self.isr_state = _next_isr_state(self.isr_state, IsrEvent.RELOADED)
        self.isr = isr
        self.pending_isr = None
        self.zk_version = zk_version
        return self._advance_high_watermark()

    def recompute_high_watermark(self) -> int | None:
        return self._advance_high_watermark()

    # ---- the high watermark and acks ------------------------------------------------------------

    def maximal_isr(self) -> tuple[int, ...]:
        if self.pending_isr is None:
            return self.isr
        return (*self.isr, *(r for r in self.pending_isr if r not in self.isr))

    def _advance_high_watermark(self) -> int | None:
        candidate = self.leader_log_end
        for replica in self.maximal_isr():
            if replica == self.broker_id:
                continue
            follower = self.followers.get(replica)
            if follower is None or follower.log_end_offset == UNKNOWN_OFFSET:
                return None
            candidate = min(candidate, follower.log_end_offset)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return candidate
        return None

    def enough_replicas(self, min_insync_replicas: int) -> bool:
        """acks=all may append: the (committed) ISR has at least min.insync.replicas."""
        return len(self.isr) >= min_insync_replicas

    def acked(self, offset_exclusive: int) -> bool:
        """Whether every record below `offset_exclusive` is committed (the HW passed it)."""
        return self.high_watermark >= offset_exclusive

    def follower_log_end(self, replica_id: int) -> int:
        follower = self.followers.get(replica_id)
        return UNKNOWN_OFFSET if follower is None else follower.log_end_offset

    def last_caught_up_time_ms(self, replica_id: int) -> int:
        follower = self.followers.get(replica_id)
        return 0 if follower is None else follower.last_caught_up_time_ms

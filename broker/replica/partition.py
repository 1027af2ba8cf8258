"""The leader's view of one partition's replication: follower positions, ISR, high watermark. Pure.

Theory of operation
-------------------
`LeaderState` is Kafka's Partition as its leader keeps it, without I/O: the replicas, the
ISR (and an ISR change in flight), each follower's log end offset and when it last caught
up, and the high watermark. The replica manager feeds it events with the time:

- `on_follower_fetch(replica, fetch_offset, leader_log_end, now_ms)`: a follower's fetch
  offset is its log end. Kafka's rule for "caught up": the follower reached the leader's
  log end as it was at this fetch, or at least the leader's log end at its previous fetch
  (then it caught up as of that previous fetch). A follower that keeps fetching but is
  always behind therefore stops catching up and, after replica.lag.time.max.ms, leaves
  the ISR (`shrink_candidates`). A follower outside the ISR whose log end reaches the high
  watermark is proposed for the ISR again.
- `on_leader_append(leader_log_end)`.

Each follower's fetch also carries its log start offset (Kafka's FetchRequest v5+): the
*low watermark* (`low_watermark`) is the smallest log start over the leader and the
followers on live brokers, unknown (-1) while a live follower has not said, as in Kafka's
Partition.lowWatermarkIfLeader. DeleteRecords is answered once it passes the offset asked.

The high watermark is the smallest log end offset over the ISR, the leader's included, and
never goes down. While an ISR change is being written, the HW is computed over the
*maximal* ISR -- the current one plus any replica being added (KIP-497's rule) -- so a
record is never counted as committed by a set of replicas that may not be the ISR. A
follower whose log end is not yet known (right after this broker became leader) holds the
HW where it is until it fetches.

ISR changes are proposals: `propose_isr` returns what to write (the ISR and the znode
version it expects); the shell writes it and reports back (`isr_write_succeeded` /
`isr_write_failed`). Only one change is in flight at a time.
"""
from __future__ import annotations

from dataclasses import dataclass

UNKNOWN_OFFSET = -1


@dataclass
class _Follower:
    log_end_offset: int = UNKNOWN_OFFSET
    last_caught_up_ms: int = 0
    last_fetch_ms: int = 0
    leader_end_at_last_fetch: int = UNKNOWN_OFFSET
    log_start_offset: int = UNKNOWN_OFFSET


@dataclass(frozen=True)
class FetchUpdate:
    high_watermark: int | None           # the new HW, when it moved
    expand_isr: tuple[int, ...] | None   # a proposed ISR with the follower added
    log_start_moved: bool = False        # the follower's log start offset changed (the low watermark may have)


@dataclass(frozen=True)
class IsrProposal:
    isr: tuple[int, ...]
    expected_zk_version: int


class LeaderState:
    """See the module doc. Not thread-safe: the replica manager calls it under a lock."""

    def __init__(self, broker_id: int, *, replicas, isr, leader_epoch: int, zk_version: int, leader_log_end: int,
                 high_watermark: int, now_ms: int, epoch_start_offset: int | None = None):
        self.broker_id = broker_id
        self.replicas = tuple(replicas)
        self.isr = tuple(isr) if broker_id in isr else (broker_id, *isr)
        self.leader_epoch = leader_epoch
        self.zk_version = zk_version
        self.leader_log_end = leader_log_end
        self.high_watermark = high_watermark
        # Kafka's rule: a follower joins the ISR only once it has this leader's epoch start
        self.epoch_start_offset = leader_log_end if epoch_start_offset is None else epoch_start_offset
        self.pending_isr: tuple[int, ...] | None = None
        # Followers in the ISR count as caught up now: they get replica.lag.time.max.ms to show it.
        self.followers = {r: _Follower(last_caught_up_ms=now_ms if r in self.isr else 0)
                          for r in self.replicas if r != broker_id}

    # ---- events ---------------------------------------------------------------------------

    def on_leader_append(self, leader_log_end: int) -> int | None:
        self.leader_log_end = leader_log_end
        return self._advance_high_watermark()

    def on_follower_fetch(self, replica_id: int, fetch_offset: int, leader_log_end: int, now_ms: int,
                          log_start_offset: int | None = None) -> FetchUpdate:
        self.leader_log_end = leader_log_end
        follower = self.followers.get(replica_id)
        if follower is None:
            follower = self.followers[replica_id] = _Follower()
        log_start_moved = log_start_offset is not None and log_start_offset != follower.log_start_offset
        if log_start_moved:
            follower.log_start_offset = log_start_offset
        if fetch_offset >= leader_log_end:
            follower.last_caught_up_ms = now_ms
        elif follower.leader_end_at_last_fetch >= 0 and fetch_offset >= follower.leader_end_at_last_fetch:
            follower.last_caught_up_ms = max(follower.last_caught_up_ms, follower.last_fetch_ms)
        follower.leader_end_at_last_fetch = leader_log_end
        follower.last_fetch_ms = now_ms
        follower.log_end_offset = fetch_offset
        new_hw = self._advance_high_watermark()
        expand = None
        if (replica_id not in self.isr and replica_id in self.replicas and self.pending_isr is None
                and fetch_offset >= self.high_watermark and fetch_offset >= self.epoch_start_offset):
            expand = (*self.isr, replica_id)
        return FetchUpdate(new_hw, expand, log_start_moved)

    def low_watermark(self, leader_log_start: int, is_live) -> int:
        """The smallest log start offset over this leader and its followers on live brokers
        (`is_live(broker_id)`); -1 while one of those has not reported its own."""
        low = leader_log_start
        for replica in self.replicas:
            if replica == self.broker_id or not is_live(replica):
                continue
            follower = self.followers.get(replica)
            low = min(low, UNKNOWN_OFFSET if follower is None else follower.log_start_offset)
        return low

    def shrink_candidates(self, now_ms: int, replica_lag_time_max_ms: int) -> tuple[int, ...] | None:
        """The ISR without followers that have not caught up within the bound, or None."""
        if self.pending_isr is not None:
            return None
        lagging = {r for r in self.isr if r != self.broker_id
                   and now_ms - self.followers.get(r, _Follower()).last_caught_up_ms > replica_lag_time_max_ms}
        if not lagging:
            return None
        return tuple(r for r in self.isr if r not in lagging)

    # ---- ISR changes ------------------------------------------------------------------------

    def propose_isr(self, isr: tuple[int, ...]) -> IsrProposal | None:
        if self.pending_isr is not None or tuple(isr) == self.isr or self.broker_id not in isr:
            return None
        self.pending_isr = tuple(isr)
        return IsrProposal(self.pending_isr, self.zk_version)

    def isr_write_succeeded(self, new_zk_version: int) -> None:
        if self.pending_isr is not None:
            self.isr = self.pending_isr
        self.pending_isr = None
        self.zk_version = new_zk_version

    def isr_write_failed(self) -> None:
        self.pending_isr = None

    def recompute_high_watermark(self) -> int | None:
        return self._advance_high_watermark()

    # ---- the high watermark ---------------------------------------------------------------------

    def maximal_isr(self) -> tuple[int, ...]:
        if self.pending_isr is None:
            return self.isr
        return (*self.isr, *(r for r in self.pending_isr if r not in self.isr))

    def _advance_high_watermark(self) -> int | None:
        ends = [self.leader_log_end]
        for replica in self.maximal_isr():
            if replica == self.broker_id:
                continue
            follower = self.followers.get(replica)
            if follower is None or follower.log_end_offset == UNKNOWN_OFFSET:
                return None
            ends.append(follower.log_end_offset)
        candidate = min(ends)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return candidate
        return None

    def enough_replicas(self, min_insync_replicas: int) -> bool:
        return len(self.isr) >= min_insync_replicas

"""Followers copy their leaders' logs: one fetcher thread per leader broker.

Theory of operation
-------------------
`FetcherManager` owns the fetcher threads of one broker and which partitions each carries
(Kafka's ReplicaFetcherManager). A followed partition goes to the thread of its leader's
broker; a thread with no partitions left ends.

Each `ReplicaFetcher` loops:

1. Truncate the partitions that just became followers (KIP-101 / KIP-279): ask the leader
   with OffsetsForLeaderEpoch for the end offset of this log's latest leader epoch. The
   leader answers (epoch', end'): the largest epoch it knows that is <= the one asked, and
   where that epoch ended in its log. The follower cuts its own log at min(end', its own
   end of epoch'), so everything past the point where the two logs agree goes, and nothing
   before it. (The high watermark is not used for this: truncating to it loses acknowledged
   records in KIP-101's first scenario and forks the logs in its second.) A leader that knows
   no epoch at all is answered by truncating to the high watermark, as Kafka does.
2. One Fetch for all of its partitions, as replica `broker_id`, at each log's end offset
   and the leader epoch from LeaderAndIsr (a leader with a newer or older epoch refuses it
   with FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH and the follower waits for the
   controller's next word). Long poll: the leader holds it until it has data. Within a
   fetch session (KIP-227, `FollowerSession`; broker/fetch_sessions.py) only the first
   Fetch lists every partition; later ones list those whose end offset, leader epoch or
   log start offset moved, and the leader answers only partitions with something new. A
   failed Fetch, or a session the leader no longer knows, starts over with a full one.
3. Append what came back through the storage engine's follower path (batches kept as the
   leader wrote them; offsets, producer state and leader epochs checked and rebuilt), then
   take the leader's high watermark, capped at the local log end, and the leader's log
   start offset (DeleteRecords, retention), capped at that high watermark. Each Fetch
   carries the follower's log start back, which the leader's DeleteRecords waits for.

A round costs what moved, not how many partitions the thread follows: the thread keeps
each partition's fetch position (its log end, its leader epoch, its log start) between
rounds and reads it again only for the partitions that moved -- added or removed, appended
to or truncated by this thread (the only writer of a follower's log), or put in or out of a
backoff. So with thousands of idle partitions a round reads the few that changed, and lists
those (a full Fetch, after a session is lost, lists them all).

A fetch offset below the leader's log start (retention moved on) restarts the log at the
leader's log start. Errors back off (replica.fetch.backoff.ms) without ending the thread;
removing a partition waits for a response being applied, so a change of role never races
an append.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import grpc

from broker.fetch_sessions import INITIAL_EPOCH, next_epoch
from eos.client_config import ChannelSecurity
from eos.errors import ErrorCode
from eos.net import open_channel
from eos.v1 import broker_pb2, broker_pb2_grpc, cluster_pb2, cluster_pb2_grpc, common_pb2

log = logging.getLogger("eos.broker.fetcher")

REPLICA_FETCH_WAIT_MAX_MS = 500          # Kafka's replica.fetch.wait.max.ms
REPLICA_FETCH_MIN_BYTES = 1              # replica.fetch.min.bytes
REPLICA_FETCH_MAX_BYTES = 1_048_576      # replica.fetch.max.bytes (per partition)
REPLICA_FETCH_RESPONSE_MAX_BYTES = 10_485_760
REPLICA_FETCH_BACKOFF_MS = 200           # Kafka's default is 1000; short here, as tests kill leaders
RPC_TIMEOUT_S = 10.0


class _FollowedPartition:
    __slots__ = ("assignment", "needs_truncation", "backoff_until_s")

    def __init__(self, assignment):
        self.assignment = assignment
        self.needs_truncation = True
        self.backoff_until_s = 0.0


class FollowerSession:
    """The follower's side of its fetch session with one leader (broker/fetch_sessions.py):
    the session id and the epoch of the next Fetch, and what the session holds for each
    partition (the fetch offset, leader epoch and log start offset last sent). Owned by the
    fetcher thread."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start over: the next Fetch is full and opens a new session."""
        self.session_id = 0
        self.epoch = INITIAL_EPOCH
        self._held: dict[tuple[str, int], tuple[int, int, int]] = {}

    def needs_listing(self, tp: tuple[str, int], position: tuple[int, int, int]) -> bool:
        """Whether the next Fetch lists `tp` at `position` (fetch offset, leader epoch, log
        start offset): all of them in a full one, else only those the session holds otherwise."""
        return self.epoch == INITIAL_EPOCH or self._held.get(tp) != position

    @property
    def full(self) -> bool:
        """Whether the next Fetch is full (lists every partition, opens a session)."""
        return self.epoch == INITIAL_EPOCH

    def forgotten(self, positions: dict, candidates=None) -> list[tuple[str, int]]:
        """The partitions the session holds that the next Fetch leaves out (no longer followed
        from this leader, backing off, or being truncated); only among `candidates` when
        given (the partitions that moved: no other can have left `positions`)."""
        if self.epoch == INITIAL_EPOCH:
            return []
        held = self._held
        if candidates is None:
            return [tp for tp in held if tp not in positions]
        return [tp for tp in candidates if tp in held and tp not in positions]

    def answered(self, session_id: int, positions: dict, moved=None) -> None:
        """A Fetch sent at `positions` was answered: the session now holds them. `moved`,
        for an incremental Fetch, names the only partitions whose position can differ from
        what the session held (the others are not read again). A leader that made no
        session (id 0) gets full fetches."""
        if self.epoch == INITIAL_EPOCH:
            if session_id == 0:
                return
            self.session_id = session_id
            moved = None
        self.epoch = next_epoch(self.epoch)
        if moved is None:
            self._held = dict(positions)
            return
        held = self._held
        for tp in moved:
            position = positions.get(tp)
            if position is None:
                held.pop(tp, None)
            else:
                held[tp] = position


class ReplicaFetcher(threading.Thread):
    """Fetches the partitions this broker follows from one leader broker."""

    def __init__(self, broker_id: int, leader_id: int, address: str, log_manager, *,
                 on_appended: Callable[[tuple[str, int]], None], broker_epoch_fn: Callable[[], int],
                 security: ChannelSecurity | None = None, socket_address: tuple[str, int] | None = None):
        super().__init__(name=f"eos-fetcher-{leader_id}", daemon=True)
        self.broker_id = broker_id
        self.leader_id = leader_id
        self.address = address
        self._log_manager = log_manager
        self._on_appended = on_appended
        self._broker_epoch = broker_epoch_fn
        self._partitions: dict[tuple[str, int], _FollowedPartition] = {}
        # The partitions whose fetch position must be read again before the next Fetch (see
        # the module doc): under _lock, since add() and remove() run on other threads.
        self._moved: set[tuple[str, int]] = set()
        # This thread's, read again only for what moved: where each partition is fetched
        # from (log end, leader epoch, log start) and the _FollowedPartition that was read for
        # (an answer for one replaced meanwhile is dropped); the partitions in a backoff (until,
        # monotonic s) and those to truncate before they are fetched.
        self._positions: dict[tuple[str, int], tuple[int, int, int]] = {}
        self._fetched_as: dict[tuple[str, int], _FollowedPartition] = {}
        self._backing_off: dict[tuple[str, int], float] = {}
        self._to_truncate: dict[tuple[str, int], _FollowedPartition] = {}
        # The partitions that moved since the last answered Fetch: the next incremental one
        # lists (or forgets) them. Kept over a round that sent nothing (a failed truncation,
        # nothing fetchable), so the leader is told every move once.
        self._unanswered_moves: set[tuple[str, int]] = set()
        self._log_start_moved = False          # this round's answer moved a log start: checkpoint
        self._session = FollowerSession()      # this thread's fetch session with the leader
        self._lock = threading.Lock()          # the partition map, and one response's application
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._channel = open_channel(address, security)
        self._broker = broker_pb2_grpc.BrokerStub(self._channel)
        self._cluster = cluster_pb2_grpc.ClusterStub(self._channel)
        # The leader's socket.transport.port (eos/socket_rpc.py), when it has one and the
        # inter-broker listener is PLAINTEXT: each Fetch is then sent and answered on this
        # thread over plain TCP, without gRPC's thread hand-offs on either broker. A port
        # that refuses a connection sends this fetcher back to gRPC for its life.
        self.socket_address = socket_address
        self._socket_channel = None
        if socket_address is not None:
            from eos.socket_rpc import SocketChannel
            self._socket_channel = SocketChannel(*socket_address, self._channel, on_unreachable=self._back_to_grpc)
            self._broker = broker_pb2_grpc.BrokerStub(self._socket_channel)
            self._cluster = cluster_pb2_grpc.ClusterStub(self._socket_channel)

    def _back_to_grpc(self) -> None:
        log.info("fetcher for leader %d: its socket port %s:%d refused a connection; fetching over gRPC",
                 self.leader_id, *self.socket_address)
        self._broker = broker_pb2_grpc.BrokerStub(self._channel)
        self._cluster = cluster_pb2_grpc.ClusterStub(self._channel)

    # ---- partitions ------------------------------------------------------------------------

    def add(self, assignments: dict) -> None:
        with self._lock:
            for tp, assignment in assignments.items():
                self._partitions[tp] = _FollowedPartition(assignment)
                self._moved.add(tp)
        self._wake.set()

    def remove(self, tps) -> None:
        with self._lock:   # waits for a response being applied
            for tp in tps:
                if self._partitions.pop(tp, None) is not None:
                    self._moved.add(tp)

    def partition_count(self) -> int:
        with self._lock:
            return len(self._partitions)

    def shutdown(self) -> None:
        self._stopping.set()
        self._wake.set()

    def close(self) -> None:
        self.shutdown()
        self.join(RPC_TIMEOUT_S + 1)
        if self._socket_channel is not None:
            self._socket_channel.close()
        self._channel.close()

    # ---- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                if not self._fetch_once():
                    self._wake.wait(REPLICA_FETCH_BACKOFF_MS / 1000.0)
                    self._wake.clear()
            except Exception:
                if self._stopping.is_set():
                    return
                log.exception("fetcher for leader %d: unexpected error; backing off", self.leader_id)
                self._stopping.wait(REPLICA_FETCH_BACKOFF_MS / 1000.0)

    def _take_moved(self) -> set[tuple[str, int]]:
        """The partitions that moved since the last round, those whose backoff is over among
        them, each one's position read again (and put back in its backoff or in the
        truncation set if that is where it is). Under _lock."""
        moved, self._moved = self._moved, set()
        now_s = time.monotonic()
        if self._backing_off:
            moved.update(tp for tp, until_s in self._backing_off.items() if until_s <= now_s)
        for tp in moved:
            self._positions.pop(tp, None)
            self._fetched_as.pop(tp, None)
            self._backing_off.pop(tp, None)
            self._to_truncate.pop(tp, None)
            followed = self._partitions.get(tp)
            if followed is None:
                continue
            if followed.backoff_until_s > now_s:
                self._backing_off[tp] = followed.backoff_until_s
            elif followed.needs_truncation:
                self._to_truncate[tp] = followed
            else:
                partition_log = self._log_manager.get_log(*tp)
                if partition_log is None:   # not (yet) on disk here: look again after a backoff
                    self._backing_off[tp] = now_s + REPLICA_FETCH_BACKOFF_MS / 1000.0
                    continue
                self._positions[tp] = (partition_log.log_end_offset, followed.assignment.leader_epoch,
                                       partition_log.log_start_offset)
                self._fetched_as[tp] = followed
        return moved

    def _fetch_once(self) -> bool:
        """One round; False when there was nothing to do or the leader could not be reached."""
        moved = self._unanswered_moves
        with self._lock:
            moved |= self._take_moved()
            to_truncate = dict(self._to_truncate)
        if to_truncate:
            truncated = self._truncate(to_truncate)
            with self._lock:
                self._moved.update(to_truncate)     # truncated, backing off, or still to do
                moved |= self._take_moved()
            if not truncated:
                return False
        positions = self._positions
        if not positions:
            return False
        session = self._session
        request = broker_pb2.FetchRequest(
            max_wait_ms=REPLICA_FETCH_WAIT_MAX_MS, min_bytes=REPLICA_FETCH_MIN_BYTES,
            max_bytes=REPLICA_FETCH_RESPONSE_MAX_BYTES, isolation_level=common_pb2.READ_UNCOMMITTED,
            is_replica=True, replica_id=self.broker_id, replica_broker_epoch=self._broker_epoch(),
            session_id=session.session_id, session_epoch=session.epoch)
        full = session.full
        for tp in (positions if full else moved):
            position = positions.get(tp)
            if position is not None and session.needs_listing(tp, position):
                request.partitions.add(topic=tp[0], partition=tp[1], fetch_offset=position[0],
                                       partition_max_bytes=REPLICA_FETCH_MAX_BYTES, has_leader_epoch=True,
                                       current_leader_epoch=position[1], log_start_offset=position[2])
        for topic, partition in session.forgotten(positions, None if full else moved):
            request.forgotten.add(topic=topic, partition=partition)
        try:
            response = self._broker.Fetch(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            session.reset()   # the leader may or may not have taken this epoch
            if not self._stopping.is_set():
                log.info("fetch from leader %d at %s failed: %s", self.leader_id, self.address, exc.code())
            return False
        if response.error_code != ErrorCode.NONE:
            log.info("fetch from leader %d: %s (%s); fetching in full", self.leader_id,
                     ErrorCode(response.error_code).name, response.error_message)
            session.reset()
            return True
        session.answered(response.session_id, positions, None if full else moved)
        self._unanswered_moves = set()
        self._log_start_moved = False
        with self._lock:
            for result in response.partitions:
                tp = (result.topic, result.partition)
                followed = self._partitions.get(tp)
                # removed, or removed and added again (a new leader epoch) while the fetch was out
                if followed is None or followed is not self._fetched_as.get(tp):
                    continue
                try:
                    self._apply(result, followed)
                except Exception as exc:
                    log.warning("%s-%d: applying the leader's data failed (%s); truncating again before "
                                "the next fetch", tp[0], tp[1], exc)
                    followed.needs_truncation = True
                    followed.backoff_until_s = time.monotonic() + REPLICA_FETCH_BACKOFF_MS / 1000.0
                    self._moved.add(tp)
        if self._log_start_moved:
            self._log_manager.checkpoint()
        return True

    def _apply(self, result: broker_pb2.FetchedPartition, followed: _FollowedPartition) -> None:
        """Apply one partition's answer; called with the lock held. Anything but an answer
        without records moves the partition (its log end, its truncation or backoff)."""
        tp = (result.topic, result.partition)
        partition_log = self._log_manager.get_log(*tp)
        if partition_log is None:
            return
        code = result.error_code
        if code != ErrorCode.NONE or result.records:
            self._moved.add(tp)
        if code == ErrorCode.NONE:
            if result.records:
                partition_log.append_as_follower(result.records, _now_ms())
            partition_log.update_high_watermark(min(result.high_watermark, partition_log.log_end_offset))
            self._follow_log_start(tp, partition_log, result.log_start_offset)
            self._on_appended(tp)
        elif code == ErrorCode.OFFSET_OUT_OF_RANGE:
            if result.log_start_offset > partition_log.log_end_offset:
                log.warning("%s-%d: behind the leader's log start %d; restarting the log there",
                            tp[0], tp[1], result.log_start_offset)
                partition_log.truncate_fully_and_start_at(result.log_start_offset)
            else:
                followed.needs_truncation = True
        else:
            log.info("%s-%d: leader %d answered %s: %s", tp[0], tp[1], self.leader_id,
                     ErrorCode(code).name, result.error_message)
            followed.backoff_until_s = time.monotonic() + REPLICA_FETCH_BACKOFF_MS / 1000.0

    def _follow_log_start(self, tp, partition_log, leader_log_start: int) -> None:
        """Move this replica's log start up to the leader's (DeleteRecords, retention there),
        as Kafka's follower does, never past its own high watermark. The partition is listed
        again whenever its log start differs from what the session last carried (this move,
        or this broker's own retention): the leader's DeleteRecords waits for it. The
        checkpoint is written once per round, before the next Fetch reports the move: a
        restart must not bring deleted records back."""
        target = min(leader_log_start, partition_log.high_watermark)
        if target > partition_log.log_start_offset:
            partition_log.delete_records_before(target, _now_ms())
            self._log_start_moved = True
        position = self._positions.get(tp)
        if position is not None and position[2] != partition_log.log_start_offset:
            self._moved.add(tp)

    def _truncate(self, partitions: dict[tuple[str, int], _FollowedPartition]) -> bool:
        request = cluster_pb2.OffsetsForLeaderEpochRequest(replica_id=self.broker_id)
        latest: dict[tuple[str, int], int] = {}
        for (topic, partition), followed in partitions.items():
            partition_log = self._log_manager.get_log(topic, partition)
            if partition_log is None:
                continue
            epoch = partition_log.leader_epoch_cache.latest_epoch
            latest[(topic, partition)] = epoch
            request.partitions.add(topic=topic, partition=partition,
                                   current_leader_epoch=followed.assignment.leader_epoch,
                                   leader_epoch=max(epoch, 0))
        try:
            response = self._cluster.OffsetsForLeaderEpoch(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            if not self._stopping.is_set():
                log.info("OffsetsForLeaderEpoch to leader %d failed: %s", self.leader_id, exc.code())
            return False
        with self._lock:
            for answer in response.partitions:
                tp = (answer.topic, answer.partition)
                followed = self._partitions.get(tp)
                partition_log = self._log_manager.get_log(*tp)
                if followed is None or partition_log is None or followed is not partitions.get(tp):
                    continue
                if answer.error_code != ErrorCode.NONE:
                    log.info("%s-%d: OffsetsForLeaderEpoch answered %s: %s", tp[0], tp[1],
                             ErrorCode(answer.error_code).name, answer.error_message)
                    followed.backoff_until_s = time.monotonic() + REPLICA_FETCH_BACKOFF_MS / 1000.0
                    continue
                log_end = partition_log.log_end_offset
                if latest.get(tp, -1) < 0 or answer.leader_epoch < 0:
                    # no epochs on one side: Kafka falls back to the high watermark
                    cut = min(partition_log.high_watermark, log_end)
                else:
                    own_epoch, own_end = partition_log.leader_epoch_cache.end_offset_for(answer.leader_epoch, log_end)
                    cut = min(answer.end_offset, log_end)
                    if own_epoch == answer.leader_epoch and own_end >= 0:
                        cut = min(cut, own_end)
                if cut < log_end:
                    log.info("%s-%d: truncating from %d to %d to match leader %d (epoch %d ends at %d)",
                             tp[0], tp[1], log_end, cut, self.leader_id, answer.leader_epoch, answer.end_offset)
                    partition_log.truncate_to(cut)
                followed.needs_truncation = False
        return True


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class FetcherManager:
    """The fetcher threads of one broker, one per leader broker; see the module doc.

    `address_of(broker_id)` gives a leader's host:port from the metadata cache (its
    inter-broker listener's); `security` secures the channels (that listener's protocol);
    `socket_address_of(broker_id)` the leader's socket port, (host, port) or None."""

    def __init__(self, broker_id: int, log_manager, *, address_of: Callable[[int], str | None],
                 on_appended: Callable[[tuple[str, int]], None], broker_epoch_fn: Callable[[], int],
                 security: ChannelSecurity | None = None,
                 socket_address_of: Callable[[int], tuple[str, int] | None] = lambda _broker_id: None):
        self.broker_id = broker_id
        self._log_manager = log_manager
        self._address_of = address_of
        self._on_appended = on_appended
        self._broker_epoch = broker_epoch_fn
        self._security = security
        self._socket_address_of = socket_address_of
        self._fetchers: dict[int, ReplicaFetcher] = {}
        self._lock = threading.Lock()
        self._stopped = False

    def add_partitions(self, assignments: dict) -> None:
        by_leader: dict[int, dict] = {}
        for tp, assignment in assignments.items():
            if assignment.leader < 0:
                continue   # offline: nothing to fetch from until the controller elects a leader
            by_leader.setdefault(assignment.leader, {})[tp] = assignment
        with self._lock:
            if self._stopped:
                return
            for leader_id, group in by_leader.items():
                address = self._address_of(leader_id)
                if address is None:
                    log.warning("no address for leader broker %d; cannot follow %s", leader_id, sorted(group))
                    continue
                socket_address = self._socket_address_of(leader_id)
                fetcher = self._fetchers.get(leader_id)
                if fetcher is not None and (fetcher.address, fetcher.socket_address) != (address, socket_address):
                    fetcher.shutdown()
                    fetcher = None
                if fetcher is None or not fetcher.is_alive():
                    fetcher = ReplicaFetcher(self.broker_id, leader_id, address, self._log_manager,
                                             on_appended=self._on_appended, broker_epoch_fn=self._broker_epoch,
                                             security=self._security, socket_address=socket_address)
                    self._fetchers[leader_id] = fetcher
                    log.info("following leader %d at %s%s", leader_id, address,
                             "" if socket_address is None else " (socket port %s:%d)" % socket_address)
                    fetcher.start()
                fetcher.add(group)

    def remove_partitions(self, tps) -> None:
        tps = list(tps)
        with self._lock:
            fetchers = list(self._fetchers.items())
        for leader_id, fetcher in fetchers:
            fetcher.remove(tps)
        with self._lock:
            for leader_id, fetcher in list(self._fetchers.items()):
                if fetcher.partition_count() == 0:
                    fetcher.shutdown()
                    del self._fetchers[leader_id]

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            fetchers = list(self._fetchers.values())
            self._fetchers.clear()
        for fetcher in fetchers:
            fetcher.close()

"""Committed offsets, the member's side: OffsetCommit (synchronous, asynchronous, automatic)
and OffsetFetch.

Theory of operation
-------------------
`OffsetCommitter` has one owner, a `consumer.group.ConsumerCoordinator`: the coordinator
makes it in its constructor, and its `commit_sync`, `commit_async` and `fetch_committed`
hand over to it. It runs on the application's thread (inside poll(), commit(), committed()
and close()) and owns what only commits need: the asynchronous commits in flight (their
gRPC threads only queue the outcome and set the wakeup; the callbacks run on the
application's thread in a later poll, commit or close) and the auto-commit timer
(auto.commit.interval.ms, restarted with each new assignment). When to auto-commit is the
coordinator's call: at a poll when the member is STABLE (or not subscribed), before it
rejoins, on close.

It holds none of the member's state and never takes the coordinator's lock. All it asks of
the member goes through `MemberAccess`, functions the coordinator makes of its own methods,
each taking the lock itself when it needs it and sending no RPC under it: the generation a
commit carries; the group coordinator's address and stub (looked up when unknown); forget a
coordinator that moved (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE); what a refused commit
does to the member (REBALANCE_IN_PROGRESS asks for a rejoin, ILLEGAL_GENERATION and
UNKNOWN_MEMBER_ID drop the generation the commit carried if it is still the member's,
FENCED_INSTANCE_ID is fatal); and the client's RPC timeout and backoff.

Offsets: `commit_sync` retries coordinator errors until its deadline. ILLEGAL_GENERATION,
UNKNOWN_MEMBER_ID and REBALANCE_IN_PROGRESS raise CommitFailedError: the group moved on, and
the records since the last successful commit will be delivered again to whoever owns the
partitions now. `commit_async` is not retried (Kafka's). `fetch_committed` asks with
require_stable (KIP-447) and retries UNSTABLE_OFFSET_COMMIT with backoff: a
read-process-write copier must not start from an offset whose transaction is still open.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from typing import Callable, Iterable, Mapping, NamedTuple

import grpc

from eos import net
from eos.client_metrics import ConsumerMetrics
from eos.errors import EosError, ErrorCode, Reaction, error_for, reaction_for
from eos.types import TopicPartition
from eos.v1 import common_pb2, group_pb2

# The group client's logger, as when this code was part of consumer/group.py: log settings name it.
log = logging.getLogger("eos.consumer.group")

__all__ = ["OffsetCommitter", "MemberAccess", "OffsetAndMetadata", "CommitFailedError"]


class OffsetAndMetadata(NamedTuple):
    """An offset to commit (the offset of the next record to read) and its metadata string."""

    offset: int
    metadata: str = ""


class CommitFailedError(EosError):
    """The group rebalanced (or this member left it) before the commit: the partitions may
    belong to another member now. `code` says why (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
    REBALANCE_IN_PROGRESS)."""

    code = ErrorCode.ILLEGAL_GENERATION


@dataclasses.dataclass(frozen=True)
class MemberAccess:
    """All that an `OffsetCommitter` asks of its ConsumerCoordinator (see the module docstring)."""

    # (generation id, member id, group.instance.id or "") a commit carries; raises
    # CommitFailedError while the member has no generation to commit with.
    commit_generation: Callable[[], tuple[int, str, str]]
    # (code, generation id the commit carried): a commit was refused with ILLEGAL_GENERATION,
    # UNKNOWN_MEMBER_ID or REBALANCE_IN_PROGRESS; drop that generation or ask for a rejoin.
    commit_refused: Callable[[ErrorCode, int], None]
    # (message): a commit was answered FENCED_INSTANCE_ID; the member is fenced for good (its
    # next poll raises the error returned, which the commit raises too).
    instance_fenced: Callable[[str], EosError]
    # The group coordinator's address, None while it is unknown.
    coordinator_address: Callable[[], str | None]
    # (deadline ms): its stub, after looking it up (until the deadline) if it is unknown.
    coordinator_stub: Callable[[int], object]
    # (code): True when the code (an answer's, or a failed call's) says the coordinator moved
    # or could not be reached; it is then looked up again.
    forget_lost_coordinator: Callable[[ErrorCode], bool]
    # (address): the client's GroupCoordinator stub there.
    stub_for: Callable[[str], object]
    # (deadline ms): the timeout of one RPC, in seconds.
    rpc_timeout_s: Callable[[int], float]
    # (attempt, deadline ms): back off before the next attempt; False when the deadline leaves no time.
    sleep_backoff: Callable[[int, int], bool]


class _CommitDone(NamedTuple):
    """A finished (or refused) asynchronous commit, waiting for its callback to run."""

    callback: object | None
    offsets: dict
    error: EosError | None = None
    future: object | None = None      # the OffsetCommit call, read on the application's thread
    generation_id: int | None = None  # the generation the call carried (with `future`)


class OffsetCommitter:
    """The member's commits and committed offsets (see the module docstring).

    `positions()` answers the current position of each assigned partition (what a default
    commit commits); it is called on the application's thread only."""

    def __init__(self, member: MemberAccess, *, group_id: str, request_timeout_ms: int, max_poll_interval_ms: int,
                 enable_auto_commit: bool, auto_commit_interval_ms: int,
                 positions: Callable[[], dict[TopicPartition, int]], wakeup: threading.Event,
                 clock: Callable[[], int], metrics: ConsumerMetrics | None):
        self._member = member
        self._group_id = group_id
        self._request_timeout_ms = request_timeout_ms
        self._max_poll_interval_ms = max_poll_interval_ms
        self._enable_auto_commit = enable_auto_commit
        self._auto_commit_interval_ms = auto_commit_interval_ms
        self._positions = positions
        self._wakeup = wakeup
        self._clock = clock
        self._metrics = metrics       # commit_latency_seconds: each OffsetCommit answered

        self._next_auto_commit_ms = clock() + auto_commit_interval_ms
        self._completed_commits: collections.deque = collections.deque()   # from gRPC threads
        self._async_commits_in_flight = 0

    # ---- commits -------------------------------------------------------------------------------

    @staticmethod
    def _commit_request_offsets(offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> list:
        return [group_pb2.OffsetToCommit(topic=tp.topic, partition=tp.partition, offset=om.offset,
                                         leader_epoch=-1, metadata=om.metadata)
                for tp, om in sorted(offsets.items())]

    def default_offsets(self) -> dict[TopicPartition, OffsetAndMetadata]:
        return {tp: OffsetAndMetadata(offset) for tp, offset in self._positions().items()}

    def commit_sync(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], timeout_ms: int) -> None:
        """OffsetCommit, retried on coordinator errors until `timeout_ms`."""
        self.run_commit_callbacks()
        if not offsets:
            return
        deadline = self._clock() + timeout_ms
        attempt = 0
        last_error: EosError | None = None
        while True:
            generation_id, member_id, instance_id = self._member.commit_generation()
            try:
                stub = self._member.coordinator_stub(deadline)
                request = group_pb2.OffsetCommitRequest(
                    group_id=self._group_id, generation_id=generation_id, member_id=member_id,
                    group_instance_id=instance_id, offsets=self._commit_request_offsets(offsets))
                sent_ms = self._clock()
                response = stub.OffsetCommit(request, timeout=self._member.rpc_timeout_s(deadline))
                self._commit_answered(sent_ms)
            except grpc.RpcError as exc:
                last_error = net.error_from_rpc(exc, f"OffsetCommit of group {self._group_id}")
                if not last_error.retriable:
                    raise last_error from None
                self._member.forget_lost_coordinator(last_error.code)
            except EosError as exc:
                if not exc.retriable:
                    raise
                last_error = exc
            else:
                failed = [p for p in response.partitions if p.error_code != ErrorCode.NONE]
                if not failed:
                    return
                last_error = self._commit_error(failed, generation_id)
                if last_error is None:
                    return
            attempt += 1
            if not self._member.sleep_backoff(attempt, deadline):
                raise last_error

    def _commit_answered(self, sent_ms: int) -> None:
        """An OffsetCommit was answered (whatever its partitions' codes, as Kafka's
        commit-latency): its round trip, for the metrics."""
        if self._metrics is not None:
            self._metrics.commit_latency_seconds.observe((self._clock() - sent_ms) / 1000)

    def _commit_error(self, failed, generation_id: int) -> EosError:
        """What a failed commit means; raises unless the error is worth retrying."""
        first = failed[0]
        code = ErrorCode(first.error_code)
        where = ", ".join(f"{p.topic}-{p.partition}" for p in failed[:5])
        message = f"commit of group {self._group_id} failed for {where}: {first.error_message or code.name}"
        if self._member.forget_lost_coordinator(code):
            return error_for(code, message)
        if code in (ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.REBALANCE_IN_PROGRESS):
            self._member.commit_refused(code, generation_id)
            raise CommitFailedError(f"{message}: the group rebalanced or this member left it; the partitions "
                                    f"may belong to another member now", code)
        if code is ErrorCode.FENCED_INSTANCE_ID:
            raise self._member.instance_fenced(message)
        if reaction_for(code) is Reaction.RETRY:
            return error_for(code, message)
        raise error_for(code, message)

    def commit_async(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], callback=None) -> None:
        """OffsetCommit without waiting; `callback(offsets, error_or_None)` runs on the
        application's thread, in a later poll(), commit or close. Not retried (as Kafka)."""
        if not offsets:
            if callback is not None:
                self._completed_commits.append(_CommitDone(callback, dict(offsets)))
            return
        offsets = dict(offsets)
        try:
            generation_id, member_id, instance_id = self._member.commit_generation()
            address = self._member.coordinator_address()
            if address is None:
                self._member.coordinator_stub(self._clock() + self._request_timeout_ms)
                address = self._member.coordinator_address()
        except EosError as exc:
            self._completed_commits.append(_CommitDone(callback, offsets, error=exc))
            return
        request = group_pb2.OffsetCommitRequest(
            group_id=self._group_id, generation_id=generation_id, member_id=member_id,
            group_instance_id=instance_id, offsets=self._commit_request_offsets(offsets))
        sent_ms = self._clock()
        future = self._member.stub_for(address).OffsetCommit.future(request, timeout=self._request_timeout_ms / 1000)
        self._async_commits_in_flight += 1

        def done(f) -> None:   # a gRPC thread: only hand the result over (and time it)
            if self._metrics is not None and not f.cancelled() and f.exception() is None:
                self._commit_answered(sent_ms)
            self._completed_commits.append(_CommitDone(callback, offsets, future=f, generation_id=generation_id))
            self._wakeup.set()

        future.add_done_callback(done)

    def run_commit_callbacks(self) -> None:
        while self._completed_commits:
            done: _CommitDone = self._completed_commits.popleft()
            error = done.error
            if done.future is not None:
                self._async_commits_in_flight -= 1
                error = self._async_commit_outcome(done.future, done.generation_id)
            if done.callback is not None:
                done.callback(done.offsets, error)
            elif error is not None:
                log.warning("group %s: asynchronous commit failed: %s", self._group_id, error)

    def _async_commit_outcome(self, future, generation_id: int) -> EosError | None:
        try:
            response = future.result()
        except grpc.FutureCancelledError:
            return EosError(f"commit of group {self._group_id} cancelled", ErrorCode.NETWORK_EXCEPTION)
        except grpc.RpcError as exc:
            error = net.error_from_rpc(exc, f"OffsetCommit of group {self._group_id}")
            self._member.forget_lost_coordinator(error.code)
            return error
        failed = [p for p in response.partitions if p.error_code != ErrorCode.NONE]
        if not failed:
            return None
        try:
            return self._commit_error(failed, generation_id)
        except EosError as exc:
            return exc

    def wait_for_async_commits(self, timeout_ms: int) -> None:
        deadline = self._clock() + timeout_ms
        while self._async_commits_in_flight > 0 and self._clock() < deadline:
            self._wakeup.clear()
            self.run_commit_callbacks()
            if self._async_commits_in_flight > 0:
                self._wakeup.wait(min(0.05, max(0.0, (deadline - self._clock()) / 1000)))
        self.run_commit_callbacks()

    # ---- committed offsets ---------------------------------------------------------------------

    def fetch_committed(self, partitions: Iterable[TopicPartition], timeout_ms: int, *,
                        raise_on_timeout: bool = True) -> dict[TopicPartition, int | None] | None:
        """The committed offset of each partition (None: nothing committed), with
        require_stable: UNSTABLE_OFFSET_COMMIT (a transactional commit awaiting its marker) and
        coordinator errors are retried with backoff until `timeout_ms`; then the last error is
        raised, or None returned when `raise_on_timeout` is False."""
        wanted = list(dict.fromkeys(partitions))
        result: dict[TopicPartition, int | None] = {}
        if not wanted:
            return result
        deadline = self._clock() + timeout_ms
        attempt = 0
        while True:
            remaining = [tp for tp in wanted if tp not in result]
            error = self._fetch_committed_once(remaining, deadline, result)
            if error is None:
                return {tp: result[tp] for tp in wanted}
            attempt += 1
            if not self._member.sleep_backoff(attempt, deadline):
                if raise_on_timeout:
                    raise error
                return None

    def _fetch_committed_once(self, partitions: list[TopicPartition], deadline: int,
                              result: dict) -> EosError | None:
        """One OffsetFetch; fills `result`; returns the retriable error if any is left to retry."""
        try:
            stub = self._member.coordinator_stub(deadline)
            response = stub.OffsetFetch(group_pb2.OffsetFetchRequest(
                group_id=self._group_id, require_stable=True,
                partitions=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in partitions]),
                timeout=self._member.rpc_timeout_s(deadline))
        except grpc.RpcError as exc:
            error = net.error_from_rpc(exc, f"OffsetFetch of group {self._group_id}")
            if not error.retriable:
                raise error from None
            self._member.forget_lost_coordinator(error.code)
            return error
        except EosError as exc:
            if not exc.retriable:
                raise
            return exc
        if response.error_code != ErrorCode.NONE:
            code = ErrorCode(response.error_code)
            error = error_for(code, f"OffsetFetch of group {self._group_id}: {response.error_message or code.name}")
            self._member.forget_lost_coordinator(code)
            if reaction_for(code) is Reaction.RETRY:
                return error
            raise error
        unstable = []
        for p in response.partitions:
            tp = TopicPartition(p.topic, p.partition)
            if p.error_code == ErrorCode.UNSTABLE_OFFSET_COMMIT:
                unstable.append(tp)
            elif p.error_code != ErrorCode.NONE:
                raise error_for(p.error_code, f"OffsetFetch of group {self._group_id} for {p.topic}-{p.partition}")
            else:
                result[tp] = p.offset if p.offset >= 0 else None
        if unstable:
            return error_for(ErrorCode.UNSTABLE_OFFSET_COMMIT,
                             f"group {self._group_id} has a transactional commit pending for "
                             f"{', '.join(f'{t.topic}-{t.partition}' for t in unstable)}")
        missing = [tp for tp in partitions if tp not in result]
        if missing:
            return EosError(f"OffsetFetch of group {self._group_id} did not answer for {missing}",
                            ErrorCode.UNKNOWN_SERVER_ERROR)
        return None

    # ---- auto-commit ---------------------------------------------------------------------------

    def restart_auto_commit_timer(self) -> None:
        """A new assignment: the next auto-commit is a whole auto.commit.interval.ms away."""
        self._next_auto_commit_ms = self._clock() + self._auto_commit_interval_ms

    def maybe_auto_commit(self, now: int, *, assignment_settled: bool) -> None:
        """At a poll: commit the positions asynchronously when auto.commit.interval.ms has
        passed and `assignment_settled` (not subscribed, or the member is STABLE)."""
        if not self._enable_auto_commit or now < self._next_auto_commit_ms:
            return
        self._next_auto_commit_ms = now + self._auto_commit_interval_ms
        if not assignment_settled:
            return
        offsets = self.default_offsets()
        if offsets:
            self.commit_async(offsets, callback=self._auto_commit_done)

    def _auto_commit_done(self, offsets, error) -> None:
        if error is not None:
            log.warning("group %s: auto-commit of %d partitions failed: %s", self._group_id, len(offsets), error)

    def auto_commit_sync(self, why: str) -> None:
        offsets = self.default_offsets()
        if not offsets:
            return
        try:
            self.commit_sync(offsets, min(self._max_poll_interval_ms, self._request_timeout_ms))
        except EosError as exc:
            log.warning("group %s: auto-commit %s failed: %s", self._group_id, why, exc)

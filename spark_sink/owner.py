"""The driver's side of a participant transaction: the owner of the transactional.id.

Theory of operation
-------------------
`TransactionOwner` speaks to the transaction and group coordinators directly over gRPC,
one method per step, each retried while the answer is retriable:

    init()                      InitProducerId: a new epoch. When the previous instance (a
                                crashed driver) left a transaction open, the coordinator
                                aborts it -- with all its participants -- and answers
                                CONCURRENT_TRANSACTIONS until the abort is complete; the
                                owner retries, so init() returns with the old one fenced.
    committed(group, tps)       OffsetFetch(require_stable): the group's committed offsets
                                and metadata, waiting out a commit whose markers are in flight.
    commit_offsets(group, ...)  AddOffsetsToTxn + TxnOffsetCommit: the input offsets join the
                                open transaction (generation -1: the sink is not a group member).
    commit(accepted)            EndTxn(commit, accepted participants): the decision.
    abort()                     EndTxn(abort): every participant aborts with the owner.

The epoch goes up at every end (KIP-890), so `identity()` -- what the executors need to
register as participants -- must be taken per transaction, after the previous end.
A fenced owner (another instance initialised the same transactional.id, or the
transaction outlived transaction.timeout.ms) gets a ProducerFencedError-like EosError
and must stop. The coordinators are reached at the bootstrap address: the embedded
broker serves both (as `ClusterMetadata.txn_coordinator_stub` assumes).
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import grpc

from eos import net
from eos.client_config import security_of
from eos.errors import EosError, ErrorCode, Reaction, error_for, reaction_for
from eos.types import TopicPartition
from eos.v1 import common_pb2, group_pb2, group_pb2_grpc, txn_pb2
from producer.coordinator import first_partition_error
from spark_sink.participant import OwnerIdentity

log = logging.getLogger("eos.spark.owner")

TRANSACTION_TIMEOUT_MS_DEFAULT = 60_000
REQUEST_TIMEOUT_MS_DEFAULT = 120_000       # give up on one step (with its retries) after this
RPC_TIMEOUT_S = 30
BACKOFF_MS_BASE = 5
BACKOFF_MS_MAX = 500


def first_error(answer) -> tuple[int, str]:
    """The answer's own error, else its partitions' (the `error_of` of answers that carry
    both, such as OffsetFetch)."""
    if answer.error_code != ErrorCode.NONE:
        return answer.error_code, answer.error_message
    return first_partition_error(answer)


def retrying(call: Callable[[], "object"], what: str, *, timeout_ms: int,
             error_of: Callable[["object"], tuple[int, str]],
             retry_codes: frozenset[int] = frozenset()):
    """Run `call` until its answer's error (from `error_of`) is NONE; retry retriable
    errors (and `retry_codes`) and transport failures with backoff until `timeout_ms`.
    Returns the answer; raises the eos error for anything else."""
    deadline = time.monotonic() + timeout_ms / 1000
    backoff = net.Backoff(BACKOFF_MS_BASE, BACKOFF_MS_MAX)
    attempt = 0
    while True:
        attempt += 1
        try:
            answer = call()
        except grpc.RpcError as exc:
            error = net.error_from_rpc(exc, what)
        else:
            code, message = error_of(answer)
            if code == ErrorCode.NONE:
                return answer
            error = error_for(code, f"{what}: {message}")
            if code not in retry_codes and reaction_for(code) is not Reaction.RETRY:
                raise error
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise EosError(f"{what}: gave up after {attempt} attempts in {timeout_ms} ms: {error}",
                           getattr(error, "code", ErrorCode.REQUEST_TIMED_OUT))
        time.sleep(min(backoff.delay_ms(attempt) / 1000, remaining_s))


def fetch_committed(groups: group_pb2_grpc.GroupCoordinatorStub, group_id: str, partitions: list[TopicPartition],
                    *, timeout_ms: int = REQUEST_TIMEOUT_MS_DEFAULT,
                    require_stable: bool = True) -> dict[TopicPartition, tuple[int, str]]:
    """OffsetFetch with retries: {partition: (offset, metadata)} of the partitions the group
    has an offset for. With require_stable a pending transactional commit is waited out."""
    request = group_pb2.OffsetFetchRequest(group_id=group_id, require_stable=require_stable, partitions=[
        common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in partitions])

    answer = retrying(lambda: groups.OffsetFetch(request, timeout=RPC_TIMEOUT_S),
                      f"OffsetFetch for group {group_id!r}", timeout_ms=timeout_ms, error_of=first_error)
    return {TopicPartition(p.topic, p.partition): (p.offset, p.metadata) for p in answer.partitions if p.offset >= 0}


def group_offsets(bootstrap: str, group_id: str, partitions: list[TopicPartition], *,
                  require_stable: bool = True, client_config: dict | None = None) -> dict[TopicPartition, int]:
    """The group's committed offsets of `partitions` (those it has), by a short-lived client."""
    metadata = net.ClusterMetadata(bootstrap, security=security_of(client_config))
    try:
        stub = metadata.group_coordinator_stub(group_id)
        return {tp: offset for tp, (offset, _) in
                fetch_committed(stub, group_id, partitions, require_stable=require_stable).items()}
    finally:
        metadata.close()


class TransactionOwner:
    """Owns one transactional.id for the driver (see the module doc). Not thread-safe."""

    def __init__(self, bootstrap: str, transactional_id: str, *,
                 transaction_timeout_ms: int = TRANSACTION_TIMEOUT_MS_DEFAULT,
                 request_timeout_ms: int = REQUEST_TIMEOUT_MS_DEFAULT, client_config: dict | None = None):
        if not transactional_id:
            raise ValueError("transactional_id must be a non-empty string")
        self.bootstrap = bootstrap
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.request_timeout_ms = request_timeout_ms
        self.producer_id = -1
        self.producer_epoch = -1
        self._metadata = net.ClusterMetadata(bootstrap, security=security_of(client_config))
        self._txn = self._metadata.txn_coordinator_stub(transactional_id)

    def identity(self) -> OwnerIdentity:
        if self.producer_id < 0:
            raise EosError("the transaction owner is not initialised; call init() first", ErrorCode.INVALID_TXN_STATE)
        return OwnerIdentity(self.bootstrap, self.transactional_id, self.producer_id, self.producer_epoch)

    def _retry(self, call, what: str, error_of=None, retry_codes: frozenset[int] = frozenset()):
        return retrying(call, what, timeout_ms=self.request_timeout_ms,
                        error_of=error_of or (lambda a: (a.error_code, a.error_message)), retry_codes=retry_codes)

    def init(self) -> tuple[int, int]:
        """A new epoch for the transactional.id; fences (and aborts) any previous instance."""
        request = txn_pb2.InitProducerIdRequest(transactional_id=self.transactional_id,
                                                transaction_timeout_ms=self.transaction_timeout_ms,
                                                producer_id=-1, producer_epoch=-1)
        answer = self._retry(lambda: self._txn.InitProducerId(request, timeout=RPC_TIMEOUT_S),
                             f"InitProducerId for {self.transactional_id!r}")
        self.producer_id, self.producer_epoch = answer.producer_id, answer.producer_epoch
        log.info("transactional id %r: producer %d epoch %d", self.transactional_id, self.producer_id,
                 self.producer_epoch)
        return self.producer_id, self.producer_epoch

    def committed(self, group_id: str, partitions: list[TopicPartition]) -> dict[TopicPartition, tuple[int, str]]:
        """{partition: (offset, metadata)} the group has committed (stable: pending
        transactional commits are waited for); partitions without a commit are left out."""
        return fetch_committed(self._metadata.group_coordinator_stub(group_id), group_id, partitions,
                               timeout_ms=self.request_timeout_ms)

    def commit_offsets(self, group_id: str, offsets: dict[TopicPartition, int], metadata: str) -> None:
        """The input offsets join the open transaction (visible when it commits)."""
        add = txn_pb2.AddOffsetsToTxnRequest(transactional_id=self.transactional_id, producer_id=self.producer_id,
                                             producer_epoch=self.producer_epoch, group_id=group_id)
        self._retry(lambda: self._txn.AddOffsetsToTxn(add, timeout=RPC_TIMEOUT_S),
                    f"AddOffsetsToTxn for {self.transactional_id!r}")
        commit = group_pb2.TxnOffsetCommitRequest(
            transactional_id=self.transactional_id, group_id=group_id, producer_id=self.producer_id,
            producer_epoch=self.producer_epoch, generation_id=-1, member_id="",
            offsets=[group_pb2.OffsetToCommit(topic=tp.topic, partition=tp.partition, offset=offset,
                                              leader_epoch=-1, metadata=metadata)
                     for tp, offset in sorted(offsets.items())])
        groups = self._metadata.group_coordinator_stub(group_id)
        self._retry(lambda: groups.TxnOffsetCommit(commit, timeout=RPC_TIMEOUT_S),
                    f"TxnOffsetCommit for group {group_id!r}",
                    error_of=first_partition_error)

    def _end(self, committed: bool, accepted: list[int]) -> None:
        request = txn_pb2.EndTxnRequest(transactional_id=self.transactional_id, producer_id=self.producer_id,
                                        producer_epoch=self.producer_epoch, committed=committed,
                                        accepted_participants=sorted(accepted))
        # A retry after a lost answer carries the same pair; the coordinator recognises it.
        answer = self._retry(lambda: self._txn.EndTxn(request, timeout=RPC_TIMEOUT_S),
                             f"EndTxn({'commit' if committed else 'abort'}) for {self.transactional_id!r}")
        self.producer_id, self.producer_epoch = answer.producer_id, answer.producer_epoch

    def commit(self, accepted_participants: list[int]) -> None:
        """Decide: the owner's writes and the accepted participants' commit; the rest abort."""
        self._end(True, accepted_participants)

    def abort(self) -> None:
        self._end(False, [])

    def close(self) -> None:
        self._metadata.close()


__all__ = ["TransactionOwner", "TRANSACTION_TIMEOUT_MS_DEFAULT", "fetch_committed", "group_offsets"]

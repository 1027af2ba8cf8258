"""The TxnCoordinator gRPC service: a thin shell over `TransactionCoordinator`.

Theory of operation
-------------------
Each RPC has the same shape: read the request, ask the owner of the state, build the
response. Errors travel as Kafka codes in the response, never as gRPC failures, so a client
handles them like any other Kafka error. Until the coordinator has replayed its log, every
transactional request is answered COORDINATOR_LOAD_IN_PROGRESS (retriable).

InitParticipant hands the owner of a transactional.id a participant producer id for its
open transaction (see txn_coordinator.state); AddPartitionsToTxn, its verify_only form and
EndTxn's accepted_participants take participants' ids.

InitProducerId without a transactional.id serves an idempotent producer: it always gets a
fresh producer id with epoch 0, also when it passes its current id and epoch to "bump" it
after a sequence error (KIP-360). That is what Kafka does for idempotent producers: the
coordinator keeps no state for them, so a fresh id is the safe bump; the old id's state on
the brokers expires (producer.id.expiration.ms).

Authorization. With an `authorizer` (the broker's, duck-typed: `allowed(operation,
resource_type, name)`, `allowed_on_any(operation, resource_type)`, `principal()`; None: no
checks), each RPC first checks what Kafka checks and answers a refusal before it asks the
coordinator anything, so a refused request changes no transaction:
InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and InitParticipant need WRITE
on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); AddPartitionsToTxn and
InitParticipant also WRITE on every topic they register (one refused topic: nothing is
registered, its partitions TOPIC_AUTHORIZATION_FAILED, the others OPERATION_NOT_ATTEMPTED);
AddOffsetsToTxn READ on the group. An idempotent InitProducerId needs IDEMPOTENT_WRITE on
the cluster or WRITE on some topic (KIP-679). The verify_only form of AddPartitionsToTxn is
a broker's question: CLUSTER_ACTION. ListTransactions shows only the ids the caller may
DESCRIBE; DescribeTransactions refuses the others. AbortTransaction (an admin writing the
ABORT marker of a hanging transaction) needs ALTER on the cluster, the permission Kafka
3.8+ accepts for an admin's WriteTxnMarkers (KIP-1037), or CLUSTER_ACTION.
"""
from __future__ import annotations

import functools
import logging

from eos.acl import Operation, ResourceType
from eos.errors import EosError, ErrorCode
from eos.types import TopicPartition
from eos.v1 import common_pb2, txn_pb2, txn_pb2_grpc
from txn_coordinator.coordinator import TransactionCoordinator
from txn_coordinator.producer_ids import ProducerIdManager
from txn_coordinator.state import TxnMetadata, TxnState

log = logging.getLogger("eos.txn_coordinator")


def _guarded(response_type, **defaults):
    """Answer COORDINATOR_LOAD_IN_PROGRESS before the log is loaded, and turn an unexpected
    exception into UNKNOWN_SERVER_ERROR for this request only: the coordinator keeps serving."""
    def wrap(handler):
        @functools.wraps(handler)
        def guarded(self, request, context):
            if not self._coordinator.ready:
                return response_type(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                     error_message="the transaction coordinator is loading its log", **defaults)
            try:
                return handler(self, request, context)
            except EosError as exc:
                return response_type(error_code=int(exc.code), error_message=str(exc), **defaults)
            except Exception as exc:
                log.exception("%s failed", handler.__name__)
                return response_type(error_code=ErrorCode.UNKNOWN_SERVER_ERROR,
                                     error_message=f"{type(exc).__name__}: {exc}", **defaults)
        return guarded
    return wrap


def _tps(partitions) -> list[TopicPartition]:
    return [TopicPartition(p.topic, p.partition) for p in partitions]


class TxnCoordinatorServicer(txn_pb2_grpc.TxnCoordinatorServicer):
    def __init__(self, producer_ids: ProducerIdManager, coordinator: TransactionCoordinator, *, authorizer=None):
        self._producer_ids = producer_ids
        self._coordinator = coordinator
        self._authorizer = authorizer

    # ---- authorization (see the module doc) ----------------------------------------------------

    def _refuse_id(self, transactional_id: str, operation: Operation = Operation.WRITE) -> str | None:
        """Why the caller may not `operation` the transactional id, or None."""
        return self._authorizer.refusal(operation, ResourceType.TRANSACTIONAL_ID, transactional_id)

    def _refuse_topics(self, partitions: list[TopicPartition]) -> dict[TopicPartition, tuple[int, str]] | None:
        """None when the caller may WRITE every topic; else every partition's answer: the
        refused ones TOPIC_AUTHORIZATION_FAILED, the rest OPERATION_NOT_ATTEMPTED (Kafka's)."""
        refused = {tp.topic for tp in partitions
                   if not self._authorizer.allowed(Operation.WRITE, ResourceType.TOPIC, tp.topic)}
        if not refused:
            return None
        who = self._authorizer.principal()
        return {tp: (ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"{who} is not authorized to WRITE topic {tp.topic!r}")
                if tp.topic in refused else
                (ErrorCode.OPERATION_NOT_ATTEMPTED, f"not attempted: the request names topics {sorted(refused)} "
                                                    f"{who} may not write")
                for tp in partitions}

    def _cluster_allows(self, *operations: Operation) -> bool:
        return any(self._authorizer.allowed(operation, ResourceType.CLUSTER) for operation in operations)

    def InitProducerId(self, request, context):
        if self._authorizer is not None:
            if not request.transactional_id:
                if not (self._cluster_allows(Operation.IDEMPOTENT_WRITE)
                        or self._authorizer.allowed_on_any(Operation.WRITE, ResourceType.TOPIC)):
                    return txn_pb2.InitProducerIdResponse(
                        error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, producer_id=-1, producer_epoch=-1,
                        error_message=f"{self._authorizer.principal()} may neither IDEMPOTENT_WRITE the cluster "
                                      f"nor WRITE any topic")
            else:
                why = self._refuse_id(request.transactional_id)
                if why is not None:
                    return txn_pb2.InitProducerIdResponse(error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                                          error_message=why, producer_id=-1, producer_epoch=-1)
        if not request.transactional_id:
            return self._init_idempotent()
        return self._init_transactional(request, context)

    def _init_idempotent(self) -> txn_pb2.InitProducerIdResponse:
        try:
            producer_id = self._producer_ids.next_id()
        except Exception as exc:  # the client retries; nothing was handed out
            log.exception("producer id allocation failed")
            return txn_pb2.InitProducerIdResponse(
                error_code=int(getattr(exc, "code", ErrorCode.UNKNOWN_SERVER_ERROR)),
                error_message=f"producer id allocation failed: {exc}", producer_id=-1, producer_epoch=-1)
        return txn_pb2.InitProducerIdResponse(error_code=ErrorCode.NONE, producer_id=producer_id, producer_epoch=0)

    @_guarded(txn_pb2.InitProducerIdResponse, producer_id=-1, producer_epoch=-1)
    def _init_transactional(self, request, context):
        d = self._coordinator.init_producer_id(request.transactional_id, request.transaction_timeout_ms,
                                               request.producer_id, request.producer_epoch)
        return txn_pb2.InitProducerIdResponse(error_code=int(d.error), error_message=d.message,
                                              producer_id=d.producer_id if d.ok else -1,
                                              producer_epoch=d.producer_epoch if d.ok else -1)

    @_guarded(txn_pb2.InitParticipantResponse, producer_id=-1, producer_epoch=-1)
    def InitParticipant(self, request, context):
        if self._authorizer is not None:
            why = self._refuse_id(request.transactional_id)
            if why is None:
                refused = self._refuse_topics(_tps(request.partitions))
                why = None if refused is None else next(m for c, m in refused.values()
                                                        if c == ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            else:
                code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            if why is not None:
                return txn_pb2.InitParticipantResponse(error_code=code, error_message=why, producer_id=-1,
                                                       producer_epoch=-1)
        d = self._coordinator.init_participant(request.transactional_id, request.producer_id,
                                               request.producer_epoch, _tps(request.partitions))
        return txn_pb2.InitParticipantResponse(error_code=int(d.error), error_message=d.message,
                                               producer_id=d.producer_id if d.ok else -1,
                                               producer_epoch=d.producer_epoch if d.ok else -1)

    @_guarded(txn_pb2.AddPartitionsToTxnResponse)
    def AddPartitionsToTxn(self, request, context):
        partitions = _tps(request.partitions)
        if self._authorizer is not None:
            refusal = self._authorize_add_partitions(request, partitions)
            if refusal is not None:
                return refusal
        if request.verify_only:
            d = self._coordinator.verify_partitions(request.transactional_id, request.producer_id,
                                                    request.producer_epoch, partitions)
        else:
            d = self._coordinator.add_partitions(request.transactional_id, request.producer_id,
                                                 request.producer_epoch, partitions)
        results = [txn_pb2.PartitionTxnResult(topic=tp.topic, partition=tp.partition,
                                              error_code=int(d.partition_errors.get(tp, d.error)),
                                              error_message=d.message)
                   for tp in partitions]
        return txn_pb2.AddPartitionsToTxnResponse(error_code=int(d.error), error_message=d.message,
                                                  partitions=results)

    def _authorize_add_partitions(self, request, partitions) -> txn_pb2.AddPartitionsToTxnResponse | None:
        if request.verify_only:
            if self._cluster_allows(Operation.CLUSTER_ACTION):
                return None
            code, why = (ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                         f"{self._authorizer.principal()} is not authorized to CLUSTER_ACTION the cluster "
                         f"(a verify_only AddPartitionsToTxn is a broker's request)")
            answers = {tp: (code, why) for tp in partitions}
        else:
            why = self._refuse_id(request.transactional_id)
            if why is not None:
                code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                answers = {tp: (code, why) for tp in partitions}
            else:
                answers = self._refuse_topics(partitions)
                if answers is None:
                    return None
                code, why = ErrorCode.TOPIC_AUTHORIZATION_FAILED, next(
                    m for c, m in answers.values() if c == ErrorCode.TOPIC_AUTHORIZATION_FAILED)
        return txn_pb2.AddPartitionsToTxnResponse(error_code=code, error_message=why, partitions=[
            txn_pb2.PartitionTxnResult(topic=tp.topic, partition=tp.partition, error_code=answers[tp][0],
                                       error_message=answers[tp][1]) for tp in partitions])

    @_guarded(txn_pb2.AddOffsetsToTxnResponse)
    def AddOffsetsToTxn(self, request, context):
        if self._authorizer is not None:
            why = self._refuse_id(request.transactional_id)
            if why is not None:
                return txn_pb2.AddOffsetsToTxnResponse(error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                                       error_message=why)
            if not self._authorizer.allowed(Operation.READ, ResourceType.GROUP, request.group_id):
                return txn_pb2.AddOffsetsToTxnResponse(
                    error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED,
                    error_message=f"{self._authorizer.principal()} is not authorized to READ group {request.group_id!r}")
        d = self._coordinator.add_offsets(request.transactional_id, request.producer_id, request.producer_epoch,
                                          request.group_id)
        return txn_pb2.AddOffsetsToTxnResponse(error_code=int(d.error), error_message=d.message)

    @_guarded(txn_pb2.EndTxnResponse, producer_id=-1, producer_epoch=-1)
    def EndTxn(self, request, context):
        if self._authorizer is not None:
            why = self._refuse_id(request.transactional_id)
            if why is not None:
                return txn_pb2.EndTxnResponse(error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                              error_message=why, producer_id=-1, producer_epoch=-1)
        d = self._coordinator.end_transaction(request.transactional_id, request.producer_id, request.producer_epoch,
                                              request.committed, list(request.accepted_participants))
        return txn_pb2.EndTxnResponse(error_code=int(d.error), error_message=d.message,
                                      producer_id=d.producer_id if d.ok else -1,
                                      producer_epoch=d.producer_epoch if d.ok else -1)

    @_guarded(txn_pb2.ListTransactionsResponse)
    def ListTransactions(self, request, context):
        try:
            states = [TxnState.from_display_name(name) for name in request.state_filters]
        except ValueError:
            return txn_pb2.ListTransactionsResponse(error_code=ErrorCode.INVALID_REQUEST)
        found = self._coordinator.list(states=states, producer_ids=list(request.producer_id_filters),
                                       running_longer_than_ms=request.duration_filter_ms)
        if self._authorizer is not None:   # the ids it may not describe do not exist for it
            found = [md for md in found if self._authorizer.allowed(
                Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, md.transactional_id)]
        return txn_pb2.ListTransactionsResponse(error_code=ErrorCode.NONE, transactions=[
            txn_pb2.TransactionListing(transactional_id=md.transactional_id, producer_id=md.producer_id,
                                       state=md.state.display_name, participant_count=len(md.participants))
            for md in found])

    def DescribeTransactions(self, request, context):
        return txn_pb2.DescribeTransactionsResponse(
            transactions=[self._describe(tid) for tid in request.transactional_ids])

    def _describe(self, transactional_id: str) -> txn_pb2.TransactionDescription:
        if self._authorizer is not None:
            why = self._refuse_id(transactional_id, Operation.DESCRIBE)
            if why is not None:
                return txn_pb2.TransactionDescription(
                    transactional_id=transactional_id, error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    error_message=why)
        if not self._coordinator.ready:
            return txn_pb2.TransactionDescription(transactional_id=transactional_id,
                                                  error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        refusal = self._coordinator.ownership_refusal(transactional_id)
        if refusal is not None:
            return txn_pb2.TransactionDescription(transactional_id=transactional_id, error_code=refusal.error,
                                                  error_message=refusal.message)
        md: TxnMetadata | None = self._coordinator.describe(transactional_id)
        if md is None:
            return txn_pb2.TransactionDescription(
                transactional_id=transactional_id, error_code=ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
                error_message=f"no transactional id {transactional_id!r}")
        return txn_pb2.TransactionDescription(
            transactional_id=transactional_id, error_code=ErrorCode.NONE, state=md.state.display_name,
            producer_id=md.producer_id, producer_epoch=md.producer_epoch, transaction_timeout_ms=md.timeout_ms,
            transaction_start_time_ms=md.start_time_ms,
            partitions=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition)
                        for tp in sorted(md.partitions)],
            coordinator_epoch=self._coordinator.coordinator_epoch,
            participants=[txn_pb2.TxnParticipant(
                producer_id=p.producer_id, producer_epoch=p.producer_epoch, accepted=p.accepted,
                partitions=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition)
                            for tp in sorted(p.partitions)])
                for p in md.participants])

    @_guarded(txn_pb2.AbortTransactionResponse)
    def AbortTransaction(self, request, context):
        if self._authorizer is not None and not self._cluster_allows(Operation.ALTER, Operation.CLUSTER_ACTION):
            return txn_pb2.AbortTransactionResponse(
                error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                error_message=f"{self._authorizer.principal()} is not authorized to ALTER the cluster "
                              f"(aborting a hanging transaction writes a marker, KIP-1037)")
        tp = TopicPartition(request.partition.topic, request.partition.partition)
        code, message = self._coordinator.abort_hanging(tp, request.producer_id, request.producer_epoch,
                                                        request.coordinator_epoch)
        return txn_pb2.AbortTransactionResponse(error_code=int(code), error_message=message)

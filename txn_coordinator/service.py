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
"""
from __future__ import annotations

import functools
import logging

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
    def __init__(self, producer_ids: ProducerIdManager, coordinator: TransactionCoordinator):
        self._producer_ids = producer_ids
        self._coordinator = coordinator

    def InitProducerId(self, request, context):
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
        d = self._coordinator.init_participant(request.transactional_id, request.producer_id,
                                               request.producer_epoch, _tps(request.partitions))
        return txn_pb2.InitParticipantResponse(error_code=int(d.error), error_message=d.message,
                                               producer_id=d.producer_id if d.ok else -1,
                                               producer_epoch=d.producer_epoch if d.ok else -1)

    @_guarded(txn_pb2.AddPartitionsToTxnResponse)
    def AddPartitionsToTxn(self, request, context):
        partitions = _tps(request.partitions)
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

    @_guarded(txn_pb2.AddOffsetsToTxnResponse)
    def AddOffsetsToTxn(self, request, context):
        d = self._coordinator.add_offsets(request.transactional_id, request.producer_id, request.producer_epoch,
                                          request.group_id)
        return txn_pb2.AddOffsetsToTxnResponse(error_code=int(d.error), error_message=d.message)

    @_guarded(txn_pb2.EndTxnResponse, producer_id=-1, producer_epoch=-1)
    def EndTxn(self, request, context):
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
        return txn_pb2.ListTransactionsResponse(error_code=ErrorCode.NONE, transactions=[
            txn_pb2.TransactionListing(transactional_id=md.transactional_id, producer_id=md.producer_id,
                                       state=md.state.display_name, participant_count=len(md.participants))
            for md in found])

    def DescribeTransactions(self, request, context):
        return txn_pb2.DescribeTransactionsResponse(
            transactions=[self._describe(tid) for tid in request.transactional_ids])

    def _describe(self, transactional_id: str) -> txn_pb2.TransactionDescription:
        if not self._coordinator.ready:
            return txn_pb2.TransactionDescription(transactional_id=transactional_id,
                                                  error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
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
        tp = TopicPartition(request.partition.topic, request.partition.partition)
        code, message = self._coordinator.abort_hanging(tp, request.producer_id, request.producer_epoch,
                                                        request.coordinator_epoch)
        return txn_pb2.AbortTransactionResponse(error_code=int(code), error_message=message)

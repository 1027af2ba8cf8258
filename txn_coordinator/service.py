"""The TxnCoordinator gRPC service (for now: producer ids for idempotent producers).

Theory of operation
-------------------
A thin shell over the pure parts: each RPC reads its request, asks the owner of the state
(`ProducerIdManager` for ids) and builds the response; errors travel as codes in the
response, never as gRPC failures, so a client handles them like any other Kafka error.

InitProducerId without a transactional.id serves an idempotent producer: it always gets a
fresh producer id with epoch 0, also when it passes its current id and epoch to "bump" it
after a sequence error (KIP-360). That is what Kafka does for idempotent producers: the
coordinator keeps no state for them, so a fresh id is the safe bump; the old id's state on
the brokers simply expires (producer.id.expiration.ms).

Everything to do with transactional.id (fencing, the transaction state machine, markers)
arrives with the transactions work; until then those requests, and every other RPC of the
service, are answered with UNSUPPORTED_VERSION and a message saying so.
"""
from __future__ import annotations

import logging

from eos.errors import EosError, ErrorCode
from eos.v1 import txn_pb2, txn_pb2_grpc
from txn_coordinator.producer_ids import ProducerIdManager

log = logging.getLogger("eos.txn_coordinator")

TRANSACTIONS_NOT_IMPLEMENTED = "transactions are not implemented yet"


class TxnCoordinatorServicer(txn_pb2_grpc.TxnCoordinatorServicer):
    def __init__(self, producer_ids: ProducerIdManager):
        self._producer_ids = producer_ids

    def InitProducerId(self, request: txn_pb2.InitProducerIdRequest, context) -> txn_pb2.InitProducerIdResponse:
        if request.transactional_id:
            return txn_pb2.InitProducerIdResponse(
                error_code=ErrorCode.UNSUPPORTED_VERSION,
                error_message=f"{TRANSACTIONS_NOT_IMPLEMENTED} (transactional.id "
                              f"{request.transactional_id!r})",
                producer_id=-1, producer_epoch=-1)
        try:
            producer_id = self._producer_ids.next_id()
        except EosError as exc:
            log.error("InitProducerId failed: %s", exc)
            return txn_pb2.InitProducerIdResponse(
                error_code=int(exc.code), error_message=str(exc), producer_id=-1, producer_epoch=-1)
        except Exception as exc:  # the coordinator keeps serving; the client retries
            log.exception("InitProducerId failed unexpectedly")
            return txn_pb2.InitProducerIdResponse(
                error_code=ErrorCode.UNKNOWN_SERVER_ERROR,
                error_message=f"producer id allocation failed: {type(exc).__name__}: {exc}",
                producer_id=-1, producer_epoch=-1)
        return txn_pb2.InitProducerIdResponse(
            error_code=ErrorCode.NONE, producer_id=producer_id, producer_epoch=0)

    # ---- not yet: transactions (issue 4) -------------------------------------------------

    def AddPartitionsToTxn(self, request, context):
        return txn_pb2.AddPartitionsToTxnResponse(
            error_code=ErrorCode.UNSUPPORTED_VERSION, error_message=TRANSACTIONS_NOT_IMPLEMENTED,
            partitions=[txn_pb2.PartitionTxnResult(
                topic=tp.topic, partition=tp.partition, error_code=ErrorCode.UNSUPPORTED_VERSION,
                error_message=TRANSACTIONS_NOT_IMPLEMENTED) for tp in request.partitions])

    def AddOffsetsToTxn(self, request, context):
        return txn_pb2.AddOffsetsToTxnResponse(
            error_code=ErrorCode.UNSUPPORTED_VERSION, error_message=TRANSACTIONS_NOT_IMPLEMENTED)

    def EndTxn(self, request, context):
        return txn_pb2.EndTxnResponse(
            error_code=ErrorCode.UNSUPPORTED_VERSION, error_message=TRANSACTIONS_NOT_IMPLEMENTED,
            producer_id=-1, producer_epoch=-1)

    def ListTransactions(self, request, context):
        return txn_pb2.ListTransactionsResponse(error_code=ErrorCode.UNSUPPORTED_VERSION)

    def DescribeTransactions(self, request, context):
        return txn_pb2.DescribeTransactionsResponse(transactions=[
            txn_pb2.TransactionDescription(
                transactional_id=tid, error_code=ErrorCode.UNSUPPORTED_VERSION,
                error_message=TRANSACTIONS_NOT_IMPLEMENTED)
            for tid in request.transactional_ids])

    def AbortTransaction(self, request, context):
        return txn_pb2.AbortTransactionResponse(
            error_code=ErrorCode.UNSUPPORTED_VERSION, error_message=TRANSACTIONS_NOT_IMPLEMENTED)

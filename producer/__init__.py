"""The eos producer: idempotent and transactional writes over gRPC."""
from __future__ import annotations

from producer.accumulator import BufferExhaustedError, ProducerClosedError
from producer.batch import RecordFuture, RecordMetadata, SendBatchResult
from producer.producer import Producer
from producer.transactions import IllegalStateError, TransactionAbortedError, TransactionTimeoutError

__all__ = ["Producer", "RecordMetadata", "RecordFuture", "SendBatchResult",
           "BufferExhaustedError", "ProducerClosedError", "IllegalStateError", "TransactionAbortedError",
           "TransactionTimeoutError"]

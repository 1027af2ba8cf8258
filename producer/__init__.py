"""The eos producer: idempotent (and, later, transactional) writes over gRPC."""
from __future__ import annotations

from producer.accumulator import (
    BufferExhaustedError,
    ProducerClosedError,
    RecordFuture,
    RecordMetadata,
    SendBatchResult,
)
from producer.producer import Producer

__all__ = ["Producer", "RecordMetadata", "RecordFuture", "SendBatchResult",
           "BufferExhaustedError", "ProducerClosedError"]

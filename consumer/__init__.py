"""The eos consumer: assignment, pipelined fetches, read_committed filtering."""
from __future__ import annotations

from consumer.consumer import Consumer, NoOffsetForPartitionError

__all__ = ["Consumer", "NoOffsetForPartitionError"]

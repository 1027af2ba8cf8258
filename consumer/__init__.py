"""The eos consumer: assignment or consumer groups, pipelined fetches, read_committed filtering."""
from __future__ import annotations

from consumer.consumer import Consumer, NoOffsetForPartitionError
from consumer.group import CommitFailedError, ConsumerGroupMetadata, FencedInstanceIdError, OffsetAndMetadata

__all__ = ["Consumer", "NoOffsetForPartitionError", "ConsumerGroupMetadata", "OffsetAndMetadata",
           "CommitFailedError", "FencedInstanceIdError"]

"""Plain value types shared by clients and the broker."""
from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class Record(NamedTuple):
    """A record as a consumer sees it. `headers` is a list of (str, bytes | None)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: list
    timestamp_type: int = 0

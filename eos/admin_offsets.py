"""`eos.Admin`'s offsets: ListOffsets (list_offsets, end_offsets) and DeleteRecords
(delete_records, kafka-delete-records), each asked of the partitions' leaders.

Theory of operation
-------------------
`OffsetAdmin` is a part of `eos.Admin` (its base class), as `TransactionAdmin` is: it uses
the Admin's plumbing (`_ask_leaders`, which groups the partitions by leader and asks again
of whoever leads after a retriable answer; `_ask_once`; the request timeout) and keeps no
state. Arguments are checked whole before anything is sent.
"""
from __future__ import annotations

from eos.admin_arguments import isolation_level_code
from eos.errors import EosError, ErrorCode, error_for, raise_if_error
from eos.types import TopicPartition
from eos.v1 import broker_pb2

_OFFSET_SPECS = {"earliest": -2, "latest": -1, "max_timestamp": -3}


class OffsetAdmin:
    """See the module doc."""

    def list_offsets(self, specs: dict, *, isolation_level: str = "read_uncommitted") -> dict[TopicPartition, int]:
        """{tp: "earliest" | "latest" | "max_timestamp" | timestamp_ms} -> {tp: offset}.

        "latest" is the high watermark (the last stable offset under read_committed); a
        timestamp gives the earliest offset whose timestamp is >= it, or -1 if none is.
        """
        level = isolation_level_code(isolation_level)
        partitions = []
        for tp, spec in specs.items():
            topic, partition = tp
            if isinstance(spec, str):
                if spec not in _OFFSET_SPECS:
                    raise ValueError(f"offset spec for {topic}-{partition} must be earliest, latest, "
                                     f"max_timestamp or a timestamp in ms, got {spec!r}")
                timestamp = _OFFSET_SPECS[spec]
            elif isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
                timestamp = spec
            else:
                raise ValueError(f"offset spec for {topic}-{partition} must be earliest, latest, "
                                 f"max_timestamp or a timestamp in ms, got {spec!r}")
            partitions.append(broker_pb2.ListOffsetsPartition(topic=topic, partition=partition,
                                                              timestamp=timestamp))
        if not partitions:
            return {}
        result = {}
        for listed in self._list_offsets_at_leaders(level, partitions):
            raise_if_error(listed, f"cannot list offsets of {listed.topic}-{listed.partition}")
            result[TopicPartition(listed.topic, listed.partition)] = listed.offset
        return result

    def _list_offsets_at_leaders(self, level: int, partitions: list) -> list:
        """ListOffsets of `partitions` (ListOffsetsPartition), asked of their leaders."""
        return self._ask_leaders(
            partitions,
            lambda stub, group, timeout_s: self._ask_once("ListOffsets", stub.ListOffsets, broker_pb2.ListOffsetsRequest(
                isolation_level=level, partitions=group), timeout_s).partitions,
            lambda p, code, message: broker_pb2.ListedOffset(topic=p.topic, partition=p.partition, error_code=code,
                                                             error_message=message, offset=-1, timestamp=-1))

    def end_offsets(self, partitions, isolation_level: str = "read_uncommitted") -> dict[TopicPartition, int | None]:
        """{tp: its end}: ListOffsets latest, one request per leader (the high watermark, or
        the LSO under read_committed); None where the partition answers an error (a topic
        deleted since, say) instead of raising, so that one gone partition spoils no overview."""
        partitions = sorted(set(partitions))
        if not partitions:
            return {}
        listed_offsets = self._list_offsets_at_leaders(
            isolation_level_code(isolation_level),
            [broker_pb2.ListOffsetsPartition(topic=tp.topic, partition=tp.partition, timestamp=-1)
             for tp in partitions])
        result: dict[TopicPartition, int | None] = dict.fromkeys(partitions)
        for listed in listed_offsets:
            if listed.error_code == ErrorCode.NONE:
                result[TopicPartition(listed.topic, listed.partition)] = listed.offset
        return result

    def delete_records(self, offsets: dict, *, timeout_ms: int | None = None) -> dict[TopicPartition, int | EosError]:
        """kafka-delete-records: {tp: offset} -> {tp: its low watermark, or the EosError it
        answered}. Records before each offset are deleted (-1: every record up to the high
        watermark); each leader answers once every live replica's log start has followed, or
        after `timeout_ms` (default request.timeout.ms; 0: at once) with REQUEST_TIMED_OUT. A
        retriable answer (that one, a leader that moved) is asked again, of whoever leads
        then, until default.api.timeout.ms; the deletion itself is done once."""
        partitions = []
        for tp, offset in offsets.items():
            topic, partition = tp
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < -1:
                raise ValueError(f"the offset to delete records of {topic}-{partition} before must be an "
                                 f"offset or -1 (the high watermark), got {offset!r}")
            partitions.append(broker_pb2.DeleteRecordsPartition(topic=topic, partition=partition, offset=offset))
        if not partitions:
            return {}
        wait_ms = self._request_timeout_ms if timeout_ms is None else timeout_ms
        if isinstance(wait_ms, bool) or not isinstance(wait_ms, int) or wait_ms < 0:
            raise ValueError(f"timeout_ms must be >= 0, got {timeout_ms!r}")
        answers = self._ask_leaders(
            partitions,
            lambda stub, group, timeout_s: self._ask_once(
                "DeleteRecords", stub.DeleteRecords,
                broker_pb2.DeleteRecordsRequest(partitions=group, timeout_ms=wait_ms),
                max(timeout_s, wait_ms / 1000 + 5)).partitions,
            lambda p, code, message: broker_pb2.DeleteRecordsResult(topic=p.topic, partition=p.partition,
                                                                    error_code=code, error_message=message,
                                                                    low_watermark=-1))
        return {TopicPartition(a.topic, a.partition):
                a.low_watermark if a.error_code == ErrorCode.NONE
                else error_for(a.error_code, a.error_message or f"cannot delete records of {a.topic}-{a.partition}: "
                                                                  f"{ErrorCode(a.error_code).name}")
                for a in answers}

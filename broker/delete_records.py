"""Kafka's DeleteRecords (kafka-delete-records.sh): a partition's records before an offset go.

Theory of operation
-------------------
The request names, per partition, the offset before which records are deleted (-1: the
high watermark). Each partition's leader checks it (`deletion_offset`, pure: Kafka's rules
in Partition.deleteRecordsOnLeader) and moves its log start offset there
(`Log.delete_records_before`): readers below it get OFFSET_OUT_OF_RANGE from then on, ListOffsets
"earliest" answers it, and whole segments below it are deleted. The log start offset
checkpoint is written at once, so a restart never brings the records back.

Refused, changing nothing: a topic without DELETE permission (TOPIC_AUTHORIZATION_FAILED),
an offset past the high watermark or below -1 (OFFSET_OUT_OF_RANGE), a topic whose
cleanup.policy has no "delete" (POLICY_VIOLATION: compaction keeps the latest value of every
key, and a hole below it would lose some), the coordinators' internal topics
(INVALID_TOPIC_EXCEPTION), a partition led elsewhere (NOT_LEADER_OR_FOLLOWER).

The answer's low watermark is the smallest log start offset over the live replicas. On one
broker that is its own. On a cluster the followers take the leader's log start from their
next Fetch answer and report theirs in the Fetch after, and the leader answers once every
live replica's log start has reached the offset (Kafka's DelayedDeleteRecords; the
replica manager's `wait_for_low_watermark`), or REQUEST_TIMED_OUT with the low watermark
reached when timeout_ms passes first: the leader's deletion stands either way.
"""
from __future__ import annotations

import contextlib
import logging
import time

from broker.acl import Operation
from broker.request_gate import gated
from broker.topics import PROTECTED_INTERNAL_TOPICS
from eos.errors import EosError, ErrorCode, InvalidTopicError, OffsetOutOfRangeError, error_code_and_message
from eos.types import TopicPartition
from eos.v1 import broker_pb2

log = logging.getLogger("eos.broker")

HIGH_WATERMARK = -1          # DeleteRecordsRequest.HIGH_WATERMARK: delete everything readable
DELETE_RECORDS_TIMEOUT_MS_DEFAULT = 30_000


def deletion_offset(topic: str, partition: int, requested: int, high_watermark: int, delete_policy: bool) -> int:
    """The offset the log start moves to, or the EosError refusing it (see the module doc)."""
    if topic in PROTECTED_INTERNAL_TOPICS:
        raise InvalidTopicError(f"cannot delete records of internal topic {topic!r}")
    if not delete_policy:
        raise EosError(f"records of {topic}-{partition} cannot be deleted: its cleanup.policy has no 'delete'",
                       ErrorCode.POLICY_VIOLATION)
    offset = high_watermark if requested == HIGH_WATERMARK else requested
    if offset < 0:
        raise OffsetOutOfRangeError(f"{topic}-{partition}: {requested} is not an offset (-1 is the high watermark)")
    if offset > high_watermark:
        raise OffsetOutOfRangeError(f"{topic}-{partition}: cannot delete records before {offset}, past the "
                                    f"high watermark {high_watermark}")
    return offset


def _result(p, code: int, message: str = "", low_watermark: int = -1) -> broker_pb2.DeleteRecordsResult:
    return broker_pb2.DeleteRecordsResult(topic=p.topic, partition=p.partition, error_code=code,
                                          error_message=message, low_watermark=low_watermark)


class DeleteRecordsHandler:
    """The RPC, for `broker.service.BrokerServicer` (which gives the lookups, the replica
    manager, the log manager, the purgatory and the authorization helpers used here)."""

    @gated
    def DeleteRecords(self, request: broker_pb2.DeleteRecordsRequest, context) -> broker_pb2.DeleteRecordsResponse:
        timeout_ms = request.timeout_ms if request.HasField("timeout_ms") else DELETE_RECORDS_TIMEOUT_MS_DEFAULT
        # one deadline for the whole request, as Kafka's one DelayedDeleteRecords has
        deadline_s = time.monotonic() + max(timeout_ms, 0) / 1000.0
        results, waiting = [], []
        for p in request.partitions:
            if self._authorizer is not None and self._topic_denied(Operation.DELETE, p.topic):
                results.append(_result(p, ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                       self._denial(Operation.DELETE, f"topic {p.topic!r}")))
                continue
            result, deleted = self._delete_records(p)
            results.append(result)
            if deleted is not None:
                waiting.append((result, *deleted))
        if not waiting:
            return broker_pb2.DeleteRecordsResponse(partitions=results)
        self._log_manager.checkpoint()
        for result, _, _ in waiting:
            # NONE promises the deletion survives a crash: a checkpoint that could not be
            # written took its log dir offline (broker/storage/log_dirs.py), which says why.
            offline = self._log_manager.offline_reason(result.topic, result.partition)
            if offline is not None:
                result.error_code, result.error_message, result.low_watermark = (
                    ErrorCode.KAFKA_STORAGE_ERROR, offline, -1)
        waiting = [entry for entry in waiting if entry[0].error_code == ErrorCode.NONE]
        for result, _, _ in waiting:
            # wakes the followers' fetch sessions, which then answer the new log start (or the
            # session's periodic look at every partition does, within a second)
            self._purgatory.notify(TopicPartition(result.topic, result.partition))
        if self._replicas is not None:        # (one broker: its own log start is the low watermark)
            for result, offset, partition_log in waiting:
                remaining_ms = max(0, int((deadline_s - time.monotonic()) * 1000))
                code, low, message = self._replicas.wait_for_low_watermark(
                    result.topic, result.partition, offset, remaining_ms, partition_log)
                result.error_code, result.low_watermark, result.error_message = code, low, message
        return broker_pb2.DeleteRecordsResponse(partitions=results)

    def _delete_records(self, p: broker_pb2.DeleteRecordsPartition):
        """(this partition's result, (the offset deleted to, its log) or None when refused)."""
        try:
            partition_log = self._log_for(p.topic, p.partition)      # an unknown topic first, as Kafka
            # as Kafka's leaderIsrUpdateLock: leadership cannot end between the check and the move
            with (self._replicas.leader_append(p.topic, p.partition) if self._replicas is not None
                  else contextlib.nullcontext()):
                offset = deletion_offset(p.topic, p.partition, p.offset, partition_log.high_watermark,
                                         partition_log.config.delete)
                log_start = partition_log.delete_records_before(offset, self._now_ms())
        except Exception as exc:
            code, message = error_code_and_message(exc)
            self._log_partition_error("DeleteRecords", p.topic, p.partition, exc)
            return _result(p, code, message), None
        log.info("DeleteRecords %s-%d: records before %d deleted; log start offset %d", p.topic, p.partition,
                 offset, log_start)
        return _result(p, ErrorCode.NONE, low_watermark=log_start), (offset, partition_log)

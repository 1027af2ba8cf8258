"""Writing records into another producer's open transaction, as a *participant* (executor side).

Theory of operation
-------------------
The driver of a Spark query owns a transactional.id and opens one transaction per
micro-batch. Each Spark task writes its share of the batch from its executor through a
`ParticipantWriter`: on its first flush it asks the coordinator for a participant producer
id (InitParticipant, naming the owner's id and epoch and the partitions it is about to
write), then produces transactional batches under that id at epoch 0 with its own
sequence numbers, acks=all, and the owner's transactional.id on every Produce (so the
partition leader can verify the partition with the coordinator, KIP-890). Partitions it
writes later are registered first (AddPartitionsToTxn with the participant's id).
`close()` flushes and returns a `WriteResult`; the task hands it back to the driver, which
accepts exactly the participants whose tasks Spark reports as successful. A participant
of a failed or duplicate task attempt is never accepted, so its writes are aborted in the
same decision that commits the rest.

The writer is small on purpose: records are partitioned with the producer's partitioner
(murmur2 of the key, sticky partitions for null keys), encoded per partition with
`BatchBuilder` (one append_many per partition and call), and sent when the buffered bytes
pass `flush_bytes` -- every buffered partition in one ProduceRequest per leader. A failed
partition is sent again with the same bytes and sequence, so the broker's duplicate check
makes the retry safe; a retriable error backs off and retries until `timeout_ms`, anything
else raises (the Spark task fails and its participant stays unaccepted).

`transactional=False` makes the same writer a plain at-least-once writer (no producer id,
no coordinator): the baseline the benchmark compares against.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Sequence

import grpc

from eos import net
from eos.errors import EosError, ErrorCode, Reaction, error_for, reaction_for
from eos.records.codec import BatchBuilder
from eos.v1 import broker_pb2, common_pb2, txn_pb2
from producer.partitioner import StickyPartitions, partition_for_key

log = logging.getLogger("eos.spark.participant")

FLUSH_BYTES_DEFAULT = 4 * 1024 * 1024      # buffered record bytes that trigger a send
BATCH_BYTES_TARGET = 512 * 1024            # a batch this big is sent (max.message.bytes is 1 MiB)
APPEND_SLICE_RECORDS_MAX = 4096
TIMEOUT_MS_DEFAULT = 120_000               # give up on one request (with its retries) after this
RPC_TIMEOUT_S = 30
BACKOFF_MS_BASE = 5
BACKOFF_MS_MAX = 500
SEQUENCE_MODULUS = 1 << 31                 # sequences wrap after 2^31 - 1


@dataclasses.dataclass(frozen=True)
class OwnerIdentity:
    """Who opened the transaction the participants write into (picklable, sent to executors)."""

    bootstrap: str
    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """What one task wrote: its participant id (-1: none, it wrote nothing transactionally)."""

    producer_id: int
    records: int
    partitions: int


def first_error(answer) -> tuple[int, str]:
    """The answer's own error, else the first partition's error (the `error_of` of answers
    that carry both: AddPartitionsToTxn, OffsetFetch)."""
    if answer.error_code != ErrorCode.NONE:
        return answer.error_code, answer.error_message
    for p in answer.partitions:
        if p.error_code != ErrorCode.NONE:
            return p.error_code, f"{p.topic}-{p.partition}: {getattr(p, 'error_message', '')}"
    return ErrorCode.NONE, ""


def retrying(call: Callable[[], "object"], what: str, *, timeout_ms: int,
             error_of: Callable[["object"], tuple[int, str]],
             retry_codes: frozenset[int] = frozenset()):
    """Run `call` until its answer's error (from `error_of`) is NONE; retry retriable
    errors (and `retry_codes`) and transport failures with backoff until `timeout_ms`.
    Returns the answer; raises the eos error for anything else."""
    deadline = time.monotonic() + timeout_ms / 1000
    backoff = net.Backoff(BACKOFF_MS_BASE, BACKOFF_MS_MAX)
    attempt = 0
    while True:
        attempt += 1
        try:
            answer = call()
        except grpc.RpcError as exc:
            error = net.error_from_rpc(exc, what)
        else:
            code, message = error_of(answer)
            if code == ErrorCode.NONE:
                return answer
            error = error_for(code, f"{what}: {message}")
            if code not in retry_codes and reaction_for(code) is not Reaction.RETRY:
                raise error
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise EosError(f"{what}: gave up after {attempt} attempts in {timeout_ms} ms: {error}",
                           getattr(error, "code", ErrorCode.REQUEST_TIMED_OUT))
        time.sleep(min(backoff.delay_ms(attempt) / 1000, remaining_s))


def _answer_error(answer) -> tuple[int, str]:
    return answer.error_code, answer.error_message


class ParticipantWriter:
    """One task's writer into `owner`'s open transaction (see the module doc). Not thread-safe."""

    def __init__(self, owner: OwnerIdentity, topic: str, *, transactional: bool = True,
                 flush_bytes: int = FLUSH_BYTES_DEFAULT, compression: int = 0,
                 timeout_ms: int = TIMEOUT_MS_DEFAULT):
        self.owner = owner
        self.topic = topic
        self.transactional = transactional
        self.flush_bytes = flush_bytes
        self.compression = compression
        self.timeout_ms = timeout_ms
        self.producer_id = -1              # the participant's id, once the coordinator gave one
        self.producer_epoch = -1
        self.records_written = 0
        self._metadata = net.ClusterMetadata(owner.bootstrap)
        self._partition_count = self._metadata.wait_for_topic(topic, timeout_ms).partition_count
        self._builders: dict[int, BatchBuilder] = {}
        self._buffered_bytes = 0
        self._sequences: dict[int, int] = {}
        self._registered: set[int] = set()
        self._sticky = StickyPartitions()
        self._closed = False

    # ---- appending ----------------------------------------------------------------------------

    def write(self, keys: Sequence[bytes | None], values: Sequence[bytes | None]) -> None:
        """Buffer records (key and value as bytes or None); sends when enough is buffered."""
        if self._closed:
            raise EosError("the participant writer is closed")
        count = len(values)
        if len(keys) != count:
            raise ValueError(f"{len(keys)} keys for {count} values")
        if count == 0:
            return
        partition_count = self._partition_count
        if partition_count == 1:
            self._append(0, list(values), list(keys))
        else:
            value_lists: dict[int, list] = {}
            key_lists: dict[int, list] = {}
            sticky = -1
            for key, value in zip(keys, values):
                if key is None:
                    if sticky < 0:
                        sticky = self._sticky.current(self.topic, partition_count)
                    partition = sticky
                else:
                    partition = partition_for_key(key, partition_count)
                bucket = value_lists.get(partition)
                if bucket is None:
                    bucket = value_lists[partition] = []
                    key_lists[partition] = []
                bucket.append(value)
                key_lists[partition].append(key)
            for partition, bucket in value_lists.items():
                self._append(partition, bucket, key_lists[partition])
            if sticky >= 0:
                self._sticky.switch(self.topic, partition_count)
        if self._buffered_bytes >= self.flush_bytes:
            self.flush()

    def _append(self, partition: int, values: list, keys: list) -> None:
        # In slices sized from the first record, so that one batch stays near
        # BATCH_BYTES_TARGET and well under max.message.bytes.
        first = values[0]
        estimate_bytes = 16 + (len(first) if first is not None else 0) + (len(keys[0]) if keys[0] is not None else 0)
        slice_records = max(1, min(APPEND_SLICE_RECORDS_MAX, (BATCH_BYTES_TARGET // 2) // estimate_bytes))
        for start in range(0, len(values), slice_records):
            builder = self._builders.get(partition)
            if builder is None:
                builder = self._builders[partition] = BatchBuilder(compression=self.compression)
            before = builder.size_bytes
            builder.append_many(values[start:start + slice_records], keys[start:start + slice_records])
            self._buffered_bytes += builder.size_bytes - before
            if builder.size_bytes >= BATCH_BYTES_TARGET:
                self.flush()

    # ---- sending ------------------------------------------------------------------------------

    def flush(self) -> None:
        ready = {p: b for p, b in self._builders.items() if b.record_count}
        if not ready:
            return
        if self.transactional:
            self._register(sorted(ready))
        batches = {}
        for partition, builder in ready.items():
            if self.transactional:
                batches[partition] = builder.build(producer_id=self.producer_id, producer_epoch=self.producer_epoch,
                                                   base_sequence=self._sequences.get(partition, 0),
                                                   transactional=True)
            else:
                batches[partition] = builder.build()
        self._send(batches)
        for partition, builder in ready.items():
            if self.transactional:
                self._sequences[partition] = (self._sequences.get(partition, 0) + builder.record_count) % SEQUENCE_MODULUS
            self.records_written += builder.record_count
        self._builders.clear()
        self._buffered_bytes = 0

    def _tps(self, partitions) -> list[common_pb2.TopicPartition]:
        return [common_pb2.TopicPartition(topic=self.topic, partition=p) for p in partitions]

    def _register(self, partitions: list[int]) -> None:
        new = [p for p in partitions if p not in self._registered]
        if self.producer_id < 0:
            stub = self._metadata.txn_coordinator_stub()
            owner = self.owner
            request = txn_pb2.InitParticipantRequest(
                transactional_id=owner.transactional_id, producer_id=owner.producer_id,
                producer_epoch=owner.producer_epoch, partitions=self._tps(new))
            # CONCURRENT_TRANSACTIONS: another task's registration is being written; retry.
            answer = retrying(lambda: stub.InitParticipant(request, timeout=RPC_TIMEOUT_S),
                              f"InitParticipant for {owner.transactional_id!r}", timeout_ms=self.timeout_ms,
                              error_of=_answer_error)
            self.producer_id, self.producer_epoch = answer.producer_id, answer.producer_epoch
        elif new:
            stub = self._metadata.txn_coordinator_stub()
            request = txn_pb2.AddPartitionsToTxnRequest(
                transactional_id=self.owner.transactional_id, producer_id=self.producer_id,
                producer_epoch=self.producer_epoch, partitions=self._tps(new))

            retrying(lambda: stub.AddPartitionsToTxn(request, timeout=RPC_TIMEOUT_S),
                     f"AddPartitionsToTxn for participant {self.producer_id}", timeout_ms=self.timeout_ms,
                     error_of=first_error)
        self._registered.update(new)

    def _send(self, batches: dict[int, bytes]) -> None:
        """Produce every batch, acks=all; resend only the partitions that failed."""
        deadline = time.monotonic() + self.timeout_ms / 1000
        backoff = net.Backoff(BACKOFF_MS_BASE, BACKOFF_MS_MAX)
        pending = dict(batches)
        attempt = 0
        while pending:
            attempt += 1
            last_error: EosError | None = None
            for leader, partitions in self._by_leader(pending).items():
                stub = self._metadata.broker_stub(leader) if leader >= 0 else None
                if stub is None:
                    last_error = EosError(f"no leader known for {self.topic} partitions {partitions}",
                                          ErrorCode.LEADER_NOT_AVAILABLE)
                    continue
                request = broker_pb2.ProduceRequest(
                    transactional_id=self.owner.transactional_id if self.transactional else "",
                    acks=-1, timeout_ms=RPC_TIMEOUT_S * 1000,
                    partitions=[broker_pb2.PartitionRecords(topic=self.topic, partition=p, records=pending[p])
                                for p in partitions])
                try:
                    response = stub.Produce(request, timeout=RPC_TIMEOUT_S)
                except grpc.RpcError as exc:
                    last_error = net.error_from_rpc(exc, f"Produce to {self.topic}")
                    continue
                for result in response.partitions:
                    code = result.error_code
                    if code in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
                        pending.pop(result.partition, None)
                        continue
                    error = error_for(code, f"Produce to {self.topic}-{result.partition} as producer "
                                            f"{self.producer_id}: {result.error_message}")
                    if reaction_for(code) is not Reaction.RETRY:
                        raise error
                    last_error = error
                    if code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                ErrorCode.LEADER_NOT_AVAILABLE):
                        self._metadata.mark_stale(self.topic)
            if not pending:
                return
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                raise EosError(f"Produce to {self.topic}: partitions {sorted(pending)} not written after "
                               f"{attempt} attempts in {self.timeout_ms} ms: {last_error}",
                               getattr(last_error, "code", ErrorCode.REQUEST_TIMED_OUT))
            time.sleep(min(backoff.delay_ms(attempt) / 1000, remaining_s))
            if self._metadata.stale_topics():
                try:
                    self._metadata.refresh_topics([self.topic])
                except EosError:
                    pass   # the next attempt backs off again

    def _by_leader(self, pending: dict[int, bytes]) -> dict[int, list[int]]:
        by_leader: dict[int, list[int]] = {}
        for partition in sorted(pending):
            by_leader.setdefault(self._metadata.leader(self.topic, partition), []).append(partition)
        return by_leader

    # ---- the end --------------------------------------------------------------------------------

    def close(self) -> WriteResult:
        """Flush what is buffered and hand back what this writer did."""
        if not self._closed:
            try:
                self.flush()
            finally:
                self._closed = True
                self._metadata.close()
        return WriteResult(self.producer_id, self.records_written, len(self._registered))

    def abandon(self) -> None:
        """Drop what is buffered (the task failed; its participant is never accepted)."""
        if not self._closed:
            self._closed = True
            self._builders.clear()
            self._metadata.close()


def write_arrow_batches(owner: OwnerIdentity, topic: str, batches, *, key_column: str = "key",
                        value_column: str = "value", transactional: bool = True,
                        flush_bytes: int = FLUSH_BYTES_DEFAULT, timeout_ms: int = TIMEOUT_MS_DEFAULT,
                        after_each_batch: Callable[[], None] | None = None) -> WriteResult:
    """A Spark task's body: write every Arrow record batch's key/value columns (binary) and
    return the task's `WriteResult`. Used by the sinks through `DataFrame.mapInArrow`."""
    writer = ParticipantWriter(owner, topic, transactional=transactional, flush_bytes=flush_bytes,
                               timeout_ms=timeout_ms)
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            keys = batch.column(key_column).to_pylist() if key_column in batch.schema.names else [None] * batch.num_rows
            writer.write(keys, batch.column(value_column).to_pylist())
            if after_each_batch is not None:
                after_each_batch()
        return writer.close()
    except BaseException:
        writer.abandon()
        raise


__all__ = ["OwnerIdentity", "ParticipantWriter", "WriteResult", "retrying", "write_arrow_batches"]

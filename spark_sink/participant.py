"""A Spark task's write into the driver's open transaction, as a *participant* (executor side).

Theory of operation
-------------------
The driver of a Spark query owns a transactional.id and opens one transaction per
micro-batch (`spark_sink.owner.TransactionOwner`); what the executors need of it travels
to them inside the pickled task function (`spark_sink.sink.TaskWrite`) as an
`OwnerIdentity`. Each Spark task writes its share of the
batch through one `ParticipantWriter`, a thin adapter over the producer's participant mode
(`eos.Producer.participant`): the producer asks the coordinator for a participant producer
id of its own (InitParticipant, naming the owner's id and epoch), registers the partitions
it writes (AddPartitionsToTxn under that id), partitions the records (murmur2 of the key,
sticky partitions for null keys), batches them and sends them acks=all with its own
sequences, so a retried send is recognised as a duplicate by the broker. There is one
implementation of all that, the producer's; this module adds only what a task needs:

- The participant is made at the task's first record: a task with no rows makes none
  (`WriteResult.producer_id` is -1) and costs the coordinator nothing.
- `close()` flushes and returns a `WriteResult` only when every record is written (the
  producer's flush raises when one failed, and so does any bulk send that failed before
  it was sent). The task hands the result back to the driver, which accepts exactly the
  participants of the tasks Spark reports as successful. A failed or duplicate task
  attempt's participant is never accepted, so its writes are aborted in the same
  decision that commits the rest.
- `abandon()` (the task failed) closes the producer without waiting for its sends.
- `timeout_ms` bounds one record's delivery (delivery.timeout.ms) and the waits for
  metadata and the coordinator (max.block.ms); `producer_config` passes further Kafka
  producer settings (linger.ms, compression.type, ...).

`transactional=False` makes the same writer a plain at-least-once writer (acks=all, no
producer id, no coordinator): the baseline the benchmark compares against.
"""
from __future__ import annotations

import dataclasses
from concurrent.futures import Future
from typing import Sequence

from eos.errors import EosError, ErrorCode
from producer.config import resolve_producer_config
from producer.producer import Producer

TIMEOUT_MS_DEFAULT = 120_000               # one record's delivery, retries included
REQUEST_TIMEOUT_MS_MAX = 30_000            # one Produce request (Kafka's request.timeout.ms)
# What the writer decides itself: the owner's id, where to connect, and the delivery
# guarantees (a participant is transactional; the plain writer is acks=all, no idempotence).
OWNED_SETTINGS = frozenset({"bootstrap.servers", "transactional.id", "enable.idempotence", "acks"})


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


def producer_settings(timeout_ms: int, producer_config: dict | None) -> dict:
    """The task's producer settings by Kafka name: `timeout_ms` as delivery.timeout.ms and
    max.block.ms (request.timeout.ms fits inside it), then `producer_config` on top.
    ValueError names a setting that is unknown, invalid, or the writer's own."""
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 10:
        raise ValueError(f"timeout_ms must be an int >= 10, got {timeout_ms!r}")
    given = dict(producer_config or {})
    owned = sorted(name for name in given if name in OWNED_SETTINGS)
    if owned:
        raise ValueError(f"producer_config must not set {', '.join(owned)}: the sink sets them")
    if "metrics" in given:
        # A registry does not travel to the executors, and their processes' registries are
        # collected by nobody: the sink's own metrics= reports from the driver.
        raise ValueError("producer_config must not set metrics: the tasks' producers run in Spark's "
                         "executors; give the sink metrics= for the driver's figures")
    settings = {"delivery.timeout.ms": timeout_ms, "max.block.ms": timeout_ms,
                "request.timeout.ms": min(REQUEST_TIMEOUT_MS_MAX, timeout_ms // 2)}
    settings.update(given)
    resolve_producer_config(settings, {})      # raises ValueError naming what is wrong
    return settings


class ParticipantWriter:
    """One task's writer into `owner`'s open transaction (see the module doc). Not thread-safe."""

    def __init__(self, owner: OwnerIdentity, topic: str, *, transactional: bool = True,
                 timeout_ms: int = TIMEOUT_MS_DEFAULT, producer_config: dict | None = None):
        if transactional and (not owner.transactional_id or owner.producer_id < 0 or owner.producer_epoch < 0):
            raise ValueError(f"a participant needs its owner's transactional.id, producer id and epoch, "
                             f"got {owner!r}")
        self.owner = owner
        self.topic = topic
        self.transactional = transactional
        self.timeout_ms = timeout_ms
        self._settings = producer_settings(timeout_ms, producer_config)
        self._producer: Producer | None = None       # made at the first record
        self._sends: list[Future] = []               # send_batch futures not yet checked
        self._records_written = 0
        self._partitions_written: set[int] = set()
        self._closed = False
        self._result: WriteResult | None = None

    @property
    def producer_id(self) -> int:
        """The participant's producer id; -1 before the first record, and for a plain writer."""
        if self._producer is None or not self.transactional:
            return -1
        return self._producer.participant_id

    @property
    def partitions_written(self) -> frozenset[int]:
        """The partitions of the records acknowledged so far."""
        return frozenset(self._partitions_written)

    def _producer_for_writing(self) -> Producer:
        if self._producer is None:
            owner = self.owner
            if self.transactional:
                self._producer = Producer.participant(
                    owner.transactional_id, owner.producer_id, owner.producer_epoch, owner.bootstrap,
                    timeout=self.timeout_ms / 1000, config=self._settings)
            else:
                self._producer = Producer(owner.bootstrap, config={**self._settings, "acks": "all",
                                                                   "enable.idempotence": False})
        return self._producer

    def write(self, keys: Sequence[bytes | None], values: Sequence[bytes | None]) -> None:
        """Queue records (key and value as bytes or None); the producer sends them as its
        batches fill. A send that already failed raises here."""
        if self._closed:
            raise EosError("the participant writer is closed", ErrorCode.INVALID_REQUEST)
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys for {len(values)} values")
        if not values:
            return
        producer = self._producer_for_writing()
        all_null_keys = all(key is None for key in keys)
        self._sends.append(producer.send_batch(self.topic, values, None if all_null_keys else keys))
        self._check_done_sends(wait=False)

    def _check_done_sends(self, *, wait: bool) -> None:
        """Count the finished sends and raise the first failure; with `wait` (after a
        flush), wait for each to finish, up to timeout_ms."""
        pending = []
        for send in self._sends:
            if not wait and not send.done():
                pending.append(send)
                continue
            result = send.result(self.timeout_ms / 1000)     # raises the send's error
            self._records_written += len(result)
            self._partitions_written.update(partition for _, partition in result.offsets_by_partition())
        self._sends = pending

    def flush(self) -> None:
        """Wait until every record queued so far is written; raises if one failed."""
        if self._producer is not None:
            self._producer.flush(self.timeout_ms / 1000)
            self._check_done_sends(wait=True)

    def close(self) -> WriteResult:
        """Flush what is queued and hand back what this writer did (again on later calls)."""
        if self._result is None:
            if self._closed:
                raise EosError("the participant writer was abandoned", ErrorCode.INVALID_REQUEST)
            try:
                self.flush()
            except BaseException:
                self.abandon()
                raise
            self._result = WriteResult(self.producer_id, self._records_written, len(self._partitions_written))
            self._closed = True
            if self._producer is not None:
                self._producer.close()
        return self._result

    def abandon(self) -> None:
        """Drop what is unsent (the task failed; its participant is never accepted)."""
        if not self._closed:
            self._closed = True
            if self._producer is not None:
                self._producer.close(0)


def _as_bytes(column) -> list:
    """An Arrow binary or string column as a list of bytes and None (a string as its UTF-8
    bytes: the cast to binary only relabels Arrow's buffers)."""
    import pyarrow as pa

    if pa.types.is_string(column.type):
        column = column.cast(pa.binary())
    elif pa.types.is_large_string(column.type):
        column = column.cast(pa.large_binary())
    return column.to_pylist()


def write_arrow_batches(owner: OwnerIdentity, topic: str, batches, *, key_column: str = "key",
                        value_column: str = "value", transactional: bool = True,
                        timeout_ms: int = TIMEOUT_MS_DEFAULT, producer_config: dict | None = None) -> WriteResult:
    """A Spark task's body: write every Arrow record batch's key/value columns (binary) and
    return the task's `WriteResult`. Used by the sinks' task function (`spark_sink.sink.TaskWrite`,
    run by mapInArrow)."""
    writer = ParticipantWriter(owner, topic, transactional=transactional, timeout_ms=timeout_ms,
                               producer_config=producer_config)
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            keys = (_as_bytes(batch.column(key_column)) if key_column in batch.schema.names
                    else [None] * batch.num_rows)
            writer.write(keys, _as_bytes(batch.column(value_column)))
        return writer.close()
    except BaseException:
        writer.abandon()
        raise


__all__ = ["OwnerIdentity", "ParticipantWriter", "WriteResult", "write_arrow_batches"]

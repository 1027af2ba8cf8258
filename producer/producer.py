"""`eos.Producer`: Kafka's KafkaProducer, over gRPC.

Theory of operation
-------------------
`send()` picks the partition (explicit, murmur2 of the key, or the topic's sticky
partition), stamps the record's timestamp, and appends it to the partition's open batch in
the `RecordAccumulator`; it returns a `RecordFuture` at once. The `Sender` thread drains
ready batches, encodes each once, and sends them to the partition leaders in
ProduceRequests of many partitions; answers complete the futures (callbacks run on the
sender thread, as Kafka's do). `send_batch()` is the bulk path: one call appends many
records of one topic, a batch-size slice at a time, and returns one future for them all.

Configuration uses Kafka's names and defaults, given as a dict of Kafka names
(`config={"linger.ms": 10}`) or as keyword arguments with dots turned into underscores
(`linger_ms=10`). Idempotence is on by default (acks=all, retries, up to 5 requests in
flight); as in Kafka >= 3.2, when enable.idempotence is *not* given and another setting
conflicts with it (acks=1, say), idempotence is quietly turned off, and when it *is* given
as true, the conflict is an error.

Thread safety: a producer is meant to be shared by threads. Every method may be called
from any thread; appends serialise on the accumulator's lock for a few list appends.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Callable, Sequence

from eos import net
from eos.errors import EosError, ErrorCode, MessageTooLargeError
from eos.records.compression import codec_from_name
from producer.accumulator import (
    BufferExhaustedError,
    ProducerClosedError,
    RecordAccumulator,
    RecordFuture,
    RecordMetadata,
    SendBatchResult,
    _BulkCompletion,
    record_size_estimate,
)
from producer.idempotence import IdempotenceState
from producer.partitioner import StickyPartitions, partition_for_key
from producer.sender import Sender

log = logging.getLogger("eos.producer")

__all__ = ["Producer", "RecordMetadata", "RecordFuture", "SendBatchResult",
           "BufferExhaustedError", "ProducerClosedError"]

INT_MAX = 2147483647
# send_batch() builds batches of up to this many bytes (bounded by max.request.size and the
# topic's max.message.bytes): in Python a batch costs a request, a sequence range and an
# append on the broker whatever its size, so a bulk call of 100-byte records sent in
# 16 KiB batches spends most of its time per batch. 1 MiB is Kafka's default
# max.request.size and (nearly) max.message.bytes, so such a batch is always accepted.
BULK_BATCH_BYTES = 1024 * 1024
TIMESTAMP_DELTA_EXTRA_BYTES = 9
MAX_IN_FLIGHT_FOR_IDEMPOTENCE = 5
TRANSACTIONS_NOT_YET = "transactions are not implemented yet (they arrive with issue 4)"


def _acks(name: str, value) -> int:
    text = str(value).strip().lower() if not isinstance(value, bool) else ""
    if text == "all" or text == "-1":
        return -1
    if text in ("0", "1"):
        return int(text)
    raise ValueError(f"{name} must be 0, 1, 'all' or -1, got {value!r}")


def _compression(name: str, value) -> int:
    try:
        return codec_from_name(value)
    except EosError as exc:
        raise ValueError(f"{name}: {exc}") from None


PRODUCER_CONFIG: dict[str, net.ConfigSpec] = {
    "bootstrap.servers": net.ConfigSpec(None, net.as_optional_str),
    "client.id": net.ConfigSpec("", net.as_str),
    "acks": net.ConfigSpec(-1, _acks),
    "enable.idempotence": net.ConfigSpec(True, net.as_bool),
    "linger.ms": net.ConfigSpec(5, net.as_int(0)),
    "batch.size": net.ConfigSpec(16384, net.as_int(0)),
    "buffer.memory": net.ConfigSpec(33554432, net.as_int(1)),
    "compression.type": net.ConfigSpec(0, _compression),
    "retries": net.ConfigSpec(INT_MAX, net.as_int(0)),
    "retry.backoff.ms": net.ConfigSpec(100, net.as_int(0)),
    "retry.backoff.max.ms": net.ConfigSpec(1000, net.as_int(0)),
    "delivery.timeout.ms": net.ConfigSpec(120000, net.as_int(1)),
    "request.timeout.ms": net.ConfigSpec(30000, net.as_int(1)),
    "max.in.flight.requests.per.connection": net.ConfigSpec(5, net.as_int(1)),
    "max.request.size": net.ConfigSpec(1048576, net.as_int(1)),
    "max.block.ms": net.ConfigSpec(60000, net.as_int(0)),
    "metadata.max.age.ms": net.ConfigSpec(300000, net.as_int(1)),
    "partitioner.ignore.keys": net.ConfigSpec(False, net.as_bool),
    "transactional.id": net.ConfigSpec(None, net.as_optional_str),
    "transaction.timeout.ms": net.ConfigSpec(60000, net.as_int(1)),
}


def resolve_producer_config(config: dict | None, kwargs: dict) -> dict:
    """Checked producer settings by Kafka name, with idempotence resolved; ValueError
    (Kafka's ConfigException) names what is wrong."""
    values, explicit = net.resolve_config("producer", PRODUCER_CONFIG, config, kwargs)
    if values["delivery.timeout.ms"] < values["linger.ms"] + values["request.timeout.ms"]:
        raise ValueError(
            f"delivery.timeout.ms ({values['delivery.timeout.ms']}) should be equal to or larger "
            f"than linger.ms ({values['linger.ms']}) + request.timeout.ms "
            f"({values['request.timeout.ms']})")
    conflicts = []
    if values["acks"] != -1:
        conflicts.append(f"acks must be 'all' (got {values['acks']})")
    if values["retries"] == 0:
        conflicts.append("retries must be greater than 0")
    if values["max.in.flight.requests.per.connection"] > MAX_IN_FLIGHT_FOR_IDEMPOTENCE:
        conflicts.append(f"max.in.flight.requests.per.connection must be at most "
                         f"{MAX_IN_FLIGHT_FOR_IDEMPOTENCE} (got "
                         f"{values['max.in.flight.requests.per.connection']})")
    transactional = values["transactional.id"] is not None
    if transactional and "enable.idempotence" in explicit and not values["enable.idempotence"]:
        raise ValueError("transactional.id requires enable.idempotence=true")
    if values["enable.idempotence"]:
        if conflicts:
            if "enable.idempotence" in explicit or transactional:
                raise ValueError("enable.idempotence=true needs " + "; ".join(conflicts))
            values["enable.idempotence"] = False   # Kafka: implicit idempotence yields
    return values


def _as_bytes(what: str, data):
    """The bytes of a key or value (str is encoded as UTF-8); TypeError for anything else."""
    if data is None or type(data) is bytes:
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        return data.encode("utf-8")
    raise TypeError(f"{what} must be bytes, bytearray, str or None, got {type(data).__name__}")


def _check_headers(headers) -> list | None:
    if not headers:
        return None
    items = headers.items() if isinstance(headers, dict) else headers
    checked = []
    for item in items:
        try:
            hkey, hvalue = item
        except (TypeError, ValueError):
            raise TypeError(f"headers must be (str, bytes | None) pairs, got {item!r}") from None
        if not isinstance(hkey, str):
            raise TypeError(f"header key must be str, got {type(hkey).__name__}")
        checked.append((hkey, _as_bytes(f"header {hkey!r} value", hvalue)))
    return checked


def _failed_future(error: BaseException) -> Future:
    future: Future = Future()
    future.set_exception(error)
    return future


def _normalise_many(what: str, items: Sequence) -> list:
    """A list of bytes-or-None from a sequence, converting only when needed."""
    items = items if isinstance(items, list) else list(items)
    kinds = set(map(type, items))
    if kinds <= {bytes, type(None)}:
        return items
    return [_as_bytes(what, item) for item in items]


class Producer:
    """A thread-safe, by default idempotent, Kafka-style producer.

    ``Producer(bootstrap="127.0.0.1:9092", *, config=None, **kwargs)``
    """

    def __init__(self, bootstrap: str = net.DEFAULT_BOOTSTRAP, *, config: dict | None = None,
                 **kwargs):
        settings = resolve_producer_config(config, kwargs)
        self.config = settings
        if settings["bootstrap.servers"]:
            bootstrap = settings["bootstrap.servers"]
        self._bootstrap = net.parse_bootstrap(bootstrap)
        self._transactional_id = settings["transactional.id"]
        self._acks = settings["acks"]
        self._max_request_size = settings["max.request.size"]
        self._batch_size = max(1, settings["batch.size"])
        self._buffer_memory = settings["buffer.memory"]
        self._max_block_ms = settings["max.block.ms"]
        self._ignore_keys = settings["partitioner.ignore.keys"]
        self._idempotent = settings["enable.idempotence"]
        backoff = net.Backoff(settings["retry.backoff.ms"], settings["retry.backoff.max.ms"])
        self._metadata = net.ClusterMetadata(
            self._bootstrap, request_timeout_ms=settings["request.timeout.ms"],
            retry_backoff_ms=settings["retry.backoff.ms"],
            retry_backoff_max_ms=settings["retry.backoff.max.ms"],
            metadata_max_age_ms=settings["metadata.max.age.ms"])
        # batch.size=0 means "no batching" in Kafka: every record is a batch of its own.
        self._accumulator = RecordAccumulator(
            batch_size=self._batch_size, buffer_memory=self._buffer_memory,
            linger_ms=settings["linger.ms"], max_block_ms=self._max_block_ms,
            sticky=StickyPartitions(), clock=net.now_ms)
        self._sender = Sender(
            accumulator=self._accumulator, metadata=self._metadata,
            idempotence=IdempotenceState() if self._idempotent else None,
            acks=self._acks, retries=settings["retries"], retry_backoff=backoff,
            request_timeout_ms=settings["request.timeout.ms"],
            delivery_timeout_ms=settings["delivery.timeout.ms"],
            max_in_flight=settings["max.in.flight.requests.per.connection"],
            max_request_size=self._max_request_size, compression=settings["compression.type"],
            client_id=settings["client.id"], batch_bytes_max=self._bulk_batch_bytes)
        self._close_lock = threading.Lock()
        self._closed = False
        self._sender.start()

    # ---- metadata ------------------------------------------------------------------------

    def _partition_count(self, topic: str) -> int:
        count = self._metadata.partition_count(topic)
        if count is None:
            if not isinstance(topic, str) or not topic:
                raise TypeError(f"topic must be a non-empty str, got {topic!r}")
            count = self._metadata.wait_for_topic(topic, self._max_block_ms).partition_count
        return count

    def partitions_for(self, topic: str) -> list[int]:
        """The partition ids of `topic` (waiting up to max.block.ms for its metadata)."""
        return list(range(self._partition_count(topic)))

    # ---- sending -------------------------------------------------------------------------

    def send(self, topic: str, value=None, key=None, partition: int | None = None, headers=None,
             timestamp_ms: int | None = None,
             on_delivery: Callable[[RecordMetadata, BaseException | None], None] | None = None
             ) -> Future:
        """Queue one record; returns a Future of its RecordMetadata.

        `on_delivery(metadata, exception)` runs on the sender thread once the record is
        acknowledged (exception None) or has failed (metadata.offset -1). Errors the
        producer can name before sending (too large, topic unknown after max.block.ms,
        buffer full for max.block.ms) come back as an already failed future, as in Kafka;
        wrong argument types raise at once.
        """
        if self._closed:
            raise ProducerClosedError("cannot send after the producer is closed")
        if type(value) is not bytes and value is not None:
            value = _as_bytes("value", value)
        if type(key) is not bytes and key is not None:
            key = _as_bytes("key", key)
        if headers:
            headers = _check_headers(headers)
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        elif isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int) or timestamp_ms < 0:
            raise ValueError(f"timestamp_ms must be a non-negative int, got {timestamp_ms!r}")
        try:
            count = self._partition_count(topic)
            if partition is not None:
                if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < count:
                    raise ValueError(f"partition {partition!r} is not in the range [0...{count - 1}] "
                                     f"of topic {topic!r}")
            elif key is not None and not self._ignore_keys:
                partition = partition_for_key(key, count)
            size = record_size_estimate(value, key, headers)
            if size > self._max_request_size:
                raise MessageTooLargeError(
                    f"the message is {size} bytes when serialized, which is larger than "
                    f"max.request.size ({self._max_request_size})")
            if size > self._buffer_memory:
                raise MessageTooLargeError(
                    f"the message is {size} bytes when serialized, which is larger than "
                    f"buffer.memory ({self._buffer_memory})")
            return self._accumulator.append(topic, partition, count, value, key, headers,
                                            timestamp_ms, size, on_delivery)
        except ProducerClosedError:
            raise
        except EosError as exc:
            if on_delivery is not None:
                try:
                    on_delivery(RecordMetadata(topic, -1 if partition is None else partition, -1,
                                               timestamp_ms), exc)
                except Exception:
                    log.exception("on_delivery callback raised")
            return _failed_future(exc)

    def send_batch(self, topic: str, values: Sequence, keys: Sequence | None = None,
                   partition: int | None = None, timestamps_ms=None,
                   headers: Sequence | None = None) -> Future:
        """Queue many records of one topic in one call; returns one Future.

        `values` (and `keys`, `headers`, `timestamps_ms` when given as sequences) are
        aligned lists. `timestamps_ms` may also be one int for all records; None stamps
        them all with the time of the call. Partitioning is the same as send(): explicit
        `partition`, else murmur2 of each key, else sticky partitions (a new partition for
        each batch). The records of one partition stay in the order given.

        Batch size: send_batch() builds batches of up to max(batch.size, 1 MiB bounded by
        max.request.size, the topic's max.message.bytes override and buffer.memory / 8),
        not batch.size. batch.size tunes how long send() waits to fill a batch; a bulk call
        has its records at hand, and in Python every batch costs a request slot, a
        sequence range and a broker append whatever its size, so 16 KiB batches of
        100-byte records would spend most of the call on per-batch work. Each batch still
        reserves the buffer memory it holds.

        The future's result is a `SendBatchResult`: a sequence of RecordMetadata in the
        order of `values`, built lazily (``result[i]``, iteration, ``len``), plus
        ``offsets_by_partition()``. If any batch fails, the future fails with the first
        error; the other batches may have been written.
        """
        if self._closed:
            raise ProducerClosedError("cannot send after the producer is closed")
        values = _normalise_many("value", values)
        count = len(values)
        if keys is not None:
            keys = _normalise_many("key", keys)
            if len(keys) != count:
                raise ValueError(f"keys has {len(keys)} items for {count} values")
        single_timestamp_ms = -1
        if timestamps_ms is None:
            single_timestamp_ms = int(time.time() * 1000)
            timestamps = [single_timestamp_ms] * count
        elif isinstance(timestamps_ms, int) and not isinstance(timestamps_ms, bool):
            if timestamps_ms < 0:
                raise ValueError(f"timestamps_ms must be non-negative, got {timestamps_ms}")
            single_timestamp_ms = timestamps_ms
            timestamps = [timestamps_ms] * count
        else:
            timestamps = list(timestamps_ms)
            if len(timestamps) != count:
                raise ValueError(f"timestamps_ms has {len(timestamps)} items for {count} values")
            if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in timestamps):
                raise ValueError("timestamps_ms must hold non-negative ints")
        if headers is not None:
            headers = [_check_headers(h) for h in headers]
            if len(headers) != count:
                raise ValueError(f"headers has {len(headers)} items for {count} values")
        future: Future = Future()
        bulk = _BulkCompletion(future, count)
        if count == 0:
            bulk.sealed()
            return future
        try:
            partition_count = self._partition_count(topic)
            if partition is not None and (isinstance(partition, bool) or not isinstance(partition, int)
                                          or not 0 <= partition < partition_count):
                raise ValueError(f"partition {partition!r} is not in the range "
                                 f"[0...{partition_count - 1}] of topic {topic!r}")
            sizes = self._record_sizes(values, keys, headers)
            if single_timestamp_ms < 0:
                # Timestamps of their own may be far apart: a timestamp delta takes up to
                # 10 bytes, where the per-record estimate allows 1.
                sizes = [size + TIMESTAMP_DELTA_EXTRA_BYTES for size in sizes]
            largest = max(sizes)
            if largest > self._max_request_size:
                raise MessageTooLargeError(
                    f"a message is {largest} bytes when serialized, which is larger than "
                    f"max.request.size ({self._max_request_size})")
            acc = self._accumulator
            batch_bytes_max = self._bulk_batch_bytes(topic)
            if partition is not None or keys is None or self._ignore_keys:
                acc.append_many(topic, partition, partition_count, values, keys, timestamps, headers,
                                sizes, None, bulk, single_timestamp_ms, batch_bytes_max)
            else:
                groups: dict[int | None, list[int]] = {}
                for position, key in enumerate(keys):
                    p = partition_for_key(key, partition_count) if key is not None else None
                    group = groups.get(p)
                    if group is None:
                        group = groups[p] = []
                    group.append(position)
                for p, positions in groups.items():
                    acc.append_many(
                        topic, p, partition_count,
                        [values[i] for i in positions], [keys[i] for i in positions],
                        [timestamps[i] for i in positions],
                        [headers[i] for i in positions] if headers is not None else None,
                        [sizes[i] for i in positions], positions, bulk, single_timestamp_ms,
                        batch_bytes_max)
        except ProducerClosedError:
            raise
        except EosError as exc:
            bulk._error = bulk._error or exc
        bulk.sealed()
        return future

    def _bulk_batch_bytes(self, topic: str) -> int:
        """The size of the batches send_batch() builds: max(batch.size, BULK_BATCH_BYTES
        bounded by max.request.size, the topic's max.message.bytes when it overrides the
        broker's, and an eighth of buffer.memory)."""
        limit = min(BULK_BATCH_BYTES, self._max_request_size, self._buffer_memory // 8)
        info = self._metadata.topic(topic)
        topic_max = info.configs.get("max.message.bytes") if info is not None else None
        if topic_max:
            try:
                limit = min(limit, int(topic_max))
            except ValueError:
                pass   # the broker validated it; an unreadable value leaves the other bounds
        return max(self._batch_size, limit)

    @staticmethod
    def _record_sizes(values: list, keys: list | None, headers: list | None) -> list[int]:
        overhead = record_size_estimate(None, None, None)
        if None in values:
            sizes = [overhead + (len(v) if v is not None else 0) for v in values]
        else:
            sizes = [overhead + n for n in map(len, values)]
        if keys is not None:
            sizes = [s + (len(k) if k is not None else 0) for s, k in zip(sizes, keys)]
        if headers is not None:
            sizes = [s + record_size_estimate(None, None, h) - overhead if h else s
                     for s, h in zip(sizes, headers)]
        return sizes

    # ---- flush and close -----------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now (ignoring linger.ms) and wait until each record sent
        before the call is acknowledged or failed. TimeoutError after `timeout` seconds."""
        batches = self._accumulator.begin_flush()
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            for batch in batches:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not batch.wait(remaining):
                    undelivered = sum(1 for b in batches if not b.done)
                    raise TimeoutError(f"flush: {undelivered} batch(es) still undelivered after {timeout} s")
        finally:
            self._accumulator.end_flush()

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is queued (up to `timeout` seconds), then stop. Records still
        undelivered at the timeout fail with ProducerClosedError. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._accumulator.begin_close()
        self._sender.join(timeout)
        if self._sender.is_alive():
            self._sender.force_close()
            self._sender.join()
        self._metadata.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ---- transactions (issue 4) ----------------------------------------------------------

    def init_transactions(self) -> None:
        if self._transactional_id is None:
            raise ValueError("init_transactions() needs transactional.id")
        raise NotImplementedError(TRANSACTIONS_NOT_YET)

    def begin_transaction(self) -> None:
        raise NotImplementedError(TRANSACTIONS_NOT_YET)

    def commit_transaction(self) -> None:
        raise NotImplementedError(TRANSACTIONS_NOT_YET)

    def abort_transaction(self) -> None:
        raise NotImplementedError(TRANSACTIONS_NOT_YET)

    def send_offsets_to_transaction(self, offsets, group_metadata) -> None:
        raise NotImplementedError(TRANSACTIONS_NOT_YET)

    def transaction(self):
        raise NotImplementedError(TRANSACTIONS_NOT_YET)

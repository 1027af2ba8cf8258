"""The transaction coordinator process: the I/O shell around `TxnCoordinatorCore`.

Theory of operation
-------------------
The core (txn_coordinator.state) decides; this shell carries the decisions out:

1. Every state change is first appended to the `__transaction_state` topic (partition
   `partition_for(transactional.id)`) with acks=all, *then* applied (`write_completed`).
   The topic is the coordinator's only durable state: `start()` replays it into the core.
2. After a Prepare* record is written, the decision is final. A bounded marker queue feeds
   one marker thread. The markers of one decision are a group (the owner's entry and one
   per participant, each a producer id, epoch, COMMIT/ABORT and partitions), sent in one
   WriteTxnMarkers; only the (entry, partition) pairs that failed are sent again, with
   backoff, until every partition has its marker; then Complete* is written. After a restart,
   `start()` re-queues every transaction the log shows as decided but not complete, so a
   coordinator killed right after PrepareCommit still finishes the commit.
3. An expiry thread aborts transactions open past transaction.timeout.ms (fencing their
   producer) and drops transactional ids idle past transactional.id.expiration.ms.

The coordinator never imports `broker`: it reaches brokers only through the gRPC contract
(Produce/Fetch for its own log, WriteTxnMarkers for markers, Metadata for leaders), so it can
run in the broker's process (the embedded default) or in its own.

Waiting instead of refusing: a request the core answers CONCURRENT_TRANSACTIONS without a
write (the previous transaction of the id completing, or a write of the id in flight) is
parked on the core's condition, up to CONCURRENT_WAIT_MS and CONCURRENT_WAITERS_MAX at once,
and decided again each time a state write lands or fails; it is answered
CONCURRENT_TRANSACTIONS (and the client retries, as with Kafka) only when the wait runs out.
A producer committing short transactions back to back thus meets its previous transaction's
completion on the coordinator, not after a retry.

Locking: one lock (a condition) guards the core; I/O (log appends, marker RPCs, producer-id blocks on a
block boundary) happens outside it, except `new_producer_id`, which the core calls and which
touches the disk once per block of 1000 ids.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time
from typing import Callable

import grpc

from eos.errors import CorruptRecordError, EosError, ErrorCode, error_for, reaction_for, Reaction
from eos.net import ADMIN_CLIENT_ID, client_id_metadata
from eos.records.codec import decode_records, encode_batch
from eos.records.header import iter_headers
from eos.types import TopicPartition
from eos.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from txn_coordinator import txn_log
from txn_coordinator.state import (TRANSACTION_MAX_TIMEOUT_MS, TRANSACTIONAL_ID_EXPIRATION_MS, Decision, MarkerEntry,
                                   MarkerRequest, TxnCoordinatorCore, TxnMetadata, TxnState)

log = logging.getLogger("eos.txn_coordinator")

STATE_TOPIC = "__transaction_state"
OFFSETS_TOPIC = "__consumer_offsets"
STATE_TOPIC_PARTITIONS = 50          # transaction.state.log.num.partitions
MARKER_QUEUE_MAX = 10_000            # decided transactions awaiting markers
MARKER_RETRY_BACKOFF_MS = 100
EXPIRY_INTERVAL_MS = 10_000          # transaction.abort.timed.out.transaction.cleanup.interval.ms
# A request that would be answered CONCURRENT_TRANSACTIONS (the id's previous transaction is
# still writing its markers, or a state write of the id is in flight) waits here for that to
# finish, up to this long, and is then decided again: the markers of a local partition take
# well under a millisecond, so the client is spared a retry round trip and its backoff.
CONCURRENT_WAIT_MS = 100
CONCURRENT_WAITERS_MAX = 16          # requests parked so at once (each holds an RPC worker)
RPC_TIMEOUT_S = 30
_MAX_MESSAGE_BYTES = 100 * 1024 * 1024


def _now_ms() -> int:
    return int(time.time() * 1000)


class BrokerLink:
    """The coordinator's view of the cluster, through the Broker gRPC service only.

    `stub` (optional) is the Broker service of the coordinator's own broker when both run
    in one process: any object with a BrokerStub's methods, such as the broker's
    in-process stub, which hands each request to the handler without a network hop. The
    coordinator's log always lives on its own broker, so every state write goes there:
    through `append_own(topic, partition, records) -> base offset` when the broker gives one
    (its own write path, the checks and acks=all wait of a Produce without the request:
    three state writes a transaction), else as a Produce. Likewise the markers of the
    partitions it leads go through `write_own_markers(coordinator_epoch, entries) ->
    {(entry index, partition): (code, message)}` when given, else as a WriteTxnMarkers."""

    def __init__(self, bootstrap: str, *, stub=None, append_own: Callable[[str, int, bytes], int] | None = None,
                 write_own_markers: Callable[[int, tuple], dict] | None = None):
        self._channel = None
        if stub is None:
            self._channel = grpc.insecure_channel(bootstrap, options=[
                ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)])
            stub = broker_pb2_grpc.BrokerStub(self._channel)
        self._stub = stub
        self._append_own = append_own
        self._write_own_markers = write_own_markers

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()

    def ensure_topic(self, name: str, partitions: int) -> int:
        """Create the internal topic when missing; return its partition count."""
        response = self._stub.Metadata(broker_pb2.MetadataRequest(topics=[name], include_internal=True),
                                       timeout=RPC_TIMEOUT_S)
        for topic in response.topics:
            if topic.name == name and topic.error_code == ErrorCode.NONE:
                return len(topic.partitions)
        created = self._stub.CreateTopics(broker_pb2.CreateTopicsRequest(
            topics=[broker_pb2.NewTopic(name=name, num_partitions=partitions, replication_factor=-1)]),
            timeout=RPC_TIMEOUT_S)
        result = created.topics[0]
        if result.error_code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
            raise error_for(result.error_code, f"cannot create {name}: {result.error_message}")
        return partitions

    def append(self, topic: str, partition: int, records: bytes) -> int:
        if self._append_own is not None:
            return self._append_own(topic, partition, records)
        # As the broker's own admin client: a client's Produce may not write internal topics.
        response = self._stub.Produce(broker_pb2.ProduceRequest(
            acks=-1, timeout_ms=RPC_TIMEOUT_S * 1000,
            partitions=[broker_pb2.PartitionRecords(topic=topic, partition=partition, records=records)]),
            timeout=RPC_TIMEOUT_S, metadata=client_id_metadata(ADMIN_CLIENT_ID))
        result = response.partitions[0]
        if result.error_code != ErrorCode.NONE:
            raise error_for(result.error_code, result.error_message)
        return result.base_offset

    def read_all(self, topic: str, partition: int, max_bytes: int = 8 * 1024 * 1024):
        """Yield (key, value) of every record from the log start to the high watermark."""
        offset = 0
        while True:
            response = self._stub.Fetch(broker_pb2.FetchRequest(
                max_wait_ms=0, min_bytes=0, max_bytes=max_bytes,
                partitions=[broker_pb2.FetchPartition(topic=topic, partition=partition, fetch_offset=offset,
                                                      partition_max_bytes=max_bytes)]),
                timeout=RPC_TIMEOUT_S)
            fetched = response.partitions[0]
            if fetched.error_code == ErrorCode.OFFSET_OUT_OF_RANGE and offset < fetched.log_start_offset:
                offset = fetched.log_start_offset
                continue
            if fetched.error_code != ErrorCode.NONE:
                raise error_for(fetched.error_code, fetched.error_message)
            if not fetched.records:
                return
            for header in iter_headers(fetched.records):
                if not header.is_control:
                    for record in decode_records(fetched.records, header, topic, partition):
                        if record.offset >= offset:
                            yield record.key, record.value
                offset = header.next_offset
            if offset >= fetched.high_watermark:
                return

    def write_markers(self, group: MarkerRequest) -> dict[tuple[int, TopicPartition], tuple[int, str]]:
        """Send every entry of `group` in one WriteTxnMarkersRequest. Returns
        {(entry index, partition): (error code, message)} for the answers received."""
        if self._write_own_markers is not None:
            return self._write_own_markers(group.coordinator_epoch, group.entries)
        response = self._stub.WriteTxnMarkers(broker_pb2.WriteTxnMarkersRequest(markers=[
            broker_pb2.TxnMarker(producer_id=entry.producer_id, producer_epoch=entry.producer_epoch,
                                 committed=entry.committed, coordinator_epoch=group.coordinator_epoch,
                                 partitions=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition)
                                             for tp in sorted(entry.partitions)])
            for entry in group.entries]),
            timeout=RPC_TIMEOUT_S)
        results = {}
        # The broker answers marker by marker in request order (a producer id may appear in
        # two entries only in theory, so the index, not the id, names the entry).
        for index, result in enumerate(response.markers[:len(group.entries)]):
            for p in result.partitions:
                results[(index, TopicPartition(p.topic, p.partition))] = (p.error_code, p.error_message)
        return results


class RoutingBrokerLink(BrokerLink):
    """On a cluster: the coordinator's own log still goes to its own broker (the leader of
    its partitions), but markers go to each partition's current leader, found with
    Metadata. A partition whose leader moved answers NOT_LEADER_OR_FOLLOWER; the marker loop
    retries it after a metadata refresh. Markers for partitions the coordinator's own
    broker leads (`own_node_id`) go to `stub`, in process when it is the broker's own."""

    def __init__(self, own_address: str, *, stub=None, own_node_id: int | None = None, security=None,
                 append_own: Callable[[str, int, bytes], int] | None = None,
                 write_own_markers: Callable[[int, tuple], dict] | None = None):
        super().__init__(own_address, stub=stub, append_own=append_own, write_own_markers=write_own_markers)
        from eos import net
        from eos.client_config import PLAINTEXT_SECURITY
        # `security`: the inter-broker listener's (own_address is on it, so Metadata names
        # every leader on it too).
        self._metadata = net.ClusterMetadata(own_address, security=security or PLAINTEXT_SECURITY)
        self._own_node_id = own_node_id if stub is not None else None

    def close(self) -> None:
        super().close()
        self._metadata.close()

    def write_markers(self, group: MarkerRequest) -> dict[tuple[int, TopicPartition], tuple[int, str]]:
        from eos import net
        topics = sorted({tp.topic for entry in group.entries for tp in entry.partitions})
        self._metadata.fetch(topics)
        by_leader: dict[int, list[tuple[int, MarkerEntry]]] = {}
        results: dict[tuple[int, TopicPartition], tuple[int, str]] = {}
        for index, entry in enumerate(group.entries):
            for tp in entry.partitions:
                leader = self._metadata.leader(tp.topic, tp.partition)
                if leader == net.NO_LEADER:
                    results[(index, tp)] = (ErrorCode.LEADER_NOT_AVAILABLE, f"{tp} has no leader right now")
                    continue
                by_leader.setdefault(leader, []).append((index, dataclasses.replace(entry, partitions=frozenset({tp}))))
        for leader, items in by_leader.items():
            if leader == self._own_node_id and self._write_own_markers is not None:
                answered = self._write_own_markers(group.coordinator_epoch, [entry for _, entry in items])
                for position, (index, entry) in enumerate(items):
                    for tp in entry.partitions:
                        results[(index, tp)] = answered[(position, tp)]
                continue
            stub = self._stub if leader == self._own_node_id else self._metadata.broker_stub(leader)
            if stub is None:
                for index, entry in items:
                    for tp in entry.partitions:
                        results[(index, tp)] = (ErrorCode.BROKER_NOT_AVAILABLE, f"no address for broker {leader}")
                continue
            try:
                response = stub.WriteTxnMarkers(broker_pb2.WriteTxnMarkersRequest(markers=[
                    broker_pb2.TxnMarker(producer_id=entry.producer_id, producer_epoch=entry.producer_epoch,
                                         committed=entry.committed, coordinator_epoch=group.coordinator_epoch,
                                         partitions=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition)
                                                     for tp in entry.partitions])
                    for _, entry in items]), timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as exc:
                for index, entry in items:
                    for tp in entry.partitions:
                        results[(index, tp)] = (ErrorCode.NETWORK_EXCEPTION, f"broker {leader}: {exc.code()}")
                continue
            for (index, _), result in zip(items, response.markers):
                for p in result.partitions:
                    results[(index, TopicPartition(p.topic, p.partition))] = (p.error_code, p.error_message)
        for (index, tp), (code, _) in results.items():
            if code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE,
                        ErrorCode.NETWORK_EXCEPTION, ErrorCode.BROKER_NOT_AVAILABLE):
                self._metadata.mark_stale(tp.topic)
        return results


class TransactionCoordinator:
    """Owns the core and the threads that carry out its decisions.

    `partitioned=True` (a cluster): this coordinator answers only for the transactional ids
    of the `__transaction_state` partitions its broker leads. `load_partition` replays one
    partition when the broker becomes its leader (the coordinator epoch of its ids is then
    the partition's leader epoch) and finishes the transactions it shows decided;
    `unload_partition` forgets them when leadership moves away. Requests for other ids are
    answered NOT_COORDINATOR, and COORDINATOR_LOAD_IN_PROGRESS while their partition loads."""

    def __init__(self, link: BrokerLink, new_producer_id: Callable[[], int], *,
                 now_ms_fn: Callable[[], int] = _now_ms, coordinator_epoch: int = 0,
                 state_topic_partitions: int = STATE_TOPIC_PARTITIONS,
                 expiry_interval_ms: int = EXPIRY_INTERVAL_MS,
                 max_timeout_ms: int = TRANSACTION_MAX_TIMEOUT_MS,
                 transactional_id_expiration_ms: int = TRANSACTIONAL_ID_EXPIRATION_MS,
                 partitioned: bool = False, concurrent_wait_ms: int = CONCURRENT_WAIT_MS,
                 concurrent_waiters_max: int = CONCURRENT_WAITERS_MAX):
        self._link = link
        self._new_producer_id = new_producer_id
        self._now_ms = now_ms_fn
        self._partitions = state_topic_partitions
        self._expiry_interval_ms = expiry_interval_ms
        self._core = TxnCoordinatorCore(coordinator_epoch=coordinator_epoch, max_timeout_ms=max_timeout_ms,
                                        transactional_id_expiration_ms=transactional_id_expiration_ms)
        self._lock = threading.Condition()   # notified whenever a state write lands or fails
        self._concurrent_wait_ms = concurrent_wait_ms
        self._concurrent_waiters_max = concurrent_waiters_max
        self._concurrent_waiters = 0
        self._markers: queue.Queue[MarkerRequest] = queue.Queue(MARKER_QUEUE_MAX)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._ready = threading.Event()
        self.partitioned = partitioned
        self._owned: dict[int, int] = {}         # partition -> coordinator epoch (its leader epoch)
        self._loading: set[int] = set()
        # transactions this coordinator completed (Complete* written), for the broker's metrics
        self.transactions_committed = 0
        self.transactions_aborted = 0
        if partitioned:
            self._core.epoch_of = lambda tid: self._owned.get(
                txn_log.partition_for(tid, self._partitions), self._core.coordinator_epoch)

    # ---- life cycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Replay the log, re-queue unfinished decisions, start the worker threads. On a
        cluster nothing is replayed here: partitions load as leadership arrives."""
        if self.partitioned:
            self._start_threads()
            self._ready.set()
            return
        self._partitions = self._link.ensure_topic(STATE_TOPIC, self._partitions)
        loaded = 0
        for partition in range(self._partitions):
            loaded += self._replay(partition, self._link.read_all(STATE_TOPIC, partition))
        unfinished = self._core.unfinished_markers()
        for marker in unfinished:
            self._markers.put(marker)
        log.info("transaction coordinator loaded %d records, %d transactional ids, %d decided transactions "
                 "to finish", loaded, len(self._core.durable), len(unfinished))
        self._start_threads()
        self._ready.set()

    def _start_threads(self) -> None:
        for target, name in ((self._marker_loop, "eos-txn-markers"), (self._expiry_loop, "eos-txn-expiry")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    # ---- partitions of a cluster -----------------------------------------------------------------

    def load_partition(self, partition: int, coordinator_epoch: int) -> None:
        """This broker now leads `__transaction_state` partition `partition`: replay it,
        take its ids at `coordinator_epoch`, finish what it shows decided."""
        with self._lock:
            self._loading.add(partition)
            self._owned.pop(partition, None)
        try:
            records = list(self._link.read_all(STATE_TOPIC, partition))
        except Exception:
            with self._lock:
                self._loading.discard(partition)
            raise
        with self._lock:
            ids = {tid for tid in self._core.durable if txn_log.partition_for(tid, self._partitions) == partition}
            self._core.unload(ids)
            self._replay(partition, records)
            self._owned[partition] = coordinator_epoch
            self._loading.discard(partition)
            self._lock.notify_all()
            unfinished = [m for m in self._core.unfinished_markers()
                          if txn_log.partition_for(m.transactional_id, self._partitions) == partition]
        for marker in unfinished:
            self._markers.put(marker)
        log.info("transaction coordinator took %s-%d at epoch %d: %d records, %d decided transactions to finish",
                 STATE_TOPIC, partition, coordinator_epoch, len(records), len(unfinished))

    def _replay(self, partition: int, records) -> int:
        """Replay (key, value) records of a `__transaction_state` partition into the core;
        returns how many. One that cannot be read is skipped with an error, as the group
        coordinator skips one in `__consumer_offsets`: refusing to load would stop every
        transactional id of the partition for good (and only the broker writes there)."""
        count = 0
        for key, value in records:
            try:
                transactional_id = txn_log.decode_key(key)
                metadata = txn_log.decode_value(transactional_id, value)
            except CorruptRecordError as exc:
                log.error("skipping an unreadable record of %s-%d: %s", STATE_TOPIC, partition, exc)
                continue
            self._core.replay(metadata, transactional_id)
            count += 1
        return count

    def unload_partition(self, partition: int) -> None:
        with self._lock:
            self._owned.pop(partition, None)
            self._loading.discard(partition)
            ids = {tid for tid in set(self._core.durable) | set(self._core.pending)
                   if txn_log.partition_for(tid, self._partitions) == partition}
            self._core.unload(ids)
            self._lock.notify_all()

    def owns(self, transactional_id: str) -> bool:
        return not self.partitioned or txn_log.partition_for(transactional_id, self._partitions) in self._owned

    def ownership_refusal(self, transactional_id: str) -> Decision | None:
        """NOT_COORDINATOR (or COORDINATOR_LOAD_IN_PROGRESS) for an id this broker does not
        answer for on a cluster, else None: for the reads (DescribeTransactions), which
        would otherwise answer "no such id" for an id that another broker coordinates."""
        with self._lock:
            return self._not_owned(transactional_id)

    def _not_owned(self, transactional_id: str) -> Decision | None:
        """On a cluster: the refusal for an id whose partition this broker does not lead."""
        if not self.partitioned:
            return None
        partition = txn_log.partition_for(transactional_id, self._partitions)
        if partition in self._owned:
            return None
        if partition in self._loading:
            return Decision(error=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                            message=f"{STATE_TOPIC}-{partition} is loading")
        return Decision(error=ErrorCode.NOT_COORDINATOR,
                        message=f"this broker does not coordinate {transactional_id!r} ({STATE_TOPIC}-{partition})")

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout_s)

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def concurrent_waiter_count(self) -> int:
        """Requests parked until their id's previous transaction completes (for metrics)."""
        return self._concurrent_waiters

    # ---- carrying out decisions ---------------------------------------------------------------

    def _carry_out(self, decision: Decision) -> Decision:
        """Append the decision's record (if any) and apply it; a failed append becomes a
        retriable error for the caller and leaves the durable state as it was."""
        if decision.write is None:
            return decision
        md = decision.write
        record = encode_batch([txn_log.encode_value(md)], keys=[txn_log.encode_key(md.transactional_id)])
        try:
            self._link.append(STATE_TOPIC, txn_log.partition_for(md.transactional_id, self._partitions), record)
        except (EosError, grpc.RpcError) as exc:
            with self._lock:
                self._core.write_failed(md)
                self._lock.notify_all()
            log.warning("cannot write the state of %r: %s", md.transactional_id, exc)
            return Decision(error=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                            message=f"the transaction log is not writable: {exc}")
        with self._lock:
            if not self._core.awaits_write(md):
                # The partition was reloaded meanwhile; what the log holds is the truth now
                # and the client's retry meets it (Kafka answers NOT_COORDINATOR here too).
                log.info("the state of %r was written while its partition reloaded; the client retries",
                         md.transactional_id)
                return Decision(error=ErrorCode.NOT_COORDINATOR,
                                message=f"{md.transactional_id!r}: its {STATE_TOPIC} partition was reloaded "
                                        f"while the write was in flight; retry")
            markers = self._core.write_completed(md)
            if md.state is TxnState.COMPLETE_COMMIT:
                self.transactions_committed += 1
            elif md.state is TxnState.COMPLETE_ABORT:
                self.transactions_aborted += 1
            self._lock.notify_all()
        if markers is not None:
            self._markers.put(markers)
        return decision

    def _marker_loop(self) -> None:
        retry: collections.deque[tuple[float, MarkerRequest]] = collections.deque()
        while not self._stopping.is_set():
            if retry and retry[0][0] <= time.monotonic():
                group = retry.popleft()[1]
            else:
                try:
                    group = self._markers.get(timeout=0.05)
                except queue.Empty:
                    continue
            try:
                again = self._work_on(group)
            except Exception:
                # This thread finishes every decided transaction: it must outlive any one
                # group (the group is retried; a coordinator move would drop it anyway).
                log.exception("marker group of %r failed; retrying it", group.transactional_id)
                again = group
            if again is not None:
                retry.append((time.monotonic() + MARKER_RETRY_BACKOFF_MS / 1000, again))

    def _work_on(self, group: MarkerRequest) -> MarkerRequest | None:
        """Send a group's markers and write Complete*; returns what to retry, or None."""
        if self.partitioned and group.transactional_id and not self.owns(group.transactional_id):
            return None     # its partition moved: the new coordinator finishes it from the log
        with self._lock:
            current = self._core.awaits_markers(group)
        if not current:
            log.info("dropping a stale marker group of %r (coordinator epoch %d)", group.transactional_id,
                     group.coordinator_epoch)
            return None
        remaining = self._send_markers(group) if group.entries else None
        if remaining is not None:
            return remaining
        with self._lock:
            if not self._core.awaits_markers(group):
                return None
            decision = self._core.markers_written(group.transactional_id, self._now_ms())
        if not self._carry_out(decision).ok:
            # Complete* not written: the transaction stays decided. Its markers are all
            # in; only the Complete* write is retried (an empty group goes straight to it).
            return MarkerRequest(group.transactional_id, group.coordinator_epoch, ())
        return None

    def _send_markers(self, group: MarkerRequest) -> MarkerRequest | None:
        """Send the group; return the part that still needs sending (None: all written)."""
        try:
            results = self._link.write_markers(group)
        except grpc.RpcError as exc:
            log.warning("WriteTxnMarkers for %r failed: %s", group.transactional_id, exc.code())
            return group
        remaining_entries = []
        for index, entry in enumerate(group.entries):
            remaining = frozenset(tp for tp in entry.partitions
                                  if self._needs_resend(group, entry, tp, results.get((index, tp))))
            if remaining:
                remaining_entries.append(dataclasses.replace(entry, partitions=remaining))
        if not remaining_entries:
            return None
        return MarkerRequest(group.transactional_id, group.coordinator_epoch, tuple(remaining_entries))

    @staticmethod
    def _needs_resend(group: MarkerRequest, entry: MarkerEntry, tp: TopicPartition,
                      answer: tuple[int, str] | None) -> bool:
        code, message = answer or (ErrorCode.UNKNOWN_SERVER_ERROR, "no answer for the partition")
        if code == ErrorCode.NONE:
            return False
        if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            # The topic is gone: there is nothing left to mark (Kafka drops it too).
            log.warning("dropping the marker of %r (producer %d) for deleted %s", group.transactional_id,
                        entry.producer_id, tp)
            return False
        if code in (ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.TRANSACTION_COORDINATOR_FENCED):
            # The partition has moved past this transaction (a newer epoch or coordinator
            # wrote there): retrying can never succeed, so the marker is dropped.
            log.error("dropping the marker of %r (producer %d) for %s: %s %s", group.transactional_id,
                      entry.producer_id, tp, ErrorCode(code).name, message)
            return False
        if reaction_for(code) is not Reaction.RETRY:
            log.error("marker of %r (producer %d) for %s refused: %s %s; retrying", group.transactional_id,
                      entry.producer_id, tp, ErrorCode(code).name, message)
        return True

    def _expiry_loop(self) -> None:
        while not self._stopping.wait(self._expiry_interval_ms / 1000):
            self.expire_now()

    def expire_now(self) -> int:
        with self._lock:
            decisions = self._core.expire(self._now_ms(), self._new_producer_id)
        for decision in decisions:
            self._carry_out(decision)
        return len(decisions)

    # ---- requests (called by the servicer) -----------------------------------------------------

    def _decide(self, transactional_id: str, core_decision: Callable[[], Decision]) -> Decision:
        """`core_decision()` under the lock, for an id this coordinator owns; while it
        answers CONCURRENT_TRANSACTIONS with nothing to write, wait for a state write to land
        and decide again (see the module doc). Ownership is checked again each time: the
        id's partition may move away during the wait."""
        def decide() -> Decision:
            return self._not_owned(transactional_id) or core_decision()

        with self._lock:
            decision = decide()
            if not self._should_wait(decision) or self._concurrent_waiters >= self._concurrent_waiters_max:
                return decision
            self._concurrent_waiters += 1
            try:
                deadline = time.monotonic() + self._concurrent_wait_ms / 1000
                while self._should_wait(decision) and not self._stopping.is_set():
                    remaining_s = deadline - time.monotonic()
                    if remaining_s <= 0:
                        break
                    self._lock.wait(remaining_s)
                    decision = decide()
            finally:
                self._concurrent_waiters -= 1
            return decision

    @staticmethod
    def _should_wait(decision: Decision) -> bool:
        return decision.error == ErrorCode.CONCURRENT_TRANSACTIONS and decision.write is None

    def init_producer_id(self, transactional_id: str, timeout_ms: int, producer_id: int = -1,
                         producer_epoch: int = -1) -> Decision:
        return self._carry_out(self._decide(transactional_id, lambda: self._core.init_producer_id(
            transactional_id, timeout_ms, self._now_ms(), self._new_producer_id,
            expected_producer_id=producer_id, expected_producer_epoch=producer_epoch)))

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: list[TopicPartition]) -> Decision:
        return self._carry_out(self._decide(transactional_id, lambda: self._core.add_partitions(
            transactional_id, producer_id, producer_epoch, partitions, self._now_ms())))

    def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str,
                    offsets_partitions: int = 50) -> Decision:
        tp = TopicPartition(OFFSETS_TOPIC, txn_log.partition_for(group_id, offsets_partitions))
        return self.add_partitions(transactional_id, producer_id, producer_epoch, [tp])

    def init_participant(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         partitions: list[TopicPartition] = ()) -> Decision:
        """The owner (producer_id, producer_epoch) asks for a participant producer id; the
        Decision carries the participant's id and epoch."""
        return self._carry_out(self._decide(transactional_id, lambda: self._core.init_participant(
            transactional_id, producer_id, producer_epoch, partitions, self._now_ms(), self._new_producer_id)))

    def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: list[TopicPartition]) -> Decision:
        refused = self._not_owned(transactional_id)
        if refused is not None:
            return refused
        with self._lock:
            return self._core.verify_partitions(transactional_id, producer_id, producer_epoch, partitions)

    def end_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int,
                        commit: bool, accepted_participants: list[int] = ()) -> Decision:
        return self._carry_out(self._decide(transactional_id, lambda: self._core.end_transaction(
            transactional_id, producer_id, producer_epoch, commit, self._now_ms(), self._new_producer_id,
            accepted_participants=accepted_participants)))

    def abort_hanging(self, tp: TopicPartition, producer_id: int, producer_epoch: int,
                      coordinator_epoch: int) -> tuple[int, str]:
        """KIP-664: write an ABORT marker for a producer whose transaction hangs in `tp`
        (one the coordinator no longer knows about). Returns (error code, message)."""
        marker = MarkerRequest("", coordinator_epoch, (MarkerEntry(producer_id, producer_epoch, False,
                                                                    frozenset({tp})),))
        try:
            results = self._link.write_markers(marker)
        except grpc.RpcError as exc:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, f"WriteTxnMarkers failed: {exc.code()}"
        return results.get((0, tp), (ErrorCode.UNKNOWN_SERVER_ERROR, "no answer for the partition"))

    def describe(self, transactional_id: str) -> TxnMetadata | None:
        with self._lock:
            return self._core.describe(transactional_id)

    def list(self, **filters) -> list[TxnMetadata]:
        with self._lock:
            return self._core.list(now_ms=self._now_ms(), **filters)

    @property
    def coordinator_epoch(self) -> int:
        return self._core.coordinator_epoch

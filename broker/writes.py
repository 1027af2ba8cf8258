"""Produce and ProduceStream of the Broker service: appends, in order, with their checks.

Theory of operation
-------------------
Single node, so replication collapses: every partition's leader is this node at leader
epoch 0 with replicas = isr = [node]. acks=1 and acks=all both answer once the batch is in
the log (appended to the page cache; fsync follows flush.messages / flush.ms, as in Kafka).
acks=all additionally requires min.insync.replicas <= 1, the size of the ISR, and answers
NOT_ENOUGH_REPLICAS (appending nothing) otherwise. acks=0 still gets a response, because a
unary gRPC call always has one; the client may ignore it.

Produce streams. gRPC runs concurrent unary calls in any order, while Kafka's producer
relies on its connection keeping request order (five idempotent batches of a partition in
flight must arrive in sequence order). `ProduceStream` gives that order back: the requests
of one stream are handled one at a time, in arrival order, by `_produce` -- the very
function a unary Produce runs -- and answered in that order, each response echoing its
request's correlation_id. A bad request is answered with its per-partition errors and the
stream goes on; only what gRPC itself cannot read (a message over
socket.request.max.bytes) fails the whole stream. The handler reads gRPC's iterator on
its own thread until it first reads ahead of answers waiting for replicas; from then on a
reader thread hands it the requests (`broker/produce_streams.py`). On stop the request
being handled is answered, later ones are not (the client retries them, as after a closed
Kafka connection), and the stream ends with UNAVAILABLE, or CANCELLED if its handler was
waiting for a request inside gRPC. A client that closes its side gets every request it
sent answered, then the end of the stream. A stream holds a worker thread for its
lifetime, so at most `max_produce_streams` are open at once; one more is refused at open with
RESOURCE_EXHAUSTED and trailing metadata `eos-produce-stream-refused: resource_exhausted`.
On a cluster an acks=all request waits for the in-sync replicas after its append; a stream
appends up to STREAM_REPLICATION_PIPELINE_MAX further requests meanwhile (in order, so
sequences stay in order) and answers each once the replicas have it, in arrival order, so one
replication round trip serves several requests.

Transactional writes (KIP-890). A transactional batch from a client that would open a
transaction in a partition (its producer has none open there at that epoch) is first checked
with the transaction coordinator (`verify_txn`): a partition the coordinator has not
registered in the producer's open transaction is refused (INVALID_TXN_STATE, or the
coordinator's own error such as PRODUCER_FENCED) and nothing is appended, so a late write
from a finished or fenced transaction can never open a transaction that no marker will
close. A request with `add_partitions_to_txn` (KIP-890 part 2, a client that sends no
AddPartitionsToTxn) has those partitions added to the producer's open transaction instead
(`add_txn_partitions`: the coordinator's AddPartitionsToTxn, made by the broker), with the
same refusals: the coordinator still checks the producer id and epoch, so a fenced or
finished producer opens nothing. As in Kafka, a request with transactional batches but no
transactional_id, or with transactional batches of more than one producer, is refused as a
whole.

Internal topics (`__consumer_offsets`, `__transaction_state`) are the coordinators': their
own appends do not come through here, and a client's Produce to them is refused
(INVALID_TOPIC_EXCEPTION, nothing appended), as Kafka refuses it to every client but its
admin client id (`eos.net.ADMIN_CLIENT_ID`). One stray keyed record there could stop the
coordinator loading the partition.

`WriteHandlers` is a part of `broker/service.BrokerServicer` (which inherits it): it uses
the servicer's `_log_for`, `_registry`, `_log_manager`, `_replicas`, `_purgatory`,
`_authorizer`, `_topic_denied`, `_denial`, `_verify_txn`, `_add_txn_partitions`, `_quotas`,
`_gate`, `_streams`, `_now_ms`, `_log_partition_error`, `storage_errors` and `traffic`.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import logging

import grpc

from broker.acl import Operation, ResourceType
from broker.produce_streams import NOTHING_YET, ProduceStreamSession
from broker.quotas import PRODUCER_BYTE_RATE
from broker.request_gate import gated
from broker.security import client_id_of_call
from broker.topics import PROTECTED_INTERNAL_TOPICS
from eos.errors import EosError, ErrorCode, error_code_and_message, error_for
from eos.net import ADMIN_CLIENT_ID
from eos.records.header import BatchHeader, iter_headers
from eos.types import TopicPartition
from eos.v1 import broker_pb2

log = logging.getLogger("eos.broker")

PRODUCE_TIMEOUT_MS_DEFAULT = 30000             # request.timeout.ms: how long acks=all waits
# acks=all requests of one produce stream appended but not yet answered (waiting for the
# in-sync replicas): the handler appends the next requests meanwhile and answers in order,
# so one replication round trip covers several requests (Kafka's max.in.flight is 5).
STREAM_REPLICATION_PIPELINE_MAX = 5
# Trailing metadata of a ProduceStream refused at open: "resource_exhausted" (too many
# streams: fall back to unary Produce) or "unavailable" (the broker is stopping), so a
# client can tell the refusal from gRPC's own RESOURCE_EXHAUSTED (a message too large).
STREAM_REFUSAL_METADATA_KEY = "eos-produce-stream-refused"
# Coordinator errors that only mean "could not verify now": answered as Kafka does, with a
# retriable produce error that does not send the client looking for new metadata.
_VERIFICATION_UNAVAILABLE = frozenset({
    ErrorCode.NETWORK_EXCEPTION, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR,
})


class _RequestRefused(EosError):
    """A produce request refused as a whole: every partition gets this code."""


def _produce_error(p: broker_pb2.PartitionRecords, code: int, message: str) -> broker_pb2.PartitionProduceResult:
    return broker_pb2.PartitionProduceResult(
        topic=p.topic, partition=p.partition, error_code=code, error_message=message,
        base_offset=-1, log_append_time_ms=-1, log_start_offset=-1)


def _may_write_internal_topics(context) -> bool:
    """Only the broker's own calls (in process: no call metadata) and its admin client id may
    append to an internal topic (see the module doc)."""
    if context is None or not hasattr(context, "invocation_metadata"):
        return True
    return client_id_of_call(context) == ADMIN_CLIENT_ID


def _refuse_produce(request: broker_pb2.ProduceRequest, code: int, message: str) -> broker_pb2.ProduceResponse:
    return broker_pb2.ProduceResponse(partitions=[_produce_error(p, code, message) for p in request.partitions])


def _parse_headers(records: bytes) -> list[BatchHeader] | None:
    """The batch headers of `records` (one header parse per batch, no record work), handed
    to the log's append so that it does not parse them again; None when the bytes do not
    parse: the append then parses them itself and refuses them with the precise error."""
    try:
        return list(iter_headers(records))
    except Exception:
        return None


def _transactional_producers(headers: list[BatchHeader] | None) -> set[tuple[int, int]]:
    """(producer id, epoch) of the transactional data batches among `headers`."""
    return {(h.producer_id, h.producer_epoch) for h in headers or ()
            if h.is_transactional and not h.is_control}


def _verification_refusal(tp: TopicPartition, transactional_id: str, code: int, message: str) -> tuple[int, str]:
    """The produce error for a partition the transaction coordinator did not confirm."""
    where = f"{tp.topic}-{tp.partition}"
    if code == ErrorCode.INVALID_TXN_STATE:
        return code, (f"partition {where} was not added to the transaction of {transactional_id!r} "
                      f"(AddPartitionsToTxn must come first, or add_partitions_to_txn be set): {message}")
    if code in _VERIFICATION_UNAVAILABLE:
        return ErrorCode.NOT_ENOUGH_REPLICAS, (
            f"could not verify that {where} is in the transaction of {transactional_id!r}; retry "
            f"(the coordinator answered {ErrorCode(code).name}: {message})")
    try:
        name = ErrorCode(code).name
    except ValueError:
        name = str(code)
    return code, f"the transaction coordinator refused the write to {where} ({name}): {message}"


class WriteHandlers:
    """Produce and ProduceStream; see the module doc."""

    # ---- Produce -----------------------------------------------------------------------------

    @gated
    def Produce(self, request: broker_pb2.ProduceRequest, context) -> broker_pb2.ProduceResponse:
        return self._produce_within_quota(request, context)

    def _produce_within_quota(self, request: broker_pb2.ProduceRequest, context,
                              waits: list | None = None) -> broker_pb2.ProduceResponse:
        """`_produce` after the producer's throttle (if any) is over; the response carries
        the throttle its bytes earn (Kafka appends first and throttles after: see
        broker/client_quotas.py)."""
        if self._quotas is None:
            return self._produce(request, waits, context)
        who, go_on = self._quotas.hold(PRODUCER_BYTE_RATE, context)
        if not go_on:      # not held (see ClientQuotas.hold): refused, nothing appended
            response = _refuse_produce(request, ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                                       "over the client's produce quota: wait throttle_time_ms before sending")
            response.correlation_id = request.correlation_id
            response.throttle_time_ms = self._quotas.owed_ms(PRODUCER_BYTE_RATE, who)
            return response
        response = self._produce(request, waits, context)
        response.throttle_time_ms = self._quotas.charge(
            PRODUCER_BYTE_RATE, who, sum(len(p.records) for p in request.partitions))
        return response

    def ProduceStream(self, request_iterator, context):
        """Produce over one ordered stream (see "Produce streams" in the module doc): each
        request goes through `_produce`, as a unary Produce does, one at a time in arrival
        order, and its response, echoing the correlation_id, is yielded in the same order."""
        session = ProduceStreamSession(request_iterator, context.cancel)
        refusal = self._streams.register(session)
        if refusal is not None:
            code, message = refusal
            context.set_trailing_metadata(((STREAM_REFUSAL_METADATA_KEY, code.name.lower()),))
            context.abort(code, message)
        def on_rpc_done() -> None:
            # Also when gRPC drops this generator without closing it (the call ended while
            # an answer was being sent): the place is given back without waiting for the GC.
            session.rpc_done()
            self._streams.unregister(session)

        try:
            if not context.add_callback(on_rpc_done):
                on_rpc_done()   # the call is over already
            # (response, its acks=all waits) appended, in arrival order, not yet answered
            answering: collections.deque = collections.deque()
            while True:
                request = session.next_request(wait=not answering)
                if (request is NOTHING_YET or request is None or len(answering) >= STREAM_REPLICATION_PIPELINE_MAX
                        or (answering and self._quotas is not None
                            and self._quotas.would_hold(PRODUCER_BYTE_RATE, context))):
                    # (the last: answers already appended go out before the next request waits
                    # out a quota throttle, or they would be late by it)
                    if request is not NOTHING_YET and request is not None:
                        session.push_back(request)
                    if not answering:
                        break
                    response, waits = answering.popleft()
                    self._finish_replication(response, waits)
                    yield response   # returns once gRPC took the message
                    continue
                if not self._gate.enter():
                    break
                try:
                    waits: list = []
                    response = self._produce_within_quota(request, context, waits)
                finally:
                    self._gate.exit()
                if waits or answering:
                    answering.append((response, waits))
                else:
                    yield response   # nothing to wait for: answered now, in order
            for response, waits in answering:   # the stream ends: what was appended is still answered
                self._finish_replication(response, waits)
                yield response
            if session.stopping or self._gate.closed:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the broker is shutting down")
        finally:
            session.finish()
            self._streams.unregister(session)

    def _produce(self, request: broker_pb2.ProduceRequest, waits: list | None = None,
                 context=None) -> broker_pb2.ProduceResponse:
        """One produce request, unary or from a stream: per-partition results, the
        request's correlation_id echoed. Never raises (a stream goes on after a bad request).
        With `waits` (a stream), acks=all partitions are appended but their wait for the
        in-sync replicas is left in `waits` for `_finish_replication`."""
        try:
            response = self._produce_partitions(request, waits, context)
        except Exception as exc:   # a bug below: this request fails, the broker goes on
            log.exception("Produce failed unexpectedly")
            response = _refuse_produce(request, ErrorCode.UNKNOWN_SERVER_ERROR,
                                       f"unexpected {type(exc).__name__}: {exc}")
        self.add_leader_hints(response.partitions)
        response.correlation_id = request.correlation_id
        return response

    def _finish_replication(self, response: broker_pb2.ProduceResponse, waits: list) -> None:
        """Wait (bounded) for the in-sync replicas of each deferred acks=all partition and
        turn its result into the error if they did not copy it in time."""
        for index, wait in waits:
            code, message = wait()
            if code != ErrorCode.NONE:
                result = response.partitions[index]
                result.error_code = code
                result.error_message = message
                result.base_offset = -1
                self.add_leader_hints((result,))

    def _produce_partitions(self, request: broker_pb2.ProduceRequest,
                            waits: list | None = None, context=None) -> broker_pb2.ProduceResponse:
        acks = request.acks
        if acks not in (0, 1, -1):
            return _refuse_produce(request, ErrorCode.INVALID_REQUIRED_ACKS,
                                   f"acks must be 0, 1 or -1 (all), got {acks}")
        headers = [_parse_headers(p.records) for p in request.partitions]
        denied: dict[int, tuple[int, str]] = {}
        if self._authorizer is not None:
            try:
                denied = self._authorize_produce(request, headers)
            except _RequestRefused as refused:
                return _refuse_produce(request, refused.code, str(refused))
        for index, p in enumerate(request.partitions):
            if p.topic in PROTECTED_INTERNAL_TOPICS and not _may_write_internal_topics(context):
                denied[index] = (ErrorCode.INVALID_TOPIC_EXCEPTION,
                                 f"Cannot append to internal topic {p.topic}: it belongs to the broker's coordinators")
        try:
            refusals = self._verify_transactional_writes(request, headers, skip=denied)
        except _RequestRefused as refused:
            return _refuse_produce(request, refused.code, str(refused))
        refusals.update(denied)
        now_ms = self._now_ms()
        timeout_ms = request.timeout_ms if request.timeout_ms > 0 else PRODUCE_TIMEOUT_MS_DEFAULT
        results = [self._produce_partition(p, acks, now_ms, headers[i], timeout_ms,
                                           None if waits is None else (lambda w, i=i: waits.append((i, w))))
                   if i not in refusals else _produce_error(p, *refusals[i])
                   for i, p in enumerate(request.partitions)]
        return broker_pb2.ProduceResponse(partitions=results)

    def _authorize_produce(self, request: broker_pb2.ProduceRequest,
                           headers: list[list[BatchHeader] | None]) -> dict[int, tuple[int, str]]:
        """Kafka's checks of a Produce: transactional batches need WRITE on the request's
        transactional id (else the whole request fails); every partition needs WRITE on its
        topic (else that partition fails, before anything is verified or appended). An
        idempotent producer needs nothing more (KIP-679: WRITE on the topic is enough)."""
        if any(_transactional_producers(h) for h in headers):
            tid = request.transactional_id
            if not tid or not self._authorizer.allowed(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
                raise _RequestRefused(self._denial(Operation.WRITE, f"transactional id {tid!r}"),
                                      ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        decided: dict[str, bool] = {}
        denied: dict[int, tuple[int, str]] = {}
        for index, p in enumerate(request.partitions):
            refused = decided.get(p.topic)
            if refused is None:
                refused = decided[p.topic] = self._topic_denied(Operation.WRITE, p.topic)
            if refused:
                denied[index] = (ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                 self._denial(Operation.WRITE, f"topic {p.topic!r}"))
        return denied

    def _verify_transactional_writes(self, request: broker_pb2.ProduceRequest,
                                     headers: list[list[BatchHeader] | None],
                                     skip: dict[int, tuple[int, str]] | None = None) -> dict[int, tuple[int, str]]:
        """KIP-890 part 1: the partitions where a transactional batch would open its
        producer's transaction are checked with the transaction coordinator first. Returns
        the refused partitions as {index in request.partitions: (code, message)}; raises
        _RequestRefused when the request as a whole is malformed (Kafka's rules). The
        partitions in `skip` (refused already: not authorized) are neither verified nor
        added to the transaction."""
        producers: set[tuple[int, int]] = set()
        candidates: list[tuple[int, broker_pb2.PartitionRecords]] = []
        for index, p in enumerate(request.partitions):
            if skip and index in skip:
                continue
            found = _transactional_producers(headers[index])
            if found:
                producers |= found
                candidates.append((index, p))
        if not candidates:
            return {}
        if not request.transactional_id:
            # Kafka refuses the whole request (as TRANSACTIONAL_ID_AUTHORIZATION_FAILED: no id
            # cannot be authorised); eos has no authorisation, so it is a malformed request.
            raise _RequestRefused(
                "the request holds transactional batches but no transactional_id: a transactional "
                "producer must send its transactional.id with every produce", ErrorCode.INVALID_REQUEST)
        if len(producers) > 1:
            pairs = ", ".join(f"{pid}/{epoch}" for pid, epoch in sorted(producers))
            raise _RequestRefused(
                f"the transactional batches of one request must come from one producer id and epoch, "
                f"found {pairs}", ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        [(producer_id, producer_epoch)] = producers
        to_verify: dict[TopicPartition, list[int]] = {}
        for index, p in candidates:
            partition_log = self._log_manager.get_log(p.topic, p.partition)
            # Already open here at this epoch: the coordinator registered the partition when
            # the transaction began, and its end bumps the epoch, fencing later appends.
            if partition_log is not None and partition_log.has_ongoing_transaction(producer_id, producer_epoch):
                continue
            to_verify.setdefault(TopicPartition(p.topic, p.partition), []).append(index)
        # KIP-890 part 2: a client that sends no AddPartitionsToTxn asks the broker to add
        # the partitions (one call to the coordinator for the whole request).
        ask = self._add_txn_partitions if request.add_partitions_to_txn else self._verify_txn
        if not to_verify or ask is None:
            return {}
        try:
            answers = ask(request.transactional_id, producer_id, producer_epoch, list(to_verify))
        except Exception as exc:
            log.warning("verifying transactional partitions of %r with the coordinator failed: %s",
                        request.transactional_id, exc)
            answers = {tp: (ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{type(exc).__name__}: {exc}") for tp in to_verify}
        refusals: dict[int, tuple[int, str]] = {}
        for tp, indexes in to_verify.items():
            code, message = answers.get(
                tp, (ErrorCode.UNKNOWN_SERVER_ERROR, "the transaction coordinator gave no answer for it"))
            if code == ErrorCode.NONE:
                continue
            refusal = _verification_refusal(tp, request.transactional_id, code, message)
            log.debug("Produce %s-%d: transactional write refused: %s", tp.topic, tp.partition, refusal[1])
            for index in indexes:
                refusals[index] = refusal
        return refusals

    def _produce_partition(self, p: broker_pb2.PartitionRecords, acks: int, now_ms: int,
                           headers: list[BatchHeader] | None = None,
                           timeout_ms: int = PRODUCE_TIMEOUT_MS_DEFAULT,
                           defer=None) -> broker_pb2.PartitionProduceResult:
        code, message, append, log_start_offset = self._append_partition(
            p.topic, p.partition, p.records, acks, now_ms, headers, timeout_ms, defer)
        if code != ErrorCode.NONE:
            return _produce_error(p, code, message)
        return broker_pb2.PartitionProduceResult(
            topic=p.topic, partition=p.partition, error_code=ErrorCode.NONE,
            base_offset=append.first_offset, log_append_time_ms=append.log_append_time_ms,
            log_start_offset=log_start_offset)

    def _append_partition(self, topic: str, partition: int, records: bytes, acks: int, now_ms: int,
                          headers: list[BatchHeader] | None, timeout_ms: int, defer):
        """One partition of a Produce: the leader's checks and append, then (acks=all on a
        cluster) the wait for the in-sync replicas, or `defer(wait)` to leave it to the
        caller. (code, message, LogAppendInfo or None, log start offset)."""
        replicas = self._replicas
        try:
            with (replicas.leader_append(topic, partition) if replicas is not None
                  else contextlib.nullcontext(0)) as leader_epoch:
                partition_log = self._log_for(topic, partition, may_create=replicas is None)
                min_isr = self._registry.get(topic).config.min_insync_replicas
                if acks == -1:
                    if replicas is not None:
                        replicas.check_min_isr(topic, partition, min_isr)
                    elif min_isr > 1:
                        raise EosError(
                            f"acks=all needs min.insync.replicas={min_isr} in-sync replicas; "
                            f"{topic}-{partition} has 1 (single broker)",
                            ErrorCode.NOT_ENOUGH_REPLICAS)
                append = partition_log.append_as_leader(records, now_ms, headers=headers,
                                                        leader_epoch=leader_epoch)
                if replicas is not None and not append.duplicate:
                    replicas.on_leader_append(topic, partition, partition_log)
        except Exception as exc:
            code, message = error_code_and_message(exc)
            self._log_partition_error("Produce", topic, partition, exc)
            return code, message, None, -1
        if self.storage_errors.failing and self.storage_errors.recovered(topic, partition):
            log.info("Produce %s-%d: writes succeed again after storage errors", topic, partition)
        if not append.duplicate:
            # wakes followers' long polls (they read to the log end) and, on one node, readers
            self._purgatory.notify(TopicPartition(topic, partition))
            if self.traffic is not None:
                self.traffic.produced(topic, len(records), append.last_offset - append.first_offset + 1)
        if replicas is not None and acks == -1:
            wait = functools.partial(replicas.wait_for_high_watermark, topic, partition,
                                     append.last_offset + 1, timeout_ms, min_isr)
            if defer is not None:
                defer(wait)        # answered in order once the in-sync replicas have it
            else:
                code, message = wait()
                if code != ErrorCode.NONE:
                    return code, message, None, -1
        return ErrorCode.NONE, "", append, partition_log.log_start_offset

    def append_own_records(self, topic: str, partition: int, records: bytes) -> int:
        """A coordinator's write to its own log in this broker (the transaction log's state
        records): what a Produce with acks=all of `records` to that one partition does --
        the same checks, append and wait for the in-sync replicas, inside the shutdown gate
        -- without the request around it (its messages, the quota, the ACLs a broker's own
        write passes anyway): half the cost of that write, paid three times a transaction.
        Returns the base offset; raises the partition's error as a client's Produce would
        report it."""
        if not self._gate.enter():
            raise EosError("the broker is shutting down", ErrorCode.BROKER_NOT_AVAILABLE)
        try:
            code, message, append, _ = self._append_partition(
                topic, partition, records, -1, self._now_ms(), None, PRODUCE_TIMEOUT_MS_DEFAULT, None)
        finally:
            self._gate.exit()
        if code != ErrorCode.NONE:
            raise error_for(code, message)
        return append.first_offset

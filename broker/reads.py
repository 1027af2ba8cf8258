"""Fetch and ListOffsets of the Broker service: what a reader may see, and where.

Theory of operation
-------------------
Fetch reads each partition up to min(partition_max_bytes, what is left of max_bytes). The
first batch of the response is returned whole even when it is larger (as Kafka does since
KIP-74), so a consumer can never be stuck behind one big batch. How far a reader may see
is `_upper_bound(log, isolation)`: the high watermark for read_uncommitted, the last stable
offset (LSO: the first offset of the earliest open transaction, else the high watermark)
for read_committed. A read_committed read is bounded by the LSO of the same log snapshot
its bytes come from and carries the aborted transactions (producer id, first offset) that
overlap them, so the consumer can drop aborted batches. Every response carries the LSO.
When the response holds fewer than min_bytes (counting only what the reader may see) and
max_wait_ms > 0, the fetch waits in the purgatory (woken by appends and transaction markers
on its partitions, its deadline, its RPC being cancelled, or shutdown) and reads again. A
wait that ends without a wake-up reads again only if a partition's bound moved meanwhile;
otherwise its last read is the answer. No lock is held while reading or appending.

A client's Fetch also answers to its client quota (`broker/client_quotas.py`): it waits out
a throttle its entity owes, is cut to what one quota window allows, and comes back empty
(uncharged) when it would go over; replica fetches never are.

ListOffsets finds an offset by timestamp within the same bound: earliest, latest (the
bound), the first record at or after a timestamp, or the record with the largest
timestamp (KIP-734).

`ReadHandlers` is a part of `broker/service.BrokerServicer` (which inherits it): it uses
the servicer's `_log_for`, `_authorizer`, `_topic_denied`, `_denial`, `_replicas`,
`_purgatory`, `_fetch_sessions`, `_quotas`, `_fetch_max_wait_cap_ms`, `_log_partition_error` and
`traffic`.
"""
from __future__ import annotations

import threading
import time

from broker.acl import Operation
from broker.fetch_sessions import FINAL_EPOCH, INITIAL_EPOCH, report_interval_s
from broker.quotas import CONSUMER_BYTE_RATE
from broker.request_gate import gated
from eos.errors import EosError, ErrorCode, InvalidRequestError, OffsetNotAvailableError, error_code_and_message
from eos.records.header import offsets_spanned
from eos.types import TopicPartition
from eos.v1 import broker_pb2, common_pb2

# Kafka's client defaults, used when a request leaves a size at proto3's 0.
FETCH_MAX_BYTES_DEFAULT = 52428800            # fetch.max.bytes
PARTITION_FETCH_MAX_BYTES_DEFAULT = 1048576   # max.partition.fetch.bytes
# A response must fit in one gRPC message (100 MiB); leave room for the envelope.
FETCH_RESPONSE_BYTES_MAX = 90 * 1024 * 1024
FETCH_MAX_WAIT_CAP_MS = 30000                 # a long poll never holds a worker longer
LATEST_TIMESTAMP = -1                         # ListOffsets' special timestamps (Kafka's)
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3


# ---- isolation: the one place that decides how far a reader may see --------------------

def _upper_bound(log, isolation_level: int) -> int:
    """The exclusive offset a reader at `isolation_level` may read up to."""
    if isolation_level == common_pb2.READ_COMMITTED:
        return log.last_stable_offset
    return log.high_watermark


def _response_budget_bytes(request: broker_pb2.FetchRequest) -> int:
    """What a Fetch answer may carry: its max_bytes (Kafka's default when unset), within
    one gRPC message."""
    return min(request.max_bytes if request.max_bytes > 0 else FETCH_MAX_BYTES_DEFAULT, FETCH_RESPONSE_BYTES_MAX)


class ReadHandlers:
    """Fetch and ListOffsets; see the module doc."""

    # ---- Fetch -------------------------------------------------------------------------------

    @gated
    def Fetch(self, request: broker_pb2.FetchRequest, context) -> broker_pb2.FetchResponse:
        if self._quotas is None or request.is_replica:
            return self._fetch(request, context)
        who, go_on = self._quotas.hold(CONSUMER_BYTE_RATE, context)
        if not go_on:      # not held (see ClientQuotas.hold): an empty answer, as a throttled fetch's
            return broker_pb2.FetchResponse(throttle_time_ms=self._quotas.owed_ms(CONSUMER_BYTE_RATE, who))
        window_bytes = self._quotas.fetch_bytes_max(who)
        if window_bytes is not None and (request.max_bytes or FETCH_MAX_BYTES_DEFAULT) > window_bytes:
            # Kafka's rule: no fetch carries more than a quota window allows, or it would be
            # refused (answered empty) again and again.
            request = broker_pb2.FetchRequest.FromString(request.SerializeToString())
            request.max_bytes = window_bytes
        response = self._fetch(request, context)
        read = sum(len(p.records) for p in response.partitions)
        # Kafka's rule: a fetch over the quota is answered without its records (a read changes
        # nothing, the consumer asks again after the throttle), and they are not counted. But
        # one batch larger than a whole window (a fetch returns at least one) would be refused
        # for good: that one goes out, and its throttle pays it back.
        whole_window = window_bytes is not None and read > window_bytes
        throttle_ms = self._quotas.charge(CONSUMER_BYTE_RATE, who, read, refund_if_throttled=not whole_window)
        if throttle_ms > 0:
            if not whole_window:
                for partition in response.partitions:
                    partition.records = b""
            response.throttle_time_ms = throttle_ms
        return response

    def _fetch(self, request: broker_pb2.FetchRequest, context) -> broker_pb2.FetchResponse:
        max_wait_ms = min(max(request.max_wait_ms, 0), self._fetch_max_wait_cap_ms)
        deadline_s = time.monotonic() + max_wait_ms / 1000.0
        if self._authorizer is not None:
            denied = self._fetch_denied(request)
            if denied:
                # Kafka answers the partitions it may not read and still reads the others;
                # a fetch with a refusal in it does not wait (an error answers at once).
                results, _, _ = self._read_all(request, denied=denied)
                return broker_pb2.FetchResponse(partitions=results)
        if request.is_replica and request.HasField("session_epoch") and self._replicas is not None:
            return self._fetch_in_session(request, context, max_wait_ms, deadline_s)
        return self._fetch_full(request, context, max_wait_ms, deadline_s)

    def _fetch_full(self, request: broker_pb2.FetchRequest, context, max_wait_ms: int,
                    deadline_s: float) -> broker_pb2.FetchResponse:
        """Every partition the request lists, read, then re-read until min_bytes or the
        deadline (long poll); the request has passed its authorization."""
        results, bytes_read, has_error = self._read_all(request)
        if bytes_read >= request.min_bytes or max_wait_ms == 0 or has_error or not results:
            return broker_pb2.FetchResponse(partitions=results)

        keys = {TopicPartition(p.topic, p.partition) for p in request.partitions}
        waiter = self._purgatory.watch(keys)
        if waiter is None:  # the purgatory is full or closing: answer with what there is
            return broker_pb2.FetchResponse(partitions=results)
        context.add_callback(waiter.cancel)  # a client that gives up frees its worker
        isolation = request.isolation_level
        replica = request.is_replica
        try:
            seen = self._read_positions(results, isolation, replica=replica)
            while True:
                # Registered before this check, so an append after it wakes the waiter.
                if self._read_positions(results, isolation, refresh=True, replica=replica) == seen:
                    remaining_s = deadline_s - time.monotonic()
                    if remaining_s <= 0:
                        break
                    woken = waiter.wait(remaining_s)
                    if waiter.cancelled or not woken:
                        break
                waiter.clear()
                results, bytes_read, has_error = self._read_all(request, replica_reported=True)
                if bytes_read >= request.min_bytes or has_error:
                    break
                seen = self._read_positions(results, isolation, replica=replica)
        finally:
            self._purgatory.unwatch(waiter)
        if (not (bytes_read >= request.min_bytes or has_error)
                and self._read_positions(results, isolation, refresh=True, replica=replica) != seen):
            # Ended by the deadline or shutdown just as a partition moved: give the freshest
            # view. Nothing moved (the usual timeout): the last read is that view already.
            results, _, _ = self._read_all(request, replica_reported=True)
        return broker_pb2.FetchResponse(partitions=results)

    # ---- a follower's fetch session (KIP-227, broker/fetch_sessions.py) --------------------------

    def _fetch_in_session(self, request: broker_pb2.FetchRequest, context, max_wait_ms: int,
                          deadline_s: float) -> broker_pb2.FetchResponse:
        """A follower's Fetch with a session epoch: a full one that opens (or closes) its
        session, or an incremental one answered with only what is new. Long poll as `_fetch`:
        an incremental fetch with no records to give waits for an append to any partition of
        the session."""
        epoch = request.session_epoch
        sessions = self._fetch_sessions
        if epoch == FINAL_EPOCH or epoch == INITIAL_EPOCH:
            return self._fetch_opening_session(request, context, max_wait_ms, deadline_s)
        if self._authorizer is not None and not self._cluster_allows(Operation.CLUSTER_ACTION):
            # An incremental Fetch may list nothing, so `_fetch_denied` (per partition listed)
            # cannot see it: the session ends, and the follower's full fetch is refused
            # partition by partition as any follower's is.
            sessions.close(request.session_id)
            return broker_pb2.FetchResponse(
                error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                error_message=self._denial(Operation.CLUSTER_ACTION, "the cluster (a follower fetch)"))
        try:
            session = sessions.resume(request.session_id, epoch, request.replica_id)
        except EosError as exc:
            return broker_pb2.FetchResponse(error_code=exc.code, error_message=str(exc))
        listed = session.apply(request.partitions, request.forgotten)
        every_s = report_interval_s(self._replicas.replica_lag_time_max_ms)
        report_all = session.report_all_due(time.monotonic(), every_s)
        errors = self._report_session(request, session, list(session.partitions) if report_all else listed)
        # The periodic report of every partition also reads every partition once: what
        # notifies nothing (a log start moved by retention) is told within the interval.
        results, told = self._wait_for_session_news(request, context, session, errors, max_wait_ms, deadline_s,
                                                    None if report_all else listed)
        for told_partition, result in told:
            told_partition.told(result.high_watermark, result.log_start_offset)
        return broker_pb2.FetchResponse(partitions=results, session_id=session.session_id)

    def _fetch_opening_session(self, request: broker_pb2.FetchRequest, context, max_wait_ms: int,
                               deadline_s: float) -> broker_pb2.FetchResponse:
        """A session's full Fetch: epoch 0 opens a session holding what it lists (the answer
        carries its id, and what each partition was told), epoch -1 closes one."""
        sessions = self._fetch_sessions
        if request.session_epoch == FINAL_EPOCH:
            sessions.close(request.session_id)
            return self._fetch_full(request, context, max_wait_ms, deadline_s)
        session = sessions.open(request.replica_id, request.partitions)
        response = self._fetch_full(request, context, max_wait_ms, deadline_s)
        for result in response.partitions:
            held = session.partitions.get((result.topic, result.partition))
            if held is not None and result.error_code == ErrorCode.NONE:
                held.told(result.high_watermark, result.log_start_offset)
        response.session_id = session.session_id
        return response

    def _wait_for_session_news(self, request: broker_pb2.FetchRequest, context, session, errors: dict,
                               max_wait_ms: int, deadline_s: float, listed):
        """(results, told) of an incremental Fetch: at once when there are `errors` or no
        wait; else the long poll, woken by an append to any partition of the session, until
        records come, the deadline passes, or the session is replaced. `listed`: the keys
        this Fetch listed, or None to read every partition of the session; otherwise a read
        looks at those, the ones notified since the session's last read, and its pending
        ones (`_read_session`)."""
        budget_bytes = _response_budget_bytes(request)
        if errors or max_wait_ms == 0:
            results, told, _ = self._read_session(request, session, errors, budget_bytes)
            return results, told
        sessions = self._fetch_sessions
        waiter, fresh = self._session_waiter(session)
        if waiter is None:
            results, told, _ = self._read_session(request, session, errors, budget_bytes)
            return results, told
        rpc_ended = threading.Event()

        def end_wait() -> None:       # a follower that gave up frees its worker
            rpc_ended.set()
            waiter.wake()
        context.add_callback(end_wait)
        # Cleared before the first read: appends since the session's last Fetch are in that
        # read, and an append after it wakes the wait below. A waiter registered just now
        # saw nothing before: that first read looks at everything.
        waiter.clear()
        first_keys = None if fresh or listed is None else set(listed)      # None: all
        while True:
            touched = self._purgatory.take_touched(waiter)
            keys = None if first_keys is None else first_keys.union(touched, session.pending)
            first_keys = set()    # later reads: what was notified since, and what is pending
            # The follower's offsets stay as it sent them, only the logs move.
            results, told, bytes_read = self._read_session(request, session, errors, budget_bytes, keys)
            if bytes_read >= request.min_bytes or errors or not sessions.is_current(session):
                return results, told
            remaining_s = deadline_s - time.monotonic()
            if (remaining_s <= 0 or not waiter.wait(remaining_s) or waiter.cancelled
                    or rpc_ended.is_set()):
                return results, told
            waiter.clear()

    def _session_waiter(self, session):
        """(waiter, registered just now): the session's purgatory waiter, registered under
        its partitions for as long as the session lives (broker/purgatory.py), tracking the
        keys notified, and moved when they change; (None, False) when the purgatory is full
        or closing, or the session is empty (answer without waiting). Dropped with the
        session (`_drop_session_waiter`)."""
        with session.waiter_lock:
            if session.dropped:
                return None, False
            waiter = session.waiter
            if waiter is not None and session.watched_version == session.keys_version:
                return (None, False) if waiter.cancelled else (waiter, False)
            version = session.keys_version
            # (topic, partition) keys: equal to, and hashed as, the TopicPartition appends notify
            if waiter is None:
                waiter = self._purgatory.watch(session.partitions, tracking=True)
            elif not self._purgatory.rewatch(waiter, session.partitions):
                waiter = None
            session.waiter, session.watched_version = waiter, version
            return waiter, waiter is not None

    def _drop_session_waiter(self, session) -> None:
        """A session was replaced or closed: its waiter leaves the purgatory, and a Fetch still
        waiting on it returns."""
        with session.waiter_lock:
            waiter, session.waiter = session.waiter, None
            session.dropped = True
        if waiter is not None:
            self._purgatory.unwatch(waiter)
            waiter.cancel()

    def _report_session(self, request: broker_pb2.FetchRequest, session, keys) -> dict:
        """Report the follower's fetch offset of each partition of `keys` to the replica
        manager, as a full fetch reports every partition it lists: it moves the high
        watermark, keeps the follower caught up, lets it join the ISR, and refuses a
        partition this broker no longer leads or a stale leader epoch. Each report also
        notes the partition's log in the session. Returns {key: error FetchedPartition}
        for those refused.

        Which keys: those the Fetch listed (their offsets moved); every partition of the
        session once per `report_interval_s` (an idle partition the follower never lists
        again stays caught up, and joins the ISR when the high watermark reaches it); and, in
        `_read_session`, any partition about to be answered that this Fetch has not reported
        yet -- so records never go out for a partition whose leadership and leader epoch this
        Fetch did not check (as in a full fetch, the check is not repeated after a wake-up)."""
        errors = {}
        replicas = self._replicas
        partitions = session.partitions
        for key in keys:
            held = partitions.get(key)
            if held is None:
                continue
            try:
                held.log = partition_log = self._log_for(*key)
                replicas.on_replica_fetch(request.replica_id, key[0], key[1], held.fetch_offset,
                                          held.current_leader_epoch if held.has_leader_epoch else None,
                                          partition_log, held.log_start_offset)
            except Exception as exc:
                code, message = error_code_and_message(exc)
                self._log_partition_error("Fetch", key[0], key[1], exc)
                held.forget_told()
                held.log = None
                errors[key] = broker_pb2.FetchedPartition(
                    topic=key[0], partition=key[1], error_code=code, error_message=message,
                    high_watermark=-1, last_stable_offset=-1, log_start_offset=-1)
            else:
                held.reported_at = request.session_epoch
        return errors

    def _read_session(self, request: broker_pb2.FetchRequest, session, errors: dict, budget_bytes: int,
                      keys=None):
        """(results, [(session partition, result) to note as told once answered], bytes read):
        the session's partitions with something new -- records past the fetch offset, or a
        high watermark or log start offset the follower was not told -- plus `errors`. A
        partition not reported in this Fetch is reported before it is read (see
        `_report_session`); one it refuses is answered with the error. `keys`: look at
        those of the session's partitions only (None: all). One with records left unsent
        (the response's size ran out) or refused stays in `session.pending`, looked at again
        by the next read."""
        results = list(errors.values())
        told = []
        bytes_read = 0
        partitions = session.partitions
        pending = session.pending
        if keys is None:
            pending.clear()
            examined = partitions.items()
        else:
            examined = [(key, partitions[key]) for key in keys if key in partitions]
            pending.difference_update(keys)
        for key, held in examined:
            partition_log = held.log
            if key in errors:
                pending.add(key)
                continue
            if (partition_log is not None and partition_log.log_end_offset <= held.fetch_offset
                    and partition_log.high_watermark == held.sent_high_watermark
                    and partition_log.log_start_offset == held.sent_log_start_offset):
                continue      # nothing new: not in the answer
            if held.reported_at != request.session_epoch or partition_log is None:
                if not self._fetch_sessions.is_current(session):
                    break     # replaced while this Fetch waited: its offsets are old news
                refused = self._report_session(request, session, (key,))
                if refused:
                    errors.update(refused)
                    results.append(refused[key])
                    pending.add(key)
                    continue
                partition_log = held.log
            fp = broker_pb2.FetchPartition(
                topic=key[0], partition=key[1], fetch_offset=held.fetch_offset,
                partition_max_bytes=held.partition_max_bytes, has_leader_epoch=held.has_leader_epoch,
                current_leader_epoch=held.current_leader_epoch)
            result = self._read_partition(fp, common_pb2.READ_UNCOMMITTED, budget_bytes - bytes_read,
                                          min_one_batch=bytes_read == 0, request=request, replica_reported=True)
            if result.error_code == ErrorCode.NONE:
                told.append((held, result))
                if not result.records and partition_log.log_end_offset > held.fetch_offset:
                    pending.add(key)      # records the size left out: the next read sends them
            else:
                held.forget_told()
                pending.add(key)
            bytes_read += len(result.records)
            results.append(result)
        return results, told, bytes_read

    def _fetch_denied(self, request: broker_pb2.FetchRequest) -> dict[str, str]:
        """{topic: why} for the topics this fetch may not read: READ on the topic for a
        consumer; for a follower (is_replica), CLUSTER_ACTION on the cluster, refused for
        every partition as Kafka does."""
        if request.is_replica:
            if self._cluster_allows(Operation.CLUSTER_ACTION):
                return {}
            why = self._denial(Operation.CLUSTER_ACTION, "the cluster (a follower fetch)")
            return {fp.topic: why for fp in request.partitions}
        return {fp.topic: self._denial(Operation.READ, f"topic {fp.topic!r}")
                for fp in request.partitions if self._topic_denied(Operation.READ, fp.topic)}

    def _read_positions(self, results, isolation: int, refresh: bool = False, replica: bool = False) -> tuple:
        """The upper bound of each fetched partition: what the last read saw, or (refresh)
        what the logs say now. A change means there may be more to read. A follower reads up
        to the log end, so its bound is the log end offset."""
        if replica:
            positions = []
            for r in results:
                partition_log = self._log_manager.get_log(r.topic, r.partition)
                positions.append(-1 if partition_log is None else partition_log.log_end_offset)
            return tuple(positions)
        if not refresh:
            if isolation == common_pb2.READ_COMMITTED:
                return tuple(r.last_stable_offset for r in results)
            return tuple(r.high_watermark for r in results)
        positions = []
        for r in results:
            partition_log = self._log_manager.get_log(r.topic, r.partition)
            positions.append(-1 if partition_log is None else _upper_bound(partition_log, isolation))
        return tuple(positions)

    def _read_all(self, request: broker_pb2.FetchRequest, replica_reported: bool = False,
                  denied: dict[str, str] | None = None):
        """One pass over the requested partitions: (results, bytes read, any error).
        A follower's fetch offsets are its log ends: the first pass reports them to the
        replica manager (`replica_reported` skips that on the re-reads of a long poll).
        The topics in `denied` are answered TOPIC_AUTHORIZATION_FAILED, unread."""
        isolation = request.isolation_level
        budget_bytes = _response_budget_bytes(request)
        results = []
        bytes_read = 0
        has_error = False
        for fp in request.partitions:
            if denied and fp.topic in denied:
                has_error = True
                results.append(broker_pb2.FetchedPartition(
                    topic=fp.topic, partition=fp.partition, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    error_message=denied[fp.topic], high_watermark=-1, last_stable_offset=-1, log_start_offset=-1))
                continue
            result = self._read_partition(fp, isolation, budget_bytes - bytes_read,
                                          min_one_batch=bytes_read == 0, request=request,
                                          replica_reported=replica_reported)
            bytes_read += len(result.records)
            has_error = has_error or result.error_code != ErrorCode.NONE
            results.append(result)
        return results, bytes_read, has_error

    def _read_partition(self, fp: broker_pb2.FetchPartition, isolation: int, budget_bytes: int,
                        *, min_one_batch: bool, request: broker_pb2.FetchRequest | None = None,
                        replica_reported: bool = False) -> broker_pb2.FetchedPartition:
        partition_log = None
        replica = request is not None and request.is_replica
        try:
            replicas = self._replicas
            current_epoch = fp.current_leader_epoch if fp.has_leader_epoch else None
            if replicas is not None and not replica:
                replicas.check_leader(fp.topic, fp.partition, current_epoch)
            partition_log = self._log_for(fp.topic, fp.partition)
            if replica:
                if replicas is None:
                    raise EosError("this broker is not part of a cluster: it has no followers",
                                   ErrorCode.NOT_LEADER_OR_FOLLOWER)
                if not replica_reported:
                    replicas.on_replica_fetch(request.replica_id, fp.topic, fp.partition, fp.fetch_offset,
                                              current_epoch, partition_log,
                                              fp.log_start_offset if fp.HasField("log_start_offset") else None)
                allowed = replicas.replica_fetch_allowance(request.replica_id, fp.topic, fp.partition, budget_bytes)
                result = self._read_for_follower(fp, partition_log, allowed, min_one_batch and allowed > 0)
                if len(result.records) > allowed:     # a whole first batch past a throttle's grant
                    replicas.charge_replica_fetch(request.replica_id, fp.topic, fp.partition,
                                                  len(result.records) - allowed)
                return result
            partition_max_bytes = (fp.partition_max_bytes if fp.partition_max_bytes > 0
                                   else PARTITION_FETCH_MAX_BYTES_DEFAULT)
            # One snapshot bounds the read and gives the offsets answered: the log stops at
            # that snapshot's end -- its high watermark on one node, where every write moves
            # both together -- and, under read_committed, at its LSO, listing the aborted
            # transactions of what it returns. (A bound read from the log beforehand would
            # come from an older snapshot than the records and offsets.)
            data = partition_log.read(
                fp.fetch_offset, max(0, min(partition_max_bytes, budget_bytes)),
                min_one_batch=min_one_batch, isolation_committed=isolation == common_pb2.READ_COMMITTED)
        except Exception as exc:
            code, message = error_code_and_message(exc)
            self._log_partition_error("Fetch", fp.topic, fp.partition, exc)
            result = broker_pb2.FetchedPartition(
                topic=fp.topic, partition=fp.partition, error_code=code, error_message=message,
                high_watermark=-1, last_stable_offset=-1, log_start_offset=-1)
            if not replica:
                self.add_leader_hints((result,))
            if partition_log is not None:
                # the client resets its position from these on OFFSET_OUT_OF_RANGE
                try:
                    result.high_watermark = partition_log.high_watermark
                    result.last_stable_offset = partition_log.last_stable_offset
                    result.log_start_offset = partition_log.log_start_offset
                except Exception:  # the error above is the one to report
                    pass
            return result
        if self.traffic is not None and data.records:
            self.traffic.fetched(fp.topic, len(data.records), offsets_spanned(data.records, data.first_offset))
        return broker_pb2.FetchedPartition(
            topic=fp.topic, partition=fp.partition, error_code=ErrorCode.NONE,
            high_watermark=data.high_watermark, last_stable_offset=data.last_stable_offset,
            log_start_offset=data.log_start_offset, records=data.records,
            aborted_transactions=[
                broker_pb2.AbortedTransaction(producer_id=aborted.producer_id, first_offset=aborted.first_offset)
                for aborted in data.aborted_transactions])

    @staticmethod
    def _read_for_follower(fp: broker_pb2.FetchPartition, partition_log, budget_bytes: int,
                           min_one_batch: bool) -> broker_pb2.FetchedPartition:
        """A follower reads up to the log end, not the high watermark, and learns the HW."""
        partition_max_bytes = fp.partition_max_bytes if fp.partition_max_bytes > 0 else PARTITION_FETCH_MAX_BYTES_DEFAULT
        high_watermark = partition_log.high_watermark
        data = partition_log.read(fp.fetch_offset, max(0, min(partition_max_bytes, budget_bytes)),
                                  max_offset_exclusive=partition_log.log_end_offset, min_one_batch=min_one_batch)
        return broker_pb2.FetchedPartition(
            topic=fp.topic, partition=fp.partition, error_code=ErrorCode.NONE, high_watermark=high_watermark,
            last_stable_offset=partition_log.last_stable_offset, log_start_offset=data.log_start_offset,
            records=data.records)

    # ---- ListOffsets -------------------------------------------------------------------------

    @gated
    def ListOffsets(self, request: broker_pb2.ListOffsetsRequest, context) -> broker_pb2.ListOffsetsResponse:
        if self._authorizer is not None:
            return broker_pb2.ListOffsetsResponse(partitions=[
                broker_pb2.ListedOffset(topic=p.topic, partition=p.partition,
                                        error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                        error_message=self._denial(Operation.DESCRIBE, f"topic {p.topic!r}"),
                                        timestamp=-1, offset=-1)
                if self._topic_denied(Operation.DESCRIBE, p.topic) else self._list_offset(p, request.isolation_level)
                for p in request.partitions])
        return broker_pb2.ListOffsetsResponse(partitions=[
            self._list_offset(p, request.isolation_level) for p in request.partitions])

    def _list_offset(self, p: broker_pb2.ListOffsetsPartition, isolation: int) -> broker_pb2.ListedOffset:
        try:
            if self._replicas is not None:
                self._replicas.check_leader(p.topic, p.partition)
            partition_log = self._log_for(p.topic, p.partition)
            lagging = (None if self._replicas is None
                       else self._replicas.lagging_high_watermark(p.topic, p.partition, partition_log))
            timestamp_ms, offset = self._find_offset(partition_log, p.timestamp, isolation, lagging)
        except Exception as exc:
            code, message = error_code_and_message(exc)
            self._log_partition_error("ListOffsets", p.topic, p.partition, exc)
            return broker_pb2.ListedOffset(topic=p.topic, partition=p.partition, error_code=code,
                                           error_message=message, timestamp=-1, offset=-1)
        return broker_pb2.ListedOffset(topic=p.topic, partition=p.partition,
                                       error_code=ErrorCode.NONE, timestamp=timestamp_ms, offset=offset)

    @staticmethod
    def _find_offset(partition_log, timestamp_ms: int, isolation: int, lagging: str | None = None) -> tuple[int, int]:
        """(timestamp, offset) answering one ListOffsets query; (-1, -1) when none matches.
        `lagging` (ReplicaManager.lagging_high_watermark) says why a new leader cannot answer
        yet: as Kafka's Partition.fetchOffsetForTimestamp, "latest", and a lookup whose match
        is not below what a reader may see, are then OFFSET_NOT_AVAILABLE (retriable)."""
        committed = isolation == common_pb2.READ_COMMITTED
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return -1, partition_log.log_start_offset
        if lagging is not None and timestamp_ms == LATEST_TIMESTAMP:
            raise OffsetNotAvailableError(lagging)
        if timestamp_ms == LATEST_TIMESTAMP:
            # Kafka answers consumers with the high watermark, and with the LSO under
            # read_committed (where such a consumer starts so it skips nothing committed).
            return -1, partition_log.latest_offset(isolation_committed=committed)
        upper = _upper_bound(partition_log, isolation)
        if timestamp_ms == MAX_TIMESTAMP:
            found = _max_timestamp(partition_log)
        elif timestamp_ms < 0:
            raise InvalidRequestError(
                f"timestamp {timestamp_ms} is neither a time nor one of the sentinels "
                f"-1 (latest), -2 (earliest), -3 (max timestamp)")
        else:
            found = partition_log.offset_for_timestamp(timestamp_ms, isolation_committed=committed)
        if found is None or found[0] >= upper:
            # Kafka's rule: the first match past what this reader may see is no answer, not
            # a reason to look for an earlier one -- unless that is only a new leader's lag.
            if lagging is not None:
                raise OffsetNotAvailableError(lagging)
            return -1, -1
        offset, found_timestamp_ms = found
        return found_timestamp_ms, offset


def _max_timestamp(partition_log) -> tuple[int, int] | None:
    """(offset, timestamp) of the earliest record carrying the largest timestamp (KIP-734,
    as fixed by KAFKA-16310), or None for an empty log. Each segment knows its maximum; the
    lookup by that timestamp finds the record."""
    max_timestamp_ms = max((segment.max_timestamp_ms for segment in partition_log.segments), default=-1)
    if max_timestamp_ms < 0:
        return None
    return partition_log.offset_for_timestamp(max_timestamp_ms)

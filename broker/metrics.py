"""A broker's Prometheus metrics: what it holds, what it did, and how long its requests took.

Theory of operation
-------------------
Only this module imports prometheus_client. Each piece of the broker keeps its own counts
as plain integers, owned where the event happens: the Broker service its bytes and records
per topic (broker/traffic.py) and its storage errors, the replica manager its ISR shrinks
and expands, the controller its elections, the group coordinator its rebalances, the
transaction coordinator its completed transactions, the cleaner its passes. State is read
where it lives: offsets and sizes from the logs, ISR from the replica manager, transaction
and group states from the coordinators. A scrape calls `BrokerStateCollector.collect()`,
which reads both through the `BrokerServer` and yields metric families; nothing is pushed
and nothing is kept twice, so a broker that is never scraped pays only for its counters.

The one thing measured per call is a request's rate, errors and latency
(`RequestMetricsInterceptor`), and only when `metrics.port` is set: a broker without an
endpoint installs no interceptor. A call's `error` label is the first Kafka error code in
its response (the response's own `error_code`, or the first of its partitions' or topics'
that is not NONE), else NONE; a call that fails at the gRPC level is labelled GRPC_<status>.
A stream counts each response message as a request, timed from the request message it
answers.

Names follow Kafka's JMX metrics where one exists (docs/operations.md maps them), as a JMX
exporter would print them but with the `eos_` prefix: requests under `eos_network_`,
broker-wide counts under `eos_server_`, logs under `eos_log_`, the controller under
`eos_controller_`, coordinators under `eos_group_coordinator_` and
`eos_transaction_coordinator_`, and the process's CPU, memory and open files as
prometheus_client's standard `process_*`.

Each broker has its own registry (several brokers can live in one test process) and serves
it on `metrics.port` over HTTP (`MetricsEndpoint`), at `/metrics`.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Iterator

import grpc
from prometheus_client import (CollectorRegistry, Counter, Histogram, ProcessCollector, disable_created_metrics,
                               start_http_server)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from google.protobuf.descriptor import FieldDescriptor

from eos.errors import ErrorCode

if TYPE_CHECKING:   # the server owns this module's objects; nothing here imports it at run time
    from broker.server import BrokerServer

log = logging.getLogger("eos.broker.metrics")

# Loopback calls take 0.2 ms to a few ms; long polls and parked group requests up to 30 s.
REQUEST_SECONDS_BUCKETS = (0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                           2.5, 5.0, 10.0, 30.0)
# How long a scrape waits for the group coordinator's lock: a replay of __consumer_offsets
# holds it for its whole length, and a scrape must answer during a slow start.
COORDINATOR_WAIT_S = 0.2
_UNCOUNTED_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
_TXN_STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort",
               "Dead", "PrepareEpochFence")
_GROUP_STATES = ("Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead")


# ---- per-call metrics --------------------------------------------------------------------------

_ERROR_FIELDS: dict[str, tuple[bool, tuple[tuple[str, bool], ...]]] = {}


def _error_fields(descriptor) -> tuple[bool, tuple[tuple[str, bool], ...]]:
    """(has its own error_code, (name, repeated) of the message fields that may hold one),
    worked out once per message type."""
    found = _ERROR_FIELDS.get(descriptor.full_name)
    if found is None:
        nested = tuple((field.name, field.is_repeated) for field in descriptor.fields
                       if field.type == FieldDescriptor.TYPE_MESSAGE and _holds_error(field.message_type, 2))
        found = _ERROR_FIELDS[descriptor.full_name] = ("error_code" in descriptor.fields_by_name, nested)
    return found


def _holds_error(descriptor, depth: int) -> bool:
    if "error_code" in descriptor.fields_by_name:
        return True
    return depth > 0 and any(field.type == FieldDescriptor.TYPE_MESSAGE and _holds_error(field.message_type, depth - 1)
                             for field in descriptor.fields)


def first_error_code(message) -> int:
    """The first error code that is not NONE in `message` or its nested results, else 0."""
    own, nested = _error_fields(message.DESCRIPTOR)
    if own and message.error_code:
        return message.error_code
    for name, repeated in nested:
        for item in (getattr(message, name) if repeated else (getattr(message, name),)):
            code = first_error_code(item)
            if code:
                return code
    return 0


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"UNKNOWN_{code}"


class RequestMetricsInterceptor(grpc.ServerInterceptor):
    """Kafka's RequestsPerSec, ErrorsPerSec and TotalTimeMs per request type (see the module
    doc). The children of each label set are looked up once and kept."""

    def __init__(self, registry: CollectorRegistry):
        self._requests = Counter("eos_network_requests", "Requests answered, by request type and first error code "
                                 "(Kafka's RequestsPerSec and ErrorsPerSec)", ["request", "error"], registry=registry)
        self._seconds = Histogram("eos_network_request_duration_seconds", "Time from a request's arrival to its "
                                  "answer (Kafka's TotalTimeMs)", ["request"], buckets=REQUEST_SECONDS_BUCKETS,
                                  registry=registry)
        self._counted: dict[tuple[str, str], Counter] = {}
        self._timed: dict[str, Histogram] = {}

    def _record(self, request: str, error: str, seconds: float) -> None:
        counter = self._counted.get((request, error))
        if counter is None:
            counter = self._counted[(request, error)] = self._requests.labels(request, error)
        counter.inc()
        timer = self._timed.get(request)
        if timer is None:
            timer = self._timed[request] = self._seconds.labels(request)
        timer.observe(seconds)

    def _outcome(self, request: str, started_s: float, response) -> None:
        self._record(request, _error_name(first_error_code(response)) if response is not None else "NONE",
                     time.perf_counter() - started_s)

    def _failed(self, request: str, started_s: float, context) -> None:
        code = context.code() if hasattr(context, "code") else None
        status = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
        self._record(request, f"GRPC_{status}", time.perf_counter() - started_s)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        if handler_call_details.method.startswith(_UNCOUNTED_SERVICES):
            return handler          # probes and tools, not the broker's requests
        request = handler_call_details.method.rsplit("/", 1)[-1]
        if handler.unary_unary:
            return handler._replace(unary_unary=self._unary(request, handler.unary_unary))
        if handler.stream_unary:
            return handler._replace(stream_unary=self._unary(request, handler.stream_unary))
        if handler.unary_stream:
            return handler._replace(unary_stream=self._stream(request, handler.unary_stream, False))
        return handler._replace(stream_stream=self._stream(request, handler.stream_stream, True))

    def _unary(self, request: str, behaviour):
        def call(request_or_iterator, context):
            started_s = time.perf_counter()
            try:
                response = behaviour(request_or_iterator, context)
            except BaseException:
                self._failed(request, started_s, context)
                raise
            self._outcome(request, started_s, response)
            return response
        return call

    def _stream(self, request: str, behaviour, streamed_requests: bool):
        def call(request_or_iterator, context):
            # a stream of requests: each answer is timed from the request message it answers
            # (produce streams answer in order); one request: from the call's start
            arrivals: list[float] = [time.perf_counter()]
            if streamed_requests:
                arrivals.clear()

                def timed(requests):
                    for message in requests:
                        arrivals.append(time.perf_counter())
                        yield message
                request_or_iterator = timed(request_or_iterator)
            try:
                for response in behaviour(request_or_iterator, context):
                    started_s = arrivals.pop(0) if arrivals else time.perf_counter()
                    self._outcome(request, started_s, response)
                    yield response
            except BaseException:
                self._failed(request, arrivals[0] if arrivals else time.perf_counter(), context)
                raise
        return call


# ---- what the broker holds -------------------------------------------------------------------------

class BrokerStateCollector:
    """The broker's state and counts as metric families, read at each scrape (module doc)."""

    def __init__(self, server: "BrokerServer"):
        self._server = server

    def collect(self) -> Iterator:
        server = self._server
        yield _gauge("eos_server_ready", "1 once the broker has recovered its logs and loaded its coordinators "
                     "(its gRPC health is SERVING)", 1 if server.ready else 0)
        if server.log_manager is None:
            return      # still starting: the logs are not open yet
        for section in (self._topics, self._logs, self._replication, self._controller, self._purgatories,
                        self._transactions, self._groups, self._cleaner):
            try:
                families = list(section(server))
            except Exception:
                # one section that cannot be read (a piece stopping under the scrape) must not
                # cost the scrape every other metric
                log.exception("metrics: %s could not be read", section.__name__)
                continue
            yield from families

    @staticmethod
    def _topics(server) -> Iterator:
        servicer = server.servicer
        if servicer is None:
            return
        families = [CounterMetricFamily(name, text, labels=["topic"]) for name, text in (
            ("eos_server_bytes_in", "Bytes of records appended by producers (Kafka's BytesInPerSec)"),
            ("eos_server_messages_in", "Records appended by producers (Kafka's MessagesInPerSec)"),
            ("eos_server_bytes_out", "Bytes of records sent to consumers (Kafka's BytesOutPerSec)"),
            ("eos_server_messages_out", "Records sent to consumers, counted by offsets"))]
        registry = server.registry
        for topic, counts in sorted(servicer.traffic.snapshot().items()):
            if topic not in registry:        # deleted: its series go (it would stay to the restart)
                servicer.traffic.forget(topic)
                continue
            for family, value in zip(families, counts):
                family.add_metric([topic], value)
        yield from families
        errors = CounterMetricFamily("eos_log_storage_errors", "Requests answered KAFKA_STORAGE_ERROR, by partition "
                                     "and log dir (each logged at ERROR once)", labels=["topic", "partition", "log_dir"])
        for (topic, partition, log_dir), count in sorted(servicer.storage_errors.snapshot().items()):
            errors.add_metric([topic, str(partition), log_dir], count)
        yield errors

    @staticmethod
    def _logs(server) -> Iterator:
        names = (("eos_log_log_start_offset", "The first offset of the log (Kafka's LogStartOffset)"),
                 ("eos_log_log_end_offset", "The offset the next record gets (Kafka's LogEndOffset)"),
                 ("eos_log_high_watermark", "The high watermark: replicated to the ISR, readable"),
                 ("eos_log_last_stable_offset", "The last stable offset: what read_committed consumers may read"),
                 ("eos_log_size_bytes", "Bytes of the partition's segments on disk (Kafka's Size)"),
                 ("eos_log_segments", "Segments of the partition (Kafka's NumLogSegments)"))
        families = [GaugeMetricFamily(name, text, labels=["topic", "partition"]) for name, text in names]
        for partition_log in server.log_manager.all_logs():
            labels = [partition_log.topic, str(partition_log.partition)]
            try:
                values = (partition_log.log_start_offset, partition_log.log_end_offset,
                          partition_log.high_watermark, partition_log.last_stable_offset,
                          partition_log.size_bytes, len(partition_log.segments))
            except Exception:     # closed or deleted while the scrape ran: it is simply not shown
                continue
            for family, value in zip(families, values):
                family.add_metric(labels, value)
        yield from families
        yield _gauge("eos_log_offline_log_directories", "Log dirs that failed (Kafka's OfflineLogDirectoryCount)",
                     len(server.log_manager.offline_dirs))

    @staticmethod
    def _replication(server) -> Iterator:
        cluster = server.cluster
        replicas = cluster.replicas if cluster is not None else None
        if replicas is None:
            # one broker: every partition is led here and its ISR is itself, so a topic asking
            # min.insync.replicas > 1 is under it (its acks=all produces are refused)
            logs = server.log_manager.all_logs()
            hosted = led = len(logs)
            under_min_isr = sum(1 for partition_log in logs if partition_log.config.min_insync_replicas > 1)
            under_replicated = shrinks = expands = 0
        else:
            led_states = replicas.led_replication()
            hosted = len(led_states) + len(replicas.followed_partitions())
            led = len(led_states)
            under_replicated = sum(1 for _, replica_ids, isr in led_states if len(isr) < len(replica_ids))
            under_min_isr = 0
            for tp, _, isr in led_states:
                partition_log = server.log_manager.get_log(*tp)
                if partition_log is not None and len(isr) < partition_log.config.min_insync_replicas:
                    under_min_isr += 1
            shrinks, expands = replicas.isr_shrinks, replicas.isr_expands
        yield _gauge("eos_server_partitions", "Partitions with a replica on this broker (Kafka's PartitionCount)", hosted)
        yield _gauge("eos_server_leader_partitions", "Partitions this broker leads (Kafka's LeaderCount)", led)
        yield _gauge("eos_server_under_replicated_partitions", "Led partitions whose ISR is smaller than their "
                     "replicas (Kafka's UnderReplicatedPartitions)", under_replicated)
        yield _gauge("eos_server_under_min_isr_partitions", "Led partitions whose ISR is below min.insync.replicas "
                     "(Kafka's UnderMinIsrPartitionCount)", under_min_isr)
        yield _counter("eos_server_isr_shrinks", "ISR shrinks this broker wrote as leader (Kafka's IsrShrinksPerSec)",
                       shrinks)
        yield _counter("eos_server_isr_expands", "ISR expansions this broker wrote as leader (Kafka's "
                       "IsrExpandsPerSec)", expands)

    @staticmethod
    def _controller(server) -> Iterator:
        cluster = server.cluster
        if cluster is None:
            # a broker alone is its own controller; partitions on a failed log dir have no leader
            active, epoch, elections, unclean = True, 0, 0, 0
            offline = server.log_manager.offline_partition_count()
        else:
            controller = cluster.controller
            active = controller is not None and controller.is_active
            epoch = cluster.metadata.snapshot.controller_epoch
            offline = controller.offline_partitions if controller is not None else 0
            elections = controller.leader_elections_total if controller is not None else 0
            unclean = controller.unclean_leader_elections_total if controller is not None else 0
        yield _gauge("eos_controller_active_controller", "1 on the active controller (Kafka's ActiveControllerCount)",
                     1 if active else 0)
        yield _gauge("eos_controller_epoch", "The controller epoch this broker knows", epoch)
        yield _gauge("eos_controller_offline_partitions", "Partitions without a leader, on the active controller "
                     "(Kafka's OfflinePartitionsCount)", offline if active else 0)
        yield _counter("eos_controller_leader_elections", "Leaders elected by this broker as controller, clean or "
                       "unclean (Kafka's LeaderElectionRateAndTimeMs)", elections)
        yield _counter("eos_controller_unclean_leader_elections", "Unclean leader elections by this broker as "
                       "controller (Kafka's UncleanLeaderElectionsPerSec)", unclean)

    @staticmethod
    def _purgatories(server) -> Iterator:
        family = GaugeMetricFamily("eos_server_purgatory_size", "Requests waiting, by kind (Kafka's "
                                   "DelayedOperationPurgatory PurgatorySize)", labels=["delayed_operation"])
        family.add_metric(["Fetch"], server.fetch_waiter_count)
        cluster = server.cluster
        family.add_metric(["Produce"], cluster.replicas.produce_waiters
                          if cluster is not None and cluster.replicas is not None else 0)
        groups = server.group_coordinator
        family.add_metric(["Rebalance"], groups.parked_request_count() if groups is not None else 0)
        txn = server.txn_coordinator
        family.add_metric(["TxnConcurrent"], txn.concurrent_waiter_count if txn is not None else 0)
        yield family

    @staticmethod
    def _transactions(server) -> Iterator:
        txn = server.txn_coordinator
        states = dict.fromkeys(_TXN_STATES, 0)
        committed = aborted = 0
        if txn is not None and txn.ready:
            for metadata in txn.list():
                states[metadata.state.display_name] = states.get(metadata.state.display_name, 0) + 1
            committed, aborted = txn.transactions_committed, txn.transactions_aborted
        family = GaugeMetricFamily("eos_transaction_coordinator_transactions", "Transactional ids this broker "
                                   "coordinates, by state (Ongoing: an open transaction)", labels=["state"])
        for state, count in states.items():
            family.add_metric([state], count)
        yield family
        yield _gauge("eos_transaction_coordinator_markers_pending", "Transactions decided whose markers are not "
                     "all written (PrepareCommit and PrepareAbort)", states["PrepareCommit"] + states["PrepareAbort"])
        completed = CounterMetricFamily("eos_transaction_coordinator_completed", "Transactions this broker "
                                        "completed as coordinator, by result", labels=["result"])
        completed.add_metric(["commit"], committed)
        completed.add_metric(["abort"], aborted)
        yield completed

    @staticmethod
    def _groups(server) -> Iterator:
        coordinator = server.group_coordinator
        states = dict.fromkeys(_GROUP_STATES, 0)
        lag = GaugeMetricFamily("eos_group_consumer_lag", "Records between a group's committed offset and the last "
                                "stable offset, for the partitions this broker leads",
                                labels=["group", "topic", "partition"])
        cluster = server.cluster
        # a follower's LSO trails its leader's: lag is shown only where this broker leads
        led = None if cluster is None or cluster.replicas is None else set(cluster.replicas.led_partitions())
        snapshot = None if coordinator is None else coordinator.metrics_snapshot(COORDINATOR_WAIT_S)
        listings, committed, rebalances = snapshot if snapshot is not None else ([], {}, 0)
        for listing in listings:
            states[listing.state] = states.get(listing.state, 0) + 1
            for fetched in committed.get(listing.group_id, ()):
                partition_log = server.log_manager.get_log(fetched.topic, fetched.partition)
                if fetched.offset < 0 or partition_log is None or (
                        led is not None and (fetched.topic, fetched.partition) not in led):
                    continue
                lag.add_metric([listing.group_id, fetched.topic, str(fetched.partition)],
                               max(0, partition_log.last_stable_offset - fetched.offset))
        family = GaugeMetricFamily("eos_group_coordinator_groups", "Consumer groups this broker coordinates, by state "
                                   "(Kafka's NumGroups*); none while its offsets load", labels=["state"])
        for state, count in states.items():
            family.add_metric([state], count)
        yield family
        if snapshot is not None:        # a counter must not drop to 0 while a partition loads
            yield _counter("eos_group_coordinator_rebalances", "Rebalances completed with a new generation of "
                           "members", rebalances)
        yield lag

    @staticmethod
    def _cleaner(server) -> Iterator:
        cleaner = server.log_cleaner
        passes = cleaner.passes if cleaner is not None else 0
        last = cleaner.last_stats if cleaner is not None else None
        yield _counter("eos_log_cleaner_passes", "Cleaning passes finished", passes)
        yield _counter("eos_log_cleaner_bytes_read", "Bytes the cleaner read",
                       cleaner.bytes_read_total if cleaner is not None else 0)
        yield _counter("eos_log_cleaner_bytes_written", "Bytes the cleaner wrote",
                       cleaner.bytes_written_total if cleaner is not None else 0)
        yield _gauge("eos_log_cleaner_recopy_percent", "Written as a share of read in the last pass (Kafka's "
                     "cleaner-recopy-percent)", 100.0 * last.bytes_written / last.bytes_read
                     if last is not None and last.bytes_read else 0.0)
        yield _gauge("eos_log_cleaner_last_pass_seconds", "How long the last pass took (Kafka's max-clean-time-secs "
                     "over one pass)", last.seconds if last is not None else 0.0)


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)


def _counter(name: str, text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, text, value=value)


# ---- the registry and its endpoint -------------------------------------------------------------------

class BrokerMetrics:
    """One broker's registry: its state collector, its process's CPU, memory and open files,
    and the request interceptor; served over HTTP by `start(host, port)`."""

    def __init__(self, server: "BrokerServer"):
        # a `_created` series beside every counter and histogram child doubles the request
        # series for nothing a dashboard reads. prometheus_client's switch is process-wide: an
        # application embedding a broker loses its own `_created` series too (docs/operations.md)
        disable_created_metrics()
        self.registry = CollectorRegistry()
        self.registry.register(BrokerStateCollector(server))
        ProcessCollector(registry=self.registry)
        self.interceptor = RequestMetricsInterceptor(self.registry)
        self._http = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self.url = ""

    def start(self, host: str, port: int) -> int:
        """Serve /metrics on host:port (0: a free port); returns the bound port."""
        self._http, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = self._http.server_port
        from broker.metadata.types import format_host_port
        self.url = f"http://{format_host_port(host, self.port)}/metrics"
        log.info("metrics on %s", self.url)
        return self.port

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._thread.join(5.0)      # its serve_forever has returned after shutdown()
            self._http = None

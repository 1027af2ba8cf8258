"""The clients' Prometheus metrics: the producer's, the consumer's and the Spark sink's.

Theory of operation
-------------------
A client asked for metrics (`metrics=True`: prometheus_client's default REGISTRY; or a
`prometheus_client.CollectorRegistry` of the application's) reports them through that
registry, labelled with its `client_id`, so several clients share one registry. The metric
families of a kind of client are created once per registry, here (prometheus_client refuses
a name twice in one registry): `_SPECS` is the table of every family -- name, type, help,
buckets, extra labels -- and `_families` makes the families of one kind in one registry on
first use and keeps them while the registry lives.

A client holds one `ClientMetrics` (`ProducerMetrics`, `ConsumerMetrics`, `SinkMetrics`):
its families' children for its client_id, bound once, as attributes named after the family
without the kind's prefix (`metrics.record_send.inc(n)`). The client counts per batch, per
request or per poll -- never per record -- and a client without metrics holds None and pays
one `is not None` test at those points. Gauges of state the client keeps anyway (buffer
memory, a partition's lag) are read by a function when the registry is collected, so they
cost nothing between scrapes.

`close()` removes the client's children (Kafka removes a closed client's metrics too), so
clients that come and go do not grow the registry without bound; clients that share a
client_id share its children, which go when the last of them closes. prometheus_client is
imported only when metrics are asked for.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable, NamedTuple

# Request and commit round trips: from a local broker's sub-millisecond answer up to
# request.timeout.ms (30 s by default).
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Encoded batches: from one small record to send_batch()'s 1 MiB batches and beyond.
BATCH_BUCKETS_BYTES = (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)
# A micro-batch's write (a Spark job) or commit (offsets + EndTxn).
MICRO_BATCH_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class MetricSpec(NamedTuple):
    name: str               # without the kind's prefix; the attribute of ClientMetrics
    type: str               # "counter", "gauge" or "histogram"
    help: str
    buckets: tuple = ()     # histograms
    labels: tuple = ()      # beyond client_id: children made by the client, not bound here


# Named after Kafka's client metrics where one exists (in the help, in brackets).
_SPECS: dict[str, tuple[MetricSpec, ...]] = {
    "producer": (
        MetricSpec("batch_size_bytes", "histogram",
                   "Encoded size of each record batch built [batch-size-avg/max]", BATCH_BUCKETS_BYTES),
        MetricSpec("record_send", "counter", "Records acknowledged by the broker [record-send-total]"),
        MetricSpec("record_retry", "counter",
                   "Records of batches queued again after a retriable error [record-retry-total]"),
        MetricSpec("record_error", "counter", "Records whose delivery failed for good [record-error-total]"),
        MetricSpec("request_latency_seconds", "histogram",
                   "Produce requests, sent to answered (its count: requests answered) "
                   "[request-latency-avg/max, request-total]", LATENCY_BUCKETS_S),
        MetricSpec("buffer_total_bytes", "gauge", "buffer.memory [buffer-total-bytes]"),
        MetricSpec("buffer_available_bytes", "gauge",
                   "buffer.memory not reserved by batches waiting or in flight [buffer-available-bytes]"),
        MetricSpec("backlog_bytes", "gauge",
                   "Full batches the sender has not taken yet; new batches wait while they hold "
                   "buffer.memory / 16 (eos's pacing, no Kafka counterpart)"),
        MetricSpec("txn_commit_seconds", "histogram",
                   "commit_transaction() calls that committed, flush included (its count: transactions "
                   "committed) [txn-commit-time-ns-total]", LATENCY_BUCKETS_S),
        MetricSpec("txn_abort_seconds", "histogram",
                   "abort_transaction() calls that aborted (its count: transactions aborted) "
                   "[txn-abort-time-ns-total]", LATENCY_BUCKETS_S),
    ),
    "consumer": (
        MetricSpec("records_consumed", "counter", "Records handed out by poll() [records-consumed-total]"),
        MetricSpec("bytes_consumed", "counter",
                   "Bytes of record batches received by Fetch [bytes-consumed-total]"),
        MetricSpec("fetch_latency_seconds", "histogram",
                   "Fetch requests, sent to answered, the broker's wait for data included (its count: "
                   "fetches answered) [fetch-latency-avg/max, fetch-total]", LATENCY_BUCKETS_S),
        MetricSpec("records_lag", "gauge",
                   "Records between the position and the end the last Fetch saw: the high watermark, "
                   "the last stable offset under read_committed [records-lag]",
                   labels=("topic", "partition")),
        MetricSpec("commit_latency_seconds", "histogram",
                   "OffsetCommit requests answered by the group coordinator [commit-latency-avg/max, "
                   "commit-total]", LATENCY_BUCKETS_S),
    ),
    "sink": (
        MetricSpec("batch_write_seconds", "histogram",
                   "A micro-batch's write: the Spark job of the executors' producers", MICRO_BATCH_BUCKETS_S),
        MetricSpec("batch_commit_seconds", "histogram",
                   "A micro-batch's commit on the driver: input offsets and the decision (EndTxn)",
                   MICRO_BATCH_BUCKETS_S),
        MetricSpec("records_written", "counter", "Records of committed micro-batches"),
        MetricSpec("batches_committed", "counter", "Micro-batches written and committed"),
        MetricSpec("batches_skipped", "counter",
                   "Micro-batches replayed after a restart and recognised as committed before: nothing written"),
    ),
}

_lock = threading.Lock()
# registry -> kind -> _Families; weak, so an application's registry and its families go together.
_by_registry: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def metrics_setting(name: str, value):
    """The config converter of `metrics`: False (off), or the registry to report through --
    True means prometheus_client's default REGISTRY; "true"/"false" as in a config file."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        value = value.strip().lower() == "true"
    if value is None or value is False:
        return False
    import prometheus_client

    if value is True:
        return prometheus_client.REGISTRY
    if isinstance(value, prometheus_client.CollectorRegistry):
        return value
    raise ValueError(f"{name} must be true, false or a prometheus_client CollectorRegistry, got {value!r}")


class _Families:
    """The metric families of one kind of client in one registry, and the clients using them."""

    def __init__(self, kind: str, registry):
        import prometheus_client

        makers = {"counter": prometheus_client.Counter, "gauge": prometheus_client.Gauge,
                  "histogram": prometheus_client.Histogram}
        self.metrics = {}
        for spec in _SPECS[kind]:
            extra = {"buckets": spec.buckets} if spec.buckets else {}
            self.metrics[spec.name] = makers[spec.type](
                f"eos_{kind}_{spec.name}", spec.help, ("client_id",) + spec.labels, registry=registry, **extra)
        self.clients_by_id: dict[str, int] = {}   # client_id -> open clients using it


def _families(kind: str, registry) -> _Families:
    with _lock:
        kinds = _by_registry.get(registry)
        if kinds is None:
            kinds = _by_registry[registry] = {}
        families = kinds.get(kind)
        if families is None:
            families = kinds[kind] = _Families(kind, registry)
        return families


class ClientMetrics:
    """One client's children of its kind's families (see the module doc)."""

    KIND = ""

    def __init__(self, registry, client_id: str):
        self.client_id = client_id
        self._families = _families(self.KIND, registry)
        self._labelled: dict[str, set[tuple]] = {}      # family -> extra label values in use
        with _lock:
            users = self._families.clients_by_id
            users[client_id] = users.get(client_id, 0) + 1
        for spec in _SPECS[self.KIND]:
            if not spec.labels:
                setattr(self, spec.name, self._families.metrics[spec.name].labels(client_id))
        self._closed = False

    def _child(self, name: str, *labels):
        """The child of family `name` for this client and the given extra label values."""
        self._labelled.setdefault(name, set()).add(labels)
        return self._families.metrics[name].labels(self.client_id, *labels)

    def _remove(self, name: str, *labels) -> None:
        in_use = self._labelled.get(name)
        if in_use is not None and labels in in_use:
            in_use.discard(labels)
            try:
                self._families.metrics[name].remove(self.client_id, *labels)
            except KeyError:
                pass      # another client of this client_id removed it already

    def close(self) -> None:
        """Remove this client's children from the registry (those of its client_id once the
        last client using it closes). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for name, in_use in self._labelled.items():
            for labels in list(in_use):
                self._remove(name, *labels)
        with _lock:
            users = self._families.clients_by_id
            users[self.client_id] -= 1
            last = users[self.client_id] == 0
            if last:
                del users[self.client_id]
        if last:
            for spec in _SPECS[self.KIND]:
                if not spec.labels:
                    self._families.metrics[spec.name].remove(self.client_id)


class ProducerMetrics(ClientMetrics):
    KIND = "producer"

    def __init__(self, registry, client_id: str, *, buffer_total_bytes: int,
                 buffer_available_bytes: Callable[[], float], backlog_bytes: Callable[[], float]):
        super().__init__(registry, client_id)
        self.buffer_total_bytes.set(buffer_total_bytes)
        self.buffer_available_bytes.set_function(buffer_available_bytes)
        self.backlog_bytes.set_function(backlog_bytes)


class ConsumerMetrics(ClientMetrics):
    KIND = "consumer"

    def watch_lag(self, topic: str, partition: int, lag: Callable[[], float]) -> None:
        """Report a partition's lag: `lag()` is read at each collection."""
        self._child("records_lag", topic, str(partition)).set_function(lag)

    def unwatch_lag(self, topic: str, partition: int) -> None:
        self._remove("records_lag", topic, str(partition))


class SinkMetrics(ClientMetrics):
    KIND = "sink"


def metric_names(kind: str) -> list[str]:
    """The full names of a kind's families, as the registry exposes them (counters with _total)."""
    return [f"eos_{kind}_{spec.name}" + ("_total" if spec.type == "counter" else "") for spec in _SPECS[kind]]


__all__ = ["ClientMetrics", "ConsumerMetrics", "ProducerMetrics", "SinkMetrics", "metric_names",
           "metrics_setting"]

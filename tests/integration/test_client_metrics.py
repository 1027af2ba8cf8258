"""Client metrics (issue 17): producers and a consumer given a fresh CollectorRegistry run a
small workload against an in-process broker; the registry's exposition is parsed with
prometheus_client's parser and every figure is checked against what the workload did."""
from __future__ import annotations

import time

import pytest

import eos
from eos.client_metrics import metric_names
from eos.types import TopicPartition
from tests.metrics import registry_samples
from tests.waits import wait_for

WAIT_S = 30
VALUE_BYTES = 100


scrape = registry_samples      # (name, sorted label pairs) -> value, by prometheus_client's parser


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted((k, str(v)) for k, v in labels.items())))]


def client_ids(samples: dict) -> set[str]:
    return {dict(labels)["client_id"] for _, labels in samples if "client_id" in dict(labels)}


def families_of(samples: dict) -> set[str]:
    """The family names present (a histogram's samples end in _bucket/_count/_sum, a
    counter's in _total; the _created gauges are left out)."""
    names = set()
    for name, _ in samples:
        for suffix in ("_bucket", "_count", "_sum"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        if not name.endswith("_created"):
            names.add(name)
    return names


@pytest.fixture
def registry():
    from prometheus_client import CollectorRegistry

    return CollectorRegistry()


@pytest.fixture
def admin(inprocess_broker):
    with eos.Admin(inprocess_broker.address) as admin:
        yield admin


def test_two_producers_count_what_they_sent_in_one_registry(inprocess_broker, admin, registry):
    admin.create_topic("pm", partitions=2)
    buffer_bytes = 8 * 1024 * 1024
    named = eos.Producer(inprocess_broker.address, metrics=registry, client_id="p-named", linger_ms=1,
                         buffer_memory=buffer_bytes)
    unnamed = eos.Producer(inprocess_broker.address, config={"metrics": registry})
    try:
        futures = [named.send("pm", b"v" * VALUE_BYTES) for _ in range(300)]
        bulk = named.send_batch("pm", [b"w" * VALUE_BYTES] * 2000)
        unnamed.send("pm", b"x", partition=1).result(WAIT_S)
        for future in futures:
            future.result(WAIT_S)
        assert len(bulk.result(WAIT_S)) == 2000
        named.flush(WAIT_S)
        samples = scrape(registry)
        assert families_of(samples) >= set(metric_names("producer"))
        [unnamed_id] = client_ids(samples) - {"p-named"}
        assert unnamed_id.startswith("producer-")          # Kafka's default client.id
        assert value(samples, "eos_producer_record_send_total", client_id="p-named") == 2300
        assert value(samples, "eos_producer_record_send_total", client_id=unnamed_id) == 1
        assert value(samples, "eos_producer_record_error_total", client_id="p-named") == 0
        assert value(samples, "eos_producer_record_retry_total", client_id="p-named") == 0
        batches = value(samples, "eos_producer_batch_size_bytes_count", client_id="p-named")
        assert 2 <= batches <= 2300
        # every value byte is in some batch, with headers and record overhead besides
        assert value(samples, "eos_producer_batch_size_bytes_sum", client_id="p-named") > 2300 * VALUE_BYTES
        assert 1 <= value(samples, "eos_producer_request_latency_seconds_count", client_id="p-named") <= batches
        assert value(samples, "eos_producer_request_latency_seconds_sum", client_id="p-named") >= 0
        assert value(samples, "eos_producer_buffer_total_bytes", client_id="p-named") == buffer_bytes
        # everything is delivered: no batch holds buffer memory
        assert value(samples, "eos_producer_buffer_available_bytes", client_id="p-named") == buffer_bytes
        assert value(samples, "eos_producer_backlog_bytes", client_id="p-named") == 0
        assert value(samples, "eos_producer_txn_commit_seconds_count", client_id="p-named") == 0
    finally:
        named.close()
    # a closed client's metrics go (Kafka's too); the other's stay
    assert client_ids(scrape(registry)) == {unnamed_id}
    unnamed.close()
    assert client_ids(scrape(registry)) == set()


def test_a_transactional_producer_counts_commits_and_aborts(inprocess_broker, admin, registry):
    admin.create_topic("tm", partitions=1)
    producer = eos.Producer(inprocess_broker.address, transactional_id="tm-id", metrics=registry)
    try:
        producer.init_transactions(WAIT_S)
        for outcome in ("commit", "abort", "commit"):
            producer.begin_transaction()
            producer.send_batch("tm", [b"t" * VALUE_BYTES] * 50).result(WAIT_S)
            getattr(producer, f"{outcome}_transaction")(WAIT_S)
        samples = scrape(registry)
        client_id = "producer-tm-id"                       # Kafka's default for a transactional.id
        assert value(samples, "eos_producer_txn_commit_seconds_count", client_id=client_id) == 2
        assert value(samples, "eos_producer_txn_abort_seconds_count", client_id=client_id) == 1
        assert value(samples, "eos_producer_txn_commit_seconds_sum", client_id=client_id) > 0
        # the aborted transaction's records were written (then aborted): sent, not failed
        assert value(samples, "eos_producer_record_send_total", client_id=client_id) == 150
        assert value(samples, "eos_producer_record_error_total", client_id=client_id) == 0
    finally:
        producer.close()


def test_a_consumer_counts_records_bytes_fetches_lag_and_commits(inprocess_broker, admin, registry):
    admin.create_topic("cm", partitions=2)
    with eos.Producer(inprocess_broker.address) as producer:
        for partition, count in ((0, 120), (1, 80)):
            producer.send_batch("cm", [b"c" * VALUE_BYTES] * count, partition=partition).result(WAIT_S)
    consumer = eos.Consumer(inprocess_broker.address, group_id="cm-group", client_id="c-1",
                            auto_offset_reset="earliest", fetch_max_wait_ms=50, metrics=registry)
    tps = [TopicPartition("cm", 0), TopicPartition("cm", 1)]
    try:
        consumer.assign(tps)
        assert poll_until(consumer, 200) == 200
        samples = scrape(registry)
        assert families_of(samples) >= set(metric_names("consumer"))
        assert value(samples, "eos_consumer_records_consumed_total", client_id="c-1") == 200
        assert value(samples, "eos_consumer_bytes_consumed_total", client_id="c-1") > 200 * VALUE_BYTES
        assert value(samples, "eos_consumer_fetch_latency_seconds_count", client_id="c-1") >= 1
        for partition in (0, 1):
            assert value(samples, "eos_consumer_records_lag", client_id="c-1", topic="cm", partition=partition) == 0
        with eos.Producer(inprocess_broker.address) as producer:
            producer.send_batch("cm", [b"d" * VALUE_BYTES] * 10, partition=0).result(WAIT_S)
        # One record of the ten: the Fetch that brought them saw the high watermark 130,
        # and the position is 121.
        assert poll_until(consumer, 1, max_records=1) == 1
        assert value(scrape(registry), "eos_consumer_records_lag", client_id="c-1", topic="cm", partition=0) == 9
        consumer.commit()
        assert value(scrape(registry), "eos_consumer_commit_latency_seconds_count", client_id="c-1") == 1
        consumer.commit_async()                            # timed when its answer arrives
        wait_for(lambda: value(scrape(registry), "eos_consumer_commit_latency_seconds_count",
                               client_id="c-1") == 2, "the asynchronous commit's answer")
        consumer.assign(tps[1:])                            # a partition no longer assigned has no lag
        assert ("eos_consumer_records_lag", (("client_id", "c-1"), ("partition", "0"), ("topic", "cm"))) \
            not in scrape(registry)
    finally:
        consumer.close()
    assert client_ids(scrape(registry)) == set()


def poll_until(consumer, expected: int, max_records: int | None = None) -> int:
    got = 0
    deadline = time.monotonic() + WAIT_S
    while got < expected and time.monotonic() < deadline:
        got += len(consumer.poll(timeout_ms=200, max_records=max_records))
    return got


def test_the_metrics_setting_takes_a_registry_true_or_false():
    from prometheus_client import REGISTRY, CollectorRegistry

    from eos.client_metrics import metrics_setting

    mine = CollectorRegistry()
    assert metrics_setting("metrics", mine) is mine
    assert metrics_setting("metrics", True) is REGISTRY
    assert metrics_setting("metrics", "true") is REGISTRY
    assert metrics_setting("metrics", False) is False
    assert metrics_setting("metrics", "false") is False
    with pytest.raises(ValueError, match="metrics must be true, false or a prometheus_client CollectorRegistry"):
        metrics_setting("metrics", "yes please")
    with pytest.raises(ValueError, match="metrics"):
        eos.Producer("127.0.0.1:1", metrics=3)

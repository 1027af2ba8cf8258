"""Client configuration: Kafka names, underscores, validation, idempotence rules."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from consumer.consumer import CONSUMER_CONFIG
from eos import client_config, net
from producer.config import resolve_producer_config


def test_defaults_are_kafkas():
    values = resolve_producer_config(None, {})
    assert values["acks"] == -1
    assert values["enable.idempotence"] is True
    assert values["linger.ms"] == 5
    assert values["batch.size"] == 16384
    assert values["buffer.memory"] == 32 * 1024 * 1024
    assert values["retries"] == 2147483647
    assert values["delivery.timeout.ms"] == 120000
    assert values["max.in.flight.requests.per.connection"] == 5
    assert values["compression.type"] == 0


def test_kwargs_with_underscores_and_dict_of_kafka_names():
    values = resolve_producer_config({"linger.ms": 10, "batch.size": 100}, {"batch_size": 200})
    assert values["linger.ms"] == 10
    assert values["batch.size"] == 200    # keyword arguments win over the dict


def test_unknown_names_are_all_named():
    with pytest.raises(ValueError) as info:
        resolve_producer_config({"lingr.ms": 1}, {"bogus_option": 2})
    assert "lingr.ms" in str(info.value) and "bogus_option" in str(info.value)


@pytest.mark.parametrize("given,expected", [(0, 0), (1, 1), ("1", 1), ("all", -1), ("ALL", -1), (-1, -1)])
def test_acks_spellings(given, expected):
    assert resolve_producer_config(None, {"acks": given, "enable_idempotence": False})["acks"] == expected


@pytest.mark.parametrize("bad", [2, "two", None, True])
def test_bad_acks_are_refused(bad):
    with pytest.raises(ValueError, match="acks"):
        resolve_producer_config(None, {"acks": bad})


@pytest.mark.parametrize("name,codec", [("none", 0), ("gzip", 1), ("snappy", 2), ("lz4", 3), ("zstd", 4)])
def test_compression_names(name, codec):
    assert resolve_producer_config(None, {"compression_type": name})["compression.type"] == codec


def test_unknown_compression_is_refused():
    with pytest.raises(ValueError, match="compression.type"):
        resolve_producer_config(None, {"compression_type": "brotli"})


@pytest.mark.parametrize("conflict", [
    {"acks": 1}, {"acks": 0}, {"retries": 0}, {"max_in_flight_requests_per_connection": 6}])
def test_explicit_idempotence_with_a_conflict_is_an_error(conflict):
    with pytest.raises(ValueError, match="enable.idempotence"):
        resolve_producer_config(None, {"enable_idempotence": True, **conflict})


@pytest.mark.parametrize("conflict", [
    {"acks": 1}, {"acks": 0}, {"retries": 0}, {"max_in_flight_requests_per_connection": 6}])
def test_implicit_idempotence_yields_to_a_conflict(conflict):
    assert resolve_producer_config(None, conflict)["enable.idempotence"] is False


def test_transactional_id_needs_idempotence():
    with pytest.raises(ValueError, match="transactional.id"):
        resolve_producer_config(None, {"transactional_id": "x", "enable_idempotence": False})
    with pytest.raises(ValueError, match="enable.idempotence"):
        resolve_producer_config(None, {"transactional_id": "x", "acks": 1})


def test_delivery_timeout_must_cover_linger_and_request_timeout():
    with pytest.raises(ValueError, match="delivery.timeout.ms"):
        resolve_producer_config(None, {"delivery_timeout_ms": 1000, "request_timeout_ms": 1000, "linger_ms": 5})


@pytest.mark.parametrize("kwargs", [{"linger_ms": -1}, {"batch_size": "big"}, {"buffer_memory": 0},
                                    {"enable_idempotence": "maybe"}, {"linger_ms": 1.5},
                                    {"transaction_version": 3}, {"transaction_version": 0},
                                    {"transaction_version": True}])
def test_bad_values_name_the_setting(kwargs):
    name = next(iter(kwargs)).replace("_", ".")
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        resolve_producer_config(None, kwargs)


@pytest.mark.parametrize("kwargs", [{"transaction_timeout_ms": 2**31}, {"request_timeout_ms": 2**40},
                                    {"batch_size": 2**40}, {"delivery_timeout_ms": 10**10}])
def test_kafkas_int_settings_are_32_bit_and_refused_at_construction(kwargs):
    # Before, the value was taken and failed only at the first request, in a 32-bit protocol
    # field: the sender thread died and the next send() said the producer was closed.
    name = next(iter(kwargs)).replace("_", ".")
    with pytest.raises(ValueError, match=name.replace(".", r"\.") + " must be at most 2147483647"):
        resolve_producer_config(None, kwargs)
    assert resolve_producer_config(None, {"max_block_ms": 2**40})["max.block.ms"] == 2**40   # a LONG in Kafka


@pytest.mark.parametrize("name", ["session_timeout_ms", "max_poll_interval_ms", "fetch_max_wait_ms",
                                  "fetch_max_bytes"])
def test_the_consumers_int_settings_are_32_bit(name):
    with pytest.raises(ValueError, match="must be at most 2147483647"):
        client_config.resolve_config("consumer", CONSUMER_CONFIG, None, {name: 2**40})


def test_consumer_config_checks():
    values, explicit = client_config.resolve_config("consumer", CONSUMER_CONFIG, {"isolation.level": "read_committed"},
                                          {"auto_offset_reset": "earliest"})
    assert values["isolation.level"] == 1 and values["auto.offset.reset"] == "earliest"
    assert explicit == {"isolation.level", "auto.offset.reset"}
    with pytest.raises(ValueError, match="auto.offset.reset"):
        client_config.resolve_config("consumer", CONSUMER_CONFIG, None, {"auto_offset_reset": "middle"})
    with pytest.raises(ValueError, match="isolation.level"):
        client_config.resolve_config("consumer", CONSUMER_CONFIG, None, {"isolation_level": "serializable"})


def test_consumer_constructor_validation_needs_no_broker():
    from consumer import Consumer
    with pytest.raises(ValueError, match="enable.auto.commit"):
        Consumer("127.0.0.1:1", enable_auto_commit=True)
    with pytest.raises(ValueError, match="fetch_max_wayt_ms"):
        Consumer("127.0.0.1:1", fetch_max_wayt_ms=3)


@pytest.mark.parametrize("bootstrap,expected", [
    ("127.0.0.1:9092", ["127.0.0.1:9092"]),
    ("a:1, b:2", ["a:1", "b:2"]),
    (["h:10", "k:20"], ["h:10", "k:20"]),
    ("[::1]:9092", ["[::1]:9092"]),
])
def test_parse_bootstrap(bootstrap, expected):
    assert net.parse_bootstrap(bootstrap) == expected


@pytest.mark.parametrize("bad", ["localhost", "host:", ":9092", "h:0", "h:70000", "h:port", ""])
def test_bad_bootstrap_is_refused(bad):
    with pytest.raises(ValueError, match="bootstrap"):
        net.parse_bootstrap(bad)


@pytest.mark.parametrize("bootstrap,brokers,expected", [
    # nothing learned yet: the bootstrap list
    (["h:1"], {}, ["h:1"]),
    # a cluster: the bootstrap address, then the brokers it does not name, by node id
    (["h1:1"], {2: "h3:3", 0: "h1:1", 1: "h2:2"}, ["h1:1", "h2:2", "h3:3"]),
    # the same broker by a loopback alias is not asked twice
    (["localhost:9092"], {0: "127.0.0.1:9092", 1: "127.0.0.1:9093"}, ["localhost:9092", "127.0.0.1:9093"]),
    # one address in front of a cluster of one (a proxy): only that address
    (["proxy:7000"], {0: "broker:9092"}, ["proxy:7000"]),
])
def test_any_broker_addresses_add_the_brokers_metadata_named_to_the_bootstrap_list(bootstrap, brokers, expected):
    assert net.any_broker_addresses(bootstrap, brokers) == expected


def test_a_client_asks_the_next_known_broker_when_the_one_it_asked_fails():
    metadata = net.ClusterMetadata("h1:1")
    assert metadata.any_broker_address == "h1:1"
    metadata.next_any_broker()
    assert metadata.any_broker_address == "h1:1"      # nothing else known yet
    metadata.apply(SimpleNamespace(brokers=[SimpleNamespace(node_id=i, host=f"h{i + 1}", port=i + 1, socket_port=0)
                                            for i in range(3)], topics=[], controller_id=0, cluster_id="c"), [])
    seen = []
    for _ in range(4):
        seen.append(metadata.any_broker_address)
        metadata.next_any_broker()
    assert seen == ["h1:1", "h2:2", "h3:3", "h1:1"]
    metadata.close()


def test_backoff_grows_and_is_capped():
    import random
    backoff = net.Backoff(100, 1000, random.Random(1))
    delays = [backoff.delay_ms(n) for n in range(1, 10)]
    assert 80 <= delays[0] <= 120
    assert 160 <= delays[1] <= 240
    assert all(d <= 1200 for d in delays)
    assert delays[-1] >= 800


def test_public_names_resolve_lazily_from_eos():
    import eos
    import consumer
    import producer
    from eos.admin import Admin
    assert eos.Producer is producer.Producer
    assert eos.RecordMetadata is producer.RecordMetadata
    assert eos.Consumer is consumer.Consumer
    assert eos.Admin is Admin

"""What TLS costs eos and Kafka: produce and consume records/s over PLAINTEXT and SSL (or
mutual TLS) on one broker of each, in the same run.

    .venv/bin/python -m bench.tls [--records 200000] [--value-bytes 100] [--repeats 3] [--no-kafka]

Theory of operation
-------------------
One eos broker process (bench/eos_server.py) listens on a PLAINTEXT and an SSL listener at
once, with certificates made for the run (tests/certs.py: a throwaway CA, a server
certificate for 127.0.0.1, a client certificate); `--client-auth required` makes the SSL
listener mutual TLS. One Kafka broker (bench/kafka.py, the pinned 4.x jars, KRaft) gets
the same two listeners with the same PEM files (Kafka's PEM key and trust stores, KIP-651).
For each system and protocol, in turn and `--repeats` times, a fresh topic of one partition
is written by one producer (eos.Producer; confluent-kafka's librdkafka for Kafka: the bulk
path, batches of 1 MB, acks all, linger 5 ms) and read back whole by one consumer, with the
same client settings (`security.protocol`, `ssl.ca.location`, ... are the same names in
both). The rate is records over the wall time from the first send to the end of flush
(produce) and from assign to the last record (consume); the best of the repeats is reported,
and the median beside it. The figure that matters is each system's SSL rate as a share of
its own PLAINTEXT rate. Output: one JSON object on stdout (`--json-only` for it alone), then
a table.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from bench.eos_server import EosBroker
from bench.kafka import free_port
from bench.report import print_results, text_table


def _produce(eos, bootstrap: str, config: dict, topic: str, records: int, value: bytes) -> float:
    producer = eos.Producer(bootstrap, config={**config, "batch.size": 1048576, "linger.ms": 5})
    try:
        started = time.perf_counter()
        for _ in range(records):
            producer.send(topic, value=value)
        producer.flush()
        return records / (time.perf_counter() - started)
    finally:
        producer.close()


def _consume(eos, bootstrap: str, config: dict, topic: str, records: int) -> float:
    consumer = eos.Consumer(bootstrap, config={**config, "auto.offset.reset": "earliest",
                                               "max.poll.records": 100000, "fetch.max.bytes": 52428800,
                                               "max.partition.fetch.bytes": 16777216})
    try:
        started = time.perf_counter()
        consumer.assign([(topic, 0)])
        seen = 0
        deadline = time.monotonic() + 300
        while seen < records:
            if time.monotonic() > deadline:
                raise RuntimeError(f"read {seen} of {records} records of {topic} in 300 s")
            seen += len(consumer.poll(1.0))
        return records / (time.perf_counter() - started)
    finally:
        consumer.close()


def _kafka_produce(bootstrap: str, config: dict, topic: str, records: int, value: bytes) -> float:
    from confluent_kafka import Producer

    from bench.workloads.clients import kafka_producer_config
    from bench.workloads.produce import kafka_send_bulk
    producer = Producer(kafka_producer_config(bootstrap, acks="all", idempotent=True, linger_ms=5,
                                              **{"batch.size": 1048576, **config}))
    started = time.perf_counter()
    kafka_send_bulk(producer, topic, value, records, deadline=float("inf"))
    if producer.flush(300) != 0:
        raise RuntimeError(f"Kafka producer: records still unsent to {topic} after 300 s")
    return records / (time.perf_counter() - started)


def _kafka_consume(bootstrap: str, config: dict, topic: str, records: int) -> float:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}", "enable.auto.commit": False,
                         "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 16777216, **config})
    try:
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        seen = 0
        deadline = time.monotonic() + 300
        while seen < records:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kafka consumer read {seen} of {records} records of {topic} in 300 s")
            seen += sum(1 for m in consumer.consume(num_messages=100000, timeout=1.0) if m.error() is None)
        return records / (time.perf_counter() - started)
    finally:
        consumer.close()


class _Pki(NamedTuple):
    ca_path: Path
    server: object          # tests.certs.Issued
    client: object

    def client_config(self, client_auth: str) -> dict:
        config = {"security.protocol": "SSL", "ssl.ca.location": str(self.ca_path)}
        if client_auth == "required":
            config.update({"ssl.certificate.location": str(self.client.certificate_path),
                           "ssl.key.location": str(self.client.key_path)})
        return config


def _make_pki() -> _Pki:
    from tests.certs import CertificateAuthority

    directory = Path(tempfile.mkdtemp(prefix="eos-bench-tls-"))
    ca = CertificateAuthority("eos bench CA")
    return _Pki(ca.write_ca(directory / "ca.pem"), ca.issue_server(directory, "server"),
                ca.issue_client(directory, "client", {"CN": "bench"}))


def _measure(rounds, produce, consume, create, delete, check_alive, records: int, value: bytes, repeats: int) -> dict:
    """{protocol: rates} over `rounds` ({protocol name: (bootstrap, client config)})."""
    measured: dict = {}
    for repeat in range(repeats):
        for name, (bootstrap, config) in rounds.items():
            topic = f"tls-{name.split()[0].lower()}-{repeat}"
            create(topic)
            entry = measured.setdefault(name, {"produce": [], "consume": []})
            entry["produce"].append(produce(bootstrap, config, topic, records, value))
            entry["consume"].append(consume(bootstrap, config, topic, records))
            delete(topic)
            check_alive()
    for entry in measured.values():
        for kind in ("produce", "consume"):
            rates = entry.pop(kind)
            entry[f"{kind}_records_per_s_best"] = round(max(rates))
            entry[f"{kind}_records_per_s_median"] = round(statistics.median(rates))
    return measured


def _run_eos(pki: _Pki, records: int, value: bytes, repeats: int, client_auth: str, ssl_name: str) -> dict:
    import eos

    plaintext_port, ssl_port = free_port(), free_port()
    extra = ["--config", f"listeners=PLAINTEXT://127.0.0.1:{plaintext_port},SSL://127.0.0.1:{ssl_port}",
             "--config", f"ssl.certificate.location={pki.server.certificate_path}",
             "--config", f"ssl.key.location={pki.server.key_path}",
             "--config", f"ssl.ca.location={pki.ca_path}", "--config", f"ssl.client.auth={client_auth}"]
    rounds = {"PLAINTEXT": (f"127.0.0.1:{plaintext_port}", {}),
              ssl_name: (f"127.0.0.1:{ssl_port}", pki.client_config(client_auth))}
    with EosBroker(extra_args=tuple(extra)) as broker_process:
        with eos.Admin(rounds["PLAINTEXT"][0]) as admin:
            return _measure(rounds, lambda *a: _produce(eos, *a), lambda *a: _consume(eos, *a),
                            lambda t: admin.create_topic(t, partitions=1), lambda t: admin.delete_topics([t]),
                            broker_process.check_alive, records, value, repeats)


def _run_kafka(pki: _Pki, records: int, value: bytes, repeats: int, client_auth: str, ssl_name: str) -> dict:
    from confluent_kafka.admin import AdminClient

    from bench.kafka import KafkaBroker, KafkaSsl, resolve_pinned_kafka
    from bench.workloads.clients import kafka_create_topic

    ssl = KafkaSsl(pki.server.certificate_path, pki.server.key_path, pki.ca_path, client_auth)
    with KafkaBroker(resolve_pinned_kafka(), ssl=ssl) as kafka:
        rounds = {"PLAINTEXT": (kafka.bootstrap, {}), ssl_name: (kafka.ssl_bootstrap, pki.client_config(client_auth))}
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        return _measure(rounds, _kafka_produce, _kafka_consume, lambda t: kafka_create_topic(kafka.bootstrap, t),
                        lambda t: admin.delete_topics([t])[t].result(60), kafka.check_alive, records, value, repeats)


def run(records: int, value_bytes: int, repeats: int, client_auth: str, with_kafka: bool = True) -> dict:
    from bench.kafka import KafkaUnavailable

    pki = _make_pki()
    ssl_name = "SSL" if client_auth == "none" else "SSL (mutual TLS)"
    value = b"x" * value_bytes
    results: dict = {"records": records, "value_bytes": value_bytes, "repeats": repeats, "client_auth": client_auth,
                     "systems": {"eos": _run_eos(pki, records, value, repeats, client_auth, ssl_name)}}
    if with_kafka:
        try:
            results["systems"]["kafka"] = _run_kafka(pki, records, value, repeats, client_auth, ssl_name)
        except KafkaUnavailable as exc:
            results["kafka_unavailable"] = str(exc)
    for protocols in results["systems"].values():
        base = protocols["PLAINTEXT"]
        for entry in protocols.values():
            for kind in ("produce", "consume"):
                entry[f"{kind}_share_of_plaintext"] = round(
                    entry[f"{kind}_records_per_s_best"] / base[f"{kind}_records_per_s_best"], 3)
    return results


def _table(results: dict) -> str:
    rows = [("system", "protocol", "produce rec/s (best)", "(median)", "share", "consume rec/s (best)", "(median)",
             "share")]
    for system, protocols in results["systems"].items():
        for name, entry in protocols.items():
            rows.append((system, name, f"{entry['produce_records_per_s_best']:,}",
                         f"{entry['produce_records_per_s_median']:,}", f"{entry['produce_share_of_plaintext']:.0%}",
                         f"{entry['consume_records_per_s_best']:,}", f"{entry['consume_records_per_s_median']:,}",
                         f"{entry['consume_share_of_plaintext']:.0%}"))
    lines = text_table(rows)
    lines.append("share: the protocol's best rate as a share of the same system's PLAINTEXT rate")
    if "kafka_unavailable" in results:
        lines.append(f"Kafka not measured: {results['kafka_unavailable']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tls", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--client-auth", choices=["none", "required"], default="required",
                        help="the SSL listener's ssl.client.auth (required: mutual TLS)")
    parser.add_argument("--no-kafka", action="store_true", help="measure eos only")
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    results = run(args.records, args.value_bytes, args.repeats, args.client_auth, with_kafka=not args.no_kafka)
    print_results(results, _table(results), args.json_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What TLS costs eos: produce and consume records/s over PLAINTEXT, SSL and mutual TLS on
one broker.

    .venv/bin/python -m bench.tls [--records 200000] [--value-bytes 100] [--repeats 3]

Theory of operation
-------------------
One eos broker process (bench/eos_server.py) listens on a PLAINTEXT and an SSL listener at
once, with certificates made for the run (tests/certs.py: a throwaway CA, a server
certificate for 127.0.0.1, a client certificate); `--client-auth required` makes the SSL
listener mutual TLS. For each protocol, in turn and `--repeats` times, a fresh topic of
one partition is written by one `eos.Producer` (the bulk path: batches of batch.size, acks
all, linger 5 ms) and read back whole by one `eos.Consumer`. The rate is records over the
wall time from the first send to the end of flush (produce) and from assign to the last
record (consume); the best of the repeats is reported, as the other benchmarks do, and the
median beside it. Output: one JSON object on stdout (`--json-only` for it alone), then a
table. Kafka with SSL is not measured here (see docs/architecture.md, "Listeners, TLS and
principals").
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.eos_server import EosBroker
from bench.kafka import free_port


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


def run(records: int, value_bytes: int, repeats: int, client_auth: str) -> dict:
    import eos
    from tests.certs import CertificateAuthority

    pki = Path(tempfile.mkdtemp(prefix="eos-bench-tls-"))
    ca = CertificateAuthority("eos bench CA")
    ca_path = ca.write_ca(pki / "ca.pem")
    server = ca.issue_server(pki, "server")
    client = ca.issue_client(pki, "client", {"CN": "bench"})
    plaintext_port, ssl_port = free_port(), free_port()
    extra = ["--config", f"listeners=PLAINTEXT://127.0.0.1:{plaintext_port},SSL://127.0.0.1:{ssl_port}",
             "--config", f"ssl.certificate.location={server.certificate_path}",
             "--config", f"ssl.key.location={server.key_path}",
             "--config", f"ssl.ca.location={ca_path}", "--config", f"ssl.client.auth={client_auth}"]
    ssl_config = {"security.protocol": "SSL", "ssl.ca.location": str(ca_path)}
    if client_auth == "required":
        ssl_config.update({"ssl.certificate.location": str(client.certificate_path),
                           "ssl.key.location": str(client.key_path)})
    sides = {"PLAINTEXT": (f"127.0.0.1:{plaintext_port}", {}),
             "SSL" if client_auth == "none" else "SSL (mutual TLS)": (f"127.0.0.1:{ssl_port}", ssl_config)}
    value = b"x" * value_bytes
    results: dict = {"records": records, "value_bytes": value_bytes, "repeats": repeats, "protocols": {}}
    with EosBroker(extra_args=tuple(extra)) as broker_process:
        admin = eos.Admin(sides["PLAINTEXT"][0])
        try:
            for repeat in range(repeats):
                for name, (bootstrap, config) in sides.items():
                    topic = f"tls-{name.split()[0].lower()}-{repeat}"
                    admin.create_topic(topic, partitions=1)
                    produce_rate = _produce(eos, bootstrap, config, topic, records, value)
                    consume_rate = _consume(eos, bootstrap, config, topic, records)
                    entry = results["protocols"].setdefault(name, {"produce": [], "consume": []})
                    entry["produce"].append(produce_rate)
                    entry["consume"].append(consume_rate)
                    admin.delete_topics([topic])
                    broker_process.check_alive()
        finally:
            admin.close()
    for entry in results["protocols"].values():
        for kind in ("produce", "consume"):
            rates = entry.pop(kind)
            entry[f"{kind}_records_per_s_best"] = round(max(rates))
            entry[f"{kind}_records_per_s_median"] = round(statistics.median(rates))
    return results


def _table(results: dict) -> str:
    rows = [("protocol", "produce rec/s (best)", "produce (median)", "consume rec/s (best)", "consume (median)")]
    base = results["protocols"].get("PLAINTEXT")
    for name, entry in results["protocols"].items():
        rows.append((name, f"{entry['produce_records_per_s_best']:,}", f"{entry['produce_records_per_s_median']:,}",
                     f"{entry['consume_records_per_s_best']:,}", f"{entry['consume_records_per_s_median']:,}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]
    if base:
        for name, entry in results["protocols"].items():
            if name != "PLAINTEXT":
                lines.append(f"{name} vs PLAINTEXT: produce {entry['produce_records_per_s_best'] / base['produce_records_per_s_best']:.0%}, "
                             f"consume {entry['consume_records_per_s_best'] / base['consume_records_per_s_best']:.0%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tls", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--client-auth", choices=["none", "required"], default="required",
                        help="the SSL listener's ssl.client.auth (required: mutual TLS)")
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    results = run(args.records, args.value_bytes, args.repeats, args.client_auth)
    print(json.dumps(results, indent=2))
    if not args.json_only:
        print(_table(results), file=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())

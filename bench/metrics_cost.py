"""What the broker's Prometheus metrics cost: produce and consume records/s against a broker
without metrics and one with `metrics.port` set and scraped, in the same run.

    .venv/bin/python -m bench.metrics_cost [--records 200000] [--value-bytes 100] [--repeats 5]
                                           [--scrape-interval-s 1.0]

Theory of operation
-------------------
Two eos broker processes (bench/eos_server.py) run side by side: one as every test runs it
(no metrics.port: no request interceptor, no per-topic counting), one with metrics.port set
and a scraper reading its /metrics every `--scrape-interval-s` (1 s by default, 15 times
Prometheus's usual rate, so the scrape's own cost is in the figure too). In each of
`--repeats` rounds the two are measured in turn, alternating which goes first, each on a
fresh topic of one partition: one eos.Producer sends the records (the bench.tls loop:
send() per record, 1 MB batches, acks=all idempotent) and one eos.Consumer reads them back
whole. The best and the median of the rounds are reported; the figure that matters is the
metrics broker's rate as a share of the other's (the aim: above 0.97). Apache Kafka is not
run beside it: its JMX metrics cannot be turned off, so there is no "without" to compare.
Output: one JSON object on stdout (`--json-only` for it alone), then a table.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import urllib.request

from bench.eos_server import EosBroker
from bench.kafka import free_port
from bench.report import print_results, text_table
from bench.tls import _consume, _produce


class _Scraper(threading.Thread):
    """Reads /metrics every interval until stopped; counts scrapes and their bytes."""

    def __init__(self, url: str, interval_s: float):
        super().__init__(name="metrics-scraper", daemon=True)
        self._url, self._interval_s = url, interval_s
        self._stopping = threading.Event()
        self.scrapes = 0
        self.last_bytes = 0
        self.slowest_s = 0.0

    def run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            started = time.perf_counter()
            with urllib.request.urlopen(self._url, timeout=10) as response:
                self.last_bytes = len(response.read())
            self.slowest_s = max(self.slowest_s, time.perf_counter() - started)
            self.scrapes += 1

    def stop(self) -> None:
        self._stopping.set()
        self.join(15)


def run(records: int, value_bytes: int, repeats: int, scrape_interval_s: float) -> dict:
    import eos

    value = b"x" * value_bytes
    metrics_port = free_port()
    rates: dict[str, dict[str, list[float]]] = {name: {"produce": [], "consume": []}
                                                for name in ("without metrics", "with metrics")}
    with EosBroker() as plain, EosBroker(extra_args=("--config", f"metrics.port={metrics_port}")) as measured:
        scraper = _Scraper(f"http://127.0.0.1:{metrics_port}/metrics", scrape_interval_s)
        scraper.start()
        try:
            brokers = {"without metrics": plain, "with metrics": measured}
            for repeat in range(repeats):
                order = list(brokers) if repeat % 2 == 0 else list(reversed(brokers))
                for name in order:
                    broker = brokers[name]
                    topic = f"metrics-cost-{repeat}"
                    with eos.Admin(broker.bootstrap) as admin:
                        admin.create_topic(topic, partitions=1)
                    rates[name]["produce"].append(_produce(eos, broker.bootstrap, {}, topic, records, value))
                    rates[name]["consume"].append(_consume(eos, broker.bootstrap, {}, topic, records))
                    with eos.Admin(broker.bootstrap) as admin:
                        admin.delete_topics([topic])
                    broker.check_alive()
        finally:
            scraper.stop()
    results: dict = {"records": records, "value_bytes": value_bytes, "repeats": repeats,
                     "scrape_interval_s": scrape_interval_s, "scrapes": scraper.scrapes,
                     "scrape_bytes": scraper.last_bytes, "slowest_scrape_ms": round(scraper.slowest_s * 1000, 1),
                     "brokers": {}}
    for name, kinds in rates.items():
        results["brokers"][name] = {f"{kind}_records_per_s_{stat}": round(fn(samples))
                                    for kind, samples in kinds.items()
                                    for stat, fn in (("best", max), ("median", statistics.median))}
    base, with_metrics = results["brokers"]["without metrics"], results["brokers"]["with metrics"]
    results["share_of_without"] = {key: round(with_metrics[key] / base[key], 3) for key in base}
    return results


def _table(results: dict) -> str:
    rows = [("broker", "produce rec/s best", "median", "consume rec/s best", "median")]
    for name, entry in results["brokers"].items():
        rows.append((name, *(f"{entry[k]:,}" for k in ("produce_records_per_s_best", "produce_records_per_s_median",
                                                        "consume_records_per_s_best", "consume_records_per_s_median"))))
    share = results["share_of_without"]
    rows.append(("share", *(f"{share[k]:.1%}" for k in ("produce_records_per_s_best", "produce_records_per_s_median",
                                                        "consume_records_per_s_best", "consume_records_per_s_median"))))
    lines = text_table(rows)
    lines.append(f"({results['records']:,} records of {results['value_bytes']} B, {results['repeats']} rounds; "
                 f"{results['scrapes']} scrapes of {results['scrape_bytes']:,} B, slowest "
                 f"{results['slowest_scrape_ms']} ms)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.metrics_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scrape-interval-s", type=float, default=1.0)
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    results = run(args.records, args.value_bytes, args.repeats, args.scrape_interval_s)
    print_results(results, _table(results), args.json_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())

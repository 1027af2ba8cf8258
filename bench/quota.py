"""What a client quota does to a producer over it, and to one beside it that has none.

    .venv/bin/python -m bench.quota [--quota-mb 2] [--seconds 90] [--value-bytes 1000]

Theory of operation
-------------------
One eos broker process (bench/eos_server.py). First one producer with client.id "free"
sends as fast as it can, alone, for `--seconds` (its baseline). Then `producer_byte_rate`
is set to `--quota-mb` MB/s for client.id "limited", and "limited" and "free" send at the
same time, for the same time. Each producer is eos.Producer (acks=all, linger 5 ms) on its
own thread, counting the bytes of acknowledged records. A rate is taken over the run after
its first `quota.window.num` x window seconds (11 s by default), when Kafka's sampled rate
no longer allows the initial burst: what remains is the throttled rate. When the first
window's samples expire (at 11 s) the rate measured drops and a second, smaller burst
passes, as in Kafka; over 90 s it averages out, over 30 s it does not. Output: JSON on
stdout (`--json-only` for it alone), then a table with the limited producer's rate as a
share of its quota, and the free producer's rate beside its baseline.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time

from bench.eos_server import EosBroker
from bench.report import print_results

WINDOW_S = 11      # Kafka's quota.window.num x quota.window.size.seconds


class _Sender(threading.Thread):
    """One producer sending `value` to `topic` until stopped; (time, acknowledged bytes) samples."""

    def __init__(self, eos, bootstrap: str, topic: str, client_id: str, value: bytes):
        super().__init__(name=f"bench-quota-{client_id}", daemon=True)
        self.producer = eos.Producer(bootstrap, config={"client.id": client_id, "linger.ms": 5,
                                                        "batch.size": 65536})
        self.topic = topic
        self.value = value
        self.acked_bytes = 0
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def _acked(self, _metadata, error) -> None:
        if error is None:
            with self._lock:
                self.acked_bytes += len(self.value)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for _ in range(200):
                    self.producer.send(self.topic, value=self.value, on_delivery=self._acked)
                with self._lock:
                    self.samples.append((time.monotonic(), self.acked_bytes))
        finally:
            self.producer.flush()
            self.producer.close()

    def rate_after(self, started: float, skip_s: float) -> float:
        """Bytes/s acknowledged between `skip_s` after `started` and the last sample."""
        later = [(t, b) for t, b in self.samples if t >= started + skip_s]
        if len(later) < 2:
            return 0.0
        return (later[-1][1] - later[0][1]) / (later[-1][0] - later[0][0])


def _run(eos, bootstrap: str, senders: list[_Sender], seconds: float) -> float:
    started = time.monotonic()
    for sender in senders:
        sender.start()
    time.sleep(seconds)
    for sender in senders:
        sender.stop.set()
    for sender in senders:
        sender.join(120)
    return started


def run(quota_mb: float, seconds: float, value_bytes: int) -> dict:
    import eos

    quota = quota_mb * 1_000_000
    value = b"x" * value_bytes
    skip_s = min(WINDOW_S, seconds / 2)
    with EosBroker() as broker:
        with eos.Admin(broker.bootstrap) as admin:
            admin.create_topic("quota-free-alone", partitions=1)
            admin.create_topic("quota-free", partitions=1)
            admin.create_topic("quota-limited", partitions=1)
            alone = _Sender(eos, broker.bootstrap, "quota-free-alone", "free", value)
            started = _run(eos, broker.bootstrap, [alone], seconds)
            baseline = alone.rate_after(started, skip_s)
            admin.alter_client_quotas([({"client-id": "limited"}, {"producer_byte_rate": quota})])
            limited = _Sender(eos, broker.bootstrap, "quota-limited", "limited", value)
            free = _Sender(eos, broker.bootstrap, "quota-free", "free", value)
            started = _run(eos, broker.bootstrap, [limited, free], seconds)
        broker.check_alive()
    limited_rate, free_rate = limited.rate_after(started, skip_s), free.rate_after(started, skip_s)
    return {"quota_bytes_per_s": quota, "seconds": seconds, "measured_after_s": skip_s, "value_bytes": value_bytes,
            "limited_bytes_per_s": round(limited_rate), "limited_share_of_quota": round(limited_rate / quota, 3),
            "free_alone_bytes_per_s": round(baseline), "free_beside_limited_bytes_per_s": round(free_rate),
            "free_share_of_alone": round(free_rate / baseline, 3) if baseline else None}


def _table(results: dict) -> str:
    mb = lambda v: f"{v / 1e6:.2f} MB/s"
    return "\n".join([
        f"producer_byte_rate quota of 'limited': {mb(results['quota_bytes_per_s'])}",
        f"'limited' acknowledged: {mb(results['limited_bytes_per_s'])} "
        f"({results['limited_share_of_quota']:.0%} of its quota, after the first {results['measured_after_s']:.0f} s)",
        f"'free' alone: {mb(results['free_alone_bytes_per_s'])}; beside 'limited': "
        f"{mb(results['free_beside_limited_bytes_per_s'])} ({results['free_share_of_alone']:.0%} of alone)",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quota", description=__doc__.splitlines()[0])
    parser.add_argument("--quota-mb", type=float, default=2.0, help="the limited producer's MB/s (10^6 bytes)")
    parser.add_argument("--seconds", type=float, default=90.0, help="each run's length (the rate is taken after 11 s)")
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args(argv)
    results = run(args.quota_mb, args.seconds, args.value_bytes)
    print_results(results, _table(results), args.json_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())

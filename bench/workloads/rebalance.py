"""Rebalance pause (KIP-429): what a fourth member joining a group of three costs the three,
under eager rebalancing (range) and cooperative rebalancing (cooperative-sticky).

Theory of operation
-------------------
A feeder thread keeps writing to every partition of a 12-partition topic (one record to
each in turn, a round every `FEED_PAUSE_S`). Three group members, each polling on its own
thread without pause, share the topic; once every one of them has read records, a fourth
joins at `joined_at`. The run ends `TAIL_S` after the group has settled (the four members'
assignments cover the topic exactly and the newcomer has read from its share): `settled_at`.

Each member records, on its own clock reads (`time.monotonic`), every change of its
assignment (the rebalance listener: revoked, assigned, lost) and every poll that returned
records. Over the window [joined_at, settled_at + TAIL_S], for the three unchanged members:

- `unassigned_ms`: the longest time one of them held no partition at all (eager: from
  revoking everything to the new assignment; cooperative: it keeps 3 of its 4 throughout);
- `no_records_ms`: the longest time one of them went without a poll returning records (the
  gap straddling `joined_at` counts from `joined_at`). The feeder writes a record to each
  partition every few ms, so outside a rebalance this is a few tens of ms (the note gives the
  same figure over the second before the join, as the floor);
- `settle_ms`: joined_at to settled (the newcomer reading its share): the whole rebalance,
  which takes two join rounds under the cooperative protocol.

Both systems run the same members: eos's Consumer, and confluent-kafka (librdkafka, Kafka's
classic group protocol; with cooperative-sticky librdkafka applies the incremental
assignment after the listener returns) against the Kafka broker. Heartbeats every 300 ms,
session 6 s, auto.offset.reset latest, no commits. Every figure is the median of
`Sizes.repeats` runs (a fresh topic and group each).
"""
from __future__ import annotations

import threading
import time

from bench.kafka import wait_until
from bench.workloads import Metric, RunContext, Workload, register, repeated
from bench.workloads.clients import eos_create_topic, eos_module, kafka_create_topic

STRATEGIES = (("eager", "range"), ("cooperative", "cooperative-sticky"))
PARTITIONS = 12
UNCHANGED_MEMBERS = 3
HEARTBEAT_INTERVAL_MS = 300
SESSION_TIMEOUT_MS = 6_000
POLL_TIMEOUT_S = 0.02
FEED_PAUSE_S = 0.002
TAIL_S = 0.5
FLOOR_S = 1.0                 # the no-records floor is measured over this long before the join
SETTLE_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


class _Feeder:
    """Writes one small record to every partition in turn until stopped."""

    def __init__(self, system: str, bootstrap: str, topic: str):
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(system, bootstrap, topic), daemon=True,
                                        name="rebalance-feeder")
        self._thread.start()

    def _run(self, system: str, bootstrap: str, topic: str) -> None:
        try:
            if system == "kafka":
                from confluent_kafka import Producer

                producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
                while not self._stop.is_set():
                    for p in range(PARTITIONS):
                        producer.produce(topic, b"r", partition=p)
                    producer.poll(0)
                    self._stop.wait(FEED_PAUSE_S)
                producer.flush(STOP_TIMEOUT_S)
            else:
                import eos

                with eos.Producer(bootstrap, linger_ms=1) as producer:
                    while not self._stop.is_set():
                        for p in range(PARTITIONS):
                            producer.send(topic, value=b"r", partition=p)
                        self._stop.wait(FEED_PAUSE_S)
        except BaseException as exc:   # reported by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(STOP_TIMEOUT_S)
        if self.error is not None:
            raise RuntimeError(f"the feeder failed: {self.error}")


class _Member:
    """One group member polling on its own thread; records its assignment changes and the
    times of polls that returned records."""

    def __init__(self, system: str, bootstrap: str, topic: str, group: str, strategy: str):
        self.assigned: set = set()
        self.changes: list[tuple[float, int]] = [(time.monotonic(), 0)]   # (when, partitions held)
        self.arrivals: list[float] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        if system == "kafka":
            from confluent_kafka import Consumer

            self._consumer = Consumer({
                "bootstrap.servers": bootstrap, "group.id": group, "partition.assignment.strategy": strategy,
                "auto.offset.reset": "latest", "enable.auto.commit": False,
                "session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
                "fetch.wait.max.ms": 100})
            self._consumer.subscribe([topic], on_assign=lambda _c, tps: self._add(tps),
                                     on_revoke=lambda _c, tps: self._remove(tps),
                                     on_lost=lambda _c, tps: self._remove(tps))
            self._poll = self._poll_kafka
        else:
            import eos

            self._consumer = eos.Consumer(bootstrap, group_id=group, partition_assignment_strategy=[strategy],
                                          auto_offset_reset="latest", session_timeout_ms=SESSION_TIMEOUT_MS,
                                          heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS, fetch_max_wait_ms=100)
            self._consumer.subscribe([topic], listener=self)
            self._poll = lambda: len(self._consumer.poll(timeout_ms=int(POLL_TIMEOUT_S * 1000)))
        self._thread = threading.Thread(target=self._run, daemon=True, name="rebalance-member")
        self._thread.start()

    # Both clients' listeners: eager revokes (and assigns) everything, cooperative only the change.
    def _add(self, partitions) -> None:
        self.assigned |= {(tp.topic, tp.partition) for tp in partitions}
        self.changes.append((time.monotonic(), len(self.assigned)))

    def _remove(self, partitions) -> None:
        self.assigned -= {(tp.topic, tp.partition) for tp in partitions}
        self.changes.append((time.monotonic(), len(self.assigned)))

    on_partitions_assigned = _add
    on_partitions_revoked = _remove
    on_partitions_lost = _remove

    def _poll_kafka(self) -> int:
        messages = self._consumer.consume(num_messages=500, timeout=POLL_TIMEOUT_S)
        return sum(1 for m in messages if m.error() is None)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._poll():
                    self.arrivals.append(time.monotonic())
        except BaseException as exc:   # reported by stop()
            self.error = exc

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"a group member failed: {self.error}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(STOP_TIMEOUT_S)
        try:
            self._consumer.close()
        finally:
            self.check()

    def unassigned_s(self, start: float, end: float) -> float:
        """The longest stretch within [start, end] holding no partition."""
        longest, empty_since = 0.0, None
        for when, held in self.changes + [(end, -1)]:
            when = min(max(when, start), end)
            if empty_since is not None and held != 0:
                longest = max(longest, when - empty_since)
                empty_since = None
            if held == 0 and empty_since is None:
                empty_since = when
        return longest

    def no_records_s(self, start: float, end: float) -> float:
        """The longest stretch within [start, end] without a poll returning records."""
        times = [start] + [t for t in self.arrivals if start < t < end] + [end]
        return max(b - a for a, b in zip(times, times[1:]))


def _settled(members: list[_Member], newcomer: _Member) -> bool:
    for m in members:
        m.check()
    held = [frozenset(m.assigned) for m in members]
    share = PARTITIONS // len(members)
    return (sum(len(h) for h in held) == PARTITIONS and len(frozenset().union(*held)) == PARTITIONS
            and len(newcomer.assigned) == share and bool(newcomer.arrivals))


def _run_once(ctx: RunContext, mode: str, strategy: str) -> list[Metric]:
    topic = ctx.topic_name(f"rebalance-{mode}")
    group = ctx.topic_name(f"rebalance-{mode}-group")
    (kafka_create_topic if ctx.system == "kafka" else eos_create_topic)(ctx.bootstrap, topic, partitions=PARTITIONS)
    feeder = _Feeder(ctx.system, ctx.bootstrap, topic)
    unchanged = [_Member(ctx.system, ctx.bootstrap, topic, group, strategy) for _ in range(UNCHANGED_MEMBERS)]
    newcomer = None
    try:
        def three_settled() -> bool:
            for m in unchanged:
                m.check()
            return (sum(len(m.assigned) for m in unchanged) == PARTITIONS
                    and all(len(m.assigned) == PARTITIONS // UNCHANGED_MEMBERS for m in unchanged)
                    and all(m.arrivals for m in unchanged))

        wait_until(three_settled, f"{ctx.system}: three {strategy} members to share the topic", SETTLE_TIMEOUT_S)
        time.sleep(FLOOR_S)    # a quiet second before the join: the floor of no_records
        joined_at = time.monotonic()
        newcomer = _Member(ctx.system, ctx.bootstrap, topic, group, strategy)
        everyone = unchanged + [newcomer]
        wait_until(lambda: _settled(everyone, newcomer), f"{ctx.system}: the fourth {strategy} member's share",
                   SETTLE_TIMEOUT_S, interval_s=0.005)
        settled_at = time.monotonic()
        time.sleep(TAIL_S)
        end = settled_at + TAIL_S
    finally:
        for m in unchanged + ([newcomer] if newcomer is not None else []):
            m.stop()
        feeder.stop()
    unassigned_ms = max(m.unassigned_s(joined_at, end) for m in unchanged) * 1000
    no_records_ms = max(m.no_records_s(joined_at, end) for m in unchanged) * 1000
    floor_ms = max(m.no_records_s(joined_at - FLOOR_S, joined_at) for m in unchanged) * 1000
    settle_ms = (settled_at - joined_at) * 1000
    ctx.progress(f"    {mode} ({strategy}): unchanged members unassigned up to {unassigned_ms:,.0f} ms, "
                 f"without records up to {no_records_ms:,.0f} ms (floor before the join {floor_ms:,.0f} ms); "
                 f"settled in {settle_ms:,.0f} ms")
    note = (f"{PARTITIONS} partitions fed continuously, 3 members + 1 joining, {strategy}, heartbeat "
            f"{HEARTBEAT_INTERVAL_MS} ms; longest stretch of any of the 3 unchanged members; the no-records "
            f"floor in the second before the join was {floor_ms:,.0f} ms")
    key = f"rebalance.{mode}"
    return [
        Metric(f"{key}.unassigned_ms", f"{mode} ({strategy}): unchanged members without partitions",
               round(unassigned_ms, 1), "ms", False, note),
        Metric(f"{key}.no_records_ms", f"{mode} ({strategy}): unchanged members without records",
               round(no_records_ms, 1), "ms", False, note),
        Metric(f"{key}.settle_ms", f"{mode} ({strategy}): join to the newcomer reading its share",
               round(settle_ms, 1), "ms", False, note),
    ]


def run_rebalance(ctx: RunContext) -> list[Metric]:
    if ctx.system == "eos":
        eos_module("Producer", "Consumer")
    metrics: list[Metric] = []
    for mode, strategy in STRATEGIES:
        ctx.progress(f"  {mode}: a fourth member joins three ({strategy})")
        metrics += repeated(ctx, lambda: _run_once(ctx, mode, strategy))
    return metrics


register(Workload("rebalance", "Rebalance pause of unchanged members: eager (range) vs cooperative-sticky",
                  {"kafka": run_rebalance, "eos": run_rebalance}))

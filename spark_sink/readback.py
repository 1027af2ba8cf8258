"""Read a whole topic back as a read_committed consumer sees it (for checks, demos, tests).

`read_committed(bootstrap, topic)` waits until no transaction is open in any partition of
the topic (the last stable offset has reached the high watermark: markers are written
asynchronously after a commit) and then reads every partition from its start to that end.
`settled_end_offsets` is the waiting part alone. Both are bounded by `timeout_s`.
"""
from __future__ import annotations

import time

from eos.errors import EosError, ErrorCode
from eos.types import Record, TopicPartition

POLL_TIMEOUT_MS = 200
SETTLE_POLL_S = 0.05


def _partitions(admin, topic: str) -> list[TopicPartition]:
    return [TopicPartition(topic, p["partition"]) for p in admin.describe_topic(topic)["partitions"]]


def settled_end_offsets(bootstrap: str, topic: str, *, timeout_s: float = 60.0,
                        client_config: dict | None = None) -> dict[TopicPartition, int]:
    """{partition: end offset} once the read_committed end equals the log end everywhere."""
    from eos.admin import Admin

    deadline = time.monotonic() + timeout_s
    with Admin(bootstrap, config=client_config) as admin:
        tps = _partitions(admin, topic)
        while True:
            committed = admin.list_offsets({tp: "latest" for tp in tps}, isolation_level="read_committed")
            uncommitted = admin.list_offsets({tp: "latest" for tp in tps}, isolation_level="read_uncommitted")
            if committed == uncommitted:
                return committed
            if time.monotonic() > deadline:
                open_at = {f"{tp.topic}-{tp.partition}": (committed[tp], uncommitted[tp])
                           for tp in tps if committed[tp] != uncommitted[tp]}
                raise EosError(f"{topic}: transactions still open after {timeout_s} s "
                               f"(read_committed end, log end): {open_at}", ErrorCode.REQUEST_TIMED_OUT)
            time.sleep(SETTLE_POLL_S)


def read_committed(bootstrap: str, topic: str, *, timeout_s: float = 60.0,
                   end_offsets: dict[TopicPartition, int] | None = None,
                   client_config: dict | None = None) -> list[Record]:
    """Every record of `topic` a read_committed consumer sees, partition by partition in
    offset order (after `settled_end_offsets`, unless `end_offsets` is given)."""
    from consumer import Consumer

    ends = end_offsets if end_offsets is not None else settled_end_offsets(bootstrap, topic, timeout_s=timeout_s,
                                                                           client_config=client_config)
    deadline = time.monotonic() + timeout_s
    records: list[Record] = []
    with Consumer(bootstrap, isolation_level="read_committed", auto_offset_reset="earliest",
                  config=client_config) as consumer:
        wanted = [tp for tp, end in ends.items() if end > 0]
        if not wanted:
            return records
        consumer.assign(wanted)
        consumer.seek_to_beginning(*wanted)
        by_partition: dict[TopicPartition, list[Record]] = {tp: [] for tp in wanted}
        remaining = set(wanted)
        while remaining:
            if time.monotonic() > deadline:
                raise EosError(f"{topic}: reading to {ends} did not finish in {timeout_s} s", ErrorCode.REQUEST_TIMED_OUT)
            for record in consumer.poll(timeout_ms=POLL_TIMEOUT_MS, max_records=50_000):
                tp = TopicPartition(record.topic, record.partition)
                if record.offset < ends[tp]:
                    by_partition[tp].append(record)
            for tp in list(remaining):
                if consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        for tp in sorted(by_partition):
            records.extend(by_partition[tp])
    return records


__all__ = ["read_committed", "settled_end_offsets"]

"""Helpers shared by the Spark tests (fixtures live in conftest.py)."""
from __future__ import annotations

STREAM_TIMEOUT_S = 180     # a bound on every streaming query; none should come near it


def produce(address: str, topic: str, records_per_partition: dict[int, int], *, headers_every: int = 0,
            tag: str = ""):
    """Send known records to explicit partitions; return {(partition, offset): (key, value, headers)}."""
    import eos

    produced = {}
    futures = []
    with eos.Producer(address, linger_ms=5) as producer:
        for partition, count in records_per_partition.items():
            for i in range(count):
                key = f"{topic}-{partition}-k{i}{tag}".encode()
                value = f"value {i} of {topic}-{partition}{tag}".encode() * (1 + i % 3)
                if i % 17 == 16:
                    key = value = None     # null keys and tombstones come through as nulls
                headers = [("n", str(i).encode()), ("empty", None)] if headers_every and i % headers_every == 0 else []
                futures.append((producer.send(topic, value=value, key=key, partition=partition,
                                              headers=headers or None), key, value, headers))
        producer.flush(60)
        for future, key, value, headers in futures:
            metadata = future.result(60)
            produced[(metadata.partition, metadata.offset)] = (key, value, headers)
    return produced


def run_available_now(spark, address: str, topic: str, checkpoint: str, **options) -> list[tuple[int, list]]:
    """Run a stream with trigger(availableNow=True) to its end; return [(batch_id, [(partition, offset, value)])]."""
    batches: list[tuple[int, list]] = []

    def collect(batch_df, batch_id):
        rows = batch_df.select("partition", "offset", "value").collect()
        batches.append((batch_id, [(r.partition, r.offset, r.value) for r in rows]))

    stream = spark.readStream.format("eos").option("bootstrap", address).option("subscribe", topic)
    for name, value in options.items():
        stream = stream.option(name, value)
    query = (stream.load().writeStream.foreachBatch(collect)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    try:
        finished = query.awaitTermination(STREAM_TIMEOUT_S)
        assert finished, f"the availableNow query did not finish within {STREAM_TIMEOUT_S} s"
        if query.exception() is not None:
            raise AssertionError(f"the query failed: {query.exception()}")
    finally:
        query.stop()
    return batches

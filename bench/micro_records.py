"""Micro-benchmark of the record codec: encode and decode records/s, one thread, no I/O.

    .venv/bin/python -m bench.micro_records [--records N] [--batch-records N]
        [--value-bytes N] [--key-bytes N] [--codecs none,lz4,...] [--repeat N] [--json-out FILE]

(from the repository root; a plain `python bench/micro_records.py` works once eos is
installed, e.g. `pip install -e .`).

What it measures (best of --repeat runs, each over --records records):

- append:       BatchBuilder.append once per record, then build()  (the producer's send path)
- append_many:  BatchBuilder.append_many per batch, then build()    (the bulk path)
- rebuild:      build() again with a new producer id/epoch/sequence (header + CRC only)
- decode:       decode_records on each built batch                  (the consumer's path)

Values are --value-bytes long, half random and half a repeated pattern, so codecs have
something to do without the data being trivially compressible. Prints one JSON object
(also written to --json-out) and a table.
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time

from eos.records import compression
from eos.records.codec import BatchBuilder, decode_records
from eos.records.header import parse_header


def make_values(count: int, value_bytes: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    half = value_bytes // 2
    pattern = (b"eos-record-payload-" * (value_bytes // 19 + 1))[: value_bytes - half]
    return [rng.randbytes(half) + pattern for _ in range(count)]


def chunks(seq, size):
    return [seq[i:i + size] for i in range(0, len(seq), size)]


def best_rate(fn, records: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return records / best


def bench_codec(codec: int, values, keys, batch_records: int, repeat: int) -> dict:
    value_batches = chunks(values, batch_records)
    key_batches = chunks(keys, batch_records) if keys is not None else [None] * len(value_batches)
    timestamp_ms = 1_700_000_000_000
    records = len(values)

    def run_append():
        out = []
        for vb, kb in zip(value_batches, key_batches):
            builder = BatchBuilder(compression=codec)
            append = builder.append
            if kb is None:
                for v in vb:
                    append(v, None, timestamp_ms)
            else:
                for v, k in zip(vb, kb):
                    append(v, k, timestamp_ms)
            out.append(builder.build())
        return out

    def run_append_many():
        out = []
        for vb, kb in zip(value_batches, key_batches):
            builder = BatchBuilder(compression=codec)
            builder.append_many(vb, kb, timestamp_ms)
            out.append(builder.build())
        return out

    builders = []
    for vb, kb in zip(value_batches, key_batches):
        builder = BatchBuilder(compression=codec)
        builder.append_many(vb, kb, timestamp_ms)
        builder.build(producer_id=1, producer_epoch=0, base_sequence=0)
        builders.append(builder)

    def run_rebuild():
        for builder in builders:
            builder.build(producer_id=1, producer_epoch=1, base_sequence=0)

    batches = run_append_many()
    headers = [parse_header(b) for b in batches]

    def run_decode():
        for batch, header in zip(batches, headers):
            decode_records(batch, header, "bench", 0)

    # sanity: what we time decodes to what we encoded
    decoded = [r.value for b, h in zip(batches, headers) for r in decode_records(b, h, "bench", 0)]
    if decoded != values:
        raise SystemExit(f"codec {compression.codec_name(codec)}: decoded values differ from input")

    total_bytes = sum(len(b) for b in batches)
    return {
        "codec": compression.codec_name(codec),
        "append_records_per_s": round(best_rate(run_append, records, repeat)),
        "append_many_records_per_s": round(best_rate(run_append_many, records, repeat)),
        "rebuild_batches_per_s": round(best_rate(run_rebuild, len(builders), repeat)),
        "decode_records_per_s": round(best_rate(run_decode, records, repeat)),
        "batch_bytes_avg": round(total_bytes / len(batches)),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch-records", type=int, default=500)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--key-bytes", type=int, default=0, help="0 = null keys")
    parser.add_argument("--codecs", default="none,gzip,snappy,lz4,zstd")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)

    values = make_values(args.records, args.value_bytes, args.seed)
    keys = None
    if args.key_bytes:
        keys = [(b"key-%d-" % (i % 1000)).ljust(args.key_bytes, b"k")[: args.key_bytes]
                for i in range(args.records)]
    codecs = [compression.codec_from_name(name) for name in args.codecs.split(",") if name]
    results = [bench_codec(codec, values, keys, args.batch_records, args.repeat) for codec in codecs]

    report = {
        "benchmark": "micro_records",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "records": args.records,
        "batch_records": args.batch_records,
        "value_bytes": args.value_bytes,
        "key_bytes": args.key_bytes,
        "repeat": args.repeat,
        "results": results,
    }
    print(json.dumps(report))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)

    columns = [("codec", "codec", 7), ("append rec/s", "append_records_per_s", 13),
               ("append_many rec/s", "append_many_records_per_s", 18),
               ("rebuild batch/s", "rebuild_batches_per_s", 16),
               ("decode rec/s", "decode_records_per_s", 13), ("batch bytes", "batch_bytes_avg", 12)]
    print(" ".join(title.rjust(width) for title, _, width in columns))
    for row in results:
        print(" ".join((f"{row[key]:,}" if isinstance(row[key], int) else row[key]).rjust(width)
                       for _, key, width in columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())

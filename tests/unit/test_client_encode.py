"""The codec's keyed bulk encoding (what send_batch with keys builds) against the general
record-by-record path: the same bytes, decoded back to the records given."""
from __future__ import annotations

import random

import pytest

from eos.records import codec
from eos.records.codec import BatchBuilder, decode_records
from eos.records.header import parse_header

TIMESTAMP_MS = 1_700_000_000_000


def build(values, keys, timestamps, *, first_records: int = 0) -> bytes:
    builder = BatchBuilder()
    if first_records:
        builder.append_many([b"x"] * first_records, [b"k"] * first_records, TIMESTAMP_MS)
    builder.append_many(values, keys, timestamps)
    return builder.build(producer_id=7, producer_epoch=1, base_sequence=0)


def random_bytes(rng: random.Random, longest: int) -> bytes:
    return bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, longest)))


CASES = {
    # 9,000 records: offset deltas past the 8,192-entry varint table
    "values of many lengths": lambda rng: ([random_bytes(rng, 300) for _ in range(9000)],
                                           [b"key-%d" % i for i in range(9000)]),
    "values of one length, empty keys": lambda rng: ([b"v" * 100] * 500, [b""] * 500),
    "a null key (general path)": lambda rng: ([b"v"] * 100, [b"k"] * 99 + [None]),
    "a null value (general path)": lambda rng: ([b"v"] * 99 + [None], [b"k"] * 100),
    "a value too long for the tables": lambda rng: ([b"v" * 9000, b"w"], [b"k", b"l"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("timestamps", ["one", "runs"])
@pytest.mark.parametrize("first_records", [0, 70])
def test_keyed_bulk_encoding_is_the_general_encoding(case, timestamps, first_records, monkeypatch):
    values, keys = CASES[case](random.Random(case))
    stamps = (TIMESTAMP_MS if timestamps == "one"
              else [TIMESTAMP_MS + i // 300 for i in range(len(values))])
    fast = build(values, keys, stamps, first_records=first_records)
    with monkeypatch.context() as patched:
        patched.setattr(codec, "_encode_keyed", lambda *args: None)   # the general path only
        general = build(values, keys, stamps, first_records=first_records)
    assert fast == general
    records = decode_records(fast, parse_header(fast), "t", 0)[first_records:]
    assert [(r.key, r.value) for r in records] == list(zip(keys, values))


def test_the_keyed_bulk_path_is_taken_for_bytes_keys_and_values(monkeypatch):
    taken = []
    real = codec._encode_keyed
    monkeypatch.setattr(codec, "_encode_keyed", lambda *args: taken.append(real(*args)) or taken[-1])
    build([b"v" * 10] * 50, [b"key-%d" % i for i in range(50)], TIMESTAMP_MS)
    assert len(taken) == 1 and taken[0] is not None

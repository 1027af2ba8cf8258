"""The raw record walk the log cleaner and the compacted-topic check use: the same keys,
offsets and null values as the full decoder, byte ranges that tile the records section,
rebuilt batches that decode to the kept records, and malformed sections refused."""
from __future__ import annotations

import random

import pytest

from eos.errors import CorruptRecordError
from eos.records import compression
from eos.records.codec import decode_records, encode_batch
from eos.records.header import parse_header, verify_crc
from eos.records.raw import first_keyless_record, raw_records, rebuild_batch, records_section


def random_batch(rng: random.Random, codec: int = 0) -> bytes:
    count = rng.randint(1, 300)
    values = [None if rng.random() < 0.2 else bytes(rng.randint(0, 300)) for _ in range(count)]
    keys = [None if rng.random() < 0.1 else b"k%d" % rng.randint(0, 10 ** rng.randint(1, 40)) for _ in range(count)]
    timestamps = [1_000 + rng.randint(0, 10 ** rng.randint(0, 9)) for _ in range(count)]
    headers = [[("h", b"x" * rng.randint(0, 200))] if rng.random() < 0.3 else None for _ in range(count)]
    return encode_batch(values, keys, timestamps, headers, compression=codec, base_offset=rng.randint(0, 1 << 40))


@pytest.mark.parametrize("codec", list(compression.CODECS))
def test_the_walk_agrees_with_the_decoder_and_tiles_the_section(codec):
    rng = random.Random(codec)
    for _ in range(40):
        batch = random_batch(rng, codec)
        header = parse_header(batch)
        data, start, end = records_section(batch, header)
        walked = raw_records(data, start, end, header)
        decoded = decode_records(batch, header, "t", 0)
        assert [(r.offset, r.key, r.value_is_null) for r in walked] == \
               [(d.offset, d.key, d.value is None) for d in decoded]
        assert [r.start for r in walked] == [start] + [r.end for r in walked[:-1]]
        assert walked[-1].end == end
        keyless = [d.offset for d in decoded if d.key is None]
        assert first_keyless_record(batch, header) == (keyless[0] if keyless else None)


@pytest.mark.parametrize("codec", list(compression.CODECS))
def test_a_rebuilt_batch_holds_the_kept_records_at_their_offsets(codec):
    rng = random.Random(100 + codec)
    batch = random_batch(rng, codec)
    header = parse_header(batch)
    data, start, end = records_section(batch, header)
    walked = raw_records(data, start, end, header)
    kept = [r for r in walked if rng.random() < 0.5] or walked[:1]
    rebuilt = rebuild_batch(batch, header, data, kept)
    new_header = parse_header(rebuilt)
    verify_crc(rebuilt, new_header)
    assert (new_header.base_offset, new_header.last_offset_delta, new_header.records_count) == \
           (header.base_offset, header.last_offset_delta, len(kept))
    assert new_header.attributes == header.attributes
    original = {d.offset: d for d in decode_records(batch, header, "t", 0)}
    assert [(d.offset, d.key, d.value, d.headers, d.timestamp) for d in decode_records(rebuilt, new_header, "t", 0)] == \
           [(r.offset, original[r.offset].key, original[r.offset].value, original[r.offset].headers,
             original[r.offset].timestamp) for r in kept]
    empty = rebuild_batch(batch, header, data, [])
    assert parse_header(empty).records_count == 0 and len(empty) == 61


def test_malformed_sections_are_refused():
    batch = encode_batch([b"value"] * 3, [b"key"] * 3)
    header = parse_header(batch)
    data, start, end = records_section(batch, header)
    with pytest.raises(CorruptRecordError, match="ends inside record|past the end"):
        raw_records(data, start, end - 4, header)           # the last record cut short
    with pytest.raises(CorruptRecordError, match="after its 2 record"):
        raw_records(data, start, end, header._replace(records_count=2))
    with pytest.raises(CorruptRecordError):
        raw_records(data, start, end, header._replace(records_count=4))
    torn = bytearray(data[start:end])
    torn[0] = 0x7F                                          # a negative record length
    with pytest.raises(CorruptRecordError):
        raw_records(bytes(torn), 0, len(torn), header)

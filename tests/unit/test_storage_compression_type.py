"""A topic's compression.type (Kafka's LogValidator): a batch whose codec differs is stored
in the topic's codec with the same offsets, sequences, timestamps and flags; `producer`
keeps the producer's codec; markers are never compressed; a bad batch changes nothing."""
from __future__ import annotations

import os

import pytest

from broker.storage import AppendOrigin, Log
from eos.config import TopicConfig
from eos.errors import CorruptRecordError, InvalidConfigError, MessageTooLargeError
from eos.records import compression
from eos.records.codec import decode_records, encode_batch, encode_control_batch
from eos.records.header import iter_headers, verify_crc
from eos.records.raw import recompress_batch

CODECS = {"uncompressed": compression.NONE, "gzip": compression.GZIP, "snappy": compression.SNAPPY,
          "lz4": compression.LZ4, "zstd": compression.ZSTD}
VALUES = [f"value-{i:04d}-".encode() * 8 for i in range(50)]
KEYS = [f"k{i % 7}".encode() for i in range(50)]


def batch(codec: int, **kwargs) -> bytes:
    return encode_batch(VALUES, KEYS, timestamps_ms=[1_000 + i for i in range(50)],
                        headers=[[("h", b"x")]] * 50, compression=codec, **kwargs)


def stored(log: Log):
    data = log.read(0, 1 << 24).records
    headers = list(iter_headers(data))
    for header in headers:
        verify_crc(data, header)
    return data, headers


def contents(data, header):
    return [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in decode_records(data, header, "t", 0)]


@pytest.mark.parametrize("source", sorted(CODECS))
@pytest.mark.parametrize("target", sorted(CODECS))
def test_every_codec_pair_stores_the_topics_codec_with_the_same_records(tmp_path, source, target):
    topic_log = Log.open(str(tmp_path / "t-0"), TopicConfig(compression_type=target), now_ms=0)
    plain_log = Log.open(str(tmp_path / "p-0"), TopicConfig(), now_ms=0)
    for log in (topic_log, plain_log):
        log.append_as_leader(make_filler(), now_ms=0)                # offsets 0-2 first
        info = log.append_as_leader(batch(CODECS[source]), now_ms=0)
        assert (info.first_offset, info.last_offset, info.record_count) == (3, 52, 50)
    data, headers = stored(topic_log)
    assert [h.compression for h in headers] == [CODECS[target], CODECS[target]]
    plain, plain_headers = stored(plain_log)                          # compression.type=producer
    assert [h.compression for h in plain_headers] == [compression.NONE, CODECS[source]]
    assert contents(data, headers[1]) == contents(plain, plain_headers[1])
    assert [(h.base_offset, h.last_offset_delta, h.base_timestamp, h.max_timestamp, h.records_count)
            for h in headers] == [(h.base_offset, h.last_offset_delta, h.base_timestamp, h.max_timestamp,
                                   h.records_count) for h in plain_headers]


def make_filler() -> bytes:
    return encode_batch([b"a", b"b", b"c"], timestamps_ms=[1, 2, 3])


def test_a_transactional_batch_keeps_its_producer_fields_and_markers_stay_uncompressed(tmp_path):
    log = Log.open(str(tmp_path / "t-0"), TopicConfig(compression_type="zstd"), now_ms=0)
    log.append_as_leader(batch(compression.GZIP, producer_id=7, producer_epoch=3, base_sequence=0,
                               transactional=True), now_ms=0)
    # a client's retry of the same batch (same sequence) is still recognised as a duplicate
    again = log.append_as_leader(batch(compression.GZIP, producer_id=7, producer_epoch=3, base_sequence=0,
                                       transactional=True), now_ms=0)
    assert again.duplicate
    log.append_as_leader(encode_control_batch(committed=True, producer_id=7, producer_epoch=4,
                                              coordinator_epoch=0, timestamp_ms=5),
                         now_ms=0, origin=AppendOrigin.COORDINATOR)
    data, (txn, marker) = stored(log)
    assert (txn.compression, txn.producer_id, txn.producer_epoch, txn.base_sequence, txn.is_transactional) == (
        compression.ZSTD, 7, 3, 0, True)
    assert marker.is_control and marker.compression == compression.NONE
    assert log.last_stable_offset == log.log_end_offset == 51


def test_recompression_refuses_a_corrupt_record_and_writes_nothing(tmp_path):
    log = Log.open(str(tmp_path / "t-0"), TopicConfig(compression_type="lz4"), now_ms=0)
    good = bytearray(batch(compression.NONE))
    header = next(iter_headers(bytes(good)))
    # Claim one record more than the section holds; the CRC is made to match so that only
    # the records themselves are wrong (what only a decompressing validator can see).
    good[57:61] = (header.records_count + 1).to_bytes(4, "big")
    good[23:27] = (header.last_offset_delta + 1).to_bytes(4, "big")
    from eos.records.header import compute_crc
    good[17:21] = compute_crc(good, 0, len(good)).to_bytes(4, "big")
    before = {n: open(os.path.join(log.directory, n), "rb").read() for n in sorted(os.listdir(log.directory))}
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(bytes(good), now_ms=0)
    after = {n: open(os.path.join(log.directory, n), "rb").read() for n in sorted(os.listdir(log.directory))}
    assert after == before and log.log_end_offset == 0


def test_max_message_bytes_applies_to_the_stored_batch(tmp_path):
    values = [os.urandom(1) * 2000 for _ in range(10)]          # compresses to almost nothing
    gzipped = encode_batch(values, compression=compression.GZIP)
    limit = len(gzipped) + 100
    log = Log.open(str(tmp_path / "t-0"), TopicConfig(compression_type="uncompressed", max_message_bytes=limit),
                   now_ms=0)
    with pytest.raises(MessageTooLargeError):
        log.append_as_leader(gzipped, now_ms=0)
    assert log.log_end_offset == 0


def test_recompress_batch_changes_only_the_codec_length_and_crc():
    original = batch(compression.SNAPPY, producer_id=9, producer_epoch=1, base_sequence=40)
    header = next(iter_headers(original))
    out = recompress_batch(original, header, compression.ZSTD)
    new = next(iter_headers(out))
    verify_crc(out, new)
    assert new.compression == compression.ZSTD
    same = ("base_offset", "partition_leader_epoch", "magic", "last_offset_delta", "base_timestamp",
            "max_timestamp", "producer_id", "producer_epoch", "base_sequence", "records_count")
    assert [getattr(new, f) for f in same] == [getattr(header, f) for f in same]
    assert new.attributes & ~0x07 == header.attributes & ~0x07
    assert contents(out, new) == contents(original, header)


def test_none_is_a_producer_spelling_not_a_topic_compression_type():
    # Kafka's topic-level values are uncompressed, zstd, lz4, snappy, gzip and producer
    with pytest.raises(InvalidConfigError, match="compression.type"):
        TopicConfig.from_overrides({"compression.type": "none"})

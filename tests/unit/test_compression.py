"""The five codecs: round trips, Kafka's framing on write, what is accepted and refused on read."""
from __future__ import annotations

import random
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor

import lz4.frame
import pytest
import snappy
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from eos.errors import CorruptRecordError, InvalidConfigError
from eos.records import compression
from eos.records.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD, codec_from_name, codec_name, compress, decompress

CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
COMPRESSING = [GZIP, SNAPPY, LZ4, ZSTD]


def _mixed_bytes(size: int, seed: int = 1) -> bytes:
    """Half random, half repetitive: compressible, but not trivially."""
    rng = random.Random(seed)
    out = bytearray()
    while len(out) < size:
        out += rng.randbytes(64) + b"kafka-record-" * 5
    return bytes(out[:size])


# --- names --------------------------------------------------------------------------------

@pytest.mark.parametrize("name, codec", [
    ("none", NONE), ("uncompressed", NONE), ("gzip", GZIP), ("snappy", SNAPPY), ("lz4", LZ4),
    ("zstd", ZSTD), ("GZIP", GZIP), (" Zstd ", ZSTD)])
def test_codec_from_name(name, codec):
    assert codec_from_name(name) == codec


@pytest.mark.parametrize("name", ["brotli", "", "producer", "lz5"])
def test_codec_from_name_refuses_unknown_names_and_names_them(name):
    with pytest.raises(InvalidConfigError, match=repr(name)):
        codec_from_name(name)


def test_codec_name_round_trips_and_refuses_unknown_ids():
    assert [codec_name(c) for c in CODECS] == ["none", "gzip", "snappy", "lz4", "zstd"]
    assert all(codec_from_name(codec_name(c)) == c for c in CODECS)
    with pytest.raises(InvalidConfigError):
        codec_name(5)


# --- round trips --------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(codec=st.sampled_from(CODECS), data=st.binary(max_size=4000))
def test_round_trip(codec, data):
    assert decompress(codec, compress(codec, data)) == data


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("size", [0, 1, 32 * 1024, 64 * 1024 + 1, 300_000])
def test_round_trip_across_block_boundaries(codec, size):
    data = _mixed_bytes(size)
    framed = compress(codec, data)
    assert decompress(codec, framed) == data
    assert decompress(codec, memoryview(framed)) == data  # readers take any buffer


@pytest.mark.parametrize("codec", COMPRESSING)
def test_compression_actually_compresses(codec):
    data = b"the same record again " * 2000
    assert len(compress(codec, data)) < len(data) // 4


@pytest.mark.parametrize("codec", [GZIP, LZ4, ZSTD])
def test_level_is_honoured_and_output_stays_readable(codec):
    data = _mixed_bytes(100_000)
    fast = compress(codec, data, level=1)
    small = compress(codec, data, level=9)
    assert decompress(codec, fast) == decompress(codec, small) == data


def test_compress_is_deterministic():
    data = _mixed_bytes(50_000)
    for codec in CODECS:
        assert compress(codec, data) == compress(codec, data)


def test_zstd_contexts_are_safe_across_threads():
    payloads = [_mixed_bytes(20_000, seed) for seed in range(8)]

    def work(payload):
        return all(decompress(ZSTD, compress(ZSTD, payload)) == payload for _ in range(20))

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert all(pool.map(work, payloads))


# --- gzip ---------------------------------------------------------------------------------

def test_gzip_writes_a_gzip_stream_with_zero_mtime():
    framed = compress(GZIP, b"hello")
    assert framed[:4] == b"\x1f\x8b\x08\x00"      # magic, deflate, no flags
    assert framed[4:8] == b"\x00\x00\x00\x00"     # mtime 0: deterministic
    assert zlib.decompress(framed, wbits=31) == b"hello"


def test_gzip_reads_concatenated_members_as_java_does():
    assert decompress(GZIP, compress(GZIP, b"abc") + compress(GZIP, b"def")) == b"abcdef"


# --- snappy (xerial framing) --------------------------------------------------------------

def test_snappy_writes_xerial_framing_with_32k_blocks():
    data = _mixed_bytes(100_000)
    framed = compress(SNAPPY, data)
    assert framed[:8] == b"\x82SNAPPY\x00"
    assert struct.unpack(">ii", framed[8:16]) == (1, 1)   # version, minimum compatible version
    position, blocks = 16, []
    while position < len(framed):
        (length,) = struct.unpack_from(">i", framed, position)
        blocks.append(snappy.decompress(framed[position + 4:position + 4 + length]))
        position += 4 + length
    assert position == len(framed)
    assert [len(b) for b in blocks] == [32768, 32768, 32768, 100_000 - 3 * 32768]
    assert b"".join(blocks) == data


def test_snappy_reads_raw_unframed_snappy():
    data = _mixed_bytes(70_000)
    assert decompress(SNAPPY, snappy.compress(data)) == data


def test_snappy_reads_concatenated_xerial_streams():
    assert decompress(SNAPPY, compress(SNAPPY, b"first ") + compress(SNAPPY, b"second")) == b"first second"


@pytest.mark.parametrize("mangle, message", [
    (lambda f: f[:-3], "declares"),                                       # block cut short
    (lambda f: f[:18], "block length"),                                   # length cut short
    (lambda f: f[:12], "header"),                                         # header cut short
    (lambda f: f[:8] + struct.pack(">ii", 0, 0) + f[16:], "version"),     # too old a version
    (lambda f: f[:16] + struct.pack(">i", -5) + f[20:], "declares"),      # negative block length
])
def test_snappy_refuses_broken_xerial_streams(mangle, message):
    framed = compress(SNAPPY, _mixed_bytes(1000))
    with pytest.raises(CorruptRecordError, match=message):
        decompress(SNAPPY, mangle(framed))


# --- lz4 (Kafka's frame) ------------------------------------------------------------------

def _lz4_blocks(frame: bytes) -> list[tuple[int, bool]]:
    """(stored size, compressed?) of each data block of a frame written without checksums."""
    position = 7
    blocks = []
    while True:
        (word,) = struct.unpack_from("<I", frame, position)
        position += 4
        if word == 0:
            break
        size = word & 0x7FFFFFFF
        blocks.append((size, not word & 0x80000000))
        position += size
    assert position == len(frame)
    return blocks


def _xxh32_short(data: bytes, seed: int = 0) -> int:
    """XXH32 for inputs under 16 bytes (enough for a frame descriptor), from the spec."""
    assert len(data) < 16
    p1, p2, p3, p4, p5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    h = (seed + p5 + len(data)) & mask
    position = 0
    while position + 4 <= len(data):
        (word,) = struct.unpack_from("<I", data, position)
        h = rotl((h + word * p3) & mask, 17) * p4 & mask
        position += 4
    for byte in data[position:]:
        h = rotl((h + byte * p5) & mask, 11) * p1 & mask
    h ^= h >> 15
    h = h * p2 & mask
    h ^= h >> 13
    h = h * p3 & mask
    h ^= h >> 16
    return h


def test_xxh32_helper_matches_the_reference_vector():
    assert _xxh32_short(b"") == 0x02CC5D05


def test_lz4_header_checksum_is_computed_as_kafkas_reader_checks_it():
    frame = compress(LZ4, b"payload")
    # KafkaLZ4BlockInputStream: (xxh32(FLG..BD, seed 0) >> 8) & 0xFF, over the descriptor only
    assert frame[6] == (_xxh32_short(frame[4:6]) >> 8) & 0xFF


def test_lz4_writes_the_frame_kafka_writes():
    frame = compress(LZ4, b"x" * 1000)
    # magic 0x184D2204 LE; FLG 0x60 = version 01, independent blocks, no block checksum, no
    # content size, no content checksum, no dictionary id; BD 0x40 = 64 KiB blocks; then the
    # header checksum (xxh32 of FLG..BD >> 8), which is 0x82 for these two bytes.
    assert frame[:7] == bytes.fromhex("04224d18604082")
    assert frame[4] & 0x03 == 0        # reserved bit and dictionary-id bit: Kafka rejects them
    assert frame[4] & 0x20             # block independence: Kafka rejects linked blocks


def test_lz4_blocks_are_at_most_64k_and_stored_raw_when_incompressible():
    data = random.Random(3).randbytes(200_000)
    frame = compress(LZ4, data)
    blocks = _lz4_blocks(frame)
    assert [size for size, _ in blocks] == [65536, 65536, 65536, 200_000 - 3 * 65536]
    assert not any(compressed for _, compressed in blocks)
    assert decompress(LZ4, frame) == data


@pytest.mark.parametrize("options", [
    {"store_size": True}, {"block_checksum": True}, {"content_checksum": True},
    {"block_size": lz4.frame.BLOCKSIZE_MAX4MB}])
def test_lz4_reads_optional_flags_that_kafka_accepts(options):
    data = _mixed_bytes(150_000)
    kwargs = {"block_linked": False, "store_size": False, **options}
    assert decompress(LZ4, lz4.frame.compress(data, **kwargs)) == data


def test_lz4_refuses_linked_blocks_as_kafka_does():
    frame = lz4.frame.compress(_mixed_bytes(150_000), block_linked=True)
    with pytest.raises(CorruptRecordError, match="dependent"):
        decompress(LZ4, frame)


@pytest.mark.parametrize("byte_index, value, message", [
    (4, 0x61, "dictionary-id"),     # FLG dictionary id bit
    (4, 0x62, "reserved"),          # FLG reserved bit
    (4, 0xA0, "version"),           # FLG version 2
    (5, 0x30, "block descriptor"),  # BD block size code 3
    (5, 0x41, "block descriptor"),  # BD reserved low bits
    (5, 0xC0, "block descriptor"),  # BD reserved high bit
    (0, 0x05, "magic"),
])
def test_lz4_refuses_frame_descriptors_kafka_refuses(byte_index, value, message):
    frame = bytearray(compress(LZ4, b"payload" * 100))
    frame[byte_index] = value
    with pytest.raises(CorruptRecordError, match=message):
        decompress(LZ4, bytes(frame))


def test_lz4_refuses_a_truncated_frame_and_bytes_after_it():
    frame = compress(LZ4, _mixed_bytes(10_000))
    with pytest.raises(CorruptRecordError, match="truncated"):
        decompress(LZ4, frame[:-2])
    with pytest.raises(CorruptRecordError, match="follow the frame"):
        decompress(LZ4, frame + b"junk")


# --- zstd ---------------------------------------------------------------------------------

def test_zstd_writes_a_standard_frame():
    frame = compress(ZSTD, b"payload" * 100)
    assert frame[:4] == b"\x28\xb5\x2f\xfd"
    assert zstandard.ZstdDecompressor().decompress(frame) == b"payload" * 100


def test_zstd_reads_frames_without_content_size_as_zstd_jni_streams_them():
    data = _mixed_bytes(200_000)
    frame = zstandard.ZstdCompressor(level=3, write_content_size=False).compress(data)
    assert zstandard.get_frame_parameters(frame).content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert decompress(ZSTD, frame) == data


# --- bad input ----------------------------------------------------------------------------

@pytest.mark.parametrize("codec", COMPRESSING)
@pytest.mark.parametrize("garbage", [b"", b"\x05", b"not compressed at all, just bytes" * 3,
                                     bytes(range(256))])
def test_garbage_is_corrupt(codec, garbage):
    with pytest.raises(CorruptRecordError):
        decompress(codec, garbage)


@pytest.mark.parametrize("codec", [GZIP, LZ4, ZSTD])
def test_truncated_payload_is_corrupt(codec):
    framed = compress(codec, _mixed_bytes(5000))
    with pytest.raises(CorruptRecordError, match=codec_name(codec)):
        decompress(codec, framed[: len(framed) // 2])


@pytest.mark.parametrize("codec", [5, 6, 7, -1])
def test_unknown_codec_ids(codec):
    with pytest.raises(CorruptRecordError, match="unknown compression codec"):
        decompress(codec, b"whatever")
    with pytest.raises(InvalidConfigError):
        compress(codec, b"whatever")


def test_the_codec_table_matches_kafka_ids():
    assert (compression.NONE, compression.GZIP, compression.SNAPPY, compression.LZ4,
            compression.ZSTD) == (0, 1, 2, 3, 4)

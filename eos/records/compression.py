"""The five record-batch codecs, framed the way Apache Kafka's Java client frames them.

Theory of operation
-------------------
A compressed v2 batch keeps its 61-byte header in the clear and compresses the records
section as one block; bits 0-2 of the attributes name the codec. `compress` and
`decompress` turn that section into bytes and back. They are pure functions of their
input: no state survives a call except reusable library contexts, which are per thread
because zstandard's are not safe to share.

Framing, per codec (what Kafka writes, and what we accept on read):

- gzip (1): an RFC 1952 gzip stream (Java's GZIPOutputStream). Written with mtime 0 so
  equal input gives equal bytes; concatenated members are read, as Java's reader does.
- snappy (2): xerial snappy-java framing (SnappyOutputStream): the 8-byte magic
  ``\\x82SNAPPY\\x00``, version i32 (1) and minimum compatible version i32 (1), then blocks
  of at most 32 KiB input, each a big-endian i32 length and one raw snappy block. On read
  we also accept an unframed raw snappy block (as xerial's reader does when the magic is
  missing) and concatenated xerial streams.
- lz4 (3): an LZ4 frame (magic 0x184D2204) as KafkaLZ4BlockOutputStream writes it: FLG
  0x60 (version 1, independent blocks, no checksums, no content size), BD 0x40 (64 KiB
  blocks), then the header checksum. Kafka's reader (KafkaLZ4BlockInputStream) refuses a
  frame whose FLG has reserved bits or the dictionary-id bit set, dependent (linked) blocks
  or a version other than 1, and a BD with reserved bits set or a block size code outside
  4-7; we refuse the same frames on read, so nothing we accept is unreadable by Kafka.
  Content size, block and content checksums are optional flags Kafka accepts.
- zstd (4): a standard zstd frame. Kafka's zstd-jni stream writes no content size, so the
  reader streams rather than relying on it.

Levels: gzip 6 (Java's default), zstd 3 (Kafka's default), lz4 the fast compressor
(Kafka >= 3.8 defaults to LZ4HC level 9: the frames are identical in form, HC is only
slower; pass `level=` to trade speed for size).

Every failure to decompress, whatever the library raises, becomes CorruptRecordError
naming the codec and the cause; an unknown codec id (5, 6, 7) is CorruptRecordError too,
because it can only come from a corrupt or foreign batch.
"""
from __future__ import annotations

import struct
import threading
import zlib

import lz4.frame
import snappy
import zstandard

from eos.errors import CorruptRecordError, InvalidConfigError

NONE = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4

CODECS = (NONE, GZIP, SNAPPY, LZ4, ZSTD)
_NAME_OF = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
_CODEC_OF = {name: codec for codec, name in _NAME_OF.items()}
_CODEC_OF["uncompressed"] = NONE  # the broker-side spelling of compression.type

GZIP_DEFAULT_LEVEL = 6
ZSTD_DEFAULT_LEVEL = 3
LZ4_DEFAULT_LEVEL = 0  # lz4's fast (non-HC) compressor

# xerial snappy-java framing
SNAPPY_XERIAL_MAGIC = b"\x82SNAPPY\x00"
SNAPPY_XERIAL_VERSION = 1
SNAPPY_XERIAL_MIN_COMPATIBLE_VERSION = 1
SNAPPY_XERIAL_HEADER = SNAPPY_XERIAL_MAGIC + struct.pack(
    ">ii", SNAPPY_XERIAL_VERSION, SNAPPY_XERIAL_MIN_COMPATIBLE_VERSION)
SNAPPY_XERIAL_BLOCK_BYTES = 32 * 1024  # SnappyOutputStream's default block size
_BLOCK_LENGTH = struct.Struct(">i")

# lz4 frame descriptor, as Kafka checks it
LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"  # 0x184D2204 little-endian
LZ4_FLG_VERSION_MASK = 0xC0
LZ4_FLG_VERSION_1 = 0x40
LZ4_FLG_BLOCK_INDEPENDENCE = 0x20
LZ4_FLG_RESERVED_MASK = 0x03  # bit 1 reserved, bit 0 dictionary id: Kafka rejects both
LZ4_BD_RESERVED_MASK = 0x8F
LZ4_BD_BLOCK_SIZE_SHIFT = 4


def codec_from_name(name: str) -> int:
    """The codec id of a compression.type value ("none"/"uncompressed", "gzip", ...)."""
    key = name.strip().lower() if isinstance(name, str) else name
    codec = _CODEC_OF.get(key)
    if codec is None:
        raise InvalidConfigError(
            f"unknown compression type {name!r}: expected one of "
            f"{', '.join(sorted(_CODEC_OF))}")
    return codec


def codec_name(codec: int) -> str:
    name = _NAME_OF.get(codec)
    if name is None:
        raise InvalidConfigError(f"unknown compression codec id {codec!r}: expected 0-4")
    return name


# --- per-thread library contexts ----------------------------------------------------------

class _ThreadContexts(threading.local):
    """zstandard compressor/decompressor objects are not thread-safe; one set per thread."""

    def __init__(self) -> None:
        self.zstd_compressors: dict[int, zstandard.ZstdCompressor] = {}
        self.zstd_decompressor = zstandard.ZstdDecompressor()


_contexts = _ThreadContexts()


def _zstd_compressor(level: int) -> zstandard.ZstdCompressor:
    compressors = _contexts.zstd_compressors
    compressor = compressors.get(level)
    if compressor is None:
        compressor = compressors[level] = zstandard.ZstdCompressor(level=level)
    return compressor


# --- compress -----------------------------------------------------------------------------

def compress(codec: int, data, *, level: int | None = None) -> bytes:
    """Compress one records section with `codec`, framed as Kafka's Java client frames it."""
    if codec == LZ4:
        return lz4.frame.compress(
            data,
            compression_level=LZ4_DEFAULT_LEVEL if level is None else level,
            block_size=lz4.frame.BLOCKSIZE_MAX64KB,
            block_linked=False,        # Kafka requires independent blocks
            content_checksum=False,
            block_checksum=False,
            store_size=False,
        )
    if codec == ZSTD:
        return _zstd_compressor(ZSTD_DEFAULT_LEVEL if level is None else level).compress(data)
    if codec == SNAPPY:
        return _snappy_xerial_compress(data)
    if codec == GZIP:
        # wbits 31 = gzip wrapper; zlib writes mtime 0, so the output is deterministic
        return zlib.compress(data, GZIP_DEFAULT_LEVEL if level is None else level, wbits=31)
    if codec == NONE:
        return bytes(data)
    raise InvalidConfigError(f"unknown compression codec id {codec!r}: expected 0-4")


def _snappy_xerial_compress(data) -> bytes:
    view = memoryview(data)
    parts = [SNAPPY_XERIAL_HEADER]
    pack = _BLOCK_LENGTH.pack
    block_bytes = SNAPPY_XERIAL_BLOCK_BYTES
    for start in range(0, len(view), block_bytes):
        block = snappy.compress(view[start:start + block_bytes])
        parts.append(pack(len(block)))
        parts.append(block)
    return b"".join(parts)


# --- decompress ---------------------------------------------------------------------------

def decompress(codec: int, data) -> bytes:
    """Inverse of `compress`; CorruptRecordError on any bad input or unknown codec."""
    try:
        if codec == LZ4:
            return _lz4_decompress(data)
        if codec == ZSTD:
            return _zstd_decompress(data)
        if codec == SNAPPY:
            return _snappy_decompress(data)
        if codec == GZIP:
            return _gzip_decompress(data)
        if codec == NONE:
            return bytes(data)
    except CorruptRecordError:
        raise
    except Exception as exc:  # each library has its own error types; all mean "corrupt"
        raise CorruptRecordError(
            f"cannot decompress {_NAME_OF[codec]} records: {type(exc).__name__}: {exc}") from exc
    raise CorruptRecordError(f"unknown compression codec id {codec!r} in batch attributes")


def _gzip_decompress(data) -> bytes:
    out = []
    remaining = data
    while True:
        inflater = zlib.decompressobj(wbits=31)
        out.append(inflater.decompress(remaining))
        if not inflater.eof:
            raise CorruptRecordError("cannot decompress gzip records: the stream is truncated")
        remaining = inflater.unused_data
        if not remaining:
            return out[0] if len(out) == 1 else b"".join(out)


def _zstd_decompress(data) -> bytes:
    out = []
    remaining = data
    while True:
        # decompressobj streams, so frames without a content size (zstd-jni's) decode too
        inflater = _contexts.zstd_decompressor.decompressobj()
        out.append(inflater.decompress(remaining))
        if not inflater.eof:
            raise CorruptRecordError("cannot decompress zstd records: the frame is truncated")
        remaining = inflater.unused_data
        if not remaining:
            return out[0] if len(out) == 1 else b"".join(out)


def _snappy_decompress(data) -> bytes:
    view = memoryview(data)
    magic_len = len(SNAPPY_XERIAL_MAGIC)
    if view[:magic_len] != SNAPPY_XERIAL_MAGIC:
        return snappy.decompress(view)  # unframed raw snappy, as xerial's reader accepts
    out = []
    position = 0
    end = len(view)
    header_len = len(SNAPPY_XERIAL_HEADER)
    unpack = _BLOCK_LENGTH.unpack_from
    while position < end:
        if view[position:position + magic_len] == SNAPPY_XERIAL_MAGIC:
            # a stream header: at the start, or where two xerial streams were concatenated
            if end - position < header_len:
                raise CorruptRecordError("cannot decompress snappy records: truncated xerial header")
            version, = unpack(view, position + magic_len)
            if version < SNAPPY_XERIAL_MIN_COMPATIBLE_VERSION:
                raise CorruptRecordError(
                    f"cannot decompress snappy records: xerial stream version {version} is "
                    f"older than {SNAPPY_XERIAL_MIN_COMPATIBLE_VERSION}")
            position += header_len
            continue
        if end - position < 4:
            raise CorruptRecordError(
                f"cannot decompress snappy records: truncated xerial block length at byte {position}")
        block_len, = unpack(view, position)
        position += 4
        if block_len < 0 or block_len > end - position:
            raise CorruptRecordError(
                f"cannot decompress snappy records: xerial block at byte {position - 4} declares "
                f"{block_len} bytes, {end - position} remain")
        out.append(snappy.decompress(view[position:position + block_len]))
        position += block_len
    return b"".join(out)


def check_lz4_frame_header(data) -> None:
    """Refuse an lz4 frame that Kafka's KafkaLZ4BlockInputStream would refuse."""
    if len(data) < 7:
        raise CorruptRecordError(f"cannot decompress lz4 records: {len(data)} bytes is too short for a frame")
    if bytes(data[:4]) != LZ4_FRAME_MAGIC:
        raise CorruptRecordError(
            f"cannot decompress lz4 records: bad frame magic {bytes(data[:4]).hex()}")
    flg = data[4]
    bd = data[5]
    if flg & LZ4_FLG_VERSION_MASK != LZ4_FLG_VERSION_1:
        raise CorruptRecordError(f"lz4 frame version {flg >> 6} is unsupported (Kafka reads version 1)")
    if flg & LZ4_FLG_RESERVED_MASK:
        raise CorruptRecordError(
            f"lz4 frame flags {flg:#04x} set a reserved or dictionary-id bit, which Kafka rejects")
    if not flg & LZ4_FLG_BLOCK_INDEPENDENCE:
        raise CorruptRecordError("lz4 frame uses dependent (linked) blocks, which Kafka rejects")
    block_size_code = (bd >> LZ4_BD_BLOCK_SIZE_SHIFT) & 0x07
    if bd & LZ4_BD_RESERVED_MASK or not 4 <= block_size_code <= 7:
        raise CorruptRecordError(f"lz4 frame block descriptor {bd:#04x} is invalid")


def _lz4_decompress(data) -> bytes:
    check_lz4_frame_header(data)
    inflater = lz4.frame.LZ4FrameDecompressor()
    out = inflater.decompress(data)
    if not inflater.eof:
        raise CorruptRecordError("cannot decompress lz4 records: the frame is truncated")
    if inflater.unused_data:
        # Kafka reads one frame; bytes after it would be silently lost records
        raise CorruptRecordError(
            f"cannot decompress lz4 records: {len(inflater.unused_data)} bytes follow the frame")
    return out

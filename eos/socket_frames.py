"""The socket transport's frames (eos/socket_rpc.py is its client, broker/socket_server.py
its server): encoding and decoding them, and reading them off a connection.

Theory of operation
-------------------
Frames (big-endian): `u32 size` (the bytes after it), `u8 kind`, `u32 correlation id`, then
by kind:
- CALL (client): `u16 method length`, method (`/eos.v1.Broker/Produce`), a metadata block,
  the request's bytes. One call at a time per connection: the answer comes before the next
  CALL is sent. Concurrency comes from more connections (the channel keeps a pool).
- REPLY (server): the response's bytes. STATUS (server): `u8 status code`, a metadata block
  (trailing metadata), the details (UTF-8). A call ends with REPLY or STATUS.
- OPEN (client): like CALL without request bytes: the connection now carries one
  bidirectional stream (ProduceStream) until it closes. MESSAGE (both ways): one message
  of it. HALF_CLOSE (client): no more requests. The stream ends with STATUS.
- REFUSED (server, correlation id 0, the first and only frame of a connection): the port
  serves no more connections now (its `connections_max`); the details (UTF-8) say why, and
  the server closes the connection. Nothing sent on it was handled. The client sends that
  broker's calls over gRPC for a while (eos/socket_routes.py), as after a refused connect:
  a connection the server simply closes cannot be told from one cut by the network, which
  the client retries on the same port.
A metadata block is `u16 count`, then per pair `u16 key length`, key, `u32 value length`,
value (UTF-8 text, or bytes for keys ending in `-bin`, as in gRPC).

Everything here but the readers (`read_frame`, `skip_bytes`, `receive_available`) is pure.
Bytes that are not a frame of this protocol raise FrameError; a frame over the reader's limit
raises FrameTooLarge before its body is read, so the reader may skip it and go on.
"""
from __future__ import annotations

import select
import socket
import struct
import time

import grpc

CALL, REPLY, STATUS, OPEN, MESSAGE, HALF_CLOSE, REFUSED = 1, 2, 3, 4, 5, 6, 7
_KINDS = frozenset((CALL, REPLY, STATUS, OPEN, MESSAGE, HALF_CLOSE, REFUSED))
FRAME_HEAD = struct.Struct(">IBI")         # size of the rest, kind, correlation id
_KIND_AND_ID_BYTES = 5
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_STATUS_HEAD = struct.Struct(">B")
READ_BUFFER_BYTES = 64 * 1024

_CODE_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


class FrameError(Exception):
    """The peer sent bytes that are not a frame of this protocol."""


class ConnectionClosed(Exception):
    """The peer closed the connection (end of file where a frame should begin or go on)."""


class FrameTooLarge(Exception):
    """A frame larger than the reader's limit; its body is still unread."""

    def __init__(self, size: int, limit: int, correlation_id: int = 0):
        super().__init__(f"a message of {size} bytes is over the limit of {limit} bytes")
        self.size = size
        self.limit = limit
        self.correlation_id = correlation_id


# ---- frames ------------------------------------------------------------------------------

def encode_metadata(pairs) -> bytes:
    parts = [_U16.pack(len(pairs))]
    for key, value in pairs:
        key_bytes = key.encode("ascii")
        value_bytes = value if isinstance(value, bytes) else str(value).encode("utf-8")
        parts += (_U16.pack(len(key_bytes)), key_bytes, _U32.pack(len(value_bytes)), value_bytes)
    return b"".join(parts)


def decode_metadata(body, position: int) -> tuple[tuple, int]:
    """The pairs of the metadata block at `position`, and the position after it."""
    try:
        (count,) = _U16.unpack_from(body, position)
        position += 2
        pairs = []
        for _ in range(count):
            (key_length,) = _U16.unpack_from(body, position)
            key = bytes(body[position + 2:position + 2 + key_length]).decode("ascii")
            position += 2 + key_length
            (value_length,) = _U32.unpack_from(body, position)
            value = bytes(body[position + 4:position + 4 + value_length])
            position += 4 + value_length
            if position > len(body):
                raise FrameError("a metadata value runs past the end of its frame")
            pairs.append((key, value if key.endswith("-bin") else value.decode("utf-8")))
    except (struct.error, UnicodeDecodeError) as exc:
        raise FrameError(f"a malformed metadata block: {exc}") from None
    return tuple(pairs), position


def frame(kind: int, correlation_id: int, *parts: bytes) -> bytes:
    size = _KIND_AND_ID_BYTES + sum(len(part) for part in parts)
    return b"".join((FRAME_HEAD.pack(size, kind, correlation_id), *parts))


def call_frame(kind: int, correlation_id: int, method: str, metadata, payload: bytes = b"") -> bytes:
    """A CALL (with the request's bytes) or an OPEN (without)."""
    method_bytes = method.encode("ascii")
    return frame(kind, correlation_id, _U16.pack(len(method_bytes)), method_bytes,
                 encode_metadata(metadata or ()), payload)


def decode_call(body) -> tuple[str, tuple, memoryview]:
    """(method, metadata, request bytes) of a CALL or OPEN frame's body."""
    try:
        (method_length,) = _U16.unpack_from(body, 0)
        method = bytes(body[2:2 + method_length]).decode("ascii")
    except (struct.error, UnicodeDecodeError) as exc:
        raise FrameError(f"a malformed call frame: {exc}") from None
    metadata, position = decode_metadata(body, 2 + method_length)
    return method, metadata, memoryview(body)[position:]


def status_frame(correlation_id: int, code: grpc.StatusCode, details: str, trailing=()) -> bytes:
    return frame(STATUS, correlation_id, _STATUS_HEAD.pack(code.value[0]), encode_metadata(trailing or ()),
                 (details or "").encode("utf-8"))


def refused_frame(details: str) -> bytes:
    """What a server at its connections_max sends before it closes a new connection."""
    return frame(REFUSED, 0, details.encode("utf-8"))


def decode_status(body) -> tuple[grpc.StatusCode, str, tuple]:
    try:
        (number,) = _STATUS_HEAD.unpack_from(body, 0)
    except struct.error as exc:
        raise FrameError(f"a malformed status frame: {exc}") from None
    trailing, position = decode_metadata(body, 1)
    return (_CODE_BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN),
            bytes(body[position:]).decode("utf-8", "replace"), trailing)


def _body_size(size: int, kind: int, correlation_id: int, size_max: int) -> int:
    """The body's size of a frame whose head says `size` and `kind`; FrameError if no frame
    of this protocol has that head, FrameTooLarge over `size_max`."""
    if kind not in _KINDS:
        # before the size: another protocol's bytes (an HTTP/2 preface, "GET /") would
        # otherwise read as a frame of a gigabyte, waited for forever
        raise FrameError(f"not a frame of this protocol (kind {kind}): another protocol's client?")
    if size < _KIND_AND_ID_BYTES:
        raise FrameError(f"a frame of {size} bytes is shorter than its own header")
    body_size = size - _KIND_AND_ID_BYTES
    if body_size > size_max:
        raise FrameTooLarge(body_size, size_max, correlation_id)
    return body_size


def read_frame(reader, size_max: int) -> tuple[int, int, bytes]:
    """(kind, correlation id, body) of the next frame from a buffered binary reader.
    ConnectionClosed at the end of the stream; FrameTooLarge (body unread) over `size_max`."""
    head = reader.read(FRAME_HEAD.size)
    if len(head) < FRAME_HEAD.size:
        raise ConnectionClosed("the connection was closed" if not head else "the connection closed mid-frame")
    size, kind, correlation_id = FRAME_HEAD.unpack(head)
    body_size = _body_size(size, kind, correlation_id, size_max)
    body = reader.read(body_size) if body_size else b""
    if len(body) < body_size:
        raise ConnectionClosed("the connection closed mid-frame")
    return kind, correlation_id, body


def split_frames(buffer: bytearray, size_max: int) -> list[tuple[int, int, bytes]]:
    """Take the whole frames at the front of `buffer` (bytes as they came off a connection)
    out of it, as (kind, correlation id, body); a frame still arriving stays. FrameError or
    FrameTooLarge as `read_frame`."""
    frames = []
    position = 0
    head_size = FRAME_HEAD.size
    while len(buffer) - position >= head_size:
        size, kind, correlation_id = FRAME_HEAD.unpack_from(buffer, position)
        body_size = _body_size(size, kind, correlation_id, size_max)
        end = position + head_size + body_size
        if end > len(buffer):
            break
        frames.append((kind, correlation_id, bytes(buffer[position + head_size:end])))
        position = end
    del buffer[:position]
    return frames


def skip_bytes(reader, count: int) -> None:
    """Read and drop `count` bytes (an oversized frame's body), so the connection goes on."""
    while count > 0:
        chunk = reader.read(min(count, READ_BUFFER_BYTES))
        if not chunk:
            raise ConnectionClosed("the connection closed mid-frame")
        count -= len(chunk)


def send_within(sock: socket.socket, data, timeout_s: float | None) -> None:
    """Send all of `data` on a blocking socket (one without a timeout): in one system call
    when its buffer has room, the usual case; else as room appears, within `timeout_s`
    (None: no limit), raising socket.timeout past it -- a peer that stops reading cannot
    hold the sender longer. Why not settimeout() and sendall(): on a socket with a timeout
    Python polls before each send and recv, and setting the mode is a system call too; each
    of them gives up the GIL. (Measured under a scratch e2e at 1,000 records/s: 2-4% less
    CPU per record on both sides. The send itself stays the costly part: 150-190 us at the
    median for a Fetch on a busy 2-core host.)"""
    view = memoryview(data)
    deadline = None
    while view:
        try:
            view = view[sock.send(view, socket.MSG_DONTWAIT):]
            continue
        except BlockingIOError:
            pass
        if timeout_s is None:
            wait_for(sock.fileno(), select.POLLOUT, None)
            continue
        if deadline is None:
            deadline = time.monotonic() + timeout_s
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not wait_for(sock.fileno(), select.POLLOUT, remaining):
            raise socket.timeout(f"no room to send in {timeout_s:g} s: the peer is not reading")


def wait_for(fd: int, events: int, timeout_s: float | None) -> bool:
    """Sleep until `fd` has one of `events` (select.POLLIN, POLLOUT), or is closed or in
    error, or `timeout_s` passes (None: no limit); True unless the time ran out. poll(), not
    select(): a process with more than 1,024 files open (a broker's segments) has
    descriptors select() cannot take."""
    poller = select.poll()
    poller.register(fd, events)
    return bool(poller.poll(None if timeout_s is None else max(0.0, timeout_s) * 1000))


def receive_available(sock: socket.socket, inbox: bytearray) -> BaseException | None:
    """Append what the connection has to `inbox`, without waiting (a blocking socket: a
    socket with a timeout would wait inside recv). None, or why the connection is over
    (end of file, OSError): the whole frames read before it are still good."""
    try:
        while True:
            try:
                chunk = sock.recv(READ_BUFFER_BYTES, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            if not chunk:
                return ConnectionClosed("the connection was closed" if not inbox else
                                        "the connection closed mid-frame")
            inbox += chunk
            if len(chunk) < READ_BUFFER_BYTES:
                return None       # drained: spare the call that would say so
    except OSError as exc:
        return exc

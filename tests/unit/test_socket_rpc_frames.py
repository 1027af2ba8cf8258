"""The frames of the socket transport (eos/socket_frames.py): what is written reads back the
same, and bytes that are not a frame are refused with a clear error."""
import io

import grpc
import pytest

from eos.socket_frames import (CALL, OPEN, REPLY, STATUS, ConnectionClosed, FrameError, FrameTooLarge, call_frame,
                               decode_call, decode_metadata, decode_status, encode_metadata, frame, read_frame,
                               skip_bytes, split_frames, status_frame)


def _read(data: bytes, size_max: int = 1 << 20):
    return read_frame(io.BufferedReader(io.BytesIO(data)), size_max)


def test_a_call_frame_reads_back_its_method_metadata_and_request():
    metadata = (("client-id", "pipeline-1"), ("trace-bin", b"\x00\xffraw"), ("empty", ""))
    data = call_frame(CALL, 7, "/eos.v1.Broker/Produce", metadata, b"\x08\x01request")
    kind, correlation_id, body = _read(data)
    assert (kind, correlation_id) == (CALL, 7)
    method, read_metadata, payload = decode_call(body)
    assert method == "/eos.v1.Broker/Produce"
    assert read_metadata == metadata
    assert bytes(payload) == b"\x08\x01request"


def test_an_open_frame_has_no_request_bytes_and_metadata_may_be_none():
    kind, _, body = _read(call_frame(OPEN, 0, "/eos.v1.Broker/ProduceStream", None))
    assert kind == OPEN
    assert decode_call(body)[:2] == ("/eos.v1.Broker/ProduceStream", ())
    assert bytes(decode_call(body)[2]) == b""


def test_a_status_frame_carries_code_details_and_trailing_metadata():
    trailing = (("eos-produce-stream-refused", "resource_exhausted"),)
    kind, correlation_id, body = _read(status_frame(3, grpc.StatusCode.RESOURCE_EXHAUSTED, "too many — ünïcode",
                                                    trailing))
    assert (kind, correlation_id) == (STATUS, 3)
    assert decode_status(body) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "too many — ünïcode", trailing)


@pytest.mark.parametrize("code", list(grpc.StatusCode))
def test_every_grpc_status_code_survives_the_trip(code):
    assert decode_status(_read(status_frame(0, code, "x"))[2])[0] is code


def test_frames_back_to_back_are_read_one_at_a_time():
    stream = io.BufferedReader(io.BytesIO(frame(REPLY, 1, b"a") + frame(REPLY, 2, b"") + frame(REPLY, 3, b"ccc")))
    assert [read_frame(stream, 100) for _ in range(3)] == [(REPLY, 1, b"a"), (REPLY, 2, b""), (REPLY, 3, b"ccc")]
    with pytest.raises(ConnectionClosed, match="was closed"):
        read_frame(stream, 100)


def test_a_frame_cut_short_is_a_closed_connection_not_a_short_message():
    data = frame(REPLY, 1, b"0123456789")
    for cut in (2, 9, len(data) - 1):
        with pytest.raises(ConnectionClosed):
            _read(data[:cut])


def test_a_frame_over_the_limit_is_refused_before_its_body_is_read_and_can_be_skipped():
    stream = io.BufferedReader(io.BytesIO(frame(REPLY, 1, b"x" * 100) + frame(REPLY, 2, b"next")))
    with pytest.raises(FrameTooLarge) as refused:
        read_frame(stream, 99)
    assert (refused.value.size, refused.value.limit, refused.value.correlation_id) == (100, 99, 1)
    skip_bytes(stream, refused.value.size)
    assert read_frame(stream, 99) == (REPLY, 2, b"next")


def test_a_size_shorter_than_the_header_is_not_a_frame():
    with pytest.raises(FrameError, match="shorter than its own header"):
        _read(b"\x00\x00\x00\x02\x01\x00\x00\x00\x00")


@pytest.mark.parametrize("body", [
    b"",                                     # no method length
    b"\x00\x05ab",                           # method runs past the end
    b"\x00\x01a\x00\x01\x00\x01k\x00\x00\x00\x09v",   # metadata value runs past the end
    b"\x00\x01a\x00\x01\x00\x01\xff\x00\x00\x00\x00",  # a key that is not ASCII
])
def test_a_malformed_call_body_is_a_frame_error(body):
    with pytest.raises(FrameError):
        decode_call(body)


def test_metadata_blocks_follow_each_other():
    data = encode_metadata((("a", "1"),)) + encode_metadata((("b", "2"), ("c", "3")))
    first, position = decode_metadata(data, 0)
    second, end = decode_metadata(data, position)
    assert (first, second, end) == ((("a", "1"),), (("b", "2"), ("c", "3")), len(data))


@pytest.mark.parametrize("garbage", [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"])
def test_another_protocols_bytes_are_refused_at_once_not_read_as_a_huge_frame(garbage):
    with pytest.raises(FrameError, match="not a frame of this protocol"):
        _read(garbage)


def test_split_frames_takes_the_whole_frames_and_keeps_one_still_arriving():
    first, second = frame(REPLY, 1, b"one"), status_frame(2, grpc.StatusCode.OK, "done")
    third = frame(REPLY, 3, b"three" * 100)
    buffer = bytearray(first + second + third[:9])
    frames = split_frames(buffer, 1 << 20)
    assert [(kind, correlation_id) for kind, correlation_id, _ in frames] == [(REPLY, 1), (STATUS, 2)]
    assert frames[0][2] == b"one" and decode_status(frames[1][2])[1] == "done"
    assert bytes(buffer) == third[:9]                      # the head of a frame still arriving
    assert split_frames(buffer, 1 << 20) == []             # nothing whole yet: nothing taken
    buffer += third[9:]
    assert split_frames(buffer, 1 << 20) == [(REPLY, 3, b"three" * 100)] and not buffer


def test_split_frames_refuses_what_read_frame_refuses():
    with pytest.raises(FrameError):
        split_frames(bytearray(b"GET / HTTP/1.1\r\n\r\n"), 1 << 20)
    with pytest.raises(FrameTooLarge):
        split_frames(bytearray(frame(REPLY, 7, b"x" * 100)[:12]), 50)   # refused on its head alone

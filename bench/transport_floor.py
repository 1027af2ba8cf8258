"""What one round trip costs before eos does anything: Python gRPC's own floor on this
machine, beside eos's produce round trip, at the same paced rate.

    .venv/bin/python -m bench.transport_floor [--rate 1000] [--count 3000] [--repeats 3]

Theory of operation
-------------------
eos trails Kafka on the rows a round trip decides (produce latency, commit latency). This
bench separates what gRPC itself costs here from what eos adds to it. Seven paths are timed
one after the other, each `--count` round trips paced at `--rate` a second (after a warm-up
of a tenth as many), `--repeats` times, in this order each round:

- `grpc unary echo`: a 100-byte unary call to a server that returns the request. The server
  is a child process running grpc.server with a thread pool, as the broker does; nothing of
  eos is imported on either side.
- `grpc stream echo`: the same 100 bytes as one message on a long-lived bidi stream, the
  client waiting for the echo before the next (the shape of ProduceStream).
- `tcp stream echo`: the same 100 bytes, length-prefixed, on a plain TCP connection to the
  same child (a thread per connection echoes each frame); on the client a reader thread
  takes the echoes and hands them to the waiting thread, the shape a produce stream would
  have over a socket instead of gRPC: the difference to `grpc stream echo` is what gRPC
  itself costs here.
- `eos ProduceStream, raw (gRPC)`: a pre-built one-record ProduceRequest (acks=1) on a bidi
  stream to an eos broker process: the broker's whole produce path, no eos client.
- `eos Producer send -> ack (gRPC)`: eos.Producer (acks=all, idempotent, linger 0) send() to
  the future's completion: what the `latency` workload measures, here at the same pace.
  These two run against a broker with the socket transport turned off
  (`socket.transport.port=-1`).
- the same two against a second broker with `socket.transport.port` (eos/socket_rpc.py, the
  default): the raw stream on the socket port, and a Producer that finds the port in Metadata.

For each: p50 and p99 of the round trip, and the CPU time the client and the server
process used per round trip (from /proc, so gRPC's own C threads count too). Kafka is not
run: it is the reference the `latency` workload already measures (its produce latency p50
was 0.43-0.68 ms here), and a Kafka round trip has no gRPC in it.
Output: one JSON object on stdout (`--json-only` for it alone), then a table.
"""
from __future__ import annotations

import argparse
import os
import queue
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

import grpc

from bench.eos_server import EosBroker
from bench.kafka import free_port, port_accepts
from bench.report import print_results, text_table

ECHO_SERVICE = "bench.Echo"
VALUE = b"v" * 100
SERVER_START_TIMEOUT_S = 30.0
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _identity(payload: bytes) -> bytes:
    return payload


FRAME_HEADER = struct.Struct(">I")      # a TCP echo frame: big-endian length, then the bytes


def _read_exactly(connection: socket.socket, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = connection.recv(remaining)
        if not chunk:
            raise EOFError("the connection closed")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _read_frame(connection: socket.socket) -> bytes:
    (size,) = FRAME_HEADER.unpack(_read_exactly(connection, FRAME_HEADER.size))
    return _read_exactly(connection, size)


def _serve_tcp_echo(listener: socket.socket) -> None:
    def echo(connection: socket.socket) -> None:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with connection:
            try:
                while True:
                    frame = _read_frame(connection)
                    connection.sendall(FRAME_HEADER.pack(len(frame)) + frame)
            except (EOFError, OSError):
                return

    while True:
        connection, _ = listener.accept()
        threading.Thread(target=echo, args=(connection,), daemon=True).start()


def serve_echo(port: int, tcp_port: int) -> None:
    """The child process: unary and bidi gRPC echo on 127.0.0.1:`port`, TCP frame echo on
    127.0.0.1:`tcp_port`, until killed."""
    from concurrent import futures

    listener = socket.create_server(("127.0.0.1", tcp_port))
    threading.Thread(target=_serve_tcp_echo, args=(listener,), daemon=True).start()

    def echo_stream(requests, _context):
        for request in requests:
            yield request

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(ECHO_SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(lambda request, _context: request, _identity, _identity),
        "Stream": grpc.stream_stream_rpc_method_handler(echo_stream, _identity, _identity),
    }),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S


class StreamRoundTrip:
    """One bidi stream on which each call sends a message and waits for the answer."""

    def __init__(self, multi_callable):
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        open_direct = getattr(multi_callable, "open", None)     # the socket transport's stream
        if open_direct is not None:
            self._call = open_direct()
            self._send = self._call.send
        else:
            self._call = multi_callable(iter(self._requests.get, None))
            self._send = self._requests.put

    def __call__(self, message):
        self._send(message)
        return next(self._call)

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()


class TcpRoundTrip:
    """One TCP connection: each call sends a frame and waits for its echo, which a reader
    thread takes off the socket (as a stream's reader would)."""

    def __init__(self, port: int):
        self._socket = socket.create_connection(("127.0.0.1", port))
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._answers: queue.SimpleQueue = queue.SimpleQueue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            while True:
                self._answers.put(_read_frame(self._socket))
        except (EOFError, OSError) as exc:
            self._answers.put(exc)

    def __call__(self, message: bytes) -> bytes:
        self._socket.sendall(FRAME_HEADER.pack(len(message)) + message)
        answer = self._answers.get()
        if isinstance(answer, BaseException):
            raise RuntimeError(f"the TCP echo failed: {answer!r}")
        return answer

    def close(self) -> None:
        try:
            self._socket.shutdown(socket.SHUT_RDWR)   # wakes the reader's recv (close alone does not)
        except OSError:
            pass
        self._socket.close()
        self._reader.join(5)


def paced(round_trip, *, rate_per_s: int, count: int, server_pid: int) -> dict:
    """`count` round trips at `rate_per_s` after a warm-up; latencies and CPU per round trip."""
    for _ in range(max(1, count // 10)):
        round_trip()
    latencies_s = []
    client_cpu_before, server_cpu_before = process_cpu_s(os.getpid()), process_cpu_s(server_pid)
    start = time.perf_counter()
    for index in range(count):
        delay_s = start + index / rate_per_s - time.perf_counter()
        if delay_s > 0:
            time.sleep(delay_s)
        sent = time.perf_counter()
        round_trip()
        latencies_s.append(time.perf_counter() - sent)
    client_cpu = process_cpu_s(os.getpid()) - client_cpu_before
    server_cpu = process_cpu_s(server_pid) - server_cpu_before
    latencies_s.sort()
    return {"p50_ms": latencies_s[len(latencies_s) // 2] * 1000,
            "p99_ms": latencies_s[int(len(latencies_s) * 0.99)] * 1000,
            "client_cpu_us": client_cpu / count * 1e6, "server_cpu_us": server_cpu / count * 1e6}


def echo_paths(port: int, tcp_port: int) -> tuple[dict, object]:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    tcp = TcpRoundTrip(tcp_port)
    unary = channel.unary_unary(f"/{ECHO_SERVICE}/Unary", request_serializer=_identity,
                                response_deserializer=_identity)
    stream = StreamRoundTrip(channel.stream_stream(f"/{ECHO_SERVICE}/Stream", request_serializer=_identity,
                                                   response_deserializer=_identity))
    def close() -> None:
        stream.close()
        channel.close()
        tcp.close()

    return {"grpc unary echo": lambda: unary(VALUE), "grpc stream echo": lambda: stream(VALUE),
            "tcp stream echo": lambda: tcp(VALUE)}, close


def eos_paths(bootstrap: str, round_index: int, socket_port: int | None = None) -> tuple[dict, object]:
    """The raw ProduceStream and the Producer's send -> ack on the broker at `bootstrap`:
    over gRPC, or, with `socket_port`, over the broker's socket port (the Producer finds it
    in Metadata)."""
    import eos
    from bench.workloads.clients import eos_create_topic
    from eos.records.codec import encode_batch
    from eos.socket_rpc import SocketChannel
    from eos.v1 import broker_pb2, broker_pb2_grpc

    over = "socket" if socket_port else "gRPC"
    raw_topic, producer_topic = f"transport-raw-{round_index}", f"transport-producer-{round_index}"
    eos_create_topic(bootstrap, raw_topic)
    eos_create_topic(bootstrap, producer_topic)
    channel = SocketChannel("127.0.0.1", socket_port) if socket_port else grpc.insecure_channel(bootstrap)
    stream = StreamRoundTrip(broker_pb2_grpc.BrokerStub(channel).ProduceStream)
    records = encode_batch([VALUE])
    correlation_ids = iter(range(1 << 30))

    def raw_produce() -> None:
        answer = stream(broker_pb2.ProduceRequest(acks=1, timeout_ms=30_000, correlation_id=next(correlation_ids),
                                                  partitions=[broker_pb2.PartitionRecords(
                                                      topic=raw_topic, partition=0, records=records)]))
        if answer.partitions[0].error_code:
            raise RuntimeError(f"raw produce failed: {answer.partitions[0].error_message}")

    producer = eos.Producer(bootstrap, acks="all", enable_idempotence=True, linger_ms=0)

    def close() -> None:
        producer.close()
        stream.close()
        channel.close()

    return {f"eos ProduceStream, raw ({over})": raw_produce,
            f"eos Producer send -> ack ({over})": lambda: producer.send(producer_topic, value=VALUE).result()}, close


def measure(rate_per_s: int, count: int, repeats: int) -> dict:
    runs: dict[str, list[dict]] = {}
    port, tcp_port = free_port(), free_port()
    echo_server = subprocess.Popen([sys.executable, "-m", "bench.transport_floor", "--serve", str(port),
                                    "--serve-tcp", str(tcp_port)])
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not (port_accepts("127.0.0.1", port) and port_accepts("127.0.0.1", tcp_port)):
            if echo_server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the echo server did not start")
            time.sleep(0.05)
        socket_port = free_port()
        with EosBroker(extra_args=("--config", "socket.transport.port=-1")) as broker, EosBroker(
                extra_args=("--config", f"socket.transport.port={socket_port}")) as socket_broker:
            for round_index in range(repeats):
                print(f"round {round_index + 1} of {repeats}", file=sys.stderr, flush=True)
                for open_paths, server_pid in (
                        (lambda: echo_paths(port, tcp_port), echo_server.pid),
                        (lambda: eos_paths(broker.bootstrap, round_index), broker.proc.pid),
                        (lambda: eos_paths(socket_broker.bootstrap, round_index, socket_port), socket_broker.proc.pid)):
                    paths, close = open_paths()
                    try:
                        for name, round_trip in paths.items():
                            runs.setdefault(name, []).append(
                                paced(round_trip, rate_per_s=rate_per_s, count=count, server_pid=server_pid))
                    finally:
                        close()
    finally:
        echo_server.kill()
        echo_server.wait()
    return {"rate_per_s": rate_per_s, "count": count, "repeats": repeats,
            "paths": {name: {key: round(statistics.median(run[key] for run in path_runs), 3)
                             for key in path_runs[0]} | {"runs": path_runs}
                      for name, path_runs in runs.items()}}


def _table(results: dict) -> str:
    rows = [("path", "p50 ms", "p99 ms", "client CPU us", "server CPU us")]
    for name, figures in results["paths"].items():
        rows.append((name, f"{figures['p50_ms']:.3f}", f"{figures['p99_ms']:.3f}",
                     f"{figures['client_cpu_us']:.0f}", f"{figures['server_cpu_us']:.0f}"))
    lines = text_table(rows)
    lines.append(f"({results['count']:,} round trips at {results['rate_per_s']:,}/s, median of "
                 f"{results['repeats']} runs; CPU per round trip, every thread of the process)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transport_floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=1000, help="round trips a second (paced)")
    parser.add_argument("--count", type=int, default=3000, help="round trips per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)   # the echo server child
    parser.add_argument("--serve-tcp", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve_echo(args.serve, args.serve_tcp)
        return 0
    results = measure(args.rate, args.count, args.repeats)
    print_results(results, _table(results), args.json_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())

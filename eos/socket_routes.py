"""Which brokers a client reaches over their socket port, and its channels there.

Theory of operation
-------------------
A broker with socket.transport.port names the port in Metadata (`BrokerNode.socket_port`;
eos/socket_rpc.py). `SocketRoutes` is the one owner of what a client knows of those ports:
the port of each broker address Metadata named, the `SocketChannel` made to each, and the
addresses left to gRPC for a while because their port refused a connection. The client's
`ClusterMetadata` (eos/net.py) asks it for a channel when it builds a stub, and hands it
every Metadata answer; both the answer (`learn`) and a refusal (`unreachable`) tell it which
addresses' stubs it must build again.

- `socket_ports_of` (pure) reads the ports out of a Metadata answer. A single broker that the
  client reaches at its one bootstrap address (ClusterMetadata.address_of) gets its port
  there too, but only when that address is the broker's own (`same_endpoint`): a bootstrap
  address that is a proxy or tunnel in front of the broker keeps every call, since the
  socket would go around it.
- A port that refuses a connection sends that address back to gRPC for SOCKET_RETRY_MS,
  until the first Metadata answer after that (the broker may be down, or its port not
  reachable from here while its gRPC port is).
- When a broker's port changes (a restart on a free port), its old channel is closed.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

SOCKET_RETRY_MS = 30_000
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def same_endpoint(address: str, host: str, port: int) -> bool:
    """Is `address` (host:port as the client was given it) the broker's advertised
    host:port: the same port, and the same host or both loopback names (no lookup)."""
    given_host, _, given_port = address.rpartition(":")
    if not given_port.isdigit() or int(given_port) != port:
        return False
    given_host = given_host.strip("[]").lower()
    host = host.strip("[]").lower()
    return given_host == host or (given_host in _LOOPBACK_NAMES and host in _LOOPBACK_NAMES)


def socket_ports_of(brokers, bootstrap_addresses) -> dict[str, int]:
    """gRPC address -> socket port of the brokers of a Metadata answer (see the module doc)."""
    ports = {f"{b.host}:{b.port}": b.socket_port for b in brokers if b.socket_port > 0}
    if (len(brokers) == 1 and len(bootstrap_addresses) == 1 and brokers[0].socket_port > 0
            and same_endpoint(bootstrap_addresses[0], brokers[0].host, brokers[0].port)):
        ports[bootstrap_addresses[0]] = brokers[0].socket_port
    return ports


class SocketRoutes:
    """A client's socket ports and channels; see the module doc. `on_unreachable(address)`
    is told when an address goes back to gRPC (its stubs are to be made again)."""

    def __init__(self, on_unreachable: Callable[[str], None], now_ms_fn: Callable[[], int] = _monotonic_ms):
        self._on_unreachable = on_unreachable
        self._now_ms = now_ms_fn
        self._lock = threading.Lock()
        self._ports: dict[str, int] = {}             # gRPC address -> socket port
        self._channels: dict[str, object] = {}       # gRPC address -> SocketChannel
        self._down_until_ms: dict[str, int] = {}     # gRPC address -> on gRPC until then
        self._closed = False

    @property
    def ports(self) -> dict[str, int]:
        return dict(self._ports)

    @property
    def channel_count(self) -> int:
        return len(self._channels)

    def is_down(self, address: str) -> bool:
        return address in self._down_until_ms

    def channel(self, address: str, fallback: Callable[[str], object]):
        """The SocketChannel to `address`, or None: no port named, or back on gRPC for now.
        `fallback(address)` gives the gRPC channel the socket channel hands the calls it
        does not carry. Raises ClosedError once closed."""
        port = self._ports.get(address)
        if not port:
            return None
        down_until_ms = self._down_until_ms.get(address)
        if down_until_ms is not None:
            if self._now_ms() < down_until_ms:
                return None
            self._down_until_ms.pop(address, None)
        channel = self._channels.get(address)
        if channel is not None and channel.address[1] == port:
            return channel
        from eos.socket_rpc import SocketChannel
        grpc_channel = fallback(address)
        replaced = None
        with self._lock:
            if self._closed:
                raise ClosedError("client is closed")
            channel = self._channels.get(address)
            if channel is None or channel.address[1] != port:
                replaced = channel
                host = address.rsplit(":", 1)[0].strip("[]")
                channel = self._channels[address] = SocketChannel(
                    host, port, grpc_channel, on_unreachable=lambda: self.unreachable(address))
        if replaced is not None:
            replaced.close()
        return channel

    def unreachable(self, address: str) -> None:
        """The port of `address` refused a connection: gRPC for SOCKET_RETRY_MS."""
        with self._lock:
            self._down_until_ms[address] = self._now_ms() + SOCKET_RETRY_MS
        self._on_unreachable(address)

    def learn(self, brokers, bootstrap_addresses) -> set[str]:
        """Take a Metadata answer's brokers; the addresses whose stubs are to be made again
        (their port appeared, changed or went, or their time on gRPC is over)."""
        ports = socket_ports_of(brokers, bootstrap_addresses)
        now = self._now_ms()
        with self._lock:
            retry = {a for a, until_ms in self._down_until_ms.items() if until_ms <= now}
            for address in retry:
                del self._down_until_ms[address]
            changed = retry | {a for a in set(ports) | set(self._ports) if ports.get(a) != self._ports.get(a)}
            self._ports = ports
        return changed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
        for channel in channels:
            channel.close()


class ClosedError(Exception):
    """The client was closed: no channel is made any more."""

"""The values the cluster's metadata is made of, shared by the ZooKeeper store, the
controller's core and the brokers' metadata cache (one definition each)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


def format_host_port(host: str, port: int) -> str:
    """host:port, an IPv6 host in brackets ([::1]:9092)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ListenerEndpoint(NamedTuple):
    """One listener of a registered broker, as Kafka's registration lists it
    (`endpoints` plus `listener_security_protocol_map`)."""

    name: str                   # PLAINTEXT, SSL, SASL_SSL, or a mapped name such as INTERNAL
    security_protocol: str      # PLAINTEXT, SSL or SASL_SSL
    host: str
    port: int


@dataclass(frozen=True)
class BrokerInfo:
    """A registered broker: where it listens, its rack, and its broker epoch (the czxid of
    its /brokers/ids znode; -1 when not read from ZooKeeper). `host`/`port` are its
    inter-broker listener's; `endpoints` every listener's (empty: the one PLAINTEXT
    listener at host:port, as a registration without endpoints means); `socket_port` its
    socket.transport.port on its PLAINTEXT listener's host (0: none; eos/socket_rpc.py)."""

    broker_id: int
    host: str
    port: int
    rack: str | None = None
    epoch: int = -1
    endpoints: tuple[ListenerEndpoint, ...] = ()
    socket_port: int = 0

    def endpoint(self, listener_name: str | None) -> tuple[str, int] | None:
        """host and port of the broker's listener `listener_name` (None: the inter-broker
        one); None when the broker has no such listener -- Kafka leaves such a broker out
        of the Metadata a client on that listener sees."""
        if listener_name is None or not self.endpoints:
            return self.host, self.port
        for endpoint in self.endpoints:
            if endpoint.name == listener_name:
                return endpoint.host, endpoint.port
        return None


@dataclass(frozen=True)
class LeaderIsr:
    """A partition's state znode: leader (-1: none), leader epoch, ISR, and the epoch of the
    controller that wrote it."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int

"""Client plumbing shared by Producer, Consumer and Admin: channels and cluster metadata.

Theory of operation
-------------------
A client is given a bootstrap string, ``"host:port[,host:port...]"``. `parse_bootstrap`
checks it. Every gRPC channel is made by `open_channel` with the same options: 100 MiB
messages both ways (a fetch response may carry many batches), keepalive pings so a dead
broker is noticed while a long poll waits, and a channel-local subchannel pool so two
clients in one process get two connections (gRPC would otherwise share one TCP connection
between channels to the same address, and one client's bulk traffic would queue behind
the other's).

Security: a client's settings (eos/client_config.py) give a `ChannelSecurity`, which
`ClusterMetadata` passes to every `open_channel`, so each broker connection of a client is
secured alike. A TLS handshake that fails shows up in gRPC as UNAVAILABLE, like a broker
that is down, so the client's error says so when the client uses SSL.

`ClusterMetadata` is the one owner of what a client knows about the cluster: the brokers
(node id -> address) and, per topic, the partition count and the leader of each
partition. It learns them from the Metadata RPC, asked of the bootstrap addresses and then
of the brokers an answer named, in turn (`any_broker_addresses`): what any broker can answer
(Metadata, FindCoordinator, InitProducerId without an id, most admin calls) is asked of the
one that answered last, and a call that fails on the network moves to the next, so a client
given one broker's address outlives that broker, as Kafka's clients do.
Lookups read an immutable snapshot without a lock (the snapshot is replaced whole on each
refresh, never mutated); refreshes serialise on a lock and back off exponentially between
failed attempts (retry.backoff.ms doubling up to retry.backoff.max.ms, as Kafka's clients).

Leader addresses: a broker advertises the address it listens on. When the bootstrap names
exactly one address and the cluster has exactly one broker, that broker is reached through
the bootstrap channel whatever it advertises; so a client pointed at a proxy, a tunnel or
a NAT address keeps using it (the tests' fault-injecting proxy relies on this). With
several brokers each is reached at its advertised address, as in Kafka.
"""
from __future__ import annotations

import random
import threading
import time
from typing import Iterable, NamedTuple

import grpc

from eos.errors import (
    EosError,
    ErrorCode,
    NetworkError,
    RequestTimedOutError,
    SaslAuthenticationError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
    error_for,
    reaction_for,
    Reaction,
)
from eos.client_config import PLAINTEXT_SECURITY, ChannelSecurity
from eos.socket_routes import ClosedError as SocketRoutesClosed, SocketRoutes, same_endpoint
from eos.v1 import broker_pb2, broker_pb2_grpc, group_pb2, group_pb2_grpc, txn_pb2_grpc


# The gRPC metadata key a client's client.id travels in (Kafka's request header field): the
# group coordinator and the client quotas read it.
CLIENT_ID_METADATA_KEY = "client-id"
# Starts the RESOURCE_EXHAUSTED message of a call a broker refused under a request_percentage
# quota without running it: the client retries it after its backoff.
THROTTLED_MARK = "[throttled]"


# Kafka's AdminUtils.AdminClientId: the one client.id whose Produce may write the internal
# topics (__consumer_offsets, __transaction_state), which belong to the coordinators; a
# transaction coordinator running in a process of its own writes its log with it.
ADMIN_CLIENT_ID = "__admin_client"


def client_id_metadata(client_id: str) -> tuple:
    """The call metadata that names `client_id` (none for an empty one)."""
    return ((CLIENT_ID_METADATA_KEY, client_id),) if client_id else ()


MESSAGE_BYTES_MAX = 100 * 1024 * 1024
# 6 minutes: above gRPC servers' default minimum ping interval without data (5 minutes),
# so a stock server never answers our pings with GOAWAY "too_many_pings".
KEEPALIVE_TIME_MS = 360_000
KEEPALIVE_TIMEOUT_MS = 20_000

CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.use_local_subchannel_pool", 1),
)

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
RETRY_BACKOFF_MS_DEFAULT = 100
RETRY_BACKOFF_MAX_MS_DEFAULT = 1000
METADATA_MAX_AGE_MS_DEFAULT = 300_000
REQUEST_TIMEOUT_MS_DEFAULT = 30_000
NO_LEADER = -1


def now_ms() -> int:
    return int(time.monotonic() * 1000)


def parse_bootstrap(bootstrap) -> list[str]:
    """``"host:port[,host:port]"`` (or a list of such strings) -> ["host:port", ...]."""
    if isinstance(bootstrap, str):
        items = bootstrap.split(",")
    elif isinstance(bootstrap, (list, tuple)):
        items = list(bootstrap)
    else:
        raise TypeError(f"bootstrap must be a string 'host:port[,host:port]', got {type(bootstrap).__name__}")
    addresses = []
    for raw in items:
        if not isinstance(raw, str):
            raise TypeError(f"bootstrap address must be a string, got {type(raw).__name__}")
        item = raw.strip()
        host, sep, port_text = item.rpartition(":")
        if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"bootstrap address {raw!r} is not host:port with a port in 1..65535 "
                             f"(in bootstrap {bootstrap!r})")
        addresses.append(f"{host}:{int(port_text)}")
    if not addresses:
        raise ValueError("bootstrap names no address")
    return addresses


# ---- reaching the cluster ---------------------------------------------------------------------

TLS_PROBE_TIMEOUT_S = 10.0


def any_broker_addresses(bootstrap_addresses: list[str], brokers: dict[int, str]) -> list[str]:
    """Where a client asks what any broker answers (Metadata, FindCoordinator, an admin
    call): its bootstrap addresses, then every broker the last Metadata named that is not
    one of them (by node id). Kafka's clients use the bootstrap list only to find the
    cluster; after that any live broker will do. So a client given one broker's address
    still works when that broker dies, from the brokers it has learned of. One bootstrap
    address and a cluster of one broker: only the bootstrap address (it may be a proxy or
    tunnel in front of the broker, whose own address is not reachable; see `address_of`)."""
    if len(bootstrap_addresses) == 1 and len(brokers) <= 1:
        return list(bootstrap_addresses)
    addresses = list(bootstrap_addresses)
    for _, address in sorted(brokers.items()):
        host, _, port = address.rpartition(":")
        if not any(same_endpoint(given, host, int(port)) for given in addresses):
            addresses.append(address)
    return addresses


def _server_certificate_name(address: str, security: ChannelSecurity) -> str | None:
    """A name the broker's certificate holds (its first DNS or IP SAN, else its CN), learned
    with one TLS handshake that checks the chain against the CA but not the name. With
    ssl.endpoint.identification.algorithm=none the gRPC channel is told to expect that name
    (grpc.ssl_target_name_override): gRPC has no switch to skip the name check, so the check
    is made to pass for whatever certificate the trusted CA signed. None if the broker
    cannot be reached now (`open_channel` then refuses, and the caller tries again later)."""
    import socket
    import ssl
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    host, _, port = address.rpartition(":")
    context = ssl.create_default_context(cadata=security.ca_pem.decode("ascii") if security.ca_pem else None)
    context.check_hostname = False
    context.set_alpn_protocols(["h2"])
    if security.certificate_location:
        context.load_cert_chain(security.certificate_location, security.key_location)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=TLS_PROBE_TIMEOUT_S) as sock:
            with context.wrap_socket(sock) as tls:
                der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None
    certificate = x509.load_der_x509_certificate(der)
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        for name in list(names.get_values_for_type(x509.DNSName)) + [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]:
            return name
    except x509.ExtensionNotFound:
        pass
    common_names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(common_names[0].value) if common_names else None


def open_channel(address: str, security: ChannelSecurity | None = None) -> grpc.Channel:
    """The channel to `address`: insecure for PLAINTEXT, TLS (mutual with a client
    certificate) for SSL."""
    if security is None or not security.is_tls:
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    credentials = grpc.ssl_channel_credentials(root_certificates=security.ca_pem, private_key=security.key_pem,
                                               certificate_chain=security.certificate_pem)
    options = CHANNEL_OPTIONS
    if not security.verify_hostname:
        name = _server_certificate_name(address, security)
        if name is None:
            # Not cached by the caller: a channel made now would check the address's host
            # for good, failing every handshake once the broker is up.
            raise NetworkError(f"cannot reach {address} to learn the name its certificate holds "
                               f"(ssl.endpoint.identification.algorithm=none); will retry")
        options = options + (("grpc.ssl_target_name_override", name),)
    channel = grpc.secure_channel(address, credentials, options=options)
    if security.sasl is not None:
        from eos.sasl import SaslChannelInterceptor
        return _SaslChannel(channel, SaslChannelInterceptor(channel, security.sasl))
    return channel


class _SaslChannel(grpc.Channel):
    """The intercepted channel of a SASL_SSL client; `close()` reaches the real channel
    (grpc.intercept_channel's wrapper cannot be closed)."""

    def __init__(self, channel: grpc.Channel, interceptor):
        self._channel = channel
        self._intercepted = grpc.intercept_channel(channel, interceptor)

    def subscribe(self, callback, try_to_connect=False):
        self._channel.subscribe(callback, try_to_connect)

    def unsubscribe(self, callback):
        self._channel.unsubscribe(callback)

    def unary_unary(self, method, *args, **kwargs):
        return self._intercepted.unary_unary(method, *args, **kwargs)

    def unary_stream(self, method, *args, **kwargs):
        return self._intercepted.unary_stream(method, *args, **kwargs)

    def stream_unary(self, method, *args, **kwargs):
        return self._intercepted.stream_unary(method, *args, **kwargs)

    def stream_stream(self, method, *args, **kwargs):
        return self._intercepted.stream_stream(method, *args, **kwargs)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
        return False


TLS_FAILURE_HINT = (" (over SSL this is also how a failed TLS handshake looks: check that ssl.ca.location "
                    "holds the CA of the broker's certificate, that the certificate names the address, and "
                    "that a valid client certificate is given when the broker requires one)")
# A plaintext client at a TLS listener: the broker's TLS side reads the HTTP/2 preface as a
# bad handshake and closes the connection, which gRPC reports as "Socket closed" (a broker
# that is down is "Connection refused" instead).
PLAINTEXT_AT_TLS_MARK = "Socket closed"
PLAINTEXT_AT_TLS_HINT = (" (the broker closed the connection at once: if this address is an SSL listener, the "
                         "client needs security.protocol=SSL and ssl.ca.location -- in the CLI, --command-config "
                         "with them)")


def error_from_rpc(exc: grpc.RpcError, what: str, security: ChannelSecurity | None = None) -> EosError:
    """A request-level gRPC failure as the eos error a client reacts to."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    message = f"{what}: gRPC {code.name if code else '?'}: {details}"
    if security is not None and security.is_tls and code is grpc.StatusCode.UNAVAILABLE:
        message += TLS_FAILURE_HINT
    elif code is grpc.StatusCode.UNAVAILABLE and PLAINTEXT_AT_TLS_MARK in (details or ""):
        message += PLAINTEXT_AT_TLS_HINT
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestTimedOutError(message)
    if code is grpc.StatusCode.UNAUTHENTICATED:
        from eos.sasl import REAUTHENTICATE_MARK
        if (details or "").startswith(REAUTHENTICATE_MARK):
            # this connection's session is gone (a reconnect): the next call authenticates again
            return NetworkError(message)
        return SaslAuthenticationError(message)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED):
        # The connection broke or the server went away mid-call: the request may or may
        # not have been handled, which is what NETWORK_EXCEPTION means to a Kafka client.
        return NetworkError(message)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        if "Concurrent RPC limit" in (details or ""):
            # The broker's queue is full (queued.max.requests): the call was refused before
            # any handler saw it, so trying again after the backoff is safe.
            return NetworkError(message + " (the broker is busy: its queued.max.requests were all waiting)")
        if THROTTLED_MARK in (details or ""):
            # Held to a request_percentage quota and refused before it ran: retried after the backoff.
            return NetworkError(message)
        # gRPC refused the message size (the server's receive limit).
        return EosError(message, ErrorCode.RECORD_LIST_TOO_LARGE)
    return UnknownServerError(message)


class Backoff:
    """Exponential backoff with 20% jitter: base_ms, 2*base_ms, ... capped at max_ms."""

    def __init__(self, base_ms: int, max_ms: int, rng: random.Random | None = None):
        self.base_ms = max(1, base_ms)
        self.max_ms = max(self.base_ms, max_ms)
        self._rng = rng or random.Random()

    def delay_ms(self, attempt: int) -> int:
        """The wait after failed attempt number `attempt` (1 for the first failure)."""
        exp = self.base_ms * (2 ** min(max(attempt - 1, 0), 30))
        delay = min(exp, self.max_ms)
        return max(1, int(delay * self._rng.uniform(0.8, 1.2)))


class TopicInfo(NamedTuple):
    name: str
    partition_count: int
    leaders: tuple[int, ...]            # leader node id per partition, NO_LEADER if none
    is_internal: bool
    configs: dict
    leader_epochs: tuple[int, ...] = ()   # per partition, as Metadata (or a KIP-951 hint) gave it


class _Snapshot(NamedTuple):
    brokers: dict          # node_id -> "host:port"
    topics: dict           # name -> TopicInfo
    fetched_ms: dict       # name -> now_ms() when the topic was last refreshed
    controller_id: int
    cluster_id: str


_COORDINATOR_MOVED = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})


def _coordinator_moved(response) -> bool:
    """Does the answer say the coordinator is elsewhere (at the top, or for a partition, a
    described transaction or group, or a deleted group)?"""
    if getattr(response, "error_code", ErrorCode.NONE) in _COORDINATOR_MOVED:
        return True
    return any(getattr(p, "error_code", ErrorCode.NONE) in _COORDINATOR_MOVED
               for p in (*getattr(response, "partitions", ()), *getattr(response, "transactions", ()),
                         *getattr(response, "groups", ()), *getattr(response, "results", ())))


class _CoordinatorStub:
    """A TxnCoordinator (key_type TRANSACTION) or GroupCoordinator (GROUP) stub that finds
    the coordinator of one key at each call (cached) and forgets it when it answers
    NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE or cannot be reached, so the caller's retry
    goes to the new one."""

    def __init__(self, metadata: "ClusterMetadata", key: str, key_type: int):
        self._metadata = metadata
        self._key = key
        self._key_type = key_type

    def __getattr__(self, method: str):
        metadata, key, key_type = self._metadata, self._key, self._key_type
        stub_class = (txn_pb2_grpc.TxnCoordinatorStub if key_type == group_pb2.TRANSACTION
                      else group_pb2_grpc.GroupCoordinatorStub)

        def call(request, timeout=None, **kwargs):
            try:
                address = metadata.coordinator_address(key, timeout, key_type=key_type)
            except EosError as exc:
                # the callers' retry loops handle gRPC errors: present it as one
                raise _CoordinatorLookupFailed(exc) from None
            stub = metadata.stub_at(address, stub_class)
            try:
                response = getattr(stub, method)(request, timeout=timeout, **kwargs)
            except grpc.RpcError:
                metadata.forget_coordinator(key, key_type=key_type)
                raise
            if _coordinator_moved(response):
                metadata.forget_coordinator(key, key_type=key_type)
            return response
        return call


class _AnyBrokerStub:
    """A stub of `stub_class` on the broker asked for what any broker answers
    (`ClusterMetadata.any_broker_address`), resolved at each call; a call that fails on the
    network moves to the next address, so the caller's retry does not ask a dead broker
    forever."""

    def __init__(self, metadata: "ClusterMetadata", stub_class):
        self._metadata = metadata
        self._stub_class = stub_class

    def __getattr__(self, method: str):
        metadata, stub_class = self._metadata, self._stub_class

        def call(request, timeout=None, **kwargs):
            stub = metadata.stub_at(metadata.any_broker_address, stub_class)
            try:
                return getattr(stub, method)(request, timeout=timeout, **kwargs)
            except grpc.RpcError:
                metadata.next_any_broker()
                raise
        return call


class _CoordinatorLookupFailed(grpc.RpcError):
    """FindCoordinator failed; looks like a transport error (UNAVAILABLE) to the caller."""

    def __init__(self, error: EosError):
        super().__init__(str(error))
        self.error = error

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return str(self.error)


class ClusterMetadata:
    """Brokers, topics, partition counts and leaders, refreshed via the Metadata RPC."""

    def __init__(self, bootstrap, *, request_timeout_ms: int = REQUEST_TIMEOUT_MS_DEFAULT,
                 retry_backoff_ms: int = RETRY_BACKOFF_MS_DEFAULT,
                 retry_backoff_max_ms: int = RETRY_BACKOFF_MAX_MS_DEFAULT,
                 metadata_max_age_ms: int = METADATA_MAX_AGE_MS_DEFAULT,
                 security: ChannelSecurity = PLAINTEXT_SECURITY):
        self.bootstrap_addresses = parse_bootstrap(bootstrap)
        self.security = security      # every channel this client opens is secured so
        self.request_timeout_ms = request_timeout_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self._backoff = Backoff(retry_backoff_ms, retry_backoff_max_ms)
        self._snapshot = _Snapshot({}, {}, {}, -1, "")
        self._refresh_lock = threading.Lock()
        self._channels_lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}      # address -> channel
        # (address, stub class) -> stub: a stub builds a callable per method, which costs
        # more than the call it then makes, so each is built once.
        self._stubs: dict[tuple[str, type], object] = {}
        self._any_broker_index = 0      # in any_broker_addresses(): the one that answered last
        self._stale_topics: set[str] = set()
        self._coordinators: dict[tuple[int, str], str] = {}   # (key type, id) -> coordinator address
        # Brokers with socket.transport.port (eos/socket_routes.py), for a PLAINTEXT client.
        self.socket_routes = SocketRoutes(on_unreachable=lambda address: self._forget_stubs({address}))
        self._closed = False

    # ---- channels ----------------------------------------------------------------------

    def channel(self, address: str) -> grpc.Channel:
        channel = self._channels.get(address)
        if channel is None:
            # Opened outside the lock: over SSL without hostname checks it makes a TLS
            # handshake first, which must not hold up this client's other threads.
            if self._closed:
                raise NetworkError("client is closed")
            opened = open_channel(address, self.security)
            with self._channels_lock:
                if self._closed:
                    opened.close()
                    raise NetworkError("client is closed")
                channel = self._channels.get(address)
                if channel is None:
                    channel = self._channels[address] = opened
            if channel is not opened:
                opened.close()      # another thread opened one first
        return channel

    def stub_at(self, address: str, stub_class):
        """The `stub_class` stub (BrokerStub, TxnCoordinatorStub, ...) on `address`: over
        the broker's socket port when Metadata named one and this client is PLAINTEXT (TLS
        and SASL stay on gRPC; eos/socket_routes.py), else gRPC."""
        stub = self._stubs.get((address, stub_class))
        if stub is None:
            channel = None
            if not self.security.is_tls and self.security.sasl is None:
                try:
                    channel = self.socket_routes.channel(address, self.channel)
                except SocketRoutesClosed:
                    raise NetworkError("client is closed") from None
            stub = self._stubs[(address, stub_class)] = stub_class(channel or self.channel(address))
        return stub

    def _forget_stubs(self, addresses: set[str]) -> None:
        """The stubs on `addresses` are made again at their next use (their transport changed)."""
        if not addresses:
            return
        # list(): stub_at adds stubs without the lock; a dict copy is one step under the GIL
        for key in [key for key in list(self._stubs) if key[0] in addresses]:
            self._stubs.pop(key, None)

    def broker_stub_at(self, address: str) -> broker_pb2_grpc.BrokerStub:
        return self.stub_at(address, broker_pb2_grpc.BrokerStub)

    def _any_broker_addresses(self) -> list[str]:
        return any_broker_addresses(self.bootstrap_addresses, self._snapshot.brokers)

    @property
    def any_broker_address(self) -> str:
        """The address asked for what any broker answers: the one that answered last."""
        addresses = self._any_broker_addresses()
        return addresses[self._any_broker_index % len(addresses)]

    def any_broker_stub(self, stub_class=broker_pb2_grpc.BrokerStub):
        """A `stub_class` stub that asks `any_broker_address` at each call and moves to the
        next address when a call fails on the network."""
        return _AnyBrokerStub(self, stub_class)

    def next_any_broker(self) -> None:
        """That broker did not answer: ask the next address (a cluster's other brokers
        answer for it)."""
        self._any_broker_index = (self._any_broker_index + 1) % len(self._any_broker_addresses())

    def txn_coordinator_stub(self, transactional_id: str | None = None):
        """The TxnCoordinator service for `transactional_id`: its coordinator, found with
        FindCoordinator and remembered until it answers NOT_COORDINATOR (or cannot be
        reached); without an id (an idempotent producer's InitProducerId), any broker."""
        if not transactional_id:
            return self.any_broker_stub(txn_pb2_grpc.TxnCoordinatorStub)
        return _CoordinatorStub(self, transactional_id, group_pb2.TRANSACTION)

    def coordinator_address(self, key: str, timeout_s: float | None = None, *,
                            key_type: int = group_pb2.TRANSACTION) -> str:
        """host:port of the coordinator of a transactional id (key_type TRANSACTION) or a
        group (GROUP), found with FindCoordinator and cached."""
        cached = self._coordinators.get((key_type, key))
        if cached is not None:
            return cached
        stub = group_pb2_grpc.GroupCoordinatorStub(self.channel(self.any_broker_address))
        try:
            response = stub.FindCoordinator(group_pb2.FindCoordinatorRequest(key_type=key_type, keys=[key]),
                                            timeout=timeout_s if timeout_s is not None else self.request_timeout_ms / 1000)
        except grpc.RpcError as exc:
            self.next_any_broker()
            raise error_from_rpc(exc, f"FindCoordinator for {key!r}", self.security) from None
        found = response.coordinators[0] if response.coordinators else None
        if found is None or found.error_code != ErrorCode.NONE:
            code = found.error_code if found is not None else ErrorCode.COORDINATOR_NOT_AVAILABLE
            raise error_for(code, f"FindCoordinator for {key!r}: "
                                  f"{found.error_message if found is not None else 'no answer'}")
        address = self.coordinator_channel_address(found.host, found.port, timeout_s)
        self._coordinators[(key_type, key)] = address
        return address

    def coordinator_channel_address(self, host: str, port: int, timeout_s: float | None = None) -> str:
        """Where to reach a coordinator FindCoordinator named host:port: there, unless one
        bootstrap address stands for one broker (a proxy or tunnel in front of it), which
        keeps being used. Which of the two it is, Metadata tells: a client that asks for
        its coordinator before it fetched any (a transactional producer's first call, a
        consumer's group) fetches it first, else it would take a cluster for one broker."""
        if len(self.bootstrap_addresses) == 1 and not self._snapshot.brokers:
            try:
                self.fetch(timeout_ms=int(timeout_s * 1000) if timeout_s is not None else None)
            except EosError:
                pass      # unknown still: take the coordinator's own address
        if len(self.bootstrap_addresses) == 1 and len(self._snapshot.brokers) == 1:
            return self.bootstrap_addresses[0]
        return f"{host}:{port}"

    def forget_coordinator(self, key: str, *, key_type: int = group_pb2.TRANSACTION) -> None:
        self._coordinators.pop((key_type, key), None)

    def group_coordinator_stub(self, group_id: str | None = None):
        """The GroupCoordinator service: the coordinator of `group_id` (found with
        FindCoordinator and remembered until it moves), or without a group any broker
        (FindCoordinator itself, ListGroups)."""
        if not group_id:
            return self.any_broker_stub(group_pb2_grpc.GroupCoordinatorStub)
        return _CoordinatorStub(self, group_id, group_pb2.GROUP)

    def address_of(self, node_id: int) -> str | None:
        snapshot = self._snapshot
        address = snapshot.brokers.get(node_id)
        if address is None:
            return None
        if len(snapshot.brokers) == 1 and len(self.bootstrap_addresses) == 1:
            return self.bootstrap_addresses[0]
        return address

    def broker_stub(self, node_id: int) -> broker_pb2_grpc.BrokerStub | None:
        address = self.address_of(node_id)
        return None if address is None else self.broker_stub_at(address)

    # ---- lookups (lock-free, on the current snapshot) ------------------------------------

    def topic(self, name: str) -> TopicInfo | None:
        return self._snapshot.topics.get(name)

    def partition_count(self, name: str) -> int | None:
        info = self._snapshot.topics.get(name)
        return info.partition_count if info is not None else None

    def leader(self, topic: str, partition: int) -> int:
        info = self._snapshot.topics.get(topic)
        if info is None or partition >= info.partition_count:
            return NO_LEADER
        return info.leaders[partition]

    def brokers(self) -> dict[int, str]:
        return dict(self._snapshot.brokers)

    @property
    def cluster_id(self) -> str:
        return self._snapshot.cluster_id

    @property
    def controller_id(self) -> int:
        return self._snapshot.controller_id

    def mark_stale(self, topic: str) -> None:
        """A leader moved or a partition was unknown: refresh this topic at the next chance."""
        self._stale_topics.add(topic)

    def stale_topics(self) -> set[str]:
        return set(self._stale_topics)

    def needs_refresh(self, topics: Iterable[str], max_age_ms: int | None = None) -> bool:
        """Whether any of `topics` is unknown, marked stale, or older than `max_age_ms`
        (metadata.max.age.ms when None)."""
        snapshot = self._snapshot
        now = now_ms()
        max_age_ms = self.metadata_max_age_ms if max_age_ms is None else max_age_ms
        for name in topics:
            if name in self._stale_topics or name not in snapshot.topics:
                return True
            if now - snapshot.fetched_ms.get(name, 0) > max_age_ms:
                return True
        return False

    # ---- refresh -------------------------------------------------------------------------

    def fetch(self, topics: list[str] | None = None, *, include_internal: bool = False,
              timeout_ms: int | None = None) -> broker_pb2.MetadataResponse:
        """One Metadata RPC (trying each of `any_broker_addresses` once, from the one that
        answered last); updates the snapshot."""
        request = broker_pb2.MetadataRequest(topics=topics or [], include_internal=include_internal)
        timeout_s = (timeout_ms if timeout_ms is not None else self.request_timeout_ms) / 1000
        last_error: EosError | None = None
        addresses = self._any_broker_addresses()
        count = len(addresses)
        for attempt in range(count):
            index = (self._any_broker_index + attempt) % count
            address = addresses[index]
            try:
                response = self.broker_stub_at(address).Metadata(request, timeout=timeout_s)
            except grpc.RpcError as exc:
                last_error = error_from_rpc(exc, f"Metadata from {address}", self.security)
                continue
            self.apply(response, topics)
            # The answer may have changed the list (brokers joined or left): keep this one.
            addresses = self._any_broker_addresses()
            self._any_broker_index = addresses.index(address) if address in addresses else 0
            return response
        raise last_error if last_error is not None else NetworkError("no bootstrap address")

    def apply(self, response: broker_pb2.MetadataResponse, asked: list[str] | None) -> None:
        """Take in a Metadata answer (of the `asked` topics, or of all when None): fetch()'s,
        or one a caller got itself (the Admin's describe_topics)."""
        with self._refresh_lock:
            old = self._snapshot
            brokers = {b.node_id: f"{b.host}:{b.port}" for b in response.brokers}
            self._forget_stubs(self.socket_routes.learn(response.brokers, self.bootstrap_addresses))
            topics = dict(old.topics)
            fetched = dict(old.fetched_ms)
            now = now_ms()
            seen = set()
            for t in response.topics:
                seen.add(t.name)
                if t.error_code != ErrorCode.NONE:
                    # Unknown (or being created): forget what we knew; callers wait or fail.
                    topics.pop(t.name, None)
                    fetched.pop(t.name, None)
                    continue
                leaders = [NO_LEADER] * len(t.partitions)
                epochs = [-1] * len(t.partitions)
                for p in t.partitions:
                    if 0 <= p.partition < len(leaders):
                        leaders[p.partition] = p.leader_id if p.error_code == ErrorCode.NONE else NO_LEADER
                        epochs[p.partition] = p.leader_epoch
                topics[t.name] = TopicInfo(t.name, len(t.partitions), tuple(leaders), t.is_internal,
                                           dict(t.configs), tuple(epochs))
                fetched[t.name] = now
                self._stale_topics.discard(t.name)
            if not asked:
                # A full listing: topics it does not name are gone.
                for name in list(topics):
                    if name not in seen and not topics[name].is_internal:
                        topics.pop(name)
                        fetched.pop(name, None)
            self._snapshot = _Snapshot(brokers, topics, fetched, response.controller_id,
                                       response.cluster_id)

    def learn_leader(self, topic: str, partition: int, hint, asked_node: int) -> bool:
        """KIP-951: node `asked_node` refused a call as NOT_LEADER_OR_FOLLOWER (or
        FENCED_LEADER_EPOCH) and named the leader it knows (`hint`, a LeaderIdAndEpoch). The
        hint replaces what this client knows when its epoch is newer and its broker is known
        (an unknown one waits for Metadata). True when the partition's leader is now known to
        be another broker: the caller then retries there at once, with no Metadata round
        trip (which could even answer with the old leader, from a broker the controller's
        update has not reached yet); False leaves the caller to refresh and back off."""
        if hint.leader_id >= 0:
            with self._refresh_lock:
                old = self._snapshot
                info = old.topics.get(topic)
                if (info is not None and 0 <= partition < len(info.leader_epochs) and hint.leader_id in old.brokers
                        and hint.leader_epoch > info.leader_epochs[partition]):
                    leaders = list(info.leaders)
                    leaders[partition] = hint.leader_id
                    epochs = list(info.leader_epochs)
                    epochs[partition] = hint.leader_epoch
                    topics = dict(old.topics)
                    topics[topic] = info._replace(leaders=tuple(leaders), leader_epochs=tuple(epochs))
                    self._snapshot = old._replace(topics=topics)
        return self.leader(topic, partition) not in (asked_node, NO_LEADER)

    def refresh_topics(self, topics: Iterable[str]) -> None:
        """Refresh now, one RPC; transport errors propagate (callers back off)."""
        names = sorted(set(topics))
        if names:
            self.fetch(names)

    def wait_for_topic(self, name: str, max_block_ms: int) -> TopicInfo:
        """The topic's metadata, refreshing with backoff until it is known with a leader
        for every partition or `max_block_ms` passes (then UnknownTopicOrPartitionError or
        the transport error, naming the topic and the time waited)."""
        info = self._snapshot.topics.get(name)
        if info is not None and name not in self._stale_topics:
            return info
        deadline = now_ms() + max_block_ms
        attempt = 0
        last_error: EosError | None = None
        while True:
            try:
                response = self.fetch([name], timeout_ms=max(1, min(self.request_timeout_ms,
                                                                    deadline - now_ms())))
                last_error = None
                for t in response.topics:
                    if t.name == name and t.error_code != ErrorCode.NONE:
                        err = error_for(t.error_code, t.error_message)
                        if reaction_for(t.error_code) is not Reaction.RETRY:
                            raise err   # e.g. an invalid topic name: waiting cannot help
                        last_error = err
            except EosError as exc:
                if not exc.retriable:
                    raise
                last_error = exc
            info = self._snapshot.topics.get(name)
            if info is not None and NO_LEADER not in info.leaders:
                return info
            attempt += 1
            remaining = deadline - now_ms()
            if remaining <= 0:
                if info is not None:
                    return info  # known, a leader missing: the sender waits for it
                reason = f" (last error: {last_error})" if last_error else ""
                raise UnknownTopicOrPartitionError(
                    f"topic {name!r} not present in metadata after {max_block_ms} ms{reason}")
            time.sleep(min(self._backoff.delay_ms(attempt), remaining) / 1000)

    def close(self) -> None:
        with self._channels_lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
        self.socket_routes.close()
        for channel in channels:
            channel.close()

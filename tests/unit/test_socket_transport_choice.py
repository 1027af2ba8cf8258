"""Which transport a client's stubs use (eos/net.py ClusterMetadata with eos/socket_routes.py):
the socket port Metadata names, for PLAINTEXT clients only, gRPC for a while after the port
refused, and the socket again after that. No broker: the metadata answers are made here."""
import grpc

from eos import net
from eos.client_config import ChannelSecurity
from eos.socket_rpc import SocketChannel
from eos.v1 import broker_pb2

ADDRESS = "127.0.0.1:19092"


def _metadata(socket_port: int, brokers: int = 1) -> broker_pb2.MetadataResponse:
    return broker_pb2.MetadataResponse(brokers=[
        broker_pb2.BrokerNode(node_id=n, host="127.0.0.1", port=19092 + n, socket_port=socket_port + n if socket_port else 0)
        for n in range(brokers)])


def _over_socket(stub) -> bool:
    return isinstance(getattr(stub.Metadata, "_channel", None), SocketChannel)


def test_stubs_go_over_the_socket_port_metadata_names_and_follow_it():
    metadata = net.ClusterMetadata(ADDRESS)
    try:
        assert not _over_socket(metadata.broker_stub_at(ADDRESS))         # before any Metadata
        metadata.apply(_metadata(29092), None)
        stub = metadata.broker_stub_at(ADDRESS)
        assert _over_socket(stub) and stub.Metadata._channel.address == ("127.0.0.1", 29092)
        metadata.apply(_metadata(39092), None)                            # the broker restarted elsewhere
        assert metadata.broker_stub_at(ADDRESS).Metadata._channel.address == ("127.0.0.1", 39092)
        metadata.apply(_metadata(0), None)                                # and without the port
        assert not _over_socket(metadata.broker_stub_at(ADDRESS))
    finally:
        metadata.close()


def test_every_broker_of_a_cluster_at_its_own_port():
    metadata = net.ClusterMetadata("127.0.0.1:19092,127.0.0.1:19093")
    try:
        metadata.apply(_metadata(29092, brokers=3), None)
        for n in range(3):
            assert metadata.broker_stub_at(f"127.0.0.1:{19092 + n}").Metadata._channel.address == (
                "127.0.0.1", 29092 + n)
    finally:
        metadata.close()


def test_a_port_that_refused_is_left_for_grpc_then_tried_again_after_a_metadata_refresh():
    metadata = net.ClusterMetadata(ADDRESS)
    try:
        metadata.apply(_metadata(29092), None)
        assert _over_socket(metadata.broker_stub_at(ADDRESS))
        metadata.socket_routes.unreachable(ADDRESS)
        assert not _over_socket(metadata.broker_stub_at(ADDRESS))
        metadata.apply(_metadata(29092), None)             # a refresh within SOCKET_RETRY_MS changes nothing
        assert not _over_socket(metadata.broker_stub_at(ADDRESS))
        metadata.socket_routes._down_until_ms[ADDRESS] = -1     # its time on gRPC is over
        metadata.apply(_metadata(29092), None)             # the first refresh after it
        assert _over_socket(metadata.broker_stub_at(ADDRESS))
    finally:
        metadata.close()


def test_a_connection_refused_by_the_port_tells_the_client():
    metadata = net.ClusterMetadata(ADDRESS)
    try:
        from eos.local_cluster import free_port
        metadata.apply(_metadata(free_port()), None)       # nothing listens there
        stub = metadata.broker_stub_at(ADDRESS)
        try:
            stub.Metadata(broker_pb2.MetadataRequest(), timeout=2)
        except grpc.RpcError as exc:
            assert exc.code() is grpc.StatusCode.UNAVAILABLE
        else:
            raise AssertionError("a call to a closed port succeeded")
        assert metadata.socket_routes.is_down(ADDRESS)
        assert not _over_socket(metadata.broker_stub_at(ADDRESS))
    finally:
        metadata.close()


def test_tls_and_sasl_clients_stay_on_grpc():
    tls = ChannelSecurity(protocol="SSL")
    metadata = net.ClusterMetadata(ADDRESS, security=tls)
    try:
        metadata.apply(_metadata(29092), None)
        assert not _over_socket(metadata.broker_stub_at(ADDRESS))
    finally:
        metadata.close()


def test_a_bootstrap_address_that_is_not_the_brokers_own_keeps_every_call():
    # a proxy or tunnel on another port (or host) in front of the one broker: the socket
    # would go around it, so the client stays on the address it was given
    proxied = net.ClusterMetadata("127.0.0.1:18000")
    local_name = net.ClusterMetadata("localhost:19092")
    try:
        proxied.apply(_metadata(29092), None)
        assert not _over_socket(proxied.broker_stub(0))
        local_name.apply(_metadata(29092), None)     # the same broker by its loopback name
        assert _over_socket(local_name.broker_stub(0))
    finally:
        proxied.close()
        local_name.close()

"""The broker's calls over plain TCP (socket.transport.port; eos/socket_rpc.py and
broker/socket_server.py): clients find the port in Metadata and use it for produce streams,
transactions and groups; statuses, limits, ACLs and the stop path behave as over gRPC; a
port that refuses sends the client back to gRPC."""
import contextlib
import random
import socket
import threading
import time

import grpc
import pytest

import eos
from broker.config import BrokerConfig
from broker.server import BrokerServer
from broker.acl import Operation, ResourceType
from eos.errors import ErrorCode, InvalidConfigError
from eos.records.codec import encode_batch
from eos.socket_rpc import SocketChannel, SocketRpcError, SocketStreamCall
from eos.v1 import broker_pb2, broker_pb2_grpc
from tests.integration.test_acl_matrix import ANONYMOUS, broker_config, grant, make_pki
from tests.waits import wait_for

SOCKET = {"socket.transport.port": "0", "group.initial.rebalance.delay.ms": "0"}


def _start(tmp_path, config=SOCKET) -> BrokerServer:
    broker = BrokerServer(tmp_path / "data", port=0, config=config).start()
    wait_for(lambda: broker.txn_coordinator.ready, "the transaction coordinator loaded")
    return broker


@pytest.fixture
def broker(tmp_path):
    server = _start(tmp_path)
    yield server
    server.stop()


def _socket_stub(broker: BrokerServer) -> broker_pb2_grpc.BrokerStub:
    return broker_pb2_grpc.BrokerStub(SocketChannel("127.0.0.1", broker.socket_port))


def _read_committed(bootstrap: str, topic: str, count: int) -> list[bytes]:
    values: list[bytes] = []
    with eos.Consumer(bootstrap, config={"auto.offset.reset": "earliest", "isolation.level": "read_committed"}) as c:
        c.assign([(topic, 0)])
        wait_for(lambda: values.extend(r.value for r in c.poll(200)) or len(values) >= count,
                 f"{count} records of {topic}")
        assert not c.poll(300)         # and nothing more
    return values


def test_metadata_names_the_socket_port_and_an_idempotent_producer_streams_over_it(broker):
    response = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(broker.address)).Metadata(
        broker_pb2.MetadataRequest())
    assert response.brokers[0].socket_port == broker.socket_port > 0
    with eos.Admin(broker.address) as admin:
        admin.create_topic("orders")
    with eos.Producer(broker.address, config={"linger.ms": 0, "acks": "all"}) as producer:
        offsets = [producer.send("orders", value=b"%d" % i).result(10).offset for i in range(300)]
        streams = list(producer._sender._streams.all())
        assert streams and all(isinstance(s._call, SocketStreamCall) and s.direct for s in streams)
        # the sender read the answers itself: no reader thread was started for the stream
        assert not [t.name for t in threading.enumerate() if t.name.startswith("eos-produce-stream")]
    assert offsets == list(range(300))
    assert _read_committed(broker.address, "orders", 300) == [b"%d" % i for i in range(300)]


def test_a_broker_with_the_port_turned_off_names_none_and_clients_stay_on_grpc(tmp_path):
    broker = _start(tmp_path, {"socket.transport.port": "-1"})
    try:
        assert broker.socket_port is None
        with eos.Admin(broker.address) as admin:
            admin.create_topic("plain")
        with eos.Producer(broker.address, config={"linger.ms": 0}) as producer:
            producer.send("plain", value=b"v").result(10)
            assert not isinstance(producer._sender._streams.stream_to(0)._call, SocketStreamCall)
            assert producer._metadata.socket_routes.ports == {}
    finally:
        broker.stop()


def test_transactions_and_group_offsets_over_the_socket_are_exact(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("in")
        admin.create_topic("out")
    producer = eos.Producer(broker.address, config={"transactional.id": "copier"})
    try:
        producer.init_transactions()
        for n, commit in ((1, True), (2, False), (3, True)):
            producer.begin_transaction()
            for i in range(3):
                producer.send("out", value=b"t%d-%d" % (n, i))
            producer.send_offsets_to_transaction({("in", 0): n * 10}, "copier-group")
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
        assert producer._metadata.socket_routes.channel_count, "the coordinator's calls went over the socket"
    finally:
        producer.close()
    assert _read_committed(broker.address, "out", 6) == [b"t1-0", b"t1-1", b"t1-2", b"t3-0", b"t3-1", b"t3-2"]
    with eos.Consumer(broker.address, config={"group.id": "copier-group"}) as consumer:
        assert consumer.committed([("in", 0)])[("in", 0)] == 30


def test_a_consumer_group_joins_commits_and_leaves_over_the_socket(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("events", partitions=2)
    with eos.Producer(broker.address, config={"linger.ms": 0}) as producer:
        for i in range(20):
            producer.send("events", value=b"%d" % i, partition=i % 2)
    values = []
    with eos.Consumer(broker.address, config={"group.id": "readers", "auto.offset.reset": "earliest"}) as consumer:
        consumer.subscribe(["events"])
        wait_for(lambda: values.extend(r.value for r in consumer.poll(200)) or len(values) >= 20, "20 records")
        assert len(consumer.assignment()) == 2
        consumer.commit()
        assert consumer._metadata.socket_routes.channel_count
    assert sorted(values, key=int) == [b"%d" % i for i in range(20)]
    with eos.Consumer(broker.address, config={"group.id": "readers"}) as again:
        assert again.committed([("events", 0), ("events", 1)]) == {
            ("events", 0): 10, ("events", 1): 10}


def test_statuses_come_back_as_grpc_errors_and_the_connection_goes_on(tmp_path):
    broker = _start(tmp_path, {**SOCKET, "socket.request.max.bytes": "2000"})
    try:
        stub = _socket_stub(broker)
        # a handler's own answer: unknown topic, as a per-partition error
        batch = encode_batch([b"v"])
        answer = stub.Produce(broker_pb2.ProduceRequest(acks=1, partitions=[
            broker_pb2.PartitionRecords(topic="nowhere", partition=0, records=batch)]), timeout=10)
        assert answer.partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        # gRPC's own refusal of a message over the broker's limit, then the same connection serves
        with pytest.raises(SocketRpcError) as too_large:
            stub.Produce(broker_pb2.ProduceRequest(acks=1, partitions=[
                broker_pb2.PartitionRecords(topic="nowhere", partition=0, records=b"x" * 5000)]), timeout=10)
        assert too_large.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert stub.Metadata(broker_pb2.MetadataRequest(), timeout=10).brokers[0].socket_port == broker.socket_port
        # a method the broker does not have
        missing = SocketChannel("127.0.0.1", broker.socket_port).unary_unary(
            "/eos.v1.Broker/NoSuchCall", request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=broker_pb2.MetadataResponse.FromString)
        with pytest.raises(SocketRpcError) as unimplemented:
            missing(broker_pb2.MetadataRequest(), timeout=10)
        assert unimplemented.value.code() is grpc.StatusCode.UNIMPLEMENTED
    finally:
        broker.stop()


def test_a_produce_stream_answers_pipelined_requests_in_order_then_ends_ok(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("s")
    call = _socket_stub(broker).ProduceStream.open()
    for correlation_id in range(4):
        batch = encode_batch([b"r%d" % correlation_id])
        assert call.send(broker_pb2.ProduceRequest(acks=1, correlation_id=correlation_id, partitions=[
            broker_pb2.PartitionRecords(topic="s", partition=0, records=batch)]))
    call.done_sending()
    answers = list(call)          # ends with StopIteration: the broker's OK status
    assert [a.correlation_id for a in answers] == [0, 1, 2, 3]
    assert [a.partitions[0].base_offset for a in answers] == [0, 1, 2, 3]
    assert call.code() is grpc.StatusCode.OK
    assert not call.send(broker_pb2.ProduceRequest())      # over: nothing more is taken


def test_a_stopping_broker_ends_an_idle_stream_and_idle_connections(tmp_path):
    broker = _start(tmp_path)
    stub = _socket_stub(broker)
    stub.Metadata(broker_pb2.MetadataRequest(), timeout=10)      # leaves a pooled idle connection
    call = stub.ProduceStream.open()
    wait_for(lambda: broker._servicer.produce_stream_count == 1, "the stream opened on the broker")
    stopper = threading.Thread(target=broker.stop)
    stopper.start()
    with pytest.raises(SocketRpcError) as ended:
        next(call)
    assert ended.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    stopper.join(30)
    assert not stopper.is_alive(), "the broker stopped"
    with pytest.raises(SocketRpcError) as refused:
        stub.Metadata(broker_pb2.MetadataRequest(), timeout=5)
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE


def test_a_socket_port_that_refuses_sends_the_client_back_to_grpc(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("fallback")
    with eos.Producer(broker.address, config={"linger.ms": 0, "retry.backoff.ms": 20}) as producer:
        producer.send("fallback", value=b"before").result(10)
        assert isinstance(producer._sender._streams.stream_to(0)._call, SocketStreamCall)
        socket_server = broker._grpc_server.servers[-1]
        socket_server.stop(0).wait(10)      # the port refuses from now on; gRPC still serves
        offsets = [producer.send("fallback", value=b"after-%d" % i).result(30).offset for i in range(5)]
        assert offsets == [1, 2, 3, 4, 5]   # each once, in order: the retry went over gRPC
        assert producer._metadata.socket_routes.is_down(broker.address)
        assert not isinstance(producer._sender._streams.stream_to(0)._call, SocketStreamCall)
    assert _read_committed(broker.address, "fallback", 6)[1:] == [b"after-%d" % i for i in range(5)]


def test_calls_over_the_socket_are_the_plaintext_listeners_and_acls_apply(tmp_path):
    pki = make_pki(tmp_path / "pki")
    broker = _start(tmp_path, broker_config(pki, **SOCKET))
    seen = []
    broker.call_identity_observer = lambda method, identity: seen.append((method, identity))
    try:
        admin = eos.Admin(broker.address_of("SSL"), config={
            "security.protocol": "SSL", "ssl.ca.location": str(pki["ca_path"]),
            "ssl.certificate.location": str(pki["admin"].certificate_path),
            "ssl.key.location": str(pki["admin"].key_path)})
        admin.create_topic("guarded")
        # over TLS the client is told no socket port: it stays on TLS
        assert admin._metadata.fetch().brokers[0].socket_port == 0
        stub = _socket_stub(broker)
        batch = encode_batch([b"v"])
        request = broker_pb2.ProduceRequest(acks=1, partitions=[
            broker_pb2.PartitionRecords(topic="guarded", partition=0, records=batch)])
        assert stub.Produce(request, timeout=10).partitions[0].error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        assert ("/eos.v1.Broker/Produce", "PLAINTEXT", ANONYMOUS) in [
            (method, identity.listener.name, identity.principal) for method, identity in seen]
        admin.create_acls(grant(ResourceType.TOPIC, "guarded", Operation.WRITE, principal=ANONYMOUS))
        admin.close()
        assert stub.Produce(request, timeout=10).partitions[0].error_code == ErrorCode.NONE
    finally:
        broker.stop()


def test_the_setting_is_refused_where_it_cannot_serve():
    ssl_only = {"listeners": "SSL://127.0.0.1:0", "ssl.certificate.location": "c.pem", "ssl.key.location": "k.pem"}
    with pytest.raises(InvalidConfigError, match="no listener is PLAINTEXT"):
        BrokerConfig.from_dict({"socket.transport.port": "9192", **ssl_only})
    # the default (a free port) asks for nothing: a broker without a PLAINTEXT listener has none
    assert BrokerConfig.from_dict(ssl_only).socket_transport_port == 0
    with pytest.raises(InvalidConfigError):
        BrokerConfig.from_dict({"socket.transport.port": "70000"})
    assert BrokerConfig.from_dict({"socket.transport.port": "9192",
                                   "zookeeper.connect": "127.0.0.1:2181"}).socket_transport_port == 9192
    assert BrokerConfig.from_dict({"socket.transport.port": "-1"}).socket_transport_port == -1
    assert BrokerConfig.from_dict({}).socket_transport_port == 0


def test_a_broker_serves_the_port_by_default_unless_it_has_no_plaintext_listener(tmp_path):
    broker = _start(tmp_path / "plain", {})
    try:
        assert broker.socket_port > 0
        assert broker_pb2_grpc.BrokerStub(grpc.insecure_channel(broker.address)).Metadata(
            broker_pb2.MetadataRequest(), timeout=10).brokers[0].socket_port == broker.socket_port
    finally:
        broker.stop()
    pki = make_pki(tmp_path / "pki")
    tls_only = BrokerServer(tmp_path / "tls" / "data", port=0, config={
        "listeners": "SSL://127.0.0.1:0", "ssl.certificate.location": str(pki["server"].certificate_path),
        "ssl.key.location": str(pki["server"].key_path)}).start()
    try:
        assert tls_only.socket_port is None
        assert len(tls_only._grpc_server.servers) == 1      # the one gRPC server, no socket server
    finally:
        tls_only.stop()


def test_after_a_broker_restart_one_call_fails_and_the_pooled_connections_are_dropped(tmp_path):
    from eos.local_cluster import free_port
    config = {**SOCKET, "socket.transport.port": str(free_port())}
    port = free_port()
    broker = BrokerServer(tmp_path / "data", port=port, config=config).start()
    channel = SocketChannel("127.0.0.1", broker.socket_port)
    stub = broker_pb2_grpc.BrokerStub(channel)
    try:
        # four connections in the pool, as four calls at once leave them
        for _ in range(4):
            channel._give_back(channel.connect())
        stub.Metadata(broker_pb2.MetadataRequest(), timeout=10)
        assert len(channel._idle) == 4
        broker.stop()
        broker = BrokerServer(tmp_path / "data", port=port, config=config).start()
        with pytest.raises(SocketRpcError) as broken:
            stub.Metadata(broker_pb2.MetadataRequest(), timeout=10)   # a connection to the old process
        assert broken.value.code() is grpc.StatusCode.UNAVAILABLE
        assert channel._idle == []                                     # the rest were dropped with it
        assert stub.Metadata(broker_pb2.MetadataRequest(), timeout=10).brokers[0].socket_port == broker.socket_port
    finally:
        channel.close()
        broker.stop()


def test_connections_cut_at_random_moments_lose_nothing_and_write_nothing_twice(broker):
    """The dropped-response fault on the socket: the broker's side of the producer's
    connections is shut down at random moments (after a request was appended, before its
    answer left, as often as not) while records are sent, 30 times. Every record must be
    acknowledged, read once, and in send order per partition."""
    from tests.integration.test_clients_producer import by_partition, consume_all

    with eos.Admin(broker.address) as admin:
        admin.create_topic("cut", partitions=3)
    socket_server = broker._grpc_server.servers[-1]
    rng = random.Random(5)
    cuts_wanted, cuts = 30, []

    def cut_connections():
        while len(cuts) < cuts_wanted:
            time.sleep(rng.uniform(0.002, 0.01))
            with socket_server._lock:
                connections = sorted(socket_server._connections, key=id)
            if connections:
                rng.choice(connections).shut_down()
                cuts.append(1)

    sent = {p: 0 for p in range(3)}
    futures = []
    cutter = threading.Thread(target=cut_connections, daemon=True)
    with eos.Producer(broker.address, retry_backoff_ms=10, retry_backoff_max_ms=100, request_timeout_ms=5000,
                      delivery_timeout_ms=120_000, linger_ms=1, batch_size=2048, max_request_size=2048,
                      acks="all", enable_idempotence=True) as producer:
        producer.send("cut", value=b"warm-up", partition=0).result(10)
        assert isinstance(producer._sender._streams.stream_to(0)._call, SocketStreamCall)
        cutter.start()
        deadline = time.monotonic() + 60
        while cutter.is_alive():
            assert time.monotonic() < deadline, f"only {len(cuts)} connections were cut in 60 s"
            for p in range(3):
                futures.append(producer.send("cut", value=b"%d-%d" % (p, sent[p]), partition=p))
                sent[p] += 1
            if len(futures) % 300 == 0:
                time.sleep(0.001)      # let the cutter's thread in
        producer.flush(120)
        assert all(f.exception() is None for f in futures)
    records = consume_all(broker.address, "cut", 3, sum(sent.values()) + 1)
    assert len(records) == sum(sent.values()) + 1, "a record was lost or written twice"
    for partition, in_partition in by_partition(records).items():
        values = [r.value for r in in_partition if r.value != b"warm-up"]
        assert values == [b"%d-%d" % (partition, i) for i in range(sent[partition])]


def test_a_stream_idle_longer_than_the_connect_timeout_still_answers(broker, monkeypatch):
    # the connect timeout bounds the connect only: an idle produce stream stays open
    import eos.socket_rpc
    monkeypatch.setattr(eos.socket_rpc, "CONNECT_TIMEOUT_S", 0.1)
    with eos.Admin(broker.address) as admin:
        admin.create_topic("idle")
    call = _socket_stub(broker).ProduceStream.open()
    answers = []
    reader = threading.Thread(target=lambda: answers.append(next(call)))   # waits as the producer's reader does
    reader.start()
    time.sleep(0.5)
    assert call.send(broker_pb2.ProduceRequest(acks=1, correlation_id=0, partitions=[
        broker_pb2.PartitionRecords(topic="idle", partition=0, records=encode_batch([b"late"]))]))
    reader.join(10)
    assert [a.partitions[0].error_code for a in answers] == [ErrorCode.NONE]
    call.cancel()


def test_connections_over_the_ports_limit_are_told_so_and_their_clients_go_over_grpc(broker):
    from eos.socket_frames import REFUSED, read_frame

    socket_server = broker._grpc_server.servers[-1]
    socket_server.connections_max = 3
    idle = [socket.create_connection(("127.0.0.1", broker.socket_port), timeout=10) for _ in range(3)]
    try:
        wait_for(lambda: len(socket_server._connections) == 3, "the port to serve the three idle connections")
        # one more connection is told why before it is closed, having sent nothing or a call
        for sent in (b"", b"\x00" * 64):
            with socket.create_connection(("127.0.0.1", broker.socket_port), timeout=10) as raw:
                raw.sendall(sent)
                kind, _, body = read_frame(raw.makefile("rb"), 1 << 20)
                assert kind == REFUSED and b"3 connections are open" in body
        # a unary call and a started call fail UNAVAILABLE, not handled, naming the refusal ...
        stub = _socket_stub(broker)
        with pytest.raises(SocketRpcError, match="refused the connection") as refused:
            stub.Metadata(broker_pb2.MetadataRequest(), timeout=10)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        started = stub.Metadata.start(broker_pb2.MetadataRequest(), timeout=10)
        wait_for(lambda: started.poll(), "the started call's answer")
        with pytest.raises(SocketRpcError, match="refused the connection"):
            started.result()
        # ... and a client's produce stream goes over gRPC instead: delivered, once
        with eos.Admin(broker.address) as admin:
            admin.create_topic("at-the-limit")
        with eos.Producer(broker.address, config={"linger.ms": 0, "retry.backoff.ms": 20}) as producer:
            assert producer.send("at-the-limit", value=b"one").result(30).offset == 0
            assert producer._metadata.socket_routes.is_down(broker.address)
        assert _read_committed(broker.address, "at-the-limit", 1) == [b"one"]
    finally:
        for raw in idle:
            raw.close()
    wait_for(lambda: not socket_server._connections, "the port to let go of the closed connections")
    assert _socket_stub(broker).Metadata(broker_pb2.MetadataRequest(), timeout=10).brokers


def test_connections_idle_past_connections_max_idle_ms_are_closed_by_the_broker(tmp_path):
    broker = _start(tmp_path, {**SOCKET, "connections.max.idle.ms": "1500"})
    try:
        socket_server = broker._grpc_server.servers[-1]
        idle = [socket.create_connection(("127.0.0.1", broker.socket_port), timeout=30) for _ in range(2)]
        wait_for(lambda: len(socket_server._connections) == 2, "the port to serve the idle connections")
        for raw in idle:
            assert raw.recv(100) == b""          # closed by the broker, within the read's bound
            raw.close()
        wait_for(lambda: not socket_server._connections, "the port to let go of them")
        assert _socket_stub(broker).Metadata(broker_pb2.MetadataRequest(), timeout=10).brokers
    finally:
        broker.stop()
    with pytest.raises(InvalidConfigError, match="connections.max.idle.ms"):
        BrokerConfig.from_dict({"connections.max.idle.ms": "0"})
    assert BrokerConfig.from_dict({"connections.max.idle.ms": "-1"}).connections_max_idle_ms == -1


def test_a_pooled_connection_idle_past_the_clients_limit_is_closed_not_reused(broker, monkeypatch):
    from eos import socket_rpc

    channel = SocketChannel("127.0.0.1", broker.socket_port)
    stub = broker_pb2_grpc.BrokerStub(channel)
    stub.Metadata(broker_pb2.MetadataRequest(), timeout=10)
    (pooled,) = channel._idle
    stub.Metadata(broker_pb2.MetadataRequest(), timeout=10)
    assert channel._idle == [pooled]                       # reused while fresh
    monkeypatch.setattr(socket_rpc, "IDLE_CONNECTION_MAX_S", 0.0)
    stub.Metadata(broker_pb2.MetadataRequest(), timeout=10)
    assert channel._idle and channel._idle[0] is not pooled  # too old: closed, a new one made
    assert pooled.sock.fileno() == -1
    channel.close()


def test_garbage_on_the_port_closes_that_connection_and_the_broker_serves_on(broker):
    import socket as sockets
    for garbage in (b"GET / HTTP/1.1\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"\x00\x00\x00\x09\x01"):
        with sockets.create_connection(("127.0.0.1", broker.socket_port), timeout=10) as raw:
            raw.sendall(garbage)
            if garbage.startswith(b"\x00"):
                raw.shutdown(sockets.SHUT_WR)      # a frame cut short: the client went away
            assert raw.recv(100) == b""            # closed by the broker, nothing answered
    assert _socket_stub(broker).Metadata(broker_pb2.MetadataRequest(), timeout=10).brokers


@contextlib.contextmanager
def _peer(serve=lambda connection: None):
    """A server on a free loopback port in place of a broker that misbehaves on purpose: it
    accepts one connection and runs `serve(connection)` on a thread. Yields (port, thread);
    the listener and the connection are closed at the end."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def run() -> None:
        connection, _ = listener.accept()
        accepted.append(connection)
        serve(connection)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], thread
    finally:
        listener.close()
        for connection in accepted:
            connection.close()


def test_a_stream_send_to_a_peer_that_stops_reading_gives_up_after_its_send_timeout():
    with _peer() as (port, _):         # accepts, never reads
        channel = SocketChannel("127.0.0.1", port)
        call = broker_pb2_grpc.BrokerStub(channel).ProduceStream.open(send_timeout_s=0.3)
        request = broker_pb2.ProduceRequest(partitions=[broker_pb2.PartitionRecords(records=b"x" * (4 << 20))])
        results = []
        sender = threading.Thread(target=lambda: results.extend(call.send(request) for _ in range(64)))
        sender.start()
        sender.join(30)
        assert not sender.is_alive(), "a send waited past its timeout"
        assert results[-1] is False                         # the stream was given up
        with pytest.raises(SocketRpcError) as ended:
            next(call)
        assert ended.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        channel.close()


def test_a_cancelled_future_leaves_the_pool_usable(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("waits")
    channel = SocketChannel("127.0.0.1", broker.socket_port)
    stub = broker_pb2_grpc.BrokerStub(channel)
    stub.Metadata(broker_pb2.MetadataRequest(), timeout=10)               # one pooled connection
    long_poll = stub.Fetch.future(broker_pb2.FetchRequest(
        max_wait_ms=5000, min_bytes=1, max_bytes=1024, partitions=[
            broker_pb2.FetchPartition(topic="waits", partition=0, fetch_offset=0, partition_max_bytes=1024)]), timeout=30)
    assert long_poll.cancel()
    with pytest.raises(grpc.FutureCancelledError):
        long_poll.result(10)
    for _ in range(3):     # the pool holds no connection the cancel closed
        assert stub.Metadata(broker_pb2.MetadataRequest(), timeout=10).brokers[0].socket_port == broker.socket_port
    channel.close()


def test_only_clients_of_the_listener_the_port_serves_are_told_it(tmp_path):
    broker = _start(tmp_path, {"listeners": "INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
                               "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT",
                               "inter.broker.listener.name": "INTERNAL"})
    try:
        assert broker.socket_listener == "INTERNAL"
        def told(listener):
            channel = grpc.insecure_channel(broker.address_of(listener))
            try:
                return broker_pb2_grpc.BrokerStub(channel).Metadata(
                    broker_pb2.MetadataRequest(), timeout=10).brokers[0].socket_port
            finally:
                channel.close()
        assert told("INTERNAL") == broker.socket_port
        assert told("EXTERNAL") == 0      # another network's clients stay on their listener
    finally:
        broker.stop()


def test_a_direct_stream_answered_out_of_order_fails_its_requests_as_retriable():
    """A peer that answers a correlation id other than the oldest one: the sender's own
    read of the stream fails every outstanding request (retriable, so idempotence resends
    them) and the stream takes no more requests."""
    from producer.stream import ProduceStream
    from eos.errors import NetworkError
    from eos.socket_frames import MESSAGE, frame, read_frame

    def serve(connection) -> None:       # reads OPEN and two requests, answers the second one first
        reader = connection.makefile("rb")
        requests = [read_frame(reader, 1 << 20) for _ in range(3)][1:]
        answer = broker_pb2.ProduceResponse(correlation_id=broker_pb2.ProduceRequest.FromString(
            requests[1][2]).correlation_id)
        connection.sendall(frame(MESSAGE, 0, answer.SerializeToString()))

    answers = []
    with _peer(serve) as (port, server):
        channel = SocketChannel("127.0.0.1", port)
        stream = ProduceStream(broker_pb2_grpc.BrokerStub(channel), 1, in_flight_max=5,
                               on_answer=lambda request_id, answer: answers.append((request_id, answer)))
        assert stream.direct
        for request_id in (10, 11):
            assert stream.send(request_id, broker_pb2.ProduceRequest(acks=-1), now_ms=0)
        server.join(10)
        taken = []
        wait_for(lambda: taken.extend(stream.take_answers()) or stream.closed, "the stream failed")
        assert taken == []                                   # the stray answer completed nothing
        assert [request_id for request_id, _ in answers] == [10, 11]
        for _, answer in answers:
            with pytest.raises(NetworkError, match="answered correlation id 1 where 0 was due"):
                answer.result()
        assert stream.send(12, broker_pb2.ProduceRequest(acks=-1), now_ms=0) is False
        channel.close()


def _fetch_request(topic: str, offset: int, max_wait_ms: int) -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20, partitions=[
        broker_pb2.FetchPartition(topic=topic, partition=0, fetch_offset=offset, partition_max_bytes=1 << 20)])


def test_a_started_call_is_answered_to_the_thread_that_polls_it_and_its_connection_is_pooled(broker):
    """PendingCall (the consumer's Fetch over the socket): sent at once, never waited for
    inside poll(); its caller sleeps on fileno() and reads the answer itself."""
    from eos.wakeup import Wakeup
    with eos.Admin(broker.address) as admin:
        admin.create_topic("started")
    channel = SocketChannel("127.0.0.1", broker.socket_port)
    try:
        call = broker_pb2_grpc.BrokerStub(channel).Fetch.start(_fetch_request("started", 0, 30_000), timeout=60)
        assert call.poll() is False and not call.done()       # a long poll: nothing yet, and no wait
        with eos.Producer(broker.address) as producer:
            producer.send("started", value=b"first").result(10)
        wakeup = Wakeup()
        wait_for(lambda: wakeup.wait(1, [call.fileno()]) or call.poll(), "the Fetch answered")
        partition = call.result().partitions[0]
        assert partition.error_code == ErrorCode.NONE and partition.high_watermark == 1 and partition.records
        assert call.fileno() == -1 and len(channel._idle) == 1        # the connection went back
        again = broker_pb2_grpc.BrokerStub(channel).Fetch.start(_fetch_request("started", 0, 0), timeout=60)
        wait_for(again.poll, "the second Fetch answered")
        assert again.result().partitions[0].records == partition.records   # on the pooled connection
    finally:
        channel.close()


def test_a_started_call_past_its_timeout_or_cancelled_fails_and_its_connection_is_closed(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("late")
    channel = SocketChannel("127.0.0.1", broker.socket_port)
    stub = broker_pb2_grpc.BrokerStub(channel)
    try:
        late = stub.Fetch.start(_fetch_request("late", 0, 30_000), timeout=0.2)
        wait_for(late.poll, "the call past its deadline")
        with pytest.raises(SocketRpcError) as failed:
            late.result()
        assert failed.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        cancelled = stub.Fetch.start(_fetch_request("late", 0, 30_000), timeout=60)
        assert cancelled.cancel() and cancelled.poll() and not cancelled.cancel()
        with pytest.raises(SocketRpcError) as failed:
            cancelled.result()
        assert failed.value.code() is grpc.StatusCode.CANCELLED
        assert channel._idle == []          # neither connection, mid-call, went back to the pool
        refused = stub.Produce.start(broker_pb2.ProduceRequest(partitions=[broker_pb2.PartitionRecords(
            topic="late", partition=0, records=b"x" * 64)]), timeout=60)
        wait_for(refused.poll, "the Produce answered")
        assert refused.result().partitions[0].error_code == ErrorCode.CORRUPT_MESSAGE
    finally:
        channel.close()


def test_a_consumer_over_the_socket_reads_its_fetches_itself(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("direct-reads")
    with eos.Producer(broker.address) as producer:
        for i in range(50):
            producer.send("direct-reads", value=b"%d" % i)
    with eos.Consumer(broker.address, config={"auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([("direct-reads", 0)])
        values = []
        wait_for(lambda: values.extend(r.value for r in consumer.poll(200)) or len(values) >= 50, "50 records")
        assert values == [b"%d" % i for i in range(50)]
        assert all(in_flight.direct for in_flight in consumer._fetcher._in_flight.values())
        assert consumer._fetcher._callers._queues == {}      # no fetch thread was ever started


def test_requests_a_timed_out_stream_failed_are_resent_before_anything_newer(broker, monkeypatch):
    """request.timeout.ms aborts a direct stream whose requests never reached the broker,
    just as a newer record is queued: the aborted requests are retried before it (a plain
    producer, whose order only the sender keeps)."""
    from eos import net
    from producer.accumulator import RecordAccumulator

    with eos.Admin(broker.address) as admin:
        admin.create_topic("resent")
    lost = threading.Event()
    send = SocketStreamCall.send
    monkeypatch.setattr(SocketStreamCall, "send",
                        lambda call, message: True if lost.is_set() else send(call, message))
    config = {"linger.ms": 0, "acks": 1, "enable.idempotence": False, "retries": 10,
              "max.in.flight.requests.per.connection": 5, "request.timeout.ms": 1000,
              "delivery.timeout.ms": 30_000}
    with eos.Producer(broker.address, config=config) as producer:
        later = []
        wait_for_work = RecordAccumulator.wait_for_work

        def a_record_arrives_as_the_stream_times_out(acc, timeout_s, fds=()):
            posted = wait_for_work(acc, timeout_s, fds)
            oldest = [s.oldest_sent_ms() for s in producer._sender._streams.all()]
            if not later and any(sent is not None and net.now_ms() - sent >= 1000 for sent in oldest):
                # the sender's pass that times the stream out also finds this record queued
                later.append(producer.send("resent", value=b"r3", partition=0))
                lost.clear()
            return posted

        monkeypatch.setattr(RecordAccumulator, "wait_for_work", a_record_arrives_as_the_stream_times_out)
        producer.send("resent", value=b"warm", partition=0).result(10)
        lost.set()                       # these three requests never reach the broker
        early = []
        for i in range(3):
            early.append(producer.send("resent", value=b"r%d" % i, partition=0))
            wait_for(lambda: sum(producer._sender._in_flight_by_node.values()) == i + 1, f"request {i} in flight")
        for future in early:
            future.result(30)
        later[0].result(30)
    assert _read_committed(broker.address, "resent", 5) == [b"warm", b"r0", b"r1", b"r2", b"r3"]


def test_a_call_whose_metadata_no_frame_can_carry_fails_unavailable_and_keeps_no_connection(broker):
    channel = SocketChannel("127.0.0.1", broker.socket_port)
    stub = broker_pb2_grpc.BrokerStub(channel)
    stub.Metadata(broker_pb2.MetadataRequest(), timeout=10)          # one connection, now pooled
    assert len(channel._idle) == 1
    with pytest.raises(grpc.RpcError) as refused:
        stub.Metadata(broker_pb2.MetadataRequest(), timeout=10, metadata=(("schlüssel", "x"),))
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    assert channel._idle == []          # the connection the call took was closed, not kept
    assert stub.Metadata(broker_pb2.MetadataRequest(), timeout=10).brokers   # a new one serves
    channel.close()

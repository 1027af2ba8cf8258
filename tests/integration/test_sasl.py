"""SASL/SCRAM end to end on one broker: a SASL_SSL listener beside a PLAINTEXT one, users
added offline (`eos users add --data-dir`) and online (eos.Admin, `eos users`), ACLs on the
SCRAM principals, and the refusals: a wrong password, an unknown user, no token, a token
replayed on another connection. A refused call appends nothing. A transactional copier
runs over SASL_SSL with exactly the ACLs it needs; a broker restart (every connection new)
makes the clients authenticate again without the application noticing.

Certificates are made at run time (tests/certs.py); the users are User:alice, User:bob and
User:admin (the super user)."""
from __future__ import annotations

import threading

import grpc
import pytest

import eos
from broker.config import BrokerConfig
from broker.scram_users import ScramUsers
from broker.server import BrokerServer
from eos import TopicPartition
from eos.acl import Operation, ResourceType
from eos.cli import main as eos_main
from eos.errors import ClusterAuthorizationFailedError, EosError, InvalidConfigError, SaslAuthenticationError
from eos.local_cluster import free_port
from eos.sasl import REAUTHENTICATE_MARK, SASL_TOKEN_KEY, SaslChannelInterceptor, SaslSettings
from eos.scram import make_credential
from eos.v1 import broker_pb2, broker_pb2_grpc
from tests.certs import CertificateAuthority
from tests.integration.test_acl_matrix import grant
from tests.integration.test_acls import copy_input_to_output
from tests.storage_batches import make_batch
from tests.waits import wait_for

PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret", "admin": "admin-secret"}
T, G, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
FAIL_FAST = {"request.timeout.ms": 3000, "retry.backoff.ms": 50}
PRODUCER_FAIL_FAST = {**FAIL_FAST, "max.block.ms": 5000, "delivery.timeout.ms": 5000}


@pytest.fixture
def pki(tmp_path):
    ca = CertificateAuthority("eos SASL test CA")
    directory = tmp_path / "pki"
    directory.mkdir()
    return {"ca_path": ca.write_ca(directory / "ca.pem"), "server": ca.issue_server(directory, "server")}


def _config(pki, ports=(0, 0), **extra) -> dict:
    return {"listeners": f"PLAINTEXT://127.0.0.1:{ports[0]},SASL_SSL://127.0.0.1:{ports[1]}",
            "ssl.certificate.location": str(pki["server"].certificate_path),
            "ssl.key.location": str(pki["server"].key_path),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:admin", "group.initial.rebalance.delay.ms": "0", **extra}


def _start(data_dir, pki, **kwargs) -> BrokerServer:
    broker = BrokerServer(data_dir, port=0, config=_config(pki, **kwargs)).start()
    wait_for(lambda: broker.txn_coordinator.ready, "the transaction coordinator loaded")
    return broker


@pytest.fixture
def broker(tmp_path, pki):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    users = ScramUsers(data_dir)
    users.alter({(name, "SCRAM-SHA-512"): make_credential("SCRAM-SHA-512", password)
                 for name, password in PASSWORDS.items()}, set())
    server = _start(data_dir, pki)
    yield server
    server.stop()


def sasl(pki, user, password=None, mechanism="SCRAM-SHA-512") -> dict:
    return {"security.protocol": "SASL_SSL", "ssl.ca.location": str(pki["ca_path"]), "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": PASSWORDS.get(user, "") if password is None else password}


def _end(broker, pki, topic, partition=0) -> int:
    with eos.Admin(broker.address_of("SASL_SSL"), config=sasl(pki, "admin")) as admin:
        return admin.list_offsets({(topic, partition): "latest"})[TopicPartition(topic, partition)]


def _produce(broker, pki, user, topic, values, password=None):
    with eos.Producer(broker.address_of("SASL_SSL"), config={**sasl(pki, user, password), **PRODUCER_FAIL_FAST,
                                                             "linger.ms": 0}) as producer:
        futures = [producer.send(topic, value=v) for v in values]
        producer.flush()
        return [f.result(timeout=10) for f in futures]


def test_users_produce_and_consume_within_their_acls(broker, pki):
    with eos.Admin(broker.address_of("SASL_SSL"), config=sasl(pki, "admin")) as admin:
        admin.create_topic("orders", partitions=1)
        admin.create_topic("secrets", partitions=1)
        admin.create_acls(grant(T, "orders", Operation.WRITE, Operation.READ, principal="User:alice")
                          + grant(G, "readers", Operation.READ, principal="User:alice"))
    _produce(broker, pki, "alice", "orders", [b"a", b"b"])
    with pytest.raises(EosError, match="TOPIC_AUTHORIZATION_FAILED|not authorized"):
        _produce(broker, pki, "alice", "secrets", [b"x"])
    with pytest.raises(EosError, match="TOPIC_AUTHORIZATION_FAILED|not authorized"):
        _produce(broker, pki, "bob", "orders", [b"x"])
    assert _end(broker, pki, "orders") == 2 and _end(broker, pki, "secrets") == 0
    with eos.Consumer(broker.address_of("SASL_SSL"), group_id="readers",
                      config={**sasl(pki, "alice"), "auto.offset.reset": "earliest"}) as consumer:
        consumer.subscribe(["orders"])
        values = []
        wait_for(lambda: values.extend(r.value for r in consumer.poll(200)) or len(values) >= 2, "alice read orders")
    assert values == [b"a", b"b"]


@pytest.mark.parametrize("user, password, mechanism", [
    ("alice", "wrong", "SCRAM-SHA-512"),
    ("nobody", "alice-secret", "SCRAM-SHA-512"),
    ("alice", "alice-secret", "SCRAM-SHA-256"),     # alice has no SHA-256 credential
])
def test_a_refused_authentication_appends_nothing(broker, pki, user, password, mechanism):
    with eos.Admin(broker.address_of("SASL_SSL"), config=sasl(pki, "admin")) as admin:
        admin.create_topic("t", partitions=1)
        admin.create_acls(grant(T, "t", Operation.WRITE, principal="User:*"))
    with pytest.raises(SaslAuthenticationError, match="invalid credentials"):
        with eos.Producer(broker.address_of("SASL_SSL"), config={**sasl(pki, user, password, mechanism),
                                                                 **PRODUCER_FAIL_FAST}) as producer:
            producer.send("t", value=b"x").result(timeout=10)
    assert _end(broker, pki, "t") == 0


def _raw_produce(channel, topic, metadata=()):
    request = broker_pb2.ProduceRequest(acks=-1, timeout_ms=3000)
    request.partitions.add(topic=topic, partition=0, records=make_batch(1))
    return broker_pb2_grpc.BrokerStub(channel).Produce(request, timeout=5, metadata=metadata)


def test_a_token_is_worth_nothing_on_another_connection(broker, pki):
    with eos.Admin(broker.address_of("SASL_SSL"), config=sasl(pki, "admin")) as admin:
        admin.create_topic("t", partitions=1)
    credentials = grpc.ssl_channel_credentials(root_certificates=pki["ca_path"].read_bytes())
    # one connection per channel (no shared subchannel), as two machines would have
    options = (("grpc.use_local_subchannel_pool", 1),)
    own = grpc.secure_channel(broker.address_of("SASL_SSL"), credentials, options=options)
    other = grpc.secure_channel(broker.address_of("SASL_SSL"), credentials, options=options)
    try:
        interceptor = SaslChannelInterceptor(own, SaslSettings("SCRAM-SHA-512", "admin", PASSWORDS["admin"]))
        token = interceptor.token()
        assert _raw_produce(own, "t", ((SASL_TOKEN_KEY, token),)).partitions[0].error_code == 0
        for metadata, why in ((((SASL_TOKEN_KEY, token),), REAUTHENTICATE_MARK),
                              ((), "needs a SASL/SCRAM authentication"),
                              (((SASL_TOKEN_KEY, "forged"),), REAUTHENTICATE_MARK)):
            with pytest.raises(grpc.RpcError) as refused:
                _raw_produce(other, "t", metadata)
            assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED and why in refused.value.details()
        assert _raw_produce(own, "t", ((SASL_TOKEN_KEY, token),)).partitions[0].error_code == 0
    finally:
        own.close()
        other.close()
    assert _end(broker, pki, "t") == 2


def test_a_transactional_copier_over_sasl_ssl_with_exactly_its_acls(broker, pki):
    with eos.Admin(broker.address_of("SASL_SSL"), config=sasl(pki, "admin")) as admin:
        admin.create_topic("input", partitions=2)
        admin.create_topic("output", partitions=2)
        admin.create_acls(grant(T, "input", Operation.READ, principal="User:alice")
                          + grant(G, "copier", Operation.READ, principal="User:alice")
                          + grant(T, "output", Operation.WRITE, principal="User:alice")
                          + grant(X, "copier-0", Operation.WRITE, principal="User:alice"))
    expected = [f"record-{i}".encode() for i in range(60)]
    _produce(broker, pki, "admin", "input", expected)
    copy_input_to_output(broker.address_of("SASL_SSL"), sasl(pki, "alice"), len(expected))
    with eos.Consumer(broker.address_of("SASL_SSL"), config={**sasl(pki, "admin"), "auto.offset.reset": "earliest",
                                                             "isolation.level": "read_committed"}) as reader:
        reader.assign([("output", 0), ("output", 1)])
        values = []
        wait_for(lambda: values.extend(r.value for r in reader.poll(200)) or len(values) >= len(expected),
                 "the output read")
    assert sorted(values) == sorted(expected)
    with eos.Admin(broker.address_of("SASL_SSL"), config=sasl(pki, "admin")) as admin:
        committed = admin.list_group_offsets("copier", require_stable=True)
        ends = admin.list_offsets({("input", p): "latest" for p in range(2)})
    assert {tp: committed.get(tp, 0) for tp in ends} == ends


def test_clients_authenticate_again_after_the_broker_restarts(tmp_path, pki):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    ScramUsers(data_dir).alter({("admin", "SCRAM-SHA-512"): make_credential("SCRAM-SHA-512", PASSWORDS["admin"])},
                               set())
    ports = (free_port(), free_port())
    broker = _start(data_dir, pki, ports=ports)
    try:
        with eos.Admin(broker.address_of("SASL_SSL"), config=sasl(pki, "admin")) as admin:
            admin.create_topic("t", partitions=1)
        with eos.Producer(broker.address_of("SASL_SSL"), config={**sasl(pki, "admin"), "linger.ms": 0}) as producer:
            producer.send("t", value=b"before").result(timeout=10)
            broker.stop()
            broker = _start(data_dir, pki, ports=ports)     # every connection is new: every token unknown
            producer.send("t", value=b"after").result(timeout=30)
        assert _end(broker, pki, "t") == 2
    finally:
        broker.stop()


def test_users_online_and_offline(broker, pki, tmp_path, capsys, monkeypatch):
    with eos.Admin(broker.address_of("SASL_SSL"), config=sasl(pki, "admin")) as admin:
        admin.upsert_scram_credential("carol", "carol-secret", mechanism="SCRAM-SHA-256", iterations=8192)
        assert admin.describe_user_scram_credentials(["carol"]) == {"carol": {"SCRAM-SHA-256": 8192}}
    with eos.Admin(broker.address_of("SASL_SSL"), config=sasl(pki, "carol", "carol-secret", "SCRAM-SHA-256")) as admin:
        assert admin.describe_cluster()["cluster_id"]          # carol can authenticate now
        with pytest.raises(ClusterAuthorizationFailedError):     # but may not change users
            admin.delete_scram_credential("alice")
    with eos.Admin(broker.address_of("PLAINTEXT")) as anonymous, pytest.raises(ClusterAuthorizationFailedError):
        anonymous.describe_user_scram_credentials()

    password_file = tmp_path / "dave.txt"
    password_file.write_text("dave-secret\n")
    monkeypatch.setenv("EOS_SASL_PASSWORD", PASSWORDS["admin"])
    command = ["--bootstrap-server", broker.address_of("SASL_SSL"), "--security-protocol", "SASL_SSL",
               "--ssl-ca-location", str(pki["ca_path"]), "--sasl-username", "admin"]
    assert eos_main(["users", "add", "dave", "--password-file", str(password_file), *command]) == 0
    assert eos_main(["users", "list", *command]) == 0
    listed = capsys.readouterr().out
    assert "user-principal 'dave' are SCRAM-SHA-512=[iterations=4096]" in listed and "'carol'" in listed
    assert eos_main(["users", "remove", "carol", "--mechanism", "SCRAM-SHA-256", *command]) == 0
    with eos.Admin(broker.address_of("SASL_SSL"), config=sasl(pki, "admin")) as admin:
        assert "carol" not in admin.describe_user_scram_credentials()
    with pytest.raises(SaslAuthenticationError):
        with eos.Admin(broker.address_of("SASL_SSL"), config={**sasl(pki, "carol", "carol-secret", "SCRAM-SHA-256"),
                                                              **FAIL_FAST}) as admin:
            admin.describe_cluster()

    offline = tmp_path / "offline"
    offline.mkdir()
    monkeypatch.setattr("sys.stdin", open(password_file, encoding="utf-8"))
    assert eos_main(["users", "add", "erin", "--data-dir", str(offline)]) == 0
    assert ScramUsers(offline).describe() == {"erin": {"SCRAM-SHA-512": 4096}}
    assert (offline / "scram-credentials.json").stat().st_mode & 0o777 == 0o600
    assert eos_main(["users", "remove", "nobody", "--data-dir", str(offline)]) == 1


def test_sasl_settings_are_checked(pki):
    with pytest.raises(InvalidConfigError, match="SASL_PLAINTEXT"):
        BrokerConfig.from_dict({"listeners": "SASL_PLAINTEXT://127.0.0.1:0"})
    with pytest.raises(InvalidConfigError, match="sasl.enabled.mechanisms"):
        BrokerConfig.from_dict({**_config(pki), "sasl.enabled.mechanisms": "GSSAPI"})
    with pytest.raises(InvalidConfigError, match="more than one listener with name SASL_SSL"):
        BrokerConfig.from_dict({**_config(pki), "listeners": "SASL_SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:1"})
    with pytest.raises(ValueError, match="needs sasl.username"):
        eos.Admin("127.0.0.1:1", config={"security.protocol": "SASL_SSL"})
    with pytest.raises(ValueError, match="sasl.mechanism must be"):
        eos.Admin("127.0.0.1:1", config={**sasl(pki, "alice"), "sasl.mechanism": "PLAIN"})
    with pytest.raises(ValueError, match="set security.protocol=SASL_SSL"):
        eos.Admin("127.0.0.1:1", config={"sasl.username": "alice", "sasl.password": "x"})


def test_a_mechanism_the_broker_does_not_enable_is_refused(tmp_path, pki):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    ScramUsers(data_dir).alter({("alice", "SCRAM-SHA-256"): make_credential("SCRAM-SHA-256", "pw")}, set())
    broker = _start(data_dir, pki, **{"sasl.enabled.mechanisms": "SCRAM-SHA-512"})
    try:
        with pytest.raises(SaslAuthenticationError, match="UNSUPPORTED_SASL_MECHANISM"):
            with eos.Admin(broker.address_of("SASL_SSL"), config={**sasl(pki, "alice", "pw", "SCRAM-SHA-256"),
                                                                  **FAIL_FAST}) as admin:
                admin.describe_cluster()
    finally:
        broker.stop()


# ---- what the review found -------------------------------------------------------------------

def test_stalled_exchanges_are_bounded_in_number_and_in_time(tmp_path):
    """Clients that open SaslAuthenticate and never finish cannot hold the broker's workers:
    beyond the cap they are refused, and each is cut off after the exchange's time limit."""
    from concurrent import futures

    from broker.scram_users import SessionTokens
    from broker.security_service import SecurityServicer
    from eos.v1 import security_pb2, security_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    servicer = SecurityServicer(ScramUsers(tmp_path), SessionTokens(), enabled_mechanisms=("SCRAM-SHA-512",),
                                exchanges_max=2, exchange_timeout_s=8.0)
    security_pb2_grpc.add_SecurityServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = security_pb2_grpc.SecurityStub(channel)
        never = threading.Event()

        def silent():                         # a client that sends nothing and never ends
            never.wait(30)
            return
            yield

        stalled = [stub.SaslAuthenticate(silent(), timeout=30) for _ in range(2)]
        # Both held before a third tries (else, on a loaded machine, the third could come
        # only after their time limit ended them, and never be refused).
        wait_for(lambda: servicer._exchanges._value == 0, "the broker holds both stalled exchanges")

        def third_refused() -> bool:          # once the broker holds both, a third is refused
            try:
                next(stub.SaslAuthenticate(iter([security_pb2.SaslAuthenticateRequest(mechanism="SCRAM-SHA-512")]),
                                           timeout=10))
            except grpc.RpcError as refused:
                assert refused.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, refused
                return True
            return False
        wait_for(third_refused, "a third exchange refused while two are stalled")
        for call in stalled:                  # the time limit ends them, without the client's help
            with pytest.raises(grpc.RpcError) as ended:
                next(call)
            assert ended.value.code() is grpc.StatusCode.CANCELLED
        never.set()
        answer = next(stub.SaslAuthenticate(iter([security_pb2.SaslAuthenticateRequest(
            mechanism="SCRAM-SHA-512", auth_bytes=b"n,,n=nobody,r=abc")]), timeout=10))
        assert answer.error_code == 0 and answer.auth_bytes.startswith(b"r=abc")   # room again
    finally:
        never.set()                           # the silent clients' threads end even after a failure
        channel.close()
        server.stop(0)


def test_calls_racing_a_reauthentication_all_finish(broker, pki):
    """A token the broker no longer knows (a reconnect), eight calls at once on the channel:
    each failed call's done-callback drops the token on gRPC's channel thread while another
    call authenticates on that channel. None may wait on the other."""
    with eos.Admin(broker.address_of("SASL_SSL"), config=sasl(pki, "admin")) as admin:
        admin.create_topic("t", partitions=1)
    credentials = grpc.ssl_channel_credentials(root_certificates=pki["ca_path"].read_bytes())
    raw = grpc.secure_channel(broker.address_of("SASL_SSL"), credentials)
    interceptor = SaslChannelInterceptor(raw, SaslSettings("SCRAM-SHA-512", "admin", PASSWORDS["admin"]))
    channel = grpc.intercept_channel(raw, interceptor)
    try:
        interceptor.token()
        with interceptor._lock:
            interceptor._token = "unknown-to-the-broker"
        stub = broker_pb2_grpc.BrokerStub(channel)
        request = broker_pb2.MetadataRequest(topics=["t"])
        first = [stub.Metadata.future(request, timeout=20) for _ in range(8)]
        refused = 0
        for call in first:     # those sent before a callback dropped the stale token are refused
            try:
                call.result(timeout=20)
            except grpc.RpcError as stale:
                assert REAUTHENTICATE_MARK in stale.details()
                refused += 1
        assert refused >= 1
        again = [stub.Metadata.future(request, timeout=20) for _ in range(8)]
        assert all(call.result(timeout=20).topics[0].name == "t" for call in again)
    finally:
        raw.close()


def test_a_deleted_users_sessions_end_at_once(broker, pki):
    with eos.Admin(broker.address_of("SASL_SSL"), config=sasl(pki, "admin")) as admin:
        admin.upsert_scram_credential("carol", "carol-secret")
    with eos.Admin(broker.address_of("SASL_SSL"), config={**sasl(pki, "carol", "carol-secret"), **FAIL_FAST}) as carol:
        assert carol.describe_cluster()["cluster_id"]
        with eos.Admin(broker.address_of("SASL_SSL"), config=sasl(pki, "admin")) as admin:
            admin.delete_scram_credential("carol")
        with pytest.raises(SaslAuthenticationError, match="invalid credentials"):
            carol.describe_cluster()          # the session is gone; logging in again fails


def test_the_sasl_password_variable_does_not_touch_other_protocols(broker, monkeypatch, capsys):
    monkeypatch.setenv("EOS_SASL_PASSWORD", "irrelevant")
    assert eos_main(["topics", "list", "--bootstrap-server", broker.address_of("PLAINTEXT")]) == 0


def test_plaintext_ssl_and_sasl_ssl_listeners_on_one_broker(tmp_path, pki):
    """Kafka's `listeners=PLAINTEXT://...,SSL://...,SASL_SSL://...`: the two TLS listeners are
    served by servers of their own (broker/listener_servers.py), so each call still knows its
    listener: a client certificate is the principal on SSL, the SCRAM login on SASL_SSL, and
    Metadata names the port of the listener a client came in on."""
    ca = CertificateAuthority("eos three-listener CA")
    directory = tmp_path / "pki3"
    directory.mkdir()
    ca_path = ca.write_ca(directory / "ca.pem")
    server, alice_cert = ca.issue_server(directory, "server"), ca.issue_client(directory, "carol", {"CN": "carol"})
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    ScramUsers(data_dir).alter({("alice", "SCRAM-SHA-512"): make_credential("SCRAM-SHA-512", PASSWORDS["alice"])}, set())
    broker = BrokerServer(data_dir, port=0, config={
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        "ssl.certificate.location": str(server.certificate_path), "ssl.key.location": str(server.key_path),
        "ssl.ca.location": str(ca_path), "ssl.client.auth": "required"}).start()
    seen = []
    broker.call_identity_observer = lambda method, identity: seen.append((identity.listener.name, identity.principal))
    try:
        ssl_client = {"security.protocol": "SSL", "ssl.ca.location": str(ca_path),
                      "ssl.certificate.location": str(alice_cert.certificate_path),
                      "ssl.key.location": str(alice_cert.key_path)}
        # SASL_SSL with ssl.client.auth=required: the SCRAM client shows a certificate too
        sasl_client = {**sasl({"ca_path": ca_path}, "alice"), "ssl.certificate.location": str(alice_cert.certificate_path),
                       "ssl.key.location": str(alice_cert.key_path)}
        for listener, config, principal in (("PLAINTEXT", {}, "User:ANONYMOUS"), ("SSL", ssl_client, "User:CN=carol"),
                                            ("SASL_SSL", sasl_client, "User:alice")):
            seen.clear()
            with eos.Admin(broker.address_of(listener), config=config) as admin:
                cluster = admin.describe_cluster()
            assert list(cluster["brokers"].values()) == [broker.address_of(listener)]
            assert (listener, principal) in seen, seen
    finally:
        broker.stop()


def test_a_probe_reads_health_on_a_sasl_ssl_listener_without_logging_in(broker, pki):
    """gRPC health over TLS alone answers, as a probe that cannot log in needs; every other
    call on that connection still needs the SASL session."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    credentials = grpc.ssl_channel_credentials(root_certificates=pki["ca_path"].read_bytes())
    with grpc.secure_channel(broker.address_of("SASL_SSL"), credentials) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as refused:
            _raw_produce(channel, "t", ())
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED

"""ACLs end to end on one broker (broker/authorizer.py): a transactional copier that has
exactly the ACLs it needs; super users; deny wins; prefixed ACLs; allow.everyone.if.no.acl.found;
ACLs surviving a restart; eos.Admin's and `eos acls`' add, list and remove; the config checks.

Principals: mutual-TLS certificates (tests/certs.py) name User:alice, User:bob and
User:admin (the super user); PLAINTEXT calls are User:ANONYMOUS."""
from __future__ import annotations

import pytest

import eos
from broker.acl import CLUSTER_NAME, AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType
from broker.config import BrokerConfig
from broker.server import BrokerServer
from eos import TopicPartition
from eos.errors import EosError, ErrorCode, InvalidConfigError
from tests.integration.test_acl_matrix import ADMIN, ALICE, ANONYMOUS, BOB, broker_config, grant, make_pki
from tests.waits import wait_for

T, G, C, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
O = Operation
FAIL_FAST = {"request.timeout.ms": 3000, "default.api.timeout.ms": 5000, "retry.backoff.ms": 50}


@pytest.fixture
def pki(tmp_path):
    return make_pki(tmp_path / "pki")


def _client(pki: dict, broker: BrokerServer, who: str) -> tuple[str, dict]:
    """(bootstrap, client config) for `who`: SSL with its certificate, or PLAINTEXT for ANONYMOUS."""
    if who == ANONYMOUS:
        return broker.address_of("PLAINTEXT"), {}
    issued = pki[who.split(":", 1)[1]]
    return broker.address_of("SSL"), {"security.protocol": "SSL", "ssl.ca.location": str(pki["ca_path"]),
                                      "ssl.certificate.location": str(issued.certificate_path),
                                      "ssl.key.location": str(issued.key_path)}


def _admin(pki, broker, who=ADMIN, **extra) -> eos.Admin:
    bootstrap, config = _client(pki, broker, who)
    return eos.Admin(bootstrap, config={**config, **extra})


def _start(tmp_path, pki, **extra) -> BrokerServer:
    broker = BrokerServer(tmp_path / "data", port=0, config=broker_config(pki, **extra)).start()
    wait_for(lambda: broker.txn_coordinator.ready, "the transaction coordinator loaded")
    return broker


@pytest.fixture
def broker(tmp_path, pki):
    server = _start(tmp_path, pki)
    yield server
    server.stop()


def _produce(pki, broker, who, topic, values, **extra):
    bootstrap, config = _client(pki, broker, who)
    with eos.Producer(bootstrap, config={**config, "linger.ms": 0, "max.block.ms": 5000,
                                         "delivery.timeout.ms": 5000, "request.timeout.ms": 3000, **extra}) as producer:
        futures = [producer.send(topic, value=v) for v in values]
        producer.flush()
        return [f.result(timeout=10) for f in futures]


def _read_all(pki, broker, topic, partitions=1, *, isolation="read_committed") -> list[bytes]:
    with _admin(pki, broker) as admin:
        ends = admin.list_offsets({(topic, p): "latest" for p in range(partitions)}, isolation_level=isolation)
    bootstrap, config = _client(pki, broker, ADMIN)
    values = []
    with eos.Consumer(bootstrap, config={**config, "auto.offset.reset": "earliest",
                                         "isolation.level": isolation}) as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        wait_for(lambda: values.extend(r.value for r in consumer.poll(200))
                 or all(consumer.position(TopicPartition(topic, p)) >= ends[TopicPartition(topic, p)]
                        for p in range(partitions)), f"{topic} read to its end")
    return values


# ---- a transactional copier with exactly the ACLs it needs ---------------------------------------

def copy_input_to_output(bootstrap: str, config: dict, count: int) -> None:
    """Copy `count` records from "input" to "output" (same partition) as group "copier" with
    transactional id "copier-0", offsets committed in each transaction (KIP-98's loop)."""
    copied = 0
    with eos.Consumer(bootstrap, group_id="copier", config={
            **config, "isolation.level": "read_committed", "auto.offset.reset": "earliest",
            "enable.auto.commit": "false", "session.timeout.ms": 30000}) as consumer, \
            eos.Producer(bootstrap, transactional_id="copier-0", config=config) as producer:
        consumer.subscribe(["input"])
        producer.init_transactions()

        def copy_some() -> bool:
            nonlocal copied
            records = consumer.poll(timeout_ms=200)
            if records:
                with producer.transaction():
                    for r in records:
                        producer.send("output", value=r.value, partition=r.partition)
                    producer.send_offsets_to_transaction(
                        {TopicPartition(r.topic, r.partition): r.offset + 1 for r in records},
                        consumer.group_metadata())
                copied += len(records)
            return copied >= count
        wait_for(copy_some, "the copier copied every input record")


def test_transactional_copier_with_exactly_its_acls(broker, pki):
    with _admin(pki, broker) as admin:
        admin.create_topic("input", partitions=2)
        admin.create_topic("output", partitions=2)
        # What kafka-acls.sh --consumer and --producer --transactional-id would give, and no more.
        admin.create_acls(grant(T, "input", O.READ) + grant(G, "copier", O.READ)
                          + grant(T, "output", O.WRITE) + grant(X, "copier-0", O.WRITE))
    expected = [f"record-{i}".encode() for i in range(60)]
    _produce(pki, broker, ADMIN, "input", expected)

    copy_input_to_output(*_client(pki, broker, ALICE), len(expected))

    assert sorted(_read_all(pki, broker, "output", 2)) == sorted(expected)
    with _admin(pki, broker) as admin:
        committed = admin.list_group_offsets("copier", require_stable=True)
        ends = admin.list_offsets({("input", p): "latest" for p in range(2)})
    assert {tp: committed.get(tp, 0) for tp in ends} == ends


def test_idempotent_producer_needs_only_write_on_its_topic(broker, pki):
    """KIP-679: WRITE on a topic is enough for InitProducerId without a transactional id."""
    with _admin(pki, broker) as admin:
        admin.create_topic("events")
        admin.create_acls(grant(T, "events", O.WRITE))
    assert [m.offset for m in _produce(pki, broker, ALICE, "events", [b"a", b"b"], **{"enable.idempotence": "true"})] \
        == [0, 1]
    with pytest.raises(EosError) as refused:
        _produce(pki, broker, BOB, "events", [b"c"], **{"enable.idempotence": "true"})
    assert refused.value.code in (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    assert _read_all(pki, broker, "events") == [b"a", b"b"]


# ---- the rules, through the clients ------------------------------------------------------------------

def test_prefixed_acls_and_deny_wins(broker, pki):
    with _admin(pki, broker) as admin:
        for name in ("orders-eu", "orders-secret", "payments"):
            admin.create_topic(name)
        admin.create_acls(grant(T, "orders-", O.WRITE, pattern=PatternType.PREFIXED)
                          + grant(T, "orders-secret", O.WRITE, permission=Permission.DENY))
    _produce(pki, broker, ALICE, "orders-eu", [b"ok"])
    for topic in ("orders-secret", "payments"):
        with pytest.raises(EosError) as refused:
            _produce(pki, broker, ALICE, topic, [b"no"])
        assert refused.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED, topic
    with _admin(pki, broker) as admin:
        ends = admin.list_offsets({(t, 0): "latest" for t in ("orders-eu", "orders-secret", "payments")})
    assert [ends[TopicPartition(t, 0)] for t in ("orders-eu", "orders-secret", "payments")] == [1, 0, 0]


def test_super_users_are_allowed_everything_and_others_nothing_by_default(broker, pki):
    with _admin(pki, broker) as admin:
        admin.create_topic("guarded")             # the super user, without any ACL
        admin.create_acls(grant(C, CLUSTER_NAME, O.ALL, principal="User:*", permission=Permission.DENY))
        admin.delete_topic("guarded")             # a DENY for everyone does not bind a super user
    for who in (ALICE, ANONYMOUS):
        with _admin(pki, broker, who, **FAIL_FAST) as admin:
            with pytest.raises(EosError) as refused:
                admin.create_topic("not-yours")
            assert refused.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
            assert admin.list_topics() == []      # allow.everyone.if.no.acl.found is false by default
    assert broker.registry.get("not-yours") is None


def test_allow_everyone_if_no_acl_found(tmp_path, pki):
    broker = _start(tmp_path, pki, **{"allow.everyone.if.no.acl.found": "true"})
    try:
        with _admin(pki, broker) as admin:
            admin.create_topic("open")
            admin.create_topic("owned")
            admin.create_acls(grant(T, "owned", O.WRITE, principal=BOB))
        _produce(pki, broker, ANONYMOUS, "open", [b"anyone"])       # no ACL on it: everyone may
        with pytest.raises(EosError) as refused:
            _produce(pki, broker, ANONYMOUS, "owned", [b"no"])       # an ACL on it: the ACLs decide
        assert refused.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        _produce(pki, broker, BOB, "owned", [b"bob's"])
    finally:
        broker.stop()


def test_acls_survive_a_restart(tmp_path, pki):
    broker = _start(tmp_path, pki)
    acls = grant(T, "kept", O.READ) + grant(G, "team-", O.READ, pattern=PatternType.PREFIXED, principal=BOB)
    with _admin(pki, broker) as admin:
        admin.create_acls(acls)
    broker.stop()
    broker = _start(tmp_path, pki)
    try:
        with _admin(pki, broker) as admin:
            assert sorted(admin.describe_acls()) == sorted(acls)
            assert admin.describe_acls(AclFilter(G, "team-blue", PatternType.MATCH)) == acls[1:]
            assert admin.delete_acls([AclFilter(principal=BOB)]) == acls[1:]
    finally:
        broker.stop()
    broker = _start(tmp_path, pki)
    try:
        assert broker.authorizer.acls == frozenset(acls[:1])
    finally:
        broker.stop()


def test_acl_rpcs_need_alter_and_describe_on_the_cluster(broker, pki):
    acl = grant(T, "x", O.READ, principal="User:eve")
    with _admin(pki, broker, ALICE, **FAIL_FAST) as admin:
        for call in (lambda: admin.create_acls(acl), admin.describe_acls,
                     lambda: admin.delete_acls([AclFilter()])):
            with pytest.raises(EosError) as refused:
                call()
            assert refused.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    broker.authorizer.create(grant(C, CLUSTER_NAME, O.DESCRIBE))
    with _admin(pki, broker, ALICE, **FAIL_FAST) as admin:
        assert admin.describe_acls() == grant(C, CLUSTER_NAME, O.DESCRIBE)
        with pytest.raises(EosError, match="CLUSTER_AUTHORIZATION_FAILED|not authorized"):
            admin.create_acls(acl)
        with _admin(pki, broker) as super_admin:
            with pytest.raises(EosError) as invalid:
                super_admin.create_acls([AclBinding(G, "g", PatternType.LITERAL, ALICE, "*", O.WRITE,
                                                    Permission.ALLOW)])
            assert invalid.value.code == ErrorCode.INVALID_REQUEST
    assert broker.authorizer.acls == frozenset(grant(C, CLUSTER_NAME, O.DESCRIBE))


def test_a_refused_add_partitions_registers_no_partition(broker, pki):
    """One topic it may not write: nothing joins the transaction (Kafka's all-or-nothing)."""
    from tests.integration.test_acl_matrix import Env
    with _admin(pki, broker) as admin:
        admin.create_topic("mine")
        admin.create_topic("theirs")
        admin.create_acls(grant(X, "tx", O.WRITE) + grant(T, "mine", O.WRITE))
    env = Env(broker, pki)
    try:
        pid, epoch = env.init_producer("tx")
        from eos.v1 import common_pb2, txn_pb2
        response = env.stubs[ALICE].txn.AddPartitionsToTxn(txn_pb2.AddPartitionsToTxnRequest(
            transactional_id="tx", producer_id=pid, producer_epoch=epoch,
            partitions=[common_pb2.TopicPartition(topic=t, partition=0) for t in ("mine", "theirs")]))
        assert {p.topic: p.error_code for p in response.partitions} == {
            "mine": ErrorCode.OPERATION_NOT_ATTEMPTED, "theirs": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
        assert broker.txn_coordinator.describe("tx").partitions == frozenset()
    finally:
        env.close()


# ---- eos acls (kafka-acls.sh) --------------------------------------------------------------------------

def test_cli_add_list_remove(broker, pki, tmp_path, capsys):
    from eos.cli import main
    properties = tmp_path / "admin.properties"
    _, config = _client(pki, broker, ADMIN)
    properties.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
    base = ["--bootstrap-server", broker.address_of("SSL"), "--command-config", str(properties)]
    assert main(["acls", *base, "--add", "--allow-principal", ALICE, "--operation", "Write", "--operation",
                 "Describe", "--topic", "orders"]) == 0
    assert main(["acls", *base, "--add", "--deny-principal", BOB, "--host", "10.0.0.9", "--operation", "Read",
                 "--group", "app-", "--resource-pattern-type", "prefixed"]) == 0
    assert main(["acls", *base, "--add", "--allow-principal", ALICE, "--operation", "IdempotentWrite",
                 "--cluster"]) == 0
    assert main(["acls", *base, "--add", "--allow-principal", ALICE, "--operation", "Write",
                 "--transactional-id", "orders-tx"]) == 0
    capsys.readouterr()
    assert main(["acls", *base, "--list", "--topic", "orders"]) == 0
    listing = capsys.readouterr().out
    assert "ResourcePattern(resourceType=TOPIC, name=orders, patternType=LITERAL)" in listing
    assert "(principal=User:alice, host=*, operation=WRITE, permissionType=ALLOW)" in listing
    assert "DESCRIBE" in listing and "app-" not in listing
    assert main(["acls", *base, "--list"]) == 0
    listing = capsys.readouterr().out
    assert "name=app-, patternType=PREFIXED" in listing and "host=10.0.0.9, operation=READ, permissionType=DENY" \
        in listing and "kafka-cluster" in listing and "orders-tx" in listing
    assert len(broker.authorizer.acls) == 5
    assert main(["acls", *base, "--remove", "--allow-principal", ALICE, "--operation", "Describe",
                 "--topic", "orders"]) == 0
    assert AclBinding(T, "orders", PatternType.LITERAL, ALICE, "*", O.DESCRIBE, Permission.ALLOW) \
        not in broker.authorizer.acls and len(broker.authorizer.acls) == 4
    assert main(["acls", *base, "--remove", "--group", "app-", "--resource-pattern-type", "prefixed"]) == 0
    assert not any(b.resource_type == G for b in broker.authorizer.acls)
    capsys.readouterr()
    # Without the super user's certificate: ANONYMOUS over PLAINTEXT may not change ACLs.
    assert main(["acls", "--bootstrap-server", broker.address_of("PLAINTEXT"), "--add", "--allow-principal",
                 "User:mallory", "--topic", "orders"]) == 1
    assert "CLUSTER_AUTHORIZATION_FAILED" in capsys.readouterr().err
    assert main(["acls", *base, "--add", "--allow-principal", ALICE, "--operation", "Fly", "--topic", "x"]) == 2


# ---- configuration --------------------------------------------------------------------------------

def test_authorizer_config():
    on = BrokerConfig.from_dict({"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
                                 "super.users": "User:a; User:b", "allow.everyone.if.no.acl.found": "true"})
    assert on.super_users == {"User:a", "User:b"} and on.allow_everyone_if_no_acl_found
    assert BrokerConfig.from_dict({}).authorizer_class_name == ""
    for bad, message in (({"authorizer.class.name": "com.example.Custom"}, "not an authorizer eos has"),
                         ({"super.users": "alice"}, "super.users"),
                         ({"allow.everyone.if.no.acl.found": "yes"}, "true or false")):
        with pytest.raises(InvalidConfigError, match=message):
            BrokerConfig.from_dict(bad)


def test_without_an_authorizer_everything_is_allowed_and_acls_are_disabled(tmp_path):
    broker = BrokerServer(tmp_path / "data", port=0).start()
    try:
        assert broker.authorizer is None and not broker._calls_need_identity()
        with eos.Admin(broker.address) as admin:
            admin.create_topic("free")
            with pytest.raises(EosError) as disabled:
                admin.describe_acls()
            assert disabled.value.code == ErrorCode.SECURITY_DISABLED
    finally:
        broker.stop()


def test_a_corrupt_acl_file_stops_the_broker_from_starting(tmp_path, pki):
    broker = _start(tmp_path, pki)
    broker.stop()
    (tmp_path / "data" / "acls.json").write_text("{not json")
    with pytest.raises(EosError, match="not a readable ACL file"):
        BrokerServer(tmp_path / "data", port=0, config=broker_config(pki)).start()

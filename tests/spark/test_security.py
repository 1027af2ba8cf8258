"""The Spark source, the exactly-once sink and eos.App over SASL_SSL, on a broker with an
authorizer: the pipeline's user has exactly the ACLs its stage needs (READ its input and its
group, WRITE its output and its transactional id), and the output is exact. The source's
kafka.* options are checked before anything runs."""
from __future__ import annotations

import collections

import pytest

import eos
from broker.scram_users import ScramUsers
from broker.server import BrokerServer
from eos.acl import Operation, ResourceType
from eos.scram import make_credential
from spark_sink.app import App
from spark_sink.offsets import SourceOptionError, parse_options
from spark_sink.readback import read_committed
from tests.certs import CertificateAuthority
from tests.integration.test_acl_matrix import grant
from tests.integration.test_sasl import PASSWORDS, _config, sasl
from tests.waits import wait_for

WAIT_S = 120


@pytest.fixture
def sasl_broker(tmp_path):
    ca = CertificateAuthority("eos Spark SASL test CA")
    (tmp_path / "pki").mkdir()
    pki = {"ca_path": ca.write_ca(tmp_path / "pki" / "ca.pem"), "server": ca.issue_server(tmp_path / "pki", "server")}
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    ScramUsers(data_dir).alter({(name, "SCRAM-SHA-512"): make_credential("SCRAM-SHA-512", password)
                                for name, password in PASSWORDS.items()}, set())
    broker = BrokerServer(data_dir, port=0, config=_config(pki)).start()
    wait_for(lambda: broker.txn_coordinator.ready, "the transaction coordinator loaded")
    yield broker, pki
    broker.stop()


def test_source_security_options_are_checked():
    base = {"bootstrap": "127.0.0.1:1", "subscribe": "t"}
    options = parse_options({**base, "kafka.security.protocol": "SASL_SSL", "kafka.sasl.username": "alice",
                             "kafka.sasl.password": "pw"}, streaming=True)
    assert dict(options.client_config) == {"security.protocol": "SASL_SSL", "sasl.username": "alice",
                                           "sasl.password": "pw"}
    with pytest.raises(SourceOptionError, match="kafka.linger.ms|linger.ms are not security settings"):
        parse_options({**base, "kafka.linger.ms": "5"}, streaming=True)
    with pytest.raises(SourceOptionError, match="needs sasl.username"):
        parse_options({**base, "kafka.security.protocol": "SASL_SSL"}, streaming=True)


def test_an_app_over_sasl_ssl_with_exactly_its_acls_copies_exactly_once(spark, sasl_broker, tmp_path):
    from pyspark.sql import functions as F

    broker, pki = sasl_broker
    address = broker.address_of("SASL_SSL")
    admin_config = sasl(pki, "admin")
    app = App(address, spark=spark, checkpoint_dir=str(tmp_path / "cp"), client_config=sasl(pki, "alice"))

    @app.stage(source="s_in", sink="s_out", group="s-copy")
    def shout(df):
        return df.select("key", F.upper(F.col("value").cast("string")).alias("value"))

    with eos.Admin(address, config=admin_config) as admin:
        admin.create_topic("s_in", partitions=2)
        admin.create_topic("s_out", partitions=2)
        admin.create_acls(
            grant(ResourceType.TOPIC, "s_in", Operation.READ, principal="User:alice")
            + grant(ResourceType.GROUP, "s-copy", Operation.READ, principal="User:alice")
            + grant(ResourceType.TOPIC, "s_out", Operation.WRITE, principal="User:alice")
            + grant(ResourceType.TRANSACTIONAL_ID, app.stages[0].transactional_id, Operation.WRITE,
                    principal="User:alice"))
    values = [f"record-{i}".encode() for i in range(300)]
    with eos.Producer(address, config=admin_config) as producer:
        producer.send_batch("s_in", values).result(60)
    app.run(available_now=True, timeout_s=WAIT_S * 2)

    copied = read_committed(address, "s_out", client_config=admin_config)
    assert collections.Counter(r.value for r in copied) == collections.Counter(v.upper() for v in values)
    with eos.Admin(address, config=admin_config) as admin:
        committed = admin.list_group_offsets("s-copy", require_stable=True)
        ends = admin.list_offsets({("s_in", p): "latest" for p in range(2)})
    assert {tp: committed.get(tp, 0) for tp in ends} == ends

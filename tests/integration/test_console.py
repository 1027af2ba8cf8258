"""The web console (`eos console`) in a real headless browser (Debian's chromium through
Playwright) against real in-process brokers: what its pages show equals what eos.Admin
answers for the same broker; lag moves when a consumer commits; the Abort button ends a
hanging transaction and is absent for a principal that may not abort; an offline log dir
is marked; unknown names are clear 404s.

One browser and one ACL broker serve the whole module (CI's time budget). The broker has an
authorizer: the console of User:admin (a super user, started the way `eos console` starts:
its argument parser, a --command-config properties file over mutual TLS) may abort; the
console of User:alice (DESCRIBE on the cluster, read and describe everything else) is
read-only. Its hanging transaction is made as in test_cli.py: a transaction left open while
the broker is down and its __transaction_state taken away, so no coordinator knows it."""
from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from types import SimpleNamespace

import pytest

import eos
from broker.acl import CLUSTER_NAME, Operation, ResourceType
from broker.server import BrokerServer
from eos import TopicPartition
from eos.cli import build_parser
from eos.console import ConsoleServer, create_app
from eos.console.cli import open_console
from eos.console.throughput import ThroughputSampler, end_offset_sums
from tests.integration.test_acl_matrix import ADMIN, ALICE, BOB, broker_config, grant, make_pki, open_stubs
from tests.integration.test_acls import _admin, _client
from tests.integration.test_cli import TxnProducer
from tests.metrics import scrape
from tests.waits import wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
T, G, C, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
O = Operation


# ---- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def page():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"the console's browser tests need {CHROMIUM}: ./run tests installs Debian's chromium")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser.new_page()
        finally:
            browser.close()


def _start_broker(data_dir, pki) -> BrokerServer:
    server = BrokerServer(data_dir, port=0, config=broker_config(pki)).start()
    wait_for(lambda: server.txn_coordinator.ready, "the transaction coordinator loaded")
    return server


class _AsAdmin:
    """What test_cli.TxnProducer asks of a broker (its stubs), as the super user over TLS."""

    def __init__(self, server, pki, channels):
        self._stubs = open_stubs(server, pki, ADMIN, channels)

    def broker_stub(self):
        return self._stubs.broker

    def txn_stub(self):
        return self._stubs.txn


def _properties_file(path, config: dict) -> str:
    path.write_text("".join(f"{key}={value}\n" for key, value in config.items()))
    return str(path)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The ACL broker with a hanging transaction in hang-0 and the two consoles."""
    base = tmp_path_factory.mktemp("console")
    pki = make_pki(base / "pki")
    server = _start_broker(base / "data", pki)
    channels: list = []
    try:
        with _admin(pki, server, ADMIN) as admin:
            admin.create_topic("hang", partitions=2)
        stuck = TxnProducer(_AsAdmin(server, pki, channels), "stuck")
        stuck.send("hang", 0, [b"a", b"b"])
        for channel in channels:
            channel.close()
        server.stop()
        for directory in (base / "data").glob("__transaction_state-*"):
            shutil.rmtree(directory)          # the coordinator forgets the transaction
        server = _start_broker(base / "data", pki)
    except BaseException:
        server.stop()
        raise
    opened = []         # what to close, in reverse, however far the setup got
    try:
        server.authorizer.create(grant(C, CLUSTER_NAME, O.DESCRIBE) + grant(T, "*", O.READ)
                                 + grant(G, "*", O.DESCRIBE) + grant(X, "*", O.DESCRIBE))
        admin_bootstrap, admin_config = _client(pki, server, ADMIN)
        args = build_parser().parse_args([
            "console", "--bootstrap", admin_bootstrap, "--port", "0", "--hanging-after-ms", "0",
            "--command-config", _properties_file(base / "admin.properties", admin_config)])
        admin, admin_server = open_console(args)
        opened.append(admin.close)
        alice = _admin(pki, server, ALICE)
        opened.append(alice.close)
        alice_app = create_app(alice, hanging_after_ms=0,
                               sampler=ThroughputSampler(lambda: end_offset_sums(alice), interval_ms_min=0))
        alice_server = ConsoleServer(alice_app, port=0)
        for console in (admin_server, alice_server):
            console.start()
            opened.append(console.stop)
        yield SimpleNamespace(server=server, pki=pki, admin=admin, stuck=stuck, admin_url=admin_server.url,
                              alice_url=alice_server.url, alice_app=alice_app)
    finally:
        for close in reversed(opened):
            close()
        server.stop()


def _rows(page, table_id: str) -> list[list[str]]:
    """The text of each cell of the table's body rows."""
    return page.eval_on_selector_all(
        f"#{table_id} tbody tr", "rows => rows.map(r => Array.from(r.cells, c => c.textContent.trim()))")


def _produce(env, topic: str, values_by_partition: dict[int, int]) -> None:
    bootstrap, config = _client(env.pki, env.server, ADMIN)
    with eos.Producer(bootstrap, config={**config, "linger.ms": 0}) as producer:
        for partition, count in values_by_partition.items():
            for i in range(count):
                producer.send(topic, value=f"{partition}:{i}".encode() * 20, partition=partition)
        producer.flush()


# ---- brokers and topics -----------------------------------------------------------------------

def test_brokers_page_shows_the_controller_and_the_log_dirs(env, page):
    page.goto(env.admin_url + "/brokers")
    cluster = env.admin.describe_cluster()
    [row] = _rows(page, "brokers")
    assert row[:4] == ["0", cluster["brokers"][0], "", "controller"] and cluster["controller_id"] == 0
    log_dirs = env.admin.describe_log_dirs()[0]
    shown = page.eval_on_selector_all("#brokers li", "items => items.map(i => [i.dataset.path, i.className])")
    assert shown == [[path, "ok"] for path in sorted(log_dirs)]
    assert page.locator("#storage-alert").count() == 0


def test_topic_pages_show_what_the_admin_api_answers(env, page):
    env.admin.create_topic("orders", partitions=3)
    _produce(env, "orders", {0: 5, 1: 2, 2: 0})
    page.goto(env.admin_url + "/topics")
    sizes = {tp: replica["size_bytes"] for dirs in env.admin.describe_log_dirs().values()
             for described in dirs.values() for tp, replica in described["replicas"].items()}
    listed = {row[0].split()[0]: row for row in _rows(page, "topics")}     # the name, without its badge
    assert sorted(listed) == env.admin.list_topics(include_internal=True)
    orders_size = sum(sizes[TopicPartition("orders", p)] for p in range(3))
    assert listed["orders"][1:5] == ["3", "1", str(orders_size), str(orders_size)] and orders_size > 0

    page.click("text=orders")
    page.wait_for_url("**/topics/orders")
    described = env.admin.describe_topic("orders")
    tps = [TopicPartition("orders", p) for p in range(3)]
    high_watermarks = env.admin.end_offsets(tps)
    stable = env.admin.end_offsets(tps, isolation_level="read_committed")
    assert _rows(page, "partitions") == [
        [str(p["partition"]), str(p["leader"]), ",".join(map(str, p["replicas"])), ",".join(map(str, p["isr"])),
         str(high_watermarks[tp]), str(stable[tp]), str(sizes[tp])]
        for p, tp in zip(described["partitions"], tps)]
    assert [row[4] for row in _rows(page, "partitions")] == ["5", "2", "0"]


def test_unknown_topic_and_group_are_404s_with_a_message(env, page):
    response = page.goto(env.admin_url + "/topics/ghost")
    assert response.status == 404 and "topic 'ghost' does not exist" in page.text_content("#error-message")
    response = page.goto(env.admin_url + "/groups/" + urllib.parse.quote("no such group"))
    assert response.status == 404 and "'no such group' does not exist" in page.text_content("#error-message")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(env.admin_url + "/api/topics/ghost")
    assert refused.value.code == 404


# ---- consumer groups --------------------------------------------------------------------------

def test_group_page_shows_members_and_lag_that_moves_when_the_consumer_commits(env, page):
    env.admin.create_topic("lag", partitions=2)
    _produce(env, "lag", {0: 6, 1: 4})
    tp0, tp1 = TopicPartition("lag", 0), TopicPartition("lag", 1)
    bootstrap, config = _client(env.pki, env.server, ADMIN)
    with eos.Consumer(bootstrap, config={**config, "group.id": "readers", "auto.offset.reset": "earliest",
                                         "isolation.level": "read_committed", "client.id": "lag-reader"}) as consumer:
        consumer.subscribe(["lag"])
        wait_for(lambda: consumer.poll(timeout_ms=50) is not None and consumer.assignment() == {tp0, tp1},
                 "both partitions assigned")
        consumer.commit({tp0: 2, tp1: 1})

        page.goto(env.admin_url + "/groups")
        assert ["readers", "Stable", "consumer"] in _rows(page, "groups")
        page.click("text=readers")
        page.wait_for_url("**/groups/readers")
        [member] = env.admin.describe_group("readers")["members"]
        assert _rows(page, "members") == [[member["member_id"], "", "lag-reader", member["host"], "lag-0,lag-1"]]
        lag = env.admin.group_lag("readers")
        assert _rows(page, "offsets") == [
            [r["topic"], str(r["partition"]), str(r["current_offset"]), str(r["log_end_offset"]), str(r["lag"]),
             r["member_id"]] for r in lag]
        assert [r["lag"] for r in lag] == [4, 3] and page.text_content("#total-lag") == "7"

        consumer.commit({tp0: 6, tp1: 4})
        page.reload()
        assert [row[2:5] for row in _rows(page, "offsets")] == [["6", "6", "0"], ["4", "4", "0"]]
        assert page.text_content("#total-lag") == "0"
        assert [r["lag"] for r in env.admin.group_lag("readers")] == [0, 0]


# ---- transactions -----------------------------------------------------------------------------

def _transaction_rows(admin) -> list[list[str]]:
    hanging = {h["producer_id"] for h in admin.find_hanging_transactions(max_duration_ms=0)}
    return [[t["transactional_id"] + (" hanging" if t["producer_id"] in hanging else ""), str(t["producer_id"]),
             t["state"], str(t["participant_count"])] for t in admin.list_transactions()]


def test_abort_button_is_absent_for_a_read_only_principal_and_ends_a_hanging_transaction(env, page):
    hang0 = TopicPartition("hang", 0)
    [hanging] = env.admin.find_hanging_transactions(max_duration_ms=0)
    assert (hanging["topic"], hanging["partition"], hanging["producer_id"]) == ("hang", 0, env.stuck.producer_id)
    assert env.admin.end_offsets([hang0], isolation_level="read_committed")[hang0] == 0   # held back
    expected_hanging = [["hang", "0", str(hanging["producer_id"]), str(hanging["producer_epoch"]),
                         str(hanging["coordinator_epoch"]), str(hanging["start_offset"])]]

    # alice may describe everything but not abort: the hanging row, no button, and a forged post refused
    page.goto(env.alice_url + "/transactions")
    assert [row[:6] for row in _rows(page, "hanging")] == expected_hanging
    assert page.locator("#hanging button").count() == 0 and page.locator("#read-only").count() == 1
    token = env.alice_app.extensions["eos_console"].abort_token
    form = urllib.parse.urlencode({"token": token, "topic": "hang", "partition": 0,
                                   "producer_id": hanging["producer_id"], "producer_epoch": hanging["producer_epoch"],
                                   "coordinator_epoch": hanging["coordinator_epoch"]}).encode()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(env.alice_url + "/transactions/abort", data=form)
    assert refused.value.code == 403
    assert env.admin.find_hanging_transactions(max_duration_ms=0) != []

    page.goto(env.admin_url + "/transactions")
    assert [row[:6] for row in _rows(page, "hanging")] == expected_hanging
    assert _rows(page, "transactions") == _transaction_rows(env.admin)
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#hanging button:text('Abort')")
    page.wait_for_selector("#aborted")
    assert _rows(page, "hanging") == [["none"]]
    assert env.admin.find_hanging_transactions(max_duration_ms=0) == []
    assert env.admin.end_offsets([hang0], isolation_level="read_committed")[hang0] == 3   # past the marker


def test_a_stale_abort_form_is_refused(env):
    form = urllib.parse.urlencode({"token": "forged", "topic": "hang", "partition": 0, "producer_id": 1,
                                   "producer_epoch": 0, "coordinator_epoch": 0}).encode()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(env.admin_url + "/transactions/abort", data=form)
    assert refused.value.code == 400


def test_a_host_name_the_console_was_not_given_is_refused(env):
    """DNS rebinding: a page whose own name now points at 127.0.0.1 reaches the console with
    its name in the Host header; the console answers it nothing (not even the abort token)."""
    for path in ("/transactions", "/api/transactions"):
        request = urllib.request.Request(env.admin_url + path, headers={"Host": "rebound.example"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request)
        assert refused.value.code == 400
    with urllib.request.urlopen(env.admin_url + "/transactions") as page:     # its own address still works
        assert page.status == 200


def test_a_principal_allowed_less_sees_less_not_an_error_page(env, page):
    """bob may only DESCRIBE the topic hang: no log dirs (no DESCRIBE on the cluster), no
    sizes, no producers to judge hanging transactions by (DescribeProducers needs READ)."""
    env.server.authorizer.create(grant(T, "hang", O.DESCRIBE, principal=BOB))
    with _admin(env.pki, env.server, BOB) as bob, ConsoleServer(create_app(bob, hanging_after_ms=0), port=0) as console:
        page.goto(console.url + "/brokers")
        assert "CLUSTER_AUTHORIZATION_FAILED" in page.text_content("#brokers")
        assert "nothing on the cluster" in page.text_content("main")
        page.goto(console.url + "/topics")
        assert _rows(page, "topics") == [["hang", "2", "1", "unknown", "unknown", ""]]
        response = page.goto(console.url + "/transactions")
        assert response.status == 200 and "TOPIC_AUTHORIZATION_FAILED" in page.text_content("#hanging-error")
        assert page.locator("#hanging button").count() == 0


# ---- throughput -------------------------------------------------------------------------------

def test_throughput_chart_shows_records_per_second(env, page):
    env.admin.create_topic("flow", partitions=2)
    page.goto(env.alice_url + "/throughput")          # its sampler samples on every poll
    _produce(env, "flow", {0: 30, 1: 20})
    page.wait_for_function("document.getElementById('throughput-line').getAttribute('points').length > 0")
    # one read of the table, in the page: it is redrawn on every poll, so a row read between
    # two separate calls may be gone
    rate = page.wait_for_function("""() => {
        for (const row of document.querySelectorAll('#throughput-topics tbody tr')) {
            const cells = row.querySelectorAll('td');
            if (cells.length > 1 && cells[0].textContent.trim() === 'flow') return parseFloat(cells[1].textContent);
        }
        return null;
    }""").json_value()
    assert rate > 0


# ---- storage ----------------------------------------------------------------------------------

def test_an_offline_log_dir_is_marked_on_the_brokers_page(tmp_path, page):
    dirs = [tmp_path / "a", tmp_path / "b"]
    server = BrokerServer(dirs[0], port=0, config={"log.dirs": ",".join(map(str, dirs)), "metrics.port": "0",
                                                   "log.retention.check.interval.ms": "3600000"}).start()
    try:
        with eos.Admin(server.address) as admin, ConsoleServer(create_app(admin), port=0) as console:
            admin.create_topic("disk", partitions=2)
            metrics_url = f"http://127.0.0.1:{server.metrics_port}/metrics"
            before = scrape(metrics_url)
            assert before.value("eos_log_offline_log_directories") == 0
            assert before.value("eos_controller_offline_partitions") == 0
            shutil.rmtree(dirs[1])                      # the disk is gone
            server._log_manager.run_housekeeping()      # the broker's probe, run now
            after = scrape(metrics_url)                 # the broker's own figures move with it
            assert after.value("eos_log_offline_log_directories") == 1
            assert after.value("eos_controller_offline_partitions") >= 1
            page.goto(console.url + "/brokers")
            assert page.text_content("#storage-alert").startswith("1 log dir(s) offline")
            offline = page.locator(f"#brokers li[data-path='{dirs[1]}']")
            assert offline.get_attribute("class") == "offline" and "KAFKA_STORAGE_ERROR" in offline.text_content()
            assert page.locator(f"#brokers li[data-path='{dirs[0]}']").get_attribute("class") == "ok"
    finally:
        server.stop()

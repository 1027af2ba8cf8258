"""The cluster's command line as an operator uses it: eos zookeeper start, eos cluster start,
eos broker start --zookeeper, topics describe with its filters, leader-election; and a data
dir of another cluster refused at start."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid

import pytest

import eos
from eos.cli import read_properties
from eos.errors import EosError
from eos.local_cluster import free_port
from tests.cluster.test_cluster_failover import CLUSTER_CONFIG, describe
from tests.waits import wait_for

EOS = [sys.executable, "-m", "eos.cli"]


def _start(args, log_path):
    log = open(log_path, "wb")
    try:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()


def _wait_line(log_path, pattern, process, timeout_s=120):
    def found():
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        if process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode}:\n{text[-3000:]}")
        return re.search(pattern, text)
    return wait_for(found, f"{pattern!r} in {log_path}", timeout_s)


def _stop(process, timeout_s=60):
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        raise AssertionError("did not stop within the bound after SIGTERM")


def test_zookeeper_start_serves_and_stops_on_sigterm(tmp_path):
    port = free_port()
    log_path = tmp_path / "zk.out"
    process = _start(EOS + ["zookeeper", "start", "--port", str(port), "--data-dir", str(tmp_path / "zk")], log_path)
    try:
        _wait_line(log_path, rf"eos zookeeper listening on 127\.0\.0\.1:{port}", process)
        from eos.zookeeper import four_letter_word
        assert "Mode: standalone" in four_letter_word("127.0.0.1", port, "srvr")
    finally:
        assert _stop(process) == 0
    assert four_letter_word("127.0.0.1", port, "srvr") == ""       # the java child is gone too


def test_cluster_start_tls_prints_the_bootstrap_serves_mutual_tls_and_stops_everything(tmp_path):
    """`eos cluster start --tls`: a throwaway CA in <data-dir>/tls, every listener SSL with
    mutual TLS (brokers among themselves too); the admin properties it prints work with the
    CLI and the clients, and a client without TLS gets nowhere. `eos cluster stop` on the
    same data dir ends it and returns once it has exited; with nothing running it exits 1."""
    base = free_port()
    while any(_in_use(base + i) for i in range(1, 3)):
        base = free_port()
    log_path = tmp_path / "cluster.out"
    process = _start(EOS + ["cluster", "start", "--brokers", "3", "--data-dir", str(tmp_path / "c"),
                            "--base-port", str(base), "--zookeeper-port", str(free_port()), "--tls",
                            "--config", "zookeeper.session.timeout.ms=6000"], log_path)
    try:
        bootstrap = _wait_line(log_path, r"bootstrap: (\S+)", process, timeout_s=180).group(1)
        properties = _wait_line(log_path, r"--command-config (\S+)", process).group(1)
        assert bootstrap.split(",") == [f"127.0.0.1:{base + i}" for i in range(3)]
        assert (tmp_path / "c" / "tls" / "ca.pem").exists()
        client = read_properties(properties)
        assert client["security.protocol"] == "SSL" and client["ssl.certificate.location"]
        with eos.Admin(bootstrap=bootstrap, config=client) as admin:
            assert sorted(admin.describe_cluster()["brokers"]) == [0, 1, 2]
            admin.create_topic("cli", partitions=2, replication_factor=3)
            wait_for(lambda: all(len(p["isr"]) == 3 for p in describe(admin, "cli")), "full ISRs (fetches over TLS)")
        out = subprocess.run(EOS + ["topics", "describe", "cli", "--bootstrap-server", bootstrap,
                                    "--command-config", properties], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert re.search(r"Topic: cli\tPartitionCount: 2\tReplicationFactor: 3", out.stdout)
        assert len(re.findall(r"Partition: \d\tLeader: \d\tReplicas: \d,\d,\d\tIsr: \d,\d,\d", out.stdout)) == 2
        with pytest.raises(EosError):
            with eos.Admin(bootstrap=bootstrap, config={"request.timeout.ms": 2000,
                                                        "default.api.timeout.ms": 3000}) as plain:
                plain.list_topics()
        assert (tmp_path / "c" / "cluster.pid").exists()
        stop = subprocess.run(EOS + ["cluster", "stop", "--data-dir", str(tmp_path / "c")],
                              capture_output=True, text=True, timeout=180)
        assert stop.returncode == 0, stop.stderr
        assert process.poll() == 0 and "stopping the cluster" in log_path.read_text()   # exited, cleanly
        assert not (tmp_path / "c" / "cluster.pid").exists()
    finally:
        assert _stop(process, timeout_s=120) == 0
    assert not any(_in_use(base + i) for i in range(3))
    again = subprocess.run(EOS + ["cluster", "stop", "--data-dir", str(tmp_path / "c")],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "no cluster to stop" in again.stderr


def _in_use(port: int) -> bool:
    import socket
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_describe_filters_and_leader_election_cli(cluster_factory):
    cluster = cluster_factory(CLUSTER_CONFIG)
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topics([{"name": "few", "assignments": {0: [0, 1], 1: [1, 2]}}])
        wait_for(lambda: all(len(p["isr"]) == 2 for p in describe(admin, "few")), "full ISRs")
        cluster.kill(2)
        wait_for(lambda: describe(admin, "few")[1]["isr"] == [1], "partition 1 under-replicated")

        def describe_cli(*flags):
            out = subprocess.run(EOS + ["topics", "describe", "few", "--bootstrap-server", cluster.bootstrap,
                                        *flags], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            return out.stdout
        under = describe_cli("--under-replicated-partitions")
        assert "Partition: 1" in under and "Partition: 0" not in under and "Offline: 2" in under
        assert describe_cli("--unavailable-partitions").strip() == ""
        cluster.kill(1)
        wait_for(lambda: describe(admin, "few")[1]["leader"] == -1, "partition 1 offline")
        assert "Partition: 1\tLeader: none" in describe_cli("--unavailable-partitions")
        cluster.restart(1)
        cluster.restart(2)
        wait_for(lambda: all(len(p["isr"]) == 2 for p in describe(admin, "few")), "full ISRs again", 60)
        election = subprocess.run(EOS + ["leader-election", "--election-type", "preferred",
                                         "--all-topic-partitions", "--bootstrap-server", cluster.bootstrap],
                                  capture_output=True, text=True, timeout=60)
        assert election.returncode == 0, election.stderr
        assert [p["leader"] for p in describe(admin, "few")] == [0, 1]


def test_a_data_dir_of_another_cluster_refuses_to_start(zookeeper, tmp_path):
    data_dir = tmp_path / "broker"
    data_dir.mkdir()
    (data_dir / "meta.properties").write_text("version=1\nnode.id=0\ncluster.id=someOtherClusterId00000\n")
    port = free_port()
    process = subprocess.run(
        [sys.executable, "-m", "broker", "--data-dir", str(data_dir), "--port", str(port), "--node-id", "0",
         "--config", f"zookeeper.connect={zookeeper.connect_string}/eos-{uuid.uuid4().hex[:8]}"],
        capture_output=True, text=True, timeout=120)
    assert process.returncode == 1
    assert "someOtherClusterId00000" in process.stderr and "refusing to start" in process.stderr
    assert sorted(os.listdir(data_dir)) == [".lock", "meta.properties"]

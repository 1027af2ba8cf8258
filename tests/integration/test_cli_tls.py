"""`eos broker start` with an SSL listener and mutual TLS, and the client commands with
--command-config (Kafka's tools' way) and the --ssl-* flags, as a user runs them."""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading

import pytest

from tests.certs import CertificateAuthority
from tests.conftest import REPO_ROOT

WAIT_S = 60.0
LISTENING = re.compile(r"eos broker listening on (\S+) \(data dir ")


def _cli(*args: str, expect_code: int = 0) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "eos.cli", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, input="")
    assert done.returncode == expect_code, f"eos {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    """A broker process whose only listener is SSL with ssl.client.auth=required."""
    directory = tmp_path_factory.mktemp("cli-tls")
    ca = CertificateAuthority()
    ca_path = ca.write_ca(directory / "ca.pem")
    server = ca.issue_server(directory, "server")
    client = ca.issue_client(directory, "client", {"CN": "cli-user"})
    command = [sys.executable, "-m", "eos.cli", "broker", "start", "--data-dir", str(directory / "data"),
               "--config", "listeners=SSL://127.0.0.1:0",
               "--config", f"ssl.certificate.location={server.certificate_path}",
               "--config", f"ssl.key.location={server.key_path}",
               "--config", f"ssl.ca.location={ca_path}", "--config", "ssl.client.auth=required"]
    with open(directory / "broker.log", "ab") as log_file:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=log_file,
                                   stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    try:
        address = None
        while address is None:
            match = LISTENING.search(lines.get(timeout=WAIT_S))
            address = match.group(1) if match else None
        properties = directory / "client.properties"
        properties.write_text(f"# Kafka's client settings\nsecurity.protocol=SSL\nssl.ca.location={ca_path}\n"
                              f"ssl.certificate.location={client.certificate_path}\n"
                              f"ssl.key.location={client.key_path}\n")
        yield {"address": address, "properties": properties, "ca": ca_path, "client": client}
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=WAIT_S)


def test_client_commands_over_mutual_tls_with_command_config(tls_broker):
    common = ["--bootstrap-server", tls_broker["address"], "--command-config", str(tls_broker["properties"])]
    _cli("topics", "create", "tls-cli", "--partitions", "1", *common)
    assert "tls-cli" in _cli("topics", "list", *common).stdout
    done = subprocess.run([sys.executable, "-m", "eos.cli", "produce", "tls-cli", *common], cwd=REPO_ROOT,
                          input="one\ntwo\n", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    consumed = _cli("consume", "tls-cli", "--from-beginning", "--max-messages", "2", *common).stdout
    assert consumed.split() == ["one", "two"]
    # the flags say the same as the file
    flags = ["--bootstrap-server", tls_broker["address"], "--security-protocol", "SSL",
             "--ssl-ca-location", str(tls_broker["ca"]),
             "--ssl-certificate-location", str(tls_broker["client"].certificate_path),
             "--ssl-key-location", str(tls_broker["client"].key_path)]
    assert "tls-cli" in _cli("topics", "list", *flags).stdout
    _cli("txn", "list", *flags)


def test_a_client_without_a_certificate_gets_a_clear_error(tls_broker, tmp_path):
    fail_fast = tmp_path / "fail-fast.properties"
    fail_fast.write_text("default.api.timeout.ms=3000\nrequest.timeout.ms=1000\n")
    failed = _cli("topics", "list", "--bootstrap-server", tls_broker["address"], "--security-protocol", "SSL",
                  "--ssl-ca-location", str(tls_broker["ca"]), "--command-config", str(fail_fast), expect_code=1)
    assert "TLS handshake" in failed.stderr


def test_sasl_needs_a_user_and_sasl_plaintext_is_refused_by_name(tls_broker, tmp_path):
    failed = _cli("topics", "list", "--bootstrap-server", tls_broker["address"], "--security-protocol", "SASL_SSL",
                  expect_code=2)
    assert "needs sasl.username and sasl.password" in failed.stderr
    settings = tmp_path / "sasl-plaintext.properties"
    settings.write_text("security.protocol=SASL_PLAINTEXT\n")
    failed = _cli("topics", "list", "--bootstrap-server", tls_broker["address"], "--command-config", str(settings),
                  expect_code=2)
    assert "SASL_PLAINTEXT is not offered" in failed.stderr


def test_broker_refuses_plaintext_on_every_interface_without_consent(tmp_path):
    done = subprocess.run([sys.executable, "-m", "eos.cli", "broker", "start", "--data-dir", str(tmp_path / "d"),
                           "--host", "0.0.0.0", "--port", "0"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "allow.plaintext.remote" in done.stderr
    assert "listening" not in done.stdout

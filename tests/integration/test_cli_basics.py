"""`eos topics|produce|consume|dump-log` as a user runs them: `python -m eos.cli` subprocesses
against a real broker process, checked against what the test wrote."""
from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, BrokerProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    process = BrokerProcess(tmp_path_factory.mktemp("cli-basics") / "data")
    process.start()
    yield process
    process.close()


def run_cli(*args: str, broker=None, stdin: str | None = None, expect_code: int = 0) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "eos.cli", *args]
    if broker is not None:
        command += ["--bootstrap-server", broker.address]
    done = subprocess.run(command, cwd=REPO_ROOT, input=stdin, capture_output=True, text=True, timeout=120)
    assert done.returncode == expect_code, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def test_topics_lifecycle_and_refusals(broker):
    run_cli("topics", "create", "cli-orders", "--partitions", "3", "--config", "retention.ms=60000", broker=broker)
    assert "cli-orders" in run_cli("topics", "list", broker=broker).stdout.split()
    described = run_cli("topics", "describe", "cli-orders", broker=broker).stdout
    assert "PartitionCount: 3" in described and "retention.ms=60000" in described
    assert described.count("Partition: ") == 3
    assert "TOPIC_ALREADY_EXISTS" in run_cli("topics", "create", "cli-orders", broker=broker, expect_code=1).stderr
    assert "INVALID_PARTITIONS" in run_cli("topics", "create", "zero", "--partitions", "0", broker=broker,
                                           expect_code=1).stderr
    assert "INVALID_TOPIC_EXCEPTION" in run_cli("topics", "create", "bad/name", broker=broker, expect_code=1).stderr
    assert "INVALID_CONFIG" in run_cli("topics", "create", "cfg", "--config", "retention.ms=soon", broker=broker,
                                       expect_code=1).stderr
    assert "zero" not in run_cli("topics", "list", broker=broker).stdout.split()
    assert "Adding partitions succeeded!" in run_cli("topics", "alter", "--topic", "cli-orders", "--partitions", "5",
                                                     broker=broker).stdout
    assert run_cli("topics", "describe", "cli-orders", broker=broker).stdout.count("Partition: ") == 5
    assert "INVALID_PARTITIONS" in run_cli("topics", "alter", "cli-orders", "--partitions", "2", broker=broker,
                                           expect_code=1).stderr
    run_cli("topics", "delete", "cli-orders", broker=broker)
    assert "cli-orders" not in run_cli("topics", "list", broker=broker).stdout.split()


def test_produce_then_consume_round_trip(broker, tmp_path):
    run_cli("topics", "create", "cli-lines", "--partitions", "2", broker=broker)
    lines = [f"k{i % 5}:value-{i}" for i in range(500)]
    source = tmp_path / "lines.txt"
    source.write_text("\n".join(lines) + "\n")
    produced = run_cli("produce", "cli-lines", "--file", str(source), "--key-separator", ":", broker=broker)
    assert "Produced 500 records" in produced.stderr
    run_cli("produce", "cli-lines", broker=broker, stdin="from-stdin\n")
    consumed = run_cli("consume", "cli-lines", "--from-beginning", "--print-key", "--timeout-ms", "1500",
                       broker=broker).stdout.splitlines()
    assert len(consumed) == 501
    got = sorted(tuple(line.split("\t")) for line in consumed)
    want = sorted([tuple(line.split(":")) for line in lines] + [("null", "from-stdin")])
    assert got == want
    # The same key always went to the same partition (Kafka's murmur2 partitioner).
    by_offset = run_cli("consume", "cli-lines", "--from-beginning", "--print-key", "--print-offset",
                        "--timeout-ms", "1500", broker=broker).stdout.splitlines()
    partitions_per_key: dict[str, set[str]] = {}
    for line in by_offset:
        position, key, _ = line.split("\t")
        partitions_per_key.setdefault(key, set()).add(position.split(":")[0])
    assert all(len(p) == 1 for k, p in partitions_per_key.items() if k != "null")
    limited = run_cli("consume", "cli-lines", "--from-beginning", "--max-messages", "7", "--timeout-ms", "1500",
                      broker=broker).stdout.splitlines()
    assert len(limited) == 7


def test_produce_to_an_unknown_topic_fails_without_writing(broker):
    done = run_cli("produce", "no-such-topic", "--max-block-ms", "2000", broker=broker, stdin="x\n",
                   expect_code=1)
    assert "failed" in done.stderr or "UNKNOWN_TOPIC" in done.stderr


def test_dump_log_reads_segments_and_indexes(broker):
    run_cli("topics", "create", "cli-dump", "--partitions", "1", broker=broker)
    run_cli("produce", "cli-dump", broker=broker, stdin="".join(f"v{i}\n" for i in range(50)))
    segment_dir = os.path.join(broker.data_dir, "cli-dump-0")
    [log_file] = glob.glob(os.path.join(segment_dir, "*.log"))
    dumped = run_cli("dump-log", log_file, "--print-data-log").stdout
    assert "isvalid: true" in dumped and "payload: v0" in dumped and "payload: v49" in dumped
    assert "isvalid: false" not in dumped
    [time_index] = glob.glob(os.path.join(segment_dir, "*.timeindex"))
    assert run_cli("dump-log", time_index).stdout.startswith("Dumping")
    missing = run_cli("dump-log", os.path.join(segment_dir, "nope.log"), expect_code=1)
    assert "No such file" in missing.stderr and "Traceback" not in missing.stderr
    assert "not a .log" in run_cli("dump-log", os.path.join(segment_dir, "x.txt"), expect_code=1).stderr


def test_dump_log_reports_a_torn_tail(tmp_path):
    from eos.records.codec import encode_batch
    batch = encode_batch([b"a", b"b"])
    torn = tmp_path / "00000000000000000000.log"
    torn.write_bytes(batch + batch[:30])
    dumped = run_cli("dump-log", str(torn)).stdout
    assert dumped.count("baseOffset:") == 1
    assert f"Found 30 invalid bytes at position {len(batch)}" in dumped

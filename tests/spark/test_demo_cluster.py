"""`eos demo --brokers 3`: the demo's two-stage pipeline on a local 3-broker cluster with a
real ZooKeeper. Mid-copy, the broker leading most of stage 1's output partitions is killed
with SIGKILL inside an open transaction and restarted; later the whole pipeline (driver,
JVM, workers) is killed with SIGKILL inside another open transaction and restarted from
its checkpoints. The read_committed outputs must hold every order exactly once with exact
totals -- the demo's own check, whose report this test reads."""
from __future__ import annotations

import io

import pytest

from eos import demo

RECORDS = 8000


@pytest.mark.timeout(demo.PIPELINE_TIMEOUT_S + 300)
def test_the_demo_on_three_brokers_survives_a_broker_and_a_driver_killed_mid_transaction():
    report = io.StringIO()
    code = demo.run_demo(records=RECORDS, brokers=3, out=report)
    text = report.getvalue()
    assert code == 0, text
    assert "result: EXACTLY ONCE" in text, text
    broker_line = next(line for line in text.splitlines() if "broker crash:" in line)
    assert "killed broker" in broker_line and "records written in its open transaction" in broker_line, text
    crash_line = next(line for line in text.splitlines() if line.strip().startswith("crash:"))
    assert "killed the pipeline with SIGKILL" in crash_line, text
    assert f"{demo.PRICED}:" in text and f"{RECORDS:,} records, 0 duplicates" in text, text

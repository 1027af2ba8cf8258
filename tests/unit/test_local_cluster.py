"""LocalCluster's guard against a second start (no processes are spawned here)."""
from __future__ import annotations

import pytest

from eos.errors import EosError
from eos.local_cluster import BrokerProcess, LocalCluster


def test_a_second_start_is_refused_and_touches_nothing(tmp_path):
    cluster = LocalCluster(tmp_path / "c", brokers=1)
    running = BrokerProcess(0, 9092, tmp_path / "c" / "broker-0", tmp_path / "c" / "broker-0.log")
    cluster.processes[0] = running            # as after a first start
    with pytest.raises(EosError, match="started already"):
        cluster.start()
    assert cluster.processes == {0: running} and not (tmp_path / "c").exists()

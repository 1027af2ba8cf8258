"""ProducerIdManager: ids never repeat, also across restarts; the block is durable first."""
from __future__ import annotations

import json
import threading

import pytest

from eos.errors import StorageError
from txn_coordinator.producer_ids import ProducerIdManager


def test_ids_are_unique_and_blocks_are_reserved_before_use(tmp_path):
    path = tmp_path / "__producer_ids"
    manager = ProducerIdManager(path, block_size=10)
    assert not path.exists()  # nothing reserved until an id is asked for
    ids = [manager.next_id() for _ in range(25)]
    assert ids == list(range(25))
    assert json.loads(path.read_text())["block_end_exclusive"] == 30


def test_restart_skips_the_rest_of_the_block(tmp_path):
    path = tmp_path / "__producer_ids"
    first_run = ProducerIdManager(path, block_size=10)
    handed_out = {first_run.next_id() for _ in range(3)}
    second_run = ProducerIdManager(path, block_size=10)  # as after kill -9: no clean close
    assert second_run.next_id() == 10
    assert handed_out.isdisjoint({second_run.next_id() for _ in range(30)})


def test_threads_never_share_an_id(tmp_path):
    manager = ProducerIdManager(tmp_path / "ids", block_size=7)
    results: list[list[int]] = [[] for _ in range(4)]

    def take(bucket):
        for _ in range(200):
            bucket.append(manager.next_id())

    threads = [threading.Thread(target=take, args=(bucket,)) for bucket in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = [i for bucket in results for i in bucket]
    assert len(set(everything)) == 800


@pytest.mark.parametrize("content", ["", "{", '{"version": 1}', '{"version": 9, "block_end_exclusive": 5}',
                                     '{"version": 1, "block_end_exclusive": -4}'])
def test_unreadable_file_refuses_to_start(tmp_path, content):
    path = tmp_path / "ids"
    path.write_text(content)
    with pytest.raises(StorageError, match="refusing"):
        ProducerIdManager(path)


def test_advance_past_skips_ids_found_elsewhere_durably(tmp_path):
    path = tmp_path / "__producer_ids"
    manager = ProducerIdManager(path, block_size=10)
    assert manager.next_id() == 0
    manager.advance_past(41)               # Kafka's producers 0..41 live in an adopted log
    assert manager.peek_next_id() == 42 and manager.next_id() == 42
    manager.advance_past(5)                # already behind: nothing changes
    assert manager.next_id() == 43
    assert ProducerIdManager(path, block_size=10).next_id() >= 44   # also after a restart
    fresh = ProducerIdManager(tmp_path / "other", block_size=10)
    fresh.advance_past(7)
    assert ProducerIdManager(tmp_path / "other", block_size=10).next_id() == 8

"""TopicRegistry: Kafka's name rules, staged changes, persistence across instances."""
from __future__ import annotations

import json

import pytest

from broker.topics import TOPICS_DIR_NAME, TopicRegistry, validate_topic_name
from eos.config import TopicConfig
from eos.errors import (
    EosError,
    ErrorCode,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)


@pytest.mark.parametrize("name", ["a", "orders", "Orders.v2_x-1", "__consumer_offsets", "x" * 249])
def test_legal_names(name):
    validate_topic_name(name)


@pytest.mark.parametrize("name, words", [
    ("", "empty"), (".", "cannot be"), ("..", "cannot be"), ("x" * 250, "250 characters"),
    ("a b", "outside"), ("a/b", "outside"), ("ü", "outside"), ("a\n", "outside"),
])
def test_illegal_names_name_the_rule(name, words):
    with pytest.raises(InvalidTopicError, match=words) as info:
        validate_topic_name(name)
    assert info.value.code == ErrorCode.INVALID_TOPIC_EXCEPTION


def test_prepare_changes_nothing_and_commit_persists(tmp_path):
    registry = TopicRegistry(tmp_path)
    registry.load()
    info = registry.prepare_create("orders", 3, 1, {"retention.ms": "1000"})
    assert registry.get("orders") is None
    assert list((tmp_path / TOPICS_DIR_NAME).iterdir()) == []
    registry.commit(info)
    assert registry.get("orders") == info
    assert info.config.retention_ms == 1000 and info.partition_count == 3

    reloaded = TopicRegistry(tmp_path)
    [again] = reloaded.load()
    assert again == info


def test_defaults_and_validation(tmp_path):
    registry = TopicRegistry(tmp_path, default_config=TopicConfig(segment_bytes=4096),
                             default_num_partitions=2)
    registry.load()
    info = registry.prepare_create("t", -1, -1, None)
    assert info.partition_count == 2 and info.config.segment_bytes == 4096
    assert registry.prepare_create("t", 0, 0, None).partition_count == 2  # proto3 "unset"
    with pytest.raises(InvalidPartitionsError, match="at least 1"):
        registry.prepare_create("t", -3, 1, None)
    for bad_factor in (-2, 2):
        with pytest.raises(EosError) as exc:
            registry.prepare_create("t", 1, bad_factor, None)
        assert exc.value.code == ErrorCode.INVALID_REPLICATION_FACTOR
    with pytest.raises(EosError) as exc:
        registry.prepare_create("t", 1, 3, None)
    assert exc.value.code == ErrorCode.INVALID_REPLICATION_FACTOR
    with pytest.raises(InvalidConfigError, match="no.such"):
        registry.prepare_create("t", 1, 1, {"no.such": "1"})
    with pytest.raises(InvalidConfigError, match="retention.ms"):
        registry.prepare_create("t", 1, 1, {"retention.ms": "soon"})
    with pytest.raises(InvalidPartitionsError):
        registry.prepare_create("t", 10**6, 1, None)


def test_duplicates_and_collisions(tmp_path):
    registry = TopicRegistry(tmp_path)
    registry.load()
    registry.commit(registry.prepare_create("a.b", 1, 1, None))
    with pytest.raises(TopicAlreadyExistsError):
        registry.prepare_create("a.b", 1, 1, None)
    with pytest.raises(InvalidTopicError, match="collides"):
        registry.prepare_create("a_b", 1, 1, None)


def test_grow_never_shrinks(tmp_path):
    registry = TopicRegistry(tmp_path)
    registry.load()
    registry.commit(registry.prepare_create("t", 2, 1, None))
    for count in (1, 2):
        with pytest.raises(InvalidPartitionsError):
            registry.prepare_grow("t", count)
    with pytest.raises(UnknownTopicOrPartitionError):
        registry.prepare_grow("nope", 3)
    grown = registry.prepare_grow("t", 5)
    assert registry.get("t").partition_count == 2
    registry.commit(grown)
    assert TopicRegistry(tmp_path).load()[0].partition_count == 5


def test_remove_and_reload(tmp_path):
    registry = TopicRegistry(tmp_path)
    registry.load()
    registry.commit(registry.prepare_create("gone", 1, 1, None))
    registry.commit(registry.prepare_create("kept", 1, 1, None))
    registry.remove("gone")
    with pytest.raises(UnknownTopicOrPartitionError):
        registry.remove("gone")
    assert [t.name for t in TopicRegistry(tmp_path).load()] == ["kept"]


def test_leftover_temp_file_is_ignored_and_corrupt_file_refused(tmp_path):
    registry = TopicRegistry(tmp_path)
    registry.load()
    registry.commit(registry.prepare_create("t", 1, 1, None))
    topics_dir = tmp_path / TOPICS_DIR_NAME
    (topics_dir / "u.json.tmp").write_text("{half")
    assert [t.name for t in TopicRegistry(tmp_path).load()] == ["t"]
    assert not (topics_dir / "u.json.tmp").exists()
    (topics_dir / "t.json").write_text(json.dumps({"version": 1, "name": "t"}))
    with pytest.raises(EosError, match="t.json"):
        TopicRegistry(tmp_path).load()

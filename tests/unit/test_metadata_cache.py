"""The broker's metadata cache: controller-epoch fencing, full and partial updates."""
import pytest

from broker.metadata.cache import BrokerEndpoint, MetadataCache, PartitionInfo
from eos.errors import StaleControllerEpochError

BROKERS = [BrokerEndpoint(0, "127.0.0.1", 9092), BrokerEndpoint(1, "127.0.0.1", 9093, "r1")]


def part(topic, partition, leader, epoch=0, replicas=(0, 1), isr=(0, 1)):
    return PartitionInfo(topic, partition, leader, epoch, tuple(replicas), tuple(isr))


def test_full_update_replaces_and_partial_merges():
    cache = MetadataCache()
    cache.update(controller_id=0, controller_epoch=1, brokers=BROKERS,
                 partitions=[part("a", 0, 0), part("a", 1, 1), part("b", 0, 1)],
                 topic_configs={"a": {"retention.ms": "1000"}}, full=True)
    cache.update(controller_id=0, controller_epoch=1, brokers=BROKERS, partitions=[part("a", 1, 0, epoch=1)],
                 topic_configs={}, full=False)
    snapshot = cache.snapshot
    assert cache.partition("a", 1).leader == 0 and cache.partition("a", 1).leader_epoch == 1
    assert cache.partition("b", 0).leader == 1          # kept by the partial update
    assert snapshot.topic_configs["a"] == {"retention.ms": "1000"}
    cache.update(controller_id=1, controller_epoch=2, brokers=BROKERS[:1], partitions=[part("c", 0, 0)],
                 topic_configs={}, full=True)
    assert set(cache.snapshot.topics()) == {"c"}
    assert set(cache.snapshot.brokers) == {0}
    assert cache.snapshot.controller_id == 1


def test_an_older_controller_changes_nothing():
    cache = MetadataCache()
    cache.update(controller_id=1, controller_epoch=5, brokers=BROKERS, partitions=[part("a", 0, 1)],
                 topic_configs={}, full=True)
    before = cache.snapshot
    with pytest.raises(StaleControllerEpochError):
        cache.update(controller_id=0, controller_epoch=4, brokers=BROKERS[:1], partitions=[part("a", 0, 0)],
                     topic_configs={}, full=True)
    assert cache.snapshot is before


def test_deleted_topics_leave_a_partial_update():
    cache = MetadataCache()
    cache.update(controller_id=0, controller_epoch=1, brokers=BROKERS, partitions=[part("a", 0, 0), part("b", 0, 0)],
                 topic_configs={"a": {}, "b": {}}, full=True)
    cache.update(controller_id=0, controller_epoch=1, brokers=BROKERS, partitions=[], topic_configs={},
                 full=False, deleted_topics=["a"])
    assert set(cache.snapshot.topics()) == {"b"}
    assert "a" not in cache.snapshot.topic_configs


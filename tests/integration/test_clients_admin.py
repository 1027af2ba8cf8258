"""eos.Admin against a real broker process."""
from __future__ import annotations

import pytest

import eos
from eos.errors import (
    EosError,
    InvalidPartitionsError,
    InvalidTopicError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from eos.types import TopicPartition
from tests.metrics import scrape


def test_topic_lifecycle(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("orders", partitions=3, config={"retention.ms": "604800000"})
        admin.create_topics(["a", {"name": "b", "partitions": 2}, ("c", 4, 1, {"cleanup.policy": "delete"})])
        assert admin.list_topics() == ["a", "b", "c", "orders"]
        described = admin.describe_topic("orders")
        assert described["name"] == "orders" and described["internal"] is False
        assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
        assert all(p["leader"] >= 0 and p["replicas"] == [p["leader"]] and p["isr"] == [p["leader"]]
                   for p in described["partitions"])
        assert described["configs"]["retention.ms"] == "604800000"
        admin.create_partitions("b", 5)
        assert len(admin.describe_topic("b")["partitions"]) == 5
        admin.delete_topic("a")
        assert "a" not in admin.list_topics()
        cluster = admin.describe_cluster()
        assert cluster["controller_id"] in cluster["brokers"] and cluster["cluster_id"]


def test_topics_survive_a_restart(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("durable", partitions=2)
    broker.restart()
    with eos.Admin(broker.address) as admin:
        assert len(admin.describe_topic("durable")["partitions"]) == 2


def test_errors_are_eos_exceptions_naming_the_topic(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("dup")
        with pytest.raises(TopicAlreadyExistsError, match="dup"):
            admin.create_topic("dup")
        with pytest.raises(InvalidTopicError):
            admin.create_topic("bad name!")
        with pytest.raises(UnknownTopicOrPartitionError, match="ghost"):
            admin.delete_topic("ghost")
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.describe_topic("ghost")
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions("dup", 1)      # partitions can only be added
        with pytest.raises(EosError):
            admin.create_topic("neg", partitions=1, replication_factor=3)   # one broker only
        with pytest.raises(TypeError):
            admin.create_topic("t", partitions="3")


def test_list_offsets(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("lo", partitions=1)
        with eos.Producer(broker.address) as producer:
            producer.send_batch("lo", [b"a", b"b", b"c"], timestamps_ms=[1000, 2000, 3000]).result(30)
        tp = TopicPartition("lo", 0)
        assert admin.list_offsets({tp: "earliest"}) == {tp: 0}
        assert admin.list_offsets({tp: "latest"}) == {tp: 3}
        assert admin.list_offsets({tp: 1500}) == {tp: 1}
        assert admin.list_offsets({tp: 9999}) == {tp: -1}
        assert admin.list_offsets({tp: "latest"}, isolation_level="read_committed") == {tp: 3}
        with pytest.raises(ValueError, match="offset spec"):
            admin.list_offsets({tp: "newest"})
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.list_offsets({TopicPartition("ghost", 0): "latest"})


def test_list_offsets_right_after_describe_reuses_its_metadata(inprocess_broker_factory):
    """describe_topic then list_offsets (the Spark source's snapshot of a topic) asks
    Metadata once: the describe's answer routes the ListOffsets that follow. A partition
    that answer did not have is asked Metadata for, not refused as unknown."""
    broker = inprocess_broker_factory({"metrics.port": "0"})
    url = f"http://127.0.0.1:{broker.server.metrics_port}/metrics"

    def requests(scraped, name: str) -> float:
        return scraped.total("eos_network_requests_total", request=name)

    with eos.Admin(broker.address) as admin:
        admin.create_topic("snap", partitions=3)
        before = scrape(url)
        tps = [TopicPartition("snap", p["partition"]) for p in admin.describe_topic("snap")["partitions"]]
        assert admin.list_offsets({tp: "earliest" for tp in tps}) == dict.fromkeys(tps, 0)
        assert admin.list_offsets({tp: "latest" for tp in tps}, isolation_level="read_committed") == dict.fromkeys(tps, 0)
        after = scrape(url)
        assert requests(after, "Metadata") - requests(before, "Metadata") == 1
        assert requests(after, "ListOffsets") - requests(before, "ListOffsets") == 2

        with eos.Admin(broker.address) as other:
            other.create_partitions("snap", 4)
        added = TopicPartition("snap", 3)
        assert admin.list_offsets({added: "latest"}) == {added: 0}
        assert requests(scrape(url), "Metadata") - requests(after, "Metadata") == 1


def test_internal_topics_only_when_asked(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("visible")
        assert all(not name.startswith("__") for name in admin.list_topics())
        assert set(admin.list_topics()) <= set(admin.list_topics(include_internal=True))

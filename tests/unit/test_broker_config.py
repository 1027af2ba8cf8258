"""BrokerConfig.from_dict: Kafka's broker names parsed into typed settings; a bad value or
an unknown name is an error that names it, never a silent default."""
from __future__ import annotations

import pytest

from broker.server import BrokerConfig
from eos.errors import InvalidConfigError


def test_defaults():
    config = BrokerConfig.from_dict(None)
    assert config.offsets_topic_num_partitions == 50
    assert config.transaction_state_log_num_partitions == 50


@pytest.mark.parametrize("name, raw, attribute, value", [
    ("offsets.topic.num.partitions", "3", "offsets_topic_num_partitions", 3),
    ("offsets.topic.num.partitions", " 1 ", "offsets_topic_num_partitions", 1),
    ("transaction.state.log.num.partitions", "5", "transaction_state_log_num_partitions", 5),
    ("num.partitions", "4", "num_partitions", 4),
])
def test_values_are_parsed(name, raw, attribute, value):
    assert getattr(BrokerConfig.from_dict({name: raw}), attribute) == value


@pytest.mark.parametrize("name, raw, words", [
    ("offsets.topic.num.partitions", "0", "must be >= 1"),
    ("offsets.topic.num.partitions", "-2", "must be >= 1"),
    ("offsets.topic.num.partitions", "many", "not an integer"),
    ("offsets.topics.num.partitions", "3", "unknown broker config"),
])
def test_bad_values_name_the_problem(name, raw, words):
    with pytest.raises(InvalidConfigError) as raised:
        BrokerConfig.from_dict({name: raw})
    assert words in str(raised.value) and name in str(raised.value)


"""The error table mirrors the wire enum, and topic configs validate as Kafka's do."""
import pytest

from eos import errors
from eos.config import TopicConfig, kwargs_to_kafka
from eos.v1 import common_pb2


def test_error_codes_mirror_the_wire_enum():
    wire = {v.name: v.number for v in common_pb2.ErrorCode.DESCRIPTOR.values}
    local = {e.name: int(e) for e in errors.ErrorCode}
    assert local == wire


@pytest.mark.parametrize("code, reaction", [
    (errors.ErrorCode.NOT_LEADER_OR_FOLLOWER, errors.Reaction.RETRY),
    (errors.ErrorCode.CONCURRENT_TRANSACTIONS, errors.Reaction.RETRY),
    (errors.ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, errors.Reaction.ABORT),
    (errors.ErrorCode.TRANSACTION_ABORTABLE, errors.Reaction.ABORT),
    (errors.ErrorCode.PRODUCER_FENCED, errors.Reaction.FATAL),
    (errors.ErrorCode.INVALID_PRODUCER_EPOCH, errors.Reaction.FATAL),
    (errors.ErrorCode.INVALID_TOPIC_EXCEPTION, errors.Reaction.FATAL),
])
def test_reactions(code, reaction):
    assert errors.reaction_for(code) is reaction


def test_error_for_returns_the_specific_class_with_message():
    e = errors.error_for(3, "no topic 'x'")
    assert isinstance(e, errors.UnknownTopicOrPartitionError)
    assert e.code is errors.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert e.retriable and not e.fatal
    assert "no topic 'x'" in str(e)
    generic = errors.error_for(errors.ErrorCode.NON_EMPTY_GROUP)
    assert type(generic) is errors.EosError and generic.code is errors.ErrorCode.NON_EMPTY_GROUP


def test_topic_config_defaults_are_kafkas():
    c = TopicConfig()
    assert c.segment_bytes == 1 << 30
    assert c.retention_ms == 7 * 24 * 3600 * 1000
    assert c.index_interval_bytes == 4096
    assert c.max_message_bytes == 1048588


def test_topic_config_overrides_and_errors_name_the_key():
    c = TopicConfig.from_overrides({"segment.bytes": "1024", "retention.ms": "-1"})
    assert (c.segment_bytes, c.retention_ms) == (1024, -1)
    with pytest.raises(errors.InvalidConfigError, match="segment.bytes"):
        TopicConfig.from_overrides({"segment.bytes": "ten"})
    with pytest.raises(errors.InvalidConfigError, match="retention.ms"):
        TopicConfig.from_overrides({"retention.ms": "-5"})
    with pytest.raises(errors.InvalidConfigError, match="no.such"):
        TopicConfig.from_overrides({"no.such": "1"})
    with pytest.raises(errors.InvalidConfigError, match="compression.type"):
        TopicConfig.from_overrides({"compression.type": "brotli"})


def test_kwargs_become_kafka_names():
    assert kwargs_to_kafka({"transaction_timeout_ms": 1}) == {"transaction.timeout.ms": 1}

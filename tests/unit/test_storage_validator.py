"""broker.storage.validator: the pure checks and stamping of an append (Kafka's LogValidator),
on their own, without a log. Log's own tests cover them again through append_as_leader."""
from __future__ import annotations

import dataclasses

import pytest

from broker.storage.validator import AppendOrigin, assign_offsets, copy_and_stamp, prepare_batches
from eos.config import TopicConfig
from eos.errors import InvalidRecordError, MessageTooLargeError
from eos.records.codec import encode_batch
from eos.records.header import TIMESTAMP_TYPE_MASK, iter_headers, verify_crc
from tests.storage_batches import make_batch

CONFIG = TopicConfig()


def _prepare(records, origin=AppendOrigin.CLIENT, config=CONFIG):
    return prepare_batches(records, origin, config, "t-0", "t")


def test_a_request_is_summarised_batch_by_batch():
    request = make_batch(3, timestamp_ms=[5, 9, 7]) + make_batch(2, timestamp_ms=4)
    prepared = _prepare(request)
    assert [h.records_count for h in prepared.headers] == [3, 2]
    assert prepared.size_bytes == len(request)
    assert (prepared.record_count, prepared.max_timestamp_ms) == (5, 9)
    assert prepared.producer_header is None and prepared.marker is None


def test_the_limits_come_from_the_topics_config():
    batch = make_batch(1, value_bytes=500)
    _prepare(batch)
    small = dataclasses.replace(CONFIG, max_message_bytes=len(batch) - 1)
    with pytest.raises(MessageTooLargeError, match="max.message.bytes"):
        _prepare(batch, config=small)


def test_a_follower_may_copy_what_a_client_may_not_send():
    two_producers = (make_batch(1, producer_id=1, producer_epoch=0, base_sequence=0)
                     + make_batch(1, producer_id=2, producer_epoch=0, base_sequence=0))
    with pytest.raises(InvalidRecordError, match="one batch per partition per request"):
        _prepare(two_producers)
    assert len(_prepare(two_producers, origin=AppendOrigin.REPLICATION).headers) == 2
    keyless = encode_batch([b"v"])
    compacted = dataclasses.replace(CONFIG, cleanup_policy="compact")
    with pytest.raises(InvalidRecordError, match="needs a key"):
        _prepare(keyless, config=compacted)
    assert _prepare(keyless, origin=AppendOrigin.REPLICATION, config=compacted).record_count == 1


def test_the_copy_is_stamped_and_the_request_left_as_it_was():
    request = make_batch(3) + make_batch(2)
    original = bytes(request)
    headers = _prepare(request).headers
    buf, crcs, max_timestamp_ms = copy_and_stamp(request, headers, 7, log_append_time_ms=1_234)
    assert request == original
    assigned = assign_offsets(buf, headers, 100, 7, 1_234, crcs)
    assert [h.base_offset for h in assigned] == [100, 103] and max_timestamp_ms == 1_234
    reparsed = list(iter_headers(bytes(buf)))
    assert reparsed == assigned
    for header in reparsed:
        verify_crc(bytes(buf), header)              # the new CRCs cover the new timestamps
        assert header.partition_leader_epoch == 7 and header.attributes & TIMESTAMP_TYPE_MASK

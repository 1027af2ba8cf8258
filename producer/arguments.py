"""What callers hand the producer, checked and converted before anything is queued.

Keys, values and headers become bytes (str as UTF-8) or a TypeError; send_batch's lists
become aligned lists (with their timestamps) or a ValueError; the transactional
calls' arguments (a participant's partitions, a consumer's group metadata, the offsets
to commit) become what the coordinator calls carry, or a TypeError/ValueError naming the
argument at fault. Pure functions: nothing here touches the producer's state.
"""
from __future__ import annotations

from typing import Sequence

from eos.v1 import group_pb2


def as_bytes(what: str, data):
    """The bytes of a key or value (str is encoded as UTF-8); TypeError for anything else."""
    if data is None or type(data) is bytes:
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        return data.encode("utf-8")
    raise TypeError(f"{what} must be bytes, bytearray, str or None, got {type(data).__name__}")


def check_headers(headers) -> list | None:
    """Headers (a dict, or (str, bytes-like | str | None) pairs) as a list of pairs, or
    None when there are none."""
    if not headers:
        return None
    items = headers.items() if isinstance(headers, dict) else headers
    checked = []
    for item in items:
        try:
            hkey, hvalue = item
        except (TypeError, ValueError):
            raise TypeError(f"headers must be (str, bytes | None) pairs, got {item!r}") from None
        if not isinstance(hkey, str):
            raise TypeError(f"header key must be str, got {type(hkey).__name__}")
        checked.append((hkey, as_bytes(f"header {hkey!r} value", hvalue)))
    return checked


def normalise_many(what: str, items: Sequence) -> list:
    """A list of bytes-or-None from a sequence, converting only when needed."""
    items = items if isinstance(items, list) else list(items)
    kinds = set(map(type, items))
    if kinds <= {bytes, type(None)}:
        return items
    return [as_bytes(what, item) for item in items]


def bulk_records(values: Sequence, keys: Sequence | None, timestamps_ms, headers: Sequence | None,
                 now_ms: int) -> tuple[list, list | None, list[int], int, list | None]:
    """send_batch's records as aligned lists: (values, keys or None, timestamps, the one
    timestamp of them all or -1, headers or None). `timestamps_ms` is None (all `now_ms`),
    one non-negative int for all, or one per value; ValueError/TypeError otherwise."""
    values = normalise_many("value", values)
    count = len(values)
    if keys is not None:
        keys = normalise_many("key", keys)
        if len(keys) != count:
            raise ValueError(f"keys has {len(keys)} items for {count} values")
    single_timestamp_ms = -1
    if timestamps_ms is None:
        single_timestamp_ms = now_ms
        timestamps = [now_ms] * count
    elif isinstance(timestamps_ms, int) and not isinstance(timestamps_ms, bool):
        if timestamps_ms < 0:
            raise ValueError(f"timestamps_ms must be non-negative, got {timestamps_ms}")
        single_timestamp_ms = timestamps_ms
        timestamps = [timestamps_ms] * count
    else:
        timestamps = list(timestamps_ms)
        if len(timestamps) != count:
            raise ValueError(f"timestamps_ms has {len(timestamps)} items for {count} values")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in timestamps):
            raise ValueError("timestamps_ms must hold non-negative ints")
    if headers is not None:
        headers = [check_headers(h) for h in headers]
        if len(headers) != count:
            raise ValueError(f"headers has {len(headers)} items for {count} values")
    return values, keys, timestamps, single_timestamp_ms, headers


def check_participant_of(participant_of, transactional_id: str | None) -> None:
    """A participant producer's (owner producer id, owner epoch): two ints >= 0, and a
    transactional id (the owner's) to write into; TypeError/ValueError otherwise."""
    try:
        owner_id, owner_epoch = participant_of
    except (TypeError, ValueError):
        raise TypeError(f"participant_of must be (owner producer id, owner producer epoch), "
                        f"got {participant_of!r}") from None
    if (isinstance(owner_id, bool) or not isinstance(owner_id, int) or owner_id < 0
            or isinstance(owner_epoch, bool) or not isinstance(owner_epoch, int) or owner_epoch < 0):
        raise ValueError(f"participant_of needs a producer id and epoch >= 0, got {participant_of!r}")
    if transactional_id is None:
        raise ValueError("a participant writes into the transaction of a transactional.id: "
                         "give transactional_id= (the owner's)")


def participant_partitions(partitions, participant: bool) -> list[tuple[str, int]]:
    """init_transactions(partitions=...) checked: sorted distinct (topic, partition) pairs;
    only a participant may name any."""
    if partitions is None:
        return []
    if not participant:
        raise ValueError("partitions are registered at initialisation only for a participant "
                         "(Producer.participant or participant_of=)")
    if isinstance(partitions, (str, bytes)):
        raise TypeError(f"partitions must be (topic, partition) pairs, got {partitions!r}")
    checked = set()
    for tp in partitions:
        try:
            topic, partition = tp
        except (TypeError, ValueError):
            raise TypeError(f"partitions must be (topic, partition) pairs, got {tp!r}") from None
        if (not isinstance(topic, str) or not topic or isinstance(partition, bool)
                or not isinstance(partition, int) or partition < 0):
            raise ValueError(f"partition {tp!r} is not a (topic, partition >= 0)")
        checked.add((topic, partition))
    return sorted(checked)


def group_fields(group_metadata) -> tuple[str, int, str, str]:
    """(group id, generation id, member id, group instance id) of a consumer's group
    metadata, or of a plain group id (generation -1: no generation check)."""
    if isinstance(group_metadata, str):
        if not group_metadata:
            raise ValueError("the group id must not be empty")
        return group_metadata, -1, "", ""
    try:
        group_id = group_metadata.group_id
        generation_id = group_metadata.generation_id
        member_id = group_metadata.member_id
        instance_id = group_metadata.group_instance_id
    except AttributeError:
        raise TypeError(f"group_metadata must be the consumer's group_metadata() (group_id, generation_id, "
                        f"member_id, group_instance_id) or a group id str, got {group_metadata!r}") from None
    if not isinstance(group_id, str) or not group_id:
        raise ValueError(f"group_metadata.group_id must be a non-empty str, got {group_id!r}")
    if isinstance(generation_id, bool) or not isinstance(generation_id, int):
        raise TypeError(f"group_metadata.generation_id must be an int, got {generation_id!r}")
    return group_id, generation_id, member_id or "", instance_id or ""


def offsets_to_commit(offsets) -> list:
    """OffsetToCommit messages, checked before anything is sent."""
    if not isinstance(offsets, dict):
        raise TypeError(f"offsets must be a dict of TopicPartition -> offset, got {type(offsets).__name__}")
    out = []
    for tp, value in offsets.items():
        try:
            topic, partition = tp
        except (TypeError, ValueError):
            raise TypeError(f"offsets keys must be TopicPartition(topic, partition), got {tp!r}") from None
        metadata = ""
        offset = value
        if not isinstance(value, int):
            offset = getattr(value, "offset", None)
            metadata = getattr(value, "metadata", "") or ""
        if (not isinstance(topic, str) or not topic or isinstance(partition, bool) or not isinstance(partition, int)
                or partition < 0):
            raise ValueError(f"offsets key {tp!r} is not a (topic, partition >= 0)")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset for {topic}-{partition} must be an int >= 0, got {value!r}")
        out.append(group_pb2.OffsetToCommit(topic=topic, partition=partition, offset=offset, leader_epoch=-1,
                                            metadata=metadata))
    return out


__all__ = ["as_bytes", "check_headers", "group_fields", "normalise_many", "offsets_to_commit",
           "participant_partitions"]

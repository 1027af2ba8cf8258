"""`eos delete-records`: after kafka-delete-records.sh.

    eos delete-records --offset-json-file offsets.json

The file is kafka-delete-records' own:

    {"partitions": [{"topic": "orders", "partition": 0, "offset": 1200},
                    {"topic": "orders", "partition": 1, "offset": -1}], "version": 1}

Records before each offset are deleted (-1: up to the high watermark). Each partition's
line says its low watermark (the first offset still readable on every live replica) or its
error, and the exit code is 1 when any partition failed. Needs DELETE on the topics.
"""
from __future__ import annotations

import json
import sys

FILE_VERSION = 1


def read_partition_file(text: str, source: str, needs: str, value_of) -> dict[tuple[str, int], object]:
    """Kafka's tools' partition files ({"partitions": [{"topic", "partition", ...}], "version": 1},
    as kafka-delete-records and kafka-reassign-partitions read them): {(topic, partition):
    value_of(entry)}, checked whole before anything is done; ValueError naming the problem.
    `value_of(entry)` raises KeyError, TypeError or ValueError for an entry without its
    value; `needs` says what that value is, for the message."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source} is not JSON: {exc}") from None
    entries = document.get("partitions") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f'{source} must hold {{"partitions": [{{"topic", "partition", ...}}, ...], '
                         f'"version": 1}} with at least one partition')
    if document.get("version", FILE_VERSION) != FILE_VERSION:
        raise ValueError(f"{source}: version {document.get('version')!r} is not supported (1 is)")
    values: dict[tuple[str, int], object] = {}
    for index, entry in enumerate(entries):
        topic = entry.get("topic") if isinstance(entry, dict) else None
        partition = entry.get("partition") if isinstance(entry, dict) else None
        try:
            if not isinstance(topic, str) or not topic or not _is_int(partition) or partition < 0:
                raise ValueError
            value = value_of(entry)
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{source}: partition entry {index} must have a topic, a partition >= 0 and "
                             f"{needs}, got {entry!r}") from None
        if (topic, partition) in values:
            raise ValueError(f"{source}: {topic}-{partition} is listed twice")
        values[(topic, partition)] = value
    return values


def read_offsets(text: str, source: str) -> dict[tuple[str, int], int]:
    """{(topic, partition): offset} from kafka-delete-records' JSON (see read_partition_file)."""
    return read_partition_file(text, source, "an offset >= -1", _offset_of)


def _offset_of(entry: dict) -> int:
    offset = entry["offset"]
    if not _is_int(offset) or offset < -1:
        raise ValueError(offset)
    return offset


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def cmd_delete_records(args) -> int:
    import eos
    from eos.cli import client_config

    with open(args.offset_json_file, encoding="utf-8") as handle:
        offsets = read_offsets(handle.read(), args.offset_json_file)
    print("Executing records delete operation")
    with eos.Admin(bootstrap=args.bootstrap_server, config=client_config(args)) as admin:
        results = admin.delete_records(offsets)
    print("Records delete operation completed:")
    failed = False
    for tp in sorted(results):
        answer = results[tp]
        if isinstance(answer, Exception):
            failed = True
            print(f"partition: {tp.topic}-{tp.partition}\terror: {answer.code.name}: {answer}")
        else:
            print(f"partition: {tp.topic}-{tp.partition}\tlow_watermark: {answer}")
    sys.stdout.flush()
    return 1 if failed else 0


def add_commands(client_command) -> None:
    """Register `eos delete-records` on the `eos` parser."""
    command = client_command("delete-records", help="delete a partition's records before an offset "
                                                    "(after kafka-delete-records.sh)")
    command.add_argument("--offset-json-file", required=True, metavar="FILE",
                         help='{"partitions": [{"topic": T, "partition": P, "offset": O}], "version": 1}; '
                              "offset -1 is the high watermark")
    command.set_defaults(handler=cmd_delete_records)

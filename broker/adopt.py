"""`eos topics adopt`: take over partition directories that Apache Kafka wrote.

Theory of operation
-------------------
eos stores partitions in Kafka's own formats, so a Kafka user can move a topic's data over
instead of copying it record by record: stop Kafka cleanly, then adopt the topic's
`<topic>-<n>` directories into a stopped eos broker's data directory. Nothing Kafka wrote is
trusted without a check, and a refusal changes nothing:

1. *Find*: the topic's directories in the Kafka log dir must be partitions 0..n-1.
2. *Verify* each directory, reading only: every file is one Kafka keeps in a partition
   directory (a `.deleted`, `.cleaned` or `.swap` file means Kafka did not shut down
   cleanly: refused); every `.log` is whole v2 batches with good CRCs, offsets increasing
   from its base offset, no torn tail; `.index` / `.timeindex` hold increasing entries that
   point inside their segment; `.txnindex`, producer snapshots and the
   `leader-epoch-checkpoint` parse (and the snapshots pass their CRC).
   v2 only: a segment holding v0/v1 message sets (written before Kafka 0.11, or under an
   older `log.message.format.version`) is refused, naming the segment. The eos broker can
   read such segments in its own data dir, but this check, and the scan for producer ids
   (which v0/v1 do not have), read v2 batch headers only.
3. *Stage*: copy the directories into the data directory under a staging name and open each
   with eos's own recovery (`Log.open` with no recovery point: every batch scanned, indexes
   and producer state rebuilt where eos would). The adopted log must end where the scan
   said, and must have no transaction open: its coordinator's state is in Kafka's
   `__transaction_state`, which is not adopted, so an open one could never end and would
   hold the last stable offset back for good.
4. *Commit*, in an order a crash cannot turn into half an adoption: the producer-id file
   first moves past every producer id the logs hold (Kafka numbers producers from 0; a new
   eos producer handed one of those ids would collide with Kafka's history and fail with
   OUT_OF_ORDER_SEQUENCE), then the staged directories are renamed into place, then the
   topic is registered. A broker that starts between the last two steps deletes the
   unregistered directories (its start-up sweep), leaving the data dir as before.

The data directory's lock is held throughout, so a running broker makes this refuse.

Only a single broker's data directory (a cluster of one) can adopt: on a ZooKeeper cluster,
producer ids and topics belong to the controller. A limit: a ZooKeeper cluster broker's
data dir is *not* refused, because nothing in it says it belongs to a cluster. Its
meta.properties holds a cluster id and a node id, exactly as a single broker's does, and its
other files are the same ones. `zookeeper.connect` is set only when the broker is started,
and adopt is not given that setting. Adopting into a cluster broker's data dir would
register a topic the controller does not know. It would also move past Kafka's producer ids
in a file the cluster never reads, because a cluster takes its producer ids from ZooKeeper,
so a new producer could still be handed one of Kafka's ids. Do not run adopt on such a
data dir.
"""
from __future__ import annotations

import dataclasses
import mmap
import os
import re
import shutil
from pathlib import Path
from typing import Callable, Mapping

from broker.data_dir import DataDirLock
from broker.storage.index import IndexCorruptError, OffsetIndex, TimeIndex
from broker.storage.leader_epoch import decode_checkpoint
from broker.storage.log import Log
from broker.storage.producer_state import CorruptSnapshotError, decode_snapshot
from broker.storage.txn_index import read_txn_index_file
from broker.topics import TOPICS_DIR_NAME, TopicRegistry
from eos.errors import CorruptRecordError, EosError, StorageError
from eos.files import fsync_directory
from eos.records.header import NO_PRODUCER_ID, iter_headers, verify_crc
from eos.records.legacy import LEGACY_MAGICS, MAGIC_AT
from txn_coordinator.producer_ids import PRODUCER_IDS_FILE_NAME, ProducerIdManager

_SEGMENT_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex|txnindex|snapshot)$")
# Files Kafka keeps in a partition directory beside its segments.
_KAFKA_PARTITION_FILES = {"leader-epoch-checkpoint", "partition.metadata"}
_STAGING_PREFIX = "__adopting-"
_INDEX_MAX_BYTES = 1 << 30          # an adopted index is read whole; no bound to enforce here


class AdoptionRefused(EosError):
    """The Kafka directories cannot be adopted as they are; the message says why. Nothing
    in the eos data directory was changed."""


@dataclasses.dataclass(frozen=True)
class PartitionCheck:
    """What the read-only verification of one Kafka partition directory found."""

    partition: int
    segments: int
    batches: int
    log_end_offset: int
    max_producer_id: int            # -1: no idempotent or transactional batch


@dataclasses.dataclass(frozen=True)
class Adopted:
    topic: str
    partitions: tuple[PartitionCheck, ...]
    next_producer_id: int           # the first id eos will hand out from now on


def find_partitions(kafka_log_dir: Path, topic: str) -> list[Path]:
    """The topic's partition directories, in partition order; refused unless they are 0..n-1."""
    pattern = re.compile(rf"^{re.escape(topic)}-(\d+)$")
    found = {}
    for entry in sorted(kafka_log_dir.iterdir()):
        match = pattern.match(entry.name)
        if match and entry.is_dir():
            found[int(match.group(1))] = entry
    if not found:
        raise AdoptionRefused(f"no partition directory of topic {topic!r} ({topic}-0, ...) in {kafka_log_dir}")
    missing = sorted(set(range(max(found) + 1)) - set(found))
    if missing:
        raise AdoptionRefused(f"topic {topic!r} in {kafka_log_dir} lacks partition(s) {missing}: "
                              f"found {sorted(found)}; a topic's partitions are 0..n-1")
    return [found[p] for p in sorted(found)]


def verify_partition_dir(directory: Path, partition: int) -> PartitionCheck:
    """Read every file of one Kafka partition directory and check it (step 2 above)."""
    segments: list[int] = []
    others: list[tuple[int, str, Path]] = []
    for path in sorted(directory.iterdir()):
        match = _SEGMENT_FILE.match(path.name)
        if match:
            base_offset, kind = int(match.group(1)), match.group(2)
            (segments.append(base_offset) if kind == "log" else others.append((base_offset, kind, path)))
        elif path.name not in _KAFKA_PARTITION_FILES:
            raise AdoptionRefused(
                f"{path}: not a file of a cleanly shut down Kafka partition (a .deleted, .cleaned or .swap "
                f"file is left by a crash or a cleaner at work: start and stop Kafka cleanly first)")
    if not segments:
        raise AdoptionRefused(f"{directory}: no .log segment")
    end_offset_by_segment: dict[int, int] = {}
    batches = 0
    max_producer_id = NO_PRODUCER_ID
    expected_offset = None
    for base_offset in segments:
        path = directory / f"{base_offset:020d}.log"
        next_offset, segment_batches, segment_max_producer_id = _scan_segment(path, base_offset)
        batches += segment_batches
        max_producer_id = max(max_producer_id, segment_max_producer_id)
        if expected_offset is not None and base_offset < expected_offset:
            raise AdoptionRefused(f"{path}: segment base offset {base_offset} overlaps the previous segment, "
                                  f"which ends at {expected_offset}")
        end_offset_by_segment[base_offset] = next_offset
        expected_offset = next_offset
    for base_offset, kind, path in others:
        _verify_side_file(directory, base_offset, kind, path, end_offset_by_segment)
    checkpoint = directory / "leader-epoch-checkpoint"
    if checkpoint.exists():
        try:
            decode_checkpoint(checkpoint.read_bytes())
        except (StorageError, ValueError, UnicodeDecodeError) as exc:
            raise AdoptionRefused(f"{checkpoint}: {exc}") from None
    return PartitionCheck(partition, len(segments), batches, expected_offset, max_producer_id)


def _scan_segment(path: Path, base_offset: int) -> tuple[int, int, int]:
    """(next offset, batches, highest producer id) of one `.log`, every batch's CRC checked.
    The file is mapped, not read: a segment may be a gigabyte."""
    next_offset, batches, max_producer_id = base_offset, 0, NO_PRODUCER_ID
    with open(path, "rb") as segment_file:
        if os.fstat(segment_file.fileno()).st_size == 0:
            return next_offset, batches, max_producer_id
        refusal = None
        with mmap.mmap(segment_file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            position = 0                    # where the batch being read starts
            try:
                for header in iter_headers(data):
                    verify_crc(data, header)
                    if header.base_offset < next_offset:
                        raise AdoptionRefused(f"{path}: batch at byte {header.position} starts at offset "
                                              f"{header.base_offset}, before {next_offset}")
                    next_offset = header.next_offset
                    batches += 1
                    max_producer_id = max(max_producer_id, header.producer_id)
                    position = header.position + header.size_bytes
            except CorruptRecordError as exc:
                if position + MAGIC_AT < len(data) and data[position + MAGIC_AT] in LEGACY_MAGICS:
                    # Said plainly: "unsupported magic 1" alone reads like damage, not an old format.
                    refusal = (f"{path}: a v{data[position + MAGIC_AT]} message set at byte {position} (Kafka "
                               f"before 0.11, or an older log.message.format.version): adopt takes v2 segments only")
                else:
                    refusal = f"{path}: {exc}"
        # Raised once the map is closed: an error from inside iter_headers holds, through its
        # traceback, a view of the map, and closing a map with a view alive is a BufferError.
        if refusal is not None:
            raise AdoptionRefused(refusal)
    return next_offset, batches, max_producer_id


def _verify_side_file(directory: Path, base_offset: int, kind: str, path: Path,
                      end_offset_by_segment: Mapping[int, int]) -> None:
    if kind == "snapshot":
        try:
            for entry in decode_snapshot(path.read_bytes()):
                if entry.producer_id < 0:
                    raise CorruptSnapshotError(f"producer id {entry.producer_id}")
        except CorruptSnapshotError as exc:
            raise AdoptionRefused(f"{path}: {exc}") from None
        return
    if base_offset not in end_offset_by_segment:
        raise AdoptionRefused(f"{path}: an index of segment {base_offset}, which has no .log")
    try:
        if kind == "index":
            log_size = (directory / f"{base_offset:020d}.log").stat().st_size
            OffsetIndex(str(path), base_offset, _INDEX_MAX_BYTES).load(log_size)
        elif kind == "timeindex":
            TimeIndex(str(path), base_offset, _INDEX_MAX_BYTES).load(end_offset_by_segment[base_offset])
        else:
            read_txn_index_file(str(path))
    except IndexCorruptError as exc:
        raise AdoptionRefused(f"{path}: {exc}") from None


def adopt_topic(kafka_log_dir: str | os.PathLike, topic: str, data_dir: str | os.PathLike, *,
                config: Mapping[str, str] | None = None, now_ms: int,
                progress: Callable[[str], None] = lambda message: None) -> Adopted:
    """Adopt `topic`'s partition directories from `kafka_log_dir` into the stopped eos
    broker's `data_dir` (steps 1-4 of the module doc), with `config` as the topic's
    overrides. Raises AdoptionRefused (or InvalidConfigError, StorageError) having changed
    nothing."""
    kafka_log_dir, data_dir = Path(kafka_log_dir), Path(data_dir)
    if not kafka_log_dir.is_dir():
        raise AdoptionRefused(f"{kafka_log_dir} is not a directory")
    if not data_dir.is_dir():
        raise AdoptionRefused(f"{data_dir} is not a directory (start the broker once to create it)")
    lock = DataDirLock(data_dir)
    lock.acquire()                          # StorageError: a broker is running on it
    topics_dir = data_dir / TOPICS_DIR_NAME
    had_topics_dir = topics_dir.exists()
    try:
        registry = TopicRegistry(data_dir)
        registry.load()
        if topic in registry:
            raise AdoptionRefused(f"topic {topic!r} already exists in {data_dir}")
        directories = find_partitions(kafka_log_dir, topic)
        info = registry.prepare_create(topic, len(directories), 1, dict(config or {}))
        checks = []
        for partition, directory in enumerate(directories):
            progress(f"verifying {directory.name}")
            checks.append(verify_partition_dir(directory, partition))
        staging = data_dir / f"{_STAGING_PREFIX}{topic}"
        shutil.rmtree(staging, ignore_errors=True)          # a staging left by a crash
        try:
            for directory in directories:
                target = data_dir / directory.name
                if target.exists():
                    raise AdoptionRefused(f"{target} exists (a log no topic names: start the broker once "
                                          f"to sweep it, or remove it)")
            highest = max(c.max_producer_id for c in checks)
            for check, directory in zip(checks, directories):
                progress(f"recovering {directory.name} as eos would")
                # the producer state eos recovered holds the snapshots' producers too, some of
                # which may have no batch left in the log
                highest = max(highest, _stage(directory, staging / directory.name, check, info.config, now_ms))
            fsync_directory(staging)
            producer_ids = ProducerIdManager(data_dir / PRODUCER_IDS_FILE_NAME)
            if highest >= 0:
                producer_ids.advance_past(highest)
            for directory in directories:
                os.rename(staging / directory.name, data_dir / directory.name)
            # the renames are durable before the topic names them: a registry entry whose
            # directories a power loss undid would be swept into empty logs at the next start
            fsync_directory(data_dir)
            registry.commit(info)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        if not had_topics_dir and topics_dir.is_dir() and not any(topics_dir.iterdir()):
            topics_dir.rmdir()              # the registry's load made it; leave no trace
        raise
    finally:
        lock.release()
    return Adopted(topic, tuple(checks), producer_ids.peek_next_id())


def _stage(source: Path, target: Path, check: PartitionCheck, config, now_ms: int) -> int:
    """Copy and recover one partition in the staging dir (fsynced); returns the highest
    producer id in the recovered producer state (-1: none)."""
    shutil.copytree(source, target)
    (target / "partition.metadata").unlink(missing_ok=True)   # Kafka's topic id file: eos keeps its own
    try:
        log = Log.open(str(target), config, recovery_point=0, clean_shutdown=False, now_ms=now_ms)
    except (EosError, OSError) as exc:
        raise AdoptionRefused(f"{source}: eos's recovery failed: {exc}") from None
    try:
        if log.log_end_offset != check.log_end_offset:
            raise AdoptionRefused(f"{source}: eos's recovery ends the log at offset {log.log_end_offset}, "
                                  f"the segments hold batches up to {check.log_end_offset}")
        open_transactions = log.open_transactions()
        if open_transactions:
            producer_id, first_offset = open_transactions[0]
            raise AdoptionRefused(
                f"{source}: producer {producer_id} has a transaction open since offset {first_offset}; its "
                f"coordinator state is in Kafka's __transaction_state, which is not adopted, so it could never "
                f"end here. Let Kafka commit or abort it (or expire it) first")
        highest = max((entry.producer_id for entry in log.describe_producers()), default=NO_PRODUCER_ID)
    finally:
        log.close()
    for path in target.iterdir():            # the copies are durable before they are renamed in
        with open(path, "rb") as copied:
            os.fsync(copied.fileno())
    fsync_directory(target)
    return highest


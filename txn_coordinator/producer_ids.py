"""Producer ids that are never handed out twice, also across restarts and kill -9.

Theory of operation
-------------------
Ids are handed out from blocks of `block_size` consecutive ids (Kafka allocates them the
same way, from ZooKeeper or the controller). Before the first id of a block is given away,
the block's end is written durably to one small file (temp file, fsync, rename, fsync of
the directory). After any restart, clean or not, the manager starts at the recorded end:
the unused rest of the old block is skipped, never reused. Losing up to a block of ids per
crash is the price, and with 63-bit ids it is no price at all.

The file holds one line of JSON: {"version": 1, "block_end_exclusive": N}. A file that
cannot be read stops the start with an error: starting again from 0 would repeat ids,
which is exactly what this class exists to prevent.

Thread-safe: one lock guards the counter; the file is written under it, once per block.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from eos.errors import EosError, StorageError
from eos.files import write_file_atomically

PRODUCER_IDS_FILE_NAME = "__producer_ids"
PRODUCER_ID_BLOCK_SIZE = 1000
PRODUCER_ID_MAX = 2**63 - 1
_FILE_VERSION = 1


class ProducerIdManager:
    """Hands out unique producer ids, reserving them durably in blocks."""

    def __init__(self, path: str | os.PathLike, *, block_size: int = PRODUCER_ID_BLOCK_SIZE):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self._path = Path(path)
        self._block_size = block_size
        self._lock = threading.Lock()
        self._next_id = self._read_block_end()  # first id not yet handed out
        self._block_end_exclusive = self._next_id  # nothing reserved yet in this run

    @property
    def path(self) -> Path:
        return self._path

    def next_id(self) -> int:
        """A producer id no one has had before, on this data dir, ever."""
        with self._lock:
            if self._next_id >= self._block_end_exclusive:
                self._reserve_block()
            producer_id = self._next_id
            self._next_id += 1
            return producer_id

    def advance_past(self, producer_id: int) -> None:
        """Never hand out `producer_id` or any id below it (ids found in logs written
        elsewhere, such as a Kafka partition adopted by `eos topics adopt`). Durable before
        it returns; the ids skipped are simply never used."""
        with self._lock:
            if producer_id < self._next_id:
                return
            if producer_id + 1 > PRODUCER_ID_MAX:
                raise EosError("producer ids are exhausted")
            self._write_block_end(producer_id + 1)
            self._next_id = self._block_end_exclusive = producer_id + 1

    def peek_next_id(self) -> int:
        """The id the next `next_id()` will return, handing nothing out."""
        with self._lock:
            return self._next_id

    def _reserve_block(self) -> None:
        new_end = self._block_end_exclusive + self._block_size
        if new_end > PRODUCER_ID_MAX:
            raise EosError("producer ids are exhausted")
        self._write_block_end(new_end)  # durable before any id of the block is given away
        self._block_end_exclusive = new_end

    def _read_block_end(self) -> int:
        try:
            text = self._path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return 0
        try:
            data = json.loads(text)
            if data.get("version") != _FILE_VERSION:
                raise ValueError(f"unsupported version {data.get('version')!r}")
            block_end = int(data["block_end_exclusive"])
            if block_end < 0:
                raise ValueError(f"negative block end {block_end}")
            return block_end
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StorageError(
                f"producer id file {self._path} is unreadable ({exc}); refusing to start, "
                f"as guessing could hand out an id twice") from exc

    def _write_block_end(self, block_end_exclusive: int) -> None:
        payload = json.dumps({"version": _FILE_VERSION,
                              "block_end_exclusive": block_end_exclusive}).encode("utf-8")
        self._path.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomically(self._path, payload + b"\n")

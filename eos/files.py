"""Durable small-file writes, shared by every owner of a metadata file.

A crash must leave either the old content or the new one, whole: write a temporary file
beside the target, fsync it, rename it over the target, then fsync the directory so the
rename itself survives a power loss. Checkpoints, producer snapshots, topic files,
producer-id blocks and meta.properties all go through `write_file_atomically`.

The broker's small JSON documents (ACLs, SCRAM credentials, client quotas) carry a format
version: `write_json_document` writes one, `read_json_document` reads it back and refuses
another version.
"""
from __future__ import annotations

import json
import os


def fsync_directory(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomically(path: str | os.PathLike, data: bytes, *, mode: int = 0o644) -> None:
    """`mode` is the file's from its creation (a secret is never readable by others, not
    even between the write and a later chmod)."""
    path = os.fspath(path)
    temp_path = path + ".tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = os.open(temp_path, flags, mode)   # new, so `mode` holds (the umask only narrows it)
    except FileExistsError:                     # a leftover of a crash, whose mode would stay
        os.unlink(temp_path)
        fd = os.open(temp_path, flags, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp_path, path)
    fsync_directory(os.path.dirname(os.path.abspath(path)))


def write_json_document(path: str | os.PathLike, version: int, body: dict, *, mode: int = 0o644) -> None:
    """`body` with its format `version`, atomically (see `write_file_atomically`)."""
    write_file_atomically(path, json.dumps({"version": version, **body}, indent=1).encode("utf-8"), mode=mode)


def read_json_document(path: str | os.PathLike, version: int) -> dict:
    """The document at `path`; ValueError when it is not JSON, not an object, or of another version."""
    with open(path, encoding="utf-8") as file:
        document = json.load(file)
    if not isinstance(document, dict) or document.get("version") != version:
        found = document.get("version") if isinstance(document, dict) else None
        raise ValueError(f"version {found!r}, expected {version}")
    return document

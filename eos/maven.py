"""Pinned jars from Maven Central, fetched once into a cache, without Maven.

Theory of operation
-------------------
eos runs two Java programs it does not ship: ZooKeeper (its clusters) and, in tests and
benchmarks, Apache Kafka (the peer that eos is checked against). Nothing downloaded is
committed. `fetch_jars(home, jars)` downloads each (group, artifact, version) straight from
Maven Central over HTTPS with urllib and checks it against the `.sha1` Maven Central
publishes beside it, writing through a `.part` file and an atomic rename. A marker file
written last says the set is complete; an exclusive lock file keeps two processes (pytest
workers, the CLI) from downloading into the same directory at once. Later calls find the
marker and touch no network. A fresh machine has only Python and Java: this is the whole of
what fetching needs.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import urllib.request
from pathlib import Path
from typing import Callable, Sequence

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
DOWNLOAD_TIMEOUT_S = 120
COMPLETE_MARKER = ".complete"

Jar = tuple[str, str, str]          # (group id, artifact id, version)


class JarsUnavailable(RuntimeError):
    """A pinned jar could not be downloaded or did not match its published SHA-1."""


def cache_root() -> Path:
    """`$EOS_CACHE`, or ~/.cache/eos."""
    root = Path(os.environ.get("EOS_CACHE") or Path.home() / ".cache" / "eos")
    root.mkdir(parents=True, exist_ok=True)
    return root


def jar_url(group: str, artifact: str, version: str) -> str:
    return f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.jar"


def _download(url: str, timeout_s: float = DOWNLOAD_TIMEOUT_S) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.read()
    except OSError as exc:
        raise JarsUnavailable(f"cannot download {url}: {exc}") from None


def fetch_jars(home: Path, jars: Sequence[Jar], *, marker_text: str = "",
               progress: Callable[[int, int, str], None] | None = None,
               extra_files: dict[str, str] | None = None) -> Path:
    """`home`, holding every jar of `jars` (and `extra_files`, name -> text), downloading
    what is missing on first use. `progress(index, total, name)` is called before each
    download. Raises JarsUnavailable naming the jar that failed; the marker is then not
    written, so the next call tries again."""
    if (home / COMPLETE_MARKER).exists():
        return home
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)            # another process may be downloading
        if (home / COMPLETE_MARKER).exists():
            return home
        for index, (group, artifact, version) in enumerate(jars, 1):
            target = home / f"{artifact}-{version}.jar"
            if target.exists():
                continue
            if progress is not None:
                progress(index, len(jars), target.name)
            url = jar_url(group, artifact, version)
            data = _download(url)
            expected = _download(url + ".sha1").decode("ascii", "replace").split()[0].strip().lower()
            actual = hashlib.sha1(data).hexdigest()
            if actual != expected:
                raise JarsUnavailable(f"{url}: SHA-1 {actual} does not match Maven Central's {expected}")
            partial = target.with_suffix(".part")
            partial.write_bytes(data)
            os.replace(partial, target)
        for name, text in (extra_files or {}).items():
            (home / name).write_text(text)
        (home / COMPLETE_MARKER).write_text(marker_text + "\n")
    return home

"""A SPARK_HOME for pip's pyspark whose Python workers import the installed pyspark.

Theory of operation
-------------------
Spark's Python workers import pyspark from `$SPARK_HOME/python/lib/pyspark.zip`: the JVM
puts that zip and py4j's first on every worker's PYTHONPATH (`PythonUtils.sparkPythonPath`),
ahead of the interpreter's site-packages. Two costs follow, paid by every new worker
process (measured on this project's 2-core VM):

- The zip holds sources only, and zipimport never writes bytecode, so each worker compiles
  pyspark: its imports take about 1.0 s, against 0.25 s from site-packages, where pip
  compiled the package at install.
- When the worker adds Spark's files directory to sys.path, `importlib.invalidate_caches()`
  makes the importer of every package imported from the zip read the whole zip's
  directory again (CPython 3.11): another 0.3-0.4 s.

Spark starts a new worker process for each streaming query's Python source (the planner,
`python_streaming_source_runner`), so a query on the eos source paid both before its first
micro-batch: 1.2-1.7 s from start() (Spark's JVM Kafka source: 0.09 s), 0.7-0.8 s without.

With pip's pyspark the zip is a copy of the package the interpreter has installed already:
the same wheel carries both. `worker_spark_home()` makes, once per installation, a
directory with a symlink to each entry of the pyspark package except `python/`. As
SPARK_HOME it serves Spark as before (bin, jars, ...), while the zip paths Spark puts on
the workers' PYTHONPATH lead nowhere, so the workers import the installed pyspark and py4j.
It is made beside its final name and renamed into place, so that a concurrent maker (two
test processes) never sees half of one.

`use_worker_spark_home()` points SPARK_HOME at it before the JVM starts, and only where
that is safe: Spark is pip's pyspark (SPARK_HOME unset, or set to the package or to such a
directory; a Spark installation a user chose is left alone), and the workers run this very
interpreter (PYSPARK_PYTHON is sys.executable; another interpreter may lack pyspark and
need the zip). When the directory cannot be made (a read-only cache), Spark runs as it
would have, with a warning.

`prepare_python_workers()` does this and, for a local master, also starts the fork server
of Spark's planner workers (`spark_sink/worker_fork.py`), which replaces PYSPARK_PYTHON with
its launcher: the query's source then starts without an interpreter start.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

HOME_PREFIX = "spark-home-"


def pip_spark_home() -> Path | None:
    """The pyspark package directory when it is a complete SPARK_HOME (pip's pyspark:
    `jars/` and `python/lib/pyspark.zip` inside), else None."""
    try:
        import pyspark
    except ImportError:
        return None
    package = Path(pyspark.__file__).resolve().parent
    if (package / "jars").is_dir() and (package / "python" / "lib" / "pyspark.zip").is_file():
        return package
    return None


def home_name(package: Path) -> str:
    """The directory's name: pyspark's version and a digest of the package's path (its
    symlinks lead there; another installation gets a directory of its own)."""
    try:
        from pyspark.version import __version__ as version
    except ImportError:
        version = "unknown"
    return f"{HOME_PREFIX}{version}-{hashlib.sha256(str(package).encode()).hexdigest()[:12]}"


def worker_spark_home(package: Path, cache_dir: Path) -> Path:
    """The SPARK_HOME for the pyspark `package` under `cache_dir`, made on first use
    (OSError when it cannot be)."""
    home = cache_dir / home_name(package)
    if home.is_dir():
        return home
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{home.name}.", dir=cache_dir))
    try:
        staging.chmod(0o755)          # mkdtemp's 0700 would be the home's
        for entry in package.iterdir():
            if entry.name != "python":
                (staging / entry.name).symlink_to(entry)
        try:
            os.rename(staging, home)
        except OSError:
            if not home.is_dir():        # not a concurrent maker that got there first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return home


def _same_interpreter(python: str) -> bool:
    # (Imported here: worker_fork is only needed once a session is being prepared.)
    from spark_sink.worker_fork import launches_this_interpreter

    if launches_this_interpreter(python):
        return True      # the fork server's launcher (an earlier prepare_python_workers)
    # Paths compared as given, symlinks not followed: a virtualenv's python is a symlink to
    # the base interpreter, which does not see the virtualenv's packages.
    found = shutil.which(python) if python else None
    return found is not None and os.path.abspath(found) == os.path.abspath(sys.executable)


def use_worker_spark_home(cache_dir: Path | None = None) -> Path | None:
    """Set SPARK_HOME to `worker_spark_home()` when that is safe (see the module doc); call it
    before the SparkSession is made (it changes nothing once the JVM runs). Returns the
    directory, or None when SPARK_HOME is left as it was."""
    package = pip_spark_home()
    if package is None or not _same_interpreter(os.environ.get("PYSPARK_PYTHON", "")):
        return None
    current = os.environ.get("SPARK_HOME")
    if current and Path(current).resolve() != package and not Path(current).name.startswith(HOME_PREFIX):
        return None
    if cache_dir is None:
        from eos.maven import cache_root
        cache_dir = cache_root()
    try:
        home = worker_spark_home(package, cache_dir)
    except OSError as exc:
        log.warning("Spark's Python workers will import pyspark from its zip (about 1 s more per "
                    "worker): cannot make a SPARK_HOME in %s (%s)", cache_dir, exc)
        return None
    os.environ["SPARK_HOME"] = str(home)
    return home


def prepare_python_workers(*, spark_home: bool = True, fork_server: bool = True) -> Path | None:
    """Before a local SparkSession is made: its Python workers run this interpreter (the
    virtualenv's, which has eos; PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON default to
    sys.executable) and, unless `spark_home` is false (the caller chose the workers' Python
    otherwise), import its installed pyspark (`use_worker_spark_home`). Then, unless
    `fork_server` is false (a master whose executors run on other machines: they could not
    run a launcher that lives here), Spark's planner workers are forked from a warm
    interpreter (`spark_sink.worker_fork`; PYSPARK_PYTHON then names its launcher)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    home = use_worker_spark_home() if spark_home else None
    if home is not None and fork_server:
        from spark_sink.worker_fork import use_fork_server    # (imported here: see _same_interpreter)
        use_fork_server()
    return home


__all__ = ["home_name", "pip_spark_home", "prepare_python_workers", "use_worker_spark_home", "worker_spark_home"]

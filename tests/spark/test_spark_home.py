"""spark_sink.spark_home: the SPARK_HOME whose Python workers import the installed pyspark
(not Spark's source-only zip, which each new worker compiled again)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from spark_sink.spark_home import (pip_spark_home, prepare_python_workers, use_worker_spark_home,
                                    worker_spark_home)


def _worker_imports_pyspark_from(spark_home: Path) -> str:
    """Where a process with the PYTHONPATH Spark gives its workers (the zips of
    `spark_home`'s python/lib first) imports pyspark from."""
    lib = spark_home / "python" / "lib"
    zips = [str(lib / "pyspark.zip"), *(str(z) for z in sorted(Path(pip_spark_home(), "python", "lib").glob("py4j-*.zip")))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(zips)}
    return subprocess.run([sys.executable, "-c", "import pyspark; print(pyspark.__file__)"], env=env,
                          capture_output=True, text=True, check=True, timeout=120).stdout.strip()


def test_workers_of_the_made_home_import_the_installed_pyspark(tmp_path):
    package = pip_spark_home()
    assert package is not None, "pip's pyspark is a complete SPARK_HOME (jars/, python/lib/pyspark.zip)"
    home = worker_spark_home(package, tmp_path)

    entries = {entry.name for entry in package.iterdir()}
    assert {entry.name for entry in home.iterdir()} == entries - {"python"}
    assert (home / "jars").resolve() == package / "jars"
    assert (home / "bin" / "spark-submit").is_file()
    # The contrast: with pip's own home the worker imports pyspark from the zip.
    assert ".zip" in _worker_imports_pyspark_from(package)
    imported = _worker_imports_pyspark_from(home)
    assert ".zip" not in imported and Path(imported).parent == package


def test_the_home_is_made_once_and_a_concurrent_makers_home_is_used(tmp_path):
    package = pip_spark_home()
    home = worker_spark_home(package, tmp_path)
    marker = home / "made-by-the-first"
    marker.write_text("")
    assert worker_spark_home(package, tmp_path) == home and marker.exists()
    assert [p.name for p in tmp_path.iterdir()] == [home.name]      # no staging left behind


def test_use_sets_spark_home_only_when_workers_run_this_interpreter(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    home = use_worker_spark_home(tmp_path)
    assert home is not None and os.environ["SPARK_HOME"] == str(home)
    assert use_worker_spark_home(tmp_path) == home           # set before: kept

    monkeypatch.delenv("SPARK_HOME")
    others = ["", "python2.7-not-here"]       # unset (Spark runs "python3" from PATH), missing
    if os.path.realpath(sys.executable) != os.path.abspath(sys.executable):
        others.append(os.path.realpath(sys.executable))   # the base interpreter under a virtualenv
    for other in others:
        monkeypatch.setenv("PYSPARK_PYTHON", other)      # may lack pyspark: the zip stays
        assert use_worker_spark_home(tmp_path) is None and "SPARK_HOME" not in os.environ


def test_use_leaves_a_users_spark_installation_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "my-spark"))
    assert use_worker_spark_home(tmp_path / "cache") is None
    assert os.environ["SPARK_HOME"] == str(tmp_path / "my-spark")
    assert not (tmp_path / "cache").exists()


def test_use_falls_back_to_sparks_zip_when_the_home_cannot_be_made(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    assert use_worker_spark_home(not_a_directory / "cache") is None
    assert "SPARK_HOME" not in os.environ
    assert "cannot make a SPARK_HOME" in caplog.text


def test_the_sessions_python_workers_import_the_installed_pyspark(spark):
    """The test session is made through use_worker_spark_home (tests/spark/conftest.py):
    a task's Python worker imports pyspark from site-packages."""
    def where(batches):
        import pyspark
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"file": pa.array([pyspark.__file__])})

    [row] = spark.range(1, numPartitions=1).mapInArrow(where, "file string").collect()
    assert ".zip" not in row.file and Path(row.file).parent == pip_spark_home()


def test_prepare_python_workers_keeps_a_chosen_interpreter_and_can_leave_spark_home(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/other/python")
    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
    monkeypatch.setenv("EOS_CACHE", str(tmp_path))
    monkeypatch.setenv("EOS_SPARK_FORK_SERVER", "0")    # this test is about SPARK_HOME alone
    assert prepare_python_workers() is None            # another interpreter: Spark's zip stays
    assert os.environ["PYSPARK_PYTHON"] == "/opt/other/python"
    assert os.environ["PYSPARK_DRIVER_PYTHON"] == sys.executable

    monkeypatch.delenv("PYSPARK_PYTHON")
    assert prepare_python_workers(spark_home=False) is None and "SPARK_HOME" not in os.environ
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    home = prepare_python_workers()
    assert home is not None and home.parent == tmp_path and os.environ["SPARK_HOME"] == str(home)

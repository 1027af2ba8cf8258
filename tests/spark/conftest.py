"""Spark fixtures: ONE SparkSession for the whole test run.

`spark` (session scope) -> SparkSession, local[2], 2 shuffle partitions, UI off, the eos
data source registered; stopped when the run ends. Starting Spark costs seconds, so every
Spark test shares it; tests must not stop it or change global settings they do not
restore.

`eos_broker` (module scope) -> tests.conftest.BrokerProcess, one broker subprocess per test
module (each test uses its own topics); `admin` (module scope) -> eos.Admin on it.

Every test here is marked `spark` and is skipped only when pyspark cannot be imported.
Any other problem -- no Java, no pyarrow, a session that does not start -- is a failure,
never a skip.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

PYSPARK_MISSING = importlib.util.find_spec("pyspark") is None
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.spark)
            if PYSPARK_MISSING and os.environ.get("CI"):
                raise pytest.UsageError("CI must run the Spark tests, but pyspark is not importable "
                                        "(./run tests installs the [spark] extra)")
            if PYSPARK_MISSING:
                item.add_marker(pytest.mark.skip(
                    reason="pyspark is not importable (pip install -e '.[spark]')"))


@pytest.fixture(scope="session")
def spark():
    # Executors and the planner run Python workers; they must import our packages from
    # this checkout, whatever their working directory ...
    repo_root = str(HERE.parent.parent)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if repo_root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([repo_root, *paths])
    from pyspark.sql import SparkSession

    import spark_sink
    from spark_sink.spark_home import prepare_python_workers

    # ... and run this interpreter (the virtualenv's), or they would not find eos.
    prepare_python_workers()
    session = (SparkSession.builder
               .master("local[2]")
               .appName("eos-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.driver.memory", "1g")
               .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
               .config("spark.sql.streaming.stopTimeout", "30000")
               .config("spark.python.worker.reuse", "true")
               .getOrCreate())
    session.sparkContext.setLogLevel("WARN")
    spark_sink.register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def eos_broker(tmp_path_factory):
    """One broker subprocess per test module (each test uses its own topics)."""
    from tests.conftest import BrokerProcess

    process = BrokerProcess(tmp_path_factory.mktemp("spark-broker") / "data")
    process.start()
    try:
        yield process
    finally:
        process.close()


@pytest.fixture(scope="module")
def admin(eos_broker):
    import eos

    client = eos.Admin(eos_broker.address)
    yield client
    client.close()

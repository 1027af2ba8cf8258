"""What the examples share: an embedded broker when none is given, and small helpers.

`broker(bootstrap)` is a context manager giving a bootstrap address: the one given, or
that of an embedded broker started for the example (`python -m broker` on a free port, a
temporary data directory) and stopped afterwards.
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path


@contextlib.contextmanager
def broker(bootstrap: str | None):
    if bootstrap:
        yield bootstrap
        return
    from eos.demo import BrokerProcess

    work = Path(tempfile.mkdtemp(prefix="eos-example-"))
    process = BrokerProcess(work / "data", work / "broker.log")
    print(f"embedded broker at {process.address} (data in {work})", flush=True)
    try:
        yield process.address
    finally:
        process.stop()
        shutil.rmtree(work, ignore_errors=True)


def ensure_topics(bootstrap: str, partitions: int, *topics: str) -> None:
    import eos
    from eos.errors import TopicAlreadyExistsError

    with eos.Admin(bootstrap) as admin:
        for topic in topics:
            try:
                admin.create_topic(topic, partitions=partitions)
            except TopicAlreadyExistsError:
                pass

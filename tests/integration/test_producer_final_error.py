"""The producer's final error names the broker's (issue 17): a broker whose disk is full answers
KAFKA_STORAGE_ERROR to every produce; once delivery.timeout.ms has passed, every record
fails with "Expiring N record(s) ... since batch creation; last error: KAFKA_STORAGE_ERROR:
... No space left on device" -- also the batches queued behind the retried one, which were
never sent themselves."""
from __future__ import annotations

import pytest

import eos
from eos.errors import ErrorCode, RequestTimedOutError

WAIT_S = 30


@pytest.fixture
def full_disk(monkeypatch):
    """Every log write of the in-process broker fails as on a full disk (ENOSPC)."""
    import broker.storage.segment as segment_module

    def no_space(fd, data):
        raise OSError(28, "No space left on device")

    return lambda: monkeypatch.setattr(segment_module, "_write_all", no_space)


def test_records_expiring_after_storage_errors_name_the_last_one(inprocess_broker, full_disk):
    from prometheus_client import CollectorRegistry

    from tests.integration.test_client_metrics import scrape, value

    with eos.Admin(inprocess_broker.address) as admin:
        admin.create_topic("full", partitions=1)
    registry = CollectorRegistry()
    # One request in flight and small batches: most batches wait behind the retried head.
    producer = eos.Producer(inprocess_broker.address, client_id="full-p", linger_ms=0, batch_size=300,
                            max_in_flight_requests_per_connection=1, request_timeout_ms=1000,
                            delivery_timeout_ms=2000, metrics=registry)
    try:
        producer.send("full", b"before").result(WAIT_S)
        full_disk()
        futures = [producer.send("full", b"r" * 100) for _ in range(12)]
        errors = [future.exception(WAIT_S) for future in futures]
        samples = scrape(registry)
    finally:
        producer.close()
    for error in errors:
        assert isinstance(error, RequestTimedOutError), error
        message = str(error)
        assert message.startswith("Expiring ") and "ms has passed since batch creation" in message, message
        assert "; last error: KAFKA_STORAGE_ERROR: " in message and "No space left on device" in message, message
        assert error.__cause__.code is ErrorCode.KAFKA_STORAGE_ERROR
    assert value(samples, "eos_producer_record_error_total", client_id="full-p") == 12
    assert value(samples, "eos_producer_record_retry_total", client_id="full-p") >= 1
    assert value(samples, "eos_producer_record_send_total", client_id="full-p") == 1

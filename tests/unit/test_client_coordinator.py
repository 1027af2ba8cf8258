"""producer/coordinator.py: coordinator calls retried until a deadline, on a fake clock."""
from __future__ import annotations

import grpc
import pytest

from eos import net
from eos.errors import EosError, ErrorCode, ProducerFencedError
from producer.coordinator import CoordinatorCaller, concurrent_transactions_delay_ms, first_partition_error
from producer.transactions import TransactionTimeoutError
from eos.v1 import group_pb2, txn_pb2


class FakeTime:
    def __init__(self):
        self.now_ms = 1_000
        self.sleeps: list[int] = []

    def clock(self) -> int:
        return self.now_ms

    def sleep_ms(self, ms: int) -> None:
        self.sleeps.append(ms)
        self.now_ms += ms


class Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "connection refused"


def scripted(*answers):
    """An RPC that gives `answers` in turn (an exception instance is raised)."""
    calls = []

    def rpc(request, timeout):
        calls.append(timeout)
        answer = answers[min(len(calls) - 1, len(answers) - 1)]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    rpc.calls = calls
    return rpc


def caller(fake: FakeTime) -> CoordinatorCaller:
    return CoordinatorCaller(backoff=net.Backoff(100, 1000), request_timeout_ms=30_000,
                             clock=fake.clock, sleep_ms=fake.sleep_ms)


def answer(code=ErrorCode.NONE, **fields):
    return txn_pb2.EndTxnResponse(error_code=code, error_message=code.name, **fields)


def test_retriable_codes_and_transport_errors_are_retried_until_an_answer():
    fake = FakeTime()
    rpc = scripted(Unavailable(), answer(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
                   answer(producer_id=7, producer_epoch=3))
    result = caller(fake).call("EndTxn", rpc, None, deadline_ms=fake.now_ms + 60_000)
    assert (result.producer_id, result.producer_epoch) == (7, 3)
    assert len(rpc.calls) == 3 and len(fake.sleeps) == 2
    assert all(80 <= s <= 240 for s in fake.sleeps)          # retry.backoff.ms, doubling, with jitter


def test_concurrent_transactions_is_asked_again_soon_then_less_often():
    fake = FakeTime()
    rpc = scripted(*([answer(ErrorCode.CONCURRENT_TRANSACTIONS)] * 6), answer())
    caller(fake).call("AddOffsetsToTxn", rpc, None, deadline_ms=fake.now_ms + 60_000)
    assert fake.sleeps == [2, 4, 8, 16, 20, 20]
    assert [concurrent_transactions_delay_ms(n, 100) for n in (1, 2, 3, 4, 5, 50)] == [2, 4, 8, 16, 20, 20]
    assert concurrent_transactions_delay_ms(3, 5) == 5       # never above retry.backoff.ms


def test_the_deadline_gives_a_retriable_timeout_naming_the_last_error():
    fake = FakeTime()
    rpc = scripted(answer(ErrorCode.CONCURRENT_TRANSACTIONS))
    with pytest.raises(TransactionTimeoutError, match="CONCURRENT_TRANSACTIONS") as raised:
        caller(fake).call("EndTxn", rpc, None, deadline_ms=fake.now_ms + 100)
    assert isinstance(raised.value, TimeoutError) and raised.value.retriable
    assert fake.now_ms == 1_100 and len(rpc.calls) >= 2


@pytest.mark.parametrize("code, error_type", [
    (ErrorCode.PRODUCER_FENCED, ProducerFencedError),
    (ErrorCode.INVALID_PRODUCER_EPOCH, ProducerFencedError),
    (ErrorCode.INVALID_TXN_STATE, EosError),
])
def test_other_codes_are_raised_at_once(code, error_type):
    fake = FakeTime()
    rpc = scripted(answer(code))
    with pytest.raises(error_type) as raised:
        caller(fake).call("EndTxn", rpc, None, deadline_ms=fake.now_ms + 60_000)
    assert len(rpc.calls) == 1 and fake.sleeps == []
    if error_type is EosError:
        assert raised.value.code is code


def test_per_partition_errors_report_the_worst():
    response = group_pb2.TxnOffsetCommitResponse(partitions=[
        group_pb2.PartitionOffsetResult(topic="t", partition=0, error_code=ErrorCode.NONE),
        group_pb2.PartitionOffsetResult(topic="t", partition=1, error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
        group_pb2.PartitionOffsetResult(topic="t", partition=2, error_code=ErrorCode.ILLEGAL_GENERATION,
                                        error_message="stale")])
    assert first_partition_error(response) == (ErrorCode.ILLEGAL_GENERATION, "t-2: stale")
    del response.partitions[2]
    assert first_partition_error(response)[0] == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    del response.partitions[1]
    assert first_partition_error(response) == (ErrorCode.NONE, "")

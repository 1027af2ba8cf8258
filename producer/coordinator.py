"""Blocking calls to the transaction and group coordinators, retried until a deadline.

Theory of operation
-------------------
init_transactions(), send_offsets_to_transaction(), commit_transaction() and
abort_transaction() talk to the coordinators on the application's thread, one call at a
time, as Kafka's blocking transactional API does. Every call has the shape of
aiokafka's handlers: build the request, send it, read the answer's error code(s):

- NONE: the answer is returned.
- a retriable code (eos.errors.reaction_for: the coordinator is loading, the previous
  transaction is still completing, ...) or a transport failure: back off
  (retry.backoff.ms doubling to retry.backoff.max.ms; CONCURRENT_TRANSACTIONS, the previous
  transaction completing, after 2 ms doubling to 20 ms) and send again, until the
  deadline; then `TransactionTimeoutError` (a TimeoutError) naming the last error.
- anything else: the eos exception of the code (`transactions.transaction_error`, so a
  fenced producer gets ProducerFencedError); the caller decides what it does to the
  transaction's state.

The clock and the sleep are passed in, so tests can drive the retries without waiting.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import grpc

from eos import net
from eos.errors import ErrorCode, Reaction, reaction_for
from producer.transactions import TransactionTimeoutError, transaction_error

log = logging.getLogger("eos.producer")

# CONCURRENT_TRANSACTIONS means the previous transaction's markers are being written, which
# takes milliseconds: asked again after 2 ms, doubling up to 20 ms (Kafka waits 20 ms).
CONCURRENT_TRANSACTIONS_RETRY_MIN_MS = 2
CONCURRENT_TRANSACTIONS_RETRY_MAX_MS = 20


def concurrent_transactions_delay_ms(attempt: int, base_ms: int) -> int:
    """The wait after the `attempt`-th CONCURRENT_TRANSACTIONS answer in a row (1, 2, ...)."""
    delay = CONCURRENT_TRANSACTIONS_RETRY_MIN_MS << min(max(attempt - 1, 0), 10)
    return max(1, min(delay, CONCURRENT_TRANSACTIONS_RETRY_MAX_MS, base_ms))


def answer_error(answer) -> tuple[int, str]:
    """(code, message) of an answer with one error_code."""
    return answer.error_code, answer.error_message


def first_partition_error(answer) -> tuple[int, str]:
    """(code, message) of an answer with per-partition errors: the first that is not NONE
    (a retriable one only if no other is)."""
    retriable = None
    for p in answer.partitions:
        if p.error_code != ErrorCode.NONE:
            # Some partition answers (OffsetFetch's FetchedOffset) carry a code but no message.
            error = (p.error_code, f"{p.topic}-{p.partition}: {getattr(p, 'error_message', '')}")
            if reaction_for(p.error_code) is not Reaction.RETRY:
                return error
            retriable = retriable or error
    return retriable or (ErrorCode.NONE, "")


class CoordinatorCaller:
    """Retries one coordinator RPC until it answers without a retriable error."""

    def __init__(self, *, backoff: net.Backoff, request_timeout_ms: int,
                 clock: Callable[[], int] = net.now_ms,
                 sleep_ms: Callable[[int], None] = lambda ms: time.sleep(ms / 1000)):
        self._backoff = backoff
        self._request_timeout_ms = request_timeout_ms
        self._clock = clock
        self._sleep_ms = sleep_ms

    def call(self, what: str, rpc, request, deadline_ms: int, *,
             error_of: Callable[[object], tuple[int, str]] = answer_error):
        attempt = 0
        concurrent_attempts = 0
        last: str = "no attempt was made"
        while True:
            remaining_ms = deadline_ms - self._clock()
            if remaining_ms <= 0 and attempt:
                raise TransactionTimeoutError(f"{what} did not succeed in time (last: {last})")
            timeout_s = max(1, min(self._request_timeout_ms, max(remaining_ms, 1))) / 1000
            delay_ms = None
            try:
                answer = rpc(request, timeout=timeout_s)
            except grpc.RpcError as exc:
                error = net.error_from_rpc(exc, what)
                if not error.retriable:
                    raise error from None
                last = str(error)
            else:
                code, message = error_of(answer)
                if code == ErrorCode.NONE:
                    return answer
                if reaction_for(code) is not Reaction.RETRY:
                    raise transaction_error(code, f"{what}: {message}")
                last = f"{ErrorCode(code).name}: {message}"
                if code == ErrorCode.CONCURRENT_TRANSACTIONS:
                    concurrent_attempts += 1
                    delay_ms = concurrent_transactions_delay_ms(concurrent_attempts, self._backoff.base_ms)
            attempt += 1
            if delay_ms is None:
                delay_ms = self._backoff.delay_ms(attempt)
            remaining_ms = deadline_ms - self._clock()
            if remaining_ms <= 0:
                raise TransactionTimeoutError(f"{what} did not succeed in time (last: {last})")
            log.debug("%s: %s; retrying in %d ms", what, last, delay_ms)
            self._sleep_ms(min(delay_ms, remaining_ms))

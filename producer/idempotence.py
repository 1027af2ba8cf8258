"""The idempotent producer's bookkeeping: producer id, epoch, and sequences per partition.

Theory of operation
-------------------
An idempotent producer (KIP-98) stamps every batch with (producer_id, producer_epoch,
base_sequence). Sequences count records per partition, start at 0 for each epoch and wrap
to 0 after 2**31 - 1. The broker appends a batch only if its base sequence follows the last
one it appended for that producer; it answers a resend of one of the last 5 batches with
the original offsets, so a retry can never write a record twice.

This class is the one owner of that state on the client, and pure: the sender tells it
what happened (a sequence was assigned, a batch was sent, acknowledged, or refused with an
error code) and it answers with a `Decision`. It does no I/O and reads no clock, so every
rule below is a table test.

Rules (Kafka's client, KIP-98 and KIP-360):

- A batch gets its sequence when it is first drained for sending, in the order records
  were appended; a retry resends the identical bytes with the same sequence.
- A partition's *window* runs from its oldest unacknowledged batch to its newest sequenced
  one, acknowledged batches in between included; it holds at most `UNACKED_BATCHES_MAX`
  (5) batches. The broker remembers the last 5 batches it appended, so a retry of the
  oldest unacknowledged batch -- appended or not -- is always recognised. (Counting only the
  unacknowledged batches is not enough: when the answer to batch 1 is lost while batches
  2..6 are acknowledged, the broker no longer remembers batch 1 when it comes again.)
- Until the first batch of a partition is acknowledged in the current epoch, it is the only
  one sent (`first_batch_alone`, for producers without a transactional id). A broker that
  knows nothing of a producer accepts any first sequence (KIP-360): even on an ordered
  stream, if the broker refused the first batch with a retriable error (a storage error,
  a leader moving) and then took the second, the first would be refused forever; once
  one batch is in, the broker checks every sequence. A transactional producer needs no
  such care: the broker takes a transactional batch of a producer it does not know only
  at sequence 0, and every transaction starts each partition at 0 (KIP-890), so skipping
  the rule saves a round trip per partition per transaction.
- A retriable error keeps the sequence (RETRY). OUT_OF_ORDER_SEQUENCE_NUMBER is retriable
  too when the batch was not the oldest unacknowledged one of its partition, or when it was
  sent while an older one was still unacknowledged: the older batch failed or arrived
  late, and this one will follow it once it is through. The second condition matters
  when the older batch is acknowledged before the out-of-order answer of the younger one
  is handled: on a ProduceStream, after the older one was refused with a retriable error
  and resent; on the unary fallback, where gRPC may also hand two calls to the broker in
  either order.
- OUT_OF_ORDER_SEQUENCE_NUMBER for a batch that was sent as the oldest unacknowledged one,
  UNKNOWN_PRODUCER_ID, and any error that fails a sequenced batch for good (its range is
  now a hole the broker waits for) are unrecoverable for the sequence: the batch fails
  (FAIL_AND_BUMP) and the producer must bump its epoch (InitProducerId with its current id
  and epoch) before it sends anything else. The bump resets every partition to sequence 0.
- Batches that come back with a sequence error after that (or that carry an epoch from
  before the bump) are not failed: they are REBUILT with the new epoch and fresh
  sequences, in their original order. The sender waits until nothing is in flight before
  it bumps, so no batch of the new epoch can overtake one of the old.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from eos.errors import ErrorCode, InvariantError, Reaction, reaction_for

SEQUENCE_MAX = 0x7FFFFFFF          # 2**31 - 1, after which sequences wrap to 0
UNACKED_BATCHES_MAX = 5            # the broker retains the last 5 batches per producer
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1

# Errors that say something about sequences or epochs rather than about the batch's content.
_SEQUENCE_ERRORS = frozenset({
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
    ErrorCode.UNKNOWN_PRODUCER_ID,
    ErrorCode.INVALID_PRODUCER_EPOCH,
})


def increment_sequence(sequence: int, record_count: int) -> int:
    """`sequence + record_count` on the 31-bit sequence circle."""
    return (sequence + record_count) & SEQUENCE_MAX


class Decision(enum.Enum):
    ACCEPT = "accept"                # treat as delivered (a duplicate the broker recognised)
    RETRY = "retry"                  # resend the same bytes, same sequence, after backoff
    REBUILD = "rebuild"              # requeue; gets the new epoch and a fresh sequence
    FAIL = "fail"                    # fail the batch; sequences are unaffected
    FAIL_AND_BUMP = "fail_and_bump"  # fail the batch; bump the epoch before sending more


@dataclass(slots=True)
class _InWindow:
    record_count: int
    sent_behind_older: bool = False  # an older batch was unacknowledged when this was last sent
    acked: bool = False


class _PartitionSequences:
    __slots__ = ("next_sequence", "window", "acked_any")

    def __init__(self) -> None:
        self.next_sequence = 0
        self.acked_any = False      # the broker holds state for us on this partition
        # base_sequence -> _InWindow, in assignment order (dicts keep insertion order), which
        # is sequence order on the wrapping circle. Its first entry is never acknowledged:
        # acknowledged entries leave from the front.
        self.window: dict[int, _InWindow] = {}

    def is_oldest(self, base_sequence: int) -> bool:
        return next(iter(self.window), None) == base_sequence

    def remove(self, base_sequence: int) -> None:
        self.window.pop(base_sequence, None)
        self._trim()

    def ack(self, base_sequence: int) -> None:
        entry = self.window.get(base_sequence)
        if entry is not None:
            entry.acked = True
            self._trim()

    def _trim(self) -> None:
        window = self.window
        while window:
            first = next(iter(window))
            if not window[first].acked:
                break
            del window[first]

    def unacked_count(self) -> int:
        return sum(1 for entry in self.window.values() if not entry.acked)


class IdempotenceState:
    """Producer id, epoch and per-partition sequences of one idempotent producer."""

    def __init__(self, *, first_batch_alone: bool = True) -> None:
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self.bump_required = False
        self.first_batch_alone = first_batch_alone
        self._partitions: dict[object, _PartitionSequences] = {}

    # ---- the producer id ---------------------------------------------------------------

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID

    @property
    def ready_to_send(self) -> bool:
        """False until InitProducerId answered, and while an epoch bump is due."""
        return self.has_producer_id and not self.bump_required

    def set_producer_id(self, producer_id: int, producer_epoch: int) -> None:
        """The answer of InitProducerId (first call, or a bump): sequences restart at 0."""
        if producer_id < 0 or producer_epoch < 0:
            raise InvariantError(f"InitProducerId gave producer id {producer_id} epoch {producer_epoch}")
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.bump_required = False
        self._partitions.clear()

    def is_current(self, producer_id: int, producer_epoch: int) -> bool:
        return producer_id == self.producer_id and producer_epoch == self.producer_epoch

    # ---- sequences ---------------------------------------------------------------------

    def unacked_count(self, tp) -> int:
        seqs = self._partitions.get(tp)
        return seqs.unacked_count() if seqs is not None else 0

    def window_count(self, tp) -> int:
        seqs = self._partitions.get(tp)
        return len(seqs.window) if seqs is not None else 0

    def can_assign(self, tp) -> bool:
        """Whether a new batch of `tp` may get a sequence (and so be sent) now."""
        if not self.ready_to_send:
            return False
        seqs = self._partitions.get(tp)
        if seqs is None:
            return True
        if self.first_batch_alone and not seqs.acked_any:
            return not seqs.window    # the first batch goes alone (see the rules above)
        return len(seqs.window) < UNACKED_BATCHES_MAX

    def assign(self, tp, record_count: int) -> int:
        """Give the next batch of `tp` its base sequence; it is unacknowledged until told."""
        if not self.ready_to_send:
            raise InvariantError("sequence assigned without a current producer id and epoch")
        if record_count <= 0:
            raise InvariantError(f"sequence asked for a batch of {record_count} records")
        seqs = self._partitions.get(tp)
        if seqs is None:
            seqs = self._partitions[tp] = _PartitionSequences()
        if len(seqs.window) >= UNACKED_BATCHES_MAX:
            raise InvariantError(f"more than {UNACKED_BATCHES_MAX} batches in the window of {tp}")
        base_sequence = seqs.next_sequence
        seqs.next_sequence = increment_sequence(base_sequence, record_count)
        seqs.window[base_sequence] = _InWindow(record_count)
        return base_sequence

    def next_sequence(self, tp) -> int:
        seqs = self._partitions.get(tp)
        return seqs.next_sequence if seqs is not None else 0

    def on_sent(self, tp, base_sequence: int) -> None:
        """The batch is going on the wire: remember whether an older one is still open."""
        seqs = self._partitions.get(tp)
        entry = seqs.window.get(base_sequence) if seqs is not None else None
        if entry is None or entry.acked:
            raise InvariantError(f"batch {tp} sequence {base_sequence} sent without being assigned")
        entry.sent_behind_older = not seqs.is_oldest(base_sequence)

    def on_acked(self, tp, base_sequence: int, producer_id: int, producer_epoch: int) -> None:
        """The broker appended the batch (or recognised it as a duplicate)."""
        if not self.is_current(producer_id, producer_epoch):
            return  # from before a bump: its sequences were already forgotten
        seqs = self._partitions.get(tp)
        if seqs is not None:
            seqs.ack(base_sequence)
            seqs.acked_any = True

    def on_error(self, tp, base_sequence: int, producer_id: int, producer_epoch: int,
                 code: int) -> Decision:
        """What to do with a sequenced batch the broker refused with `code`."""
        code = ErrorCode(code)
        if code is ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
            self.on_acked(tp, base_sequence, producer_id, producer_epoch)
            return Decision.ACCEPT
        recoverable = code in _SEQUENCE_ERRORS or reaction_for(code) is Reaction.RETRY
        if not self.is_current(producer_id, producer_epoch):
            # Sent before the epoch bump; the bump already forgot its sequence.
            return Decision.REBUILD if recoverable else Decision.FAIL
        seqs = self._partitions.get(tp)
        entry = seqs.window.get(base_sequence) if seqs is not None else None
        if entry is None or entry.acked:
            raise InvariantError(f"error {code.name} for {tp} sequence {base_sequence}, which is not open")
        if self.bump_required and recoverable:
            seqs.remove(base_sequence)
            return Decision.REBUILD
        if reaction_for(code) is Reaction.RETRY:
            return Decision.RETRY
        if code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and (
                not seqs.is_oldest(base_sequence) or entry.sent_behind_older):
            return Decision.RETRY
        if code is ErrorCode.INVALID_PRODUCER_EPOCH:
            # Our current epoch is refused: fenced. Nothing a bump on our side can repair.
            seqs.remove(base_sequence)
            return Decision.FAIL
        # OUT_OF_ORDER for the oldest batch, UNKNOWN_PRODUCER_ID, or a batch failing for good
        # (too large, invalid): its sequence range becomes a hole; only a new epoch fills it.
        seqs.remove(base_sequence)
        self.bump_required = True
        return Decision.FAIL_AND_BUMP

    def on_given_up(self, tp, base_sequence: int, producer_id: int, producer_epoch: int) -> Decision:
        """The sender fails a sequenced batch without a broker verdict (delivery timeout,
        retries exhausted, producer closed): whether it was appended is unknown, so the
        sequence cannot continue past it."""
        if not self.is_current(producer_id, producer_epoch):
            return Decision.FAIL
        seqs = self._partitions.get(tp)
        if seqs is not None:
            seqs.remove(base_sequence)
        self.bump_required = True
        return Decision.FAIL_AND_BUMP

"""The transactional producer's state: Kafka's client TransactionManager, as a pure class.

Theory of operation
-------------------
A producer with a transactional.id moves through Kafka's client states:

    UNINITIALIZED --init_transactions--> INITIALIZING --(InitProducerId answered)--> READY
    READY --begin_transaction--> IN_TRANSACTION
    IN_TRANSACTION --commit_transaction--> COMMITTING --(EndTxn answered)--> READY
    IN_TRANSACTION | ABORTABLE_ERROR --abort_transaction--> ABORTING --(EndTxn answered)--> READY
    IN_TRANSACTION | COMMITTING --(an abortable error)--> ABORTABLE_ERROR
    any --(a fatal error: fenced)--> FATAL_ERROR

The transitions are data (`VALID_PREVIOUS_STATES`); `_transition` refuses anything else with
`IllegalStateError`, and refuses it before changing anything. An application's call in the
wrong state (commit before begin, begin twice, send outside a transaction) is such a
refusal and leaves the producer as it was; in ABORTABLE_ERROR every call but
abort_transaction raises the error that put it there; in FATAL_ERROR every call raises the
fatal error (`ProducerFencedError` when another instance took over the transactional.id),
and the producer can only be closed.

Besides the state, this class owns the bookkeeping of the open transaction:

- the partitions the coordinator has registered (`partitions_in_txn`), those waiting to
  be registered (`pending_partitions`) and those in the AddPartitionsToTxn request in
  flight. The sender asks `partition_ready(tp)` before it sends a partition's first batch
  of the transaction; an unregistered partition becomes pending, and one request
  registers all pending partitions at once (Kafka sends one AddPartitionsToTxn for the new
  partitions of a drain). At most one such request is in flight.
- whether the coordinator knows of the transaction at all (`transaction_started`: a
  partition or a group's offsets were added, or a request that may have added them went
  out). Only then does ending it need an EndTxn; a transaction that registered nothing
  ends on the client alone.

With `partitions_added_by_produce` (transaction.version 2, KIP-890 part 2; an owner's
default) there is no AddPartitionsToTxn: every partition is ready at once, the produce
request asks its leader to add the partition to the transaction, and the transaction has
started as soon as such a batch may have gone out. A partition joins `partitions_in_txn`
when one of its batches of the transaction is acknowledged (`partition_written`): only
then is it known to be registered (an abort of a transaction whose every write was refused
may find nothing open on the coordinator, which is fine).

Errors are sorted by `reaction_to(code)` (eos.errors.reaction_for, with the transaction's
own readings): PRODUCER_FENCED and INVALID_PRODUCER_EPOCH are fatal (ProducerFencedError);
retriable codes are retried by the caller; INVALID_TXN_STATE from a partition leader (a
write to a partition the coordinator does not know in this transaction) and every
abortable code make the transaction abortable. A batch that fails for good inside a
transaction makes it abortable too, whatever its code (Kafka's rule): its records are
lost, so the transaction must not commit.

Participants (eos's extension, see txn_coordinator.state): a participant writes into
another producer's open transaction with a producer id of its own. It is initialised with
InitParticipant instead of InitProducerId (which may register partitions at once:
`participant_partitions_registered`), goes to IN_TRANSACTION at once, registers its other
partitions as above, and never ends the transaction (only the owner's EndTxn does): its
commit and abort are refused. Its id belongs to that one transaction and it cannot bump
its epoch, so once the transaction is decided or over (INVALID_TXN_STATE), its id is
forgotten (INVALID_PRODUCER_ID_MAPPING) or its owner is fenced, nothing it writes can ever
be accepted: for a participant those codes are fencing (`fences`), and the error is
ProducerFencedError -- Kafka's meaning, fatal -- naming the coordinator's or leader's code
and reason, not an abortable error it could do nothing about.

The class does no I/O, reads no clock and takes no lock; the producer serialises calls.
"""
from __future__ import annotations

import enum

from eos.errors import (
    EosError,
    ErrorCode,
    ProducerFencedError,
    Reaction,
    RequestTimedOutError,
    error_for,
    reaction_for,
)


class IllegalStateError(RuntimeError):
    """A transactional call in the wrong state (Kafka's IllegalStateException). Nothing
    changed; the producer can carry on from where it was."""


class TransactionAbortedError(EosError):
    """A record was not sent because its transaction was aborted (or can only be)."""

    code = ErrorCode.TRANSACTION_ABORTABLE


class TransactionTimeoutError(RequestTimedOutError, TimeoutError):
    """A transactional call ran out of time (Kafka's TimeoutException): retriable -- the
    same call again resumes where this one stopped. Both an EosError (REQUEST_TIMED_OUT)
    and a builtin TimeoutError."""


class TxnState(enum.Enum):
    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    COMMITTING = "COMMITTING"
    ABORTING = "ABORTING"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"


S = TxnState
# Where each state may be entered from (Kafka's TransactionManager.State.isTransitionValid).
VALID_PREVIOUS_STATES: dict[TxnState, frozenset[TxnState]] = {
    S.UNINITIALIZED: frozenset(),
    S.INITIALIZING: frozenset({S.UNINITIALIZED}),
    S.READY: frozenset({S.INITIALIZING, S.COMMITTING, S.ABORTING}),
    S.IN_TRANSACTION: frozenset({S.READY, S.INITIALIZING}),    # INITIALIZING: a participant
    S.COMMITTING: frozenset({S.IN_TRANSACTION}),
    S.ABORTING: frozenset({S.IN_TRANSACTION, S.ABORTABLE_ERROR}),
    S.ABORTABLE_ERROR: frozenset({S.IN_TRANSACTION, S.COMMITTING, S.ABORTABLE_ERROR}),
    S.FATAL_ERROR: frozenset(TxnState),
}

_FENCED_CODES = frozenset({ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH})
# What fences a participant besides those (see the module doc): its transaction is decided
# or over, or its id is forgotten.
_PARTICIPANT_FENCED_CODES = _FENCED_CODES | {ErrorCode.INVALID_TXN_STATE, ErrorCode.INVALID_PRODUCER_ID_MAPPING}


def reaction_to(code: int, *, from_partition_leader: bool = False) -> Reaction:
    """What a transactional producer does about an error code: RETRY (inside), ABORT (the
    application aborts the transaction and carries on) or FATAL (only close)."""
    code = ErrorCode(code)
    if code in _FENCED_CODES:
        return Reaction.FATAL
    if from_partition_leader and code is ErrorCode.INVALID_TXN_STATE:
        return Reaction.ABORT       # KIP-890: the partition is not in this transaction
    return reaction_for(code)


def transaction_error(code: int, message: str = "") -> EosError:
    """The exception for a code a transactional producer got: fenced codes become
    ProducerFencedError, whichever of the two the coordinator or leader used."""
    if ErrorCode(code) in _FENCED_CODES:
        return ProducerFencedError(
            message or "another producer with the same transactional.id has taken over (fenced)")
    return error_for(code, message)


class TransactionManager:
    """The state and partition bookkeeping of one transactional (or participant) producer."""

    def __init__(self, transactional_id: str, *, participant: bool = False,
                 partitions_added_by_produce: bool = False):
        if not transactional_id:
            raise ValueError("a transactional producer needs a non-empty transactional.id")
        if participant and partitions_added_by_produce:
            raise ValueError("a participant registers its partitions itself (InitParticipant, AddPartitionsToTxn)")
        self.transactional_id = transactional_id
        self.participant = participant
        self.partitions_added_by_produce = partitions_added_by_produce
        self.state = S.UNINITIALIZED
        self.last_error: BaseException | None = None
        self.partitions_in_txn: set = set()
        self.pending_partitions: set = set()
        self.partitions_being_added: set = set()
        self.transaction_started = False
        self.offsets_registered = False

    def __repr__(self) -> str:
        return f"TransactionManager({self.transactional_id!r}, {self.state.name})"

    # ---- transitions -------------------------------------------------------------------------

    def _transition(self, target: TxnState, error: BaseException | None = None) -> None:
        if self.state not in VALID_PREVIOUS_STATES[target]:
            raise IllegalStateError(f"transactional producer {self.transactional_id!r}: invalid transition "
                                    f"from {self.state.name} to {target.name}")
        if target is S.ABORTABLE_ERROR:
            if self.state is not S.ABORTABLE_ERROR:
                self.last_error = error       # the first error is the one worth reporting
        elif target is S.FATAL_ERROR:
            self.last_error = error
        else:
            self.last_error = None
        self.state = target

    def _raise_if_failed(self, what: str) -> None:
        if self.state is S.FATAL_ERROR:
            raise self.last_error
        if self.state is S.ABORTABLE_ERROR:
            raise TransactionAbortedError(
                f"cannot {what}: the transaction failed and must be aborted "
                f"(abort_transaction()): {self.last_error}") from self.last_error

    def _refuse(self, what: str) -> IllegalStateError:
        return IllegalStateError(f"transactional producer {self.transactional_id!r} cannot {what} "
                                 f"in state {self.state.name}")

    # ---- the application's calls (each checks first, then changes) -----------------------------

    def begin_init(self) -> bool:
        """init_transactions(): True if InitProducerId must be asked now; False if a call
        that timed out is resumed (the state is INITIALIZING already)."""
        self._raise_if_failed("initialise transactions")
        if self.state is S.INITIALIZING:
            return False
        if self.state is not S.UNINITIALIZED:
            raise self._refuse("initialise transactions (it was initialised already)")
        self._transition(S.INITIALIZING)
        return True

    def init_done(self) -> None:
        """InitProducerId (or InitParticipant) answered: READY (a participant: IN_TRANSACTION)."""
        if self.state is not S.INITIALIZING:
            raise self._refuse("complete initialisation (it was not initialising)")
        self._transition(S.IN_TRANSACTION if self.participant else S.READY)
        self._reset_transaction()

    def begin_transaction(self) -> None:
        self._raise_if_failed("begin a transaction")
        if self.participant:
            raise self._refuse("begin a transaction (a participant writes into its owner's transaction)")
        if self.state is not S.READY:
            raise self._refuse("begin a transaction")
        self._transition(S.IN_TRANSACTION)
        self._reset_transaction()

    def check_send(self) -> None:
        """send(): only inside a transaction; the failure of an abortable transaction is
        raised again, as is a fatal one."""
        self._raise_if_failed("send")
        if self.state is not S.IN_TRANSACTION:
            raise self._refuse("send (records of a transactional producer go in a transaction: "
                               "call begin_transaction() first)")

    def check_send_offsets(self) -> None:
        self._raise_if_failed("send offsets to the transaction")
        if self.participant:
            raise self._refuse("send offsets (only the owner of the transaction may)")
        if self.state is not S.IN_TRANSACTION:
            raise self._refuse("send offsets to the transaction")

    def begin_commit(self) -> bool:
        """commit_transaction(): True if the commit starts now, False if one that timed
        out is resumed. An abortable transaction raises its error: it must be aborted."""
        if self.participant:
            raise self._refuse("commit (only the owner of the transaction ends it)")
        self._raise_if_failed("commit")
        if self.state is S.COMMITTING:
            return False
        if self.state is not S.IN_TRANSACTION:
            raise self._refuse("commit a transaction")
        self._transition(S.COMMITTING)
        return True

    def begin_abort(self) -> bool:
        """abort_transaction(): True if the abort starts now, False if one that timed out
        is resumed. Allowed from an abortable error; a fatal one raises."""
        if self.participant:
            raise self._refuse("abort (only the owner of the transaction ends it)")
        if self.state is S.FATAL_ERROR:
            raise self.last_error
        if self.state is S.ABORTING:
            return False
        if self.state not in (S.IN_TRANSACTION, S.ABORTABLE_ERROR):
            raise self._refuse("abort a transaction")
        self._transition(S.ABORTING)
        return True

    @property
    def end_txn_needed(self) -> bool:
        """Whether the coordinator must be told the transaction's end (it knows of it)."""
        return self.transaction_started

    def end_done(self) -> None:
        """EndTxn answered (or nothing had to be told): the next transaction may begin."""
        if self.state not in (S.COMMITTING, S.ABORTING):
            raise self._refuse("complete the end of a transaction (none is ending)")
        self._transition(S.READY)
        self._reset_transaction()

    # ---- errors ----------------------------------------------------------------------------------

    def abortable_error(self, error: BaseException) -> None:
        """Something the transaction needed failed: it can no longer commit. Ignored once
        the transaction is being aborted or has ended (its batches fail as a matter of
        course)."""
        if self.state in (S.IN_TRANSACTION, S.COMMITTING, S.ABORTABLE_ERROR):
            self._transition(S.ABORTABLE_ERROR, error)

    def fatal_error(self, error: BaseException) -> None:
        if self.state is not S.FATAL_ERROR:
            self._transition(S.FATAL_ERROR, error)

    def fences(self, code: int) -> bool:
        """Whether `code` (from the coordinator or a partition leader) means this producer
        is fenced: PRODUCER_FENCED / INVALID_PRODUCER_EPOCH, and for a participant also a
        decided or forgotten transaction (see the module doc)."""
        return code in (_PARTICIPANT_FENCED_CODES if self.participant else _FENCED_CODES)

    def fenced_error(self, code: int, message: str) -> EosError:
        """The fatal error of a `fences(code)` refusal: ProducerFencedError, whose message
        keeps the refusal's own code and reason."""
        code = ErrorCode(code)
        if not self.participant:
            return transaction_error(code, message)
        return ProducerFencedError(
            f"participant of {self.transactional_id!r} is fenced: the transaction it writes into "
            f"no longer takes its writes ({code.name}: {message})")

    def error(self, code: int, message: str, *, from_partition_leader: bool = False) -> Reaction:
        """Record a non-retriable error; returns its reaction (RETRY: nothing recorded)."""
        if self.fences(code):
            self.fatal_error(self.fenced_error(code, message))
            return Reaction.FATAL
        reaction = reaction_to(code, from_partition_leader=from_partition_leader)
        if reaction is Reaction.FATAL:
            self.fatal_error(transaction_error(code, message))
        elif reaction is Reaction.ABORT:
            self.abortable_error(transaction_error(code, message))
        return reaction

    @property
    def has_error(self) -> bool:
        return self.state in (S.ABORTABLE_ERROR, S.FATAL_ERROR)

    @property
    def sending_allowed(self) -> bool:
        """Whether the sender may send this producer's batches now."""
        return self.state in (S.IN_TRANSACTION, S.COMMITTING)

    # ---- partitions ------------------------------------------------------------------------------

    def _reset_transaction(self) -> None:
        self.partitions_in_txn = set()
        self.pending_partitions = set()
        self.partitions_being_added = set()
        self.transaction_started = False
        self.offsets_registered = False

    @property
    def nothing_registered(self) -> bool:
        """No partition and no group is confirmed to be in the transaction."""
        return not self.partitions_in_txn and not self.offsets_registered

    def partition_ready(self, tp) -> bool:
        """The sender is about to send a batch of `tp`: True if the coordinator has
        registered the partition in this transaction; otherwise it is queued for
        registration and the batch waits. With partitions added by the produce, always True:
        the batch's request registers it, so the transaction has started."""
        if tp in self.partitions_in_txn:
            return True
        if self.partitions_added_by_produce:
            self.transaction_started = True
            return True
        if tp not in self.partitions_being_added:
            self.pending_partitions.add(tp)
        return False

    def note_partition(self, tp) -> bool:
        """send() knows the record's partition: queue its registration now, so it overlaps
        the batch's linger (Kafka registers at send time too). True if newly queued."""
        if (tp in self.partitions_in_txn or tp in self.pending_partitions or tp in self.partitions_being_added
                or self.state is not S.IN_TRANSACTION or self.partitions_added_by_produce):
            return False
        self.pending_partitions.add(tp)
        return True

    def partitions_to_add(self) -> list:
        """The pending partitions for one AddPartitionsToTxn request, now in flight; empty
        while another request is in flight or nothing is pending."""
        if self.partitions_being_added or not self.pending_partitions or not self.sending_allowed:
            return []
        added = sorted(self.pending_partitions)
        self.partitions_being_added = set(added)
        self.pending_partitions = set()
        self.transaction_started = True     # the coordinator may register them from here on
        return added

    def add_partitions_done(self, results: dict) -> Reaction | None:
        """The answer to AddPartitionsToTxn, {tp: (code, message)}: registered partitions
        may be sent; retriable refusals go back to pending (the caller backs off). Returns
        the worst reaction (None when every partition was registered)."""
        worst: Reaction | None = None
        asked, self.partitions_being_added = self.partitions_being_added, set()
        for tp in asked:
            code, message = results.get(tp, (ErrorCode.UNKNOWN_SERVER_ERROR,
                                              "the coordinator's answer has no result for the partition"))
            if code == ErrorCode.NONE:
                self.partitions_in_txn.add(tp)
                continue
            reaction = self.error(code, f"AddPartitionsToTxn {tp[0]}-{tp[1]}: {message}")
            if reaction is Reaction.RETRY:
                self.pending_partitions.add(tp)
            worst = _worse(worst, reaction)
        return worst

    def partition_written(self, tp) -> None:
        """A batch of `tp` in this transaction was acknowledged: its leader had the
        partition registered (the produce added it, or AddPartitionsToTxn had)."""
        if self.state in (S.IN_TRANSACTION, S.COMMITTING, S.ABORTING, S.ABORTABLE_ERROR):
            self.partitions_in_txn.add(tp)

    def participant_partitions_registered(self, partitions) -> None:
        """InitParticipant registered `partitions` for this participant: they may be sent
        without an AddPartitionsToTxn."""
        if not self.participant or self.state is not S.IN_TRANSACTION:
            raise self._refuse("take partitions registered at initialisation (only a participant, after "
                               "InitParticipant)")
        self.partitions_in_txn |= set(partitions)
        self.pending_partitions -= self.partitions_in_txn
        if self.partitions_in_txn:
            self.transaction_started = True

    def add_partitions_failed(self) -> None:
        """The request got no answer (transport error): its partitions are pending again."""
        self.pending_partitions |= self.partitions_being_added
        self.partitions_being_added = set()

    def offsets_added(self) -> None:
        """AddOffsetsToTxn is going out: the coordinator may know of the transaction."""
        self.transaction_started = True

    def offsets_confirmed(self) -> None:
        """AddOffsetsToTxn answered: the group's offsets are part of the transaction."""
        self.transaction_started = True
        self.offsets_registered = True


_ORDER = {None: 0, Reaction.RETRY: 1, Reaction.ABORT: 2, Reaction.FATAL: 3}


def _worse(a: Reaction | None, b: Reaction | None) -> Reaction | None:
    return a if _ORDER[a] >= _ORDER[b] else b

"""The transaction state machine of the coordinator: pure, deterministic, no I/O.

Theory of operation
-------------------
Each transactional.id has one `TxnMetadata`: its producer id and epoch, its state, the
partitions of the open transaction. The durable copy is what the `__transaction_state` log
says; `TxnCoordinatorCore.durable` holds it, replayed from the log at start. A request that
changes metadata never changes `durable` directly: the core answers with a `Decision`
carrying the new metadata to *write*; while that write is in flight the id sits in
`pending`, and any other request for it gets CONCURRENT_TRANSACTIONS. When the shell has
appended the record it calls `write_completed`, which moves the metadata into `durable` and
returns what to do next (send markers after a Prepare*; nothing after a Complete*). This is
Kafka's pendingState, kept apart as Redpanda keeps speculative state apart from durable.

The flow of one transaction (KIP-98 with KIP-890's epoch bump at every end):

    Empty/Complete* --AddPartitions--> Ongoing --EndTxn(commit)--> PrepareCommit  (the decision)
    PrepareCommit --markers written--> CompleteCommit
    Ongoing --EndTxn(abort) | timeout | fenced by InitProducerId--> PrepareAbort --> CompleteAbort

The epoch goes up by one when a transaction ends (the markers carry the new epoch, so a late
write from the finished transaction is fenced by the partition leaders) and when a new
producer instance calls InitProducerId. An epoch that would pass EPOCH_MAX rotates to a new
producer id at epoch 0. `last_producer_id`/`last_producer_epoch` remember the previous pair
so that a retried EndTxn or InitProducerId is recognised and answered the same way.

Participants (eos's extension for writers on many machines, e.g. Spark executors): the
owner of a transactional.id may ask for *participant* producer ids (`init_participant`).
Each is a fresh id from the same source as every producer id (so it never repeats), at
epoch 0, single-use: it belongs to the one open transaction and its partitions are
tracked apart from the owner's. The owner's EndTxn(commit) names the participants it
*accepts*; the Prepare* record (the decision) holds that choice, so the markers are fixed
once, by the decision: the owner's partitions and the accepted participants' get COMMIT,
every other participant's get ABORT. Abort, timeout and fencing abort every participant.
A participant's markers carry its epoch + 1, so the partition leaders fence any late
write of it; a participant of a decided transaction is refused (INVALID_TXN_STATE), and
after Complete* its id is forgotten (INVALID_PRODUCER_ID_MAPPING), so a straggler can never
write into the next transaction. The markers of one decision form one `MarkerRequest`: a
group of (producer id, epoch, committed, partitions) entries, sent together.

Transitions are data: `VALID_PREVIOUS_STATES` lists where each state may be entered from,
and `_transition` refuses anything else with InvariantError (a bug, never bad input: bad
input is refused earlier with a Kafka error code). Participants exist only while a
transaction is open or being decided (`STATES_WITH_PARTICIPANTS`); `_transition` checks
that too.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Callable, Iterable

from eos.errors import ErrorCode, InvariantError
from eos.types import TopicPartition

EPOCH_MAX = 32767          # producer epochs are i16
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
TRANSACTION_MAX_TIMEOUT_MS = 900_000        # transaction.max.timeout.ms (15 minutes)
TRANSACTIONAL_ID_EXPIRATION_MS = 604_800_000  # transactional.id.expiration.ms (7 days)
# Participants one transaction may have. Each state record holds all of them, so the bound
# also bounds the record (about 30 bytes a participant plus its partitions).
PARTICIPANTS_PER_TXN_MAX = 10_000


class TxnState(enum.Enum):
    # value = (name as Kafka's tools print it, the byte stored in __transaction_state)
    EMPTY = ("Empty", 0)
    ONGOING = ("Ongoing", 1)
    PREPARE_COMMIT = ("PrepareCommit", 2)
    PREPARE_ABORT = ("PrepareAbort", 3)
    COMPLETE_COMMIT = ("CompleteCommit", 4)
    COMPLETE_ABORT = ("CompleteAbort", 5)
    DEAD = ("Dead", 6)
    PREPARE_EPOCH_FENCE = ("PrepareEpochFence", 7)

    @property
    def display_name(self) -> str:
        return self.value[0]

    @property
    def log_id(self) -> int:
        return self.value[1]

    @classmethod
    def from_log_id(cls, log_id: int) -> "TxnState":
        for state in cls:
            if state.log_id == log_id:
                return state
        raise ValueError(f"unknown transaction state id {log_id}")

    @classmethod
    def from_display_name(cls, name: str) -> "TxnState":
        for state in cls:
            if state.display_name.lower() == name.lower():
                return state
        raise ValueError(f"unknown transaction state {name!r}")


S = TxnState
VALID_PREVIOUS_STATES: dict[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}
# States in which no transaction is open: a new one may begin, the id may expire.
IDLE_STATES = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
# The only states whose metadata may hold participants (an open or a deciding transaction).
STATES_WITH_PARTICIPANTS = frozenset({S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE})
DECIDED_STATES = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})


@dataclasses.dataclass(frozen=True)
class Participant:
    """A producer id handed out for one writer of the owner's open transaction."""

    producer_id: int
    producer_epoch: int
    partitions: frozenset[TopicPartition] = frozenset()
    accepted: bool = False     # named by the EndTxn(commit) that decided the transaction

    @property
    def marker_epoch(self) -> int:
        # One above the epoch it writes with: once the marker is in a partition, the
        # leader refuses any later write of this participant there.
        return self.producer_epoch + 1


@dataclasses.dataclass(frozen=True)
class TxnMetadata:
    """Everything the coordinator knows about one transactional.id (one log record)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    last_producer_id: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    start_time_ms: int       # when the open transaction began; -1 when none is open
    last_update_ms: int
    participants: tuple[Participant, ...] = ()   # in the order they were handed out

    def participant(self, producer_id: int) -> Participant | None:
        for p in self.participants:
            if p.producer_id == producer_id:
                return p
        return None


@dataclasses.dataclass(frozen=True)
class MarkerEntry:
    """Write a COMMIT or ABORT marker for (producer_id, producer_epoch) into each partition."""

    producer_id: int
    producer_epoch: int
    committed: bool
    partitions: frozenset[TopicPartition]


@dataclasses.dataclass(frozen=True)
class MarkerRequest:
    """Every marker of one decided transaction: the owner's entry (if it has partitions)
    first, then one entry per participant with partitions. Sent as one WriteTxnMarkers."""

    transactional_id: str
    coordinator_epoch: int
    entries: tuple[MarkerEntry, ...]

    @property
    def partition_count(self) -> int:
        return sum(len(e.partitions) for e in self.entries)

    def entry_for(self, producer_id: int) -> MarkerEntry | None:
        for entry in self.entries:
            if entry.producer_id == producer_id:
                return entry
        return None


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the shell does with a request: reply now, or write `write` first and reply after."""

    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    write: TxnMetadata | None = None          # append to __transaction_state, then write_completed()
    partition_errors: dict[TopicPartition, ErrorCode] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is ErrorCode.NONE


def _refuse(error: ErrorCode, message: str) -> Decision:
    return Decision(error=error, message=message)


def _transition(current: TxnMetadata | None, **changes) -> TxnMetadata:
    new = dataclasses.replace(current, **changes)
    if new.state not in VALID_PREVIOUS_STATES or current.state not in VALID_PREVIOUS_STATES[new.state]:
        raise InvariantError(
            f"illegal transaction transition {current.state.display_name} -> {new.state.display_name} "
            f"for {current.transactional_id!r}")
    if new.participants and new.state not in STATES_WITH_PARTICIPANTS:
        raise InvariantError(
            f"{current.transactional_id!r} would keep {len(new.participants)} participants in state "
            f"{new.state.display_name}")
    return new


def _bumped(md: TxnMetadata, new_producer_id: Callable[[], int]) -> tuple[int, int]:
    """The (producer id, epoch) after one bump, rotating the id when the epoch is spent."""
    if md.producer_epoch + 1 >= EPOCH_MAX:
        return new_producer_id(), 0
    return md.producer_id, md.producer_epoch + 1


class TxnCoordinatorCore:
    """All transactional ids of one coordinator. Methods take `now_ms` and return Decisions."""

    def __init__(self, *, coordinator_epoch: int = 0,
                 max_timeout_ms: int = TRANSACTION_MAX_TIMEOUT_MS,
                 transactional_id_expiration_ms: int = TRANSACTIONAL_ID_EXPIRATION_MS,
                 participants_per_txn_max: int = PARTICIPANTS_PER_TXN_MAX):
        self.coordinator_epoch = coordinator_epoch
        self.participants_per_txn_max = participants_per_txn_max
        self.max_timeout_ms = max_timeout_ms
        self.transactional_id_expiration_ms = transactional_id_expiration_ms
        self.epoch_of: Callable[[str], int] | None = None   # per-partition coordinator epochs (a cluster)
        self.durable: dict[str, TxnMetadata] = {}   # as the log says
        self.pending: dict[str, TxnMetadata] = {}   # written, not yet acknowledged by the log

    # ---- loading -------------------------------------------------------------------------

    def replay(self, record: TxnMetadata | None, transactional_id: str) -> None:
        """Apply one record of the log during load (None is a tombstone: the id is gone)."""
        if record is None or record.state is S.DEAD:
            self.durable.pop(transactional_id, None)
        else:
            self.durable[transactional_id] = record

    def unfinished_markers(self) -> list[MarkerRequest]:
        """After a load: every decided transaction whose markers may not all be written."""
        return [self._markers_for(md) for md in self.durable.values() if md.state in DECIDED_STATES]

    # ---- the write protocol --------------------------------------------------------------

    def _propose(self, md: TxnMetadata, **reply) -> Decision:
        self.pending[md.transactional_id] = md
        return Decision(write=md, producer_id=md.producer_id, producer_epoch=md.producer_epoch, **reply)

    def write_completed(self, md: TxnMetadata) -> MarkerRequest | None:
        """The log has `md`. Returns the markers to send when `md` is a decision."""
        proposed = self.pending.get(md.transactional_id)
        if proposed != md:
            raise InvariantError(f"write_completed for {md.transactional_id!r} does not match the pending write")
        del self.pending[md.transactional_id]
        self.replay(md, md.transactional_id)
        if md.state in DECIDED_STATES:
            return self._markers_for(md)
        return None

    def awaits_write(self, md: TxnMetadata) -> bool:
        """Whether `md` is still the write this core waits for. Not so once the id's
        partition was reloaded while the write was in flight (a new leader epoch of its
        `__transaction_state` partition): the load dropped the pending write and replayed
        the log, with or without it."""
        return self.pending.get(md.transactional_id) == md

    def write_failed(self, md: TxnMetadata) -> None:
        """The append failed: forget the proposal; durable state is unchanged."""
        if self.pending.get(md.transactional_id) == md:
            del self.pending[md.transactional_id]

    def _markers_for(self, md: TxnMetadata) -> MarkerRequest:
        committed = md.state is S.PREPARE_COMMIT
        entries = []
        if md.partitions:
            # The data sits under the id that wrote it. When the bump rotated to a new id (the
            # epoch was spent), the markers go out under the old id with the last epoch, and
            # the client continues with the new id at epoch 0.
            rotated = md.last_producer_id not in (NO_PRODUCER_ID, md.producer_id)
            producer_id, epoch = (md.last_producer_id, EPOCH_MAX) if rotated else (md.producer_id, md.producer_epoch)
            entries.append(MarkerEntry(producer_id, epoch, committed, md.partitions))
        for p in md.participants:
            if p.partitions:
                entries.append(MarkerEntry(p.producer_id, p.marker_epoch, committed and p.accepted, p.partitions))
        return MarkerRequest(md.transactional_id, self.epoch_for(md.transactional_id), tuple(entries))

    def epoch_for(self, transactional_id: str) -> int:
        """The coordinator epoch markers of this id carry: on a cluster, the leader epoch of
        its `__transaction_state` partition (`epoch_of`); on one node, the core's epoch."""
        return self.coordinator_epoch if self.epoch_of is None else self.epoch_of(transactional_id)

    def unload(self, transactional_ids) -> None:
        """Forget ids whose log partition this coordinator no longer leads (durable and
        pending: a pending write's append will fail, as the partition moved)."""
        for transactional_id in list(transactional_ids):
            self.durable.pop(transactional_id, None)
            self.pending.pop(transactional_id, None)

    def awaits_markers(self, group: MarkerRequest) -> bool:
        """Whether `group` is still the work of this coordinator: its transaction is decided,
        no write of it is pending, and the group was made at the id's current coordinator
        epoch. A group from before the id's partition moved away and back (a retry the old
        ownership queued) is stale: the load that took the partition back queued its own,
        and completing the transaction twice, or a newer one with an older one's markers,
        would be wrong."""
        md = self.durable.get(group.transactional_id)
        return (md is not None and md.state in DECIDED_STATES and group.transactional_id not in self.pending
                and group.coordinator_epoch == self.epoch_for(group.transactional_id))

    def markers_written(self, transactional_id: str, now_ms: int) -> Decision:
        """Every partition has its marker: propose Complete*."""
        md = self.durable.get(transactional_id)
        if md is None or md.state not in DECIDED_STATES:
            raise InvariantError(f"markers written for {transactional_id!r} in state "
                                 f"{md.state.display_name if md else 'absent'}")
        if transactional_id in self.pending:
            raise InvariantError(f"markers written for {transactional_id!r} while a write is pending")
        done = S.COMPLETE_COMMIT if md.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
        return self._propose(_transition(md, state=done, partitions=frozenset(), participants=(),
                                         start_time_ms=-1, last_update_ms=now_ms))

    # ---- requests ------------------------------------------------------------------------

    def _current(self, transactional_id: str) -> tuple[TxnMetadata | None, Decision | None]:
        if transactional_id in self.pending:
            return None, _refuse(ErrorCode.CONCURRENT_TRANSACTIONS,
                                 f"a state change of {transactional_id!r} is being written")
        return self.durable.get(transactional_id), None

    def init_producer_id(self, transactional_id: str, timeout_ms: int, now_ms: int,
                         new_producer_id: Callable[[], int], *,
                         expected_producer_id: int = NO_PRODUCER_ID,
                         expected_producer_epoch: int = NO_PRODUCER_EPOCH) -> Decision:
        if timeout_ms <= 0 or timeout_ms > self.max_timeout_ms:
            return _refuse(ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                           f"transaction.timeout.ms {timeout_ms} is outside 1..{self.max_timeout_ms}")
        md, refusal = self._current(transactional_id)
        if refusal:
            return refusal
        if md is None:
            fresh = TxnMetadata(transactional_id, new_producer_id(), 0, NO_PRODUCER_ID, NO_PRODUCER_EPOCH,
                                timeout_ms, S.EMPTY, frozenset(), -1, now_ms)
            self.pending[transactional_id] = fresh
            return Decision(write=fresh, producer_id=fresh.producer_id, producer_epoch=fresh.producer_epoch)
        if expected_producer_id != NO_PRODUCER_ID:
            # KIP-360: a producer re-initialising itself names its current id and epoch.
            is_current = (expected_producer_id, expected_producer_epoch) == (md.producer_id, md.producer_epoch)
            is_retry = (md.last_producer_epoch >= 0 and (expected_producer_id, expected_producer_epoch)
                        == (md.last_producer_id, md.last_producer_epoch))
            if is_retry and md.state in IDLE_STATES:
                return Decision(producer_id=md.producer_id, producer_epoch=md.producer_epoch)
            if not is_current:
                return _refuse(ErrorCode.PRODUCER_FENCED,
                               f"producer {expected_producer_id} epoch {expected_producer_epoch} is not the "
                               f"current one ({md.producer_id} epoch {md.producer_epoch})")
        if md.state in DECIDED_STATES:
            return _refuse(ErrorCode.CONCURRENT_TRANSACTIONS,
                           f"{transactional_id!r} is completing a transaction; retry")
        if md.state is S.ONGOING:
            # A new instance: fence the old one by aborting its transaction with a bumped
            # epoch. The caller retries and gets a fresh epoch once the abort completes.
            return self._abort_fenced(md, now_ms, new_producer_id, reply_error=ErrorCode.CONCURRENT_TRANSACTIONS)
        producer_id, epoch = _bumped(md, new_producer_id)
        bumped = _transition(md, state=S.EMPTY, producer_id=producer_id, producer_epoch=epoch,
                             last_producer_id=md.producer_id, last_producer_epoch=md.producer_epoch,
                             timeout_ms=timeout_ms, partitions=frozenset(), start_time_ms=-1,
                             last_update_ms=now_ms)
        return self._propose(bumped)

    def _abort_fenced(self, md: TxnMetadata, now_ms: int, new_producer_id: Callable[[], int],
                      reply_error: ErrorCode) -> Decision:
        producer_id, epoch = _bumped(md, new_producer_id)
        fenced = _transition(md, state=S.PREPARE_EPOCH_FENCE)
        # The previous epoch is deliberately not remembered (only the id, for the markers):
        # a fenced producer's retry must never be mistaken for the owner's retry and handed
        # the new epoch.
        aborting = _transition(fenced, state=S.PREPARE_ABORT, producer_id=producer_id, producer_epoch=epoch,
                               last_producer_id=md.producer_id, last_producer_epoch=NO_PRODUCER_EPOCH,
                               last_update_ms=now_ms)
        decision = self._propose(aborting)
        return dataclasses.replace(decision, error=reply_error,
                                   message=f"aborting the open transaction of {md.transactional_id!r} "
                                           f"to fence producer epoch {md.producer_epoch}")

    def _check_producer(self, md: TxnMetadata | None, transactional_id: str, producer_id: int,
                        producer_epoch: int) -> Decision | None:
        if md is None:
            return _refuse(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                           f"no producer id is registered for {transactional_id!r}; call init_transactions()")
        if producer_id != md.producer_id:
            return _refuse(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                           f"producer id {producer_id} does not belong to {transactional_id!r}: it is neither "
                           f"its producer (current {md.producer_id}) nor a participant of its open transaction")
        if producer_epoch != md.producer_epoch:
            return _refuse(ErrorCode.PRODUCER_FENCED,
                           f"producer epoch {producer_epoch} of {transactional_id!r} is fenced "
                           f"(current {md.producer_epoch})")
        return None

    def _check_participant(self, md: TxnMetadata, participant: Participant, producer_epoch: int) -> Decision | None:
        if producer_epoch != participant.producer_epoch:
            return _refuse(ErrorCode.PRODUCER_FENCED,
                           f"participant {participant.producer_id} of {md.transactional_id!r} writes with epoch "
                           f"{participant.producer_epoch}, not {producer_epoch}")
        if md.state is not S.ONGOING:
            return _refuse(ErrorCode.INVALID_TXN_STATE,
                           f"the transaction of {md.transactional_id!r} that producer {participant.producer_id} "
                           f"participates in is {md.state.display_name}: its writes are over")
        return None

    def init_participant(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         partitions: Iterable[TopicPartition], now_ms: int,
                         new_producer_id: Callable[[], int]) -> Decision:
        """The owner (producer_id, producer_epoch) asks for a participant producer id for its
        open transaction (opened now if it was idle), with `partitions` already registered.
        The Decision's producer_id/producer_epoch are the participant's."""
        partitions = frozenset(partitions)
        md, refusal = self._current(transactional_id)
        refusal = refusal or self._check_producer(md, transactional_id, producer_id, producer_epoch)
        if refusal:
            return refusal
        if md.state in DECIDED_STATES:
            return _refuse(ErrorCode.CONCURRENT_TRANSACTIONS,
                           f"the previous transaction of {transactional_id!r} is still completing")
        if len(md.participants) >= self.participants_per_txn_max:
            return _refuse(ErrorCode.INVALID_REQUEST,
                           f"the transaction of {transactional_id!r} already has {len(md.participants)} "
                           f"participants, the most one transaction may have ({self.participants_per_txn_max})")
        participant = Participant(new_producer_id(), 0, partitions)
        start_ms = md.start_time_ms if md.state is S.ONGOING else now_ms
        ongoing = _transition(md, state=S.ONGOING, participants=md.participants + (participant,),
                              start_time_ms=start_ms, last_update_ms=now_ms)
        decision = self._propose(ongoing)
        return dataclasses.replace(decision, producer_id=participant.producer_id,
                                   producer_epoch=participant.producer_epoch)

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[TopicPartition], now_ms: int) -> Decision:
        """Register partitions for the owner (producer_id is the transactional id's) or for
        one of the open transaction's participants."""
        partitions = frozenset(partitions)
        md, refusal = self._current(transactional_id)
        participant = None
        if refusal is None and md is not None and producer_id != md.producer_id:
            participant = md.participant(producer_id)
        if participant is not None:
            refusal = self._check_participant(md, participant, producer_epoch)
        else:
            refusal = refusal or self._check_producer(md, transactional_id, producer_id, producer_epoch)
        if refusal:
            return dataclasses.replace(refusal, partition_errors={tp: refusal.error for tp in partitions})
        if participant is not None:
            if partitions <= participant.partitions:
                return Decision(producer_id=participant.producer_id, producer_epoch=participant.producer_epoch)
            grown = dataclasses.replace(participant, partitions=participant.partitions | partitions)
            ongoing = _transition(md, participants=tuple(grown if p is participant else p for p in md.participants),
                                  last_update_ms=now_ms)
            return dataclasses.replace(self._propose(ongoing), producer_id=participant.producer_id,
                                       producer_epoch=participant.producer_epoch)
        if md.state in DECIDED_STATES:
            return _refuse(ErrorCode.CONCURRENT_TRANSACTIONS,
                           f"the previous transaction of {transactional_id!r} is still completing")
        if md.state is S.ONGOING and partitions <= md.partitions:
            return Decision(producer_id=md.producer_id, producer_epoch=md.producer_epoch)  # nothing new to write
        start_ms = md.start_time_ms if md.state is S.ONGOING else now_ms
        ongoing = _transition(md, state=S.ONGOING, partitions=md.partitions | partitions,
                              start_time_ms=start_ms, last_update_ms=now_ms)
        return self._propose(ongoing)

    def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: Iterable[TopicPartition]) -> Decision:
        """KIP-890 part 1: is each partition registered in the producer's open transaction?
        A partition leader asks before it appends a transactional batch, so that a late write
        from a finished transaction cannot open a hanging one. The producer is the owner or
        a participant of the open transaction. Never writes."""
        partitions = frozenset(partitions)
        md = self.durable.get(transactional_id)
        participant = md.participant(producer_id) if md is not None and producer_id != md.producer_id else None
        if participant is not None:
            refusal = self._check_participant(md, participant, producer_epoch)
            registered = participant.partitions
        else:
            refusal = self._check_producer(md, transactional_id, producer_id, producer_epoch)
            registered = md.partitions if md is not None and md.state is S.ONGOING else frozenset()
        if refusal:
            return dataclasses.replace(refusal, partition_errors={tp: refusal.error for tp in partitions})
        errors = {tp: ErrorCode.NONE if tp in registered else ErrorCode.INVALID_TXN_STATE for tp in partitions}
        missing = sorted(f"{tp.topic}-{tp.partition}" for tp, e in errors.items() if e is not ErrorCode.NONE)
        message = (f"not in the open transaction of {transactional_id!r} for producer {producer_id}: "
                   f"{', '.join(missing)}" if missing else "")
        return Decision(producer_id=producer_id, producer_epoch=producer_epoch,
                        partition_errors=errors, message=message)

    def end_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int,
                        commit: bool, now_ms: int, new_producer_id: Callable[[], int],
                        accepted_participants: Iterable[int] = ()) -> Decision:
        """Decide the open transaction. On commit, `accepted_participants` names the
        participants whose writes commit with the owner's; every other participant aborts."""
        accepted = frozenset(accepted_participants)
        md, refusal = self._current(transactional_id)
        if refusal:
            return refusal
        if md is None:
            return _refuse(ErrorCode.INVALID_PRODUCER_ID_MAPPING, f"unknown transactional id {transactional_id!r}")
        wanted_prepare = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        wanted_complete = S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT
        # A retry of an EndTxn whose answer was lost: the decision is already taken with the
        # epoch bumped, so the request carries the previous pair.
        is_retry = md.last_producer_epoch >= 0 and (producer_id, producer_epoch) == (
            md.last_producer_id, md.last_producer_epoch)
        if is_retry and md.state in (wanted_prepare, wanted_complete):
            if md.state is wanted_prepare:
                return _refuse(ErrorCode.CONCURRENT_TRANSACTIONS, "the transaction is completing; retry")
            return Decision(producer_id=md.producer_id, producer_epoch=md.producer_epoch)
        refusal = self._check_producer(md, transactional_id, producer_id, producer_epoch)
        if refusal:
            return refusal
        if accepted and not commit:
            return _refuse(ErrorCode.INVALID_REQUEST,
                           f"an abort of {transactional_id!r} accepts no participants (every participant aborts); "
                           f"got {len(accepted)}")
        if md.state is S.ONGOING:
            unknown = accepted - {p.producer_id for p in md.participants}
            if unknown:
                shown = ", ".join(str(pid) for pid in sorted(unknown)[:10])
                return _refuse(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                               f"cannot accept {len(unknown)} producer id(s) that are not participants of the "
                               f"open transaction of {transactional_id!r}: {shown}")
            new_id, new_epoch = _bumped(md, new_producer_id)
            participants = tuple(dataclasses.replace(p, accepted=p.producer_id in accepted)
                                 for p in md.participants)
            decided = _transition(md, state=wanted_prepare, producer_id=new_id, producer_epoch=new_epoch,
                                  last_producer_id=md.producer_id, last_producer_epoch=md.producer_epoch,
                                  participants=participants, last_update_ms=now_ms)
            return self._propose(decided)
        if md.state is S.EMPTY and not commit:
            # Kafka lets a producer abort when nothing was sent; nothing to write.
            return Decision(producer_id=md.producer_id, producer_epoch=md.producer_epoch)
        return _refuse(ErrorCode.INVALID_TXN_STATE,
                       f"cannot {'commit' if commit else 'abort'} {transactional_id!r} in state "
                       f"{md.state.display_name}")

    # ---- time ------------------------------------------------------------------------------

    def expire(self, now_ms: int, new_producer_id: Callable[[], int]) -> list[Decision]:
        """Abort transactions open past their timeout (fencing their producer) and drop ids
        idle past transactional.id.expiration.ms."""
        decisions = []
        for transactional_id, md in list(self.durable.items()):
            if transactional_id in self.pending:
                continue
            if md.state is S.ONGOING and now_ms > md.start_time_ms + md.timeout_ms:
                decisions.append(self._abort_fenced(md, now_ms, new_producer_id, reply_error=ErrorCode.NONE))
            elif md.state in IDLE_STATES and now_ms > md.last_update_ms + self.transactional_id_expiration_ms:
                decisions.append(self._propose(_transition(md, state=S.DEAD, last_update_ms=now_ms)))
        return decisions

    # ---- reads -----------------------------------------------------------------------------

    def describe(self, transactional_id: str) -> TxnMetadata | None:
        return self.durable.get(transactional_id)

    def list(self, states: Iterable[TxnState] = (), producer_ids: Iterable[int] = (),
             running_longer_than_ms: int = 0, now_ms: int = 0) -> list[TxnMetadata]:
        states, producer_ids = set(states), set(producer_ids)
        found = []
        for md in self.durable.values():
            if states and md.state not in states:
                continue
            if producer_ids and md.producer_id not in producer_ids and not any(
                    p.producer_id in producer_ids for p in md.participants):
                continue
            if running_longer_than_ms > 0 and (md.start_time_ms < 0 or now_ms - md.start_time_ms < running_longer_than_ms):
                continue
            found.append(md)
        return sorted(found, key=lambda md: md.transactional_id)

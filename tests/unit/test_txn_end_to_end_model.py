"""Transactions end to end, in process, against a model (issue 4's stateful test).

The real coordinator core (txn_coordinator.state) decides; its log is a list of encoded
`__transaction_state` records (txn_coordinator.txn_log); two real partition logs
(broker.storage.Log) take transactional batches and markers. Hypothesis interleaves
InitProducerId (fencing), AddPartitions + transactional writes, late writes that the broker
checks with the coordinator (KIP-890 part 1), commits, aborts, timeouts, marker delivery,
coordinator crashes between the decision and the markers (the core is rebuilt from its log
and finishes what it decided), and broker kills (logs closed uncleanly and recovered).

The invariant: once every decided transaction has its markers, read_committed on each
partition (Kafka's consumer algorithm over the aborted-transaction lists) shows exactly the
records of committed transactions, in append order, each once.
"""
from __future__ import annotations

import itertools
import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.storage import Log
from eos.config import TopicConfig
from eos.errors import EosError, ErrorCode
from eos.records.codec import decode_records, encode_batch
from eos.records.header import iter_headers
from eos.types import TopicPartition
from txn_coordinator import txn_log
from txn_coordinator.state import TxnCoordinatorCore, TxnState

PARTITIONS = [TopicPartition("out", 0), TopicPartition("out", 1)]
IDS = ["app-a", "app-b"]
TIMEOUT_MS = 60_000
CONFIG = TopicConfig(segment_bytes=4096)   # small segments: markers and data cross rolls


def read_committed(log: Log) -> list[bytes]:
    """All committed record values of a partition, as a read_committed consumer sees them."""
    data = log.read(0, 1 << 30, isolation_committed=True)
    aborted = sorted(data.aborted_transactions, key=lambda a: a.first_offset)
    values, open_aborted, next_aborted = [], set(), 0
    for header in iter_headers(data.records):
        while next_aborted < len(aborted) and aborted[next_aborted].first_offset <= header.last_offset:
            open_aborted.add(aborted[next_aborted].producer_id)
            next_aborted += 1
        if header.is_control:
            open_aborted.discard(header.producer_id)
            continue
        if header.is_transactional and header.producer_id in open_aborted:
            continue
        values.extend(r.value for r in decode_records(data.records, header, "out", 0))
    return values


class TransactionsModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="eos-txn-model-")
        self.now_ms = 1_000
        self.logs = {tp: Log.open(f"{self.dir}/out-{tp.partition}", CONFIG, now_ms=self.now_ms)
                     for tp in PARTITIONS}
        self.ids = itertools.count(5000)
        self.core = TxnCoordinatorCore()
        self.state_log: list[tuple[bytes, bytes]] = []   # the __transaction_state records
        self.pending_markers = []
        # client side: transactional id -> (producer id, epoch) of the live instance
        self.client: dict[str, tuple[int, int]] = {}
        self.registered: dict[str, set[TopicPartition]] = {}
        self.sequences: dict[tuple[int, int, TopicPartition], int] = {}
        # model: per partition, (value, transaction key) in append order; outcome per key
        self.appended: dict[TopicPartition, list[tuple[bytes, tuple]]] = {tp: [] for tp in PARTITIONS}
        self.outcome: dict[tuple, bool] = {}
        self.open_txn: dict[str, tuple | None] = {}
        self.values = itertools.count()

    def teardown(self):
        for log in self.logs.values():
            log.close(clean=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- the shell, as TransactionCoordinator carries decisions out --------------------

    def new_producer_id(self) -> int:
        return next(self.ids)

    def carry_out(self, decision, transactional_id: str):
        md = decision.write
        if md is None:
            return decision
        if md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            # The decision: the open transaction's fate is sealed by this record.
            key = self.open_txn.get(transactional_id)
            if key is not None:
                self.outcome[key] = md.state is TxnState.PREPARE_COMMIT
            self.open_txn[transactional_id] = None
            self.registered[transactional_id] = set()
        self.state_log.append((txn_log.encode_key(md.transactional_id), txn_log.encode_value(md)))
        markers = self.core.write_completed(md)
        if markers is not None:
            self.pending_markers.append(markers)
        return decision

    # ---- rules ------------------------------------------------------------------------

    @rule(tid=st.sampled_from(IDS))
    def init_producer_id(self, tid):
        d = self.carry_out(self.core.init_producer_id(tid, TIMEOUT_MS, self.now_ms, self.new_producer_id), tid)
        if d.ok:
            self.client[tid] = (d.producer_id, d.producer_epoch)
            self.registered[tid] = set()
            self.open_txn[tid] = None
        else:
            assert d.error in (ErrorCode.CONCURRENT_TRANSACTIONS,), d
            self.client.pop(tid, None)   # the new instance retries later; the old one is fenced

    @precondition(lambda self: self.client)
    @rule(data=st.data(), tp=st.sampled_from(PARTITIONS), count=st.integers(1, 4))
    def send(self, data, tp, count):
        tid = data.draw(st.sampled_from(sorted(self.client)))
        pid, epoch = self.client[tid]
        if tp not in self.registered[tid]:
            d = self.carry_out(self.core.add_partitions(tid, pid, epoch, [tp], self.now_ms), tid)
            if not d.ok:
                assert d.error in (ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.PRODUCER_FENCED), d
                return
            self.registered[tid].add(tp)
            if self.open_txn.get(tid) is None:
                self.open_txn[tid] = (tid, pid, epoch, next(self.values))
        self.append(tid, pid, epoch, tp, count, expect_ok=True)

    def append(self, tid, pid, epoch, tp, count, *, expect_ok):
        seq_key = (pid, epoch, tp)
        values = [f"v{next(self.values)}".encode() for _ in range(count)]
        batch = encode_batch(values, producer_id=pid, producer_epoch=epoch,
                             base_sequence=self.sequences.get(seq_key, 0), transactional=True)
        try:
            self.logs[tp].append_as_leader(batch, self.now_ms)
        except EosError:
            assert not expect_ok, "a registered write of the live instance was refused"
            return
        self.sequences[seq_key] = self.sequences.get(seq_key, 0) + count
        self.appended[tp].extend((v, self.open_txn[tid]) for v in values)

    @precondition(lambda self: self.client)
    @rule(data=st.data(), tp=st.sampled_from(PARTITIONS))
    def late_write_of_a_stale_instance(self, data, tp):
        """A zombie (an older epoch of a live id) writes: the broker first asks the
        coordinator whether the partition is in the producer's open transaction."""
        tid = data.draw(st.sampled_from(sorted(self.client)))
        pid, epoch = self.client[tid]
        if epoch == 0:
            return
        stale = epoch - 1
        verdict = self.core.verify_partitions(tid, pid, stale, [tp])
        assert verdict.partition_errors[tp] is not ErrorCode.NONE   # the broker refuses it
        # and even if a broker skipped the check, the log fences the old epoch once a
        # marker or a newer batch reached it; the model records nothing either way.

    @precondition(lambda self: self.client)
    @rule(data=st.data(), commit=st.booleans())
    def end_transaction(self, data, commit):
        tid = data.draw(st.sampled_from(sorted(self.client)))
        pid, epoch = self.client[tid]
        d = self.carry_out(self.core.end_transaction(tid, pid, epoch, commit, self.now_ms, self.new_producer_id), tid)
        if d.ok:
            self.client[tid] = (d.producer_id, d.producer_epoch)   # KIP-890: a new epoch
            self.registered[tid] = set()
            self.open_txn[tid] = None
        else:
            assert d.error in (ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.INVALID_TXN_STATE,
                               ErrorCode.PRODUCER_FENCED), d

    @precondition(lambda self: self.pending_markers)
    @rule()
    def deliver_markers(self):
        markers = self.pending_markers.pop(0)
        for entry in markers.entries:
            for tp in sorted(entry.partitions):
                self.logs[tp].append_txn_marker(entry.producer_id, entry.producer_epoch,
                                                markers.coordinator_epoch, entry.committed, self.now_ms)
        self.carry_out(self.core.markers_written(markers.transactional_id, self.now_ms),
                       markers.transactional_id)

    @rule()
    def crash_coordinator(self):
        """Killed at any point after a write: the new core knows only its log, and resends
        the markers of every transaction the log shows as decided."""
        core = TxnCoordinatorCore(coordinator_epoch=self.core.coordinator_epoch)
        for key, value in self.state_log:
            tid = txn_log.decode_key(key)
            core.replay(txn_log.decode_value(tid, value), tid)
        self.core = core
        self.pending_markers = core.unfinished_markers()

    @rule()
    def kill_broker(self):
        for tp, log in self.logs.items():
            log.close(clean=False)
            self.logs[tp] = Log.open(f"{self.dir}/out-{tp.partition}", CONFIG, now_ms=self.now_ms)

    @rule(advance_ms=st.sampled_from([1_000, TIMEOUT_MS + 1]))
    def time_passes(self, advance_ms):
        self.now_ms += advance_ms
        for d in self.core.expire(self.now_ms, self.new_producer_id):
            self.carry_out(d, d.write.transactional_id)

    # ---- the invariant ------------------------------------------------------------------

    @invariant()
    def committed_data_is_exactly_what_read_committed_shows(self):
        deciding = {tid for tid, md in self.core.durable.items()
                    if md.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)}
        # every decided transaction is on its way to completion: its markers are queued
        assert deciding <= {m.transactional_id for m in self.pending_markers}, deciding
        if self.pending_markers:
            return   # decided transactions still completing: checked once they are done
        for tp, log in self.logs.items():
            expected = [v for v, key in self.appended[tp] if self.outcome.get(key) is True]
            shown = read_committed(log)
            # open transactions hold the LSO: only what precedes the first open one shows
            assert shown == expected[:len(shown)], (tp, shown, expected)
            if all(self.outcome.get(key) is not None for _, key in self.appended[tp]):
                assert shown == expected, (tp, shown, expected)


TransactionsModel.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_transactions_end_to_end = TransactionsModel.TestCase

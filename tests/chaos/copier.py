"""The transactional copier: one input partition copied to an output topic, exactly once.

Theory of operation
-------------------
After Kafka's TransactionalMessageCopier, but without group membership: each copier owns
one input partition (copier-0 reads partition 0, copier-1 partition 1) under its own
transactional.id, and keeps its input position as the committed offset of a consumer group
that no member ever joins (TxnOffsetCommit with generation -1 is a "simple" commit).

1. `init_transactions()` first: the epoch bump fences any earlier instance of this
   transactional.id (a copier killed with kill -9) and aborts its open transaction, input
   offsets included.
2. Then the committed offset of the input partition (`Consumer.committed`, which asks
   with require_stable, KIP-447): while a transactional offset commit of the group is still pending -- the
   previous instance's commit waiting for its markers, or its abort -- the coordinator
   answers UNSTABLE_OFFSET_COMMIT and the copier asks again, so it never starts from an
   offset that is about to change. No committed offset: the start of the partition.
3. The loop: poll read_committed; open a transaction; send each record to the output
   topic, keyed by its input key (so the output partition is the key's), with the value
   transformed (`transform`); keep polling into the same transaction until it holds
   `--txn-records` records or `--txn-max-ms` has passed; add the consumer's position as the
   group's offset (send_offsets_to_transaction); commit. `--max-records-per-s` paces the
   copy by waiting inside each transaction (a stand-in for processing time), which also
   bounds how far a copier gets between a supervisor's decision to kill it and the kill.
4. Errors: a fatal one (fenced, a newer instance exists) ends the process with exit code
   2. Anything else in a transaction aborts it and rewinds the consumer to the committed
   offset (step 2), as Kafka's copier does; if even the abort fails, exit code 3 and the
   supervisor starts a new instance, which fences this one's transaction.

Because the output records and the input offset commit in one transaction, every input
record is in the output exactly once, whenever the process dies: a transaction that did
not commit is aborted and its records are invisible to read_committed readers, and the
next instance starts where the last committed transaction ended.

Usage::

    python -m tests.chaos.copier --bootstrap 127.0.0.1:PORT --input IN --output OUT --partition N
        [--group copier] [--transactional-id copier-N] [--txn-records 2000] [--txn-max-ms 1000]
        [--max-poll-records 500] [--max-records-per-s 0] [--transaction-timeout-ms 60000]
        [--stop-at-end]

Stdout, one flushed line per event (the supervising test reads them)::

    ready position=<next input offset> end=<input end offset, -1 without --stop-at-end>
    committed position=<next input offset> records=<in this transaction> total=<by this process>
        first=<input offset of its first record> last=<of its last record>
    aborted position=<rewound to> reason=<error>
    done position=<next input offset>
    frozen position=<where the open transaction started> phase=<records|offsets>

`--freeze-after N` (for the zombie test): inside the first transaction that starts at or
after input position N, once its records are written to the broker (`--freeze-phase
records`) or its offsets are added too (`offsets`), the copier reports "frozen" and stops
itself with SIGSTOP, as a long GC pause or a stalled VM would stop it; SIGCONT resumes it
where it stood, with its transaction open.

Exit codes: 0 done (--stop-at-end: the input's end was reached), 2 a fatal error (or a
client call outside a transaction that timed out), 3 a transaction that could not be
aborted; a traceback goes to stderr.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time

from eos.errors import EosError
from eos.types import TopicPartition

log = logging.getLogger("eos.chaos.copier")

TRANSFORM_SUFFIX = b"|copied"
OFFSET_FETCH_TIMEOUT_MS = 60_000   # bound on waiting for a stable committed offset
EXIT_DONE = 0
EXIT_FATAL = 2
EXIT_ABORT_FAILED = 3


def transform(value: bytes) -> bytes:
    """What the copier does to a value (the key is kept as it is)."""
    return value + TRANSFORM_SUFFIX


def emit(line: str) -> None:
    print(line, flush=True)


class Copier:
    """One copier process: its transactional producer, its read_committed consumer of the
    one input partition, and the loop of the theory of operation."""

    def __init__(self, args: argparse.Namespace):
        import eos   # the clients; imported here so `--help` stays fast

        self.args = args
        self.tp = TopicPartition(args.input, args.partition)
        self.transactional_id = args.transactional_id or f"copier-{args.partition}"
        self.producer = eos.Producer(
            args.bootstrap, transactional_id=self.transactional_id,
            transaction_timeout_ms=args.transaction_timeout_ms, linger_ms=args.linger_ms,
            batch_size=args.batch_size)
        self.consumer = eos.Consumer(
            args.bootstrap, group_id=args.group, isolation_level="read_committed",
            auto_offset_reset="earliest", max_poll_records=args.max_poll_records)
        self.copied_total = 0
        self._froze = False      # --freeze-after: the one freeze happened

    def close(self) -> None:
        self.consumer.close()
        self.producer.close(timeout=5)

    def rewind(self) -> int:
        """Seek the input to its committed offset (or its start); return where that is."""
        committed = self.consumer.committed([self.tp], timeout_ms=OFFSET_FETCH_TIMEOUT_MS)[self.tp]
        if committed is None:
            self.consumer.seek_to_beginning(self.tp)
        else:
            self.consumer.seek(self.tp, committed)
        return self.consumer.position(self.tp)

    def run(self) -> int:
        args = self.args
        self.producer.init_transactions()
        self.consumer.assign([self.tp])
        position = self.rewind()
        end = self.consumer.end_offsets([self.tp])[self.tp] if args.stop_at_end else -1
        group_metadata = self.consumer.group_metadata()
        emit(f"ready position={position} end={end}")
        while end < 0 or position < end:
            records = self.consumer.poll(timeout_ms=args.poll_timeout_ms,
                                         max_records=min(args.max_poll_records, args.txn_records))
            if not records:
                position = self.consumer.position(self.tp)
                continue
            try:
                count, first, last = self._copy_in_one_transaction(records, group_metadata, end, position)
            except (EosError, TimeoutError) as exc:   # TimeoutError: a client call ran out of time
                if isinstance(exc, EosError) and exc.fatal:
                    raise
                position = self._abort_and_rewind(exc)
                continue
            position = self.consumer.position(self.tp)
            self.copied_total += count
            if position <= last:
                # the consumer's position must be past every record it handed out: a position
                # behind them would commit input offsets that a restart reads twice
                log.error("position %d is not past the last copied record %d (first %d, %d records)",
                          position, last, first, count)
            emit(f"committed position={position} records={count} total={self.copied_total} first={first} last={last}")
        emit(f"done position={position}")
        return EXIT_DONE

    def _copy_in_one_transaction(self, records, group_metadata, end: int,
                                 start_position: int) -> tuple[int, int, int]:
        """One committed transaction; (records copied, input offsets of its first and last)."""
        args, producer, output = self.args, self.producer, self.args.output
        started = time.monotonic()
        deadline = started + args.txn_max_ms / 1000
        producer.begin_transaction()
        count = 0
        first_offset = records[0].offset
        while True:
            for record in records:
                producer.send(output, value=transform(record.value), key=record.key)
            count += len(records)
            last_offset = records[-1].offset
            remaining_s = deadline - time.monotonic()
            if count >= args.txn_records or remaining_s <= 0:
                break
            if 0 <= end <= self.consumer.position(self.tp):
                break
            records = self.consumer.poll(timeout_ms=int(remaining_s * 1000),
                                         max_records=min(args.max_poll_records, args.txn_records - count))
            if not records:
                break
        self._maybe_freeze("records", start_position)
        pace_until = started + count / args.max_records_per_s if args.max_records_per_s else 0.0
        self._pace(started, pace_until)
        producer.send_offsets_to_transaction({self.tp: self.consumer.position(self.tp)}, group_metadata)
        self._maybe_freeze("offsets", start_position)
        self._pace(started, pace_until, 1.0)
        producer.commit_transaction()
        return count, first_offset, last_offset

    def _maybe_freeze(self, phase: str, start_position: int) -> None:
        """--freeze-after: stop this process inside its open transaction (see the module doc)."""
        args = self.args
        if self._froze or args.freeze_after < 0 or args.freeze_phase != phase or start_position < args.freeze_after:
            return
        self._froze = True
        self.producer.flush()        # the transaction's records are on the broker, uncommitted
        emit(f"frozen position={start_position} phase={phase}")
        os.kill(os.getpid(), signal.SIGSTOP)

    @staticmethod
    def _pace(started: float, until: float, fraction: float = 0.5) -> None:
        """--max-records-per-s: wait until `fraction` of the transaction's paced time has
        passed. The wait is spent inside the transaction, half with its records written and
        half with its offsets added too, so that kills at random times find it in each phase."""
        if until:
            delay_s = started + (until - started) * fraction - time.monotonic()
            if delay_s > 0:
                time.sleep(delay_s)

    def _abort_and_rewind(self, error: Exception) -> int:
        log.warning("transaction failed (%s); aborting and rewinding", error)
        try:
            self.producer.abort_transaction()
        except Exception:
            log.exception("the abort failed too")
            raise SystemExit(EXIT_ABORT_FAILED)
        position = self.rewind()
        reason = error.code.name if isinstance(error, EosError) else type(error).__name__
        emit(f"aborted position={position} reason={reason}")
        return position


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.copier",
                                     description="Copy one input partition to an output topic, exactly once.")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True, help="input topic")
    parser.add_argument("--output", required=True, help="output topic")
    parser.add_argument("--partition", type=int, required=True, help="the input partition this copier owns")
    parser.add_argument("--group", default="copier", help="the group that holds the input offsets")
    parser.add_argument("--transactional-id", default=None, help="default copier-<partition>")
    parser.add_argument("--txn-records", type=int, default=2000, help="records per transaction at most")
    parser.add_argument("--txn-max-ms", type=int, default=1000, help="a transaction's collecting time at most")
    parser.add_argument("--transaction-timeout-ms", type=int, default=60000)
    parser.add_argument("--poll-timeout-ms", type=int, default=500)
    parser.add_argument("--max-poll-records", type=int, default=500,
                        help="records per poll (a transaction spans several polls)")
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=65536)
    parser.add_argument("--max-records-per-s", type=int, default=0,
                        help="pace the copy to at most this rate (0: as fast as it goes)")
    parser.add_argument("--stop-at-end", action="store_true",
                        help="exit 0 once the input's end (as of start) is copied")
    parser.add_argument("--freeze-after", type=int, default=-1,
                        help="testing: SIGSTOP itself inside the first transaction starting at or after this "
                             "input position (-1: never)")
    parser.add_argument("--freeze-phase", choices=("records", "offsets"), default="records",
                        help="with --freeze-after: once the transaction's records are written, or its offsets "
                             "added too")
    args = parser.parse_args(argv)
    if (args.partition < 0 or args.txn_records < 1 or args.txn_max_ms < 0 or args.max_poll_records < 1
            or args.max_records_per_s < 0):
        parser.error("--partition, --txn-max-ms and --max-records-per-s must be >= 0, "
                     "--txn-records and --max-poll-records >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    copier = Copier(args)
    try:
        return copier.run()
    except EosError as exc:
        log.exception("fatal error %s; exiting", exc.code.name)
        return EXIT_FATAL
    except TimeoutError:   # a client call outside a transaction ran out of time (broker away)
        log.exception("timed out outside a transaction; exiting")
        return EXIT_FATAL
    finally:
        copier.close()


if __name__ == "__main__":
    sys.exit(main())

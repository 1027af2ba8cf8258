"""`eos.Admin`'s transactions: what kafka-transactions.sh asks (list, describe,
describe-producers, abort, find-hanging).

Theory of operation
-------------------
`TransactionAdmin` is a part of `eos.Admin` (its base class): it uses the Admin's plumbing
(`_call`, its retries and timeouts; `_every_broker`; `_ask_leaders`) and keeps no state.

On a cluster each broker coordinates the transactional ids of the `__transaction_state`
partitions it leads, so the questions go where the answer is, as Kafka's admin sends them:

- ListTransactions to every broker, each listing naming the broker that answered
  (`coordinator_id`); a broker that cannot be asked fails the call, since a listing without
  its share would make its live transactions look unknown;
- DescribeTransactions to the id's coordinator (FindCoordinator, found again when it moves;
  another broker answers NOT_COORDINATOR);
- DescribeProducers to each partition's leader, which holds its producer state;
- AbortTransaction (KIP-664) to any broker: it writes the ABORT marker at the partition's
  leader.

Hanging transactions follow kafka-transactions.sh find-hanging: DescribeProducers on the
partitions; a producer whose open transaction has had no write for longer than the maximum
transaction timeout is hanging unless some coordinator lists that producer (as owner or
participant) with an ongoing or completing transaction that includes the partition.
"""
from __future__ import annotations

import time
from typing import Callable

from eos.admin_arguments import tps
from eos.errors import EosError, ErrorCode, raise_if_error
from eos.types import TopicPartition
from eos.v1 import broker_pb2, common_pb2, txn_pb2, txn_pb2_grpc

MAX_TRANSACTION_TIMEOUT_MS = 15 * 60 * 1000     # Kafka's transaction.max.timeout.ms: find-hanging's default
# A transaction the coordinator still works on: its partitions may legitimately be open.
_LIVE_TXN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort")


class TransactionAdmin:
    """The transaction methods of `eos.Admin` (see the module doc)."""

    def _txn_call(self, what: str, rpc: Callable, request, answer_code: Callable | None = None):
        return self._call(what, rpc, request, stub=self._metadata.txn_coordinator_stub, answer_code=answer_code)

    def list_transactions(self, states=None, *, producer_ids=None, duration_ms: int | None = None) -> list[dict]:
        """[{"transactional_id", "coordinator_id", "producer_id", "state", "participant_count"}],
        sorted by id, then coordinator; filtered by `states` (e.g. ["Ongoing"]), `producer_ids`
        (owners or participants) and `duration_ms` (only transactions open longer than that).

        Each broker coordinates the ids of the __transaction_state partitions it leads, so
        every broker is asked, as Kafka's admin asks them (its `coordinator_id` names the one
        that answered). A broker that cannot be asked fails the call: a listing without its
        share would call its live transactions unknown (find_hanging_transactions reads it)."""
        states = [states] if isinstance(states, str) else list(states or [])
        request = txn_pb2.ListTransactionsRequest(
            state_filters=states, producer_id_filters=list(producer_ids or []), duration_filter_ms=duration_ms or 0)
        listed = []
        for node_id, response in self._list_at_every_broker(
                "ListTransactions", txn_pb2_grpc.TxnCoordinatorStub, request,
                f"unknown transaction state in {states}: known are Empty, Ongoing, PrepareCommit, PrepareAbort, "
                f"CompleteCommit, CompleteAbort, PrepareEpochFence, Dead"):
            listed += [{"transactional_id": t.transactional_id, "coordinator_id": node_id, "producer_id": t.producer_id,
                        "state": t.state, "participant_count": t.participant_count} for t in response.transactions]
        return sorted(listed, key=lambda t: (t["transactional_id"], t["coordinator_id"]))

    def describe_transaction(self, transactional_id: str) -> dict:
        """{"transactional_id", "coordinator_id", "state", "producer_id", "producer_epoch",
        "timeout_ms", "start_time_ms" (None when no transaction is open), "partitions": [TopicPartition],
        "groups", "coordinator_epoch", "participants": [{"producer_id", "producer_epoch",
        "partitions", "accepted"}]}. An unknown id raises TRANSACTIONAL_ID_NOT_FOUND."""
        # at the id's coordinator (on a cluster, the leader of its __transaction_state partition)
        coordinator = self._metadata.txn_coordinator_stub(transactional_id)
        response = self._call("DescribeTransactions", lambda s: s.DescribeTransactions,
                              txn_pb2.DescribeTransactionsRequest(transactional_ids=[transactional_id]),
                              stub=lambda: coordinator,
                              answer_code=lambda r: r.transactions[0].error_code if r.transactions else 0)
        found = [t for t in response.transactions if t.transactional_id == transactional_id]
        if not found:
            raise EosError(f"DescribeTransactions did not answer for {transactional_id!r}", ErrorCode.UNKNOWN_SERVER_ERROR)
        t = found[0]
        raise_if_error(t, f"cannot describe transactional id {transactional_id!r}")
        return {"transactional_id": t.transactional_id, "coordinator_id": self._coordinator_id(transactional_id),
                "state": t.state, "producer_id": t.producer_id,
                "producer_epoch": t.producer_epoch, "timeout_ms": t.transaction_timeout_ms,
                "start_time_ms": t.transaction_start_time_ms if t.transaction_start_time_ms >= 0 else None,
                "partitions": sorted(TopicPartition(p.topic, p.partition) for p in t.partitions),
                "groups": sorted(t.groups), "coordinator_epoch": t.coordinator_epoch,
                "participants": [{"producer_id": p.producer_id, "producer_epoch": p.producer_epoch,
                                  "partitions": sorted(TopicPartition(q.topic, q.partition) for q in p.partitions),
                                  "accepted": p.accepted} for p in t.participants]}

    def _coordinator_id(self, transactional_id: str) -> int:
        """The node id of the transactional id's coordinator (the broker that just answered
        for it), or -1 when no broker of the metadata has its address."""
        address = self._metadata.coordinator_address(transactional_id)     # cached by the call just made
        brokers = self._every_broker(refresh=False)
        if len(brokers) == 1:
            return brokers[0][0]
        return next((node_id for node_id, at in brokers if at == address), -1)

    def abort_transaction(self, tp, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """KIP-664: write an ABORT marker for `producer_id`'s open transaction in partition `tp`
        (a hanging transaction the coordinator no longer knows about), so the LSO moves on.

        `producer_epoch` and `coordinator_epoch` are the producer's, as find_hanging_transactions
        and describe_producers show them (a coordinator epoch of -1, never marked, counts as 0,
        as in Kafka's tool). The marker itself carries producer_epoch + 1: under transactions
        v2 (KIP-890) a marker is written at the bumped epoch, as the coordinator writes its own,
        and the broker refuses one at the epoch of the open transaction."""
        topic, partition = tp
        for label, value in (("producer_id", producer_id), ("producer_epoch", producer_epoch),
                             ("coordinator_epoch", coordinator_epoch), ("partition", partition)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{label} must be an int, got {value!r}")
        if producer_id < 0 or not 0 <= producer_epoch < 32767:
            raise ValueError(f"producer {producer_id} epoch {producer_epoch}: an id >= 0 and an epoch in 0..32766")
        response = self._txn_call("AbortTransaction", lambda s: s.AbortTransaction, txn_pb2.AbortTransactionRequest(
            partition=common_pb2.TopicPartition(topic=topic, partition=partition), producer_id=producer_id,
            producer_epoch=producer_epoch + 1, coordinator_epoch=max(0, coordinator_epoch)))
        raise_if_error(response, f"cannot abort the transaction of producer {producer_id} in {topic}-{partition}")

    def describe_producers(self, partitions) -> dict[TopicPartition, list[dict]]:
        """The active producers of each partition: {tp: [{"producer_id", "producer_epoch",
        "last_sequence", "last_timestamp_ms", "coordinator_epoch", "current_txn_start_offset"
        (-1: no open transaction)}]}."""
        partitions = sorted({TopicPartition(*tp) for tp in partitions})
        if not partitions:
            return {}
        # Kafka sends DescribeProducers to each partition's leader: on a cluster the others
        # hold no producer state for it (or a follower's).
        answered = self._ask_leaders(
            tps(partitions),
            lambda stub, group, timeout_s: self._ask_once("DescribeProducers", stub.DescribeProducers,
                                                          broker_pb2.DescribeProducersRequest(partitions=group),
                                                          timeout_s).partitions,
            lambda p, code, message: broker_pb2.PartitionProducers(topic=p.topic, partition=p.partition,
                                                                   error_code=code, error_message=message))
        result = {}
        for p in answered:
            raise_if_error(p, f"cannot describe the producers of {p.topic}-{p.partition}")
            result[TopicPartition(p.topic, p.partition)] = [
                {"producer_id": s.producer_id, "producer_epoch": s.producer_epoch, "last_sequence": s.last_sequence,
                 "last_timestamp_ms": s.last_timestamp_ms, "coordinator_epoch": s.coordinator_epoch,
                 "current_txn_start_offset": s.current_txn_start_offset} for s in p.producers]
        return result

    def find_hanging_transactions(self, topic: str | None = None, *, partitions=None, broker_id: int | None = None,
                                  max_duration_ms: int = MAX_TRANSACTION_TIMEOUT_MS,
                                  now_ms: int | None = None) -> list[dict]:
        """kafka-transactions.sh find-hanging: open transactions (in `partitions`, or every
        partition of `topic`, or of every topic; with `broker_id`, only the partitions with a
        replica on that broker) whose last write is older than `max_duration_ms` and that
        no coordinator accounts for. Rows sorted by (topic, partition, producer): {"topic",
        "partition", "producer_id", "producer_epoch", "coordinator_epoch", "start_offset",
        "last_timestamp_ms", "duration_ms", "transactional_id" (None: no coordinator knows
        the producer)}."""
        if partitions is None:
            # one Metadata for every topic, not one per topic
            described = self.describe_topics([topic] if topic is not None else None)
            partitions = [TopicPartition(t, p["partition"]) for t, d in described.items() for p in d["partitions"]
                          if broker_id is None or broker_id in p["replicas"]]
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        candidates = []
        for tp, producers in self.describe_producers(partitions).items():
            for state in producers:
                if state["current_txn_start_offset"] >= 0 and now - state["last_timestamp_ms"] >= max_duration_ms:
                    candidates.append((tp, state))
        if not candidates:
            return []
        # Who does the coordinator say these producers write for, and where may they be open?
        live: dict[int, tuple[str, set]] = {}    # producer id -> (transactional id, partitions it may have open)
        ids = sorted({state["producer_id"] for _, state in candidates})
        for listing in self.list_transactions(producer_ids=ids):
            if listing["state"] not in _LIVE_TXN_STATES:
                live.setdefault(listing["producer_id"], (listing["transactional_id"], set()))
                continue
            try:
                described = self.describe_transaction(listing["transactional_id"])
            except EosError as exc:
                if exc.code != ErrorCode.TRANSACTIONAL_ID_NOT_FOUND:
                    raise
                continue
            live[described["producer_id"]] = (described["transactional_id"], set(described["partitions"]))
            for participant in described["participants"]:
                live[participant["producer_id"]] = (described["transactional_id"], set(participant["partitions"]))
        hanging = []
        for tp, state in candidates:
            transactional_id, open_partitions = live.get(state["producer_id"], (None, set()))
            if tp in open_partitions:
                continue
            hanging.append({"topic": tp.topic, "partition": tp.partition, "producer_id": state["producer_id"],
                            "producer_epoch": state["producer_epoch"], "coordinator_epoch": state["coordinator_epoch"],
                            "start_offset": state["current_txn_start_offset"],
                            "last_timestamp_ms": state["last_timestamp_ms"],
                            "duration_ms": now - state["last_timestamp_ms"], "transactional_id": transactional_id})
        return sorted(hanging, key=lambda h: (h["topic"], h["partition"], h["producer_id"]))

"""Partition assignors and the ConsumerProtocol bytes they travel in.

Theory of operation
-------------------
In Kafka's classic group protocol the coordinator never looks inside assignments: each
member sends its subscription as opaque protocol metadata in JoinGroup, the coordinator
picks one assignor name all members support, and the member it makes leader runs that
assignor over every member's subscription and sends the result back in SyncGroup. So the
assignors are pure functions, run by the consumer that leads:

    assign(partitions_per_topic: {topic: partition count},
           subscriptions: {member_id: Subscription}) -> {member_id: [TopicPartition]}

Every member appears in the result (an empty list when it gets nothing), every partition of
a subscribed, existing topic goes to exactly one member subscribed to that topic, and the
result is deterministic. Members are ordered as Kafka's MemberInfo orders them: static
members (with a group.instance.id) first by instance id, then dynamic members by member id,
so a restarted static member keeps its place.

- `RangeAssignor` ("range", Kafka's default): per topic, the partitions are cut into
  contiguous ranges over the sorted members subscribed to it; the first
  (partitions % members) members get one extra (10 partitions, 3 members: 4, 3, 3).
- `RoundRobinAssignor` ("roundrobin"): all subscribed partitions sorted by (topic,
  partition) are dealt in turn around the sorted members, skipping members not subscribed
  to the partition's topic.
- `StickyAssignor` ("sticky"): balanced first (when all members subscribe to the same
  topics, counts differ by at most one), then as few moves as possible: each member keeps
  the partitions it owned (`Subscription.owned_partitions`, claimed at the highest
  generation), orphaned partitions go to the least loaded eligible member, and partitions
  move from the most to the least loaded member only while that narrows a gap of two or
  more. When a member leaves, the survivors keep theirs and share its partitions.

- `CooperativeStickyAssignor` ("cooperative-sticky", KIP-429): the sticky assignment, then
  every partition that would move to a member while another member still claims it is
  taken out of the plan (`partitions_in_transfer`): nobody gets it this round. Its owner,
  finding it missing from its assignment, revokes it and rejoins at once; in that second
  rebalance it is claimed by no one and goes where the sticky plan puts it. So a member
  never reads a partition another member still holds, and nobody stops reading what stays.

Rebalance protocols (Kafka's `RebalanceProtocol`): EAGER members give up every partition
before they rejoin; COOPERATIVE members keep theirs, claim them in the subscription
(owned_partitions) and give up, after SyncGroup, only those missing from their new
assignment (`incremental_change`). Each assignor names the protocols it supports; a
consumer follows the newest protocol that all its configured assignors support
(`rebalance_protocol`): ["cooperative-sticky"] is COOPERATIVE, ["cooperative-sticky",
"range"] (the upgrade path: the group can still pick range while older members remain) is
EAGER. A group whose members share no assignor is refused by the coordinator with
INCONSISTENT_GROUP_PROTOCOL, which is how a mix of eager-only and cooperative-only members
is refused.

A change in a topic's partition count is not seen by the coordinator: the leader notices it
in its metadata and rejoins, which makes the coordinator start a rebalance (Kafka's rule).

Bytes (Kafka's ConsumerProtocol, big-endian, i32 array counts, i16 string lengths):

    Subscription v0: version i16, topics [string], user_data bytes? (i32 length, -1 null)
                 v1: + owned_partitions [topic string, partitions [i32]]
                 v2: + generation_id i32
    Assignment   v0: version i16, assigned [topic string, partitions [i32]], user_data bytes?

A newer version is read with the newest layout we know, ignoring what follows (Kafka's
rule: versions only append fields). Bad bytes raise ValueError naming the problem.
"""
from __future__ import annotations

import dataclasses
import enum
import struct
from collections import defaultdict
from typing import Iterable, Mapping, NamedTuple, Protocol

from eos.types import TopicPartition

CONSUMER_PROTOCOL_TYPE = "consumer"
SUBSCRIPTION_VERSION = 2
ASSIGNMENT_VERSION = 2
DEFAULT_GENERATION = -1

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


# ---- the ConsumerProtocol ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Subscription:
    """What one member asks for. `group_instance_id` is not in the bytes: the leader sets it
    from the JoinGroup response (it orders static members)."""

    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: tuple[TopicPartition, ...] = ()
    generation_id: int = DEFAULT_GENERATION
    group_instance_id: str | None = None


@dataclasses.dataclass(frozen=True)
class Assignment:
    partitions: tuple[TopicPartition, ...]
    user_data: bytes | None = None


def _string(text: str) -> bytes:
    raw = text.encode()
    return _I16.pack(len(raw)) + raw


def _partitions_by_topic(partitions: Iterable[TopicPartition]) -> bytes:
    by_topic: dict[str, list[int]] = defaultdict(list)
    for tp in partitions:
        by_topic[tp.topic].append(tp.partition)
    parts = [_I32.pack(len(by_topic))]
    for topic in sorted(by_topic):
        numbers = sorted(by_topic[topic])
        parts.append(_string(topic))
        parts.append(struct.pack(f">i{len(numbers)}i", len(numbers), *numbers))
    return b"".join(parts)


def _nullable_bytes(raw: bytes | None) -> bytes:
    return _I32.pack(-1) if raw is None else _I32.pack(len(raw)) + bytes(raw)


def encode_subscription(subscription: Subscription, version: int = SUBSCRIPTION_VERSION) -> bytes:
    if not 0 <= version <= SUBSCRIPTION_VERSION:
        raise ValueError(f"subscription version {version} is not 0..{SUBSCRIPTION_VERSION}")
    parts = [_I16.pack(version), _I32.pack(len(subscription.topics))]
    parts += [_string(topic) for topic in subscription.topics]
    parts.append(_nullable_bytes(subscription.user_data))
    if version >= 1:
        parts.append(_partitions_by_topic(subscription.owned_partitions))
    if version >= 2:
        parts.append(_I32.pack(subscription.generation_id))
    return b"".join(parts)


def encode_assignment(assignment: Assignment, version: int = ASSIGNMENT_VERSION) -> bytes:
    if not 0 <= version <= ASSIGNMENT_VERSION:
        raise ValueError(f"assignment version {version} is not 0..{ASSIGNMENT_VERSION}")
    return _I16.pack(version) + _partitions_by_topic(assignment.partitions) + _nullable_bytes(assignment.user_data)


class _Reader:
    def __init__(self, buf: bytes, what: str):
        self.buf, self.pos, self.what = bytes(buf), 0, what

    def _need(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError(f"{self.what}: truncated or bad length {n} at byte {self.pos} of {len(self.buf)}")

    def i16(self) -> int:
        self._need(2)
        (v,) = _I16.unpack_from(self.buf, self.pos)
        self.pos += 2
        return v

    def i32(self) -> int:
        self._need(4)
        (v,) = _I32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def string(self) -> str:
        n = self.i16()
        self._need(n)
        try:
            text = self.buf[self.pos:self.pos + n].decode()
        except UnicodeDecodeError:
            raise ValueError(f"{self.what}: string at byte {self.pos} is not UTF-8") from None
        self.pos += n
        return text

    def nullable_bytes(self) -> bytes | None:
        n = self.i32()
        if n == -1:
            return None
        self._need(n)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return raw

    def count(self, min_item_bytes: int) -> int:
        n = self.i32()
        if n < 0 or n * min_item_bytes > len(self.buf) - self.pos:
            raise ValueError(f"{self.what}: array count {n} at byte {self.pos} does not fit")
        return n

    def partitions_by_topic(self) -> tuple[TopicPartition, ...]:
        found = []
        for _ in range(self.count(min_item_bytes=6)):
            topic = self.string()
            for _ in range(self.count(min_item_bytes=4)):
                found.append(TopicPartition(topic, self.i32()))
        return tuple(found)


def decode_subscription(data: bytes) -> Subscription:
    reader = _Reader(data, "consumer subscription")
    version = reader.i16()
    if version < 0:
        raise ValueError(f"consumer subscription version {version} is negative")
    topics = tuple(reader.string() for _ in range(reader.count(min_item_bytes=2)))
    user_data = reader.nullable_bytes()
    owned = reader.partitions_by_topic() if version >= 1 else ()
    generation_id = reader.i32() if version >= 2 else DEFAULT_GENERATION
    if version <= SUBSCRIPTION_VERSION and reader.pos != len(reader.buf):
        raise ValueError(f"consumer subscription: {len(reader.buf) - reader.pos} unexpected trailing bytes")
    return Subscription(topics, user_data, owned, generation_id)


def decode_assignment(data: bytes) -> Assignment:
    reader = _Reader(data, "consumer assignment")
    version = reader.i16()
    if version < 0:
        raise ValueError(f"consumer assignment version {version} is negative")
    partitions = reader.partitions_by_topic()
    user_data = reader.nullable_bytes()
    if version <= ASSIGNMENT_VERSION and reader.pos != len(reader.buf):
        raise ValueError(f"consumer assignment: {len(reader.buf) - reader.pos} unexpected trailing bytes")
    return Assignment(partitions, user_data)


# ---- assignors -----------------------------------------------------------------------------

def member_order(member_id: str, subscription: Subscription) -> tuple:
    """Kafka's MemberInfo order: static members by instance id first, then dynamic by member id."""
    if subscription.group_instance_id is not None:
        return (0, subscription.group_instance_id, member_id)
    return (1, member_id, "")


def _sorted_members(subscriptions: Mapping[str, Subscription]) -> list[str]:
    return sorted(subscriptions, key=lambda m: member_order(m, subscriptions[m]))


def _check_counts(partitions_per_topic: Mapping[str, int]) -> None:
    for topic, count in partitions_per_topic.items():
        if count < 0:
            raise ValueError(f"topic {topic!r} has a negative partition count {count}")


class RebalanceProtocol(enum.IntEnum):
    """Kafka's ConsumerPartitionAssignor.RebalanceProtocol; a higher id is a newer protocol."""

    EAGER = 0
    COOPERATIVE = 1


class PartitionAssignor(Protocol):
    name: str
    supported_protocols: tuple[RebalanceProtocol, ...]

    def assign(self, partitions_per_topic: Mapping[str, int],
               subscriptions: Mapping[str, Subscription]) -> dict[str, list[TopicPartition]]: ...


class RangeAssignor:
    name = "range"
    supported_protocols = (RebalanceProtocol.EAGER,)

    def assign(self, partitions_per_topic: Mapping[str, int],
               subscriptions: Mapping[str, Subscription]) -> dict[str, list[TopicPartition]]:
        _check_counts(partitions_per_topic)
        result: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
        members_by_topic: dict[str, list[str]] = defaultdict(list)
        for member_id in _sorted_members(subscriptions):
            for topic in dict.fromkeys(subscriptions[member_id].topics):
                members_by_topic[topic].append(member_id)
        for topic in sorted(members_by_topic):
            count = partitions_per_topic.get(topic)
            if count is None:
                continue  # no metadata for the topic (yet): Kafka skips it
            members = members_by_topic[topic]
            per_member, extra = divmod(count, len(members))
            start = 0
            for i, member_id in enumerate(members):
                length = per_member + (1 if i < extra else 0)
                result[member_id].extend(TopicPartition(topic, p) for p in range(start, start + length))
                start += length
        return result


class RoundRobinAssignor:
    name = "roundrobin"
    supported_protocols = (RebalanceProtocol.EAGER,)

    def assign(self, partitions_per_topic: Mapping[str, int],
               subscriptions: Mapping[str, Subscription]) -> dict[str, list[TopicPartition]]:
        _check_counts(partitions_per_topic)
        result: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
        members = _sorted_members(subscriptions)
        if not members:
            return result
        wanted = {m: set(subscriptions[m].topics) for m in members}
        topics = sorted({t for s in wanted.values() for t in s if t in partitions_per_topic})
        turn = 0
        for topic in topics:
            for partition in range(partitions_per_topic[topic]):
                # Advance around the circle to the next member subscribed to this topic; some
                # member is, since the topic came from a subscription.
                while topic not in wanted[members[turn % len(members)]]:
                    turn += 1
                result[members[turn % len(members)]].append(TopicPartition(topic, partition))
                turn += 1
        return result


class StickyAssignor:
    name = "sticky"
    supported_protocols = (RebalanceProtocol.EAGER,)

    def assign(self, partitions_per_topic: Mapping[str, int],
               subscriptions: Mapping[str, Subscription]) -> dict[str, list[TopicPartition]]:
        _check_counts(partitions_per_topic)
        members = _sorted_members(subscriptions)
        rank = {m: i for i, m in enumerate(members)}
        wanted = {m: set(subscriptions[m].topics) for m in members}
        eligible: dict[str, list[str]] = {
            topic: [m for m in members if topic in wanted[m]]
            for topic in sorted({t for s in wanted.values() for t in s if t in partitions_per_topic})}
        all_partitions = [TopicPartition(t, p) for t in eligible for p in range(partitions_per_topic[t])]
        valid = set(all_partitions)

        # 1. Who owned what: a partition claimed by several members stays with the claim of the
        #    highest generation; a tie at that generation is a conflict and nobody keeps it.
        claims: dict[TopicPartition, list[tuple[int, str]]] = defaultdict(list)
        for m in members:
            sub = subscriptions[m]
            for tp in dict.fromkeys(sub.owned_partitions):
                if tp in valid and tp.topic in wanted[m]:
                    claims[tp].append((sub.generation_id, m))
        owner: dict[TopicPartition, str] = {}
        for tp, claimants in claims.items():
            best = max(g for g, _ in claimants)
            at_best = [m for g, m in claimants if g == best]
            if len(at_best) == 1:
                owner[tp] = at_best[0]
        assigned: dict[str, list[TopicPartition]] = {m: [] for m in members}
        for tp in all_partitions:
            if tp in owner:
                assigned[owner[tp]].append(tp)

        # 2. Balance by quota when everyone wants the same topics: each member keeps at most
        #    its quota of what it owned (the members owning most get the larger quotas), so
        #    only the excess of overloaded members is freed.
        if members and all(wanted[m] == wanted[members[0]] for m in members):
            base, extra = divmod(len(all_partitions), len(members))
            by_load = sorted(members, key=lambda m: (-len(assigned[m]), rank[m]))
            for i, m in enumerate(by_load):
                quota = base + (1 if i < extra else 0)
                for tp in assigned[m][quota:]:
                    del owner[tp]
                del assigned[m][quota:]

        # 3. Every unowned partition goes to the least loaded member that may take it.
        for tp in all_partitions:
            if tp not in owner and eligible[tp.topic]:
                m = min(eligible[tp.topic], key=lambda c: (len(assigned[c]), rank[c]))
                owner[tp] = m
                assigned[m].append(tp)

        # 4. Move partitions from heavier to lighter eligible members while a move narrows a gap
        #    of two or more (each move lowers the sum of squared loads, so this ends).
        self._rebalance(assigned, owner, eligible, rank)
        return {m: sorted(assigned[m]) for m in members}

    @staticmethod
    def _rebalance(assigned: dict[str, list[TopicPartition]], owner: dict[TopicPartition, str],
                   eligible: dict[str, list[str]], rank: dict[str, int]) -> None:
        moved = True
        while moved:
            moved = False
            # Heaviest first; for each of its partitions (newest first, the ones it held least),
            # the lightest eligible taker at least two lighter.
            for giver in sorted(assigned, key=lambda m: (-len(assigned[m]), rank[m])):
                for tp in reversed(assigned[giver]):
                    takers = [c for c in eligible[tp.topic] if len(assigned[c]) + 2 <= len(assigned[giver])]
                    if takers:
                        taker = min(takers, key=lambda c: (len(assigned[c]), rank[c]))
                        assigned[giver].remove(tp)
                        assigned[taker].append(tp)
                        owner[tp] = taker
                        moved = True
                        break
                if moved:
                    break


def partitions_in_transfer(plan: Mapping[str, Iterable[TopicPartition]],
                           subscriptions: Mapping[str, Subscription]) -> set[TopicPartition]:
    """The partitions `plan` gives to a member while another member claims to own them.
    Any claim counts, whatever its generation: a stale claimant still reads the partition
    until its own SyncGroup tells it to revoke, so handing it on now would let two members
    read it at once."""
    claimants: dict[TopicPartition, set[str]] = defaultdict(set)
    for member_id, sub in subscriptions.items():
        for tp in sub.owned_partitions:
            claimants[tp].add(member_id)
    return {tp for member_id, tps in plan.items() for tp in tps if claimants.get(tp, set()) - {member_id}}


class CooperativeStickyAssignor(StickyAssignor):
    name = "cooperative-sticky"
    supported_protocols = (RebalanceProtocol.EAGER, RebalanceProtocol.COOPERATIVE)

    def assign(self, partitions_per_topic: Mapping[str, int],
               subscriptions: Mapping[str, Subscription]) -> dict[str, list[TopicPartition]]:
        plan = super().assign(partitions_per_topic, subscriptions)
        # EAGER members claim nothing (they gave everything up before joining), so under the
        # eager protocol nothing is in transfer and this is the sticky assignment itself.
        moving = partitions_in_transfer(plan, subscriptions)
        return {m: [tp for tp in tps if tp not in moving] for m, tps in plan.items()}


ASSIGNORS: dict[str, PartitionAssignor] = {
    a.name: a for a in (RangeAssignor(), RoundRobinAssignor(), StickyAssignor(), CooperativeStickyAssignor())}
DEFAULT_ASSIGNOR = "range"


def assignor_for(name: str) -> PartitionAssignor:
    try:
        return ASSIGNORS[name]
    except KeyError:
        raise ValueError(f"unknown partition.assignment.strategy {name!r}; known: {', '.join(sorted(ASSIGNORS))}") from None


def rebalance_protocol(assignor_names: Iterable[str]) -> RebalanceProtocol:
    """The protocol a consumer configured with these assignors follows: the newest one all
    of them support (Kafka's ConsumerCoordinator rule)."""
    names = list(assignor_names)
    if not names:
        raise ValueError("no assignor configured")
    common = set(RebalanceProtocol)
    for name in names:
        common &= set(assignor_for(name).supported_protocols)
    if not common:
        raise ValueError(f"the assignors {names} support no rebalance protocol in common")
    return max(common)


class AssignmentChange(NamedTuple):
    """What a cooperative member does with a new assignment: give up `revoked`, start
    `added`, keep reading `kept` without a pause."""

    kept: tuple[TopicPartition, ...]
    revoked: tuple[TopicPartition, ...]
    added: tuple[TopicPartition, ...]


def incremental_change(owned: Iterable[TopicPartition], assigned: Iterable[TopicPartition]) -> AssignmentChange:
    owned_set, assigned_set = set(owned), set(assigned)
    return AssignmentChange(kept=tuple(sorted(owned_set & assigned_set)),
                            revoked=tuple(sorted(owned_set - assigned_set)),
                            added=tuple(sorted(assigned_set - owned_set)))


def partitions_not_subscribed(owned: Iterable[TopicPartition], topics: Iterable[str]) -> tuple[TopicPartition, ...]:
    """What a cooperative member revokes before it rejoins: the partitions of topics it no
    longer subscribes to (it cannot claim them, and nobody else would get them while it held them)."""
    wanted = set(topics)
    return tuple(sorted(tp for tp in owned if tp.topic not in wanted))


def assign_group(assignor: PartitionAssignor, partitions_per_topic: Mapping[str, int],
                 members: Iterable[tuple[str, str | None, bytes]]) -> dict[str, bytes]:
    """What the group leader does with a JoinGroup response: decode each member's
    (member_id, group_instance_id, metadata), assign, and encode the SyncGroup assignments."""
    subscriptions = {}
    for member_id, group_instance_id, metadata in members:
        sub = decode_subscription(metadata)
        subscriptions[member_id] = dataclasses.replace(sub, group_instance_id=group_instance_id or None)
    plan = assignor.assign(partitions_per_topic, subscriptions)
    return {m: encode_assignment(Assignment(tuple(tps))) for m, tps in plan.items()}


__all__ = ["Subscription", "Assignment", "encode_subscription", "decode_subscription", "encode_assignment",
           "decode_assignment", "RangeAssignor", "RoundRobinAssignor", "StickyAssignor", "CooperativeStickyAssignor",
           "RebalanceProtocol", "rebalance_protocol", "partitions_in_transfer", "AssignmentChange",
           "incremental_change", "partitions_not_subscribed", "ASSIGNORS",
           "DEFAULT_ASSIGNOR", "assignor_for", "assign_group", "member_order", "CONSUMER_PROTOCOL_TYPE"]

"""Assignors (consumer.assignors) as Kafka defines them, and the ConsumerProtocol bytes."""
from __future__ import annotations

import struct
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.assignors import (ASSIGNORS, Assignment, AssignmentChange, CooperativeStickyAssignor, RangeAssignor,
                                RebalanceProtocol, RoundRobinAssignor, StickyAssignor, Subscription, assign_group,
                                assignor_for, decode_assignment, decode_subscription, encode_assignment,
                                encode_subscription, incremental_change, partitions_in_transfer,
                                partitions_not_subscribed, rebalance_protocol)
from eos.types import TopicPartition as TP


def subs(**topics_by_member):
    return {m: Subscription(tuple(t)) for m, t in topics_by_member.items()}


def counts(plan):
    return {m: len(tps) for m, tps in plan.items()}


def assert_exact_cover(plan, partitions_per_topic, subscriptions):
    """Every partition of a subscribed topic goes to exactly one member subscribed to it."""
    owners = Counter(tp for tps in plan.values() for tp in tps)
    wanted = {t for s in subscriptions.values() for t in s.topics if t in partitions_per_topic}
    expected = {TP(t, p) for t in wanted for p in range(partitions_per_topic[t])}
    assert set(owners) == expected
    assert all(n == 1 for n in owners.values()), [tp for tp, n in owners.items() if n > 1]
    for m, tps in plan.items():
        assert all(tp.topic in subscriptions[m].topics for tp in tps)
    assert set(plan) == set(subscriptions)


# ---- range -------------------------------------------------------------------------------

def test_range_10_partitions_3_consumers_gives_4_3_3():
    plan = RangeAssignor().assign({"t": 10}, subs(c=["t"], a=["t"], b=["t"]))
    assert plan == {"a": [TP("t", p) for p in range(0, 4)],
                    "b": [TP("t", p) for p in range(4, 7)],
                    "c": [TP("t", p) for p in range(7, 10)]}


def test_range_is_per_topic_so_the_first_members_get_the_extras_of_every_topic():
    plan = RangeAssignor().assign({"t1": 3, "t2": 3}, subs(a=["t1", "t2"], b=["t1", "t2"]))
    assert counts(plan) == {"a": 4, "b": 2}
    assert plan["a"] == [TP("t1", 0), TP("t1", 1), TP("t2", 0), TP("t2", 1)]


def test_range_only_counts_members_subscribed_to_the_topic_and_skips_unknown_topics():
    plan = RangeAssignor().assign({"t1": 4, "t2": 2}, subs(a=["t1"], b=["t1", "t2", "missing"], c=["t2"]))
    assert plan == {"a": [TP("t1", 0), TP("t1", 1)], "b": [TP("t1", 2), TP("t1", 3), TP("t2", 0)], "c": [TP("t2", 1)]}


def test_more_members_than_partitions_leaves_some_empty():
    plan = RangeAssignor().assign({"t": 2}, subs(a=["t"], b=["t"], c=["t"]))
    assert counts(plan) == {"a": 1, "b": 1, "c": 0}


def test_static_members_sort_first_by_instance_id():
    s = {"zzz": Subscription(("t",), group_instance_id="instance-a"),
         "aaa": Subscription(("t",)),
         "mmm": Subscription(("t",), group_instance_id="instance-b")}
    plan = RangeAssignor().assign({"t": 3}, s)
    assert plan == {"zzz": [TP("t", 0)], "mmm": [TP("t", 1)], "aaa": [TP("t", 2)]}


# ---- round-robin -------------------------------------------------------------------------

def test_round_robin_deals_in_turn():
    plan = RoundRobinAssignor().assign({"t": 7}, subs(b=["t"], a=["t"], c=["t"]))
    assert plan == {"a": [TP("t", 0), TP("t", 3), TP("t", 6)], "b": [TP("t", 1), TP("t", 4)],
                    "c": [TP("t", 2), TP("t", 5)]}


def test_round_robin_goes_across_topics_in_sorted_order():
    plan = RoundRobinAssignor().assign({"t2": 2, "t1": 3}, subs(a=["t1", "t2"], b=["t1", "t2"]))
    assert plan == {"a": [TP("t1", 0), TP("t1", 2), TP("t2", 1)], "b": [TP("t1", 1), TP("t2", 0)]}


def test_round_robin_skips_members_not_subscribed():
    plan = RoundRobinAssignor().assign({"t1": 2, "t2": 2}, subs(a=["t1"], b=["t1", "t2"], c=["t2"]))
    # t1-0 -> a, t1-1 -> b, t2-0 -> c, t2-1 -> (a skipped) b
    assert plan == {"a": [TP("t1", 0)], "b": [TP("t1", 1), TP("t2", 1)], "c": [TP("t2", 0)]}


# ---- sticky ------------------------------------------------------------------------------

def owned(plan, generation=1):
    return {m: Subscription(("t",), owned_partitions=tuple(tps), generation_id=generation) for m, tps in plan.items()}


def test_sticky_first_assignment_is_balanced():
    plan = StickyAssignor().assign({"t": 10}, subs(a=["t"], b=["t"], c=["t"]))
    assert sorted(counts(plan).values()) == [3, 3, 4]
    assert_exact_cover(plan, {"t": 10}, subs(a=["t"], b=["t"], c=["t"]))


def test_sticky_keeps_the_survivors_partitions_when_a_member_leaves():
    first = StickyAssignor().assign({"t": 10}, subs(a=["t"], b=["t"], c=["t"]))
    survivors = owned({m: first[m] for m in ("a", "c")})
    second = StickyAssignor().assign({"t": 10}, survivors)
    for m in ("a", "c"):
        assert set(first[m]) <= set(second[m])
    assert sorted(counts(second).values()) == [5, 5]
    assert set(second["a"]) | set(second["c"]) == {TP("t", p) for p in range(10)}


def test_sticky_moves_only_what_balance_needs_when_a_member_joins():
    first = StickyAssignor().assign({"t": 9}, subs(a=["t"], b=["t"]))
    s = owned(first)
    s["c"] = Subscription(("t",), generation_id=-1)
    second = StickyAssignor().assign({"t": 9}, s)
    assert counts(second) == {"a": 3, "b": 3, "c": 3}
    kept = sum(len(set(first[m]) & set(second[m])) for m in ("a", "b"))
    assert kept == 6   # only the three partitions c needed moved


def test_sticky_conflicting_claims_go_to_the_highest_generation():
    s = {"a": Subscription(("t",), owned_partitions=(TP("t", 0), TP("t", 1)), generation_id=5),
         "b": Subscription(("t",), owned_partitions=(TP("t", 0),), generation_id=4)}
    plan = StickyAssignor().assign({"t": 2}, s)
    # a's claim on t-0 wins (generation 5 over 4); a is over its quota of one, so it keeps
    # t-0 and its other partition goes to b.
    assert plan == {"a": [TP("t", 0)], "b": [TP("t", 1)]}
    tie = {"a": Subscription(("t",), owned_partitions=(TP("t", 0),), generation_id=5),
           "b": Subscription(("t",), owned_partitions=(TP("t", 0),), generation_id=5)}
    assert counts(StickyAssignor().assign({"t": 2}, tie)) == {"a": 1, "b": 1}


def test_sticky_drops_claims_on_partitions_that_no_longer_exist_or_are_not_subscribed():
    s = {"a": Subscription(("t",), owned_partitions=(TP("t", 5), TP("gone", 0)), generation_id=1),
         "b": Subscription(("t",))}
    plan = StickyAssignor().assign({"t": 2}, s)
    assert_exact_cover(plan, {"t": 2}, s)
    assert counts(plan) == {"a": 1, "b": 1}


topics_st = st.lists(st.sampled_from(["t0", "t1", "t2", "t3"]), min_size=1, max_size=4, unique=True)


@settings(max_examples=60, deadline=None)
@given(n_members=st.integers(1, 7), partition_counts=st.lists(st.integers(0, 12), min_size=4, max_size=4),
       topics=topics_st, prior=st.data())
def test_sticky_balance_within_one_for_equal_subscriptions(n_members, partition_counts, topics, prior):
    per_topic = dict(zip(["t0", "t1", "t2", "t3"], partition_counts))
    all_tps = [TP(t, p) for t in topics for p in range(per_topic[t])]
    members = [f"m{i}" for i in range(n_members)]
    # A random previous ownership, possibly overlapping, with random generations.
    s = {}
    for m in members:
        claimed = prior.draw(st.lists(st.sampled_from(all_tps), max_size=6, unique=True)) if all_tps else []
        s[m] = Subscription(tuple(topics), owned_partitions=tuple(claimed), generation_id=prior.draw(st.integers(-1, 3)))
    plan = StickyAssignor().assign(per_topic, s)
    assert_exact_cover(plan, per_topic, s)
    sizes = counts(plan).values()
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=60, deadline=None)
@given(per_topic=st.dictionaries(st.sampled_from(["t0", "t1", "t2"]), st.integers(0, 8), min_size=1),
       member_topics=st.lists(topics_st, min_size=1, max_size=6))
def test_every_assignor_covers_exactly_and_sticky_cannot_improve(per_topic, member_topics):
    s = {f"m{i}": Subscription(tuple(t)) for i, t in enumerate(member_topics)}
    for assignor in ASSIGNORS.values():
        plan = assignor.assign(per_topic, s)
        assert_exact_cover(plan, per_topic, s)
        assert plan == assignor.assign(per_topic, s)   # deterministic
    plan = StickyAssignor().assign(per_topic, s)
    load = counts(plan)
    for m, tps in plan.items():
        for tp in tps:
            assert not any(tp.topic in s[o].topics and load[o] + 2 <= load[m] for o in s), (m, tp, load)


def test_round_robin_balance_within_one_for_equal_subscriptions():
    plan = RoundRobinAssignor().assign({"a": 5, "b": 7}, subs(x=["a", "b"], y=["a", "b"], z=["a", "b"]))
    assert sorted(counts(plan).values()) == [4, 4, 4]


def test_bad_partition_count_is_refused_and_unknown_assignor_named():
    with pytest.raises(ValueError, match="negative partition count"):
        RangeAssignor().assign({"t": -1}, subs(a=["t"]))
    with pytest.raises(ValueError, match="unknown partition.assignment.strategy 'magic'"):
        assignor_for("magic")
    assert assignor_for("sticky").name == "sticky"


# ---- cooperative-sticky (KIP-429) ----------------------------------------------------------

EAGER, COOPERATIVE = RebalanceProtocol.EAGER, RebalanceProtocol.COOPERATIVE


@pytest.mark.parametrize("names, protocol", [
    (["range"], EAGER),
    (["sticky"], EAGER),
    (["cooperative-sticky"], COOPERATIVE),
    (["cooperative-sticky", "range"], EAGER),      # the upgrade path: eager until range is dropped
    (["roundrobin", "cooperative-sticky"], EAGER),
])
def test_a_consumer_follows_the_newest_protocol_all_its_assignors_support(names, protocol):
    assert rebalance_protocol(names) is protocol


def test_rebalance_protocol_refuses_nothing_and_unknown_names():
    with pytest.raises(ValueError, match="no assignor"):
        rebalance_protocol([])
    with pytest.raises(ValueError, match="unknown"):
        rebalance_protocol(["fair"])


def claims(owned_by_member, generation=3, topics=("t",)):
    return {m: Subscription(tuple(topics), owned_partitions=tuple(tps), generation_id=generation)
            for m, tps in owned_by_member.items()}


@pytest.mark.parametrize("plan, owned, moving", [
    ({"a": [TP("t", 0)]}, {"a": [TP("t", 0)]}, set()),                               # kept
    ({"a": [TP("t", 0)], "b": []}, {"a": [], "b": []}, set()),                       # unclaimed
    ({"a": [], "b": [TP("t", 0)]}, {"a": [TP("t", 0)], "b": []}, {TP("t", 0)}),      # moves a -> b
    ({"a": [TP("t", 0)], "b": []}, {"a": [TP("t", 0)], "b": [TP("t", 0)]}, {TP("t", 0)}),  # b's stale claim
    ({"a": [TP("t", 1)], "b": [TP("t", 0)]}, {"a": [TP("t", 0)], "b": [TP("t", 1)]},
     {TP("t", 0), TP("t", 1)}),                                                      # a swap: both wait
])
def test_partitions_in_transfer_are_those_given_while_another_member_claims_them(plan, owned, moving):
    assert partitions_in_transfer(plan, claims(owned)) == moving


@pytest.mark.parametrize("owned, assigned, change", [
    ([], [TP("t", 0)], AssignmentChange((), (), (TP("t", 0),))),
    ([TP("t", 0), TP("t", 1)], [TP("t", 1)], AssignmentChange((TP("t", 1),), (TP("t", 0),), ())),
    ([TP("t", 1), TP("t", 0)], [TP("t", 0), TP("t", 1)], AssignmentChange((TP("t", 0), TP("t", 1)), (), ())),
    ([TP("t", 0)], [TP("t", 2)], AssignmentChange((), (TP("t", 0),), (TP("t", 2),))),
    ([TP("t", 0)], [], AssignmentChange((), (TP("t", 0),), ())),
])
def test_incremental_change_revokes_only_what_was_lost_and_adds_only_what_is_new(owned, assigned, change):
    assert incremental_change(owned, assigned) == change


def test_before_rejoining_a_cooperative_member_revokes_only_topics_it_dropped():
    owned = [TP("a", 0), TP("b", 1), TP("a", 1)]
    assert partitions_not_subscribed(owned, ["a", "b"]) == ()
    assert partitions_not_subscribed(owned, ["b"]) == (TP("a", 0), TP("a", 1))


def test_cooperative_sticky_without_claims_is_the_sticky_assignment():
    s = subs(a=["t"], b=["t"], c=["t"])
    assert CooperativeStickyAssignor().assign({"t": 10}, s) == StickyAssignor().assign({"t": 10}, s)
    assert assignor_for("cooperative-sticky").supported_protocols == (EAGER, COOPERATIVE)


def test_a_fourth_member_joining_three_takes_over_in_two_rounds_and_nobody_else_stops():
    tps = [TP("t", p) for p in range(12)]
    before = {"a": tps[0:4], "b": tps[4:8], "c": tps[8:12]}
    first_round = claims({**before, "d": []})
    plan1 = CooperativeStickyAssignor().assign({"t": 12}, first_round)
    # Round 1: d gets nothing yet (what it should get is still owned); each old member keeps 3 of 4.
    assert plan1["d"] == []
    for m in "abc":
        assert set(plan1[m]) <= set(before[m]) and len(plan1[m]) == 3
    freed = set(tps) - {tp for m in "abc" for tp in plan1[m]}
    assert len(freed) == 3
    # Round 2 (the members that revoked rejoined): the freed partitions go to d, nothing else moves.
    plan2 = CooperativeStickyAssignor().assign({"t": 12}, claims(plan1, generation=4))
    assert set(plan2["d"]) == freed
    assert all(plan2[m] == plan1[m] for m in "abc")


@settings(max_examples=80, deadline=None)
@given(n_members=st.integers(1, 6), n_new=st.integers(0, 3), n_partitions=st.integers(0, 20), data=st.data())
def test_cooperative_rounds_never_give_a_claimed_partition_and_settle_in_two(n_members, n_new, n_partitions, data):
    """Start from a valid cooperative group (nobody claims a partition twice), add members:
    no round hands a partition to a member while another owns it, and after the owners have
    revoked (one more round) the assignment is an exact, balanced cover with nothing in transfer."""
    per_topic = {"t": n_partitions}
    tps = [TP("t", p) for p in range(n_partitions)]
    old = [f"m{i}" for i in range(n_members)]
    owner_of = {tp: data.draw(st.sampled_from(old + [None])) for tp in tps}
    owned = {m: [tp for tp in tps if owner_of[tp] == m] for m in old}
    owned.update({f"new{i}": [] for i in range(n_new)})
    for round_number in range(2):
        plan = CooperativeStickyAssignor().assign(per_topic, claims(owned, generation=round_number))
        for m, given_now in plan.items():
            for tp in given_now:
                assert all(tp not in owned[o] for o in owned if o != m), (round_number, m, tp)
        owned = {m: list(plan[m]) for m in plan}    # each member revokes what it lost, keeps the rest
    assert_exact_cover(plan, per_topic, claims(owned))
    sizes = counts(plan).values()
    assert max(sizes) - min(sizes) <= 1


# ---- ConsumerProtocol bytes --------------------------------------------------------------

def s16(text):
    return struct.pack(">h", len(text)) + text.encode()


def test_subscription_bytes_follow_kafkas_layout():
    sub = Subscription(("b", "a"), b"ud", (TP("a", 2), TP("a", 0), TP("b", 1)), 7)
    assert encode_subscription(sub, version=0) == struct.pack(">hi", 0, 2) + s16("b") + s16("a") + struct.pack(">i", 2) + b"ud"
    v2 = encode_subscription(sub)
    assert v2 == (struct.pack(">hi", 2, 2) + s16("b") + s16("a") + struct.pack(">i", 2) + b"ud"
                  + struct.pack(">i", 2) + s16("a") + struct.pack(">iii", 2, 0, 2) + s16("b") + struct.pack(">ii", 1, 1)
                  + struct.pack(">i", 7))
    back = decode_subscription(v2)
    assert back.topics == ("b", "a") and back.user_data == b"ud" and back.generation_id == 7
    assert set(back.owned_partitions) == set(sub.owned_partitions)
    assert decode_subscription(encode_subscription(Subscription(("t",)), version=0)) == Subscription(("t",))


def test_assignment_bytes_follow_kafkas_layout():
    a = Assignment((TP("t", 1), TP("t", 0)), None)
    raw = encode_assignment(a, version=0)
    assert raw == struct.pack(">hi", 0, 1) + s16("t") + struct.pack(">iii", 2, 0, 1) + struct.pack(">i", -1)
    assert decode_assignment(raw) == Assignment((TP("t", 0), TP("t", 1)), None)


def test_newer_versions_are_read_with_the_newest_layout_we_know():
    raw = encode_subscription(Subscription(("t",), None, (), 3)) + b"rack-field-of-v3"
    raw = struct.pack(">h", 3) + raw[2:]
    assert decode_subscription(raw) == Subscription(("t",), None, (), 3)


@pytest.mark.parametrize("raw, problem", [
    (b"", "truncated"),
    (struct.pack(">hi", 0, 5), "array count 5"),
    (struct.pack(">hi", 0, -2), "array count -2"),
    (struct.pack(">hi", 0, 1) + struct.pack(">h", 9) + b"ab", "truncated or bad length 9"),
    (struct.pack(">hi", 0, 0) + struct.pack(">i", -4), "bad length -4"),
    (struct.pack(">hi", 0, 0) + struct.pack(">i", -1) + b"x", "trailing"),
    (struct.pack(">h", -3), "negative"),
])
def test_corrupt_subscriptions_are_refused(raw, problem):
    with pytest.raises(ValueError, match=problem):
        decode_subscription(raw)


@settings(max_examples=50, deadline=None)
@given(topics=st.lists(st.text(max_size=8), max_size=4).map(tuple), user_data=st.none() | st.binary(max_size=10),
       owned=st.lists(st.tuples(st.text(max_size=5), st.integers(0, 100)), max_size=5, unique=True),
       generation=st.integers(-1, 1000))
def test_protocol_round_trips(topics, user_data, owned, generation):
    owned_tps = tuple(sorted(TP(t, p) for t, p in owned))
    sub = Subscription(topics, user_data, owned_tps, generation)
    back = decode_subscription(encode_subscription(sub))
    assert (back.topics, back.user_data, tuple(sorted(back.owned_partitions)), back.generation_id) == \
        (topics, user_data, owned_tps, generation)
    a = Assignment(owned_tps, user_data)
    back_a = decode_assignment(encode_assignment(a))
    assert tuple(sorted(back_a.partitions)) == owned_tps and back_a.user_data == user_data


def test_assign_group_runs_the_leaders_step():
    members = [("m1", None, encode_subscription(Subscription(("t",)))),
               ("m2", "static-1", encode_subscription(Subscription(("t",))))]
    out = assign_group(RangeAssignor(), {"t": 3}, members)
    # The static member sorts first and so gets the extra partition.
    assert decode_assignment(out["m2"]).partitions == (TP("t", 0), TP("t", 1))
    assert decode_assignment(out["m1"]).partitions == (TP("t", 2),)

"""Table and scenario tests of the group membership state machine (broker.group.state),
driven the way the service shell will drive it: requests with a time, parked tokens,
completions and writes."""
from __future__ import annotations

import itertools
from collections import Counter

import pytest

from broker.group.records import decode_record
from broker.group.state import (VALID_PREVIOUS_STATES, Group, GroupCoordinatorCore, GroupState, JoinResponse,
                                SyncResponse, _transition)
from consumer.assignors import (RangeAssignor, StickyAssignor, Subscription, assign_group, decode_assignment,
                                encode_subscription)
from eos.errors import ErrorCode as E, InvariantError
from eos.types import TopicPartition as TP

S = GroupState
SESSION_MS, REBALANCE_MS = 10_000, 30_000
TOPICS = {"t": 10}


def sub(*topics, owned=(), generation=-1):
    return encode_subscription(Subscription(tuple(topics or ("t",)), owned_partitions=tuple(owned), generation_id=generation))


class Shell:
    """Plays the service shell: keeps answers of parked requests, writes group records to a
    fake log (kept for replay) unless told to hold them."""

    def __init__(self, core=None, **config):
        ids = itertools.count(1)
        config.setdefault("initial_rebalance_delay_ms", 0)
        self.core = core or GroupCoordinatorCore(member_id_factory=lambda client, inst: f"{inst or client}-{next(ids)}",
                                                 **config)
        self.now = 0
        self.answers: dict[int, object] = {}
        self.log: list[tuple[bytes, bytes | None]] = []
        self.hold_writes = False
        self.held = []

    def handle(self, outcome):
        for done in outcome.completed:
            assert done.token not in self.answers, "a token completed twice"
            self.answers[done.token] = done.response
        for write in outcome.writes:
            if self.hold_writes:
                self.held.append(write)
            else:
                self.log.append(write.record())
                self.handle(self.core.write_completed(write.write_id, self.now))
        return outcome

    def release(self, error=E.NONE):
        held, self.held = self.held, []
        for write in held:
            if error is E.NONE:
                self.log.append(write.record())
            self.handle(self.core.write_completed(write.write_id, self.now, error))

    def result(self, outcome):
        """The answer now, or the token when parked."""
        self.handle(outcome)
        return outcome.response if outcome.token is None else outcome.token

    def answer(self, token_or_response):
        if isinstance(token_or_response, int):
            return self.answers.get(token_or_response)
        return token_or_response

    def join(self, member_id="", instance=None, protocols=None, group="g", session_ms=SESSION_MS,
             rebalance_ms=REBALANCE_MS, protocol_type="consumer", client="c"):
        protocols = protocols if protocols is not None else [("range", sub())]
        return self.result(self.core.join(group, member_id, instance, protocol_type, protocols, session_ms,
                                          rebalance_ms, self.now, client_id=client, client_host="/127.0.0.1"))

    def new_member(self, client="c", **kw):
        """KIP-394: first join gets an id, the second join uses it. Returns (member_id, token or response)."""
        first = self.join(client=client, **kw)
        assert isinstance(first, JoinResponse) and first.error is E.MEMBER_ID_REQUIRED, first
        return first.member_id, self.join(member_id=first.member_id, client=client, **kw)

    def sync(self, member_id, generation, assignments=None, instance=None, group="g"):
        return self.result(self.core.sync(group, generation, member_id, instance, assignments or {}, self.now))

    def heartbeat(self, member_id, generation, instance=None, group="g"):
        return self.result(self.core.heartbeat(group, generation, member_id, instance, self.now)).error

    def leave(self, member_id, instance=None, group="g"):
        return self.result(self.core.leave(group, member_id, instance, self.now)).error

    def tick(self, to_ms):
        self.now = to_ms
        return self.handle(self.core.tick(to_ms))

    def state(self, group="g"):
        return self.core.groups[group].state


def stabilize(shell: Shell, join_answers: dict[str, object], assignor=RangeAssignor(), topics=TOPICS):
    """Given each member's join (token or response) of one round, have the leader assign and
    everyone sync. Returns ({member: [TopicPartition]}, generation)."""
    joined = {m: shell.answer(a) for m, a in join_answers.items()}
    assert all(isinstance(r, JoinResponse) and r.error is E.NONE for r in joined.values()), joined
    generations = {r.generation_id for r in joined.values()}
    assert len(generations) == 1, generations
    generation = generations.pop()
    leader = next(m for m, r in joined.items() if r.members)
    plan = assign_group(assignor, topics, [(j.member_id, j.group_instance_id, j.metadata) for j in joined[leader].members])
    tokens = {m: shell.sync(m, generation, plan if m == leader else None) for m in joined}
    result = {}
    for m, t in tokens.items():
        response = shell.answer(t)
        assert isinstance(response, SyncResponse) and response.error is E.NONE, (m, response)
        result[m] = list(decode_assignment(response.assignment).partitions)
    return result, generation


def three_member_group(shell, **kw):
    ids, answers = [], {}
    for client in ("a", "b", "c"):
        member_id, answer = shell.new_member(client=client, **kw)
        ids.append(member_id)
        answers[member_id] = answer
    # With no initial delay the first member is alone in generation 1; the others' joins make
    # it rejoin (a heartbeat says REBALANCE_IN_PROGRESS), which completes generation 2.
    first = shell.answer(answers[ids[0]])
    if isinstance(first, JoinResponse) and first.generation_id == 1:
        assert shell.heartbeat(ids[0], 1) is E.REBALANCE_IN_PROGRESS
        answers[ids[0]] = shell.join(member_id=ids[0], **kw)
    return ids, answers


# ---- the transition table -------------------------------------------------------------------

def test_transition_table_is_kafkas():
    legal = {(prev, new) for new, prevs in VALID_PREVIOUS_STATES.items() for prev in prevs}
    assert legal == {(S.PREPARING_REBALANCE, S.EMPTY),
                     (S.STABLE, S.PREPARING_REBALANCE), (S.COMPLETING_REBALANCE, S.PREPARING_REBALANCE),
                     (S.EMPTY, S.PREPARING_REBALANCE), (S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE),
                     (S.COMPLETING_REBALANCE, S.STABLE)} | {(p, S.DEAD) for p in S}


@pytest.mark.parametrize("prev, new", list(itertools.product(S, S)))
def test_every_transition_legal_or_refused(prev, new):
    group = Group("g", prev, 0)
    if prev in VALID_PREVIOUS_STATES[new]:
        _transition(group, new, 5)
        assert (group.state, group.previous_state, group.state_timestamp_ms) == (new, prev, 5)
    else:
        with pytest.raises(InvariantError, match=f"illegal group transition {prev.value} -> {new.value}"):
            _transition(group, new, 5)
        assert group.state is prev


# ---- joining --------------------------------------------------------------------------------

def test_first_member_joins_syncs_and_is_stable():
    shell = Shell()
    member_id, answer = shell.new_member(client="app")
    assert member_id == "app-1"
    joined = shell.answer(answer)
    assert (joined.error, joined.generation_id, joined.leader, joined.member_id, joined.protocol_name) == \
        (E.NONE, 1, member_id, member_id, "range")
    assert [m.member_id for m in joined.members] == [member_id]
    assert shell.state() is S.COMPLETING_REBALANCE
    plan, generation = stabilize(shell, {member_id: answer})
    assert plan[member_id] == [TP("t", p) for p in range(10)] and generation == 1
    assert shell.state() is S.STABLE
    assert decode_record(*shell.log[-1])[1].members[0].member_id == member_id
    assert shell.core.open_tokens() == set()


def test_three_members_get_one_generation_with_no_partition_twice():
    shell = Shell()
    ids, answers = three_member_group(shell)
    plan, generation = stabilize(shell, answers)
    assert generation == 2
    owners = Counter(tp for tps in plan.values() for tp in tps)
    assert set(owners) == {TP("t", p) for p in range(10)} and set(owners.values()) == {1}
    assert sorted(len(tps) for tps in plan.values()) == [3, 3, 4]
    assert shell.state() is S.STABLE and shell.core.open_tokens() == set()


def test_initial_delay_gathers_members_into_one_generation():
    shell = Shell(initial_rebalance_delay_ms=3_000)
    a, ta = shell.new_member(client="a")
    assert isinstance(ta, int)                       # parked during the delay
    shell.now = 1_000
    b, tb = shell.new_member(client="b")
    shell.tick(2_999)
    assert shell.answer(ta) is None
    shell.tick(3_000)                                # b joined during the delay: wait one more delay
    assert shell.answer(ta) is None
    shell.tick(6_000)
    assert shell.answer(ta).generation_id == shell.answer(tb).generation_id == 1
    assert shell.answer(ta).leader == a and {m.member_id for m in shell.answer(ta).members} == {a, b}


def test_initial_delay_is_bounded_by_the_rebalance_timeout():
    shell = Shell(initial_rebalance_delay_ms=3_000)
    _, ta = shell.new_member(client="a", rebalance_ms=5_000)
    for t in (1_000, 2_000, 4_000):
        shell.now = t
        shell.new_member(client=f"x{t}", rebalance_ms=5_000)
        shell.tick(t)
    shell.tick(4_999)
    assert shell.answer(ta) is None
    shell.tick(5_000)                                 # 3000 + min(3000, 5000 - 3000): the rebalance timeout
    assert shell.answer(ta).generation_id == 1 and len(shell.answer(ta).members) == 4


def test_member_id_required_holds_the_join_phase_until_the_member_rejoins_or_expires():
    shell = Shell()
    a, ta = shell.new_member(client="a")
    stabilize(shell, {a: ta})
    first_b = shell.join(client="b")
    assert first_b.error is E.MEMBER_ID_REQUIRED
    ta2 = shell.join(member_id=a)                     # the leader rejoins: a rebalance starts
    assert shell.answer(ta2) is None                  # b's id is pending: wait for it
    shell.tick(SESSION_MS - 1)
    assert shell.answer(ta2) is None
    shell.tick(SESSION_MS)                            # b never came back: expired, the phase completes
    assert shell.answer(ta2).generation_id == 2 and [m.member_id for m in shell.answer(ta2).members] == [a]


def test_protocol_is_chosen_by_vote_among_common_protocols():
    shell = Shell(initial_rebalance_delay_ms=1_000)
    md = sub()
    answers = {}
    for client, protocols in (("a", [("range", md), ("roundrobin", md)]),
                              ("b", [("roundrobin", md), ("range", md), ("sticky", md)]),
                              ("c", [("roundrobin", md), ("range", md)])):
        member_id, t = shell.new_member(client=client, protocols=protocols)
        answers[member_id] = t
    shell.tick(1_000)
    shell.tick(2_000)                                 # others joined during the delay: one more
    assert {shell.answer(t).protocol_name for t in answers.values()} == {"roundrobin"}


def test_vote_ties_go_to_the_first_members_preference():
    shell = Shell(initial_rebalance_delay_ms=1_000)
    md = sub()
    _, ta = shell.new_member(client="a", protocols=[("sticky", md), ("range", md)])
    shell.new_member(client="b", protocols=[("range", md), ("sticky", md)])
    shell.tick(1_000)
    shell.tick(2_000)
    assert shell.answer(ta).protocol_name == "sticky"


# ---- error rules ----------------------------------------------------------------------------

@pytest.mark.parametrize("session_ms, ok", [(5_999, False), (6_000, True), (1_800_000, True), (1_800_001, False)])
def test_session_timeout_bounds(session_ms, ok):
    shell = Shell()
    first = shell.join(session_ms=session_ms)
    assert first.error is (E.MEMBER_ID_REQUIRED if ok else E.INVALID_SESSION_TIMEOUT)
    if not ok:
        assert "session.timeout.ms" in first.message and "g" not in shell.core.groups


def test_inconsistent_protocols_are_refused():
    shell = Shell()
    a, ta = shell.new_member(client="a")
    stabilize(shell, {a: ta})
    md = sub()
    assert shell.join(protocols=[("roundrobin", md)]).error is E.INCONSISTENT_GROUP_PROTOCOL
    assert shell.join(protocol_type="connect").error is E.INCONSISTENT_GROUP_PROTOCOL
    assert shell.join(member_id=a, protocols=[("sticky", md)]).error is E.INCONSISTENT_GROUP_PROTOCOL
    assert Shell().join(protocols=[]).error is E.INCONSISTENT_GROUP_PROTOCOL
    assert shell.state() is S.STABLE


def test_bad_join_input_is_refused_and_changes_nothing():
    shell = Shell()
    assert shell.join(group="").error is E.INVALID_GROUP_ID
    assert shell.join(rebalance_ms=0).error is E.INVALID_REQUEST
    assert shell.join(protocols=[("range", b""), ("range", b"")]).error is E.INVALID_REQUEST
    assert shell.join(member_id="ghost").error is E.UNKNOWN_MEMBER_ID     # no such group
    assert shell.core.groups == {}


def test_unknown_members_and_stale_generations():
    shell = Shell()
    a, ta = shell.new_member(client="a")
    _, generation = stabilize(shell, {a: ta})
    assert shell.join(member_id="ghost").error is E.UNKNOWN_MEMBER_ID
    assert shell.heartbeat("ghost", generation) is E.UNKNOWN_MEMBER_ID
    assert shell.answer(shell.sync("ghost", generation)).error is E.UNKNOWN_MEMBER_ID
    assert shell.leave("ghost") is E.UNKNOWN_MEMBER_ID
    assert shell.heartbeat(a, generation - 1) is E.ILLEGAL_GENERATION
    assert shell.answer(shell.sync(a, generation + 1)).error is E.ILLEGAL_GENERATION
    assert shell.heartbeat(a, generation, group="nope") is E.UNKNOWN_MEMBER_ID
    assert shell.answer(shell.sync(a, generation, group="nope")).error is E.UNKNOWN_MEMBER_ID
    assert shell.heartbeat(a, generation) is E.NONE


def test_rebalance_in_progress_answers():
    shell = Shell()
    a, ta = shell.new_member(client="a")
    _, generation = stabilize(shell, {a: ta})
    shell.new_member(client="b")                      # the group starts preparing a rebalance
    assert shell.state() is S.PREPARING_REBALANCE
    assert shell.heartbeat(a, generation) is E.REBALANCE_IN_PROGRESS
    assert shell.answer(shell.sync(a, generation)).error is E.REBALANCE_IN_PROGRESS


def test_group_max_size():
    shell = Shell(max_group_size=2)
    ids, answers = [], {}
    for client in ("a", "b"):
        m, t = shell.new_member(client=client)
        ids.append(m)
        answers[m] = t
    shell.heartbeat(ids[0], 1)
    answers[ids[0]] = shell.join(member_id=ids[0])
    stabilize(shell, answers)
    refused = shell.join(client="c")
    assert refused.error is E.GROUP_MAX_SIZE_REACHED and refused.member_id == ""
    assert len(shell.core.groups["g"].members) == 2


def test_dead_group_answers_coordinator_not_available():
    shell = Shell()
    a, ta = shell.new_member(client="a")
    _, generation = stabilize(shell, {a: ta})
    _transition(shell.core.groups["g"], S.DEAD, shell.now)   # the moment a deletion or unload is under way
    assert shell.join(member_id=a).error is E.COORDINATOR_NOT_AVAILABLE
    assert shell.join().error is E.COORDINATOR_NOT_AVAILABLE
    assert shell.answer(shell.sync(a, generation)).error is E.COORDINATOR_NOT_AVAILABLE
    assert shell.heartbeat(a, generation) is E.COORDINATOR_NOT_AVAILABLE
    assert shell.leave(a) is E.COORDINATOR_NOT_AVAILABLE
    assert shell.core.validate_offset_commit("g", generation, a, None).error is E.COORDINATOR_NOT_AVAILABLE


# ---- rebalance triggers ---------------------------------------------------------------------

def test_follower_rejoin_with_same_metadata_is_answered_at_once_and_leader_rejoin_rebalances():
    shell = Shell()
    ids, answers = three_member_group(shell)
    _, generation = stabilize(shell, answers)
    leader = next(m for m in ids if shell.core.groups["g"].leader_id == m)
    follower = next(m for m in ids if m != leader)
    same = shell.join(member_id=follower)
    assert isinstance(same, JoinResponse) and same.generation_id == generation and same.members == ()
    assert shell.state() is S.STABLE
    assert isinstance(shell.join(member_id=leader), int)       # parked: a rebalance started
    assert shell.state() is S.PREPARING_REBALANCE


def test_changed_subscription_triggers_a_rebalance():
    shell = Shell()
    a, ta = shell.new_member(client="a")
    _, generation = stabilize(shell, {a: ta})
    b, tb = shell.new_member(client="b")
    shell.heartbeat(a, generation)
    _, generation = stabilize(shell, {a: shell.join(member_id=a), b: tb})
    token = shell.join(member_id=b, protocols=[("range", sub("t", "u"))])
    assert isinstance(token, int) and shell.state() is S.PREPARING_REBALANCE
    assert shell.heartbeat(a, generation) is E.REBALANCE_IN_PROGRESS
    plan, new_generation = stabilize(shell, {a: shell.join(member_id=a), b: token}, topics={"t": 2, "u": 2})
    assert new_generation == generation + 1 and TP("u", 0) in plan[b]


def test_leave_rebalances_and_the_last_leave_empties_the_group():
    shell = Shell()
    a, ta = shell.new_member(client="a")
    b, tb = shell.new_member(client="b")
    shell.heartbeat(a, 1)
    _, generation = stabilize(shell, {a: shell.join(member_id=a), b: tb})
    assert shell.leave(b) is E.NONE
    assert shell.state() is S.PREPARING_REBALANCE
    assert shell.heartbeat(a, generation) is E.REBALANCE_IN_PROGRESS
    plan, generation = stabilize(shell, {a: shell.join(member_id=a)})
    assert len(plan[a]) == 10
    assert shell.leave(a) is E.NONE
    assert shell.state() is S.EMPTY and shell.core.groups["g"].generation_id == generation + 1
    empty = decode_record(*shell.log[-1])[1]
    assert empty.members == () and empty.protocol is None and empty.leader is None


def test_session_expiry_moves_the_dead_members_partitions_to_the_others():
    shell = Shell()
    ids, answers = three_member_group(shell)
    plan, generation = stabilize(shell, answers)
    a, b, dead = ids
    for t in range(2_000, SESSION_MS, 2_000):                  # a and b heartbeat, the third stops
        shell.now = t
        assert shell.heartbeat(a, generation) is E.NONE
        assert shell.heartbeat(b, generation) is E.NONE
        shell.tick(t)
    assert dead in shell.core.groups["g"].members
    shell.tick(SESSION_MS)                                      # its session timeout passes
    assert dead not in shell.core.groups["g"].members and shell.state() is S.PREPARING_REBALANCE
    assert shell.heartbeat(dead, generation) is E.UNKNOWN_MEMBER_ID
    assert shell.heartbeat(a, generation) is E.REBALANCE_IN_PROGRESS
    new_plan, new_generation = stabilize(shell, {a: shell.join(member_id=a), b: shell.join(member_id=b)})
    assert new_generation == generation + 1
    assert set(plan[dead]) <= set(new_plan[a]) | set(new_plan[b])
    assert set(new_plan[a]) | set(new_plan[b]) == {TP("t", p) for p in range(10)}


def test_members_that_miss_the_rebalance_timeout_are_removed_but_static_ones_stay():
    shell = Shell()
    session_ms = 45_000                                    # longer than the rebalance timeout
    a, _ = shell.new_member(client="a", session_ms=session_ms)
    shell.join(instance="s1", client="s", session_ms=session_ms)
    b, tb = shell.new_member(client="b", session_ms=session_ms)
    group = shell.core.groups["g"]
    s1 = group.static_members["s1"]
    shell.heartbeat(a, 1)
    shell.heartbeat(s1, 1, instance="s1")
    answers = {a: shell.join(member_id=a, session_ms=session_ms), b: tb,
               s1: shell.join(member_id=s1, instance="s1", session_ms=session_ms)}
    _, generation = stabilize(shell, answers)
    # The leader starts a rebalance; only it rejoins before the rebalance timeout.
    shell.now = 1_000
    leader = group.leader_id
    t_leader = shell.join(member_id=leader, session_ms=session_ms)
    shell.tick(1_000 + REBALANCE_MS)
    joined = shell.answer(t_leader)
    assert joined.generation_id == generation + 1
    expected = {leader, s1}                                # dynamic members dropped, static s1 kept
    assert {m.member_id for m in joined.members} == expected and set(group.members) == expected


def test_a_late_tick_fires_timers_in_deadline_order():
    shell = Shell()
    a, ta = shell.new_member(client="a")
    b, tb = shell.new_member(client="b")
    shell.heartbeat(a, 1)
    _, generation = stabilize(shell, {a: shell.join(member_id=a), b: tb})
    shell.now = 1_000
    t_a = shell.join(member_id=a)                          # a rebalance starts; b never rejoins
    # b's session (deadline 10 000) ends before the rebalance timeout (31 000): b is removed by
    # its session timeout, which completes the join phase at 10 000, long before 31 000.
    shell.tick(100_000)
    assert shell.answer(t_a).generation_id == generation + 1
    assert [m.member_id for m in shell.answer(t_a).members] == [a]
    # a never synced either, so its own session ended at 10 000 + 10 000 and the group emptied
    # then; had the rebalance timeout fired first, that would have been 41 000.
    assert shell.state() is S.EMPTY and shell.core.groups["g"].state_timestamp_ms == 20_000


def test_members_that_do_not_sync_in_time_are_removed():
    shell = Shell()
    a, ta = shell.new_member(client="a")
    b, tb = shell.new_member(client="b")
    shell.heartbeat(a, 1)
    ta = shell.join(member_id=a)
    joined = {m: shell.answer(t) for m, t in ((a, ta), (b, tb))}
    generation = joined[a].generation_id
    leader = next(m for m, r in joined.items() if r.members)
    follower = b if leader == a else a
    assert shell.answer(shell.sync(leader, generation, {leader: b"x"})).error is E.NONE
    for t in range(5_000, REBALANCE_MS, 5_000):             # both heartbeat, the follower never syncs
        shell.now = t
        assert shell.heartbeat(leader, generation) is E.NONE
        assert shell.heartbeat(follower, generation) is E.NONE
        shell.tick(t)
    assert follower in shell.core.groups["g"].members
    shell.tick(REBALANCE_MS)
    assert follower not in shell.core.groups["g"].members
    assert shell.state() is S.PREPARING_REBALANCE


def test_superseded_and_removed_requests_are_all_answered():
    shell = Shell(initial_rebalance_delay_ms=5_000)
    a, t1 = shell.new_member(client="a")
    t2 = shell.join(member_id=a)                           # a retry while the first is parked
    assert shell.answer(t1).error is E.REBALANCE_IN_PROGRESS
    assert shell.leave(a) is E.NONE
    assert shell.answer(t2).error is E.UNKNOWN_MEMBER_ID
    assert shell.core.open_tokens() == set()


# ---- static membership (KIP-345) ------------------------------------------------------------

INSTANCES = ("i1", "i2", "i3")


def static_group(shell, protocols=None, assignor=RangeAssignor()):
    """Three static members i1..i3 in one Stable generation. `protocols`: {instance: protocols}
    (default: range with a plain subscription). Returns (plan by member id, generation)."""
    protocols = protocols or {}
    answers = {}
    for inst in INSTANCES:
        answers[inst] = shell.join(instance=inst, client=inst, protocols=protocols.get(inst))
    group = shell.core.groups["g"]
    first = group.static_members["i1"]
    if shell.answer(answers["i1"]).generation_id == 1:
        shell.heartbeat(first, 1, instance="i1")
        answers["i1"] = shell.join(member_id=first, instance="i1", protocols=protocols.get("i1"))
    plan, generation = stabilize(shell, {group.static_members[i]: answers[i] for i in answers}, assignor=assignor)
    return plan, generation


def sticky_static_group(shell):
    """Three static members under the sticky assignor, in the state a running group is in: a
    second generation whose subscriptions carry what each member owned in the first (as every
    rejoin of the eos and Kafka clients does). Returns (plan by member id, generation)."""
    first_plan, first_generation = static_group(shell, {i: [("sticky", sub())] for i in INSTANCES}, StickyAssignor())
    group = shell.core.groups["g"]
    ids = {i: group.static_members[i] for i in INSTANCES}
    owned = {i: [("sticky", sub(owned=first_plan[ids[i]], generation=first_generation))] for i in INSTANCES}
    leader = next(i for i in INSTANCES if ids[i] == group.leader_id)
    answers = {ids[leader]: shell.join(member_id=ids[leader], instance=leader, protocols=owned[leader])}
    for i in INSTANCES:
        if i != leader:
            assert shell.heartbeat(ids[i], first_generation, instance=i) is E.REBALANCE_IN_PROGRESS
            answers[ids[i]] = shell.join(member_id=ids[i], instance=i, protocols=owned[i])
    plan, generation = stabilize(shell, answers, assignor=StickyAssignor())
    assert generation == first_generation + 1 and shell.state() is S.STABLE
    assert all(set(plan[ids[i]]) == set(first_plan[ids[i]]) for i in INSTANCES)     # sticky: nothing moved
    return plan, generation


def recorded_members(shell):
    """{instance id: MemberMetadata} of the group's last record in the log."""
    return {m.group_instance_id: m for m in decode_record(*shell.log[-1])[1].members}


def test_static_members_join_without_member_id_required():
    shell = Shell()
    answer = shell.join(instance="i1", client="x")
    assert isinstance(answer, JoinResponse) and answer.error is E.NONE and answer.member_id == "i1-1"


def test_static_member_restart_keeps_its_partitions_without_a_new_generation():
    shell = Shell()
    plan, generation = static_group(shell)
    group = shell.core.groups["g"]
    old_id = group.static_members["i2"]
    shell.now = 3_000                                      # restarted within the session timeout
    rejoined = shell.answer(shell.join(instance="i2", client="i2"))
    new_id = rejoined.member_id
    assert rejoined.error is E.NONE and new_id != old_id
    assert rejoined.generation_id == generation and shell.state() is S.STABLE
    synced = shell.answer(shell.sync(new_id, generation, instance="i2"))
    assert list(decode_assignment(synced.assignment).partitions) == plan[old_id]
    # The old incarnation is fenced.
    assert shell.heartbeat(old_id, generation, instance="i2") is E.FENCED_INSTANCE_ID
    assert shell.answer(shell.sync(old_id, generation, instance="i2")).error is E.FENCED_INSTANCE_ID
    assert shell.join(member_id=old_id, instance="i2").error is E.FENCED_INSTANCE_ID
    assert shell.core.validate_offset_commit("g", generation, old_id, "i2").error is E.FENCED_INSTANCE_ID
    assert shell.heartbeat(new_id, generation, instance="i2") is E.NONE
    assert recorded_members(shell)["i2"].member_id == new_id                   # recorded in the log


def test_static_sticky_member_restart_with_other_owned_partitions_keeps_the_generation():
    # The sticky subscription carries the owned partitions and their generation, so the bytes
    # a restarted member sends (it owns nothing yet) differ from the ones the group holds.
    # Kafka's coordinator looks only at whether the group's protocol choice would change.
    shell = Shell()
    plan, generation = sticky_static_group(shell)
    group = shell.core.groups["g"]
    ids = dict(group.static_members)
    old_id = ids["i2"]
    restarted_metadata = sub()
    assert group.members[old_id].metadata("sticky") != restarted_metadata
    shell.now = 3_000
    rejoined = shell.answer(shell.join(instance="i2", client="i2", protocols=[("sticky", restarted_metadata)]))
    new_id = rejoined.member_id
    assert rejoined.error is E.NONE and new_id != old_id
    assert (rejoined.generation_id, rejoined.protocol_name, shell.state()) == (generation, "sticky", S.STABLE)
    synced = shell.answer(shell.sync(new_id, generation, instance="i2"))
    assert synced.error is E.NONE and list(decode_assignment(synced.assignment).partitions) == plan[old_id]
    # Nobody else was disturbed: their heartbeats are fine in the same generation.
    for inst in ("i1", "i3"):
        assert shell.heartbeat(ids[inst], generation, instance=inst) is E.NONE
    # The old incarnation is fenced everywhere.
    assert shell.heartbeat(old_id, generation, instance="i2") is E.FENCED_INSTANCE_ID
    assert shell.answer(shell.sync(old_id, generation, instance="i2")).error is E.FENCED_INSTANCE_ID
    assert shell.join(member_id=old_id, instance="i2", protocols=[("sticky", sub())]).error is E.FENCED_INSTANCE_ID
    assert shell.core.validate_offset_commit("g", generation, old_id, "i2").error is E.FENCED_INSTANCE_ID
    # The log holds the new member id with its new metadata and the old assignment.
    recorded = recorded_members(shell)["i2"]
    assert (recorded.member_id, recorded.subscription) == (new_id, restarted_metadata)
    assert list(decode_assignment(recorded.assignment).partitions) == plan[old_id]


def test_static_member_restart_with_new_subscription_keeps_the_generation_as_kafka_does():
    # Kafka's rule (GroupCoordinator.updateStaticMemberAndRebalance): only a change of the
    # group's protocol choice rebalances. The member keeps its assignment; a client whose
    # assignment names topics it no longer subscribes to rejoins (then with its member id,
    # and changed metadata of a known member does rebalance).
    shell = Shell()
    plan, generation = static_group(shell)
    old_id = shell.core.groups["g"].static_members["i2"]
    rejoined = shell.answer(shell.join(instance="i2", client="i2", protocols=[("range", sub("t", "u"))]))
    assert rejoined.error is E.NONE and rejoined.generation_id == generation and shell.state() is S.STABLE
    synced = shell.answer(shell.sync(rejoined.member_id, generation, instance="i2"))
    assert list(decode_assignment(synced.assignment).partitions) == plan[old_id]


MIXED = {"range-first": [("range", sub()), ("roundrobin", sub())],
         "roundrobin-first": [("roundrobin", sub()), ("range", sub())]}


def test_static_member_restart_rebalances_only_when_the_protocol_choice_changes():
    shell = Shell()
    _, generation = static_group(shell, {i: MIXED["range-first"] for i in INSTANCES})
    assert shell.core.groups["g"].protocol_name == "range"
    # i2 now prefers roundrobin: the vote is still range 2, roundrobin 1, so nothing to do.
    kept = shell.answer(shell.join(instance="i2", client="i2", protocols=MIXED["roundrobin-first"]))
    assert kept.error is E.NONE and kept.generation_id == generation and shell.state() is S.STABLE
    # i3 too: roundrobin wins the next vote, so the group must rebalance to use it.
    token = shell.join(instance="i3", client="i3", protocols=MIXED["roundrobin-first"])
    assert isinstance(token, int) and shell.answer(token) is None and shell.state() is S.PREPARING_REBALANCE
    assert shell.heartbeat(shell.core.groups["g"].static_members["i1"], generation, instance="i1") \
        is E.REBALANCE_IN_PROGRESS


def test_known_static_member_rejoining_with_changed_metadata_rebalances():
    # Not a restart: the member rejoins with its member id. Kafka compares the metadata of a
    # known follower in a Stable group byte for byte, static or not.
    shell = Shell()
    plan, generation = sticky_static_group(shell)
    group = shell.core.groups["g"]
    follower = next(i for i in INSTANCES if group.static_members[i] != group.leader_id)
    member_id = group.static_members[follower]
    same = shell.join(member_id=member_id, instance=follower, protocols=[("sticky", group.members[member_id].metadata("sticky"))])
    assert isinstance(same, JoinResponse) and same.generation_id == generation and shell.state() is S.STABLE
    token = shell.join(member_id=member_id, instance=follower,
                       protocols=[("sticky", sub(owned=plan[member_id], generation=generation))])
    assert isinstance(token, int) and shell.state() is S.PREPARING_REBALANCE


def _start_rebalance(shell, generation):
    """From a Stable static group: the leader rejoins, so the group is PreparingRebalance."""
    group = shell.core.groups["g"]
    leader_inst = next(i for i in INSTANCES if group.static_members[i] == group.leader_id)
    token = shell.join(member_id=group.leader_id, instance=leader_inst)
    assert isinstance(token, int) and shell.state() is S.PREPARING_REBALANCE
    return leader_inst, token


def test_static_member_restart_while_preparing_rebalance_joins_the_next_generation():
    # Kafka: nothing more to do than for any member rejoining during the join phase; the old
    # member id's parked join is answered FENCED_INSTANCE_ID and never gets the generation.
    shell = Shell()
    _, generation = static_group(shell)
    group = shell.core.groups["g"]
    old_ids = dict(group.static_members)
    leader_inst, leader_token = _start_rebalance(shell, generation)
    restarting, other = [i for i in INSTANCES if i != leader_inst]
    old_token = shell.join(member_id=old_ids[restarting], instance=restarting)
    assert isinstance(old_token, int)
    new_token = shell.join(instance=restarting, client=restarting)
    assert isinstance(new_token, int) and shell.state() is S.PREPARING_REBALANCE
    assert shell.answer(old_token).error is E.FENCED_INSTANCE_ID
    new_id = group.static_members[restarting]
    answers = {old_ids[leader_inst]: leader_token, new_id: new_token,
               old_ids[other]: shell.join(member_id=old_ids[other], instance=other)}
    plan, new_generation = stabilize(shell, answers)
    assert new_generation == generation + 1 and set(plan) == {old_ids[leader_inst], new_id, old_ids[other]}
    assert shell.heartbeat(old_ids[restarting], new_generation, instance=restarting) is E.FENCED_INSTANCE_ID


def test_static_member_restart_while_completing_rebalance_starts_another_rebalance():
    # Kafka: the leader may already be assigning to the old member id, so the new one would
    # get nothing: the group goes back to PreparingRebalance, and the old id's parked
    # SyncGroup is answered FENCED_INSTANCE_ID.
    shell = Shell()
    _, generation = static_group(shell)
    group = shell.core.groups["g"]
    old_ids = dict(group.static_members)
    leader_inst, leader_token = _start_rebalance(shell, generation)
    others = [i for i in INSTANCES if i != leader_inst]
    for inst in others:
        shell.join(member_id=old_ids[inst], instance=inst)
    assert shell.state() is S.COMPLETING_REBALANCE and group.generation_id == generation + 1
    restarting = others[0]
    old_sync = shell.sync(old_ids[restarting], generation + 1, instance=restarting)
    assert isinstance(old_sync, int) and shell.answer(old_sync) is None           # waits for the leader
    new_token = shell.join(instance=restarting, client=restarting)
    assert isinstance(new_token, int) and shell.state() is S.PREPARING_REBALANCE
    assert shell.answer(old_sync).error is E.FENCED_INSTANCE_ID
    assert shell.answer(shell.sync(group.leader_id, generation + 1, {})).error is E.REBALANCE_IN_PROGRESS


def test_failed_static_rejoin_write_restores_the_old_member():
    shell = Shell()
    _, generation = static_group(shell)
    old_id = shell.core.groups["g"].static_members["i3"]
    shell.hold_writes = True
    token = shell.join(instance="i3", client="i3")
    assert isinstance(token, int)
    shell.release(error=E.NOT_LEADER_OR_FOLLOWER)
    assert shell.answer(token).error is E.NOT_COORDINATOR
    assert shell.core.groups["g"].static_members["i3"] == old_id
    assert shell.heartbeat(old_id, generation, instance="i3") is E.NONE


def test_leave_by_instance_id_removes_the_static_member():
    shell = Shell()
    static_group(shell)
    assert shell.leave("", instance="i1") is E.NONE
    assert "i1" not in shell.core.groups["g"].static_members and shell.state() is S.PREPARING_REBALANCE
    assert shell.leave("", instance="nobody") is E.UNKNOWN_MEMBER_ID


# ---- writes ---------------------------------------------------------------------------------

def test_sync_is_answered_only_once_the_assignment_is_written():
    shell = Shell()
    a, ta = shell.new_member(client="a")
    shell.hold_writes = True
    token = shell.sync(a, 1, {a: b"plan"})
    assert isinstance(token, int) and shell.answer(token) is None and shell.state() is S.COMPLETING_REBALANCE
    shell.release()
    assert shell.answer(token).assignment == b"plan" and shell.state() is S.STABLE


def test_failed_assignment_write_sends_members_back_to_rejoin():
    shell = Shell()
    a, ta = shell.new_member(client="a")
    shell.hold_writes = True
    token = shell.sync(a, 1, {a: b"plan"})
    shell.release(error=E.KAFKA_STORAGE_ERROR)
    assert shell.answer(token).error is E.NOT_COORDINATOR
    assert shell.state() in (S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE)
    with pytest.raises(InvariantError, match="not pending"):
        shell.core.write_completed(999, 0)


def test_delete_group():
    shell = Shell()
    a, ta = shell.new_member(client="a")
    stabilize(shell, {a: ta})
    assert shell.result(shell.core.delete_group("g", 0)).error is E.NON_EMPTY_GROUP
    shell.leave(a)
    assert shell.state() is S.EMPTY
    assert shell.result(shell.core.delete_group("g", 0)).error is E.NONE
    assert shell.log[-1][1] is None and "g" not in shell.core.groups
    assert shell.result(shell.core.delete_group("g", 0)).error is E.GROUP_ID_NOT_FOUND


def test_unload_answers_parked_requests_not_coordinator():
    from broker.group.records import partition_for_group
    shell = Shell(initial_rebalance_delay_ms=5_000)
    _, token = shell.new_member(client="a")
    shell.handle(shell.core.unload_partition(partition_for_group("g"), 0))
    assert shell.answer(token).error is E.NOT_COORDINATOR and "g" not in shell.core.groups
    assert shell.core.open_tokens() == set()


# ---- offsets (KIP-447) ----------------------------------------------------------------------

def test_validate_offset_commit_rules():
    shell = Shell()
    v = shell.core.validate_offset_commit
    assert v("nobody", -1, "", None).ok                              # a simple consumer's group
    assert v("nobody", 3, "m", None).error is E.UNKNOWN_MEMBER_ID
    ids, answers = three_member_group(shell)
    a = ids[0]
    assert v("g", 2, a, None).error is E.REBALANCE_IN_PROGRESS        # CompletingRebalance
    assert v("g", 2, a, None, transactional=True).ok                  # not for TxnOffsetCommit
    _, generation = stabilize(shell, answers)
    assert v("g", generation, a, None).ok
    assert v("g", generation - 1, a, None).error is E.ILLEGAL_GENERATION
    assert v("g", generation - 1, a, None, transactional=True).error is E.ILLEGAL_GENERATION
    assert v("g", generation, "zombie", None, transactional=True).error is E.UNKNOWN_MEMBER_ID
    assert v("g", -1, "", None).error is E.UNKNOWN_MEMBER_ID          # simple commit into a live group
    assert v("g", -1, "", None, transactional=True).ok                # old TxnOffsetCommit without metadata
    shell.new_member(client="d")                                      # PreparingRebalance: commits still allowed
    assert shell.state() is S.PREPARING_REBALANCE and v("g", generation, a, None).ok


# ---- describe, list, replay -----------------------------------------------------------------

def test_describe_and_list():
    shell = Shell()
    a, ta = shell.new_member(client="a")
    assert shell.core.describe("g").protocol == ""                    # not Stable: no protocol, no metadata
    stabilize(shell, {a: ta})
    d = shell.core.describe("g")
    assert (d.error, d.state, d.protocol_type, d.protocol, d.generation_id) == (E.NONE, "Stable", "consumer", "range", 1)
    assert d.members[0].member_id == a and decode_assignment(d.members[0].assignment).partitions
    assert shell.core.describe("nope").error is E.GROUP_ID_NOT_FOUND
    assert [g.group_id for g in shell.core.list()] == ["g"]
    assert shell.core.list(["stable"]) and not shell.core.list(["Empty", "PreparingRebalance"])
    with pytest.raises(ValueError, match="unknown group state"):
        shell.core.list(["Sleeping"])


def test_replay_restores_the_stable_group_from_its_last_record():
    shell = Shell()
    ids, answers = three_member_group(shell)
    plan, generation = stabilize(shell, answers)
    restarted = Shell(core=GroupCoordinatorCore(initial_rebalance_delay_ms=0))
    restarted.now = 50_000
    for key, value in shell.log:
        k, v = decode_record(key, value)
        restarted.core.replay(k.group_id, v, restarted.now)
    d = restarted.core.describe("g")
    assert (d.state, d.generation_id) == ("Stable", generation)
    for m in ids:
        assert restarted.heartbeat(m, generation) is E.NONE
        assert list(decode_assignment(restarted.answer(restarted.sync(m, generation)).assignment).partitions) == plan[m]
    restarted.tick(restarted.now + SESSION_MS)                          # nobody heartbeats after the load
    assert restarted.core.groups["g"].members == {} and restarted.state() is S.EMPTY
    restarted.core.replay("g", None, 0)
    assert "g" not in restarted.core.groups


def test_next_deadline_tells_the_shell_when_to_tick():
    shell = Shell(initial_rebalance_delay_ms=3_000)
    assert shell.core.next_deadline_ms() is None
    shell.new_member(client="a")
    assert shell.core.next_deadline_ms() == 3_000


def test_sticky_assignor_keeps_survivors_through_the_core():
    shell = Shell()
    md = sub()
    ids, answers = three_member_group(shell, protocols=[("sticky", md)])
    plan, generation = stabilize(shell, answers, assignor=StickyAssignor())
    a, b, c = ids
    assert shell.leave(c) is E.NONE
    owned = {m: [("sticky", sub(owned=plan[m], generation=generation))] for m in (a, b)}
    new_plan, _ = stabilize(shell, {m: shell.join(member_id=m, protocols=owned[m]) for m in (a, b)},
                            assignor=StickyAssignor())
    for m in (a, b):
        assert set(plan[m]) <= set(new_plan[m])


# ---- random clients against the core ---------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


class Client:
    def __init__(self, name, instance):
        self.name, self.instance = name, instance
        self.member_id, self.generation, self.join_token, self.sync_token, self.last_join = "", -1, None, None, None


def check_invariants(core):
    for group in core.groups.values():
        if group.members:
            assert group.leader_id in group.members
        for inst, member_id in group.static_members.items():
            assert group.members[member_id].group_instance_id == inst
        if group.state is S.STABLE:
            owners = Counter(tp for m in group.members.values() if m.assignment
                             for tp in decode_assignment(m.assignment).partitions)
            assert all(n == 1 for n in owners.values()), owners     # no partition twice in a generation
        if group.state is S.EMPTY:
            assert not group.members


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["join", "sync", "heartbeat", "leave", "time", "round", "round"]),
                                st.integers(0, 3), st.integers(0, 15_000)), max_size=60))
def test_random_clients_never_break_the_core(steps):
    shell = Shell()
    clients = [Client("a", None), Client("b", None), Client("c", "static-c"), Client("d", "static-d")]

    def settle(client):
        if client.join_token is not None and client.join_token in shell.answers:
            apply_join(client, shell.answers[client.join_token])
            client.join_token = None
        if client.sync_token is not None and client.sync_token in shell.answers:
            client.sync_token = None

    def apply_join(client, response):
        if response.error is E.MEMBER_ID_REQUIRED:
            client.member_id = response.member_id
        elif response.error is E.NONE:
            client.member_id, client.generation, client.last_join = response.member_id, response.generation_id, response
        elif response.error in (E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID):
            client.member_id, client.generation = "", -1

    def do(action, client, amount):
        settle(client)
        if action == "join" and client.join_token is None:
            answer = shell.join(member_id=client.member_id, instance=client.instance, client=client.name)
            if isinstance(answer, int):
                client.join_token = answer
            else:
                apply_join(client, answer)
        elif action == "sync" and client.member_id and client.sync_token is None and client.last_join:
            plan = None
            if client.last_join.members and not client.last_join.skip_assignment:
                plan = assign_group(RangeAssignor(), TOPICS, [(j.member_id, j.group_instance_id, j.metadata)
                                                              for j in client.last_join.members])
            answer = shell.sync(client.member_id, client.generation, plan, instance=client.instance)
            if isinstance(answer, int):
                client.sync_token = answer
        elif action == "heartbeat" and client.member_id:
            shell.heartbeat(client.member_id, client.generation, instance=client.instance)
        elif action == "leave" and client.member_id:
            shell.leave(client.member_id, instance=client.instance)
            client.member_id, client.generation = "", -1
        elif action == "time":
            shell.tick(shell.now + amount)
        settle(client)

    for action, index, amount in steps:
        if action == "round":          # the first `index + 1` clients all join, then all sync
            for phase in ("join", "sync"):
                for client in clients[:index + 1]:
                    do(phase, client, 0)
        else:
            do(action, clients[index], amount)
        check_invariants(shell.core)
    # Everyone goes away; every parked request gets its answer.
    shell.tick(shell.now + 10 * REBALANCE_MS + NEW_MEMBER_MS)
    shell.tick(shell.now + 10 * REBALANCE_MS + NEW_MEMBER_MS)
    check_invariants(shell.core)
    assert shell.core.open_tokens() == set()
    assert all(not g.members for g in shell.core.groups.values())


NEW_MEMBER_MS = 300_000


@pytest.mark.parametrize("config, problem", [
    ({"initial_rebalance_delay_ms": -1}, "group.initial.rebalance.delay.ms -1"),
    ({"min_session_timeout_ms": 10, "max_session_timeout_ms": 5}, "group.min.session.timeout.ms 10"),
    ({"max_group_size": 0}, "group.max.size 0"),
])
def test_bad_configuration_is_named(config, problem):
    with pytest.raises(ValueError, match=problem):
        GroupCoordinatorCore(**config)

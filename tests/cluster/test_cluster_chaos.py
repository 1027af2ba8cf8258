"""The transactional copier on a 3-broker cluster under a nemesis (Kafka's transactions
system test, with brokers failing): RF 3, min.insync.replicas 2, a real ZooKeeper.

100,000 input records are copied by two copiers (tests/chaos/copier.py) that the
supervisor kills with SIGKILL at seeded points, while a nemesis thread injects broker
faults at seeded times: it kills (`kill -9`, then restarts) or pauses (SIGSTOP, then
SIGCONT; sometimes past the ZooKeeper session, so leadership moves) the broker that holds a
role at that moment -- a copier's transaction coordinator, the copiers' group coordinator,
the controller, an output partition's leader -- and restarts ZooKeeper once. After each
fault it waits until every broker is back and every partition of the copy's topics and of
the internal topics has its full ISR, so at most one broker is ever out.

The check is the single-broker chaos test's (tests/chaos/test_copier.py): the output read
read_committed is exactly the transformed input, in per-partition order, with no duplicate
and no aborted record; a read_committed reader running along never saw a record that a
fresh read does not show; the group's committed offsets equal the input's ends. On top:
the nemesis carried out every fault of its mandatory plan.
"""
from __future__ import annotations

import random
import threading
import time

import pytest

import eos
from broker.group.records import OFFSETS_TOPIC
from eos.errors import EosError
from eos.net import ClusterMetadata
from eos.v1 import group_pb2
from tests.chaos.test_copier import GROUP, INPUT, OUTPUT, SEED, run_chaos_copy
from tests.cluster.test_cluster_failover import CLUSTER_CONFIG

TXN_STATE_TOPIC = "__transaction_state"
CHAOS_CONFIG = {**CLUSTER_CONFIG, "min.insync.replicas": "2", "default.replication.factor": "3",
                "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}
SESSION_TIMEOUT_S = int(CLUSTER_CONFIG["zookeeper.session.timeout.ms"]) / 1000
HEAL_TIMEOUT_S = 120.0
# Every fault of this plan happens (asserted); more random ones follow until the copy ends.
MANDATORY_FAULTS = [("kill", "txn-coordinator"), ("pause-long", "group-coordinator"), ("kill", "controller"),
                    ("kill", "output-leader"), ("restart", "zookeeper"), ("pause-short", "output-leader"),
                    ("kill", "group-coordinator"), ("pause-long", "txn-coordinator")]
ROLES = ["txn-coordinator", "group-coordinator", "controller", "output-leader"]
ACTIONS = ["kill", "pause-short", "pause-long"]


class ClusterUnderTest:
    """The cluster as run_chaos_copy sees a broker: a bootstrap address and its logs."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.address = cluster.bootstrap

    def log_tail(self, lines: int = 25) -> str:
        parts = []
        for broker_id, proc in self.cluster.processes.items():
            try:
                text = proc.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
            except OSError:
                text = ["(no log)"]
            parts.append(f"--- broker {broker_id} log (tail) ---\n" + "\n".join(text))
        return "\n".join(parts)


class Nemesis(threading.Thread):
    """Faults at seeded random times until `stop()`; see the module doc."""

    def __init__(self, cluster, zookeeper, rng: random.Random, note):
        super().__init__(name="nemesis", daemon=True)
        self.cluster = cluster
        self.zookeeper = zookeeper
        self.rng = rng
        self.note = lambda text: (note(text), print(text, flush=True))
        self.done: list[tuple[str, str, int | None]] = []
        self.failure: str | None = None
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()
        self.join(HEAL_TIMEOUT_S + 30)

    def run(self) -> None:
        plan = list(MANDATORY_FAULTS)
        try:
            while not self._stopping.is_set():
                # the mandatory faults come quickly, so that they all land within the copy;
                # then the copy gets room to move between faults
                if self._stopping.wait(self.rng.uniform(0.2, 1.0) if plan else self.rng.uniform(2.0, 6.0)):
                    return
                action, role = plan.pop(0) if plan else (self.rng.choice(ACTIONS), self.rng.choice(ROLES))
                self._inject(action, role)
                self._heal()
        except Exception as exc:     # reported by the test, with the supervisor's diagnostics
            self.failure = f"nemesis: {type(exc).__name__}: {exc}"
            self.note(self.failure)

    def mandatory_done(self) -> bool:
        return [(action, role) for action, role, _ in self.done[:len(MANDATORY_FAULTS)]] == MANDATORY_FAULTS

    # ---- faults -------------------------------------------------------------------------------

    def _inject(self, action: str, role: str) -> None:
        if role == "zookeeper":
            self.zookeeper.stop()
            self._stopping.wait(self.rng.uniform(0.5, 2.0))
            self.zookeeper.start()
            self.zookeeper.wait_ready()
            self.done.append((action, role, None))
            self.note("nemesis: ZooKeeper restarted")
            return
        victim = self._holder_of(role)
        if action == "kill":
            self.cluster.kill(victim)
            self.note(f"nemesis: broker {victim} ({role}) killed with SIGKILL")
            self._stopping.wait(self.rng.uniform(0.0, 1.0))
            self.cluster.restart(victim)
            self.note(f"nemesis: broker {victim} restarted")
        else:
            pause_s = (SESSION_TIMEOUT_S + self.rng.uniform(1.0, 2.0) if action == "pause-long"
                       else self.rng.uniform(0.3, SESSION_TIMEOUT_S / 2))
            self.cluster.pause(victim)
            self.note(f"nemesis: broker {victim} ({role}) paused for {pause_s:.1f} s")
            time.sleep(pause_s)        # not cut short by stop(): a broker must not stay stopped
            self.cluster.resume(victim)
            self.note(f"nemesis: broker {victim} resumed")
        self.done.append((action, role, victim))

    def _holder_of(self, role: str) -> int:
        """The broker holding `role` now (a random broker if the cluster cannot say)."""
        try:
            with eos.Admin(bootstrap=self.cluster.bootstrap, default_api_timeout_ms=10_000) as admin:
                if role == "controller":
                    holder = admin.describe_cluster()["controller_id"]
                elif role == "output-leader":
                    holder = self.rng.choice(admin.describe_topic(OUTPUT)["partitions"])["leader"]
                else:
                    holder = self._coordinator(role)
        except EosError:
            holder = -1
        return holder if holder in self.cluster.processes else self.rng.choice(sorted(self.cluster.processes))

    def _coordinator(self, role: str) -> int:
        metadata = ClusterMetadata(self.cluster.bootstrap)
        try:
            if role == "group-coordinator":
                address = metadata.coordinator_address(GROUP, 10.0, key_type=group_pb2.GROUP)
            else:
                address = metadata.coordinator_address(f"copier-{self.rng.randrange(2)}", 10.0)
        finally:
            metadata.close()
        return next((b for b, p in self.cluster.processes.items() if p.address == address), -1)

    def _heal(self) -> None:
        """Until every broker is live and every partition that matters has its full ISR."""
        deadline = time.monotonic() + HEAL_TIMEOUT_S
        self.cluster.wait_ready(timeout_s=HEAL_TIMEOUT_S, brokers=set(self.cluster.processes))
        with eos.Admin(bootstrap=self.cluster.bootstrap, default_api_timeout_ms=10_000) as admin:
            while True:
                lagging = self._lagging(admin)
                if not lagging:
                    return
                if time.monotonic() > deadline:
                    stuck = lagging[0].split()[0]
                    raise TimeoutError(f"the cluster did not heal within {HEAL_TIMEOUT_S} s: {lagging[:5]}\n"
                                       f"what the brokers logged about {stuck} and the controller's warnings:\n"
                                       + self._log_lines_about(stuck))
                time.sleep(0.2)

    def _log_lines_about(self, partition: str, lines_per_broker: int = 8) -> str:
        """The last lines of each broker's log naming `partition` or warning from the controller."""
        parts = []
        for broker_id, proc in sorted(self.cluster.processes.items()):
            try:
                text = proc.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                text = []
            about = [line for line in text if f"{partition}:" in line or f"{partition} " in line
                     or ("eos.controller" in line and "WARNING" in line)]
            parts.append(f"--- broker {broker_id} ---\n" + "\n".join(about[-lines_per_broker:]))
        return "\n".join(parts)

    def _lagging(self, admin) -> list[str]:
        lagging = []
        for topic in (INPUT, OUTPUT, TXN_STATE_TOPIC, OFFSETS_TOPIC):
            try:
                partitions = admin.describe_topic(topic)["partitions"]
            except EosError as exc:
                return [f"{topic}: {exc}"]
            lagging += [f"{topic}-{p['partition']} leader {p['leader']} isr {p['isr']}" for p in partitions
                        if p["leader"] < 0 or len(p["isr"]) < len(p["replicas"])]
        return lagging


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory(CHAOS_CONFIG)


@pytest.mark.timeout(1200)
def test_copiers_and_brokers_killed_at_random_copy_exactly_once(cluster, zookeeper, tmp_path):
    """100,000 records, copiers killed 2 to 4 times each, brokers and ZooKeeper failing."""
    rng = random.Random(SEED + 10)
    nemesis_holder: list[Nemesis] = []

    def nemesis_tick(supervisor) -> None:
        if not nemesis_holder and max(c.best_position for c in supervisor.copiers) > 0:
            # faults start once both internal topics exist and the copy is under way
            nemesis_holder.append(Nemesis(cluster, zookeeper, rng, supervisor.note))
            nemesis_holder[0].start()

    try:
        supervisor = run_chaos_copy(
            ClusterUnderTest(cluster), tmp_path, records_per_partition=50_000, kills_per_copier=(2, 4),
            copier_args={0: ["--txn-records", "1000", "--max-poll-records", "500", "--max-records-per-s", "800"],
                         1: ["--txn-records", "300", "--max-poll-records", "200", "--max-records-per-s", "800"]},
            timeout_s=600, seed=SEED + 10, on_tick=nemesis_tick, expect_clean_exits=False, replication_factor=3)
    finally:
        for nemesis in nemesis_holder:
            nemesis.stop()
    assert nemesis_holder, "the nemesis never started"
    nemesis = nemesis_holder[0]
    assert nemesis.failure is None, nemesis.failure + "\n" + "\n".join(supervisor.events)
    assert nemesis.mandatory_done(), (f"the copy ended before the nemesis's plan did: {nemesis.done}\n"
                                      + "\n".join(supervisor.events))
    print("\n".join(supervisor.events))

"""What each console page shows, built from eos.Admin answers: plain dicts, no HTML.

Theory of operation
-------------------
One function per page (`brokers`, `topics`, `topic`, `groups`, `group`, `transactions`); each
takes the Admin the console connects with and returns a dict of plain values (str, int,
None, lists, dicts), which `eos.console.app` renders both as a Jinja page and as the JSON
beside it, so the two can never disagree. The functions keep no state and make the fewest
Admin calls the page needs, batched so that a page costs the same few RPCs at 10 topics or
10,000: one Metadata for every topic, one DescribeLogDirs per broker, one ListOffsets per
partition leader.

Sizes come from DescribeLogDirs: a partition's size is its leader's replica (the data a
reader sees), a topic's "on disk" adds every replica. A broker whose log dirs cannot be
described (down, or the console's principal lacks DESCRIBE on the cluster) leaves those
sizes unknown (None) and the page says why, rather than failing the whole page.

Errors the Admin raises for the thing a page names (an unknown topic or group) propagate as
EosError; the app turns them into 404s.
"""
from __future__ import annotations

from eos.acl import Operation
from eos.errors import EosError, ErrorCode
from eos.types import TopicPartition

# What the broker checks for AbortTransaction (txn_coordinator/service.py: KIP-1037's ALTER,
# or CLUSTER_ACTION): the console shows Abort buttons iff its principal holds one of them.
ABORT_OPERATIONS = frozenset({Operation.ALTER, Operation.CLUSTER_ACTION})


def _error_text(error: EosError) -> str:
    return f"{error.code.name}: {error}"


def may_abort(admin) -> bool:
    """Whether the console's principal may abort transactions (asked afresh: ACLs change)."""
    operations = admin.describe_cluster(include_authorized_operations=True)["authorized_operations"]
    return bool(operations and operations & ABORT_OPERATIONS)


def log_dirs_by_broker(admin, broker_ids) -> tuple[dict[int, dict], dict[int, str]]:
    """({broker id: its log dirs as Admin.describe_log_dirs gives them}, {broker id: why its
    log dirs are unknown}): one DescribeLogDirs per broker, a failure kept to its broker."""
    found, errors = {}, {}
    for broker_id in broker_ids:
        try:
            found.update(admin.describe_log_dirs([broker_id]))
        except EosError as exc:
            errors[broker_id] = _error_text(exc)
    return found, errors


def _replica_sizes(log_dirs: dict[int, dict]) -> dict[tuple[int, TopicPartition], int]:
    """(broker id, partition) -> its replica's size in bytes, over the online log dirs."""
    return {(broker_id, tp): replica["size_bytes"]
            for broker_id, dirs in log_dirs.items() for described in dirs.values()
            for tp, replica in described["replicas"].items()}


# ---- brokers ----------------------------------------------------------------------------------

def brokers(admin) -> dict:
    cluster = admin.describe_cluster(include_authorized_operations=True)
    log_dirs, log_dir_errors = log_dirs_by_broker(admin, sorted(cluster["brokers"]))
    rows = []
    for node_id, address in sorted(cluster["brokers"].items()):
        dirs = []
        for path, described in sorted(log_dirs.get(node_id, {}).items()):
            error = described["error"]
            dirs.append({"path": path, "online": error is None,
                         "error": None if error is None else error.code.name,
                         "error_message": None if error is None else str(error),
                         "total_bytes": described["total_bytes"], "usable_bytes": described["usable_bytes"],
                         "replica_count": len(described["replicas"]),
                         "storage_errors": described["storage_errors"],
                         "last_storage_error": described["last_storage_error"],
                         "size_bytes": sum(r["size_bytes"] for r in described["replicas"].values())})
        rows.append({"node_id": node_id, "address": address, "rack": cluster["racks"].get(node_id),
                     "is_controller": node_id == cluster["controller_id"], "log_dirs": dirs,
                     "offline_log_dirs": sum(1 for d in dirs if not d["online"]),
                     "storage_errors": sum(d["storage_errors"] for d in dirs),
                     "log_dirs_error": log_dir_errors.get(node_id)})
    operations = cluster["authorized_operations"]
    return {"cluster_id": cluster["cluster_id"], "controller_id": cluster["controller_id"], "brokers": rows,
            "offline_log_dirs": sum(b["offline_log_dirs"] for b in rows),
            "storage_errors": sum(b["storage_errors"] for b in rows),
            "authorized_operations": sorted(op.name for op in operations or ())}


# ---- topics -----------------------------------------------------------------------------------

def topics(admin) -> dict:
    described = admin.describe_topics(include_internal=True)
    broker_ids = sorted({b for t in described.values() for p in t["partitions"] for b in p["replicas"]})
    log_dirs, log_dir_errors = log_dirs_by_broker(admin, broker_ids)
    sizes = _replica_sizes(log_dirs)
    rows = []
    for name, topic in described.items():
        partitions = topic["partitions"]
        leader_sizes = [sizes.get((p["leader"], TopicPartition(name, p["partition"]))) for p in partitions]
        replica_sizes = [sizes.get((b, TopicPartition(name, p["partition"]))) for p in partitions
                         for b in p["replicas"]]
        rows.append({
            "name": name, "internal": topic["internal"], "partitions": len(partitions),
            "replication_factor": max((len(p["replicas"]) for p in partitions), default=0),
            "size_bytes": None if None in leader_sizes else sum(leader_sizes),
            "on_disk_bytes": None if None in replica_sizes else sum(replica_sizes),
            "offline_partitions": sum(1 for p in partitions if p["leader"] < 0),
            "under_replicated_partitions": sum(1 for p in partitions if len(p["isr"]) < len(p["replicas"]))})
    return {"topics": rows, "log_dir_errors": {str(b): e for b, e in sorted(log_dir_errors.items())}}


def topic(admin, name: str) -> dict:
    described = admin.describe_topics([name])[name]
    tps = [TopicPartition(name, p["partition"]) for p in described["partitions"]]
    high_watermarks = admin.end_offsets(tps)
    stable_offsets = admin.end_offsets(tps, isolation_level="read_committed")
    log_dirs, log_dir_errors = log_dirs_by_broker(
        admin, sorted({p["leader"] for p in described["partitions"] if p["leader"] >= 0}))
    sizes = _replica_sizes(log_dirs)
    partitions = [{**p, "high_watermark": high_watermarks.get(tp), "last_stable_offset": stable_offsets.get(tp),
                   "size_bytes": sizes.get((p["leader"], tp))}
                  for p, tp in zip(described["partitions"], tps)]
    return {"name": name, "internal": described["internal"], "configs": described["configs"],
            "partitions": partitions, "size_bytes": sum(p["size_bytes"] or 0 for p in partitions),
            "log_dir_errors": {str(b): e for b, e in sorted(log_dir_errors.items())}}


# ---- consumer groups --------------------------------------------------------------------------

def groups(admin) -> dict:
    return {"groups": admin.list_groups()}


def group(admin, group_id: str) -> dict:
    """The group's members and its lag per partition against the LSO (read_committed, as an
    exactly-once reader sees it). A group with committed offsets but no members is shown;
    one with neither raises GROUP_ID_NOT_FOUND."""
    offsets = admin.group_lag(group_id, isolation_level="read_committed")
    try:
        description = admin.describe_group(group_id)
    except EosError as exc:
        if exc.code != ErrorCode.GROUP_ID_NOT_FOUND:
            raise
        description = {"group_id": group_id, "state": "Dead", "protocol_type": "", "protocol": "",
                       "generation": -1, "members": []}
    members = [{**m, "assignment": [f"{tp.topic}-{tp.partition}" for tp in m["assignment"]]}
               for m in description["members"]]
    return {**description, "members": members, "offsets": offsets,
            "total_lag": sum(row["lag"] for row in offsets if row["lag"] is not None)}


# ---- transactions -----------------------------------------------------------------------------

def transactions(admin, *, hanging_after_ms: int) -> dict:
    """Every transactional id by state, the hanging transactions (find-hanging, open longer
    than `hanging_after_ms` with no coordinator accounting for them) and whether the
    console may abort them."""
    listed = admin.list_transactions()
    try:
        hanging, hanging_error = admin.find_hanging_transactions(max_duration_ms=hanging_after_ms), None
    except EosError as exc:
        # e.g. a principal that may DESCRIBE a topic but not READ it (DescribeProducers needs
        # READ): the transactions are still shown, the hanging ones are unknown, and why
        hanging, hanging_error = [], _error_text(exc)
    hanging_producers = {h["producer_id"] for h in hanging}
    by_state: dict[str, int] = {}
    for t in listed:
        by_state[t["state"]] = by_state.get(t["state"], 0) + 1
    return {"by_state": dict(sorted(by_state.items())),
            "transactions": [{**t, "hanging": t["producer_id"] in hanging_producers} for t in listed],
            "hanging": hanging, "hanging_error": hanging_error, "hanging_after_ms": hanging_after_ms,
            "may_abort": may_abort(admin)}

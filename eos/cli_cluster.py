"""The cluster commands of the `eos` command line, after Kafka's tools.

    eos zookeeper start --port 2181 --data-dir DIR   Apache ZooKeeper (jars fetched and cached)
    eos cluster start --brokers 3 --data-dir ./eos-cluster [--base-port 9092] [--zookeeper-port 2181] [--tls]
    eos cluster stop --data-dir ./eos-cluster [--timeout 120]   (kafka-server-stop.sh for that cluster)
    eos leader-election --election-type preferred|unclean (--topic T [--partition P] | --all-topic-partitions)
    eos partitions reassign --plan plan.json (--execute [--throttle B] | --verify | --cancel)

`topics describe` (in eos/cli.py) prints Leader, Replicas, Isr and Offline per partition
and takes --under-replicated-partitions / --unavailable-partitions, like kafka-topics.
The reassignment plan is kafka-reassign-partitions' JSON:
{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2]}]}.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

from eos.processes import start_ticks

# Written by a running `cluster start` in its data dir, removed as it ends: which process
# `cluster stop` signals ({"pid", "start_ticks"}: a pid reused since names another process).
CLUSTER_PID_FILE = "cluster.pid"
STOP_TIMEOUT_S_DEFAULT = 120.0
STOP_POLL_S = 0.2


# ---- cluster start -------------------------------------------------------------------------

def cmd_cluster_start(args) -> int:
    from eos.local_cluster import LocalCluster
    from eos.progress import ProgressBar

    config = dict(args.config_pairs)
    tls_options = {}
    if args.tls:
        tls = _local_tls(args.data_dir)
        config = {**tls.broker_config, **config}
        tls_options = {"listener_protocol": "SSL", "client_config": tls.client_config}
    cluster = LocalCluster(args.data_dir, brokers=args.brokers, base_port=args.base_port,
                           zookeeper_port=args.zookeeper_port, broker_config=config,
                           metrics_base_port=args.metrics_base_port, **tls_options)
    stop_requested = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop_requested.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    pid_file = Path(args.data_dir) / CLUSTER_PID_FILE
    try:
        bar = ProgressBar(args.brokers, "starting brokers", unit="brokers", stream=sys.stderr)
        cluster.start(progress=lambda _broker_id: bar.advance(1))
        bar.close()
        _write_pid_file(pid_file)
        print(f"ZooKeeper: {cluster.zookeeper_connect}", flush=True)
        for broker_id, proc in sorted(cluster.processes.items()):
            print(f"broker {broker_id}: {proc.address} (data dir {proc.data_dir}, log {proc.log_path})", flush=True)
            if proc.metrics_url is not None:
                print(f"broker {broker_id} metrics: {proc.metrics_url}", flush=True)
        print(f"bootstrap: {cluster.bootstrap}", flush=True)
        if args.tls:
            print(f"TLS: every listener is SSL with mutual TLS; clients use --command-config {tls.client_file} "
                  f"(User:CN=admin, a super user)", flush=True)
        while not stop_requested.wait(0.5):
            for broker_id, proc in cluster.processes.items():
                if not proc.running and proc.process is not None and proc.process.returncode not in (None, 0):
                    print(f"broker {broker_id} exited with {proc.process.returncode}; see {proc.log_path}",
                          file=sys.stderr, flush=True)
                    proc.process = None
        print("stopping the cluster", file=sys.stderr, flush=True)
    finally:
        cluster.stop()
        if _running_cluster(pid_file) == os.getpid():
            pid_file.unlink()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0


def _write_pid_file(path: Path) -> None:
    """This process as the cluster of `path`'s data dir. (A second `cluster start` on the same
    data dir never gets here: its brokers find their data dirs locked.)"""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"pid": os.getpid(), "start_ticks": start_ticks(os.getpid())}))
    os.replace(temporary, path)


def _running_cluster(path: Path) -> int | None:
    """The pid of the live `cluster start` that wrote `path`, or None (no file, an unreadable
    one, or its process has exited)."""
    try:
        recorded = json.loads(path.read_text())
        pid, ticks = int(recorded["pid"]), recorded["start_ticks"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if ticks is not None and start_ticks(pid) == ticks else None


def cmd_cluster_stop(args) -> int:
    """SIGTERM to the `cluster start` running from --data-dir (it stops its brokers, each
    with a controlled shutdown, then ZooKeeper), and wait until it has exited. Exit 1 when
    none runs there, as kafka-server-stop.sh does, or when it outlives --timeout."""
    pid_file = Path(args.data_dir) / CLUSTER_PID_FILE
    pid = _running_cluster(pid_file)
    if pid is None:
        print(f"no cluster to stop: none runs from {args.data_dir} (no live process in {pid_file})",
              file=sys.stderr)
        return 1
    ticks = start_ticks(pid)
    with contextlib.suppress(ProcessLookupError):     # it ended between the look and the signal
        os.kill(pid, signal.SIGTERM)
    print(f"stopping the cluster of {args.data_dir} (pid {pid})", file=sys.stderr, flush=True)
    deadline = time.monotonic() + args.timeout
    while start_ticks(pid) == ticks:
        if time.monotonic() > deadline:
            print(f"the cluster (pid {pid}) was still stopping after {args.timeout:g} s", file=sys.stderr)
            return 1
        time.sleep(STOP_POLL_S)
    print("stopped", file=sys.stderr)
    return 0


class _LocalClusterTls(NamedTuple):
    broker_config: dict[str, str]     # every broker's TLS settings and super users
    client_config: dict[str, str]     # the admin's client settings
    client_file: str                  # the same as a properties file for --command-config


def _local_tls(data_dir: str) -> _LocalClusterTls:
    """A throwaway CA and certificates in <data-dir>/tls (kept across restarts, see
    eos.tls_certs.make_local_tls) for an SSL-only cluster, and a client properties file for
    the admin certificate."""
    from pathlib import Path

    from eos.tls_certs import BROKER_COMMON_NAME, make_local_tls

    directory = Path(data_dir) / "tls"
    tls = make_local_tls(directory, clients={"admin": "admin"})
    client = tls.client_config("admin")
    client_file = directory / "admin.properties"
    client_file.write_text("".join(f"{name}={value}\n" for name, value in client.items()), encoding="utf-8")
    super_users = f"User:CN={BROKER_COMMON_NAME};User:CN=admin"
    return _LocalClusterTls({**tls.broker_config(), "super.users": super_users}, client, str(client_file))


# ---- leader election ----------------------------------------------------------------------------

def cmd_leader_election(args) -> int:
    import eos
    from eos.cli import client_config
    from eos.errors import ErrorCode

    if args.all_topic_partitions == bool(args.topic):
        raise SystemExit("error: give --topic (with an optional --partition) or --all-topic-partitions")
    with eos.Admin(bootstrap=args.bootstrap_server, config=client_config(args)) as admin:
        partitions = None
        if args.topic:
            if args.partition is not None:
                partitions = [(args.topic, args.partition)]
            else:
                partitions = [(args.topic, p["partition"]) for p in admin.describe_topic(args.topic)["partitions"]]
        results = admin.elect_leaders(args.election_type, partitions)
    elected = sorted(f"{tp.topic}-{tp.partition}" for tp, error in results.items() if error is None)
    not_needed = sorted(f"{tp.topic}-{tp.partition}" for tp, error in results.items()
                        if error is not None and error.code == ErrorCode.ELECTION_NOT_NEEDED)
    failed = {tp: error for tp, error in results.items()
              if error is not None and error.code != ErrorCode.ELECTION_NOT_NEEDED}
    kind = args.election_type.upper()
    if elected:
        print(f"Successfully completed leader election ({kind}) for partitions {', '.join(elected)}")
    if not_needed:
        print(f"Valid replica already elected for partitions {', '.join(not_needed)}")
    for tp, error in sorted(failed.items()):
        print(f"Error completing leader election ({kind}) for partition {tp.topic}-{tp.partition}: {error}",
              file=sys.stderr)
    return 1 if failed else 0


# ---- partition reassignment -------------------------------------------------------------------------

def _read_plan(path: str) -> dict[tuple[str, int], list[int]]:
    from eos.cli_records import read_partition_file

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        return read_partition_file(text, path, "a list of replicas",
                                   lambda entry: [_replica_id(r) for r in entry["replicas"]])
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: cannot read the plan {path}: {exc}")


def _replica_id(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(value)
    return value


def cmd_partitions(args) -> int:
    import eos
    from eos.cli import client_config

    plan = _read_plan(args.plan)
    modes = [m for m in ("execute", "verify", "cancel") if getattr(args, m)]
    if len(modes) != 1:
        raise SystemExit("error: give exactly one of --execute, --verify, --cancel")
    with eos.Admin(bootstrap=args.bootstrap_server, config=client_config(args)) as admin:
        if args.execute:
            results = admin.alter_partition_reassignments(plan, throttle_bytes_per_s=args.throttle)
            failed = {tp: e for tp, e in results.items() if e is not None}
            for tp, error in sorted(failed.items()):
                print(f"Error reassigning {tp.topic}-{tp.partition}: {error}", file=sys.stderr)
            started = sorted(f"{tp.topic}-{tp.partition}" for tp, e in results.items() if e is None)
            if started:
                print(f"Successfully started partition reassignments for {', '.join(started)}")
            return 1 if failed else 0
        if args.cancel:
            results = admin.alter_partition_reassignments({tp: None for tp in plan})
            failed = {tp: e for tp, e in results.items() if e is not None}
            for tp, error in sorted(failed.items()):
                print(f"Error cancelling the reassignment of {tp.topic}-{tp.partition}: {error}", file=sys.stderr)
            cancelled = sorted(f"{tp.topic}-{tp.partition}" for tp, e in results.items() if e is None)
            if cancelled:
                print(f"Successfully cancelled partition reassignments for {', '.join(cancelled)}")
            return 1 if failed else 0
        ongoing = admin.list_partition_reassignments()
        incomplete = 0
        for (topic, partition), target in sorted(plan.items()):
            if (topic, partition) in ongoing:
                print(f"Reassignment of partition {topic}-{partition} is still in progress.")
                incomplete += 1
                continue
            current = next(p for p in admin.describe_topic(topic)["partitions"] if p["partition"] == partition)
            if current["replicas"] == target:
                print(f"Reassignment of partition {topic}-{partition} is completed.")
            else:
                print(f"There is no active reassignment of partition {topic}-{partition}, but replicas are "
                      f"{current['replicas']} rather than {target}.")
                incomplete += 1
        return 1 if incomplete else 0


def cmd_zookeeper_start(args) -> int:
    from eos.zookeeper import run_zookeeper
    return run_zookeeper(args.data_dir, port=args.port)


def add_commands(commands, client_command, parse_pairs) -> None:
    """Register the cluster commands on the `eos` parser."""
    zookeeper = commands.add_parser("zookeeper", help="run Apache ZooKeeper for a cluster")
    zookeeper_actions = zookeeper.add_subparsers(dest="action", required=True)
    zk_start = zookeeper_actions.add_parser("start", help="start ZooKeeper on 127.0.0.1 in the foreground")
    zk_start.add_argument("--port", type=int, default=2181)
    zk_start.add_argument("--data-dir", default="./eos-zookeeper")
    zk_start.set_defaults(handler=cmd_zookeeper_start)
    cluster = commands.add_parser("cluster", help="a local cluster: ZooKeeper and brokers on 127.0.0.1")
    cluster_actions = cluster.add_subparsers(dest="action", required=True)
    start = cluster_actions.add_parser("start", help="start ZooKeeper and N brokers in the foreground")
    start.add_argument("--brokers", type=int, default=3)
    start.add_argument("--data-dir", default="./eos-cluster")
    start.add_argument("--base-port", type=int, default=9092, help="broker i listens on base-port + i")
    start.add_argument("--zookeeper-port", type=int, default=2181)
    start.add_argument("--metrics-base-port", type=int, default=9404,
                       help="broker i serves Prometheus metrics on this port + i (-1: none)")
    start.add_argument("--config", action="append", metavar="NAME=VALUE", help="broker config for every broker")
    start.add_argument("--tls", action="store_true",
                       help="SSL listeners with mutual TLS, brokers included, from a throwaway CA made in "
                            "<data-dir>/tls (the cryptography package); clients use <data-dir>/tls/admin.properties")
    start.set_defaults(handler=lambda args: cmd_cluster_start(_with_pairs(args, parse_pairs)))
    stop = cluster_actions.add_parser("stop", help="stop the cluster started from --data-dir, and wait for it")
    stop.add_argument("--data-dir", default="./eos-cluster")
    stop.add_argument("--timeout", type=float, default=STOP_TIMEOUT_S_DEFAULT,
                      help="seconds to wait for it to exit (default %(default)g)")
    stop.set_defaults(handler=cmd_cluster_stop)

    election = client_command("leader-election", help="elect preferred or unclean leaders (kafka-leader-election)")
    election.add_argument("--election-type", choices=["preferred", "unclean"], required=True)
    election.add_argument("--topic")
    election.add_argument("--partition", type=int)
    election.add_argument("--all-topic-partitions", action="store_true")
    election.set_defaults(handler=cmd_leader_election)

    partitions = client_command("partitions", help="partition reassignment (kafka-reassign-partitions)")
    partitions.add_argument("action", choices=["reassign"])
    partitions.add_argument("--plan", required=True, help="JSON: {\"partitions\": [{topic, partition, replicas}]}")
    partitions.add_argument("--execute", action="store_true")
    partitions.add_argument("--verify", action="store_true")
    partitions.add_argument("--cancel", action="store_true")
    partitions.add_argument("--throttle", type=int, default=0,
                            help="with --execute: bytes/s the leaders send the new replicas while they catch up")
    partitions.set_defaults(handler=cmd_partitions)


def _with_pairs(args, parse_pairs):
    args.config_pairs = parse_pairs(args.config)
    return args

"""python -m bench [--quick] [--only NAME,...] [--records N]: eos against Apache Kafka.

Theory of operation
-------------------
One run: describe the machine, measure the raw disk in the directory where the brokers
will keep their data, then for each system in turn (Kafka, then eos; never both at once)
start its broker on 127.0.0.1, run every selected workload against it, and stop it. The
outcome of each (workload, system) is one of: ok (metrics), not available (the system
cannot do it yet, which is not a failure), lost (records went missing: reported instead of
a speed, and the run exits 1), error (exits 1). Results go to bench/results/ for a full run
and to bench/results/tmp/ (not committed) for --quick, --only or --records runs, unless
--out says otherwise.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

from bench import disk, report
from bench.eos_server import EosBroker, EosUnavailable, broker_available
from bench.host_speed import python_probe_ms
from bench.kafka import KafkaBroker, KafkaUnavailable, resolve_kafka
from bench.workloads import REGISTRY, NotAvailable, RecordsLost, RunContext, Sizes

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "bench" / "results"
SYSTEM_ORDER = ("kafka", "eos")


class Progress:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.start:6.1f}s] {message}", flush=True)


def _command_output(args: list[str], cwd: Path | None = None) -> str:
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=30, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (result.stdout + result.stderr).strip()


def machine_info(tmp_dir: str) -> dict:
    cpu_model = "unknown"
    try:
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        if match:
            cpu_model = match.group(1).strip()
    except OSError:
        pass
    memory_gib = 0.0
    try:
        match = re.search(r"^MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
        if match:
            memory_gib = int(match.group(1)) / (1 << 20)
    except OSError:
        pass
    # A run from a clean export (git archive HEAD, no .git) names its commit in
    # EOS_BENCH_COMMIT; a run from a work tree says whether it had uncommitted changes.
    if (REPO_ROOT / ".git").exists():
        commit = _command_output(["git", "rev-parse", "--short=12", "HEAD"], REPO_ROOT)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=REPO_ROOT,
                               capture_output=True).returncode != 0
    else:
        commit, dirty = os.environ.get("EOS_BENCH_COMMIT", "unknown (no .git)"), False
    java = _command_output(["java", "-version"]).splitlines()
    info = {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "memory_gib": round(memory_gib, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "java": (" ".join(java[0].replace('"', "").split()[:3:2]) if java else "no java"),
        "eos_commit": commit + ("+uncommitted" if dirty else ""),
        "data_filesystem": _filesystem_of(tmp_dir),
        # Other work on a shared machine moves the figures; this shows how busy it was.
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        # ... and this how fast the host ran Python code (bench/host_speed.py).
        "python_probe_ms_at_start": python_probe_ms(),
    }
    try:
        import confluent_kafka
        version = confluent_kafka.version()
        info["confluent_kafka"] = version[0] if isinstance(version, tuple) else version
        info["librdkafka"] = confluent_kafka.libversion()[0]
    except ImportError:
        info["confluent_kafka"] = None
    return info


def _filesystem_of(path: str) -> str:
    path = os.path.realpath(path)
    best = ("", "unknown", "unknown")
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype = line.split()[:3]
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) \
                    and len(mount) > len(best[0]):
                best = (mount, fstype, device)
    except OSError:
        pass
    return f"{best[1]} ({best[2]} on {best[0] or '?'})"


def run_system(system: str, broker, workloads: list[str], sizes: Sizes, disk_speed,
               progress: Progress) -> dict[str, dict]:
    """Every selected workload against one started broker."""
    outcomes: dict[str, dict] = {}
    data_dir = broker.log_dir if system == "kafka" else broker.data_dir
    ctx = RunContext(system=system, bootstrap=broker.bootstrap, data_dir=data_dir,
                     sizes=sizes, progress=progress, shared={"disk": disk_speed},
                     broker_pid=broker.proc.pid if broker.proc is not None else None)
    for name in workloads:
        workload = REGISTRY[name]
        runner = workload.runners.get(system)
        progress(f"{system}: {name} — {workload.title}")
        started = time.monotonic()
        if runner is None:
            outcomes[name] = {"status": "not available", "detail": f"no {system} runner"}
            continue
        try:
            broker.check_alive()
        except (KafkaUnavailable, EosUnavailable) as exc:
            # A dead broker fails every workload left; no point waiting on client timeouts.
            progress(f"  ERROR: {exc}")
            lines = str(exc).splitlines() or [""]
            outcomes[name] = {"status": "error", "elapsed_s": 0.0,
                              "detail": " ... ".join(dict.fromkeys([lines[0], lines[-1]]))}
            continue
        try:
            metrics = runner(ctx)
            outcomes[name] = {"status": "ok", "metrics": [m.to_dict() for m in metrics]}
        except NotAvailable as exc:
            progress(f"  not available: {exc}")
            outcomes[name] = {"status": "not available", "detail": str(exc)}
        except RecordsLost as exc:
            progress(f"  RECORDS LOST: {exc}")
            outcomes[name] = {"status": "lost", "detail": str(exc),
                              "expected": exc.expected, "actual": exc.actual}
        except Exception as exc:  # a benchmark must report, not crash the other rows
            progress(f"  ERROR: {type(exc).__name__}: {exc}")
            traceback.print_exc()
            try:
                broker.check_alive()
            except (KafkaUnavailable, EosUnavailable) as dead:
                progress(f"  the broker died: {dead}")
            outcomes[name] = {"status": "error", "detail": f"{type(exc).__name__}: {exc}"}
        outcomes[name]["elapsed_s"] = round(time.monotonic() - started, 1)
    return outcomes


def _measure_system(system: str, args, sizes: Sizes, disk_speed, progress: Progress, systems: dict,
                    per_workload: dict, stopped: list) -> None:
    """Start `system`'s broker, run every workload on it into `per_workload` (its status into
    `systems`), and stop it; a stopped broker's files stay, listed in `stopped`."""
    broker = None
    try:
        try:
            broker, version = start_broker(system, args.kafka_version, args.tmp_dir,
                                           progress, tuple(args.eos_config))
        except (KafkaUnavailable, EosUnavailable, ImportError) as exc:
            # No eos broker program yet is "not available"; one that crashes is an error.
            missing = system == "eos" and broker_available() is not None
            status = "not available" if missing else "error"
            progress(f"{system}: {status}: {exc}")
            systems[system] = {"status": status, "detail": str(exc), "version": None}
            for name in args.workloads:
                per_workload[name][system] = {"status": status, "detail": f"{system} broker: {exc}"}
            return
        systems[system] = {"status": "ok", "version": version, "bootstrap": broker.bootstrap}
        progress(f"{system}: broker up at {broker.bootstrap}")
        for name, outcome in run_system(system, broker, args.workloads, sizes, disk_speed,
                                        progress).items():
            per_workload[name][system] = outcome
    finally:
        if broker is not None:
            progress(f"{system}: stopping the broker")
            broker.stop(keep_files=True)
            stopped.append(broker)


def start_broker(system: str, kafka_version: str, tmp_dir: str, progress: Progress,
                 eos_config: tuple[str, ...] = ()):
    if system == "kafka":
        progress("kafka: resolving jars from Maven Central (cached after the first run)")
        dist = resolve_kafka(kafka_version)
        progress(f"kafka: starting Kafka {dist.version} (KRaft, one node)")
        return KafkaBroker(dist, base_dir=tmp_dir).start(), dist.version
    progress("eos: starting the eos broker")
    from eos import __version__
    extra_args = tuple(arg for pair in eos_config for arg in ("--config", pair))
    return EosBroker(base_dir=tmp_dir, extra_args=extra_args).start(), __version__


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: under 2 minutes")
    parser.add_argument("--only", default="", help="comma-separated workloads: "
                        + ", ".join(REGISTRY))
    parser.add_argument("--systems", default=",".join(SYSTEM_ORDER),
                        help="comma-separated systems to run (default: kafka,eos)")
    parser.add_argument("--records", type=int, help="records per throughput measurement")
    parser.add_argument("--out", type=Path, help="results directory (default: bench/results, "
                        "or bench/results/tmp for partial runs)")
    parser.add_argument("--kafka-version", default=os.environ.get("EOS_BENCH_KAFKA_VERSION",
                                                                   "latest"))
    parser.add_argument("--tmp-dir", default=os.environ.get("EOS_BENCH_TMP",
                                                             tempfile.gettempdir()),
                        help="where broker data and the disk test go (same filesystem)")
    parser.add_argument("--json", action="store_true", help="also print the JSON to stdout")
    parser.add_argument("--eos-config", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the eos broker (repeatable), as `eos broker start --config`")
    args = parser.parse_args(argv)
    args.workloads = [w.strip() for w in args.only.split(",") if w.strip()] or \
        [name for name, w in REGISTRY.items() if w.default_on]
    unknown = [w for w in args.workloads if w not in REGISTRY]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(REGISTRY)}")
    args.workloads = [name for name in REGISTRY if name in args.workloads]  # registry order
    args.system_list = [s.strip() for s in args.systems.split(",") if s.strip()]
    bad = [s for s in args.system_list if s not in SYSTEM_ORDER]
    if bad:
        parser.error(f"unknown system(s) {', '.join(bad)}; known: {', '.join(SYSTEM_ORDER)}")
    if args.records is not None and args.records <= 0:
        parser.error(f"--records must be positive, got {args.records}")
    return args


def _exit_on_sigterm(signum, _frame) -> None:
    # SIGTERM (timeout, CI) must unwind through the finally blocks that stop the brokers
    # and remove their temp dirs; Python's default would just die.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    args = parse_args(argv)
    progress = Progress()
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.records:
        sizes.records = args.records
        sizes.warmup_records = min(sizes.warmup_records, max(1000, args.records // 10))
    partial = args.quick or args.only or args.records or args.systems != ",".join(SYSTEM_ORDER)
    out_dir = args.out or (RESULTS_DIR / "tmp" if partial else RESULTS_DIR)
    started = dt.datetime.now(dt.timezone.utc)
    command = "python -m bench" + ("" if argv is None and len(sys.argv) <= 1 else
                                   " " + " ".join(sys.argv[1:] if argv is None else argv))
    progress(f"{command}: workloads {', '.join(args.workloads)} on "
             f"{', '.join(args.system_list)}; {sizes.records:,} records per measurement")
    machine = machine_info(args.tmp_dir)
    progress(f"machine: {machine['cpu_model']}, {machine['cores']} cores, "
             f"{machine['memory_gib']} GiB, {machine['data_filesystem']}")
    progress(f"disk: sequential write of {sizes.disk_mib} MiB in {args.tmp_dir}")
    disk_speed = disk.measure(args.tmp_dir, sizes.disk_mib)
    progress(f"disk: {disk_speed.buffered_mb_s:,.0f} MB/s buffered, "
             f"{disk_speed.fsync_mb_s:,.0f} MB/s with fsync")
    systems: dict[str, dict] = {}
    per_workload: dict[str, dict[str, dict]] = {name: {} for name in args.workloads}
    # Every system's files stay until all have run: on ext4 without a journal, as on this
    # machine, creating a file scans past the inodes freed in the last minute or more, so
    # one system's mass removal would slow the file creation of the system measured next
    # (bench/README, "Files kept to the end, a session's waiter, the metadata index").
    stopped = []
    try:
        for system in args.system_list:
            _measure_system(system, args, sizes, disk_speed, progress, systems, per_workload, stopped)
    finally:
        for broker in stopped:
            broker.remove_files()
    finished = dt.datetime.now(dt.timezone.utc)
    run = {
        "schema": 1,
        "command": command,
        "mode": "quick" if args.quick else "full",
        "started_utc": started.isoformat(timespec="seconds"),
        "finished_utc": finished.isoformat(timespec="seconds"),
        "duration_s": round((finished - started).total_seconds(), 1),
        "sizes": asdict(sizes),
        "machine": {**machine, "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
                    "python_probe_ms_at_end": python_probe_ms()},
        "disk": disk_speed.to_dict(),
        "systems": systems,
        "workloads": [{"name": name, "title": REGISTRY[name].title,
                       "results": per_workload[name]} for name in args.workloads],
    }
    stem = f"{started:%Y-%m-%d}-{machine['hostname']}"
    written = report.write(run, out_dir, stem)
    if args.json:
        print(json.dumps({**run, "rows": report.rows(run)}, indent=2))
    print()
    print(report.console_table(run))
    print()
    for path in written:
        print(f"wrote {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}")
    failed = [(w["name"], s, o["status"]) for w in run["workloads"]
              for s, o in w["results"].items() if o["status"] in ("lost", "error")]
    if failed:
        print("FAILED: " + "; ".join(f"{w} on {s}: {status}" for w, s, status in failed),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""python -m bench.startup [--partitions 10000] [--segments-per-partition 1] [--json-out F]: broker start time and memory.

    python -m bench.startup --partitions 4000 --segments-per-partition 4 \
        --code-dir before=/tmp/eos-before --code-dir mmap=$PWD@mmap --code-dir read=$PWD@read

Theory of operation
-------------------
Kafka's issue "memory-mapped indexes" asks what a broker with many partitions pays at start
for its segment indexes. This bench answers for eos's storage engine, alone
(`LogManager.load`) and inside a whole broker (`BrokerServer.start`), after a clean and
after an unclean shutdown.

1. Build (not timed). One template partition is written with `broker.storage.Log` itself
   (`append_as_leader`, batches of 2 records of 100 B, increasing timestamps) with a small
   segment.bytes (64 KiB) and index.interval.bytes (256 B), so that every batch but the
   first of a segment gets an offset-index and a time-index entry (~270 of each per sealed
   segment: 2.2 KB of `.index`, 3.3 KB of `.timeindex`: a 1 GiB Kafka segment at 4 KiB per
   entry has 2 MB, scaled down to segments this size). It has --segments-per-partition
   segments, the last (the active one) half full, and is closed cleanly. It is then copied
   to `bench-0` .. `bench-<N-1>` (distinct files, no links: recovery rewrites index files).
   The checkpoints (recovery point = log start = log end) and the topic registry's file are
   written as a clean shutdown leaves them, and one `BrokerServer` start and clean stop
   creates the broker's own files (meta.properties, the 100 internal partitions).
   Sizes: 4,000 partitions x 4 segments hold 0.9 GB of `.log` and 65 MB of indexes in 68,000
   files; 10,000 x 1 hold 0.3 GB. More does not open here: every segment keeps its `.log`
   descriptor open (as Kafka's do) and this machine's RLIMIT_NOFILE is 20,000 (hard limit,
   not raisable in the container), so 10,000 partitions fit with one segment each only;
   4,000 x 4 (12,000 sealed segments) is where the index designs differ.

2. Measure. Each figure comes from a fresh child process (`python bench/startup.py
   --child ...`, RLIMIT_NOFILE raised to its hard limit), so no cache of one run helps the
   next, and the child imports the storage code from --code-dir NAME=DIR (default: this
   checkout): give another tree, e.g. a `git archive` of an older commit, to compare two
   designs on the same data; DIR@ACCESS also sets broker.storage.index.SEALED_INDEX_ACCESS
   ("mmap" or "read"). Before a clean-shutdown run the parent writes `.kafka_cleanshutdown`
   (a load removes it); before an unclean one it removes it, so recovery checks every batch
   from the recovery point's segment (the active one) on. The child reports
   - load_s: wall time of `LogManager.load()` (or `BrokerServer.start()`), perf_counter;
   - rss_mb after the load (VmRSS of /proc/self/status), split into anonymous (RssAnon:
     Python objects, arrays) and file-backed pages (RssFile: mapped files), and
     peak_rss_mb, VmHWM: getrusage's ru_maxrss survives exec on Linux, so a child's would
     include the parent's RSS before the exec (kept in the JSON as ru_maxrss_mb);
   - touch_s, rss_after_touch_mb, fds and maps: then one offset-index and one time-index
     lookup in every segment of every partition (what the first fetch of each segment
     does), so that a lazy design's deferred cost is shown, not hidden; with the descriptors
     and memory maps the process then holds.
   The child exits without closing anything (a close would write). One unmeasured load
   warms the page cache first; then every design is run --repeats times (3) in turn, so a
   busy minute on this shared machine hits each design, and the median (min-max) is kept.

Results: JSON on stdout and in --json-out, a table on stdout, and
`bench/results/startup-<P>x<S>-<UTC date>-<host>.{json,md}` plus `startup-<P>x<S>-latest.*`
for the two committed sizes above (`bench/results/tmp/` for others). The data directory is
removed at the end unless --keep-data (reuse it with --data-dir).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "bench" / "results"
TOPIC = "bench"
SEGMENT_BYTES = 64 * 1024
INDEX_INTERVAL_BYTES = 256
VALUE_BYTES = 100
RECORDS_PER_BATCH = 2
DEFAULT_PARTITIONS = 10_000
DEFAULT_SEGMENTS = 1
# The sizes whose results go to bench/results/ (others to bench/results/tmp/): 10,000
# partitions of one segment (the count; more segments need more descriptors than
# this machine's RLIMIT_NOFILE of 20,000 allows, one per segment) and 4,000 of 4 segments
# (12,000 sealed segments: where the index designs differ).
COMMITTED_SIZES = {(10_000, 1), (4_000, 4)}
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
CHILD_TIMEOUT_S = 1800          # one load of 10,000 partitions takes well under a minute here


def topic_overrides() -> dict[str, str]:
    return {"segment.bytes": str(SEGMENT_BYTES), "index.interval.bytes": str(INDEX_INTERVAL_BYTES),
            "retention.ms": "-1", "retention.bytes": "-1"}


# ---- build (parent, this checkout's code) ----------------------------------------------------

def _build_template(directory: str, segments: int) -> None:
    """One partition of `segments` segments (the last half full), written by `Log` and closed cleanly."""
    from broker.storage import Log
    from eos.config import TopicConfig
    from eos.records.codec import BatchBuilder

    config = TopicConfig.from_overrides(topic_overrides())
    log_ = Log.open(directory, config, now_ms=0)
    timestamp_ms = 1_700_000_000_000
    values = [bytes([65 + i % 26]) * VALUE_BYTES for i in range(RECORDS_PER_BATCH)]
    appends_max = segments * SEGMENT_BYTES // 100 + 1000      # bounded: each append adds > 100 bytes
    for _ in range(appends_max):
        if len(log_.segments) == segments and log_.active_segment.size_bytes >= SEGMENT_BYTES // 2:
            break
        builder = BatchBuilder()
        builder.append_many(values, None, [timestamp_ms] * RECORDS_PER_BATCH)
        log_.append_as_leader(builder.build(), now_ms=0)
        timestamp_ms += 10
    log_.close(clean=True)


def build(data_dir: str, partitions: int, segments: int, with_broker: bool, progress) -> dict:
    """The data directory of a cleanly stopped broker with `partitions` copies of one partition."""
    from broker.storage.checkpoint import (
        LOG_START_OFFSET_CHECKPOINT, RECOVERY_POINT_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT,
        OffsetCheckpointFile)
    from broker.topics import TopicRegistry

    os.makedirs(data_dir, exist_ok=True)
    template_parent = tempfile.mkdtemp(prefix="eos-bench-startup-template-", dir=os.path.dirname(data_dir))
    template = os.path.join(template_parent, f"{TOPIC}-0")
    _build_template(template, segments)
    names = sorted(os.listdir(template))
    from broker.storage import Log
    from eos.config import TopicConfig
    probe = Log.open(template, TopicConfig.from_overrides(topic_overrides()), clean_shutdown=True, now_ms=0)
    end_offset = probe.log_end_offset
    probe.close(clean=False)
    sizes: dict[str, int] = {}
    for name in names:
        suffix = os.path.splitext(name)[1]
        sizes[suffix] = sizes.get(suffix, 0) + os.path.getsize(os.path.join(template, name))
    started = time.monotonic()
    for partition in range(partitions):
        target = os.path.join(data_dir, f"{TOPIC}-{partition}")
        os.makedirs(target)
        for name in names:
            shutil.copyfile(os.path.join(template, name), os.path.join(target, name))
        if partition % 1000 == 999:
            progress(f"copied {partition + 1:,} partitions")
    shutil.rmtree(template_parent)
    offsets = {(TOPIC, p): end_offset for p in range(partitions)}
    for name in (RECOVERY_POINT_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT):
        OffsetCheckpointFile(os.path.join(data_dir, name)).write(offsets)
    OffsetCheckpointFile(os.path.join(data_dir, LOG_START_OFFSET_CHECKPOINT)).write(
        {(TOPIC, p): 0 for p in range(partitions)})
    registry = TopicRegistry(data_dir)
    registry.load()
    registry.commit(registry.prepare_create(TOPIC, partitions, 1, topic_overrides()))
    open(os.path.join(data_dir, CLEAN_SHUTDOWN_FILE), "wb").close()
    if with_broker:
        from broker.server import BrokerServer
        BrokerServer(data_dir, port=0).start().stop()     # meta.properties, internal topics
    os.sync()
    progress(f"built {partitions:,} partitions in {time.monotonic() - started:.0f} s")
    return {"partitions": partitions, "segments_per_partition": segments, "segment_bytes": SEGMENT_BYTES,
            "index_interval_bytes": INDEX_INTERVAL_BYTES, "records_per_batch": RECORDS_PER_BATCH,
            "value_bytes": VALUE_BYTES, "end_offset_per_partition": end_offset,
            "bytes_per_partition": sizes, "files_per_partition": len(names),
            "total_mb": {suffix: round(size * partitions / 1e6, 1) for suffix, size in sizes.items()}}


# ---- one measurement (child process, the code of --code-dir) ---------------------------------

def _status_mb() -> dict[str, float]:
    """VmRSS, RssAnon and RssFile of this process, in MB (10^6 bytes)."""
    wanted = {"VmRSS": "rss_mb", "RssAnon": "rss_anon_mb", "RssFile": "rss_file_mb", "VmHWM": "peak_rss_mb"}
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in wanted:
                out[wanted[key]] = round(int(rest.split()[0]) * 1024 / 1e6, 1)
    return out


def _touch_every_index(logs) -> int:
    """One offset lookup and one timestamp lookup in every segment (a first fetch of each)."""
    lookups = 0
    for log_ in logs:
        for segment in log_.segments:
            middle_offset = (segment.base_offset + segment.next_offset) // 2
            segment.offset_index.lookup(middle_offset)
            segment.time_index.lookup(segment.max_timestamp_ms - 1)
            lookups += 2
    return lookups


def _descriptors_and_maps() -> tuple[int, int]:
    """Open file descriptors and memory-mapped areas of this process (-1 when the
    descriptors are exhausted and /proc cannot be read)."""
    try:
        descriptors = len(os.listdir("/proc/self/fd"))
        with open("/proc/self/maps") as f:
            maps = sum(1 for _ in f)
    except OSError:
        return -1, -1
    return descriptors, maps


def child(code_dir: str, data_dir: str, what: str, index_access: str | None) -> dict:
    sys.path.insert(0, code_dir)
    import resource
    import logging
    logging.basicConfig(level=logging.WARNING)
    # Every segment keeps its .log descriptor open (as Kafka's do): take what the system allows.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    from broker.storage.log_manager import LogManager   # noqa: F401 (imported before the clock)
    from broker.topics import TopicRegistry
    import broker.storage.index as index_module
    if index_access is not None:
        if not hasattr(index_module, "SEALED_INDEX_ACCESS"):
            raise SystemExit(f"{code_dir}: its indexes have no SEALED_INDEX_ACCESS to set to {index_access}")
        index_module.SEALED_INDEX_ACCESS = index_access
    rss_before = _status_mb()["rss_mb"]
    broker = None
    if what == "log_manager":
        registry = TopicRegistry(data_dir)
        configs = {info.name: info.config for info in registry.load()}
        manager = LogManager(data_dir)
        started = time.perf_counter()
        manager.load(configs)
        load_s = time.perf_counter() - started
        logs = manager.all_logs()
    else:
        from broker.server import BrokerServer
        broker = BrokerServer(data_dir, port=0)
        started = time.perf_counter()
        broker.start()
        load_s = time.perf_counter() - started
        logs = broker.log_manager.all_logs()
    after_load = _status_mb()
    descriptors_after_load, maps_after_load = _descriptors_and_maps()
    started = time.perf_counter()
    lookups = _touch_every_index(logs)
    touch_s = time.perf_counter() - started
    after_touch = _status_mb()
    descriptors_after_touch, maps_after_touch = _descriptors_and_maps()
    return {"load_s": round(load_s, 3), "rss_before_mb": rss_before, **after_load,
            "peak_rss_after_load_mb": after_load["peak_rss_mb"],
            "touch_s": round(touch_s, 3), "lookups": lookups,
            "rss_after_touch_mb": after_touch["rss_mb"], "rss_anon_after_touch_mb": after_touch["rss_anon_mb"],
            "rss_file_after_touch_mb": after_touch["rss_file_mb"],
            "peak_rss_mb": after_touch["peak_rss_mb"],
            # getrusage's ru_maxrss survives exec on Linux: it includes the parent's RSS
            # before the exec, hence VmHWM (this process image's own peak) as the figure
            "ru_maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1.024 / 1000, 1),
            "fds_after_load": descriptors_after_load, "maps_after_load": maps_after_load,
            "fds_after_touch": descriptors_after_touch, "maps_after_touch": maps_after_touch,
            "fd_limit": hard, "partitions": len(logs), "segments": sum(len(log_.segments) for log_ in logs),
            "index_module": index_module.__file__}


def run_child(python: str, design: str, data_dir: str, what: str, shutdown: str) -> dict:
    """One measurement in a fresh process; `design` is DIR or DIR@ACCESS (SEALED_INDEX_ACCESS)."""
    code_dir, _, index_access = design.partition("@")
    marker = os.path.join(data_dir, CLEAN_SHUTDOWN_FILE)
    if shutdown == "clean":
        open(marker, "wb").close()
    elif os.path.exists(marker):
        os.unlink(marker)
    done = subprocess.run([python, str(Path(__file__).resolve()), "--child", what, "--code-dir", code_dir,
                           "--data-dir", data_dir] + (["--index-access", index_access] if index_access else []),
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"child ({what}, {shutdown}, {code_dir}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- report --------------------------------------------------------------------------------

FIGURES = [("load_s", "load s"), ("rss_mb", "RSS MB"), ("rss_anon_mb", "anon MB"), ("rss_file_mb", "file MB"),
           ("peak_rss_mb", "peak MB"), ("touch_s", "touch s"), ("rss_after_touch_mb", "RSS touched MB"),
           ("rss_anon_after_touch_mb", "anon touched MB"), ("fds_after_touch", "fds touched"),
           ("maps_after_touch", "maps touched")]


def summarise(samples: list[dict]) -> dict:
    out = {}
    for key, _ in FIGURES:
        values = [s[key] for s in samples]
        out[key] = {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values),
                    "samples": values}
    out["rss_before_mb"] = statistics.median(s["rss_before_mb"] for s in samples)
    return out


def table(run: dict) -> str:
    head = ["what", "shutdown", "design"] + [title for _, title in FIGURES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in run["rows"]:
        cells = [row["what"], row["shutdown"], row["design"]]
        for key, _ in FIGURES:
            f = row["figures"][key]
            cells.append(f"{f['median']:g} ({f['min']:g}-{f['max']:g})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS)
    parser.add_argument("--segments-per-partition", type=int, default=DEFAULT_SEGMENTS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--code-dir", action="append", default=[],
                        help="NAME=DIR: measure the storage code under DIR as design NAME (repeatable; "
                             "default: this checkout as 'current')")
    parser.add_argument("--what", default="log_manager,broker", help="log_manager and/or broker")
    parser.add_argument("--shutdowns", default="clean,unclean")
    parser.add_argument("--data-dir", help="reuse (or build into) this directory")
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--tmp-dir", default=os.environ.get("EOS_BENCH_TMP", tempfile.gettempdir()))
    parser.add_argument("--json-out")
    parser.add_argument("--out", type=Path, help="results directory (default bench/results, tmp/ if not default size)")
    parser.add_argument("--child", choices=["log_manager", "broker"], help=argparse.SUPPRESS)
    parser.add_argument("--index-access", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        code_dir = args.code_dir[0]
        print(json.dumps(child(code_dir, args.data_dir, args.child, args.index_access)))
        sys.stdout.flush()
        os._exit(0)     # nothing is closed: a close would write to the data directory

    sys.path.insert(0, str(REPO_ROOT))
    t0 = time.monotonic()

    def progress(message):
        print(f"[{time.monotonic() - t0:7.1f}s] {message}", file=sys.stderr, flush=True)

    designs = [tuple(spec.split("=", 1)) for spec in args.code_dir] or [("current", str(REPO_ROOT))]
    whats = [w for w in args.what.split(",") if w]
    shutdowns = [s for s in args.shutdowns.split(",") if s]
    started_utc = dt.datetime.now(dt.timezone.utc)
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="eos-bench-startup-", dir=args.tmp_dir)
    run = {"benchmark": "startup",
           "command": "python -m bench.startup " + " ".join(argv if argv is not None else sys.argv[1:]),
           "started_utc": started_utc.isoformat(timespec="seconds"), "python": platform.python_version(),
           "machine": platform.machine(), "cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg(),
           "designs": dict(designs), "repeats": args.repeats, "rows": []}
    try:
        if os.path.exists(os.path.join(data_dir, "recovery-point-offset-checkpoint")):
            progress(f"reusing {data_dir}")
            run["data"] = {"reused": data_dir, "partitions": args.partitions,
                           "segments_per_partition": args.segments_per_partition}
        else:
            progress(f"building {args.partitions:,} partitions in {data_dir}")
            run["data"] = build(data_dir, args.partitions, args.segments_per_partition, "broker" in whats, progress)
        python = sys.executable
        progress("warm-up load (not counted)")
        run_child(python, designs[0][1], data_dir, "log_manager", "clean")
        for what in whats:
            for shutdown in shutdowns:
                samples: dict[str, list[dict]] = {name: [] for name, _ in designs}
                for repeat in range(args.repeats):
                    for name, code_dir in designs:     # in turn, so a busy minute hits every design
                        sample = run_child(python, code_dir, data_dir, what, shutdown)
                        samples[name].append(sample)
                        progress(f"{what} {shutdown} {name} #{repeat + 1}: load {sample['load_s']} s, "
                                 f"RSS {sample['rss_mb']} MB, peak {sample['peak_rss_mb']} MB, "
                                 f"touch {sample['touch_s']} s -> RSS {sample['rss_after_touch_mb']} MB")
                for name, _ in designs:
                    run["rows"].append({"what": what, "shutdown": shutdown, "design": name,
                                        "segments": samples[name][0]["segments"],
                                        "figures": summarise(samples[name])})
        open(os.path.join(data_dir, CLEAN_SHUTDOWN_FILE), "wb").close()   # leave it as built
    finally:
        if not args.keep_data and not args.data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
    run["loadavg_at_end"] = os.getloadavg()
    run["duration_s"] = round(time.monotonic() - t0, 1)
    text = table(run)
    print(json.dumps(run))
    print()
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(run, indent=2))
    committed_size = (args.partitions, args.segments_per_partition) in COMMITTED_SIZES
    out = args.out or (RESULTS_DIR if committed_size else RESULTS_DIR / "tmp")
    out.mkdir(parents=True, exist_ok=True)
    size = f"{args.partitions}x{args.segments_per_partition}"
    stem = f"startup-{size}-{started_utc:%Y-%m-%d}-{socket.gethostname()}"
    data = run["data"]
    body = (f"# Broker start time and memory\n\n`{run['command']}` at {run['started_utc']} ({run['duration_s']} s, "
            f"load {run['loadavg_at_start'][0]:.1f} at start, {run['loadavg_at_end'][0]:.1f} at end); "
            f"{data.get('partitions'):,} partitions x {data.get('segments_per_partition')} segments "
            f"(segment.bytes {SEGMENT_BYTES}, index.interval.bytes {INDEX_INTERVAL_BYTES}); "
            f"data: {data.get('total_mb', 'reused')} MB by suffix. Median (min-max) of {args.repeats} runs, "
            f"each a fresh process; MB = 10^6 bytes. Designs: "
            + ", ".join(f"{n} = `{d}`" for n, d in designs) + " (see bench/startup.py).\n\n" + text + "\n")
    names = [stem] + ([f"startup-{size}-latest"] if committed_size and args.out is None else [])
    for name in names:
        (out / f"{name}.json").write_text(json.dumps(run, indent=2))
        (out / f"{name}.md").write_text(body)
    print(f"\nwrote {out / stem}.json and .md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""python -m bench.profile storage|broker|producer: where the time goes on the produce path.

Theory of operation
-------------------
Each scenario runs one bench workload (the same code as the benchmark rows) under a
sampling profiler and prints the functions that take the most samples:

- ``storage``: append-storage's loop (`broker.storage.Log.append_as_leader` on pre-built
  batches) in a child process, profiled whole;
- ``broker``: an eos broker process (bench/eos_server.py) profiled while append-broker's
  two raw producer processes send it pre-built 1 MiB batches;
- ``producer``: the eos Producer in a child process (produce workload: warm-up, then
  `Sizes.records` through ``send`` or ``send_batch``) and, at the same time, the broker
  serving it, for each `--config` (e.g. bulk-all-plain against bulk-all-idem).

The profiler is py-spy (``pip install py-spy``; found on PATH, in $PY_SPY, or beside this
interpreter): it samples another process from outside, so the code runs unmodified. By
default only samples of threads that are running count (py-spy's own idle test), so the
percentages are shares of CPU time; `--idle` keeps the waiting threads too (a wall-clock
view: where a blocked user thread waits). Without py-spy the storage
and producer scenarios fall back to cProfile in-process (client side only; the broker
scenario needs py-spy).

Output in `--out` (default bench/results/tmp/profile/): the raw collapsed stacks of each
profiled process (``<scenario>-<what>.txt``, one ``frame;frame;... count`` line per stack,
the input of flamegraph.pl or speedscope) and ``<name>.summary.txt``: samples per thread,
then the top functions by self and by inclusive samples, in percent of the samples of the
threads shown. Nothing here asserts anything; the figures vary with the machine's load.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "tmp" / "profile"
SAMPLE_RATE_HZ = 250
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


# ---------------------------------------------------------------- collapsed stacks

def _short_frame(frame: str, with_line: bool) -> str:
    match = _FRAME.match(frame)
    if match is None:
        return frame
    path = match.group("file")
    for prefix in (str(REPO_ROOT) + "/",):
        if path.startswith(prefix):
            path = path[len(prefix):]
            break
    else:
        if "site-packages/" in path:
            path = path.split("site-packages/", 1)[1]
        elif "/lib/python" in path:
            path = path.rsplit("/", 1)[-1]
    line = match.group("line")
    return f"{match.group('func')} ({path}{':' + line if with_line and line else ''})"


def summarize(raw_path: Path, *, top: int = 25, thread_filter: str | None = None,
              focus: str | None = None, with_line: bool = False) -> str:
    """Samples per thread, then top functions by self and inclusive samples (of the
    threads matching `thread_filter` and the stacks with a frame containing `focus`)."""
    threads: collections.Counter[str] = collections.Counter()
    self_samples: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw_path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = "all"
        if frames[0].startswith("thread ("):
            thread = frames[0].split(": ", 1)[-1] if ": " in frames[0] else frames[0]
            # numbered workers (ThreadPoolExecutor-0_12, eos-broker-rpc_3) as one pool
            thread = re.sub(r"_\d+$", "_N", thread)
            frames = frames[1:]
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        threads[thread] += count
        if thread_filter and not re.search(thread_filter, thread):
            continue
        if focus and not any(focus in f for f in frames):
            continue
        total += count
        names = [_short_frame(f, with_line) for f in frames] or ["(no Python frame)"]
        self_samples[names[-1]] += count
        for name in set(names):
            inclusive[name] += count
    out = [f"{raw_path.name}: {sum(threads.values())} samples"]
    out.append("samples per thread: " + ", ".join(
        f"{name} {count} ({100 * count / max(1, sum(threads.values())):.0f}%)"
        for name, count in threads.most_common(8)))
    if thread_filter or focus:
        out.append(f"threads matching /{thread_filter or '.*'}/, stacks through "
                   f"{focus or 'anything'}: {total} samples (100%)")
    out.append("-- self (the function itself, not its callees) --")
    out += [f"{100 * c / max(1, total):5.1f}%  {name}" for name, c in self_samples.most_common(top)]
    out.append("-- inclusive (with callees) --")
    out += [f"{100 * c / max(1, total):5.1f}%  {name}" for name, c in inclusive.most_common(top)]
    return "\n".join(out)


# ---------------------------------------------------------------- py-spy

def find_py_spy() -> str | None:
    candidates = [os.environ.get("PY_SPY"), shutil.which("py-spy"),
                  str(Path(sys.executable).parent / "py-spy")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class PySpy:
    """py-spy record of one process (a pid, or a command it starts), stopped by SIGINT."""

    def __init__(self, py_spy: str, output: Path, *, pid: int | None = None,
                 command: list[str] | None = None, idle: bool = False,
                 rate_hz: int = SAMPLE_RATE_HZ):
        args = [py_spy, "record", "--format", "raw", "--output", str(output), "--rate",
                str(rate_hz), "--threads", "--nonblocking"]
        if idle:
            args.append("--idle")
        if pid is not None:
            args += ["--pid", str(pid)]
        elif command:
            args += ["--"] + command
        else:
            raise ValueError("PySpy needs a pid or a command")
        self.output = output
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, env=_child_env())

    def wait(self, timeout_s: float) -> str:
        """Until the profiled command exits (py-spy writes the output then)."""
        try:
            out, _ = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        return out

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            out, _ = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


# ---------------------------------------------------------------- scenarios (children)

def child_storage(variant_key: str, mib: int, repeats: int, directory: str) -> None:
    from bench.workloads.append_storage import VARIANTS, append_once, build_batches

    variant = next(v for v in VARIANTS if v.key == variant_key)
    batches, per_batch = build_batches(b"v" * 100, variant, mib << 20)
    for _ in range(repeats):
        run = append_once(directory, batches, per_batch)
        print(f"storage {variant.label}: {run.mb_per_s:,.0f} MB/s, {run.records / run.append_s:,.0f} "
              f"records/s ({run.batches:,} batches)", flush=True)


def child_producer(bootstrap: str, data_dir: str, config_key: str, records: int) -> None:
    from bench.workloads import RunContext, Sizes
    from bench.workloads import produce

    sizes = Sizes(records=records, repeats=1, warmup_records=min(50_000, records),
                  max_measure_s=30.0)
    ctx = RunContext(system="eos", bootstrap=bootstrap, data_dir=Path(data_dir), sizes=sizes,
                     progress=lambda m: print(m, flush=True),
                     topic_prefix=f"profile{os.getpid()}")
    run = produce.measure_once(ctx, produce.CONFIGS[config_key])
    print(f"producer {run.config.label}: {run.records_per_s:,.0f} records/s "
          f"({run.acked:,} in {run.elapsed_s:.2f} s)", flush=True)


# ---------------------------------------------------------------- scenarios (parent)

def _write_summary(path: Path, parts: list[str]) -> None:
    text = "\n\n".join(parts)
    path.write_text(text + "\n")
    print(text)
    print(f"\nwrote {path}")


def profile_storage(args, py_spy: str | None) -> None:
    out = args.out / f"storage-{args.variant}.txt"
    command = [sys.executable, "-m", "bench.profile", "_storage", args.variant,
               str(args.mib), str(args.repeats), args.tmp_dir]
    if py_spy is None:
        import cProfile
        import pstats
        profiler = cProfile.Profile()
        profiler.runcall(child_storage, args.variant, args.mib, args.repeats, args.tmp_dir)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
        return
    spy = PySpy(py_spy, out, command=command, idle=False)
    print(spy.wait(timeout_s=600))
    _write_summary(args.out / f"storage-{args.variant}.summary.txt",
                   [summarize(out, top=args.top, thread_filter="MainThread",
                              focus="Log.append_as_leader"),
                    "Same, by line:\n" + summarize(out, top=args.top, thread_filter="MainThread",
                                                   focus="Log.append_as_leader",
                                                   with_line=True)])


def _start_broker(args):
    from bench.eos_server import EosBroker
    broker = EosBroker(base_dir=args.tmp_dir).start()
    print(f"broker pid {broker.proc.pid} at {broker.bootstrap}", flush=True)
    return broker


def profile_broker(args, py_spy: str | None) -> None:
    if py_spy is None:
        raise SystemExit("the broker scenario needs py-spy (pip install py-spy)")
    from bench.workloads import RunContext, Sizes
    from bench.workloads.append_broker import measure_once

    broker = _start_broker(args)
    try:
        ctx = RunContext(system="eos", bootstrap=broker.bootstrap, data_dir=broker.data_dir,
                         sizes=Sizes(disk_mib=args.mib, max_measure_s=30.0),
                         progress=lambda m: print(m, flush=True))
        out = args.out / "broker-append.txt"
        spy = PySpy(py_spy, out, pid=broker.proc.pid, idle=args.idle)
        time.sleep(1.0)   # py-spy attaches
        try:
            for _ in range(args.repeats):
                run = measure_once(ctx)
                print(f"broker append: {run.mb_per_s:,.0f} MB/s, {run.records_per_s:,.0f} "
                      f"records/s ({run.requests} requests in {run.elapsed_s:.2f} s)", flush=True)
        finally:
            print(spy.stop())
    finally:
        broker.stop()
    _write_summary(args.out / "broker-append.summary.txt", [
        summarize(out, top=args.top),
        "RPC worker threads only:\n" + summarize(out, top=args.top, thread_filter="rpc"),
        "Same, by line:\n" + summarize(out, top=args.top, thread_filter="rpc", with_line=True)])


def profile_producer(args, py_spy: str | None) -> None:
    broker = _start_broker(args)
    parts: list[str] = []
    try:
        for config_key in args.config:
            command = [sys.executable, "-m", "bench.profile", "_producer", broker.bootstrap,
                       str(broker.data_dir), config_key, str(args.records)]
            if py_spy is None:
                import cProfile
                import pstats
                profiler = cProfile.Profile()
                profiler.runcall(child_producer, broker.bootstrap, str(broker.data_dir),
                                 config_key, args.records)
                pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
                continue
            client_out = args.out / f"producer-{config_key}-client.txt"
            broker_out = args.out / f"producer-{config_key}-broker.txt"
            broker_spy = PySpy(py_spy, broker_out, pid=broker.proc.pid, idle=args.idle)
            time.sleep(1.0)
            try:
                client_spy = PySpy(py_spy, client_out, command=command, idle=args.idle)
                print(client_spy.wait(timeout_s=600))
            finally:
                print(broker_spy.stop())
            parts += [f"==== {config_key}: client, all threads",
                      summarize(client_out, top=args.top),
                      f"==== {config_key}: client, sender thread",
                      summarize(client_out, top=args.top, thread_filter="sender"),
                      f"==== {config_key}: broker, all threads",
                      summarize(broker_out, top=args.top)]
    finally:
        broker.stop()
    if parts:
        _write_summary(args.out / ("producer-" + "+".join(args.config) + ".summary.txt"), parts)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_storage":
        child_storage(argv[1], int(argv[2]), int(argv[3]), argv[4])
        return 0
    if argv and argv[0] == "_producer":
        child_producer(argv[1], argv[2], argv[3], int(argv[4]))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.profile",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=("storage", "broker", "producer"))
    parser.add_argument("--variant", default="16kib", help="storage: 1mib, 1mib-idem, 16kib, "
                        "16kib-idem (default 16kib)")
    parser.add_argument("--mib", type=int, default=512, help="storage/broker: MiB appended "
                        "per run (default 512)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--config", action="append",
                        help="producer: a produce config key, repeatable (default "
                             "bulk-all-plain and bulk-all-idem)")
    parser.add_argument("--records", type=int, default=1_000_000,
                        help="producer: records per run (default 1,000,000)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--idle", action="store_true", help="keep samples of waiting threads "
                        "(wall-clock view; default: only threads on a CPU, py-spy's own test)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--tmp-dir", default=tempfile.gettempdir())
    args = parser.parse_args(argv)
    args.config = args.config or ["bulk-all-plain", "bulk-all-idem"]
    args.out.mkdir(parents=True, exist_ok=True)
    py_spy = find_py_spy()
    print(f"profiler: {py_spy or 'cProfile (py-spy not found)'}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    {"storage": profile_storage, "broker": profile_broker,
     "producer": profile_producer}[args.scenario](args, py_spy)
    return 0


if __name__ == "__main__":
    sys.exit(main())

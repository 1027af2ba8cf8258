"""Turning one harness run into JSON, a Markdown table, PNG plots and a console table.

Theory of operation
-------------------
The harness hands over one plain dict (`run`), already JSON-shaped: machine, disk, systems,
and per workload the per-system outcome (status, metrics or the reason there are none).
`rows()` pairs the metrics of eos and Kafka by their stable key and computes, per row:
- the ratio, oriented so that a ratio above 1 always means eos is better: eos/kafka for
  figures where higher is better (throughput), kafka/eos where lower is better (latency,
  duplicates). A zero denominator gives no ratio (never inf or nan);
- the verdict (`verdict`), from the two values themselves, so that it exists where the ratio
  does not: "eos 0 vs 1,234 duplicates" is eos better, both 0 is even;
- whether the two systems' run-to-run ranges (min-max of the metric's samples) overlap, in
  which case the verdict is within the noise of this machine.
`summary()` counts the verdicts of the rows that compare both systems, leaving out rows that
only restate another row in other units (MB/s next to records/s). Everything else here only
formats those rows; nothing is measured or recomputed.
"""
from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

SYSTEMS = ("eos", "kafka")
SYSTEM_NAMES = {"eos": "eos", "kafka": "Kafka"}
EOS_BETTER, KAFKA_BETTER, EVEN = "eos better", "Kafka better", "even"


def text_table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows of cells as left-aligned columns, two spaces apart (the standalone benches' tables)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def print_results(results: dict, table: str, json_only: bool) -> None:
    """A standalone bench's output: its JSON on stdout, then (unless --json-only) its table."""
    print(json.dumps(results, indent=2), flush=True)
    if not json_only:
        print(table, flush=True)


def write_run(out: Path, stem: str, latest_stem: str | None, run: dict, markdown: str) -> None:
    """A run's `<stem>.json` (the figures) and `<stem>.md` (the table) in `out`, and the same
    as `<latest_stem>.*` when given (a full run of both systems)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in (stem, latest_stem):
        if name is not None:
            (out / f"{name}.json").write_text(json.dumps(run, indent=2))
            (out / f"{name}.md").write_text(markdown)
    print(f"\nwrote {out / stem}.json and .md")


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def rows(run: dict) -> list[dict]:
    """One row per (workload, metric) with both systems' values, samples, the oriented
    ratio and the verdict."""
    out = []
    for workload in run["workloads"]:
        by_key: dict[str, dict] = {}
        order: list[str] = []
        status = {s: workload["results"].get(s, {}).get("status", "not run") for s in SYSTEMS}
        for system in SYSTEMS:
            outcome = workload["results"].get(system, {})
            for metric in outcome.get("metrics", []):
                if metric["key"] not in by_key:
                    order.append(metric["key"])
                    by_key[metric["key"]] = {"workload": workload["name"], **metric,
                                             "eos": None, "kafka": None,
                                             "samples": {"eos": [], "kafka": []}}
                row = by_key[metric["key"]]
                row[system] = metric["value"]
                row["samples"][system] = list(metric.get("samples") or [])
        for key in order:
            row = by_key[key]
            row.pop("value", None)
            if "restates" not in row:
                # Runs saved before metrics named what they restate: MB/s next to the
                # records/s of the same runs.
                sibling = key.removesuffix(".mb_per_s") + ".records_per_s"
                row["restates"] = sibling if key.endswith(".mb_per_s") and sibling in by_key \
                    else ""
            row["ratio"] = ratio(row["eos"], row["kafka"], row["higher_is_better"])
            row["verdict"] = verdict(row["eos"], row["kafka"], row["higher_is_better"])
            row["ranges_overlap"] = ranges_overlap(row["samples"]["eos"],
                                                   row["samples"]["kafka"])
            row["status"] = dict(status)
            out.append(row)
        if not order:
            out.append({"workload": workload["name"], "key": workload["name"],
                        "label": workload["title"], "unit": "", "higher_is_better": True,
                        "note": "", "eos": None, "kafka": None, "ratio": None,
                        "verdict": None, "ranges_overlap": None, "restates": "",
                        "samples": {"eos": [], "kafka": []}, "status": dict(status)})
    return out


def ratio(eos_value, kafka_value, higher_is_better: bool) -> float | None:
    """eos/kafka (higher is better) or kafka/eos (lower is better); None when either is
    missing or not a finite number, or either is 0: "0 duplicates against 1,234" has no
    finite ratio, and a ratio of 0 says nothing more (`verdict` answers those)."""
    if not (_finite(eos_value) and _finite(kafka_value)):
        return None
    numerator, denominator = ((eos_value, kafka_value) if higher_is_better
                              else (kafka_value, eos_value))
    if numerator == 0 or denominator == 0:
        return None
    return round(numerator / denominator, 3)


def verdict(eos_value, kafka_value, higher_is_better: bool) -> str | None:
    """EOS_BETTER, KAFKA_BETTER or EVEN from the values; None unless both are numbers."""
    if not (_finite(eos_value) and _finite(kafka_value)):
        return None
    if eos_value == kafka_value:
        return EVEN
    eos_ahead = eos_value > kafka_value if higher_is_better else eos_value < kafka_value
    return EOS_BETTER if eos_ahead else KAFKA_BETTER


def ranges_overlap(eos_samples: list, kafka_samples: list) -> bool | None:
    """Whether the min-max ranges of two systems' runs overlap; None without two samples
    on each side (one run says nothing about the spread)."""
    eos_values = [v for v in eos_samples if _finite(v)]
    kafka_values = [v for v in kafka_samples if _finite(v)]
    if len(eos_values) < 2 or len(kafka_values) < 2:
        return None
    return min(eos_values) <= max(kafka_values) and min(kafka_values) <= max(eos_values)


def compared(row: dict) -> bool:
    """Counted in the summary: both systems have a value and the row is not a restatement
    of another row of the same runs."""
    return row.get("verdict") is not None and not row.get("restates")


def summary(all_rows: list[dict]) -> dict:
    """Counts and rows of each verdict over the compared rows."""
    counted = [r for r in all_rows if compared(r)]
    return {
        "compared": len(counted),
        "ahead": [r for r in counted if r["verdict"] == EOS_BETTER],
        "behind": [r for r in counted if r["verdict"] == KAFKA_BETTER],
        "even": [r for r in counted if r["verdict"] == EVEN],
        "within_noise": [r for r in counted if r.get("ranges_overlap")],
        "one_run": [r for r in counted if r.get("ranges_overlap") is None],
    }


def _number(value) -> str:
    if not _finite(value):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) < 10:
        return f"{value:,.3f}".rstrip("0").rstrip(".") if value else "0"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"


def _cell(value, status: str) -> str:
    if value is not None:
        return _number(value)
    return {"ok": "-", "not available": "n/a", "lost": "LOST", "error": "error",
            "not run": "not run"}.get(status, status)


def _spread_cell(samples: list) -> str:
    """min–max (number of runs), or what there is instead."""
    values = [v for v in samples if _finite(v)]
    if len(values) >= 2:
        return f"{_number(min(values))}–{_number(max(values))} ({len(values)})"
    return "1 run" if values else "-"


def _ratio_cell(row: dict) -> str:
    if row.get("ratio") is not None:
        return f"{row['ratio']:.2f}x"
    if row.get("verdict") is None:
        return "-"
    values = f"eos {_number(row['eos'])} vs {_number(row['kafka'])}"
    return f"{values}: {row['verdict']}" if row["verdict"] != EVEN else f"{values}: even"


def _label(row: dict) -> str:
    """The label with its unit, unless the label already ends on it ("...: records/s") or
    names it before more words ("MB/s on disk", "MB/s (in-process)"); "every 100 ms: p50"
    still gets " (ms)"."""
    unit, label = row["unit"], row["label"]
    if not unit or re.search(rf"{re.escape(unit)}(\s\(|\s+on\b|$)", label):
        return label
    return f"{label} ({unit})"


def _row_name(row: dict) -> str:
    return f"{row['workload']}: {_label(row)}"


def summary_lines(all_rows: list[dict]) -> list[str]:
    """A few lines of Markdown: how many rows eos is ahead and behind on, and which."""
    counts = summary(all_rows)
    if not counts["compared"]:
        return ["No figure was measured on both systems."]
    lines = [f"eos is **ahead on {len(counts['ahead'])}** of the {counts['compared']} figures "
             f"measured on both systems, **behind on {len(counts['behind'])}**"
             + (f", even on {len(counts['even'])}" if counts["even"] else "")
             + " (MB/s rows that restate a records/s row are not counted twice)."]
    if counts["behind"]:
        lines.append("Behind: " + "; ".join(f"{_row_name(r)} {_ratio_cell(r)}"
                                            for r in counts["behind"]) + ".")
    if counts["within_noise"]:
        lines.append(f"Within the noise (the two systems' min–max over their runs overlap) on "
                     f"{len(counts['within_noise'])}: " + "; ".join(
                         f"{_row_name(r)} {_ratio_cell(r)}" for r in counts["within_noise"])
                     + ".")
    if counts["one_run"]:
        lines.append(f"{len(counts['one_run'])} of the compared figures come from a single run "
                     "on at least one side: their spread is unknown.")
    return lines


def _grouped(all_rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """Rows by workload, in run order."""
    groups: dict[str, list[dict]] = {}
    for row in all_rows:
        groups.setdefault(row["workload"], []).append(row)
    return list(groups.items())


def _notes(workload: dict) -> list[str]:
    notes = []
    for system in SYSTEMS:
        outcome = workload["results"].get(system)
        if outcome and outcome["status"] != "ok":
            notes.append(f"- {SYSTEM_NAMES[system]}: **{outcome['status']}** — "
                         f"{outcome.get('detail', '')}")
        elif outcome:
            details = list(dict.fromkeys(m["note"] for m in outcome["metrics"]
                                         if m.get("note")))
            if details:
                notes.append(f"- {SYSTEM_NAMES[system]}: " + "; ".join(details))
    return notes


def python_probe_sentence(figures: dict) -> str:
    """" Python speed probe ...": the host's speed for Python at the run's start and end
    (bench/host_speed.py), or "" for a run recorded before the probe existed."""
    start, end = figures.get("python_probe_ms_at_start"), figures.get("python_probe_ms_at_end")
    if start is None or end is None:
        return ""
    return (f" Python speed probe (a fixed pure-Python loop, median of 3, lower is faster): "
            f"{start:,.0f} ms at the start, {end:,.0f} at the end.")


def markdown(run: dict) -> str:
    machine = run["machine"]
    disk = run.get("disk") or {}
    all_rows = rows(run)
    repeats = run.get("sizes", {}).get("repeats")
    lines = [
        f"# eos vs Apache Kafka — {run['started_utc'][:10]} on {machine['hostname']}",
        "",
        "## Summary",
        "",
        *summary_lines(all_rows),
        "",
        f"Command: `{run['command']}` ({run['mode']} sizes; {run['duration_s']:.0f} s). "
        f"Machine: {machine['cpu_model']}, {machine['cores']} cores, "
        f"{machine['memory_gib']:.0f} GiB; Python {machine['python']}, {machine['java']}, "
        f"Kafka {run['systems'].get('kafka', {}).get('version') or 'n/a'} with confluent-kafka "
        f"{machine.get('confluent_kafka', '?')} (librdkafka {machine.get('librdkafka', '?')}); "
        f"eos at {machine['eos_commit']}. Load average (1/5/15 min) "
        f"{'/'.join(map(str, machine.get('loadavg_at_start', [])))} at the start, "
        f"{'/'.join(map(str, machine.get('loadavg_at_end', [])))} at the end."
        + python_probe_sentence(machine),
        "",
        "**Ratio = eos/Kafka where higher is better (throughput), Kafka/eos where lower is "
        "better (latency, duplicates): above 1 means eos is better.** "
        + (f"Each figure is the median of {repeats} runs" if repeats and repeats > 1
           else "Each figure is one run") +
        "; the min–max columns give the range over the runs (their number in brackets).",
        "",
    ]
    if disk:
        lines += [f"Raw sequential write of this disk ({disk['size_mib']} MiB in 1 MiB "
                  f"blocks, median of {len(disk['buffered_runs_mb_s'])}): "
                  f"{disk['buffered_mb_s']:,.0f} MB/s buffered, {disk['fsync_mb_s']:,.0f} "
                  f"MB/s with a final fsync.", ""]
    workloads = {w["name"]: w for w in run["workloads"]}
    for name, group in _grouped(all_rows):
        workload = workloads[name]
        elapsed = ", ".join(f"{SYSTEM_NAMES[s]} {o['elapsed_s']:.0f} s"
                            for s, o in workload["results"].items() if "elapsed_s" in o)
        lines += [f"## {name}: {workload['title']}" + (f" ({elapsed})" if elapsed else ""),
                  "",
                  "| metric | eos | eos min–max | Kafka | Kafka min–max | "
                  "eos/Kafka (>1 = eos better) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for row in group:
            lines.append(f"| {_label(row)} | "
                         f"{_cell(row['eos'], row['status']['eos'])} | "
                         f"{_spread_cell(row['samples']['eos'])} | "
                         f"{_cell(row['kafka'], row['status']['kafka'])} | "
                         f"{_spread_cell(row['samples']['kafka'])} | "
                         f"{_ratio_cell(row)} |")
        notes = _notes(workload)
        if notes:
            lines += ["", *notes]
        lines.append("")
    for system in SYSTEMS:
        info = run["systems"].get(system, {})
        if info.get("status") not in (None, "ok"):
            lines += [f"{system}: {info['status']} — {info.get('detail', '')}", ""]
    lines += ["Sizes: " + ", ".join(f"{k}={v}" for k, v in run["sizes"].items()), ""]
    return "\n".join(lines)


def console_table(run: dict) -> str:
    all_rows = rows(run)
    table = [("workload", "metric", "eos", "eos min-max", "kafka", "kafka min-max",
              "eos/kafka")]
    for name, group in _grouped(all_rows):
        for index, row in enumerate(group):
            table.append((name if index == 0 else "",
                          _label(row),
                          _cell(row["eos"], row["status"]["eos"]),
                          _spread_cell(row["samples"]["eos"]).replace("–", "-"),
                          _cell(row["kafka"], row["status"]["kafka"]),
                          _spread_cell(row["samples"]["kafka"]).replace("–", "-"),
                          _ratio_cell(row)))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    out = []
    for index, row in enumerate(table):
        out.append("  ".join(cell.ljust(widths[i]) if i < 2 else cell.rjust(widths[i])
                             for i, cell in enumerate(row)).rstrip())
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
    out.append("(eos/kafka > 1 means eos is better; where lower is better the ratio is "
               "kafka/eos; min-max over the runs, their number in brackets)")
    out += [""] + [line.replace("**", "") for line in summary_lines(all_rows)]
    return "\n".join(out)


def _plot_panels(all_rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """(title, rows) of each bar panel; rows of units without a panel of their own (counts
    such as duplicates) get one panel per unit."""
    def is_append(r: dict) -> bool:
        return r["workload"].startswith("append")

    measured = [r for r in all_rows if r["eos"] is not None or r["kafka"] is not None]
    panels = [
        ("Throughput (records/s, higher is better)", [r for r in measured
                                                     if r["unit"] == "records/s"
                                                     and not is_append(r)]),
        ("MB/s of values (higher is better)", [r for r in measured if r["unit"] == "MB/s"
                                               and not is_append(r)]),
        # Append rows (MB/s of .log bytes) get their own panel against the raw disk: the
        # in-process ones are an order of magnitude above any client's MB/s.
        ("Append: MB/s to .log files; red lines: raw disk (higher is better)",
         [r for r in measured if r["unit"] == "MB/s" and is_append(r)]),
        ("Latency (ms, lower is better)", [r for r in measured if r["unit"] == "ms"]),
    ]
    known = {"records/s", "MB/s", "ms", "ratio", ""}
    for unit in dict.fromkeys(r["unit"] for r in measured if r["unit"] not in known):
        unit_rows = [r for r in measured if r["unit"] == unit]
        directions = {("higher" if r["higher_is_better"] else "lower") for r in unit_rows}
        direction = f", {directions.pop()} is better" if len(directions) == 1 else ""
        panels.append((f"{unit[:1].upper()}{unit[1:]} ({unit}{direction})", unit_rows))
    return [(title, rs) for title, rs in panels if rs]


def plot(run: dict, path: Path) -> Path | None:
    """Bar charts of records/s, MB/s, latency, other units and the ratios, with the
    min-max of the runs as error bars; None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, MaxNLocator
    except ImportError:
        return None
    all_rows = rows(run)
    panels = _plot_panels(all_rows)
    # Rows that restate another (MB/s next to records/s) are left out of the ratios.
    ratio_rows = [r for r in all_rows if compared(r)]
    count = len(panels) + (1 if ratio_rows else 0)
    if count == 0:
        return None
    # Each panel as tall as its rows need (two bars a row; one bar a row for the ratios).
    heights = [max(1.8, 0.9 + 0.42 * len(rs)) for _title, rs in panels]
    if ratio_rows:
        heights.append(max(1.8, 0.9 + 0.26 * len(ratio_rows)))
    fig, axes = plt.subplots(count, 1, figsize=(11, sum(heights) + 0.6), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    colours = {"eos": "#2b7bba", "kafka": "#9a9a9a"}
    for ax, (title, panel_rows) in zip(axes[:, 0], panels):
        labels = [f"{r['workload']}: {r['label']}".replace(": records/s", "")
                  .replace(": MB/s", "") for r in panel_rows]
        positions = range(len(panel_rows))
        width = 0.4
        for offset, system in ((-width / 2, "eos"), (width / 2, "kafka")):
            values = [r[system] if _finite(r[system]) else 0 for r in panel_rows]
            low, high = [], []
            for r, value in zip(panel_rows, values):
                spread = [v for v in r["samples"][system] if _finite(v)]
                low.append(max(0.0, value - min(spread)) if len(spread) > 1 else 0.0)
                high.append(max(0.0, max(spread) - value) if len(spread) > 1 else 0.0)
            bars = ax.barh([p + offset for p in positions], values, height=width,
                           xerr=[low, high], error_kw={"elinewidth": 0.8, "capsize": 2},
                           label="eos" if system == "eos" else "Apache Kafka",
                           color=colours[system])
            for bar, r, top in zip(bars, panel_rows, high):
                text = _cell(r[system], r["status"][system])
                ax.text(bar.get_width() + top, bar.get_y() + bar.get_height() / 2,
                        f" {text}", va="center", fontsize=7)
        ax.set_yticks(list(positions))
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6))   # wide labels must not collide
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:,.0f}"))
        ax.legend(fontsize=8, loc="upper right", bbox_to_anchor=(1.0, 1.18), ncol=2,
                  frameon=False)
        ax.margins(x=0.15)
        if title.startswith("Append") and run.get("disk"):
            disk = run["disk"]
            for x, style, name in ((disk["buffered_mb_s"], "-", "raw disk, buffered"),
                                   (disk["buffered_mb_s"] / 2, ":", "half of it (issue 2 aim)"),
                                   (disk["fsync_mb_s"], "--", "raw disk, with fsync")):
                ax.axvline(x, color="#b22222", linestyle=style, linewidth=0.9)
                ax.text(x, 0.97, f"{name} {x:,.0f} ", fontsize=6, color="#b22222",
                        rotation=90, ha="right", va="top", transform=ax.get_xaxis_transform())
    if ratio_rows:
        _plot_ratios(axes[-1, 0], ratio_rows)
    fig.suptitle(f"eos vs Apache Kafka {run['systems'].get('kafka', {}).get('version') or ''} — "
                 f"{run['started_utc'][:10]}, {run['machine']['hostname']} "
                 f"({run['mode']}); whiskers: min-max of the runs", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _plot_ratios(ax, ratio_rows: list[dict]) -> None:
    """Log-scale bars from 1 to each ratio; a row without a ratio (a zero on one side) gets
    its verdict written at 1 instead of a bar."""
    ratios = [r["ratio"] for r in ratio_rows if r["ratio"] is not None and r["ratio"] > 0]
    extent = max([abs(math.log10(v)) for v in ratios] + [0.3]) * 1.25
    for y, row in enumerate(ratio_rows):
        value = row["ratio"]
        if value is not None and value > 0:
            ax.barh(y, value - 1.0, left=1.0,
                    color="#2b7bba" if value >= 1 else "#d9822b")
            ax.text(value, y, f" {value:.2f}x " if value >= 1 else f" {value:.2f}x ",
                    va="center", ha="left" if value >= 1 else "right", fontsize=7)
        else:
            ax.text(1.0, y, f" {_ratio_cell(row)}", va="center", ha="left", fontsize=7,
                    color="#2b7bba" if row["verdict"] == EOS_BETTER else "#d9822b")
    ax.set_xscale("log")
    ax.set_xlim(10 ** -extent, 10 ** extent)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(list(range(len(ratio_rows))))
    ax.set_yticklabels([_row_name(r) for r in ratio_rows], fontsize=8)
    ax.set_ylim(len(ratio_rows) - 0.5, -0.5)
    ax.set_title("eos relative to Kafka (> 1 means eos is better; log scale)", fontsize=10)


def rewrite(json_path: Path) -> list[Path]:
    """Regenerate the Markdown and PNG (and latest.*) of a saved run, e.g. after a change
    of format: ``python -m bench.report bench/results/latest.json``."""
    run = json.loads(json_path.read_text())
    run.pop("rows", None)
    stem = json_path.stem if json_path.stem != "latest" else \
        f"{run['started_utc'][:10]}-{run['machine']['hostname']}"
    return write(run, json_path.parent, stem)


def write(run: dict, out_dir: Path, stem: str) -> list[Path]:
    """stem.json, stem.md, stem.png in out_dir, each also copied to latest.*."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps({**run, "rows": rows(run)}, indent=2) + "\n")
    written.append(json_path)
    md_path = out_dir / f"{stem}.md"
    md_path.write_text(markdown(run))
    written.append(md_path)
    png_path = plot(run, out_dir / f"{stem}.png")
    if png_path is not None:
        written.append(png_path)
    for path in list(written):
        latest = out_dir / f"latest{path.suffix}"
        shutil.copyfile(path, latest)
        written.append(latest)
    return written


if __name__ == "__main__":
    import sys

    for argument in sys.argv[1:]:
        for written in rewrite(Path(argument)):
            print(f"wrote {written}")

"""Turning one harness run into JSON, a Markdown table, PNG plots and a console table.

Theory of operation
-------------------
The harness hands over one plain dict (`run`), already JSON-shaped: machine, disk, systems,
and per workload the per-system outcome (status, metrics or the reason there are none).
`rows()` pairs the metrics of eos and Kafka by their stable key and computes the ratio,
oriented so that a ratio above 1 always means eos is better: eos/kafka for figures where
higher is better (throughput), kafka/eos where lower is better (latency). Everything else
here only formats those rows; nothing is measured or recomputed.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

SYSTEMS = ("eos", "kafka")


def rows(run: dict) -> list[dict]:
    """One row per (workload, metric) with both systems' values and the oriented ratio."""
    out = []
    for workload in run["workloads"]:
        by_key: dict[str, dict] = {}
        order: list[str] = []
        for system in SYSTEMS:
            outcome = workload["results"].get(system, {})
            for metric in outcome.get("metrics", []):
                if metric["key"] not in by_key:
                    order.append(metric["key"])
                    by_key[metric["key"]] = {"workload": workload["name"], **metric,
                                             "eos": None, "kafka": None}
                by_key[metric["key"]][system] = metric["value"]
        for key in order:
            row = by_key[key]
            row.pop("value", None)
            row["ratio"] = ratio(row["eos"], row["kafka"], row["higher_is_better"])
            row["status"] = {s: workload["results"].get(s, {}).get("status", "not run")
                             for s in SYSTEMS}
            out.append(row)
        if not order:
            out.append({"workload": workload["name"], "key": workload["name"],
                        "label": workload["title"], "unit": "", "higher_is_better": True,
                        "note": "", "eos": None, "kafka": None, "ratio": None,
                        "status": {s: workload["results"].get(s, {}).get("status", "not run")
                                   for s in SYSTEMS}})
    return out


def ratio(eos_value, kafka_value, higher_is_better: bool) -> float | None:
    if eos_value is None or kafka_value is None:
        return None
    numerator, denominator = ((eos_value, kafka_value) if higher_is_better
                              else (kafka_value, eos_value))
    if denominator == 0:
        return None
    return round(numerator / denominator, 3)


def _cell(value, status: str) -> str:
    if value is not None:
        if isinstance(value, float) and abs(value) < 10:
            return f"{value:,.3f}".rstrip("0").rstrip(".") if value else "0"
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"
    return {"ok": "-", "not available": "n/a", "lost": "LOST", "error": "error",
            "not run": "not run"}.get(status, status)


def _ratio_cell(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def markdown(run: dict) -> str:
    machine = run["machine"]
    disk = run.get("disk") or {}
    lines = [
        f"# eos vs Apache Kafka — {run['started_utc'][:10]} on {machine['hostname']}",
        "",
        f"Command: `{run['command']}` ({run['mode']} sizes; {run['duration_s']:.0f} s). "
        f"Machine: {machine['cpu_model']}, {machine['cores']} cores, "
        f"{machine['memory_gib']:.0f} GiB; Python {machine['python']}, {machine['java']}, "
        f"Kafka {run['systems'].get('kafka', {}).get('version') or 'n/a'} with confluent-kafka "
        f"{machine.get('confluent_kafka', '?')} (librdkafka {machine.get('librdkafka', '?')}); "
        f"eos at {machine['eos_commit']}. Load average (1/5/15 min) "
        f"{'/'.join(map(str, machine.get('loadavg_at_start', [])))} at the start, "
        f"{'/'.join(map(str, machine.get('loadavg_at_end', [])))} at the end.",
        "",
        "**Ratio = eos/Kafka for throughput, Kafka/eos for latency: above 1 means eos is "
        "better.**",
        "",
    ]
    if disk:
        lines += [f"Raw sequential write of this disk ({disk['size_mib']} MiB in 1 MiB "
                  f"blocks, median of {len(disk['buffered_runs_mb_s'])}): "
                  f"{disk['buffered_mb_s']:,.0f} MB/s buffered, {disk['fsync_mb_s']:,.0f} "
                  f"MB/s with a final fsync.", ""]
    lines += ["| workload | metric | eos | Kafka | eos/Kafka (>1 = eos better) |",
              "| --- | --- | ---: | ---: | ---: |"]
    for row in rows(run):
        unit = f" ({row['unit']})" if row["unit"] and row["unit"] not in row["label"] else ""
        lines.append(f"| {row['workload']} | {row['label']}{unit} | "
                     f"{_cell(row['eos'], row['status']['eos'])} | "
                     f"{_cell(row['kafka'], row['status']['kafka'])} | "
                     f"{_ratio_cell(row['ratio'])} |")
    notes = []
    for workload in run["workloads"]:
        for system in SYSTEMS:
            outcome = workload["results"].get(system)
            if outcome and outcome["status"] != "ok":
                notes.append(f"- {workload['name']} on {system}: **{outcome['status']}** — "
                             f"{outcome.get('detail', '')}")
            elif outcome:
                details = list(dict.fromkeys(m["note"] for m in outcome["metrics"]
                                             if m.get("note")))
                if details:
                    notes.append(f"- {workload['name']} on {system}: " + "; ".join(details))
    if notes:
        lines += ["", "Notes:", ""] + notes
    for system in SYSTEMS:
        info = run["systems"].get(system, {})
        if info.get("status") not in (None, "ok"):
            lines += ["", f"{system}: {info['status']} — {info.get('detail', '')}"]
    lines += ["", "Sizes: " + ", ".join(f"{k}={v}" for k, v in run["sizes"].items()), ""]
    return "\n".join(lines)


def console_table(run: dict) -> str:
    table = [("workload", "metric", "eos", "kafka", "eos/kafka")]
    for row in rows(run):
        table.append((row["workload"], f"{row['label']} [{row['unit']}]" if row["unit"] else
                      row["label"], _cell(row["eos"], row["status"]["eos"]),
                      _cell(row["kafka"], row["status"]["kafka"]), _ratio_cell(row["ratio"])))
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    out = []
    for index, row in enumerate(table):
        out.append("  ".join(cell.ljust(widths[i]) if i < 2 else cell.rjust(widths[i])
                             for i, cell in enumerate(row)))
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
    out.append("(eos/kafka > 1 means eos is better; for latency the ratio is kafka/eos)")
    return "\n".join(out)


def plot(run: dict, path: Path) -> Path | None:
    """Bar charts of records/s, MB/s, latency and the ratios; None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, MaxNLocator
    except ImportError:
        return None
    all_rows = rows(run)
    # Append rows (MB/s of .log bytes) get their own panel against the raw disk: the
    # in-process ones are an order of magnitude above any client's MB/s.
    def is_append(r: dict) -> bool:
        return r["workload"].startswith("append")

    panels = [
        ("Throughput (records/s, higher is better)", [r for r in all_rows
                                                     if r["unit"] == "records/s"
                                                     and not is_append(r)]),
        ("MB/s of values (higher is better)", [r for r in all_rows if r["unit"] == "MB/s"
                                               and not is_append(r)]),
        ("Append: MB/s written to .log files; lines: raw disk write (higher is better)",
         [r for r in all_rows if r["unit"] == "MB/s" and is_append(r)]),
        ("Latency (ms, lower is better)", [r for r in all_rows if r["unit"] == "ms"]),
    ]
    panels = [(title, rs) for title, rs in panels if rs]
    # MB/s of values repeats records/s for the same run, so it is left out of the ratios.
    ratio_rows = [r for r in all_rows if r["ratio"] is not None
                  and (r["unit"] != "MB/s" or r["workload"] == "append-client")]
    count = len(panels) + (1 if ratio_rows else 0)
    if count == 0:
        return None
    fig, axes = plt.subplots(count, 1, figsize=(11, 3.2 * count + 0.6), squeeze=False)
    colours = {"eos": "#2b7bba", "kafka": "#9a9a9a"}
    for ax, (title, panel_rows) in zip(axes[:, 0], panels):
        labels = [f"{r['workload']}: {r['label']}".replace(": records/s", "")
                  .replace(": MB/s", "") for r in panel_rows]
        positions = range(len(panel_rows))
        width = 0.4
        for offset, system in ((-width / 2, "eos"), (width / 2, "kafka")):
            values = [r[system] or 0 for r in panel_rows]
            bars = ax.barh([p + offset for p in positions], values, height=width,
                           label="eos" if system == "eos" else "Apache Kafka",
                           color=colours[system])
            for bar, r in zip(bars, panel_rows):
                text = _cell(r[system], r["status"][system])
                ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {text}",
                        va="center", fontsize=7)
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
        ax = axes[-1, 0]
        labels = [f"{r['workload']}: {r['label']}" for r in ratio_rows]
        values = [r["ratio"] for r in ratio_rows]
        ax.barh(range(len(values)), values,
                color=["#2b7bba" if v >= 1 else "#d9822b" for v in values])
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_yticks(list(range(len(values))))
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_title("eos relative to Kafka (> 1 means eos is better)", fontsize=10)
        for y, v in enumerate(values):
            ax.text(v, y, f" {v:.2f}x", va="center", fontsize=7)
        ax.margins(x=0.15)
    fig.suptitle(f"eos vs Apache Kafka {run['systems'].get('kafka', {}).get('version') or ''} — "
                 f"{run['started_utc'][:10]}, {run['machine']['hostname']} "
                 f"({run['mode']})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


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

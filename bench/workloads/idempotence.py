"""Idempotent against plain produce, back to back in the same run.

The same producer path on fresh topics, acks=all every time, alternating without and with
idempotence (`Sizes.repeats` pairs). The plain and idempotent figures are the medians of
their runs; the overhead figure is the median over the pairs of idempotent records/s over
plain records/s (1.0 means no overhead; issue 3 aims for eos at 0.95 or better). The bulk
path is used where the client has one, since its per-record cost is lowest and so shows the
overhead most clearly.
"""
from __future__ import annotations

from bench.workloads import (Metric, NotAvailable, RunContext, Workload, median_low,
                             register)
from bench.workloads import produce
from bench.workloads.clients import require_client

PAIRS = (("bulk-all-plain", "bulk-all-idem"), ("send-all-plain", "send-all-idem"))


def run(ctx: RunContext) -> list[Metric]:
    require_client(ctx)
    for plain_key, idem_key in PAIRS:
        plain_runs, idem_runs = [], []
        try:
            for _ in range(ctx.sizes.repeats):
                ctx.progress(f"  idempotence: {produce.CONFIGS[plain_key].label}")
                plain_runs.append(produce.measure_once(ctx, produce.CONFIGS[plain_key]))
                ctx.progress(f"  idempotence: {produce.CONFIGS[idem_key].label}")
                idem_runs.append(produce.measure_once(ctx, produce.CONFIGS[idem_key]))
        except NotAvailable:
            if plain_runs:
                raise
            continue
        plain, idem = produce.median_run(plain_runs), produce.median_run(idem_runs)
        # Each pair ran back to back under the same load: the ratio is per pair, then the
        # median of the pairs (not median over median, which may mix two load levels).
        pair_ratios = [round(i.records_per_s / p.records_per_s, 4)
                       for p, i in zip(plain_runs, idem_runs)]
        ratio = median_low(pair_ratios)
        ctx.progress(f"  idempotence: median plain {plain.records_per_s:,.0f} records/s, "
                     f"idempotent {idem.records_per_s:,.0f}: ratio {ratio:.3f} "
                     f"({(1 - ratio) * 100:+.1f}% overhead)")
        note = (f"medians of {len(plain_runs)} alternating runs ({plain.config.path} path); "
                f"ratio: median of the pairs' ratios, {(1 - ratio) * 100:.1f}% overhead")
        return [
            Metric("idempotence.plain_records_per_s", "acks=all plain: records/s",
                   round(plain.records_per_s), "records/s", True, note,
                   samples=tuple(round(r.records_per_s) for r in plain_runs)),
            Metric("idempotence.idem_records_per_s", "acks=all idempotent: records/s",
                   round(idem.records_per_s), "records/s", True, note,
                   samples=tuple(round(r.records_per_s) for r in idem_runs)),
            Metric("idempotence.idem_over_plain", "idempotent / plain throughput",
                   ratio, "ratio", True, note, samples=tuple(pair_ratios)),
        ]
    raise NotAvailable("no produce path to compare idempotent and plain with")


register(Workload("idempotence", "Idempotent vs plain produce overhead",
                  {"kafka": run, "eos": run}))

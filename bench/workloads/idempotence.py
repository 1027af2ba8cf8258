"""Idempotent against plain produce, back to back in the same run.

The same producer path on fresh topics, acks=all every time, alternating without and with
idempotence (`Sizes.repeats` pairs; medians compared). The figure is idempotent records/s over plain records/s (1.0
means no overhead; issue 3 aims for eos at 0.95 or better). The bulk path is used where the
client has one, since its per-record cost is lowest and so shows the overhead most clearly.
"""
from __future__ import annotations

from bench.workloads import Metric, NotAvailable, RunContext, Workload, register
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
        ratio = idem.records_per_s / plain.records_per_s
        ctx.progress(f"  idempotence: median plain {plain.records_per_s:,.0f} records/s, "
                     f"idempotent {idem.records_per_s:,.0f}: ratio {ratio:.3f} "
                     f"({(1 - ratio) * 100:+.1f}% overhead)")
        note = (f"medians of {len(plain_runs)} alternating runs; {(1 - ratio) * 100:.1f}% "
                f"overhead ({plain.config.path} path)")
        return [
            Metric("idempotence.plain_records_per_s", "acks=all plain: records/s",
                   round(plain.records_per_s), "records/s", True, note),
            Metric("idempotence.idem_records_per_s", "acks=all idempotent: records/s",
                   round(idem.records_per_s), "records/s", True, note),
            Metric("idempotence.idem_over_plain", "idempotent / plain throughput",
                   round(ratio, 4), "ratio", True, note),
        ]
    raise NotAvailable("no produce path to compare idempotent and plain with")


register(Workload("idempotence", "Idempotent vs plain produce overhead",
                  {"kafka": run, "eos": run}))

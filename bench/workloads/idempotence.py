"""Idempotent against plain produce, back to back in the same run.

The same producer path twice on fresh topics, acks=all both times: first without
idempotence, then with it. The figure is idempotent records/s over plain records/s (1.0
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
        try:
            plain = produce.RUNNERS[ctx.system](ctx, produce.CONFIGS[plain_key])
        except NotAvailable:
            continue
        ctx.progress(f"  idempotence: plain {plain.records_per_s:,.0f} records/s")
        idem = produce.RUNNERS[ctx.system](ctx, produce.CONFIGS[idem_key])
        ratio = idem.records_per_s / plain.records_per_s
        ctx.progress(f"  idempotence: idempotent {idem.records_per_s:,.0f} records/s, "
                     f"ratio {ratio:.3f} ({(1 - ratio) * 100:+.1f}% overhead)")
        note = (f"plain {plain.records_per_s:,.0f}/s, idempotent {idem.records_per_s:,.0f}/s: "
                f"{(1 - ratio) * 100:.1f}% overhead ({plain.config.path} path)")
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

"""Order enrichment: a stream of orders joined with a static customers table, exactly once.

    python examples/order_enrichment.py                 # embedded broker, 10,000 orders
    python examples/order_enrichment.py --bootstrap 127.0.0.1:9092 --orders 50000

Orders arrive on `orders` as JSON ({"order_id", "customer_id", "amount_cents"}, keyed by
customer). One stage joins them with a static customers table (name, tier, country) and
writes JSON to `orders_enriched`, keyed by customer, through the exactly-once sink: every
order appears there once, whatever crashes. The program seeds the orders, drains them
with `app.run(available_now=True)`, and prints what a read_committed reader sees.
"""
from __future__ import annotations

import argparse
import json
import tempfile

from _embedded import broker, ensure_topics

import eos

CUSTOMERS = [  # customer_id, name, tier, country
    (1, "Ada", "gold", "UK"), (2, "Grace", "silver", "US"), (3, "Edsger", "bronze", "NL"),
    (4, "Barbara", "gold", "US"), (5, "Donald", "silver", "US"), (6, "Frances", "gold", "US"),
    (7, "Tony", "bronze", "UK"), (8, "Leslie", "silver", "US"),
]


def seed_orders(bootstrap: str, count: int) -> None:
    keys, values = [], []
    for order_id in range(count):
        customer_id = CUSTOMERS[order_id % len(CUSTOMERS)][0]
        keys.append(str(customer_id).encode())
        values.append(json.dumps({"order_id": order_id, "customer_id": customer_id,
                                  "amount_cents": 100 + (order_id * 37) % 9900}).encode())
    with eos.Producer(bootstrap) as producer:
        producer.send_batch("orders", values, keys=keys).result(120)


def build_app(bootstrap: str, checkpoint_dir: str) -> eos.App:
    from pyspark.sql import functions as F

    app = eos.App(bootstrap=bootstrap, checkpoint_dir=checkpoint_dir, max_records_per_trigger=5000)

    @app.stage(source="orders", sink="orders_enriched", group="enricher")
    def enrich(orders):
        customers = orders.sparkSession.createDataFrame(
            CUSTOMERS, "customer_id int, name string, tier string, country string")
        order = F.from_json(F.col("value").cast("string"),
                            "order_id long, customer_id int, amount_cents long").alias("o")
        enriched = orders.select(order).select("o.*").join(F.broadcast(customers), "customer_id")
        return enriched.select(
            F.col("customer_id").cast("string").alias("key"),
            F.to_json(F.struct("order_id", "customer_id", "name", "tier", "country", "amount_cents")).alias("value"))

    return app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", default=None, help="an eos broker (default: start an embedded one)")
    parser.add_argument("--orders", type=int, default=10_000)
    args = parser.parse_args()
    with broker(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory(prefix="eos-checkpoints-") as checkpoints:
        ensure_topics(bootstrap, 3, "orders", "orders_enriched")
        seed_orders(bootstrap, args.orders)
        app = build_app(bootstrap, checkpoints)
        app.run(available_now=True)

        from spark_sink.readback import read_committed

        enriched = [json.loads(r.value) for r in read_committed(bootstrap, "orders_enriched")]
        by_tier: dict[str, int] = {}
        for order in enriched:
            by_tier[order["tier"]] = by_tier.get(order["tier"], 0) + order["amount_cents"]
        print(f"\n{len(enriched):,} enriched orders (read_committed), "
              f"{len({o['order_id'] for o in enriched}):,} distinct")
        print("e.g.", enriched[0])
        for tier, cents in sorted(by_tier.items()):
            print(f"  revenue from {tier:6} customers: {cents / 100:12,.2f}")
        return 0 if len(enriched) == len({o["order_id"] for o in enriched}) else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""``orders``: the reference pipeline with non-additive state, written against the public API only
(what the README's "Your first pipeline" teaches; nothing here reaches into checkpoint_lib's
internals).

- input ``landing/orders``: ``order_id string, customer string, amount_cents long, ts timestamp``.
  Upstream retries: the same order may land again (same id, same values), in the same batch or a
  later one.
- ``gold/orders``: each order once (the first time its id is seen), exactly once;
- ``gold/order_duplicates``: every repeat of an id seen before, with its offset: nothing is lost;
- ``gold/customers``: per customer, upserted: ``orders`` (distinct), ``max_amount_cents`` (lifetime),
  ``last_order_id`` / ``last_order_ts`` (the latest order by ``ts``; a tie goes to the later one);
- ``dlq/orders``: rows without id, customer, amount or time, or a non-positive amount.

The state per customer is *replaced* at every flush (``state_update = "replace"``): the counters,
the last order, and the ids seen within ``retention`` of the customer's latest order (a map from
id to order time; older ids are forgotten, so the state stays bounded: an id that comes back after
the retention window counts as a new order).
"""

from __future__ import annotations

import random
from datetime import datetime, timezone
from typing import Any

from ..pipeline import DeltaSink, DeltaSource, Pipeline
from ..quality.spec import QualitySpec, count_rows

SOURCE_SCHEMA = "order_id string, customer string, amount_cents long, ts timestamp"
OFFSETS = ("src_version", "src_file", "src_row")
RETENTION_S = 7 * 86_400
START = datetime(2026, 3, 1, tzinfo=timezone.utc)


def order_errors(df: Any) -> Any:
    """Why a landing row is bad (null when it is good)."""
    from pyspark.sql import functions as F

    return (
        F.when(F.col("order_id").isNull(), F.lit("null order_id"))
        .when(F.col("customer").isNull() | (F.trim(F.col("customer")) == ""), F.lit("null or empty customer"))
        .when(F.col("amount_cents").isNull(), F.lit("null amount_cents"))
        .when(F.col("amount_cents") <= 0, F.lit("amount_cents must be positive"))
        .when(F.col("ts").isNull(), F.lit("null ts"))
    )


class CustomerOrders:
    """Deduplicates orders by id within ``retention_s`` and keeps each customer's counters."""

    state_schema = ("orders long, max_amount_cents long, last_order_id string, last_order_ts timestamp, "
                    "seen map<string, timestamp>")
    state_update = "replace"
    order_by = OFFSETS

    def __init__(self, retention_s: int = RETENTION_S):
        self.retention_s = int(retention_s)

    def apply(self, records: Any, state: Any, key: str) -> tuple[Any, dict[str, Any]]:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        # a repeat: an id the customer's state has seen, or a later copy within this flush
        first_in_flush = F.row_number().over(Window.partitionBy(key, "order_id").orderBy(*OFFSETS)) == 1
        seen_before = F.col("prior_seen")[F.col("order_id")].isNotNull()
        marked = (records.join(state.select(key, F.col("seen").alias("prior_seen")), key, "left")
                  .withColumn("repeat", F.coalesce(seen_before, F.lit(False)) | ~first_in_flush))
        fresh = marked.where(~F.col("repeat"))
        repeats = marked.where(F.col("repeat")).select("order_id", key, "amount_cents", "ts", *OFFSETS)

        flush = fresh.groupBy(key).agg(
            F.count(F.lit(1)).alias("new_orders"),
            F.max("amount_cents").alias("flush_max"),
            F.max_by(F.struct("order_id", "ts"), F.struct("ts", *OFFSETS)).alias("flush_last"),
            F.map_from_entries(F.collect_list(F.struct("order_id", "ts"))).alias("flush_seen"),
        )
        take_flush = F.col("last_order_ts").isNull() | (F.col("flush_last.ts") >= F.col("last_order_ts"))
        last_ts = F.when(take_flush, F.col("flush_last.ts")).otherwise(F.col("last_order_ts"))
        no_ids = F.map_from_arrays(F.array().cast("array<string>"), F.array().cast("array<timestamp>"))
        horizon = last_ts - F.expr(f"INTERVAL {self.retention_s} SECONDS")
        customers = flush.join(state, key, "left").select(
            key,
            (F.coalesce("orders", F.lit(0)) + F.col("new_orders")).alias("orders"),
            F.greatest(F.coalesce("max_amount_cents", F.col("flush_max")), F.col("flush_max")).alias("max_amount_cents"),
            F.when(take_flush, F.col("flush_last.order_id")).otherwise(F.col("last_order_id")).alias("last_order_id"),
            last_ts.alias("last_order_ts"),
            F.map_filter(F.map_concat(F.coalesce("seen", no_ids), "flush_seen"),
                         lambda _id, ts: ts >= horizon).alias("seen"),
        )
        return customers, {
            "orders": fresh.select("order_id", key, "amount_cents", "ts"),
            "duplicates": repeats,
            "customers": customers.drop("seen"),
        }


def quality_spec() -> QualitySpec:
    """Each distinct valid order once in ``gold/orders``; per customer, the order count of state,
    sink and source agree (the source's repeats counted once: the generator repeats an order
    within a day, far inside the retention)."""

    def distinct_orders(ctx: Any, valid: Any) -> Any:
        return valid.dropDuplicates(["order_id"])

    def invariants() -> dict[str, list[Any]]:
        """The pipeline's own, GX-native (imported only when a validation runs)."""
        import great_expectations as gx

        return {
            "customers": [
                gx.expectations.ExpectColumnValuesToBeUnique(column="customer"),
                gx.expectations.ExpectColumnValuesToBeBetween(column="orders", min_value=1),
                gx.expectations.ExpectColumnValuesToNotBeNull(column="last_order_id"),
            ],
            "orders": [gx.expectations.ExpectColumnValuesToBeBetween(column="amount_cents", min_value=1)],
        }

    return QualitySpec(
        pipeline="orders",
        event_sink="orders",
        event_id="order_id",
        event_columns=("customer", "amount_cents"),
        key_sink="customers",
        aggregates={"orders": count_rows},
        source_records=distinct_orders,
        distinct_events=True,
        expectations=invariants,
    )


def build() -> Pipeline:
    return (
        Pipeline("orders")
        .source(DeltaSource("landing/orders", SOURCE_SCHEMA, validate=order_errors), parallelism=2)
        .key_by("customer", parallelism=3)
        .process(CustomerOrders(), uid="customer_orders")
        .sink("orders", DeltaSink("gold/orders", "order_id string, customer string, amount_cents long, ts timestamp"))
        .sink("duplicates", DeltaSink(
            "gold/order_duplicates",
            "order_id string, customer string, amount_cents long, ts timestamp, "
            "src_version long, src_file string, src_row long"))
        .sink("customers", DeltaSink(
            "gold/customers",
            "customer string, orders long, max_amount_cents long, last_order_id string, last_order_ts timestamp",
            mode="upsert", keys=("customer",)))
        .dead_letters("dlq/orders")
        .generator(generate)
        .quality(quality_spec())
    )


def generate(spark: Any, warehouse: str, rows: int, *, bad_fraction: float = 0.0, seed: int | None = None,
             customers: int = 100, repeat_fraction: float = 0.1) -> int:
    """Append ``rows`` orders to ``landing/orders`` as one new table version; returns it.

    Batch ``b`` (the table's next version) holds orders ``o<b>-<n>``, each a pure function of
    ``(b, n)`` (customer, amount, a time on day ``b``), so about ``repeat_fraction`` of the rows can
    repeat an order exactly: one of this batch's, or one of the previous batch's. About
    ``bad_fraction`` are bad (null customer or a zero amount)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError
    from pyspark.sql import functions as F

    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    path = f"{warehouse.rstrip('/')}/landing/orders"
    try:
        batch = DeltaTable(path).version() + 1
    except TableNotFoundError:
        batch = 0
    seed = random.randrange(2**31) if seed is None else seed
    u = F.rand(seed)
    repeat_earlier = (u < repeat_fraction / 2) & (F.lit(batch) > 0)
    df = (
        spark.range(rows, numPartitions=2).withColumn("u", u)
        .withColumn("b", F.when(repeat_earlier, F.lit(batch - 1)).otherwise(F.lit(batch)))
        .withColumn("n", F.when(repeat_earlier, F.pmod("id", F.lit(50)))
                    .when(F.col("u") < repeat_fraction, F.floor(F.col("id") / 2)).otherwise(F.col("id")))
        .select(
            F.format_string("o%d-%d", "b", "n").alias("order_id"),
            F.format_string("cust-%04d", F.pmod(F.xxhash64("b", "n"), F.lit(customers))).alias("customer"),
            (F.pmod(F.xxhash64("b", "n", F.lit(1)), F.lit(100_000)) + 1).alias("amount_cents"),
            F.timestamp_seconds(F.lit(int(START.timestamp())) + F.col("b") * 86_400 + F.col("n")).alias("ts"),
            F.rand(seed + 1).alias("bad"),
        )
    )
    if bad_fraction > 0:
        df = (df.withColumn("customer", F.when(F.col("bad") < bad_fraction / 2, F.lit(None)).otherwise(F.col("customer")))
              .withColumn("amount_cents", F.when((F.col("bad") >= bad_fraction / 2) & (F.col("bad") < bad_fraction),
                                                 F.lit(0)).otherwise(F.col("amount_cents"))))
    df.drop("bad").write.format("delta").mode("append").save(path)
    return DeltaTable(path).version()

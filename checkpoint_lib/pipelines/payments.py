"""``payments``: the reference pipeline (tests and benchmarks use it; names and schemas are fixed).

- input ``landing/payments``: ``event_id string, account string, amount_cents long, ts timestamp``
- ``gold/ledger``: one row per valid event, exactly once, with the account's balance after it
- ``gold/balances``: per account, the sum and count of its valid events (upserted)
- ``dlq/payments``: bad rows (null event id, account or amount) with the reason and source offset

Events of one account are applied in source-offset order (table version, file, row), which is
the order the ledger's ``balance_after_cents`` follows.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping

from ..pipeline import DeltaSink, DeltaSource, Pipeline
from ..quality.spec import QualitySpec, count_rows, sum_of

SOURCE_SCHEMA = {"event_id": "string", "account": "string", "amount_cents": "long", "ts": "timestamp"}
LEDGER_SCHEMA = (
    ("event_id", "string"), ("account", "string"), ("amount_cents", "long"), ("balance_after_cents", "long"),
)
BALANCES_SCHEMA = (("account", "string"), ("balance_cents", "long"), ("event_count", "long"))


def payment_errors(df: Any) -> Any:
    """The reason a landing row is bad, or null."""
    from pyspark.sql import functions as F

    return (
        F.when(F.col("event_id").isNull(), F.lit("null event_id"))
        .when(F.col("account").isNull() | (F.trim(F.col("account")) == ""), F.lit("null or empty account"))
        .when(F.col("amount_cents").isNull(), F.lit("null amount_cents"))
    )


class RunningBalance:
    """Keeps ``balance_cents`` and ``event_count`` per account; emits ledger rows and balances.
    Additive state: the state it returns is what the flush adds to each account."""

    state_schema = "balance_cents long, event_count long"
    order_by = ("src_version", "src_file", "src_row")

    def apply(self, records: Any, state: Any, key: str) -> tuple[Any, Mapping[str, Any]]:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        prior = state.select(
            F.col(key), F.col("balance_cents").alias("prior_balance"), F.col("event_count").alias("prior_count")
        )
        joined = records.join(prior, key, "left").fillna(0, ["prior_balance", "prior_count"])
        running = Window.partitionBy(key).orderBy(*self.order_by).rowsBetween(Window.unboundedPreceding, 0)
        ledger = joined.select(
            "event_id", key, "amount_cents",
            (F.col("prior_balance") + F.sum("amount_cents").over(running)).alias("balance_after_cents"),
        )
        per_key = joined.groupBy(key, "prior_balance", "prior_count").agg(
            F.sum("amount_cents").alias("balance_cents"), F.count(F.lit(1)).alias("event_count")
        )
        deltas = per_key.select(key, "balance_cents", "event_count")
        balances = per_key.select(
            key,
            (F.col("prior_balance") + F.col("balance_cents")).alias("balance_cents"),
            (F.col("prior_count") + F.col("event_count")).alias("event_count"),
        )
        return deltas, {"ledger": ledger, "balances": balances}


def account_digits(accounts: int) -> int:
    """Digits of a generated account number (``acct-000042``): 6, or more so that ``accounts``
    distinct numbers never collide (Spark's ``lpad`` cuts a longer string to the width)."""
    return max(6, len(str(max(accounts, 1) - 1)))


def quality_spec() -> QualitySpec:
    """What the quality suites check of this pipeline (checkpoint_lib.quality.spec)."""
    return QualitySpec(
        pipeline="payments",
        event_sink="ledger",
        event_id="event_id",
        event_columns=("account", "amount_cents"),
        key_sink="balances",
        aggregates={"balance_cents": sum_of("amount_cents"), "event_count": count_rows},
    )


def running_balances(name: str, source: Any, *, ledger: str, balances: str, dead_letters: str,
                     parallelism: tuple[int, int] = (2, 3)) -> Pipeline:
    """A pipeline of payments' shape over any ``source`` of payments: keyed by account, running
    balances, a ledger (append) and the balances (upsert). ``parallelism``: (source, operator)."""
    return (
        Pipeline(name)
        .source(source, parallelism=parallelism[0])
        .key_by("account", parallelism=parallelism[1])
        .process(RunningBalance(), uid="balance")
        .sink("ledger", DeltaSink(ledger, LEDGER_SCHEMA))
        .sink("balances", DeltaSink(balances, BALANCES_SCHEMA, mode="upsert", keys=("account",)))
        .dead_letters(dead_letters)
    )


def build() -> Pipeline:
    return (
        running_balances("payments", DeltaSource("landing/payments", SOURCE_SCHEMA, validate=payment_errors),
                         ledger="gold/ledger", balances="gold/balances", dead_letters="dlq/payments")
        .generator(generate)
        .quality(quality_spec())
    )


def generate(
    spark: Any,
    warehouse: str,
    rows: int,
    *,
    bad_fraction: float = 0.0,
    accounts: int = 1000,
    seed: int | None = None,
    files: int = 2,
) -> int:
    """Append ``rows`` payment events to ``warehouse/landing/payments`` as one new table version.

    Generated in Spark (no data through the driver): event ids are unique across calls (they carry
    the version being written), amounts are in -50_000..50_000 cents, and about ``bad_fraction``
    of the rows have a null account or a null amount. Returns the new table version.
    """
    from pyspark.sql import functions as F

    from ..delta.log import latest_version

    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    if not 0.0 <= bad_fraction <= 1.0:
        raise ValueError(f"bad_fraction must be within 0..1, got {bad_fraction}")
    path = f"{warehouse.rstrip('/')}/landing/payments"
    previous = latest_version(path)
    batch = 0 if previous is None else previous + 1
    seed = random.randrange(2**31) if seed is None else seed
    start = datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(days=batch)
    r = F.rand(seed)
    df = (
        spark.range(rows, numPartitions=max(1, files))
        .withColumn("u", r)
        .select(
            F.concat(F.lit(f"b{batch}-"), F.col("id").cast("string")).alias("event_id"),
            F.concat(F.lit("acct-"), F.lpad(F.pmod(F.xxhash64(F.col("id"), F.lit(seed)), F.lit(accounts)).cast("string"), account_digits(accounts), "0")).alias("account"),
            (F.pmod(F.xxhash64(F.col("id"), F.lit(seed + 1)), F.lit(100_001)) - F.lit(50_000)).cast("long").alias("amount_cents"),
            F.timestamp_seconds(F.lit(int(start.timestamp())) + F.col("id")).alias("ts"),
            "u",
        )
    )
    if bad_fraction > 0:
        half = bad_fraction / 2
        df = df.withColumn("account", F.when(F.col("u") < half, F.lit(None)).otherwise(F.col("account")))
        df = df.withColumn(
            "amount_cents",
            F.when((F.col("u") >= half) & (F.col("u") < bad_fraction), F.lit(None)).otherwise(F.col("amount_cents")),
        )
    df.drop("u").write.format("delta").mode("append").save(path)
    return latest_version(path) or 0

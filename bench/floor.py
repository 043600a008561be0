"""The floor: one plain PySpark batch job computing the payments outputs in one pass.

No fault tolerance, no state between runs, no two-phase commit: it reads the whole landing table
and overwrites ``OUT/gold/ledger``, ``OUT/gold/balances`` and ``OUT/dlq/payments``. What any
fault-tolerant contender costs is measured as a ratio to this.

Events of an account are applied in source-offset order. The generator's event ids
(``b{version}-{n}``, ``n`` in file-then-row order) follow that order by construction, so the
floor orders by them instead of by file offsets (which a batch read of Delta does not expose per
version). Bench-only: a real job would carry explicit offsets.
"""

from __future__ import annotations

import time
from typing import Any


def offset_order(F: Any) -> list[Any]:
    """Sort columns equal to the source-offset order, for the generator's event ids."""
    return [
        F.regexp_extract("event_id", r"^b(\d+)-", 1).cast("long"),
        F.regexp_extract("event_id", r"-(\d+)$", 1).cast("long"),
    ]


def payments_outputs(rows: Any) -> tuple[Any, Any, Any]:
    """The floor's ``(ledger, balances, dead letters)`` of ``rows`` (the landing rows with their
    ``error`` column), as DataFrames: what ``run_floor`` writes, and what the PostgreSQL section's
    plain contenders write elsewhere (bench/postgres.py)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    good = rows.where(F.col("error").isNull()).drop("error")
    running = Window.partitionBy("account").orderBy(*offset_order(F)).rowsBetween(Window.unboundedPreceding, 0)
    ledger = good.select(
        "event_id", "account", "amount_cents", F.sum("amount_cents").over(running).alias("balance_after_cents")
    )
    balances = good.groupBy("account").agg(
        F.sum("amount_cents").alias("balance_cents"), F.count(F.lit(1)).alias("event_count")
    )
    bad = rows.where(F.col("error").isNotNull()).select(
        *(F.col(c).cast("string").alias(c) for c in ("event_id", "account", "amount_cents", "ts")), "error"
    )
    return ledger, balances, bad


def landing_rows(spark: Any, landing: str, *, version: int | None = None) -> Any:
    """The landing table (up to ``version``) with each row's ``error`` (null: valid), persisted:
    the caller unpersists it."""
    from checkpoint_lib.pipelines.payments import payment_errors

    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    rows = reader.load(landing)
    return rows.withColumn("error", payment_errors(rows)).persist()


def run_floor(spark: Any, landing: str, out: str, *, version: int | None = None) -> dict:
    """The outputs of the whole landing table, or of its versions up to ``version``, into ``out``."""
    started = time.monotonic()
    rows = landing_rows(spark, landing, version=version)
    ledger, balances, bad = payments_outputs(rows)
    for df, name in ((ledger, "gold/ledger"), (balances, "gold/balances"), (bad, "dlq/payments")):
        df.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(f"{out}/{name}")
    rows.unpersist()
    return {"seconds": time.monotonic() - started}

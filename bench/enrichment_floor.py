"""The floor of the ``enrichment`` section: one plain PySpark batch job computing the outputs of
``checkpoint_lib.pipelines.enrichment`` from its landing tables in one pass.

    CKPT_SPARK_MASTER=local[2] .venv/bin/python bench/enrichment_floor.py --warehouse W --out OUT

No fault tolerance, no state between runs: it reads the whole payments table and the accounts
table's whole change data feed (Spark's ``readChangeFeed`` from version 0: its ``insert``,
``update_postimage`` and ``delete`` rows), and overwrites ``OUT/gold/enrichment/tagged``,
``OUT/gold/enrichment/region_totals``, ``OUT/dlq/enrichment/rejected`` and
``OUT/dlq/enrichment/payments`` (the paths ours writes under its warehouse).

The semantics are the verifier's (``checkpoint_lib/pipelines/enrichment_data.py``):

- bad rows (``payments.payment_errors``: no event id, no or a blank account, no amount) are dead
  letters, with their reason;
- every other row is looked up **as of its ts**: the account's change with the greatest
  ``updated_at <= ts``, a later commit winning a tie (so a late change never wins over a newer one,
  and a delete, which the generator lands after an update to the same ``updated_at``, wins over
  it); no such change, a null ``ts`` or a delete: rejected ``unknown account``; status ``closed``:
  rejected ``closed account``; else tagged with the change's region. Rejected rows are kept per
  landed row (a payment landed twice is rejected twice);
- the tagged rows are deduplicated by ``event_id``; ``region_totals`` sums and counts them per region.

The verifier keeps the first copy of an event in source-offset order; the generator lands a
repeated event as an identical row (the same account and ``ts``, so the same lookup), so any copy
is that first one, and the floor (as ours' ``Dedup`` does) keeps one with ``dropDuplicates``.
Reading the whole change feed is what makes a batch job exact whatever order the tables landed in:
the lookup needs every change up to the payment's ``ts``, and no snapshot of the accounts table
holds them (a move, a close or a late change rewrites the row in place).

:func:`history` and :func:`looked_up` are the lookup; the expert peer (``bench/enrichment_peer.py``)
runs the same one on each micro-batch.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from checkpoint_lib.pipelines.enrichment_data import (ACCOUNTS_PATH, CLOSED, CLOSED_ACCOUNT, DEAD_LETTERS_PATH,
                                                      PAYMENTS_PATH, REGION_TOTALS_PATH, REJECTED_PATH,
                                                      REJECTED_SCHEMA, TAGGED_PATH, TAGGED_SCHEMA, UNKNOWN_ACCOUNT)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["history", "looked_up", "dead_letters", "run_enrichment_floor", "OUTPUTS"]

OUTPUTS = {"tagged": TAGGED_PATH, "region_totals": REGION_TOTALS_PATH, "rejected": REJECTED_PATH,
           "dead_letters": DEAD_LETTERS_PATH}
"""Each output's path under a contender's output root (ours: its warehouse)."""
CHANGES = ("insert", "update_postimage", "delete")
ROW = "_row"
"""A landed row's identity within one read (a payment landed twice is two rows)."""


def history(spark: SparkSession, accounts: str, *, starting_version: int = 0,
            ending_version: int | None = None) -> DataFrame:
    """The accounts table's changes between two versions (both included; default: from 0 to the
    latest), from its change data feed: ``account, region, status, updated_at, deleted`` (a delete:
    the account does not exist from its ``updated_at``) and ``version`` (its commit). A change
    without ``updated_at`` is valid at no time: left out, as the verifier does."""
    from pyspark.sql import functions as F

    reader = (spark.read.format("delta").option("readChangeFeed", "true")
              .option("startingVersion", str(starting_version)))
    if ending_version is not None:
        reader = reader.option("endingVersion", str(ending_version))
    feed = reader.load(accounts)
    return (feed.where(F.col("_change_type").isin(*CHANGES) & F.col("updated_at").isNotNull())
            .select("account", "region", "status", "updated_at",
                    (F.col("_change_type") == F.lit("delete")).alias("deleted"),
                    F.col("_commit_version").alias("version")))


def looked_up(good: DataFrame, changes: DataFrame) -> DataFrame:
    """``good`` (valid payment rows with a unique :data:`ROW`) with the account as of each ``ts``:
    the tagged schema's columns and ``reason`` (null: accepted; ``unknown account``, ``closed
    account``). One row per row of ``good``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    p, c = good.alias("p"), changes.alias("c")
    joined = p.join(c, (F.col("p.account") == F.col("c.account")) & (F.col("c.updated_at") <= F.col("p.ts")), "left")
    newest = Window.partitionBy(F.col(f"p.{ROW}")).orderBy(F.col("c.updated_at").desc_nulls_last(),
                                                          F.col("c.version").desc_nulls_last())
    found = joined.withColumn("_rank", F.row_number().over(newest)).where(F.col("_rank") == 1)
    unknown = F.col("c.updated_at").isNull() | F.col("c.deleted")
    reason = (F.when(unknown, F.lit(UNKNOWN_ACCOUNT))
              .when(F.col("c.status") == F.lit(CLOSED), F.lit(CLOSED_ACCOUNT)))
    return found.select(*(F.col(f"p.{n}").alias(n) for n, _ in TAGGED_SCHEMA if n != "region"),
                        F.when(reason.isNull(), F.col("c.region")).alias("region"), reason.alias("reason"))


def tagged_of(looked: DataFrame) -> DataFrame:
    """The accepted rows of :func:`looked_up`, in the tagged schema, not yet deduplicated."""
    from pyspark.sql import functions as F

    return looked.where(F.col("reason").isNull()).select(*(n for n, _ in TAGGED_SCHEMA))


def rejected_of(looked: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return looked.where(F.col("reason").isNotNull()).select(*(n for n, _ in REJECTED_SCHEMA))


def totals_of(tagged: DataFrame) -> DataFrame:
    """Per region: the sum of ``amount_cents`` and the count of ``tagged``'s rows."""
    from pyspark.sql import functions as F

    return tagged.groupBy("region").agg(F.sum("amount_cents").alias("total_cents"),
                                        F.count(F.lit(1)).alias("payment_count"))


def dead_letters(rows: DataFrame) -> DataFrame:
    """The bad rows of ``rows`` (an ``error`` column), the payments columns as strings and the reason."""
    from pyspark.sql import functions as F

    return rows.where(F.col("error").isNotNull()).select(
        *(F.col(c).cast("string").alias(c) for c in ("event_id", "account", "amount_cents", "ts")), "error")


def run_enrichment_floor(spark: SparkSession, warehouse: str, out: str) -> dict[str, Any]:
    """The outputs of the landing tables under ``warehouse`` into ``out``. Returns ``{"seconds"}``."""
    from pyspark.sql import functions as F

    from checkpoint_lib.pipelines.payments import payment_errors

    started = time.monotonic()
    root, out = warehouse.rstrip("/"), out.rstrip("/")
    payments = spark.read.format("delta").load(f"{root}/{PAYMENTS_PATH}")
    rows = (payments.withColumn("error", payment_errors(payments))
            .withColumn(ROW, F.monotonically_increasing_id()).persist())
    try:
        looked = looked_up(rows.where(F.col("error").isNull()), history(spark, f"{root}/{ACCOUNTS_PATH}")).persist()
        try:
            tagged = tagged_of(looked).dropDuplicates(["event_id"]).persist()
            outputs = {"tagged": tagged, "region_totals": totals_of(tagged), "rejected": rejected_of(looked),
                       "dead_letters": dead_letters(rows)}
            for name, df in outputs.items():
                (df.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
                 .save(f"{out}/{OUTPUTS[name]}"))
            tagged.unpersist()
        finally:
            looked.unpersist()
    finally:
        rows.unpersist()
    return {"seconds": time.monotonic() - started}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warehouse", required=True, help="holds landing/enrichment/payments and .../accounts")
    ap.add_argument("--out", required=True, help="output root")
    args = ap.parse_args()

    from checkpoint_lib.spark.session import get_spark

    print(run_enrichment_floor(get_spark(ui=False), args.warehouse, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

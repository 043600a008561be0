"""The expert peer: the ``payments`` pipeline as a Spark expert would write it in Structured
Streaming, with no state store at all.

    CKPT_SPARK_MASTER=local[2] .venv/bin/python bench/expert_peer.py --landing W/landing/payments --out OUT

One streaming query over the landing Delta table (``availableNow``); ``foreachBatch`` computes
each account's running balance with a window over the micro-batch, started from the balances
table's row of that account (read for the touched accounts only: a join, with deletion vectors on
the table, so a MERGE rewrites what changed), then appends the ledger and the dead letters and
MERGEs the new balances. Every write is stamped ``(txnAppId = query id, txnVersion = batch id)``,
the ledger before the MERGE: a batch replayed after a crash reads the balances as they were before
it (the MERGE had not landed) or skips every write (it had), so each output is written once.
``bench/peer.py`` keeps the other form (``applyInPandasWithState`` on RocksDB) as a second row.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from bench.floor import offset_order
from bench.streaming import create_outputs, main, merge_latest_balances, run_available_now, stamped_append
from checkpoint_lib.pipelines.payments import LEDGER_SCHEMA, payment_errors

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["batch_writer", "run_expert_peer"]

CHECKPOINT = "_stream_checkpoint"


def batch_writer(paths: dict[str, str], query_id: dict[str, str], started: threading.Event):
    """The foreachBatch function: ledger, dead letters, then the balances MERGE, each skipped by
    Delta when that table already holds this (query id, batch id) stamp."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def write(batch: DataFrame, batch_id: int) -> None:
        started.wait()  # the query id is known once start() returned
        app = f"expert-payments-{query_id['id']}"
        spark = batch.sparkSession
        rows = batch.withColumn("error", payment_errors(batch)).persist()
        try:
            good = rows.where(F.col("error").isNull())
            prior = (
                spark.read.format("delta").load(paths["balances"])
                .join(good.select("account").distinct(), "account")  # the touched accounts only
                .select("account", F.col("balance_cents").alias("prior_balance"),
                        F.col("event_count").alias("prior_count"))
            )
            order = Window.partitionBy("account").orderBy(*offset_order(F))
            running = (
                good.join(prior, "account", "left").fillna(0, ["prior_balance", "prior_count"])
                .select("event_id", "account", "amount_cents",
                        (F.col("prior_balance") + F.sum("amount_cents").over(
                            order.rowsBetween(Window.unboundedPreceding, 0))).alias("balance_after_cents"),
                        (F.col("prior_count") + F.row_number().over(order)).alias("count_after"))
                .persist()
            )
            try:
                stamped_append(running.select(*(n for n, _ in LEDGER_SCHEMA)), paths["ledger"], app, batch_id)
                bad = rows.where(F.col("error").isNotNull()).select(
                    *(F.col(c).cast("string").alias(c) for c in ("event_id", "account", "amount_cents", "ts")),
                    "error",
                )
                stamped_append(bad, paths["dlq"], app, batch_id)
                merge_latest_balances(spark, paths["balances"], running, app, batch_id)  # last: see the docstring
            finally:
                running.unpersist()
        finally:
            rows.unpersist()

    return write


def run_expert_peer(
    spark: SparkSession, landing: str, out: str, *, files_per_batch: int, checkpoint_location: str | None = None,
) -> dict[str, Any]:
    """Process what ``landing`` holds beyond the checkpoint into ``out``, ``files_per_batch``
    landing files per micro-batch, and stop. Returns ``{"batches", "seconds", "rows"}``."""
    out = out.rstrip("/")
    paths = create_outputs(spark, out, balances_properties={"delta.enableDeletionVectors": "true"})
    source = spark.readStream.format("delta").option("maxFilesPerTrigger", files_per_batch).load(landing)
    return run_available_now(spark, source, lambda qid, started: batch_writer(paths, qid, started),
                             checkpoint_location or f"{out}/{CHECKPOINT}")


if __name__ == "__main__":
    raise SystemExit(main(run_expert_peer, __doc__, CHECKPOINT))

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

import argparse
import threading
import time
from typing import TYPE_CHECKING, Any

from bench.floor import offset_order
from checkpoint_lib.pipelines.payments import BALANCES_SCHEMA, LEDGER_SCHEMA, payment_errors

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["run_expert_peer"]

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
PROGRESS_RETENTION_CONF = "spark.sql.streaming.numRecentProgressUpdates"
DLQ_SCHEMA = "event_id string, account string, amount_cents string, ts string, error string"


def _ddl(schema: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in schema)


def _create_outputs(spark: SparkSession, out: str) -> dict[str, str]:
    from checkpoint_lib.spark.tables import create_if_missing

    paths = {"ledger": f"{out}/gold/ledger", "balances": f"{out}/gold/balances", "dlq": f"{out}/dlq/payments"}
    schemas = {"ledger": _ddl(LEDGER_SCHEMA), "balances": _ddl(BALANCES_SCHEMA), "dlq": DLQ_SCHEMA}
    for name, path in paths.items():
        properties = {"delta.enableDeletionVectors": "true"} if name == "balances" else None
        create_if_missing(spark, path, spark.createDataFrame([], schemas[name]).schema, properties=properties)
    return paths


def batch_writer(paths: dict[str, str], query_id: dict[str, str], started: threading.Event):
    """The foreachBatch function: ledger, dead letters, then the balances MERGE, each skipped by
    Delta when that table already holds this (query id, batch id) stamp."""
    from delta.tables import DeltaTable
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def append(df: DataFrame, path: str, app: str, batch_id: int) -> None:
        (df.write.format("delta").mode("append")
         .option("txnAppId", app).option("txnVersion", str(batch_id)).save(path))

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
            ledger = (
                good.join(prior, "account", "left").fillna(0, ["prior_balance", "prior_count"])
                .select("event_id", "account", "amount_cents",
                        (F.col("prior_balance") + F.sum("amount_cents").over(
                            order.rowsBetween(Window.unboundedPreceding, 0))).alias("balance_after_cents"),
                        (F.col("prior_count") + F.row_number().over(order)).alias("count_after"))
                .persist()
            )
            try:
                append(ledger.select(*(n for n, _ in LEDGER_SCHEMA)), paths["ledger"], app, batch_id)
                bad = rows.where(F.col("error").isNotNull()).select(
                    *(F.col(c).cast("string").alias(c) for c in ("event_id", "account", "amount_cents", "ts")),
                    "error",
                )
                append(bad, paths["dlq"], app, batch_id)
                latest = ledger.groupBy("account").agg(
                    F.max_by("balance_after_cents", "count_after").alias("balance_cents"),
                    F.max("count_after").alias("event_count"),
                )
                conf = spark.conf  # the query's own (cloned) session
                conf.set(TXN_APP_ID_CONF, app)
                conf.set(TXN_VERSION_CONF, str(batch_id))
                try:
                    (DeltaTable.forPath(spark, paths["balances"]).alias("t")
                     .merge(latest.alias("s"), "t.account = s.account")
                     .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
                finally:
                    conf.unset(TXN_APP_ID_CONF)
                    conf.unset(TXN_VERSION_CONF)
            finally:
                ledger.unpersist()
        finally:
            rows.unpersist()

    return write


def run_expert_peer(
    spark: SparkSession, landing: str, out: str, *, files_per_batch: int, checkpoint_location: str | None = None,
) -> dict[str, Any]:
    """Process what ``landing`` holds beyond the checkpoint into ``out``, ``files_per_batch``
    landing files per micro-batch, and stop. Returns ``{"batches", "seconds", "rows"}``."""
    from checkpoint_lib.spark.tables import session_confs

    out = out.rstrip("/")
    checkpoint = checkpoint_location or f"{out}/_stream_checkpoint"
    paths = _create_outputs(spark, out)
    source = spark.readStream.format("delta").option("maxFilesPerTrigger", files_per_batch).load(landing)
    query_id: dict[str, str] = {}
    started = threading.Event()
    t0 = time.monotonic()
    with session_confs(spark, {PROGRESS_RETENTION_CONF: "1000000"}):
        query = (
            source.writeStream.foreachBatch(batch_writer(paths, query_id, started))
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        )
        query_id["id"] = str(query.id)
        started.set()
        query.awaitTermination()
    seconds = time.monotonic() - t0
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    return {"batches": len(progress), "seconds": seconds, "rows": sum(p["numInputRows"] for p in progress)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--landing", required=True, help="the landing Delta table, e.g. W/landing/payments")
    ap.add_argument("--out", required=True, help="output root: gold/ledger, gold/balances, dlq/payments")
    ap.add_argument("--files-per-batch", type=int, default=2)
    ap.add_argument("--checkpoint-location", default=None, help="default: OUT/_stream_checkpoint")
    args = ap.parse_args()

    from checkpoint_lib.spark.session import get_spark

    spark = get_spark(ui=False)
    print(run_expert_peer(spark, args.landing, args.out, files_per_batch=args.files_per_batch,
                          checkpoint_location=args.checkpoint_location))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

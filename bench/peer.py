"""The "peer" contender: the ``payments`` pipeline as plain Spark Structured Streaming.

    CKPT_SPARK_MASTER=local[2] .venv/bin/python bench/peer.py --landing W/landing/payments --out OUT

What a careful Spark user would write for the same outputs as ``checkpoint_lib.pipelines.payments``
(``gold/ledger``, ``gold/balances``, ``dlq/payments``): one streaming query over the landing Delta
table (``availableNow``), the per-account running balance kept by ``applyInPandasWithState`` in
the RocksDB state store, and exactly-once outputs through Delta's idempotent writes in
``foreachBatch``, stamped ``(txnAppId = query id, txnVersion = batch id)``, so a replayed batch
(after a crash between its writes and the offset commit) is skipped by every table it reached.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pandas as pd

from bench.floor import offset_order
from checkpoint_lib.pipelines.payments import BALANCES_SCHEMA, LEDGER_SCHEMA, payment_errors

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["run_peer"]

STATE_STORE_CONF = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# query.recentProgress keeps only this many batches (default 100): the totals need them all.
PROGRESS_RETENTION_CONF = "spark.sql.streaming.numRecentProgressUpdates"
# Delta's idempotent-DML stamp (delta-spark >= 2.3, delta-io/delta#1555): MERGE/UPDATE/DELETE take
# it from these session confs (the txnAppId/txnVersion writer options exist for appends only).
TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"

DLQ_SCHEMA = "event_id string, account string, amount_cents string, ts string, error string"
STATE_SCHEMA = "balance_cents long, event_count long"
# What the stateful step emits per input row: valid events with the account's balance and count
# after them; bad rows (``error`` set) pass through untouched so one query feeds all three tables.
STEP_SCHEMA = (
    "event_id string, account string, amount_cents long, amount_str string, ts_str string, error string, "
    "balance_after_cents long, count_after long"
)
_STEP_COLUMNS = [f.split()[0] for f in STEP_SCHEMA.split(", ")]


def _ddl(schema: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in schema)


def _apply_account(key: tuple[Any, ...], chunks: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
    """One account's rows of a micro-batch: valid events applied in (version, n) order onto the
    stored (balance, count); bad rows leave the state alone (their account may be null)."""
    rows = pd.concat(list(chunks), ignore_index=True)
    bad = rows["error"].notna()
    good = rows[~bad].sort_values(["seq_version", "seq_n"], kind="stable")
    if len(good):
        balance, count = state.get if state.exists else (0, 0)
        running = good["amount_cents"].astype("int64").cumsum() + balance
        good = good.assign(balance_after_cents=running, count_after=range(count + 1, count + 1 + len(good)))
        state.update((int(running.iloc[-1]), count + len(good)))
        yield good[_STEP_COLUMNS]
    if bad.any():
        yield rows[bad].assign(amount_cents=None, balance_after_cents=None, count_after=None)[_STEP_COLUMNS]


def _create_outputs(spark: SparkSession, out: str) -> dict[str, str]:
    """Create the three output tables if missing, so every batch can MERGE into balances."""
    from checkpoint_lib.spark.tables import create_if_missing

    paths = {"ledger": f"{out}/gold/ledger", "balances": f"{out}/gold/balances", "dlq": f"{out}/dlq/payments"}
    schemas = {"ledger": _ddl(LEDGER_SCHEMA), "balances": _ddl(BALANCES_SCHEMA), "dlq": DLQ_SCHEMA}
    for name, path in paths.items():
        create_if_missing(spark, path, spark.createDataFrame([], schemas[name]).schema)
    return paths


def _batch_writer(paths: dict[str, str], query_id: dict[str, str], started: threading.Event):
    """The foreachBatch function: three idempotent Delta commits per batch, each skipped by Delta
    when that table already holds this (query id, batch id) stamp."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    def append(df: DataFrame, path: str, app: str, batch_id: int) -> None:
        (df.write.format("delta").mode("append")
         .option("txnAppId", app).option("txnVersion", str(batch_id)).save(path))

    def write(batch: DataFrame, batch_id: int) -> None:
        started.wait()  # the query id is known once start() returned
        app = f"peer-payments-{query_id['id']}"
        batch.persist()  # three writes read it: run the stateful step once
        try:
            good = batch.where(F.col("error").isNull())
            append(good.select(*(n for n, _ in LEDGER_SCHEMA)), paths["ledger"], app, batch_id)
            bad = batch.where(F.col("error").isNotNull()).select(
                "event_id", "account", F.col("amount_str").alias("amount_cents"), F.col("ts_str").alias("ts"), "error"
            )
            append(bad, paths["dlq"], app, batch_id)
            latest = good.groupBy("account").agg(
                F.max_by("balance_after_cents", "count_after").alias("balance_cents"),
                F.max("count_after").alias("event_count"),
            )
            conf = batch.sparkSession.conf  # the query's own (cloned) session
            conf.set(TXN_APP_ID_CONF, app)
            conf.set(TXN_VERSION_CONF, str(batch_id))
            try:
                (DeltaTable.forPath(batch.sparkSession, paths["balances"]).alias("t")
                 .merge(latest.alias("s"), "t.account = s.account")
                 .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
            finally:
                conf.unset(TXN_APP_ID_CONF)
                conf.unset(TXN_VERSION_CONF)
        finally:
            batch.unpersist()

    return write


def run_peer(
    spark: SparkSession,
    landing: str,
    out: str,
    *,
    files_per_batch: int,
    checkpoint_location: str | None = None,
) -> dict[str, Any]:
    """Process what ``landing`` holds beyond the checkpoint into ``out``, ``files_per_batch``
    landing files per micro-batch, and stop. Returns ``{"batches", "seconds", "rows"}`` (rows:
    valid and bad input rows, from the query progress)."""
    from pyspark.sql import functions as F

    from checkpoint_lib.spark.tables import session_confs

    out = out.rstrip("/")
    checkpoint = checkpoint_location or f"{out}/_checkpoints/peer"
    paths = _create_outputs(spark, out)
    steps = (
        spark.readStream.format("delta").option("maxFilesPerTrigger", files_per_batch).load(landing)
        .select(
            "event_id", "account", "amount_cents",
            F.col("amount_cents").cast("string").alias("amount_str"), F.col("ts").cast("string").alias("ts_str"),
            payment_errors(None).alias("error"),
            *(c.alias(name) for c, name in zip(offset_order(F), ("seq_version", "seq_n"))),
        )
        .groupBy("account")
        .applyInPandasWithState(_apply_account, STEP_SCHEMA, STATE_SCHEMA, "append", "NoTimeout")
    )
    query_id: dict[str, str] = {}
    started = threading.Event()
    t0 = time.monotonic()
    # Both are read from the session while the query runs; the provider is also recorded in the
    # checkpoint, so later runs of it keep RocksDB whatever the session says.
    with session_confs(spark, {STATE_STORE_CONF: ROCKSDB_PROVIDER, PROGRESS_RETENTION_CONF: "1000000"}):
        query = (
            steps.writeStream.foreachBatch(_batch_writer(paths, query_id, started))
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
    ap.add_argument("--checkpoint-location", default=None, help="default: OUT/_checkpoints/peer")
    args = ap.parse_args()

    from checkpoint_lib.spark.session import get_spark

    spark = get_spark(ui=False)
    print(run_peer(spark, args.landing, args.out, files_per_batch=args.files_per_batch,
                   checkpoint_location=args.checkpoint_location))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

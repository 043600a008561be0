"""What both Structured Streaming contenders share (bench/peer.py, bench/expert_peer.py): the output
tables, Delta's idempotent-write stamps on every write of a micro-batch, the balances MERGE, and
one ``availableNow`` query run to its end with its figures."""

from __future__ import annotations

import argparse
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

from checkpoint_lib.pipelines.payments import BALANCES_SCHEMA, LEDGER_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Delta's idempotent-DML stamp (delta-spark >= 2.3, delta-io/delta#1555): MERGE/UPDATE/DELETE take
# it from these session confs (the txnAppId/txnVersion writer options exist for appends only).
TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
# query.recentProgress keeps only this many batches (default 100): the totals need them all.
PROGRESS_RETENTION_CONF = "spark.sql.streaming.numRecentProgressUpdates"
DLQ_SCHEMA = "event_id string, account string, amount_cents string, ts string, error string"


def _ddl(schema: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in schema)


def create_outputs(spark: SparkSession, out: str, balances_properties: dict[str, str] | None = None) -> dict[str, str]:
    """Create the three output tables if missing, so every batch can MERGE into balances."""
    from checkpoint_lib.spark.tables import create_if_missing

    paths = {"ledger": f"{out}/gold/ledger", "balances": f"{out}/gold/balances", "dlq": f"{out}/dlq/payments"}
    schemas = {"ledger": _ddl(LEDGER_SCHEMA), "balances": _ddl(BALANCES_SCHEMA), "dlq": DLQ_SCHEMA}
    for name, path in paths.items():
        properties = balances_properties if name == "balances" else None
        create_if_missing(spark, path, spark.createDataFrame([], schemas[name]).schema, properties=properties)
    return paths


def stamped_append(df: DataFrame, path: str, app: str, batch_id: int) -> None:
    """Append, skipped by Delta when ``path`` already holds the stamp ``(app, batch_id)``."""
    (df.write.format("delta").mode("append")
     .option("txnAppId", app).option("txnVersion", str(batch_id)).save(path))


@contextmanager
def stamped_session(spark: SparkSession, app: str, batch_id: int) -> Iterator[None]:
    """Every DML command of the query's (cloned) session stamped ``(app, batch_id)`` meanwhile."""
    conf = spark.conf
    conf.set(TXN_APP_ID_CONF, app)
    conf.set(TXN_VERSION_CONF, str(batch_id))
    try:
        yield
    finally:
        conf.unset(TXN_APP_ID_CONF)
        conf.unset(TXN_VERSION_CONF)


def merge_latest_balances(spark: SparkSession, path: str, running: DataFrame, app: str, batch_id: int) -> None:
    """MERGE each account's last running balance and count of ``running`` into the balances table,
    stamped ``(app, batch_id)``."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    latest = running.groupBy("account").agg(
        F.max_by("balance_after_cents", "count_after").alias("balance_cents"),
        F.max("count_after").alias("event_count"),
    )
    with stamped_session(spark, app, batch_id):
        (DeltaTable.forPath(spark, path).alias("t")
         .merge(latest.alias("s"), "t.account = s.account")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())


def run_available_now(spark: SparkSession, stream: DataFrame, writer: Callable[..., Callable], checkpoint: str,
                      confs: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``stream`` through ``writer(query_id, started)`` (the foreachBatch function) until it has
    processed everything available, with ``confs`` set meanwhile. Returns ``{"batches", "seconds",
    "rows"}`` (rows: input rows, from the query progress)."""
    from checkpoint_lib.spark.tables import session_confs

    query_id: dict[str, str] = {}
    started = threading.Event()
    t0 = time.monotonic()
    with session_confs(spark, {**(confs or {}), PROGRESS_RETENTION_CONF: "1000000"}):
        query = (
            stream.writeStream.foreachBatch(writer(query_id, started))
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        )
        query_id["id"] = str(query.id)  # the writers stamp with it: they wait for it
        started.set()
        query.awaitTermination()
    seconds = time.monotonic() - t0
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    return {"batches": len(progress), "seconds": seconds, "rows": sum(p["numInputRows"] for p in progress)}


def main(run: Callable[..., dict], doc: str, default_checkpoint: str) -> int:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--landing", required=True, help="the landing Delta table, e.g. W/landing/payments")
    ap.add_argument("--out", required=True, help="output root: gold/ledger, gold/balances, dlq/payments")
    ap.add_argument("--files-per-batch", type=int, default=2)
    ap.add_argument("--checkpoint-location", default=None, help=f"default: OUT/{default_checkpoint}")
    args = ap.parse_args()

    from checkpoint_lib.spark.session import get_spark

    spark = get_spark(ui=False)
    print(run(spark, args.landing, args.out, files_per_batch=args.files_per_batch,
              checkpoint_location=args.checkpoint_location))
    return 0

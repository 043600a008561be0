"""The expert peer of the ``enrichment`` section: the enrichment example as a Spark expert writes it
in Structured Streaming, with no state store.

    CKPT_SPARK_MASTER=local[2] .venv/bin/python bench/enrichment_peer.py --warehouse W --out OUT

One streaming query over the payments Delta table (``availableNow``, ``maxFilesPerTrigger`` set
so that a micro-batch is one landed version: one checkpoint interval of ours); in ``foreachBatch``:

1. **the dimension, read at the batch**: the accounts table's change data feed up to its version
   at this batch, kept as a cached DataFrame that each batch extends with the versions committed
   since the last one (:class:`AccountsHistory`: in a backfill the table does not move, so it is
   read once; live, a batch reads only the dimension's new commits);
2. **a stream-static join, as of the payment's ts** (:func:`bench.enrichment_floor.looked_up`, the
   floor's lookup): per payment row, the account's change with the greatest ``updated_at <= ts``,
   a later commit winning a tie; no change, a null ``ts`` or a delete -> rejected ``unknown
   account``, ``closed`` -> ``closed account``, else tagged with the change's region;
3. **dedup against the tagged table**: the batch's accepted rows, one per ``event_id``, minus the
   ids ``gold/enrichment/tagged`` already holds (a left anti join on its ``event_id`` column):
   the batch's *new* events;
4. the writes, each stamped with Delta's idempotent-write transaction ``(txnAppId = query id,
   txnVersion = batch id)``, so a micro-batch replayed after a crash skips every table it already
   reached: the dead letters and the rejected rows appended (``txnAppId``/``txnVersion`` writer
   options), the region totals MERGEd (``total + the batch's``: session-conf stamps), then the
   new events MERGEd into ``tagged`` (insert when no row has that ``event_id``) **last**. The
   order is what makes a replay exact: step 3 reads ``tagged`` as it was before the batch unless
   the batch's every write landed, so a replay finds the same new events, and the totals MERGE it
   may repeat is skipped by its stamp.

**Why the change feed, not the latest snapshot of the accounts table.** The stream-static join an
expert writes first joins each micro-batch with ``spark.read.load(accounts)``, the dimension as it
is when the batch runs. That is not "as of the payment": a backlog (this benchmark reads landed
tables, as any restart after downtime does) meets the dimension's *final* state, after moves,
closes and removals that came after the payment; and a snapshot holds one row per account, as
last written, so a *late* change (an update landed after a newer one, with an older
``updated_at``) overwrites the newer values in place, and a removed account's history is gone. The
verifier's results need the account's change history, which the change data feed is. Reading it up
to the table's version at the batch is exact given the generator's landing rule: every change with
``updated_at <= ts`` lands before the payment, so it is in the feed when the payment's batch runs,
and what lands after has ``updated_at > ts`` (or is a late change, which never wins), so reading
more than had landed when the payment did changes no lookup. The history is small (a few rows per
account) and the batch's lookup is a broadcast join on it.

**Dedup.** The generator lands a repeated event as an identical row, so within a batch any copy is
the first (``dropDuplicates``), as the floor and ours' ``Dedup`` keep one.
"""

from __future__ import annotations

import argparse
import threading
from typing import TYPE_CHECKING, Any

from bench.enrichment_floor import OUTPUTS, ROW, dead_letters, history, looked_up, rejected_of, tagged_of
from bench.streaming import DLQ_SCHEMA, run_available_now, stamped_append, stamped_session
from checkpoint_lib.pipelines.enrichment_data import (ACCOUNTS_PATH, PAYMENTS_PATH, REGION_TOTALS_SCHEMA,
                                                      REJECTED_SCHEMA, TAGGED_SCHEMA)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["AccountsHistory", "batch_writer", "create_outputs", "files_per_version", "run_enrichment_peer"]

CHECKPOINT = "_stream_checkpoint"


def _ddl(schema: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in schema)


def create_outputs(spark: SparkSession, out: str) -> dict[str, str]:
    """Create the four output tables under ``out`` if missing (each batch MERGEs into two of them)."""
    from checkpoint_lib.spark.tables import create_if_missing

    schemas = {"tagged": _ddl(TAGGED_SCHEMA), "region_totals": _ddl(REGION_TOTALS_SCHEMA),
               "rejected": _ddl(REJECTED_SCHEMA), "dead_letters": DLQ_SCHEMA}
    paths = {name: f"{out}/{OUTPUTS[name]}" for name in schemas}
    for name, path in paths.items():
        create_if_missing(spark, path, spark.createDataFrame([], schemas[name]).schema)
    return paths


class AccountsHistory:
    """The accounts table's change history (:func:`bench.enrichment_floor.history`) up to its
    version at the last :meth:`at_latest`, cached; each call reads only the commits made since."""

    def __init__(self, path: str):
        self.path = path
        self.version = -1
        self.changes: DataFrame | None = None

    def latest_version(self, spark: SparkSession) -> int:
        from delta.tables import DeltaTable

        return int(DeltaTable.forPath(spark, self.path).history(1).select("version").head()[0])

    def at_latest(self, spark: SparkSession) -> DataFrame:
        """The history up to the table's latest version, read in ``spark`` (the batch's session)."""
        from pyspark import StorageLevel

        latest = self.latest_version(spark)
        if latest > self.version:
            new = history(spark, self.path, starting_version=self.version + 1, ending_version=latest)
            merged = new if self.changes is None else self.changes.unionByName(new)
            merged = merged.persist(StorageLevel.MEMORY_AND_DISK)
            merged.count()  # cached before the older one is let go
            if self.changes is not None:
                self.changes.unpersist()
            self.changes, self.version = merged, latest
        return self.changes

    def close(self) -> None:
        if self.changes is not None:
            self.changes.unpersist()
            self.changes = None


def batch_writer(paths: dict[str, str], accounts: AccountsHistory, query_id: dict[str, str],
                 started: threading.Event):
    """The foreachBatch function (see the module docstring for the order of the writes)."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from checkpoint_lib.pipelines.payments import payment_errors

    def write(batch: DataFrame, batch_id: int) -> None:
        started.wait()  # the query id is known once start() returned
        app = f"expert-enrichment-{query_id['id']}"
        spark = batch.sparkSession
        rows = (batch.withColumn("error", payment_errors(batch))
                .withColumn(ROW, F.monotonically_increasing_id()).persist())
        looked = new = None
        try:
            stamped_append(dead_letters(rows), paths["dead_letters"], app, batch_id)
            changes = F.broadcast(accounts.at_latest(spark))
            looked = looked_up(rows.where(F.col("error").isNull()), changes).persist()
            stamped_append(rejected_of(looked), paths["rejected"], app, batch_id)
            known = spark.read.format("delta").load(paths["tagged"]).select("event_id")
            new = (tagged_of(looked).dropDuplicates(["event_id"])
                   .join(known, "event_id", "left_anti").persist())
            step = new.groupBy("region").agg(F.sum("amount_cents").alias("total_cents"),
                                             F.count(F.lit(1)).alias("payment_count"))
            with stamped_session(spark, app, batch_id):
                (DeltaTable.forPath(spark, paths["region_totals"]).alias("t")
                 .merge(step.alias("s"), "t.region = s.region")
                 .whenMatchedUpdate(set={"total_cents": "t.total_cents + s.total_cents",
                                         "payment_count": "t.payment_count + s.payment_count"})
                 .whenNotMatchedInsertAll().execute())
                (DeltaTable.forPath(spark, paths["tagged"]).alias("t")  # last: see the docstring
                 .merge(new.alias("s"), "t.event_id = s.event_id")
                 .whenNotMatchedInsertAll().execute())
        finally:
            for df in (new, looked, rows):
                if df is not None:
                    df.unpersist()

    return write


def files_per_version(payments: str) -> int:
    """The most files one version of the payments table added: ``maxFilesPerTrigger`` for a
    micro-batch of one landed version (read from the Delta log, no Spark)."""
    from collections import Counter

    from checkpoint_lib.delta import log as delta_log

    latest = delta_log.latest_version(payments)
    counts = Counter(f.version for f in delta_log.added_files(payments, -1, latest if latest is not None else -1))
    return max(counts.values(), default=1)


def run_enrichment_peer(spark: SparkSession, warehouse: str, out: str, *, files_per_batch: int | None = None,
                        checkpoint_location: str | None = None) -> dict[str, Any]:
    """Process what the payments table under ``warehouse`` holds beyond the checkpoint into ``out``,
    ``files_per_batch`` files per micro-batch (default: one landed version's), and stop. Returns
    ``{"batches", "seconds", "rows"}``."""
    root, out = warehouse.rstrip("/"), out.rstrip("/")
    payments = f"{root}/{PAYMENTS_PATH}"
    files = files_per_batch or files_per_version(payments)
    paths = create_outputs(spark, out)
    accounts = AccountsHistory(f"{root}/{ACCOUNTS_PATH}")
    source = spark.readStream.format("delta").option("maxFilesPerTrigger", files).load(payments)
    try:
        return run_available_now(spark, source,
                                 lambda qid, started: batch_writer(paths, accounts, qid, started),
                                 checkpoint_location or f"{out}/{CHECKPOINT}")
    finally:
        accounts.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warehouse", required=True, help="holds landing/enrichment/payments and .../accounts")
    ap.add_argument("--out", required=True, help="output root")
    ap.add_argument("--files-per-batch", type=int, default=None, help="default: the files of one landed version")
    ap.add_argument("--checkpoint-location", default=None, help=f"default: OUT/{CHECKPOINT}")
    args = ap.parse_args()

    from checkpoint_lib.spark.session import get_spark

    print(run_enrichment_peer(get_spark(ui=False), args.warehouse, args.out, files_per_batch=args.files_per_batch,
                              checkpoint_location=args.checkpoint_location))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

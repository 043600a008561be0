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

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pandas as pd

from bench.floor import offset_order
from bench.streaming import create_outputs, main, merge_latest_balances, run_available_now, stamped_append
from checkpoint_lib.pipelines.payments import LEDGER_SCHEMA, payment_errors

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["run_peer"]

STATE_STORE_CONF = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
STATE_SCHEMA = "balance_cents long, event_count long"
# What the stateful step emits per input row: valid events with the account's balance and count
# after them; bad rows (``error`` set) pass through untouched so one query feeds all three tables.
STEP_SCHEMA = (
    "event_id string, account string, amount_cents long, amount_str string, ts_str string, error string, "
    "balance_after_cents long, count_after long"
)
_STEP_COLUMNS = [f.split()[0] for f in STEP_SCHEMA.split(", ")]


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


def _batch_writer(paths: dict[str, str], query_id: dict[str, str], started: threading.Event):
    """The foreachBatch function: three idempotent Delta commits per batch, each skipped by Delta
    when that table already holds this (query id, batch id) stamp."""
    from pyspark.sql import functions as F

    def write(batch: DataFrame, batch_id: int) -> None:
        started.wait()  # the query id is known once start() returned
        app = f"peer-payments-{query_id['id']}"
        batch.persist()  # three writes read it: run the stateful step once
        try:
            good = batch.where(F.col("error").isNull())
            stamped_append(good.select(*(n for n, _ in LEDGER_SCHEMA)), paths["ledger"], app, batch_id)
            bad = batch.where(F.col("error").isNotNull()).select(
                "event_id", "account", F.col("amount_str").alias("amount_cents"), F.col("ts_str").alias("ts"), "error"
            )
            stamped_append(bad, paths["dlq"], app, batch_id)
            merge_latest_balances(batch.sparkSession, paths["balances"], good, app, batch_id)
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

    out = out.rstrip("/")
    checkpoint = checkpoint_location or f"{out}/_checkpoints/peer"
    paths = create_outputs(spark, out)
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
    # The provider is read from the session while the query runs, and recorded in the checkpoint,
    # so later runs of it keep RocksDB whatever the session says.
    return run_available_now(spark, steps, lambda qid, started: _batch_writer(paths, qid, started), checkpoint,
                             confs={STATE_STORE_CONF: ROCKSDB_PROVIDER})


if __name__ == "__main__":
    raise SystemExit(main(run_peer, __doc__, "_checkpoints/peer"))

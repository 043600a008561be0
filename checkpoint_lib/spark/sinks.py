"""Two-phase-commit sinks into Delta tables (the I/O half of ``core.twophase``).

- **write**: records of the open transaction are appended to a staging Delta table, tagged with
  the transaction's handle. Staged rows are durable but invisible in the target table.
- **pre-commit** (at the barrier): nothing left to flush, the rows are already staged; the core
  moves the transaction to pending and the snapshot records it.
- **commit** (a global committer, as Flink's Sink V2 and Iceberg's committer): when checkpoint
  ``c`` completes, the staged rows of every subtask's transactions up to ``c`` go into the target in
  ONE Delta commit, an append (``append`` mode) or a MERGE on ``keys`` (``upsert`` mode), stamped
  with Delta's idempotent-write transaction ``(txnAppId = sink + epoch, txnVersion = c)``. Delta
  records the stamp atomically with the data, and commits are cumulative, so "committed" is
  exactly "the stamp of its epoch reached its checkpoint": a repeated commit is a no-op and no
  transaction is ever committed twice.
- **abort**: the staged rows are deleted; committed transactions' staged rows are deleted lazily.

Before committing, the writer's epoch is checked against the store: a zombie of an older attempt
is refused (:class:`~checkpoint_lib.core.errors.FencedError`).
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..core.twophase import Transaction
from ..delta.log import is_delta_table
from . import tables

_TXN_COLUMNS = [
    T.StructField("txn_handle", T.StringType(), False),
    T.StructField("txn_id", T.StringType(), False),
    T.StructField("txn_epoch", T.LongType(), False),
    T.StructField("txn_seq", T.LongType(), False),
    T.StructField("sink_subtask", T.IntegerType(), False),
    T.StructField("flush", T.LongType(), False),
]
_SESSION_CONF_LOCK = threading.Lock()


class DeltaTwoPhaseSink:
    """One logical sink (e.g. ``ledger``) of a pipeline; every subtask of it shares the tables."""

    def __init__(
        self,
        spark: SparkSession,
        name: str,
        target: str,
        staging: str,
        schema: T.StructType,
        *,
        app_prefix: str,
        mode: str = "append",
        keys: Iterable[str] = (),
        check_epoch: Callable[[int], None] | None = None,
    ):
        if mode not in ("append", "upsert"):
            raise ValueError(f"sink mode must be 'append' or 'upsert', got {mode!r}")
        self.keys = list(keys)
        if mode == "upsert" and not self.keys:
            raise ValueError("an upsert sink needs keys")
        self.spark = spark
        self.name = name
        self.target = target
        self.staging = staging
        self.schema = schema
        self.mode = mode
        self.app_prefix = app_prefix
        self.check_epoch = check_epoch

    def create(self) -> None:
        tables.create_if_missing(self.spark, self.target, self.schema)
        tables.create_if_missing(
            self.spark, self.staging, T.StructType(_TXN_COLUMNS + list(self.schema.fields)),
            partition_by=["sink_subtask"],
        )

    # writing ---------------------------------------------------------------------------------

    def stage(self, rows: DataFrame, handles: dict[int, Transaction], flush: int) -> None:
        """Stage ``rows`` (the target's columns plus ``sink_subtask``) into each subtask's open
        transaction ``handles[subtask]``, in one Delta commit."""
        if not handles:
            return
        txns = self.spark.createDataFrame(
            [(s, t.handle, t.txn_id, t.epoch, t.seq) for s, t in handles.items()],
            "sink_subtask int, txn_handle string, txn_id string, txn_epoch long, txn_seq long",
        )
        staged = rows.join(F.broadcast(txns), "sink_subtask").withColumn("flush", F.lit(flush).cast("long"))
        staged.select(*[f.name for f in _TXN_COLUMNS], *self.schema.fieldNames()).write.format(
            "delta"
        ).mode("append").save(self.staging)

    # committing ----------------------------------------------------------------------------

    def app_id(self, epoch: int) -> str:
        """Delta's idempotent-write application id of this sink's commits for one epoch."""
        return f"{self.app_prefix}/{self.name}/e{epoch}"

    def committed_checkpoint(self, epoch: int) -> int:
        """The highest checkpoint whose transactions of ``epoch`` the target holds (-1: none)."""
        from deltalake import DeltaTable

        if not is_delta_table(self.target):
            return -1
        version = DeltaTable(self.target).transaction_version(self.app_id(epoch))
        return -1 if version is None else int(version)

    def is_committed(self, txn: Transaction) -> bool:
        return txn.checkpoint_id is not None and self.committed_checkpoint(txn.epoch) >= txn.checkpoint_id

    def commit(self, txns: list[Transaction], checkpoint_id: int, writer_epoch: int) -> list[Transaction]:
        """Commit ``txns`` (every subtask's, all pre-committed at checkpoints <= ``checkpoint_id``)
        as ONE Delta commit per epoch they were written in, stamped ``(app_id(epoch),
        checkpoint_id)``. Commits are cumulative, so a transaction is committed exactly when its
        epoch's stamp reached its checkpoint: those are skipped, which makes a repeated commit (a
        retry, a recovery, a late notification) a no-op. Returns what this call committed."""
        if self.check_epoch is not None:
            self.check_epoch(writer_epoch)
        done: list[Transaction] = []
        for epoch in sorted({t.epoch for t in txns}):
            done += tables.retry_conflicts(
                lambda: self._commit_epoch(txns, epoch, checkpoint_id),
                f"sink {self.name}: commit of checkpoint {checkpoint_id} to {self.target}",
                before_retry=None if self.check_epoch is None else lambda: self.check_epoch(writer_epoch),
            )
        return done

    def _commit_epoch(self, txns: list[Transaction], epoch: int, checkpoint_id: int) -> list[Transaction]:
        """One Delta commit of what ``txns`` of ``epoch`` the target does not hold yet (re-read on
        every attempt: after a conflict, the stamp says whether a retry has anything left to do)."""
        stamp = self.committed_checkpoint(epoch)
        todo = [t for t in txns if t.epoch == epoch and (t.checkpoint_id or 0) > stamp]
        if not todo:
            return []
        version = max(checkpoint_id, *(t.checkpoint_id or 0 for t in todo))
        staged = (
            self.spark.read.format("delta").load(self.staging)
            .where(F.col("txn_handle").isin([t.handle for t in todo]))
        )
        app = self.app_id(epoch)
        if self.mode == "append":
            (
                staged.select(*self.schema.fieldNames())
                .write.format("delta").mode("append")
                .option("txnAppId", app).option("txnVersion", str(version))
                .save(self.target)
            )
        else:
            self._merge(staged, app, str(version))
        return todo

    def _merge(self, staged: DataFrame, app: str, version: str) -> None:
        from delta.tables import DeltaTable

        latest = Window.partitionBy(*self.keys).orderBy(F.col("txn_seq").desc(), F.col("flush").desc())
        rows = (
            staged.withColumn("_rank", F.row_number().over(latest)).where("_rank = 1")
            .select(*self.schema.fieldNames())
        )
        cond = " AND ".join(f"t.{k} = s.{k}" for k in self.keys)
        with _SESSION_CONF_LOCK:  # the idempotent-DML stamp is a session setting
            conf = self.spark.conf
            conf.set("spark.databricks.delta.write.txnAppId", app)
            conf.set("spark.databricks.delta.write.txnVersion", version)
            try:
                (
                    DeltaTable.forPath(self.spark, self.target).alias("t")
                    .merge(rows.alias("s"), cond)
                    .whenMatchedUpdateAll()
                    .whenNotMatchedInsertAll()
                    .execute()
                )
            finally:
                conf.unset("spark.databricks.delta.write.txnAppId")
                conf.unset("spark.databricks.delta.write.txnVersion")

    def rollback_to(self, checkpoint_id: int) -> int | None:
        """Make the target hold exactly what it held when checkpoint ``checkpoint_id`` was the
        latest committed to it (Delta RESTORE to the version before the first commit stamped above
        it); returns that version, or None when nothing after it was committed. Idempotent until
        the sink commits again. Writes of others to the target after that version are undone too:
        the target belongs to the pipeline."""
        from delta.tables import DeltaTable

        from ..delta.log import version_before_txn_above

        if not is_delta_table(self.target):
            return None
        version = version_before_txn_above(self.target, f"{self.app_prefix}/{self.name}/e", checkpoint_id)
        if version is None:
            return None
        if version < 0:  # our first commit created the table: before it, the table held nothing
            DeltaTable.forPath(self.spark, self.target).delete()
        else:
            DeltaTable.forPath(self.spark, self.target).restoreToVersion(version)
        return version

    # aborting, cleaning up and recovery ----------------------------------------------------

    def discard(self, txns: Iterable[Transaction]) -> None:
        """Delete the staged rows of ``txns``: an abort, or the cleanup of committed ones (both
        idempotent: what is gone stays gone)."""
        handles = sorted({t.handle for t in txns})
        if handles:
            tables.delete_where(self.spark, self.staging, F.col("txn_handle").isin(handles))

    def open_transactions(self) -> list[Transaction]:
        """Every transaction with staged rows, of every epoch (committed ones whose cleanup a
        crash interrupted included): recovery re-commits those the restored checkpoint owns (a
        no-op for committed ones) and discards the rest."""
        if not is_delta_table(self.staging):
            return []
        rows = (
            self.spark.read.format("delta").load(self.staging)
            .select("txn_handle", "txn_id", "txn_epoch", "txn_seq").distinct().collect()
        )
        return sorted(Transaction(r.txn_seq, r.txn_id, r.txn_epoch) for r in rows)

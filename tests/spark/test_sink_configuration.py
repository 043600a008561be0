"""What we own on a sink table (issue 24, item 8): its commit stamps. A table configured to
expire them is refused clearly before anything is written; tables we create keep their log a year
so a rollback to an old savepoint can walk it."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.pipelines import get
from checkpoint_lib.spark.runner import PipelineRunner
from checkpoint_lib.spark.sinks import SINK_TABLE_PROPERTIES, DeltaTwoPhaseSink, SinkConfigurationError

pytestmark = pytest.mark.spark
SCHEMA = T.StructType([T.StructField("account", T.StringType()), T.StructField("amount_cents", T.LongType())])


def _sink(spark, tmp_path) -> DeltaTwoPhaseSink:
    return DeltaTwoPhaseSink(spark, "ledger", str(tmp_path / "ledger"), str(tmp_path / "staging"), SCHEMA,
                             app_prefix="checkpoint_lib/p")


def test_a_sink_table_we_create_keeps_its_log_for_rollbacks(spark, tmp_path):
    from deltalake import DeltaTable

    sink = _sink(spark, tmp_path)
    sink.create()
    configuration = DeltaTable(sink.target).metadata().configuration
    assert configuration["delta.logRetentionDuration"] == SINK_TABLE_PROPERTIES["delta.logRetentionDuration"]


def test_a_sink_table_that_would_expire_our_stamps_is_refused_before_any_write(spark, tmp_path):
    payments = get("payments")
    ledger = str(tmp_path / payments.sinks["ledger"].path)
    spark.sql(f"CREATE TABLE delta.`{ledger}` (x INT) USING delta "
              "TBLPROPERTIES ('delta.setTransactionRetentionDuration' = 'interval 1 days')")
    with pytest.raises(SinkConfigurationError, match="setTransactionRetentionDuration.*UNSET TBLPROPERTIES"):
        PipelineRunner(payments, str(tmp_path), spark, rows_per_checkpoint=10).open()
    assert DeltaCheckpointStore(tmp_path / "_checkpoints" / "payments").epochs.current() == 0  # no attempt began


@pytest.mark.parametrize("lost", ["log", "files"])
def test_a_rollback_past_the_sinks_history_is_refused_naming_the_fix(spark, tmp_path, lost):
    """Rolling back to checkpoint 1 needs the sink's log back to 1's commit and that version's
    files: without them (log retention, VACUUM) the rollback is refused with what to do."""
    from pathlib import Path

    from deltalake import DeltaTable

    from checkpoint_lib.core.twophase import Transaction
    from checkpoint_lib.spark.sinks import RollbackUnavailableError
    from delta_history import expire_log_through

    sink = _sink(spark, tmp_path)
    sink.create()
    for cid in (1, 2, 3):
        txn = Transaction(cid, "a", 1, checkpoint_id=cid)
        sink.stage(spark.createDataFrame([(0, f"k{cid}", cid)], "sink_subtask int, account string, amount_cents long"),
                   {0: txn}, flush=1)
        sink.commit([txn], cid, writer_epoch=1)
    assert sink.rollback_version(3) is None  # nothing after 3: nothing to undo
    version = sink.rollback_version(1)  # the version holding exactly checkpoint 1's commit
    assert {r["account"] for r in DeltaTable(sink.target, version=version).to_pyarrow_table().to_pylist()} == {"k1"}
    if lost == "log":
        expire_log_through(sink.target, version)
        why = "a commit on the way back to it is gone"
    else:
        first = DeltaTable(sink.target, version=version).file_uris()[0]
        Path(first.removeprefix("file://")).unlink()
        why = f"version {version} lost 1 data files to VACUUM"
    with pytest.raises(RollbackUnavailableError, match=f"checkpoint 1 committed: {why}.*Nothing was written.*logRetentionDuration"):
        sink.rollback_to(1)


# --- each record written once (issue 25) -------------------------------------------------------


def _rows(spark, rows):
    return spark.createDataFrame([(0, *r) for r in rows], "sink_subtask int, account string, amount_cents long")


def test_an_append_commit_adds_the_files_the_flush_wrote_and_an_abort_never_deletes_a_committed_one(spark, tmp_path):
    """The flush writes the rows once, inside the target's folder; the commit adds those very
    files (no copy, with statistics); the files of an aborted transaction are deleted. A crash
    between a commit and the clean-up leaves the committed transaction listed as open: the next
    recovery aborts it (it is not owned by a later checkpoint), and that abort keeps its files,
    which the table refers to."""
    from deltalake import DeltaTable

    from checkpoint_lib.core.twophase import Transaction

    sink = _sink(spark, tmp_path)
    sink.create()
    t1, t2 = Transaction(1, "a", 1, checkpoint_id=1), Transaction(2, "a", 1)
    sink.stage(_rows(spark, [("x", 5), ("y", -2)]), {0: t1}, flush=1)
    sink.stage(_rows(spark, [("z", 7)]), {0: t2}, flush=2)
    written = {f.path for f in sink.pending.files([t1])}
    assert sink.commit([t1], 1, writer_epoch=1) == [t1]
    table = DeltaTable(sink.target)
    added = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert {a["path"] for a in added} == written and table.transaction_version(sink.app_id) == (1 << 32) | 1
    stats = sorted((a["num_records"], a["min.amount_cents"], a["max.amount_cents"]) for a in added)
    assert sum(n for n, _, _ in stats) == 2 and min(s[1] for s in stats) == -2 and max(s[2] for s in stats) == 5
    assert sorted(spark.read.format("delta").load(sink.target).toPandas()["account"]) == ["x", "y"]

    assert sorted(sink.open_transactions()) == sorted([Transaction(1, "a", 1), Transaction(2, "a", 1)])
    sink.abort(sink.open_transactions())  # t1: committed, its clean-up lost to a crash; t2: never committed
    assert sink.open_transactions() == []
    assert sorted(spark.read.format("delta").load(sink.target).toPandas()["account"]) == ["x", "y"]
    left = [str(p.relative_to(sink.target)) for p in (tmp_path / "ledger" / "ckpt").rglob("*.parquet")]
    assert sorted(left) == sorted(written)  # t2's file is gone, t1's stay


def test_an_append_sink_table_its_commit_cannot_write_is_refused_before_any_write(spark, tmp_path):
    for ddl, why in [("PARTITIONED BY (account)", "partitioned"),
                     ("TBLPROPERTIES ('delta.feature.checkConstraints' = 'supported')", "checkConstraints")]:
        path = tmp_path / why / "ledger"
        spark.sql(f"CREATE TABLE delta.`{path}` (account STRING, amount_cents BIGINT) USING delta {ddl}")
        sink = DeltaTwoPhaseSink(spark, "ledger", str(path), str(tmp_path / why / "staging"), SCHEMA,
                                 app_prefix="checkpoint_lib/p")
        with pytest.raises(SinkConfigurationError, match=why):
            sink.create()


def test_an_append_sink_commits_into_a_table_with_deletion_vectors(spark, tmp_path):
    """Deletion vectors on (Databricks' default for new tables, or an upgrade while the pipeline is
    down): the commit adds whole new files, none with a deletion vector, which honours the feature."""
    from checkpoint_lib.core.twophase import Transaction

    path = tmp_path / "ledger"
    spark.sql(f"CREATE TABLE delta.`{path}` (account STRING, amount_cents BIGINT) USING delta "
              "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"INSERT INTO delta.`{path}` VALUES ('old', 1), ('gone', 2)")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE account = 'gone'")  # a deletion vector on the old file
    sink = DeltaTwoPhaseSink(spark, "ledger", str(path), str(tmp_path / "staging"), SCHEMA, app_prefix="checkpoint_lib/p")
    sink.create()
    txn = Transaction(1, "a", 1, checkpoint_id=1)
    sink.stage(_rows(spark, [("x", 3)]), {0: txn}, flush=1)
    assert sink.commit([txn], 1, writer_epoch=1) == [txn]
    assert sorted(map(tuple, spark.read.format("delta").load(str(path)).collect())) == [("old", 1), ("x", 3)]


def test_rows_that_do_not_fit_the_table_are_refused_before_they_are_written(spark, tmp_path):
    from checkpoint_lib.core.twophase import Transaction

    path = tmp_path / "ledger"
    spark.sql(f"CREATE TABLE delta.`{path}` (account STRING NOT NULL, amount_cents BIGINT) USING delta")
    sink = DeltaTwoPhaseSink(spark, "ledger", str(path), str(tmp_path / "staging"), SCHEMA, app_prefix="checkpoint_lib/p")
    sink.schema = spark.read.format("delta").load(str(path)).schema
    sink.create()
    txn = Transaction(1, "a", 1)
    wrong = spark.createDataFrame([(0, "x", "ten")], "sink_subtask int, account string, amount_cents string")
    with pytest.raises(ValueError, match="amount_cents.*string.*bigint"):
        sink.stage(wrong, {0: txn}, flush=1)
    with pytest.raises(Exception, match="NOT NULL column account"):
        sink.stage(_rows(spark, [(None, 3)]), {0: txn}, flush=2)
    narrow = spark.createDataFrame([(0, "x", 3)], "sink_subtask int, account string, amount_cents int")
    sink.stage(narrow, {0: txn}, flush=3)  # widened to the table's bigint
    sink.commit([Transaction(1, "a", 1, checkpoint_id=1)], 1, writer_epoch=1)
    assert spark.read.format("delta").load(str(path)).collect() == [("x", 3)]


def test_each_subtasks_rows_go_into_its_own_transaction_and_a_row_of_a_subtask_without_one_fails_the_flush(spark, tmp_path):
    """A flush writes every subtask's rows in one Spark job, each into its subtask's transaction;
    a row whose subtask has no open transaction in the flush is never dropped silently."""
    from checkpoint_lib.core.twophase import Transaction

    sink = _sink(spark, tmp_path)
    sink.create()
    t0, t1 = Transaction(1, "a", 1), Transaction(2, "b", 1)
    rows = spark.createDataFrame([(0, "x", 1), (1, "y", 2), (1, "z", 3)], "sink_subtask int, account string, amount_cents long")
    sink.stage(rows, {0: t0, 1: t1}, flush=1)
    for txn, want in ((t0, ["x"]), (t1, ["y", "z"])):
        files = [f"{sink.target}/{f.path}" for f in sink.pending.files([txn])]
        assert sorted(r.account for r in spark.read.parquet(*files).collect()) == want
    with pytest.raises(Exception, match="a row of subtask 1, which has no open transaction in this flush"):
        sink.stage(rows, {0: Transaction(3, "a", 1)}, flush=2)
    sink.commit([Transaction(1, "a", 1, checkpoint_id=1), Transaction(2, "b", 1, checkpoint_id=1)], 1, writer_epoch=1)
    assert sorted(r.account for r in spark.read.format("delta").load(sink.target).collect()) == ["x", "y", "z"]

"""What we own on a sink table (issue 24, item 8): its commit stamps. A table configured to
expire them is refused clearly before anything is written; tables we create keep their log a year
so a rollback to an old savepoint can walk it."""

from __future__ import annotations

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
    assert DeltaCheckpointStore(tmp_path / "_checkpoints" / "payments").current_epoch() == 0  # no attempt began


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

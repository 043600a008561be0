"""Someone else writes our tables while we commit: OPTIMIZE (another engine's compaction) and a
foreign append, landing deterministically in the middle of our MERGE.

The concurrent write is made from inside the MERGE itself: the source DataFrame carries a Python
UDF that, when Spark evaluates it (after the MERGE took its snapshot, before it commits), commits
to the same table through delta-rs, i.e. another process and another Delta implementation. Delta
then refuses our commit (optimistic concurrency); ``tables.retry_conflicts`` plans the MERGE
again on the new snapshot, or after too many conflicts raises a clear ConcurrentWriterError with
nothing of ours committed.
"""

from __future__ import annotations

import os

import pytest

from checkpoint_lib.spark import tables
from checkpoint_lib.spark.state import KeyedStateTable
from checkpoint_lib.verify import read_delta
from state_rows import state_rows

pytestmark = [pytest.mark.spark, pytest.mark.race]


def _state(spark, path) -> KeyedStateTable:
    from pyspark.sql import types as T

    values = T.StructType([T.StructField("balance_cents", T.LongType()), T.StructField("event_count", T.LongType())])
    table = KeyedStateTable(spark, path, "account", values)
    # without deletion vectors (KeyedStateTable.create turns them on): the other engine here is
    # delta-rs, which cannot write to a table with that writer feature
    tables.create_if_missing(spark, path, table.schema)
    table.create()
    for i in range(4):  # four small files: something for OPTIMIZE to compact
        spark.createDataFrame([(i, f"acct-{i}", 100, 1, None, None)], table.schema).write.format("delta").mode("append").save(path)
    return table


def _deltas_that_write_concurrently(spark, path: str, marker_dir: str, what: str, times: int):
    """Deltas (+10 cents, +1 event for acct-0..acct-3) whose evaluation commits ``what`` to ``path``
    through delta-rs, the first ``times`` times the MERGE is attempted."""
    from pyspark.sql import functions as F

    def concurrent_write(x):
        import os as _os

        attempt = sum(1 for f in _os.listdir(marker_dir) if f.startswith("retry-"))  # see _next_attempt
        if attempt >= times:
            return x
        try:  # once per attempt, whichever task gets there first
            _os.close(_os.open(f"{marker_dir}/fired-{attempt}", _os.O_CREAT | _os.O_EXCL | _os.O_WRONLY))
        except FileExistsError:
            return x
        from deltalake import DeltaTable, write_deltalake

        if what == "optimize":
            DeltaTable(path).optimize.compact()
        else:
            import pyarrow as pa

            write_deltalake(path, pa.table({
                "key_group": pa.array([999 + attempt], pa.int32()), "account": [f"foreign-{attempt}"],
                "balance_cents": pa.array([1], pa.int64()), "event_count": pa.array([1], pa.int64()),
                "_ckpt_run": pa.array([None], pa.int64()), "_ckpt_gone": pa.array([None], pa.bool_()),
            }), mode="append")
        return x

    udf = F.udf(concurrent_write, "long")
    rows = [(i, f"acct-{i}", 10, 1) for i in range(4)]
    return spark.createDataFrame(rows, "key_group int, account string, balance_cents long, event_count long") \
        .withColumn("balance_cents", udf(F.col("balance_cents")))


def _next_attempt(marker_dir, seen: list):
    """The driver's side: before each retry (the fence's place), count the attempt for the UDF."""
    def before_retry():
        seen.append("fence checked")
        open(f"{marker_dir}/retry-{len(seen)}", "w").close()
    return before_retry


def test_optimize_by_another_engine_during_our_flush_changes_nothing_and_our_run_lands_once(spark, tmp_path):
    """A flush appends a run computed from the state it read; another engine's OPTIMIZE landing
    in between changes no state, so the run is neither refused nor applied twice."""
    path = str(tmp_path / "state")
    table = _state(spark, path)
    os.makedirs(tmp_path / "markers")
    deltas = _deltas_that_write_concurrently(spark, path, str(tmp_path / "markers"), "optimize", times=1)
    table.add(deltas, before_retry=_next_attempt(str(tmp_path / "markers"), []))
    got = state_rows(path).set_index("account").sort_index()
    assert got["balance_cents"].to_dict() == {f"acct-{i}": 110 for i in range(4)}  # added once, not twice
    assert got["event_count"].to_dict() == {f"acct-{i}": 2 for i in range(4)}
    from deltalake import DeltaTable

    ops = [h["operation"] for h in DeltaTable(path).history()]
    assert "OPTIMIZE" in ops and ops[0] == "WRITE", ops  # the compaction landed first, our run after it


def test_a_users_optimize_racing_our_compaction_leaves_the_same_state(spark, tmp_path, monkeypatch):
    """Folding the runs overwrites the table with its state; another engine's OPTIMIZE (the same
    rows in fewer files) landing while the fold runs changes no state, whichever commits first."""
    from pyspark.sql import functions as F

    path = str(tmp_path / "state")
    table = _state(spark, path)
    os.makedirs(tmp_path / "markers")
    table.add(spark.createDataFrame([(0, "acct-0", 10, 1)], "key_group int, account string, balance_cents long, "
                                    "event_count long"))
    marker = str(tmp_path / "markers")

    def optimize_once(x):
        import os as _os

        try:
            _os.close(_os.open(f"{marker}/fired-fold", _os.O_CREAT | _os.O_EXCL | _os.O_WRONLY))
        except FileExistsError:
            return x
        from deltalake import DeltaTable

        DeltaTable(path).optimize.compact()
        return x

    racing = F.udf(optimize_once, "long")
    real = table.stored
    monkeypatch.setattr(table, "stored", lambda version=None: real(version).where(
        racing(F.col("balance_cents")).isNotNull()))
    table.compact()
    monkeypatch.undo()
    assert os.path.exists(f"{marker}/fired-fold")
    got = state_rows(path).set_index("account")["balance_cents"].to_dict()
    assert got == {"acct-0": 110, "acct-1": 100, "acct-2": 100, "acct-3": 100}
    assert table.stored().count() == 4  # folded: one row per key


def test_a_dead_letter_append_racing_another_attempt_filters_again_and_lands_each_row_once(spark, tmp_path, monkeypatch):
    """Two attempts append the dead letters of overlapping steps: the other one commits (versions up
    to 1) between our filter (on no stamp) and our commit (versions up to 2). Our commit is a
    compare-and-swap on the snapshot we filtered on, so it is refused, and we filter again: each
    bad row lands once."""
    from checkpoint_lib.pipelines import get
    from checkpoint_lib.spark.runner import PipelineRunner
    from checkpoint_lib.spark.sinks import app_prefix

    runner = PipelineRunner(get("payments"), str(tmp_path), spark, stage="source")
    runner.open()
    dead_letters = runner.sources["source"].dead_letters
    bad = spark.createDataFrame(
        [(f"e{v}-{i}", None, 5, None, "null or empty account", v, f"part-{v}.parquet", i) for v in range(3) for i in range(2)],
        "event_id string, account string, amount_cents long, ts timestamp, _ckpt_error string, src_version long, "
        "src_file string, src_row long",
    )
    real, raced = tables.stamped_commit, []

    def other_attempt_first(path, *a, **kw):
        if not raced:
            raced.append(path)
            monkeypatch.setattr(tables, "stamped_commit", real)
            dead_letters.append(bad.where("src_version <= 1"), 1, runner.epoch)  # the other attempt, a shorter step
            monkeypatch.setattr(tables, "stamped_commit", other_attempt_first)
        return real(path, *a, **kw)

    monkeypatch.setattr(tables, "stamped_commit", other_attempt_first)
    dead_letters.append(bad, 2, runner.epoch)
    assert raced
    got = read_delta(dead_letters.path)
    assert sorted(zip(got["src_version"], got["src_row"])) == [(v, i) for v in range(3) for i in range(2)]
    assert tables.stamp_of(dead_letters.path, f"{app_prefix('payments')}/dlq") == 2
    dead_letters.append(bad, 2, runner.epoch)  # a retry of the same step adds nothing
    assert len(read_delta(dead_letters.path)) == 6


def test_a_truncation_racing_a_users_optimize_is_planned_again_and_deletes_exactly_its_rows(spark, tmp_path):
    """A channel log's truncation (a DELETE) while a user's OPTIMIZE compacts the same files: Delta
    refuses our commit, which is planned again on the compacted snapshot (it raised before)."""
    from pyspark.sql import functions as F

    path = str(tmp_path / "log")
    for seq in range(4):  # four small files: something for OPTIMIZE to compact
        spark.createDataFrame([(seq, 1, f"r{seq}")], "seq long, epoch long, record string") \
            .write.format("delta").mode("append").save(path)
    marker = str(tmp_path / "optimized")

    def compact_once(seq):
        import os as _os

        try:  # once, whichever task gets there first: after our DELETE took its snapshot
            _os.close(_os.open(marker, _os.O_CREAT | _os.O_EXCL | _os.O_WRONLY))
        except FileExistsError:
            return seq
        from deltalake import DeltaTable

        DeltaTable(path).optimize.compact()
        return seq

    udf = F.udf(compact_once, "long", useArrow=False)  # an Arrow UDF in a filter hangs on Spark 4.2 here
    retries = []
    from unittest import mock

    with mock.patch.object(tables.log, "warning", side_effect=retries.append):
        tables.delete_where(spark, path, udf(F.col("seq")) <= 1, what="truncating the log")
    assert sorted(r.seq for r in spark.read.format("delta").load(path).collect()) == [2, 3]
    assert len(retries) == 1 and "truncating the log: conflict with a concurrent writer" in retries[0], retries
    from deltalake import DeltaTable

    ops = [h["operation"] for h in DeltaTable(path).history()]
    assert ops[:2] == ["DELETE", "OPTIMIZE"], ops  # the compaction landed first, our DELETE after it


def test_a_writer_that_keeps_conflicting_gets_a_clear_error_and_nothing_of_ours_lands(spark, tmp_path, monkeypatch):
    """Another writer appends to the table during every attempt of our DELETE: each attempt is
    refused by Delta, and after the last one a ConcurrentWriterError names what we were doing and
    the conflict; no attempt of ours committed (the rows it would delete are all there)."""
    from pyspark.sql import functions as F

    path = str(tmp_path / "log")
    spark.createDataFrame([(seq, 1) for seq in range(4)], "seq long, epoch long").write.format("delta").save(path)

    def append_meanwhile(seq):  # a foreign append after our DELETE took its snapshot, every time
        import pyarrow as pa
        from deltalake import write_deltalake

        write_deltalake(path, pa.table({"seq": pa.array([100 + seq], pa.int64()), "epoch": pa.array([1], pa.int64())}),
                        mode="append")
        return seq

    udf = F.udf(append_meanwhile, "long", useArrow=False)
    monkeypatch.setattr(tables, "CONFLICT_ATTEMPTS", 3)
    monkeypatch.setattr(tables.time, "sleep", lambda s: None)
    with pytest.raises(tables.ConcurrentWriterError, match="truncating the log: 3 attempts conflicted"):
        tables.delete_where(spark, path, udf(F.col("seq")) <= 1, what="truncating the log")
    from deltalake import DeltaTable

    ops = [h["operation"] for h in DeltaTable(path).history()]
    assert "DELETE" not in ops, ops  # nothing of ours committed
    assert {0, 1, 2, 3} <= set(DeltaTable(path).to_pyarrow_table().column("seq").to_pylist())


def test_a_truncation_with_nothing_in_range_runs_no_spark_job(spark, tmp_path, monkeypatch):
    """What the files' statistics rule out is not DELETEd at all (a log at a first start, or
    consumed already); what they may hold is, and exactly that."""
    path = str(tmp_path / "log")
    for seq, epoch in ((0, 1), (1, 1), (2, 2)):
        spark.createDataFrame([(seq, epoch)], "seq long, epoch long").write.format("delta").mode("append").save(path)
    deletes = []
    real = tables.delete_where
    monkeypatch.setattr(tables, "delete_where", lambda *a, **k: (deletes.append(k["what"]), real(*a, **k)))
    assert not tables.may_hold(str(tmp_path / "missing"), {"seq": (0, None)})
    for what, bounds in (("past the end", {"seq": (3, None)}), ("an older epoch", {"epoch": (None, 0)}),
                         ("below the start", {"seq": (None, -1), "epoch": (None, 2)}),
                         ("empty range", {"seq": (1, 2), "epoch": (3, 3)})):
        tables.delete_within(spark, path, bounds, what=what)
    assert deletes == []
    tables.delete_within(spark, path, {"seq": (1, None), "epoch": (None, 1)}, what="seq 1 of epoch 1")
    assert deletes == ["seq 1 of epoch 1"]
    assert sorted((r.seq, r.epoch) for r in spark.read.format("delta").load(path).collect()) == [(0, 1), (2, 2)]


def test_a_channel_log_a_user_turned_deletion_vectors_on_is_indexed_by_spark_alike(spark, tmp_path):
    """The index is read by delta-rs; a log with deletion vectors (a user's ALTER TABLE, then a
    DELETE that writes one) is read by Spark instead, and gives the same events; its truncation is
    Delta's DELETE (a remove must name a file's deletion vector, which delta-rs's cannot)."""
    from deltalake import DeltaTable
    from pyspark.sql import types as T

    from checkpoint_lib.spark.channels import DeltaChannelLog

    payload = T.StructType([T.StructField("v", T.LongType())])
    log = DeltaChannelLog(spark, str(tmp_path / "log"), payload)
    log.create()
    data = spark.createDataFrame([(0, r, v) for r in (0, 1) for v in range(3)], "sender int, receiver int, v long")
    log.write([("data", 1, data), ("barrier", 2, (7, 1.5), [0], [0, 1])], epoch=1)
    log.write([("data", 3, data)], epoch=1)
    before = log.index(1)
    assert [(e.seq, e.receiver, e.kind, e.rows) for e in before] == [
        (1, 0, "data", 3), (1, 1, "data", 3), (2, 0, "barrier", 0), (2, 1, "barrier", 0), (3, 0, "data", 3), (3, 1, "data", 3)]
    spark.sql(f"ALTER TABLE delta.`{log.path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    assert log._index_rows(1, None, -1) is None  # delta-rs datasets refuse the feature: Spark reads it
    assert log.index(1) == before
    spark.sql(f"DELETE FROM delta.`{log.path}` WHERE seq = 1 AND receiver = 0 AND record.v = 0").collect()
    assert any(b.num_rows for b in DeltaTable(log.path).deletion_vectors())  # a file's rows partly deleted
    assert [(e.seq, e.receiver, e.rows) for e in log.index(1)][:2] == [(1, 0, 2), (1, 1, 3)]
    assert not tables.remove_files_within(log.path, {"seq": (None, 1), "epoch": (None, 1)}, what="a truncation")
    log.truncate_upto(1, 1)  # Delta's DELETE
    assert log.index(1) == before[2:]
    assert log.index(1, after=2) == before[4:]

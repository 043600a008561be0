"""The fence is part of the write (issue 24, items 4 and 5): a zombie of an older epoch that
passed every check and then stalled must find its late write refused by Delta inside its own
commit, not merely by a read before it. Each test lets the newer epoch fence the table exactly at
the worst instant: after the zombie decided to write, or (through another Delta implementation,
from inside the zombie's own Spark job) after its transaction read the table and before it commits.

Tried / lost / duplicated: every test asserts the zombie's rows did not land (nothing duplicated),
the newer epoch's rows are all there (nothing lost), and the zombie learns it is fenced."""

from __future__ import annotations

import os

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from checkpoint_lib.core.acks import PinnedState
from checkpoint_lib.core.errors import FencedError
from checkpoint_lib.core.keygroups import DEFAULT_MAX_PARALLELISM, KeyGroupRange
from checkpoint_lib.core.twophase import Transaction
from checkpoint_lib.spark import tables
from checkpoint_lib.spark.channels import DeltaChannelLog
from checkpoint_lib.spark.sinks import DeltaTwoPhaseSink
from checkpoint_lib.spark.state import KeyedStateTable
from checkpoint_lib.verify import read_delta
from state_rows import state_rows

pytestmark = [pytest.mark.spark, pytest.mark.race]
SCHEMA = T.StructType([T.StructField("account", T.StringType()), T.StructField("amount_cents", T.LongType())])
STATE_APP = "checkpoint_lib/p/state/op"


def _fence_from_another_engine(path: str, app_id: str, epoch: int, marker: str):
    """A UDF (identity on a long column) that, the first time Spark evaluates it - inside the
    zombie's job, after its transaction took its snapshot - commits the newer epoch's fence to
    ``path`` through delta-rs: another process, another Delta implementation."""

    def fence(x):
        import os as _os

        try:
            _os.close(_os.open(marker, _os.O_CREAT | _os.O_EXCL | _os.O_WRONLY))
        except FileExistsError:
            return x
        import pyarrow as pa
        from deltalake import CommitProperties, DeltaTable, Transaction as AppTxn, write_deltalake

        dt = DeltaTable(path)
        write_deltalake(dt, pa.schema(dt.schema().to_arrow()).empty_table(), mode="append",
                        commit_properties=CommitProperties(app_transactions=[AppTxn(app_id, epoch << 32)]))
        return x

    return F.udf(fence, "long", useArrow=False)  # an Arrow UDF stalls inside the MERGE of staged Parquet files


# --- sinks ------------------------------------------------------------------------------------


def _sink(spark, tmp_path, mode="append") -> DeltaTwoPhaseSink:
    sink = DeltaTwoPhaseSink(spark, "ledger", str(tmp_path / "ledger"), str(tmp_path / "staging"), SCHEMA,
                             app_prefix="checkpoint_lib/p", mode=mode, keys=["account"] if mode == "upsert" else ())
    sink.create()
    return sink


def _stage(spark, sink, txn: Transaction, rows) -> None:
    df = spark.createDataFrame([(0, *r) for r in rows], "sink_subtask int, account string, amount_cents long")
    sink.stage(df, {0: txn}, flush=1)


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_sink_commit_by_a_zombie_that_stalled_past_its_check_is_refused_in_the_commit(spark, tmp_path, mode):
    """Epoch 1 completed checkpoint 3, checked its epoch (still current) and stalled; epoch 2
    recovered to checkpoint 2 (fence first, then the rollback). Epoch 1's commit of checkpoint 3
    then lands nothing."""
    sink = _sink(spark, tmp_path, mode)
    t2, t3 = Transaction(1, "a", 1, checkpoint_id=2), Transaction(2, "a", 1, checkpoint_id=3)
    _stage(spark, sink, t2, [("x", 10)])
    _stage(spark, sink, t3, [("y", 20)])
    sink.commit([t2], 2, writer_epoch=1)
    newer = _sink(spark, tmp_path, mode)
    newer.fence(2)  # the recovery of epoch 2, before its rollback to checkpoint 2
    with pytest.raises(FencedError, match="epoch 1 is fenced: epoch 2"):
        sink.commit([t3], 3, writer_epoch=1)  # check_epoch passed long ago: none here
    assert sorted(read_delta(sink.target)["account"]) == ["x"]
    assert sink.stamp() == (2, 2) and newer.is_committed(t2) and not newer.is_committed(t3)


def test_an_append_commit_racing_the_fence_between_its_check_and_its_commit_is_refused(spark, tmp_path, monkeypatch):
    """An append sink commits the files it wrote with one delta-rs commit placed on the snapshot
    whose stamp it checked. The newer epoch's fence lands right after that check, from another
    Delta implementation (Spark): the commit loses the version, reads again, finds the fence and is
    refused; nothing of it lands and the zombie is told it is fenced."""
    from deltalake import DeltaTable

    sink = _sink(spark, tmp_path)
    t3 = Transaction(2, "a", 1, checkpoint_id=3)
    _stage(spark, sink, t3, [("y", 20)])
    commit, fired = DeltaTable.create_write_transaction, []

    def fence_first(self, *a, **kw):
        if not fired:
            fired.append(1)
            tables.raise_fence(spark, sink.target, sink.app_id, 2)
        return commit(self, *a, **kw)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", fence_first)
    with pytest.raises(FencedError):
        sink.commit([t3], 3, writer_epoch=1)
    assert fired and read_delta(sink.target).empty and sink.stamp() == (2, 0)


@pytest.mark.slow  # CI tier: CI keeps the stalled zombies of this module and the append race above
def test_an_upsert_commit_racing_the_fence_inside_its_own_job_is_refused(spark, tmp_path):
    """The fence lands while the zombie's MERGE job runs (after it read the staged files and the
    table's stamp): Delta finds the conflict on the application id, the retry sees the fence and
    skips, and the zombie is told it is fenced."""
    sink = _sink(spark, tmp_path, "upsert")
    t3 = Transaction(2, "a", 1, checkpoint_id=3)
    _stage(spark, sink, t3, [("y", 20)])
    udf = _fence_from_another_engine(sink.target, sink.app_id, 2, str(tmp_path / "fired"))

    class Reader:  # the staged rows pass through the UDF, so the fence fires inside the job
        def __init__(self, reader):
            self.reader = reader

        def schema(self, schema):
            return Reader(self.reader.schema(schema))

        def parquet(self, *paths):
            df = self.reader.parquet(*paths)
            staged = all(p.startswith(sink.transactions) for p in paths)
            return df.withColumn("amount_cents", udf(F.col("amount_cents"))) if staged else df

    class Session:
        def __init__(self, s):
            self.s = s

        def __getattr__(self, name):
            return getattr(self.s, name)

        @property
        def read(self):
            return Reader(self.s.read)

    sink.spark = Session(spark)
    with pytest.raises(FencedError):
        sink.commit([t3], 3, writer_epoch=1)
    assert os.path.exists(tmp_path / "fired")
    assert read_delta(sink.target).empty and sink.stamp() == (2, 0)


def test_tables_stamped_by_the_older_scheme_still_tell_what_is_committed(spark, tmp_path):
    sink = _sink(spark, tmp_path)
    t2 = Transaction(1, "a", 1, checkpoint_id=2)
    spark.createDataFrame([("x", 10)], SCHEMA).write.format("delta").mode("append") \
        .option("txnAppId", sink.legacy_app_id(1)).option("txnVersion", "2").save(sink.target)
    assert sink.is_committed(t2) and not sink.is_committed(Transaction(1, "b", 2, checkpoint_id=2))
    sink.fence(2)
    assert sink.is_committed(t2) and sink.stamp()[0] == 2


# --- keyed state ------------------------------------------------------------------------------


def _state(spark, path) -> KeyedStateTable:
    values = T.StructType([T.StructField("balance_cents", T.LongType())])
    table = KeyedStateTable(spark, path, "account", values, app_id=STATE_APP)
    tables.create_if_missing(spark, path, table.schema)  # no deletion vectors: delta-rs writes it too
    spark.createDataFrame([(0, "acct-0", 100, None, None)], table.schema).write.format("delta").mode("append").save(path)
    return table


def _deltas(spark, cents=10):
    return spark.createDataFrame([(0, "acct-0", cents)], "key_group int, account string, balance_cents long")


def test_a_state_merge_by_a_zombie_after_the_fence_lands_nothing(spark, tmp_path):
    path = str(tmp_path / "state")
    state = _state(spark, path)
    state.add(_deltas(spark), epoch=1)
    state.fence(2)
    with pytest.raises(FencedError):
        state.add(_deltas(spark, 1000), epoch=1)
    assert state_rows(path)["balance_cents"].tolist() == [110]
    state.add(_deltas(spark, 5), epoch=2)  # the newer epoch writes on
    assert state_rows(path)["balance_cents"].tolist() == [115]


@pytest.mark.parametrize("writer", ["delta-rs", "delta"])
def test_a_zombie_flush_after_a_newer_epoch_wrote_the_state_is_told_it_is_fenced(spark, tmp_path, writer):
    """The zombie read the state at a version; the newer epoch then fenced the table and wrote runs
    (its restore, its replay). The zombie's flush is refused as fenced, the error it exits with,
    not as a state "changed by another writer" (the newer attempt is this pipeline), and lands
    nothing; whether a run is committed by delta-rs or (a column-mapped table) by Delta's append."""
    path = str(tmp_path / "state")
    state = _state(spark, path)
    if writer == "delta":
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
                  "'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')")
        from deltalake import DeltaTable

        assert tables.files_commit_problem(DeltaTable(path)) is not None
    read_at = state.add(_deltas(spark), epoch=1)
    state.fence(2)
    state.add(_deltas(spark, 5), epoch=2)
    with pytest.raises(FencedError):
        state.apply(_deltas(spark, 1000), replace=False, before_retry=lambda: None, epoch=1, read_at=read_at)
    assert state_rows(path)["balance_cents"].tolist() == [115]


def test_the_state_tables_fence_is_a_stamp_alone_committed_by_delta_rs(spark, tmp_path):
    """The state table has deletion vectors, yet its fence is one delta-rs commit of the stamp alone
    (no Spark job); the same epoch may fence again, an older one is refused."""
    from deltalake import DeltaTable

    path = str(tmp_path / "state")
    values = T.StructType([T.StructField("balance_cents", T.LongType())])
    state = KeyedStateTable(spark, path, "account", values, app_id=STATE_APP)
    state.create()  # as the runner creates it: deletion vectors on
    state.add(_deltas(spark), epoch=1)
    assert "deletionVectors" in (DeltaTable(path).protocol().writer_features or [])
    before = DeltaTable(path).version()
    state.fence(2)
    dt = DeltaTable(path)
    assert dt.version() == before + 1, [(h.get("version"), h.get("operation")) for h in dt.history(5)]
    last = dt.history(1)[0]
    assert "delta-rs" in str(last.get("engineInfo", last.get("clientVersion", ""))), last
    assert tables.split_version(dt.transaction_version(STATE_APP)) == (2, before + 1)
    state.fence(2)  # again (a retried recovery step): still epoch 2's
    assert tables.split_version(DeltaTable(path).transaction_version(STATE_APP))[0] == 2
    with pytest.raises(FencedError):
        state.fence(1)


@pytest.mark.slow  # CI tier: CI keeps the stalled zombies of this module
def test_a_state_merge_racing_the_fence_inside_its_own_job_is_refused(spark, tmp_path):
    path = str(tmp_path / "state")
    state = _state(spark, path)
    udf = _fence_from_another_engine(path, STATE_APP, 2, str(tmp_path / "fired"))
    deltas = _deltas(spark, 1000).withColumn("balance_cents", udf(F.col("balance_cents")))
    with pytest.raises(FencedError):
        state.add(deltas, epoch=1)
    assert os.path.exists(tmp_path / "fired")
    assert state_rows(path)["balance_cents"].tolist() == [100]


def test_a_recovery_restoring_what_the_state_table_still_holds_writes_nothing(spark, tmp_path):
    """A kill after a checkpoint and before the next flush leaves the state table at the version the
    snapshot pinned: the recovery's restore commits nothing (the fence is the only commit since);
    one flush later, it rewrites. An older epoch's restore is refused either way."""
    path = str(tmp_path / "state")
    state = _state(spark, path)
    pinned = state.add(_deltas(spark), epoch=1)
    everything = [PinnedState(pinned, KeyGroupRange(0, DEFAULT_MAX_PARALLELISM - 1))]
    state.fence(2)
    fenced = state.version()
    state.restore(everything, epoch=2)
    assert state.version() == fenced and state_rows(path)["balance_cents"].tolist() == [110]
    with pytest.raises(FencedError):
        state.restore(everything, epoch=1)
    state.add(_deltas(spark, 5), epoch=2)  # a flush after the snapshot: the restore rewrites
    state.fence(3)
    state.restore(everything, epoch=3)
    assert state.version() == fenced + 3 and state_rows(path)["balance_cents"].tolist() == [110]


@pytest.mark.slow  # CI tier: a full run and two recoveries
def test_a_stalled_older_recovery_cannot_restore_over_the_newer_one(spark, tmp_path):
    path = str(tmp_path / "state")
    state = _state(spark, path)
    pinned = state.version()
    state.add(_deltas(spark), epoch=1)
    state.fence(3)
    state.restore([PinnedState(pinned, KeyGroupRange(0, 32767))], epoch=3)  # epoch 3 restores
    state.add(_deltas(spark, 7), epoch=3)
    with pytest.raises(FencedError):  # epoch 2's recovery wakes up and restores: refused
        state.restore([PinnedState(pinned, KeyGroupRange(0, 32767))], epoch=2)
    with pytest.raises(FencedError):
        state.clear(epoch=2)
    assert state_rows(path)["balance_cents"].tolist() == [107]


# --- channel logs -----------------------------------------------------------------------------


def test_a_zombies_channel_deletes_never_touch_a_newer_epochs_rows(spark, tmp_path):
    payload = T.StructType([T.StructField("amount_cents", T.LongType())])
    log = DeltaChannelLog(spark, str(tmp_path / "channel"), payload)
    log.create()
    rows = [(0, 0, seq, "data", None, None, epoch, (1,)) for epoch in (1, 2) for seq in range(4)]  # the record in its struct
    spark.createDataFrame(rows, log.schema).write.format("delta").mode("append").save(log.path)
    log.truncate_upto(2, epoch=1)  # the zombie (epoch 1): consumed up to 2
    log.truncate_after(0, epoch=1)  # a stalled recovery of epoch 1
    log.clear(epoch=1)
    left = read_delta(log.path)
    assert sorted(zip(left["epoch"], left["seq"])) == [(2, 0), (2, 1), (2, 2), (2, 3)]


@pytest.mark.parametrize("mode", [pytest.param("append", marks=pytest.mark.slow), "upsert"])  # CI tier: [upsert]
def test_a_rollback_to_a_checkpoint_committed_together_with_the_next_keeps_its_rows(spark, tmp_path, mode):
    """Checkpoint 2's notification was late, so checkpoint 3's commit also committed 2's transaction.
    A recovery to checkpoint 2 (epoch 2: fence, roll the sink back to what 2 committed, re-commit
    what 2 owns) must leave exactly 2's rows: 3's undone, 2's neither lost nor doubled."""
    sink = _sink(spark, tmp_path, mode)
    t1, t2, t3 = (Transaction(i, "a", 1, checkpoint_id=i) for i in (1, 2, 3))
    for t, row in ((t1, ("w", 5)), (t2, ("x", 10)), (t3, ("y", 20))):
        _stage(spark, sink, t, [row])
    sink.commit([t1], 1, writer_epoch=1)
    sink.commit([t2, t3], 3, writer_epoch=1)  # the late notification: cumulative
    assert sorted(read_delta(sink.target).itertuples(index=False, name=None)) == [("w", 5), ("x", 10), ("y", 20)]

    recovery = _sink(spark, tmp_path, mode)
    recovery.fence(2)
    recovery.rollback_to(2)
    recovery.commit([t2], 2, writer_epoch=2)  # what checkpoint 2 owns: re-committed if missing
    assert sorted(read_delta(sink.target).itertuples(index=False, name=None)) == [("w", 5), ("x", 10)]
    assert recovery.uncommitted([t1, t2]) == []

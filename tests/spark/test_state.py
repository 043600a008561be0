"""The keyed state table on real Delta: what a flush writes, and that pinned versions stay whole."""

from __future__ import annotations

import os

import pytest

from checkpoint_lib.spark.state import KeyedStateTable, _rows_added, key_group_column

pytestmark = pytest.mark.spark
KEYS = 4000


def _table(spark, path: str) -> KeyedStateTable:
    from pyspark.sql import types as T

    values = T.StructType([T.StructField("balance_cents", T.LongType()), T.StructField("event_count", T.LongType())])
    table = KeyedStateTable(spark, path, "account", values)
    table.create()
    return table


def _deltas(spark, ids, fmt: str = "acct-%05d"):
    """+10 cents and +1 event for the account of every id of the range ``ids`` (start, end, step)."""
    from pyspark.sql import functions as F

    return (
        spark.range(*ids, numPartitions=4)
        .select(F.format_string(fmt, F.col("id")).alias("account"))
        .withColumn("key_group", key_group_column("account"))
        .withColumn("balance_cents", F.lit(10).cast("long")).withColumn("event_count", F.lit(1).cast("long"))
    )


def _removed(path: str, version: int) -> int:
    """The files commit ``version`` removed."""
    from checkpoint_lib.delta.log import commit_actions

    return sum(1 for a in commit_actions(path, version) if "remove" in a)


def _history(spark, path: str, version: int):
    return spark.sql(f"DESCRIBE HISTORY delta.`{path}`").where(f"version = {version}").first()


def test_a_flush_writes_what_changed_not_the_whole_state(spark, tmp_path):
    """A flush appends one run: the new rows of the keys it changed, nothing of the others; the
    state is each key's newest row, and a pinned version reads as it was."""
    from pyspark.sql import functions as F

    path = str(tmp_path / "state")
    table = _table(spark, path)
    first = table.add(_deltas(spark, (0, KEYS)))  # 4,000 keys, spread over several files
    second = table.add(_deltas(spark, (0, KEYS, KEYS // 20)))  # 20 keys, one in every 200: they touch every file
    full, flush = (_history(spark, path, v) for v in (first, second))
    assert (full["operation"], flush["operation"]) == ("WRITE", "WRITE")  # appends: no MERGE, no file rewritten
    assert (_rows_added(path, first), _rows_added(path, second)) == (KEYS, 20)
    assert _removed(path, second) == 0
    assert table.stored().count() == KEYS + 20

    now = table.read().agg(F.sum("balance_cents"), F.sum("event_count"), F.count("*")).first()
    assert tuple(now) == (KEYS * 10 + 20 * 10, KEYS + 20, KEYS)
    pinned = table.read(first).agg(F.sum("balance_cents"), F.count("*")).first()
    assert tuple(pinned) == (KEYS * 10, KEYS)  # the version a snapshot pinned reads as it was
    keys = spark.createDataFrame([("acct-00000",), ("acct-00001",), ("nobody",)], "account string")
    assert {r.account: r.balance_cents for r in table.read_keys(keys).collect()} == {"acct-00000": 20,
                                                                                   "acct-00001": 10}


def _index(df) -> str:
    """Where the scan of ``df`` lists its files: Delta's log (a snapshot rebuilt in Spark) or a list given."""
    plan = df._jdf.queryExecution().executedPlan().toString()
    return "delta" if "DeltaFileIndex" in plan or "TahoeLogFileIndex" in plan else "files" if "InMemoryFileIndex" in plan else plan


def test_a_flush_reads_the_state_files_the_log_lists_and_through_delta_once_a_delete_left_deletion_vectors(
        spark, tmp_path):
    """Delta's own read rebuilds the table's snapshot in Spark jobs at every new version (five of
    every step); the files the log lists hold the same rows, at any version. A DELETE by someone
    else leaves deletion vectors on a state table: its files then hold rows that are gone, and it is
    read through Delta."""
    path = str(tmp_path / "state")
    table = _table(spark, path)
    first = table.add(_deltas(spark, (0, 400)))
    second = table.add(_deltas(spark, (0, 400, 40)))
    delta = lambda v=None: sorted(map(tuple, (spark.read.format("delta").option("versionAsOf", v) if v is not None  # noqa: E731
                                              else spark.read.format("delta")).load(path).collect()))
    for version in (None, first, second):
        stored = table.stored(version)
        assert _index(stored) == "files"
        assert sorted(map(tuple, stored.collect())) == delta(version)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE account = 'acct-00040'")  # deletion vectors (the table's default)
    stored = table.stored()
    assert _index(stored) == "delta" and _index(table.stored(second)) == "files"
    assert sorted(map(tuple, stored.collect())) == delta() and len(delta()) == 400 + 10 - 2
    assert sorted(map(tuple, table.stored(second).collect())) == delta(second)  # before the DELETE: its files


def test_compaction_folds_the_runs_and_changes_no_state_of_any_version(spark, tmp_path):
    from checkpoint_lib.reserved import STATE_RUN

    path = str(tmp_path / "state")
    table = _table(spark, path)
    # 300 accounts, then three flushes of 100 updates each, then a deleted key: runs pile up
    versions = [table.add(_deltas(spark, (0, 300) if i == 0 else (i * 50, i * 50 + 100))) for i in range(4)]
    gone = spark.createDataFrame([("acct-00007", 0, 0, True)], "account string, balance_cents long, "
                                 "event_count long, _delete boolean").withColumn("key_group", key_group_column("account"))
    versions.append(table.replace(gone))
    rows = lambda v: sorted(map(tuple, table.read(v).collect()))  # noqa: E731
    before = {v: rows(v) for v in versions}
    assert len(before[versions[-1]]) == 299 and table.stored().count() == 300 + 3 * 100 + 1
    compacted = table.compact()
    assert compacted == versions[-1] + 1
    commit = _history(spark, path, compacted)
    assert commit["operation"] == "WRITE" and commit["operationParameters"]["mode"] == "Overwrite"
    assert table.stored().count() == 299  # one row per key: replaced rows and the tombstone gone
    assert rows(compacted) == before[versions[-1]]  # the same state
    assert {v: rows(v) for v in versions} == before  # every version a snapshot may pin reads the same
    from checkpoint_lib.delta.log import rows_unchanged_since

    assert rows_unchanged_since(path, versions[-1])  # a restore of the last flush's version has nothing to write
    # each row keeps its run: a flush after the compaction still wins over it
    assert table.stored().where("account = 'acct-00100'").first()[STATE_RUN] == versions[2]
    table.add(_deltas(spark, (100, 101)))
    assert table.read().where("account = 'acct-00100'").first()["balance_cents"] == 40


def test_the_state_kill_points_are_between_a_runs_files_and_its_commit_and_between_the_run_and_its_fold(
        spark, tmp_path):
    """``state_run`` is reached once the run's files are written and before their commit (a kill there
    leaves files nothing refers to); ``state_compact`` (the chaos runs' kill inside a fold) once the
    flush's run has committed and before the fold's overwrite (a kill there leaves the run, unfolded)."""
    path = str(tmp_path / "state")
    table = _table(spark, path)
    first = table.add(_deltas(spark, (0, 10)))
    seen: list[tuple[str, int]] = []
    version = table.apply(_deltas(spark, (5, 15)), replace=False, before_retry=lambda: None, epoch=None,
                          compact=True, reached=lambda phase: seen.append((phase, table.version())))
    assert seen == [("state_run", first), ("state_compact", first + 1)]  # the run not landed, then landed
    assert version == first + 2 and table.stored().count() == 15
    table.apply(_deltas(spark, (0, 1)), replace=False, before_retry=lambda: None, epoch=None,
                reached=lambda phase: seen.append((phase, table.version())))
    assert seen[2:] == [("state_run", first + 2)]  # no fold due: state_compact not reached


@pytest.mark.slow  # CI tier: the fold (test_compaction_folds_...) and the kill point above, reached only when one is due
def test_a_fold_is_due_once_the_runs_outgrow_the_state_and_a_first_run_into_an_empty_table_is_not_one(
        spark, tmp_path, monkeypatch):
    """The runs are folded once the rows appended since the last fold (or since the table was
    opened) outnumber the rows it held then: each appended row is folded O(1) times. A run into an
    empty table replaces nothing (a pipeline's first step, its bootstrap): it is no reason to fold."""
    from checkpoint_lib.spark import state

    monkeypatch.setattr(state, "COMPACT_AT_LEAST", 5)
    table = _table(spark, str(tmp_path / "state"))
    table.add(_deltas(spark, (0, 20)))
    assert not table.due()  # 20 rows into an empty table: nothing to fold
    table.add(_deltas(spark, (0, 10)))
    assert not table.due()  # 10 appended on a table of 20
    table.add(_deltas(spark, (10, 25)))
    assert table.due()  # 25 appended on a table of 20
    table.compact()
    assert not table.due() and table.stored().count() == 25
    reopened = _table(spark, str(tmp_path / "state"))
    reopened.add(_deltas(spark, (0, 24)))
    assert not reopened.due()  # 24 appended on a table of 25
    reopened.add(_deltas(spark, (0, 2)))
    assert reopened.due()


def test_a_table_written_before_runs_is_upgraded_in_place_and_its_rows_are_the_oldest_run(spark, tmp_path):
    """A state table of an earlier release (one row per key, no run columns): opening it adds the
    columns (a metadata commit), its rows read as they were, and flushes after it win."""
    from pyspark.sql import functions as F

    path = str(tmp_path / "state")
    old = _deltas(spark, (0, 10))
    old.write.format("delta").save(path)
    table = _table(spark, path)  # create(): the table exists, so it is upgraded
    assert tuple(table.read().agg(F.sum("balance_cents"), F.count("*")).first()) == (100, 10)
    table.add(_deltas(spark, (0, 2)))
    now = {r.account: r.balance_cents for r in table.read().collect()}
    assert now["acct-00000"] == 20 and now["acct-00005"] == 10 and len(now) == 10
    table.compact()
    assert table.stored().count() == 10 and {r.account: r.balance_cents for r in table.read().collect()} == now


def _age(log_dir, days: float) -> None:
    """Make every commit in ``log_dir`` ``days`` old (without in-commit timestamps a commit's time
    is its file's)."""
    import os
    import time

    then = time.time() - days * 86400
    for f in log_dir.iterdir():
        os.utime(f, (then, then))


@pytest.mark.slow  # a minute; CI tier: our session's time-travel limit lifted (the test below)
def test_a_pinned_version_outlives_deltas_retention_even_in_a_default_session(spark, tmp_path):
    """A savepoint pins a state version for ever. Delta would take it away twice over: its log
    cleanup drops entries older than 30 days when it writes a log checkpoint, and it refuses time
    travel past the deleted-file retention (7 days). The state table's own properties must keep the
    version readable and restorable, even in a session that enforces that retention (the default)."""
    from pyspark.sql import functions as F

    from checkpoint_lib.core.acks import PinnedState
    from checkpoint_lib.core.keygroups import DEFAULT_MAX_PARALLELISM, KeyGroupRange

    path = str(tmp_path / "state")
    table = _table(spark, path)
    pinned = table.add(_deltas(spark, (0, 100)))
    _age(tmp_path / "state" / "_delta_log", 60)  # the pinned version's log, past both retentions
    # a log checkpoint every 2 commits (10 by default), and with it the log cleanup, sooner
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    for _ in range(3):
        table.add(_deltas(spark, (0, 10)))
    assert any(f.name.endswith(".checkpoint.parquet") for f in (tmp_path / "state" / "_delta_log").iterdir())

    enforce = "spark.databricks.delta.vacuum.enforceTimeTravelWithinDeletedFileRetentionDuration"
    ours = spark.conf.get(enforce)
    spark.conf.set(enforce, "true")
    try:
        assert tuple(table.read(pinned).agg(F.sum("balance_cents"), F.count("*")).first()) == (1000, 100)
        table.restore([PinnedState(pinned, KeyGroupRange(0, DEFAULT_MAX_PARALLELISM - 1))])
        assert tuple(table.read().agg(F.sum("balance_cents"), F.count("*")).first()) == (1000, 100)
    finally:
        spark.conf.set(enforce, ours)


def test_our_session_reads_versions_older_than_the_deleted_file_retention(spark, tmp_path):
    """Sinks and sources are not ours to configure, yet a rollback and the quality suites read them
    as an old checkpoint left them: our session lifts Delta 4's time-travel limit (7 days by
    default). A plain table, one version 8 days old: refused with the limit, read without it."""
    from pyspark.errors import AnalysisException

    path = str(tmp_path / "sink")
    spark.range(5).write.format("delta").save(path)
    spark.range(5, 8).write.format("delta").mode("append").save(path)
    _age(tmp_path / "sink" / "_delta_log", 8)
    spark.range(8, 9).write.format("delta").mode("append").save(path)
    old = lambda: spark.read.format("delta").option("versionAsOf", 0).load(path).count()  # noqa: E731

    enforce = "spark.databricks.delta.vacuum.enforceTimeTravelWithinDeletedFileRetentionDuration"
    assert spark.conf.get(enforce) == "false"
    spark.conf.set(enforce, "true")
    try:
        with pytest.raises(AnalysisException, match="deletedFileRetentionDuration"):
            old()
    finally:
        spark.conf.set(enforce, "false")
    assert old() == 5


def test_replace_sets_deletes_and_leaves_untouched_keys_alone(spark, tmp_path):
    """General keyed state: a flush's rows replace their keys' state, ``_delete`` removes a key,
    keys it does not name keep theirs, and the version before reads as it was."""
    from pyspark.sql import functions as F

    path = str(tmp_path / "state")
    table = _table(spark, path)
    before = table.add(_deltas(spark, (0, 10)))  # acct-00000..09: 10 cents, 1 event each
    rows = spark.createDataFrame(
        [("acct-00001", 500, 7, False), ("acct-00002", 0, 0, True), ("acct-00042", 3, 1, False),
         ("acct-00043", 9, 9, True)],  # a new key deleted: nothing is inserted
        "account string, balance_cents long, event_count long, _delete boolean",
    ).withColumn("key_group", key_group_column("account"))
    after = table.replace(rows)
    now = {r.account: (r.balance_cents, r.event_count) for r in table.read(after).collect()}
    assert now["acct-00001"] == (500, 7)  # replaced, not added
    assert "acct-00002" not in now and "acct-00043" not in now
    assert now["acct-00042"] == (3, 1)
    assert now["acct-00003"] == (10, 1) and len(now) == 10  # untouched keys keep their state
    assert table.read(before).agg(F.sum("balance_cents")).first()[0] == 100  # the pinned version is whole

    # without the delete column, every row is a new value
    again = table.replace(spark.createDataFrame([("acct-00001", 1, 1)], "account string, balance_cents long, "
                                                "event_count long").withColumn("key_group", key_group_column("account")))
    assert {r.account: r.balance_cents for r in table.read(again).collect()}["acct-00001"] == 1


@pytest.mark.parametrize("change", ["restore", pytest.param("append", marks=pytest.mark.slow),
                                    pytest.param("optimize", marks=pytest.mark.slow)])  # CI tier: [restore]
def test_a_flush_refuses_a_run_on_rows_another_writer_changed_since_it_read_them(spark, tmp_path, change):
    """A keyed state table is written by its pipeline alone: a RESTORE or an append by someone else
    after the version a flush read would leave the flush's run on top of other rows (the keys it
    did not touch wrong from then on). The flush refuses before writing; the next run recovers from
    its checkpoint. An OPTIMIZE (no row changed) is no reason to refuse."""
    from checkpoint_lib.spark.state import StateTableChangedError

    path = str(tmp_path / "state")
    table = _table(spark, path)
    table.add(_deltas(spark, (0, 100)))
    read_at = table.add(_deltas(spark, (0, 50)))
    if change == "restore":
        spark.sql(f"RESTORE TABLE delta.`{path}` TO VERSION AS OF {read_at - 1}").collect()
    elif change == "append":
        _deltas(spark, (0, 5), "ext-%d").withColumnRenamed("key_group", "key_group").write.format("delta") \
            .mode("append").save(path)
    else:
        spark.sql(f"OPTIMIZE delta.`{path}`").collect()
    before = table.version()

    def flush():
        return table.apply(_deltas(spark, (50, 60)), replace=False, before_retry=lambda: None, epoch=None,
                           read_at=read_at)

    if change == "optimize":
        assert flush() == before + 1
        return
    with pytest.raises(StateTableChangedError, match=rf"after version {read_at}.*not written.*recovers"):
        flush()
    assert table.version() == before  # nothing written


def _engine(path: str, version: int) -> str:
    """Who wrote commit ``version``: its commitInfo's engine."""
    from checkpoint_lib.delta.log import commit_actions

    info = next(a["commitInfo"] for a in commit_actions(path, version) if "commitInfo" in a)
    return str(info.get("engineInfo", ""))


def test_a_foreign_change_racing_a_flushs_run_makes_it_decide_again_and_refuse(spark, tmp_path, monkeypatch):
    """The run's files are written, then a RESTORE lands before their commit: the commit, placed on
    the snapshot the checks were made on, loses; its files are deleted; the next attempt sees the
    RESTORE and refuses before writing anything. A run is one delta-rs commit, stamped for its epoch."""
    from checkpoint_lib.delta import pending
    from checkpoint_lib.spark import tables
    from checkpoint_lib.spark.state import StateTableChangedError

    path = str(tmp_path / "state")
    table = _table(spark, path)
    table.app_id = "ckpt-test-state"
    table.add(_deltas(spark, (0, 100)), epoch=1)
    read_at = table.add(_deltas(spark, (0, 50)), epoch=1)
    assert "delta-rs" in _engine(path, read_at)
    assert tables.split_version(tables.stamp_of(path, table.app_id)) == (1, read_at)
    describe = pending.describe_written
    written = []

    def racing(folder, root):
        written.append(folder)
        spark.sql(f"RESTORE TABLE delta.`{path}` TO VERSION AS OF {read_at - 1}").collect()
        monkeypatch.setattr(pending, "describe_written", describe)
        return describe(folder, root)

    monkeypatch.setattr(pending, "describe_written", racing)
    retried = []
    with pytest.raises(StateTableChangedError, match=r"RESTORE at version .*not written"):
        table.apply(_deltas(spark, (50, 60)), replace=False, before_retry=lambda: retried.append(1), epoch=1,
                    read_at=read_at)
    assert table.version() == read_at + 1 and retried == [1]  # the RESTORE alone; the epoch checked before retrying
    assert len(written) == 1 and not os.path.exists(written[0])  # the lost attempt's files are gone


@pytest.mark.slow  # CI tier: the run's own race (above) and this fallback's use (the test below)
def test_a_foreign_change_racing_a_run_appended_through_delta_is_refused_just_after_it(spark, tmp_path, monkeypatch):
    """A table delta-rs may not add files to (column mapping) takes its runs through Delta's append:
    a RESTORE landing between the flush's check and its commit lets the run land (its commit carries
    the fence's stamp, so it is told from the foreign one), then the flush refuses, saying so."""
    from checkpoint_lib.spark.state import StateTableChangedError

    path = str(tmp_path / "state")
    table = _table(spark, path)
    _map_column_names(spark, path)
    table.app_id = "ckpt-test-state"
    table.add(_deltas(spark, (0, 100)), epoch=1)
    read_at = table.add(_deltas(spark, (0, 50)), epoch=1)
    save = KeyedStateTable._save

    def racing(self, writer, epoch, sequence):
        spark.sql(f"RESTORE TABLE delta.`{path}` TO VERSION AS OF {read_at - 1}").collect()
        monkeypatch.setattr(KeyedStateTable, "_save", save)
        return save(self, writer, epoch, sequence)

    monkeypatch.setattr(KeyedStateTable, "_save", racing)
    with pytest.raises(StateTableChangedError, match=r"RESTORE at version .*landed after it"):
        table.apply(_deltas(spark, (50, 60)), replace=False, before_retry=lambda: None, epoch=1, read_at=read_at)
    assert table.version() == read_at + 2  # the RESTORE, then the run


def test_a_log_checkpoint_delta_rs_writes_keeps_the_deletion_vectors_delta_wrote(spark, tmp_path):
    """Runs, fences and sink commits are delta-rs commits on tables Spark also writes, and delta-rs
    writes the log checkpoints at its commits: a checkpoint must keep the deletion vectors a DELETE
    by Spark left, or the deleted rows would come back for every reader."""
    from deltalake import DeltaTable

    path = str(tmp_path / "state")
    table = _table(spark, path)
    table.add(_deltas(spark, (0, 100)))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE account < 'acct-00010'").collect()
    assert any(b.num_rows for b in DeltaTable(path).deletion_vectors())  # the DELETE left deletion vectors
    DeltaTable(path).create_checkpoint()
    assert spark.read.format("delta").load(path).count() == 90
    assert table.stored().count() == 90


def _map_column_names(spark, path: str) -> None:
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name')").collect()


def test_a_table_delta_rs_cannot_add_files_to_takes_its_runs_through_delta(spark, tmp_path):
    """Column mapping (files whose column names are not the table's) is beyond a delta-rs commit of
    Spark's Parquet files: such a state table's runs are Delta appends, and its state reads right."""
    from pyspark.sql import functions as F

    path = str(tmp_path / "state")
    table = _table(spark, path)
    table.add(_deltas(spark, (0, 100)))
    _map_column_names(spark, path)
    version = table.add(_deltas(spark, (0, 10)))
    assert "Apache-Spark" in _engine(path, version)
    now = table.read().agg(F.sum("balance_cents"), F.sum("event_count"), F.count("*")).first()
    assert tuple(now) == (100 * 10 + 10 * 10, 110, 100)


def test_restoring_a_version_whose_files_a_vacuum_deleted_is_refused_clearly(spark, tmp_path):
    """After an OPTIMIZE and a VACUUM with no retention (the safety check off), an older
    version's files are gone: restoring it is refused with what happened and what to do, before
    Spark reads a file."""
    from deltalake import DeltaTable

    from checkpoint_lib.core.acks import PinnedState
    from checkpoint_lib.core.keygroups import KeyGroupRange
    from checkpoint_lib.spark.state import StateFilesLostError

    path = str(tmp_path / "state")
    table = _table(spark, path)
    pinned = table.add(_deltas(spark, (0, 100)))
    table.add(_deltas(spark, (0, 50)))
    spark.sql(f"OPTIMIZE delta.`{path}`").collect()
    # another tool's VACUUM (delta-rs: Spark's own takes a minute and more on 2 cores for these few files)
    DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with pytest.raises(StateFilesLostError, match=rf"files of version {pinned}.*are gone.*--checkpoint N"):
        table.restore([PinnedState(pinned, KeyGroupRange(0, 127))])

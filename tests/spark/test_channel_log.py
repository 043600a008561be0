"""A channel log on real Delta: a step's append is one Spark write and one delta-rs commit, and a
segment is read from the files the log lists for its positions, not through Delta's snapshot."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from checkpoint_lib.delta.log import commit_actions, latest_version
from checkpoint_lib.spark.channels import BARRIER, DATA, ChannelStateTable, DeltaChannelLog

pytestmark = pytest.mark.spark
PAYLOAD = T.StructType([T.StructField("account", T.StringType()), T.StructField("amount_cents", T.LongType())])


def _segment(spark, seq: int, receivers=(0, 1, 2), rows: int = 6):
    """``rows`` records per receiver, from sender 0 and 1 alternately, amounts ``seq * 1000 + i``."""
    data = [(f"a{r}-{i}", seq * 1000 + i, i % 2, r) for r in receivers for i in range(rows)]
    return spark.createDataFrame(data, "account string, amount_cents long, sender int, receiver int")


def _engine(path: str, version: int) -> str:
    info = next(a["commitInfo"] for a in commit_actions(path, version) if "commitInfo" in a)
    return str(info.get("engineInfo", ""))


def _index(df) -> str:
    plan = df._jdf.queryExecution().executedPlan().toString()
    return "delta" if "DeltaFileIndex" in plan or "TahoeLogFileIndex" in plan else "files" if "InMemoryFileIndex" in plan else plan


def test_a_step_is_one_commit_of_files_by_receiver_and_a_segment_reads_only_its_files(spark, tmp_path):
    log = DeltaChannelLog(spark, str(tmp_path / "channel"), PAYLOAD)
    log.create()
    before = latest_version(log.path)
    for seq in (0, 2, 4):  # three steps: a segment and its barrier each
        log.append(_segment(spark, seq), seq, senders=[0, 1], receivers=[0, 1, 2], barrier=(seq // 2 + 1, 1.5), epoch=3)
    assert latest_version(log.path) == before + 3  # one commit a step, data and barrier together
    last = latest_version(log.path)
    assert "delta-rs" in _engine(log.path, last)
    adds = [a["add"] for a in commit_actions(log.path, last) if "add" in a]
    assert {a["partitionValues"]["receiver"] for a in adds} == {"0", "1", "2"}

    events = log.index(epoch=3)
    assert [(e.seq, e.kind) for e in events if e.receiver == 1 and e.sender == 0] == [
        (0, DATA), (1, BARRIER), (2, DATA), (3, BARRIER), (4, DATA), (5, BARRIER)]
    segment = [e for e in events if e.seq == 2 and e.kind == DATA]
    df = log.read(segment, epoch=3)
    assert _index(df) == "files"  # the log's files, as delta-rs lists them: no snapshot rebuilt by Delta
    got = sorted((r.receiver, r.sender, r.account, r.amount_cents) for r in df.collect())
    assert got == sorted((r, i % 2, f"a{r}-{i}", 2000 + i) for r in (0, 1, 2) for i in range(6))
    second = {"/".join(a["add"]["path"].split("/")[-2:]) for a in commit_actions(log.path, before + 2) if "add" in a}
    read = {"/".join(f.split("/")[-2:]) for f in df.inputFiles()}
    # files of that step alone, by their statistics (not even its files holding only its barriers)
    assert read < second and {f.split("/")[0] for f in read} == {"receiver=0", "receiver=1", "receiver=2"}

    assert log.read([], epoch=3).count() == 0
    assert log.read(segment, epoch=4).count() == 0  # another epoch's reader sees nothing of epoch 3


def test_a_log_delta_rs_cannot_add_files_to_takes_delta_appends_and_reads(spark, tmp_path):
    """Column mapping (files whose column names are not the table's): the step is a Delta append and
    the segment a Delta read, with the same rows."""
    log = DeltaChannelLog(spark, str(tmp_path / "channel"), PAYLOAD)
    log.create()
    spark.sql(f"ALTER TABLE delta.`{log.path}` SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name')").collect()
    log.append(_segment(spark, 0, receivers=(1,)), 0, senders=[0, 1], receivers=[1], epoch=1)
    assert "Apache-Spark" in _engine(log.path, latest_version(log.path))
    df = log.read([e for e in log.index(epoch=1) if e.kind == DATA], epoch=1)
    assert _index(df) == "delta"
    assert sorted(r.amount_cents for r in df.select(F.col("amount_cents")).collect()) == list(range(6))


def test_an_unaligned_checkpoints_channel_state_is_one_commit_and_a_restore_reads_its_files_alone(spark, tmp_path):
    """The records in flight an unaligned checkpoint saved: copied from the log in one Spark write
    and one delta-rs commit; a restore reads them from that checkpoint's files alone, what a
    column-mapped table (Delta's append and read) gives too."""
    log = DeltaChannelLog(spark, str(tmp_path / "channel"), PAYLOAD)
    log.create()
    for seq in (0, 2):
        log.append(_segment(spark, seq), seq, senders=[0, 1], receivers=[0, 1, 2], epoch=1)
    steps = {seq: [e for e in log.index(epoch=1) if e.seq == seq and e.kind == DATA and e.receiver == 1] for seq in (0, 2)}
    state = ChannelStateTable(spark, str(tmp_path / "channel_state"), PAYLOAD)
    state.create()
    mapped = ChannelStateTable(spark, str(tmp_path / "mapped"), PAYLOAD)
    mapped.create()
    spark.sql(f"ALTER TABLE delta.`{mapped.path}` SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name')").collect()
    before = {}
    for table in (state, mapped):
        before[table.path] = latest_version(table.path)
        for cid, seq in ((7, 0), (8, 2)):
            table.append(cid, log.read_packed(steps[seq], 1))
        assert latest_version(table.path) == before[table.path] + 2  # a commit a checkpoint
        assert ("delta-rs" if table is state else "Apache-Spark") in _engine(table.path, before[table.path] + 1)
    for table in (state, mapped):
        df = table.records(8, receivers=[1])
        assert _index(df) == ("files" if table is state else "delta")
        assert sorted((r.sender, r.receiver, r.account, r.amount_cents) for r in df.collect()) == sorted(
            (i % 2, 1, f"a1-{i}", 2000 + i) for i in range(6))
    eighth = {a["add"]["path"].split("/")[-1] for a in commit_actions(state.path, before[state.path] + 2) if "add" in a}
    assert {f.split("/")[-1] for f in state.records(8).inputFiles()} <= eighth  # checkpoint 7's files unread
    assert state.records(9).count() == 0


def _files(path: str) -> set[str]:
    from deltalake import DeltaTable

    return set(DeltaTable(path).file_uris())


def test_truncating_a_log_removes_the_files_of_consumed_steps_in_one_commit_and_keeps_what_straddles(spark, tmp_path):
    """A truncation is one delta-rs commit of remove actions (nothing rewritten): the files of the
    steps at or before the position go, a newer epoch's stay; after a user's OPTIMIZE compacted
    steps together, a file holding later positions too stays until those are truncated as well."""
    log = DeltaChannelLog(spark, str(tmp_path / "channel"), PAYLOAD)
    log.create()
    for seq in (0, 2, 4):
        log.append(_segment(spark, seq), seq, senders=[0, 1], receivers=[0, 1, 2], barrier=(seq // 2 + 1, 1.5), epoch=3)
    log.append(_segment(spark, 6), 6, senders=[0, 1], receivers=[0, 1, 2], epoch=4)  # a newer epoch's step
    before = latest_version(log.path)
    log.truncate_upto(7, epoch=3)  # epoch 3's three steps, not epoch 4's
    assert latest_version(log.path) == before + 1
    actions = list(commit_actions(log.path, before + 1))
    assert "delta-rs" in _engine(log.path, before + 1)
    assert not [a for a in actions if "add" in a] and {a["remove"]["partitionValues"]["receiver"] for a in actions if "remove" in a} == {"0", "1", "2"}
    assert log.index(epoch=3) == [] and [e.seq for e in log.index(epoch=4) if e.receiver == 0 and e.sender == 0] == [6]
    assert spark.read.format("delta").load(log.path).where(F.col("epoch") == 3).count() == 0

    for seq in (8, 10):  # two more steps of epoch 4, then a user's OPTIMIZE: one file per receiver
        log.append(_segment(spark, seq), seq, senders=[0, 1], receivers=[0, 1, 2], barrier=(seq // 2 + 1, 1.5), epoch=4)
    spark.sql(f"OPTIMIZE delta.`{log.path}`").collect()
    compacted = _files(log.path)
    log.truncate_upto(9, epoch=4)  # every file holds position 10 too: nothing removed, nothing lost
    assert _files(log.path) == compacted
    assert [e.seq for e in log.index(epoch=4, after=9) if e.receiver == 0 and e.sender == 0] == [10, 11]
    log.truncate_upto(11, epoch=4)
    assert _files(log.path) == set() and log.index(epoch=4) == []


def test_a_truncation_racing_a_users_optimize_loses_no_row(spark, tmp_path, monkeypatch):
    """The OPTIMIZE commits between the truncation's read of the files and its commit: the files the
    truncation removes are gone already, their rows in the OPTIMIZE's files, and every row is still
    there (delta-rs commits the removes, which change nothing then; were it to refuse them, the
    truncation would remove nothing this time)."""
    from deltalake import DeltaTable

    log = DeltaChannelLog(spark, str(tmp_path / "channel"), PAYLOAD)
    log.create()
    for seq in (0, 2, 4):
        log.append(_segment(spark, seq), seq, senders=[0, 1], receivers=[0, 1, 2], barrier=(seq // 2 + 1, 1.5), epoch=3)
    rows = spark.read.format("delta").load(log.path).count()
    original = DeltaTable.create_write_transaction
    raced = []

    def racing(self, actions, *args, **kwargs):
        if not raced:
            raced.append(True)
            spark.sql(f"OPTIMIZE delta.`{log.path}`").collect()
        return original(self, actions, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", racing)
    version = latest_version(log.path)
    log.truncate_upto(1, epoch=3)  # the first step's files
    assert raced and latest_version(log.path) in (version + 1, version + 2)
    assert spark.read.format("delta").load(log.path).count() == rows
    assert [e.seq for e in log.index(epoch=3) if e.receiver == 0 and e.sender == 0] == [0, 1, 2, 3, 4, 5]


def test_a_log_a_user_added_a_column_to_or_appended_foreign_rows_to_reads_as_before(spark, tmp_path, caplog):
    """Another tool's ALTER TABLE ADD COLUMNS keeps the log's layout (the record in its struct: the
    new column is not a flat record's); rows another tool appended, whose kind is none of ours, are
    ignored, with a warning naming the table."""
    log = DeltaChannelLog(spark, str(tmp_path / "channel"), PAYLOAD)
    log.create()
    log.append(_segment(spark, 0, receivers=(1,)), 0, senders=[0, 1], receivers=[1], barrier=(1, 1.5), epoch=2)
    spark.sql(f"ALTER TABLE delta.`{log.path}` ADD COLUMNS (note STRING)").collect()
    schema = spark.read.format("delta").load(log.path).schema
    row = {"sender": 2, "receiver": 1, "seq": 0, "kind": "ext-kind-0", "epoch": 2, "note": "x"}
    foreign = spark.createDataFrame([tuple(row.get(f.name) for f in schema.fields)], schema)
    foreign.write.format("delta").mode("append").save(log.path)
    log.append(_segment(spark, 2, receivers=(1,)), 2, senders=[0, 1], receivers=[1], epoch=2)
    again = DeltaChannelLog(spark, log.path, PAYLOAD)  # a new process: the layout read from the table
    assert again.nested
    events = again.index(epoch=2)
    assert {e.kind for e in events} == {DATA, BARRIER} and {e.sender for e in events} == {0, 1}
    assert "holds 1 events of epoch 2 that no writer of checkpoint_lib wrote" in caplog.text
    df = again.read([e for e in events if e.kind == DATA], epoch=2)
    assert sorted(r.amount_cents for r in df.collect()) == sorted([*range(6), *range(2000, 2006)])

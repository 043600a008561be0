"""A channel log on real Delta: a step's append is one Spark write and one delta-rs commit, and a
segment is read from the files the log lists for its positions, not through Delta's snapshot."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from checkpoint_lib.delta.log import commit_actions, latest_version
from checkpoint_lib.spark.channels import BARRIER, DATA, DeltaChannelLog

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

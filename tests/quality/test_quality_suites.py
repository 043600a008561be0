"""The Great Expectations suites on a real payments warehouse: they pass on a healthy run that was
crashed-free but recovered through ``ckpt recover`` (which runs and records the after-restore
validation), and each fails on a deliberately broken copy: a duplicated ledger row, a dropped
row and a tampered balance, a snapshot with a missing channel-state segment, an unacknowledged subtask.

One healthy warehouse per module (a PipelineRunner run costs about a minute); every breaking test
works on its own ``shutil.copytree`` of it.
"""

from __future__ import annotations

import contextlib
import io
import json

import dataclasses
import shutil
from pathlib import Path

import pytest

from checkpoint_lib import cli
from checkpoint_lib.core.checkpoints import CompletedCheckpoint
from checkpoint_lib.core.types import SubtaskId
from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.pipelines import get
from checkpoint_lib.pipelines.payments import generate
from checkpoint_lib.quality import (
    QualityCheckError,
    QualityCheckFailed,
    data_docs_index,
    validate_checkpoint,
    validate_restore,
)
from checkpoint_lib.quality import context as quality_context
from checkpoint_lib.quality.records import ValidationLog
from checkpoint_lib.spark.runner import PipelineRunner

pytestmark = pytest.mark.spark
ROWS = 200


@pytest.fixture(scope="module")
def healthy(spark, tmp_path_factory) -> Path:
    """Generate, run to completion, then ``ckpt recover`` (restore the latest checkpoint, run on,
    validate). The recover command must succeed: its validation passed."""
    w = tmp_path_factory.mktemp("quality") / "w"
    w.mkdir()
    generate(spark, str(w), ROWS, bad_fraction=0.05, accounts=12, seed=11)
    PipelineRunner(get("payments"), str(w), spark, rows_per_checkpoint=ROWS).run()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["recover", "payments", "--warehouse", str(w), "--rows-per-checkpoint", str(ROWS), "-o", "json"])
    assert code == 0
    summary = json.loads(out.getvalue())  # stdout holds the JSON alone (progress and GX summary: stderr)
    assert summary["epoch"] == 2 and summary["restored"] is not None and summary["final"] in summary["completed"]
    assert [(v["suite"], v["success"], v["failed"]) for v in summary["validations"]] == [("restore", True, 0)]
    return w


def _copy(healthy: Path, tmp_path: Path) -> Path:
    target = tmp_path / "w"
    shutil.copytree(healthy, target)
    return target


def _failed(exc: QualityCheckFailed) -> set[tuple[str, str]]:
    return {(o.view, o.target) for o in exc.result.failed}


def test_recover_runs_the_validation_and_records_it(healthy):
    row = ValidationLog(healthy / "_checkpoints" / "payments").latest(kind="restore")
    assert row is not None and row["success"] and row["status"] == "passed"
    store = DeltaCheckpointStore(healthy / "_checkpoints" / "payments")
    assert row["epoch"] == store.epochs.current() == 2
    assert row["restored_checkpoint_id"] is not None
    assert row["checkpoint_id"] == store.checkpoints.latest().checkpoint_id
    assert row["evaluated"] >= 10 and row["failed"] == 0
    assert "PASSED" in row["summary"]


def test_data_docs_index_exists_and_names_the_latest_run(healthy):
    index = data_docs_index(healthy, "payments")
    assert index == healthy.resolve() / "_quality" / "payments" / "data_docs" / "index.html"
    assert index.is_file()
    row = ValidationLog(healthy / "_checkpoints" / "payments").latest()
    assert row["run_name"] in index.read_text()
    # every view validated in that run has its rendered result page and its suite page (one Data
    # Docs update per run renders them all)
    docs = index.parent
    for view in ("event_sink", "events", "keys", "totals", "restored_state"):
        assert (docs / "validations" / "payments" / "after_restore" / view / row["run_name"]).is_dir(), view
        assert (docs / "expectations" / "payments" / "after_restore" / f"{view}.html").is_file(), view


@pytest.mark.slow  # ~12 s; CI tier: a real (unaligned) checkpoint passes it in tests/spark/test_inflight.py, and the
# views and the progress steps are checked on the constructed cut of test_a_missing_channel_state_segment_fails
def _cached_plans(spark) -> int:
    return spark._jsparkSession.sharedState().cacheManager().numCachedEntries()


def test_per_checkpoint_suite_passes_on_the_healthy_run(spark, healthy, tmp_path):
    """... and, run on its own as the runner's gate before a commit runs it, leaves nothing cached
    in the (long-lived) process: the tables it cached for its views are released."""
    w = _copy(healthy, tmp_path)
    steps, cached = [], _cached_plans(spark)
    result = validate_checkpoint(spark, "payments", str(w), progress=lambda step, view: steps.append((step, view)))
    assert result.success, result.summary(verbose=True)
    assert _cached_plans(spark) == cached
    views = ["subtasks", "channel_state", "conservation"]
    assert {o.view for o in result.outcomes} == set(views)
    assert steps == [("computed", v) for v in views] + [("validated", v) for v in views]  # what the CLI's bar shows


def test_a_pipeline_without_a_quality_spec_gets_the_generic_suite(spark, healthy, tmp_path, monkeypatch):
    """No roles declared: what needs none is still checked (nothing lost, restored state = its
    snapshot on every state column), and a lost dead letter fails it."""
    import dataclasses

    from checkpoint_lib.pipelines import payments

    build = payments.build
    monkeypatch.setattr(payments, "build", lambda: dataclasses.replace(build(), quality_spec=None))
    w = _copy(healthy, tmp_path)
    generic = validate_restore(spark, "payments", str(w))
    assert generic.success and {o.view for o in generic.outcomes} == {"totals", "restored_state"}, generic.summary()
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, f"{w}/dlq/payments").delete("true")
    with pytest.raises(QualityCheckFailed) as err:
        validate_restore(spark, "payments", str(w))
    assert ("totals", "table") in _failed(err.value)


@pytest.mark.slow  # CI tier: the dropped row and the tampered balance below fail the same suite's checks
def test_a_duplicated_ledger_row_fails(spark, healthy, tmp_path):
    w = _copy(healthy, tmp_path)
    ledger = f"{w}/gold/ledger"
    spark.read.format("delta").load(ledger).limit(1).write.format("delta").mode("append").save(ledger)
    with pytest.raises(QualityCheckFailed, match="FAILED") as err:
        validate_restore(spark, "payments", str(w))
    assert {("event_sink", "event_id"), ("events", "sink_copies")} <= _failed(err.value)
    row = ValidationLog(w / "_checkpoints" / "payments").latest(kind="restore")
    assert row["status"] == "failed" and not row["success"] and "expect_column_values_to_be_unique" in row["summary"]


def test_a_dropped_ledger_row_and_a_tampered_balance_each_fail_their_own_checks(spark, healthy, tmp_path):
    """One copy, two breakages (one validation: CI time), each caught by its own expectations and
    nothing else: a ledger row deleted (events lost, totals short) and a balance off by a cent
    (the key sink no longer matches the source; the ledger is not involved)."""
    from delta.tables import DeltaTable

    w = _copy(healthy, tmp_path)
    ledger = f"{w}/gold/ledger"
    victim = spark.read.format("delta").load(ledger).select("event_id").first()["event_id"]
    DeltaTable.forPath(spark, ledger).delete(f"event_id = '{victim}'")
    balances = f"{w}/gold/balances"
    account = spark.read.format("delta").load(balances).select("account").first()["account"]
    DeltaTable.forPath(spark, balances).update(f"account = '{account}'", {"balance_cents": "balance_cents + 1"})
    with pytest.raises(QualityCheckFailed) as err:
        validate_restore(spark, "payments", str(w))
    lost = {("events", "sink_copies"), ("events", "values_match"), ("totals", "table")}  # the deleted row
    assert _failed(err.value) == lost | {("keys", "sink_matches_source")}  # + the tampered balance


def _add_checkpoint(store: DeltaCheckpointStore, base: CompletedCheckpoint, acks: dict) -> int:
    cid = store.ids.get_and_increment()
    store.checkpoints.add(dataclasses.replace(base, checkpoint_id=cid, acks=acks,
                                  ack_times={s: t for s, t in base.ack_times.items() if s in acks}))
    return cid


def test_an_unacknowledged_subtask_fails(spark, healthy, tmp_path):
    w = _copy(healthy, tmp_path)
    store = DeltaCheckpointStore(w / "_checkpoints" / "payments")
    base = store.checkpoints.latest()
    acks = {s: a for s, a in base.acks.items() if s != SubtaskId("balance", 2)}
    cid = _add_checkpoint(store, base, acks)
    with pytest.raises(QualityCheckFailed) as err:
        validate_checkpoint(spark, "payments", str(w), cid)
    assert ("subtasks", "acked") in _failed(err.value)
    assert ValidationLog(w / "_checkpoints" / "payments").latest(kind="checkpoint", checkpoint_id=cid)["status"] == "failed"


def _unaligned_snapshot(spark, w: Path) -> tuple[int, str]:
    """Build a consistent *unaligned* snapshot from the latest checkpoint: one account's records
    are taken out of subtask 0's state and logged as its channel state instead (two segments, one
    per sender), exactly what an unaligned barrier overtaking them would have produced."""
    from pyspark.sql import functions as F

    from pyspark.sql import types as T

    from checkpoint_lib.pipelines.payments import payment_errors
    from checkpoint_lib.spark.channels import ChannelStateTable
    from checkpoint_lib.spark.state import key_group_column

    root = w / "_checkpoints" / "payments"
    store = DeltaCheckpointStore(root)
    base = store.checkpoints.latest()
    keyed, source = SubtaskId("balance", 0), SubtaskId("source", 0)
    lo, hi = base.acks[keyed].state["key_groups"]
    offset, barrier = base.acks[source].state["version"], 10  # where subtask 0 received the barrier on both channels
    records = (
        spark.read.format("delta").option("versionAsOf", offset).load(f"{w}/landing/payments")
        .where(payment_errors(None).isNull())
        .withColumn("key_group", key_group_column("account"))
        .where(F.col("key_group").between(lo, hi))
    )
    account = records.agg(F.min("account")).first()[0]
    records = records.where(F.col("account") == account)
    cid = store.ids.get_and_increment()
    state_path = f"{root}/state/balance"
    state = spark.read.format("delta").option("versionAsOf", base.acks[keyed].state["table_version"]).load(state_path)
    moved = records.agg(F.sum("amount_cents").alias("a"), F.count(F.lit(1)).alias("n")).first()
    (
        state.withColumn("balance_cents", F.when(F.col("account") == account, F.col("balance_cents") - moved["a"]).otherwise(F.col("balance_cents")))
        .withColumn("event_count", F.when(F.col("account") == account, F.col("event_count") - moved["n"]).otherwise(F.col("event_count")))
        .write.format("delta").mode("overwrite").save(state_path)
    )
    version = spark.sql(f"DESCRIBE HISTORY delta.`{state_path}` LIMIT 1").first()["version"]
    cs_path = f"{root}/edge_state/source_balance"  # the source edge's channel-state table
    payload = records.drop("key_group").schema
    schema = T.StructType(list(ChannelStateTable.OURS) + [T.StructField("record", payload)])
    rows = (
        records.withColumn("checkpoint_id", F.lit(cid)).withColumn("receiver", F.lit(0))
        .withColumn("src_row", F.monotonically_increasing_id()).withColumn("sender", F.col("src_row") % 2)
        .withColumn("seq", F.lit(barrier - 1)).withColumn("src_version", F.lit(offset)).withColumn("src_file", F.lit("constructed"))
    )
    rows = rows.withColumn("record", F.struct(*[F.col(f.name).cast(f.dataType) for f in schema["record"].dataType.fields]))
    rows.select(*[F.col(f.name).cast(f.dataType) for f in schema]).write.format("delta").mode("append").save(cs_path)
    acks = dict(base.acks)
    acks[keyed] = dataclasses.replace(
        base.acks[keyed], state={**base.acks[keyed].state, "table_version": int(version),
                                 "barrier_seqs": {"0": barrier, "1": barrier}},
        channel_state_rows=int(moved["n"]), channel_state_bytes=int(moved["n"]) * 64, unaligned=True,
    )
    store.checkpoints.add(dataclasses.replace(base, checkpoint_id=cid, acks=acks))
    return cid, cs_path


def test_a_missing_channel_state_segment_fails(spark, healthy, tmp_path):
    from delta.tables import DeltaTable

    w = _copy(healthy, tmp_path)
    cid, cs_path = _unaligned_snapshot(spark, w)
    steps = []
    ok = validate_checkpoint(spark, "payments", str(w), cid,  # the constructed cut is consistent
                             progress=lambda step, view: steps.append((step, view)))
    assert ok.success and ok.metrics["channel_state_segments"] == 2, ok.summary(verbose=True)
    views = ["subtasks", "channel_state", "conservation"]
    assert {o.view for o in ok.outcomes} == set(views)
    assert steps == [("computed", v) for v in views] + [("validated", v) for v in views]  # what the CLI's bar shows
    DeltaTable.forPath(spark, cs_path).delete(f"checkpoint_id = {cid} AND sender = 1")
    with pytest.raises(QualityCheckFailed) as err:
        validate_checkpoint(spark, "payments", str(w), cid)
    assert {("subtasks", "channel_state_rows_recorded, channel_state_rows_found"), ("conservation", "table")} <= _failed(err.value)


def test_bad_input_is_refused_clearly(spark, healthy, tmp_path):
    with pytest.raises(ValueError, match="pipeline name"):
        validate_restore(spark, "../etc", str(healthy))
    with pytest.raises(ValueError, match="checkpoint id"):
        validate_restore(spark, "payments", str(healthy), 0)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        validate_restore(spark, "payments", str(tmp_path / "nowhere"))
    w = _copy(healthy, tmp_path)
    with pytest.raises(QualityCheckError, match="checkpoint 999 .* unknown"):
        validate_checkpoint(spark, "payments", str(w), 999)
    assert ValidationLog(w / "_checkpoints" / "payments").latest()["status"] == "error"


def _views(spark, w: Path, kind: str) -> dict:
    """The views of suite ``kind`` on warehouse ``w`` at its latest checkpoint (as a validation builds them)."""
    from checkpoint_lib.quality import views as V
    from checkpoint_lib.quality.spec import get_spec

    root = w.resolve()
    ctx = V.Context(spark, get("payments"), get_spec("payments"), root, V.open_store(root, "payments"))
    facts = V.checkpoint_facts(ctx, None)
    if kind == "restore":
        return V.restore_views(ctx, facts, V.latest_restore(ctx))
    return V.checkpoint_views(ctx, facts)


def _jobs(spark) -> int:
    ids = spark.sparkContext.statusTracker().getJobIdsForGroup(None)
    return 1 + max(ids) if ids else 0


@pytest.mark.slow  # ~40 s; CI tier: each engine's outcomes in the tests above
def test_pandas_and_spark_engines_give_the_same_outcomes(spark, healthy, tmp_path, monkeypatch):
    """The same views validated both ways - collected (pandas, GX's pandas engine: no Spark job)
    and kept in Spark (GX on Spark) - give the same outcome for every expectation, failing ones
    included (a duplicated ledger row, a tampered balance, a lost dead letter)."""
    import pandas as pd
    from delta.tables import DeltaTable

    from checkpoint_lib.quality.gx_project import GxProject
    from checkpoint_lib.quality.spec import get_spec
    from checkpoint_lib.quality.validate import suite_for

    w = _copy(healthy, tmp_path)
    ledger = f"{w}/gold/ledger"
    spark.read.format("delta").load(ledger).limit(1).write.format("delta").mode("append").save(ledger)
    balances = f"{w}/gold/balances"
    account = spark.read.format("delta").load(balances).select("account").first()["account"]
    DeltaTable.forPath(spark, balances).update(f"account = '{account}'", {"balance_cents": "balance_cents + 1"})
    dlq = f"{w}/dlq/payments"
    DeltaTable.forPath(spark, dlq).delete(f"src_row = {spark.read.format('delta').load(dlq).first()['src_row']}")

    def outcomes(kind: str, engine: str) -> list[tuple]:
        views = _views(spark, w, kind)
        materialized = [v for name, v in views.items() if not name.startswith("sink_")]
        assert all(isinstance(v, pd.DataFrame) == (engine == "pandas") for v in materialized), engine
        before = _jobs(spark)
        found = GxProject(tmp_path / engine / kind, "payments").run(
            suite_for(kind, get_spec("payments"), "account"), views, f"{engine}-{kind}")
        if engine == "pandas":
            assert _jobs(spark) == before  # GX itself started no Spark job
        return sorted((o.view, o.expectation, o.target, o.success, o.unexpected_count, o.element_count,
                       o.observed, o.error) for o in found)

    for kind in ("restore", "checkpoint"):
        on_pandas = outcomes(kind, "pandas")
        with monkeypatch.context() as m:
            m.setattr(quality_context, "DRIVER_ROWS", -1)  # nothing is small enough: every view stays in Spark
            on_spark = outcomes(kind, "spark")
        assert on_pandas == on_spark, kind
        if kind == "restore":
            failed = {(o[0], o[2]) for o in on_pandas if not o[3]}
            assert {("event_sink", "event_id"), ("keys", "sink_matches_source"), ("totals", "table")} <= failed
            assert any(o[4] for o in on_pandas)  # unexpected counts compared, not only zeros


def test_one_command_loads_each_table_once_and_builds_the_data_docs_once(spark, healthy, tmp_path, monkeypatch):
    """``ckpt validate`` (both suites): the channel-state table four views read and the source both
    suites read are loaded once (by Spark or, being small, by delta-rs), and the Data Docs are built
    once, with both suites' pages."""
    from pyspark.sql import types as T
    from pyspark.sql.readwriter import DataFrameReader

    from checkpoint_lib.layout import channel_state_table, checkpoint_root
    from checkpoint_lib.quality.gx_project import GxProject
    from checkpoint_lib.spark.channels import ChannelStateTable

    w = _copy(healthy, tmp_path)
    records = T.StructType([T.StructField(c, T.StringType() if c in ("event_id", "account", "src_file") else
                                          T.TimestampType() if c == "ts" else T.LongType())
                            for c in ("event_id", "account", "amount_cents", "ts", "src_version", "src_file", "src_row")])
    ChannelStateTable(spark, str(channel_state_table(checkpoint_root(w, "payments"), "source_balance")),
                      records).create()  # empty, as an unchained run leaves it
    loads, builds = [], []
    load, build = DataFrameReader.load, GxProject.build_docs

    def counted_load(self, path=None, *args, **kwargs):
        loads.append(str(path))
        return load(self, path, *args, **kwargs)

    def counted_build(self):
        if self.pending:
            builds.append([str(d) for d in self.pending])
        return build(self)

    driver_read = quality_context._driver_read

    def counted_driver_read(spark, path, version):
        loads.append(str(path))
        return driver_read(spark, path, version)

    monkeypatch.setattr(DataFrameReader, "load", counted_load)
    monkeypatch.setattr(quality_context, "_driver_read", counted_driver_read)
    monkeypatch.setattr(GxProject, "build_docs", counted_build)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["validate", "payments", "--warehouse", str(w), "-o", "json"]) == 0
    assert [r["suite"] for r in json.loads(out.getvalue())] == ["restore", "checkpoint"]
    assert loads.count(str(channel_state_table(checkpoint_root(w.resolve(), "payments"), "source_balance"))) == 1
    assert loads.count(str(w.resolve() / get("payments").source_spec.path)) == 1
    assert len(builds) == 1 and any("after_restore" in d for d in builds[0]) and any("per_checkpoint" in d for d in builds[0])
    docs = data_docs_index(w, "payments").parent
    log = ValidationLog(w / "_checkpoints" / "payments")
    for kind, suite, view in (("restore", "after_restore", "events"), ("checkpoint", "per_checkpoint", "subtasks")):
        run_name = log.latest(kind=kind)["run_name"]
        assert (docs / "validations" / "payments" / suite / view / run_name).is_dir(), suite
        assert run_name in (docs / "index.html").read_text()


def test_a_small_table_read_by_delta_rs_holds_what_spark_reads(spark, healthy, tmp_path, monkeypatch):
    """``Tables.load`` reads a small table through delta-rs (no Delta snapshot resolved in Spark):
    at an older version and at the latest, it has Spark's schema and Spark's rows, the keyed state
    with a deletion vector (a deleted row) included. A table delta-rs cannot read is read by Spark."""
    from delta.tables import DeltaTable as SparkDeltaTable
    from deltalake import DeltaTable
    from pyspark.sql import functions as F

    from checkpoint_lib.layout import checkpoint_root, state_table

    w = _copy(healthy, tmp_path)
    p = get("payments")
    source, ledger = str(w / p.source_spec.path), str(w / p.sinks["ledger"].path)
    state = str(state_table(checkpoint_root(w, "payments"), p.operator_uid))
    one = spark.read.format("delta").load(state).first()[p.key]
    SparkDeltaTable.forPath(spark, state).delete(F.col(p.key) == one)  # a deletion vector, not a rewrite
    log = "".join(f.read_text() for f in sorted(Path(state, "_delta_log").glob("*.json")))
    assert '"deletionVector":{' in log
    older = DeltaTable(ledger).version() - 1
    assert older >= 0
    driver_read, by_delta_rs = quality_context._driver_read, []

    def counted(spark_, path, version):
        frame = driver_read(spark_, path, version)
        by_delta_rs.append((path, version, frame is not None))
        return frame

    monkeypatch.setattr(quality_context, "_driver_read", counted)
    tables = quality_context.Tables(spark)
    for path, version in ((source, None), (ledger, older), (ledger, None), (state, None)):
        got = tables.load(path, version)
        reader = spark.read.format("delta")
        want = (reader if version is None else reader.option("versionAsOf", version)).load(path)
        assert got.schema == want.schema, path
        assert sorted(got.collect()) == sorted(want.collect()), (path, version)
        assert got.count() > 0, path
    assert tables.load(state).where(F.col(p.key) == one).count() == 0
    assert by_delta_rs == [(source, None, True), (ledger, older, True), (ledger, None, True), (state, None, True)]
    frames = [tables.load(path, version) for path, version in tables.loaded]
    assert all(f.storageLevel.useMemory for f in frames)  # the views' jobs do not ship the rows again
    tables.release()
    assert not any(f.storageLevel.useMemory for f in frames)

    import deltalake

    def refused(*args, **kwargs):
        raise deltalake.exceptions.DeltaProtocolError("a reader feature delta-rs lacks")

    monkeypatch.setattr(deltalake.QueryBuilder, "execute", refused)
    fallback = quality_context.Tables(spark).load(ledger, older)
    assert by_delta_rs[-1] == (ledger, older, False) and not fallback.storageLevel.useMemory
    assert sorted(fallback.collect()) == sorted(spark.read.format("delta").option("versionAsOf", older).load(ledger).collect())


def test_a_warehouse_is_driver_sized_by_all_its_tables_rows(healthy, monkeypatch):
    """What decides a short-lived driver for ``ckpt validate``: the source, sinks, dead letters,
    state and channel state together (by their logs), not any one of them."""
    from deltalake import DeltaTable

    p = get("payments")
    assert quality_context.driver_sized(p, healthy.resolve())
    source = DeltaTable(str(healthy / p.source_spec.path)).get_add_actions(flatten=True).column("num_records")
    monkeypatch.setattr(quality_context, "DRIVER_ROWS", sum(source.to_pylist()))  # the source alone fits
    assert not quality_context.driver_sized(p, healthy.resolve())

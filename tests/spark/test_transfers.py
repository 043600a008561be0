"""The cyclic ``transfers`` pipeline: a keyed bank operator that sends credits to itself over a
feedback edge. Unaligned checkpoints log what is in flight on the cycle as channel state; every
completed checkpoint, read back through the state-reading API, conserves money exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import functions as F

from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.pipelines import get
from checkpoint_lib.pipelines.transfers import generate
from checkpoint_lib.quality import QualityCheckFailed, validate_restore
from checkpoint_lib.quality.records import ValidationLog
from checkpoint_lib.spark import inspect
from checkpoint_lib.spark.runner import PipelineRunner
from checkpoint_lib.verify import rows_in_offset_order, check_transfers

pytestmark = pytest.mark.spark
ROWS = 300


def run(spark, w, *, parallelism=None, **kw):
    pipeline = get("transfers").with_parallelism(operator=parallelism)
    kw.setdefault("mode", "unaligned")
    kw.setdefault("validate_checkpoints", False)  # on by default for transfers: tested once, below
    return PipelineRunner(pipeline, str(w), spark, rows_per_checkpoint=ROWS, **kw).run()


def landing(spark, w, seed=0, versions=3):
    for v in range(versions):
        generate(spark, str(w), ROWS, accounts=30, bad_fraction=0.03, skew=0.3, seed=seed * 10 + v)


def store(w) -> DeltaCheckpointStore:
    return DeltaCheckpointStore.open(f"{w}/_checkpoints/transfers")


def conserved(spark, w, cid: int) -> int:
    """Balances in the bank's state + credits in its channel state = the opening balances, for
    checkpoint ``cid``; returns how many credits were in flight."""
    p = get("transfers")
    openings = int(rows_in_offset_order(Path(w) / "landing" / "accounts")["opening_cents"].sum())
    state = inspect.operator_state(spark, str(w), p, cid).agg(F.sum("balance_cents")).first()[0] or 0
    credits = inspect.channel_state(spark, str(w), p, cid).where(F.col("movement") == "credit")
    flying = credits.agg(F.coalesce(F.sum("amount_cents"), F.lit(0)).alias("cents"), F.count(F.lit(1)).alias("n")).first()
    assert state + flying.cents == openings, f"checkpoint {cid}: {state} + {flying.cents} != {openings}"
    return flying.n


@pytest.mark.parametrize("mode", ["aligned", "at_least_once"])
def test_a_cycle_is_refused_where_barriers_cannot_come_round(mode):
    with pytest.raises(ValueError, match="feedback edge .* Use --mode unaligned"):
        PipelineRunner(get("transfers"), "/nonexistent", None, mode=mode)


@pytest.fixture(scope="module")
def banked(spark, tmp_path_factory):
    w = tmp_path_factory.mktemp("transfers")
    landing(spark, w)
    return w, run(spark, w, validate_checkpoints=None)  # the pipeline's default: validated


@pytest.mark.slow  # CI tier: the long transfers run of tests/spark/test_long_runs.py covers it in CI
def test_unaligned_checkpoints_of_the_cycle_conserve_money_exactly(spark, banked):
    w, summary = banked
    check = check_transfers(str(w))
    assert check.ok, check.summary()
    assert check.bad_transfers > 0 and check.dlq_rows == check.bad_transfers
    completed = store(w).checkpoints.all()
    assert [c.checkpoint_id for c in completed] == summary.completed and len(completed) >= 3
    inflight = {c.checkpoint_id: conserved(spark, w, c.checkpoint_id) for c in completed}
    # credits really are in flight on the feedback edge in every checkpoint taken mid-stream
    assert all(n > 0 for cid, n in inflight.items() if cid != summary.final), inflight
    # on by default for transfers: every checkpoint passed the per-checkpoint GX suite before commit
    validated = {r["checkpoint_id"]: r for r in ValidationLog(f"{w}/_checkpoints/transfers").rows()
                 if r["kind"] == "checkpoint"}
    assert set(validated) == set(summary.completed) and all(r["success"] for r in validated.values()), validated
    for c in completed:
        bank = [a for s, a in c.acks.items() if s.operator == "bank"]
        assert len(bank) == 3 and all(a.unaligned for a in bank)
        assert all(a.state.get("barrier_seqs") for a in bank)  # where each channel's barrier was: the cut


# slow: ~5 min; CI rescales payments with channel state (test_inflight) and without (test_payments)
@pytest.mark.slow
def test_transfers_rescaled_3_to_5_then_5_to_2_from_checkpoints_with_channel_state(spark, banked):
    w, summary = banked
    first = summary.completed[0]
    up = run(spark, w, parallelism=5, restore_checkpoint=first)
    assert up.restored == first
    check = check_transfers(str(w))
    assert check.ok, f"3 -> 5: {check.summary()}"
    five = [c for c in store(w).checkpoints.all() if sum(s.operator == "bank" for s in c.acks) == 5]
    logged = [c.checkpoint_id for c in five if conserved(spark, w, c.checkpoint_id) > 0]
    assert logged, "the run at parallelism 5 logged no channel state"
    down = run(spark, w, parallelism=2, restore_checkpoint=logged[0])
    assert down.restored == logged[0]
    check = check_transfers(str(w))
    assert check.ok, f"5 -> 2: {check.summary()}"
    for c in store(w).checkpoints.all():
        conserved(spark, w, c.checkpoint_id)
    # the after-restore GX suite on the rescaled restore of a checkpoint with channel state
    result = validate_restore(spark, "transfers", str(w), logged[0])
    assert result.success and result.restored_checkpoint_id == logged[0], result.summary(verbose=True)


@pytest.mark.slow  # CI tier: CI keeps the commit phase's validation gate
def test_a_checkpoint_failing_validation_is_discarded_never_committed_and_the_next_run_recovers(spark, tmp_path):
    """Money goes missing from checkpoint 2's channel state (a broken snapshot): its validation
    fails before the commit, so it is discarded, nothing of it becomes visible, the run stops with
    the summary, and the next start restores checkpoint 1 and ends exact."""
    landing(spark, tmp_path, seed=3)
    runner = PipelineRunner(get("transfers"), str(tmp_path), spark, mode="unaligned", rows_per_checkpoint=ROWS)
    validating = []

    def tamper(phase):
        if phase == "validate":
            validating.append(phase)
            if len(validating) == 2:  # checkpoint 2: lose its in-flight credits (every edge's channel state)
                for cs in sorted((tmp_path / "_checkpoints" / "transfers" / "edge_state").iterdir()):
                    spark.sql(f"DELETE FROM delta.`{cs}` WHERE checkpoint_id = 2")

    runner.ctx.kills.reached = tamper
    with pytest.raises(QualityCheckFailed, match="conservation"):
        runner.run()
    history = {r["checkpoint_id"]: r for r in store(tmp_path).checkpoints.history()}
    assert history[2]["status"] == "discarded" and "validation" in history[2]["message"]
    assert store(tmp_path).checkpoints.latest().checkpoint_id == 1
    recovered = run(spark, tmp_path, validate_checkpoints=None)
    assert recovered.restored == 1
    check = check_transfers(str(tmp_path))
    assert check.ok, check.summary()


class Died(BaseException):
    """The process dies at a kill point (nothing after it runs, nothing is cleaned up)."""


def die_before_validating(runner, w, spark, *, at: int, tamper: bool):
    """Run ``runner`` until checkpoint ``at`` completed and its validation is about to start, then
    die: ``at`` is completed, durable and not validated. With ``tamper``, its in-flight credits are
    lost first (a broken snapshot its validation would have caught)."""
    validating = []

    def kill_point(phase):
        if phase == "validate":
            validating.append(phase)
            if len(validating) == at:
                if tamper:  # every edge's channel state of the checkpoint
                    logged = sorted((Path(w) / "_checkpoints" / "transfers" / "edge_state").iterdir())
                    assert logged, "no channel-state table"
                    for table in logged:
                        spark.sql(f"DELETE FROM delta.`{table}` WHERE checkpoint_id = {at}")
                raise Died()

    runner.ctx.kills.reached = kill_point
    with pytest.raises(Died):
        runner.run()
    assert store(w).checkpoints.latest().checkpoint_id == at and not store(w).verdicts.validated(at)


@pytest.mark.slow  # CI tier: CI keeps the commit phase's validation gate
def test_recovery_validates_a_checkpoint_that_was_never_validated_before_it_commits_it(spark, tmp_path):
    """Item 2 of issue 24: the process died between checkpoint 2's completion and its validation.
    Recovery must not restore and re-commit it unvalidated: it validates it first, the broken
    snapshot fails, is discarded, and checkpoint 1 is restored instead."""
    landing(spark, tmp_path, seed=3)
    runner = PipelineRunner(get("transfers"), str(tmp_path), spark, mode="unaligned", rows_per_checkpoint=ROWS)
    die_before_validating(runner, tmp_path, spark, at=2, tamper=True)
    recovered = run(spark, tmp_path, validate_checkpoints=None)
    assert recovered.restored == 1
    history = {r["checkpoint_id"]: r for r in store(tmp_path).checkpoints.history()}
    assert history[2]["status"] == "discarded" and "validation" in history[2]["message"]
    assert all(store(tmp_path).verdicts.validated(c.checkpoint_id) for c in store(tmp_path).checkpoints.all())
    check = check_transfers(str(tmp_path))
    assert check.ok, check.summary()


@pytest.mark.parametrize("tamper", [pytest.param(False, marks=pytest.mark.slow), True], ids=["sound", "broken"])
def test_the_commit_phase_commits_only_a_validated_checkpoint(spark, tmp_path, tamper):
    """The snapshot DAG's commit task (``PipelineControl.commit``) on a checkpoint whose stage
    process died before validating it: it validates first; a sound one commits, a broken one is
    discarded and nothing of it becomes visible."""
    from checkpoint_lib.control import PipelineControl

    # checkpoint 1, taken mid-stream (a second version follows), holds credits in flight; the
    # process dies before its first validation, so no suite runs before the commit task's
    landing(spark, tmp_path, seed=3, versions=2)
    runner = PipelineRunner(get("transfers"), str(tmp_path), spark, mode="unaligned", rows_per_checkpoint=ROWS)
    die_before_validating(runner, tmp_path, spark, at=1, tamper=tamper)
    control = PipelineControl(str(tmp_path), "transfers")
    sinks = control.commit_phase.sinks(None)
    assert any(not sinks[n].is_committed(t) for n, ts in control.commit_phase.owned_transactions(1).items() for t in ts)
    if tamper:
        with pytest.raises(QualityCheckFailed, match="conservation"):
            control.commit(1, spark=spark)
        assert store(tmp_path).checkpoints.status(1)["status"] == "discarded"
        stamps = {n: s.committed_checkpoint(runner.epoch) for n, s in control.commit_phase.sinks(None).items()}
        assert all(stamp < 1 for stamp in stamps.values()), stamps  # nothing of checkpoint 1 is visible
    else:
        outcome = control.commit(1, spark=spark)
        assert outcome.committed and store(tmp_path).verdicts.validated(1)
        sinks = control.commit_phase.sinks(None)
        assert all(sinks[n].is_committed(t) for n, ts in control.commit_phase.owned_transactions(1).items() for t in ts)


@pytest.mark.slow
@pytest.mark.parametrize("mode,kw", [("unaligned", {}), ("aligned_with_timeout", {"alignment_timeout": 0.5})])
def test_restoring_each_older_checkpoint_of_the_cycle_ends_exact(spark, tmp_path, mode, kw):
    landing(spark, tmp_path, seed=5)
    first = run(spark, tmp_path, mode=mode, **kw)
    assert check_transfers(str(tmp_path)).ok
    for cid in reversed([c for c in first.completed if c != first.final]):
        again = run(spark, tmp_path, mode=mode, restore_checkpoint=cid, **kw)
        assert again.restored == cid
        check = check_transfers(str(tmp_path))
        assert check.ok, f"after restoring checkpoint {cid} ({mode}): {check.summary()}"
        for c in store(tmp_path).checkpoints.all():
            conserved(spark, tmp_path, c.checkpoint_id)


@pytest.mark.slow  # CI tier: the per-edge channel state of the runs above; this is the upgrade path
def test_a_checkpoint_taken_before_the_graph_runtime_restores_its_channel_state_from_the_old_table(spark, tmp_path):
    """The linear runtime kept every channel's in-flight records in one table, ``channel_state``
    (the feedback channels numbered from the source parallelism), where the graph runtime keeps one
    per edge. A checkpoint of that layout (made here by moving a checkpoint's channel state there)
    is read back and restored from it: its credits in flight are replayed, exactly once."""
    from checkpoint_lib.layout import channel_state_table

    landing(spark, tmp_path, seed=7)
    first = run(spark, tmp_path)
    logged = [c for c in first.completed if c != first.final and conserved(spark, tmp_path, c) > 0]
    assert logged, "no checkpoint with credits in flight"
    cid = logged[0]
    root = f"{tmp_path}/_checkpoints/transfers"
    sources = sum(1 for s in store(tmp_path).checkpoints.get(cid).acks if s.operator == "source")
    for edge, first_channel in (("source_bank", 0), ("bank_bank", sources)):
        path = str(channel_state_table(root, edge))
        rows = spark.read.format("delta").load(path).where(F.col("checkpoint_id") == cid)
        rows.withColumn("sender", (F.col("sender") + F.lit(first_channel)).cast("int")).write.format("delta") \
            .mode("append").option("mergeSchema", "true").save(str(channel_state_table(root)))
        spark.sql(f"DELETE FROM delta.`{path}` WHERE checkpoint_id = {cid}")
    assert conserved(spark, tmp_path, cid) > 0  # read back from the old table alone
    again = run(spark, tmp_path, restore_checkpoint=cid)
    assert again.restored == cid
    check = check_transfers(str(tmp_path))
    assert check.ok, check.summary()

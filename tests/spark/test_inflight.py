"""Records in flight: a lagging source subtask puts its barriers behind the others', so unaligned
checkpoints log real channel state (written by Spark), aligned ones really wait, and restores -
rescaled ones included, the case FLINK-38267 is about - replay that channel state exactly once."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.pipelines import get
from checkpoint_lib.pipelines.payments import generate
from checkpoint_lib.quality import validate_checkpoint, validate_restore
from checkpoint_lib.spark import inspect
from checkpoint_lib.spark.runner import PipelineRunner
from checkpoint_lib.verify import check_payments, expected_payments, landing_in_offset_order

pytestmark = pytest.mark.spark
ROWS = 400


def run(spark, w, *, parallelism=None, **kw):
    pipeline = get("payments").with_parallelism(operator=parallelism)
    kw.setdefault("mode", "unaligned")
    kw.setdefault("lagging_sources", 1)
    return PipelineRunner(pipeline, str(w), spark, rows_per_checkpoint=ROWS, **kw).run()


@pytest.fixture(scope="module")
def skewed(spark, tmp_path_factory):
    w = tmp_path_factory.mktemp("skewed")
    for v in range(3):
        generate(spark, str(w), ROWS, bad_fraction=0.03, accounts=25, seed=20 + v)
    return w, run(spark, w)


def store(w) -> DeltaCheckpointStore:
    return DeltaCheckpointStore.open(f"{w}/_checkpoints/payments")


def assert_consistent_cut(spark, w, cid: int) -> int:
    """State + channel state of checkpoint ``cid`` (read back through the state-reading API) equal
    the valid source rows up to its offset, and every logged segment precedes its channel's
    barrier (n >= m). Returns the number of in-flight records."""
    p = get("payments")
    offsets = next(iter(inspect.source_offsets(str(w), p, cid).values()))
    _, balances, _ = expected_payments(landing_in_offset_order(str(w), upto=int(offsets["version"])))
    state = inspect.operator_state(spark, str(w), p, cid).agg(
        F.sum("balance_cents").alias("cents"), F.sum("event_count").alias("events")).first()
    chan = inspect.channel_state(spark, str(w), p, cid)
    inflight = chan.agg(F.coalesce(F.sum("amount_cents"), F.lit(0)).alias("cents"),
                        F.count(F.lit(1)).alias("events")).first()
    assert (state.cents or 0) + inflight.cents == int(balances["balance_cents"].sum()), f"checkpoint {cid}"
    assert (state.events or 0) + inflight.events == int(balances["event_count"].sum()), f"checkpoint {cid}"
    # n >= m: each receiver logged only what its channel carried before the checkpoint's barrier
    received = {(s.index, int(c)): at for s, a in store(w).checkpoints.get(cid).acks.items()
                if s.operator == p.operator_uid for c, at in a.state["barrier_seqs"].items()}
    for row in chan.groupBy("receiver", "sender").agg(F.max("seq").alias("last")).collect():
        assert row.last < received[(row.receiver, row.sender)], \
            f"checkpoint {cid}: a segment after the barrier of channel {row.sender} at subtask {row.receiver}"
    acked = sum(a.channel_state_rows for s, a in store(w).checkpoints.get(cid).acks.items() if s.operator == p.operator_uid)
    assert acked == inflight.events, f"checkpoint {cid}: acks recorded {acked} in-flight rows, found {inflight.events}"
    return inflight.events


def test_unaligned_snapshots_hold_real_in_flight_records_and_conserve_money(spark, skewed):
    w, summary = skewed
    check = check_payments(str(w), exact_order=False)
    assert check.ok, check.summary()
    completed = store(w).checkpoints.all()
    assert [c.checkpoint_id for c in completed] == summary.completed and len(completed) >= 3
    inflight = {c.checkpoint_id: assert_consistent_cut(spark, w, c.checkpoint_id) for c in completed}
    # every checkpoint but the final one (taken once everything was read) caught records in flight
    assert all(n > 0 for cid, n in inflight.items() if cid != summary.final), inflight
    for c in completed:
        keyed = [a for s, a in c.acks.items() if s.operator == "balance"]
        assert keyed and all(a.unaligned for a in keyed)
        if c.checkpoint_id != summary.final:  # the lagging subtask's barrier really is behind, at every receiver
            assert all(a.state["barrier_seqs"]["1"] > a.state["barrier_seqs"]["0"] for a in keyed), c.checkpoint_id
    # and the GX per-checkpoint suite (conservation, n >= m per channel, acks) agrees on real channel state
    result = validate_checkpoint(spark, "payments", str(w), completed[0].checkpoint_id)
    assert result.success and any(o.view == "channel_state" for o in result.outcomes), result.summary(verbose=True)


@pytest.mark.slow  # CI tier: several runs at three parallelisms
def test_restoring_channel_state_rescaled_3_to_5_then_5_to_2_is_exactly_once(spark, skewed):
    """Restore the first checkpoint (with channel state) at parallelism 5, finish; then restore a
    checkpoint of that run (with channel state logged by 5 subtasks) at parallelism 2, finish."""
    w, summary = skewed
    first = summary.completed[0]
    up = run(spark, w, parallelism=5, restore_checkpoint=first)
    assert up.restored == first
    check = check_payments(str(w), exact_order=False)
    assert check.ok, f"3 -> 5: {check.summary()}"
    five = [c for c in store(w).checkpoints.all() if len([s for s in c.acks if s.operator == "balance"]) == 5]
    logged = [c.checkpoint_id for c in five if assert_consistent_cut(spark, w, c.checkpoint_id) > 0]
    assert logged, "the run at parallelism 5 logged no channel state"
    down = run(spark, w, parallelism=2, restore_checkpoint=logged[0])
    assert down.restored == logged[0]
    check = check_payments(str(w), exact_order=False)
    assert check.ok, f"5 -> 2: {check.summary()}"
    # the after-restore GX suite counts the records in flight at the checkpoint as landing after it
    result = validate_restore(spark, "payments", str(w), logged[0])
    assert result.success and result.restored_checkpoint_id == logged[0], result.summary(verbose=True)


# aligned under a lagging source: also tests/spark/test_long_runs.py (12+ checkpoints), so slow here
@pytest.mark.slow  # CI tier: every mode a full run; CI keeps the unaligned one above
@pytest.mark.parametrize("mode", [pytest.param("aligned", marks=pytest.mark.slow), "aligned_with_timeout", "at_least_once"])
def test_every_mode_is_exact_without_failures_under_skew(spark, tmp_path, mode):
    for v in range(2):
        generate(spark, str(tmp_path), ROWS, bad_fraction=0.03, accounts=25, seed=30 + v)
    kw = {"alignment_timeout": 0.0} if mode == "aligned_with_timeout" else {}
    summary = run(spark, tmp_path, mode=mode, **kw)
    check = check_payments(str(tmp_path), exact_order=False)
    assert check.ok, check.summary()
    first = store(tmp_path).checkpoints.get(summary.completed[0])
    keyed = [a for s, a in first.acks.items() if s.operator == "balance"]
    if mode == "aligned":  # the fast channel waited a whole source step for the lagging barrier
        assert all(not a.unaligned and a.channel_state_rows == 0 and a.alignment_ms > 0 for a in keyed)
    elif mode == "aligned_with_timeout":  # timeout 0: switched to unaligned, logged what was in flight
        assert all(a.unaligned for a in keyed) and sum(a.channel_state_rows for a in keyed) > 0
        assert_consistent_cut(spark, tmp_path, first.checkpoint_id)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["unaligned", "aligned_with_timeout"])
def test_restoring_each_older_checkpoint_in_turn_ends_in_the_same_result(spark, tmp_path, mode):
    """Every older checkpoint of the first run (each holding channel state) restored in turn, newest
    first (restoring one discards every later one): the sinks roll back to what it committed, its
    channel state is replayed, and the result is exact."""
    for v in range(3):
        generate(spark, str(tmp_path), ROWS, bad_fraction=0.03, accounts=25, seed=40 + v)
    kw = {"alignment_timeout": 0.0} if mode == "aligned_with_timeout" else {}
    first = run(spark, tmp_path, mode=mode, **kw)
    for cid in reversed([c for c in first.completed if c != first.final]):
        again = run(spark, tmp_path, mode=mode, restore_checkpoint=cid, **kw)
        assert again.restored == cid
        check = check_payments(str(tmp_path), exact_order=False)
        assert check.ok, f"after restoring checkpoint {cid}: {check.summary()}"

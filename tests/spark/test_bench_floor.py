"""The benchmark's floor (bench/floor.py) and its output comparison (bench/compare.py): the floor
must produce what exactly-once processing must, and the comparison must catch a wrong contender."""

from __future__ import annotations

import pandas as pd
import pytest

from bench.outputs import diff_outputs
from bench.floor import run_floor
from checkpoint_lib.pipelines.payments import generate
from checkpoint_lib.verify import expected_payments, landing_in_offset_order, read_delta

pytestmark = [pytest.mark.spark]


@pytest.mark.slow  # CI tier: the benchmark's own check; make bench and bench-quick compare every contender with it
def test_floor_is_exact_and_the_comparison_catches_a_wrong_contender(spark, tmp_path):
    w = str(tmp_path / "w")
    for v in range(2):
        generate(spark, w, 500, bad_fraction=0.05, accounts=15, seed=v, files=2)
    run_floor(spark, f"{w}/landing/payments", w)
    want_ledger, want_balances, bad = expected_payments(landing_in_offset_order(w))
    ledger = read_delta(f"{w}/gold/ledger").sort_values("event_id", ignore_index=True)
    pd.testing.assert_frame_equal(
        ledger, want_ledger.sort_values("event_id", ignore_index=True), check_dtype=False
    )
    balances = read_delta(f"{w}/gold/balances").sort_values("account", ignore_index=True)
    pd.testing.assert_frame_equal(
        balances, want_balances.sort_values("account", ignore_index=True), check_dtype=False
    )
    assert len(read_delta(f"{w}/dlq/payments")) == len(bad) > 0
    assert diff_outputs(spark, w, w) == []

    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    other = str(tmp_path / "other")
    run_floor(spark, f"{w}/landing/payments", other)
    one = ledger["event_id"].iloc[7]
    DeltaTable.forPath(spark, f"{other}/gold/ledger").update(
        F.col("event_id") == F.lit(one), {"balance_after_cents": F.col("balance_after_cents") + 1}
    )
    spark.read.format("delta").load(f"{other}/dlq/payments").limit(1).write.format("delta").mode("append").save(
        f"{other}/dlq/payments"
    )
    problems = diff_outputs(spark, w, other)
    assert any(p.startswith("gold/ledger: 1 rows missing, 1 rows extra") for p in problems), problems
    assert any(p.startswith("dlq/payments") for p in problems), problems
    assert diff_outputs(spark, w, other, ledger_order=False)[0].startswith("dlq/payments")


@pytest.mark.slow  # CI tier: make bench-quick runs it
def test_ours_contender_matches_the_floor_and_reports_its_checkpoints(spark, tmp_path):
    """bench/ours.py as the benchmark runs it: a checkpoint every version, outputs equal to the
    floor's, and the figures the tables print (the interval trend included)."""
    from bench.ours import copy_landing, run_ours

    data = str(tmp_path / "data")
    for v in range(3):
        generate(spark, data, 300, bad_fraction=0.05, accounts=15, seed=v, files=2)
    run_floor(spark, f"{data}/landing/payments", f"{data}/floor")
    w = str(tmp_path / "ours")
    copy_landing(data, w)
    figures = run_ours(spark, w, mode="aligned", rows_per_checkpoint=300)
    assert diff_outputs(spark, f"{data}/floor", w) == []
    assert figures["rows"] == 900 and figures["steps"] >= 3  # a last step may find the source caught up
    assert figures["measured_checkpoints"] >= 3  # one per version at least
    assert figures["checkpoints"] == figures["measured_checkpoints"] + 1  # the final one is not measured
    assert figures["median_checkpoint_ms"] > 0 and figures["seconds"] > 0
    assert figures["interval_s_first_tenth"] > 0 and figures["interval_s_last_tenth"] > 0


def test_the_work_counter_counts_the_jobs_and_the_commits_of_a_run(spark, tmp_path):
    """bench/work.py: the Delta commits a run adds to every table under its folder (a table it
    creates counts its first version, one made before does not count its old ones) and the
    Spark jobs it starts, per step."""
    from bench.work import Work

    old, new = str(tmp_path / "out" / "old"), str(tmp_path / "out" / "deep" / "new")
    spark.range(3).write.format("delta").save(old)
    with Work(spark, str(tmp_path / "out")) as work:
        spark.range(2).write.format("delta").mode("append").save(old)
        for _ in range(3):
            spark.range(2).write.format("delta").mode("append").save(new)
        assert spark.read.format("delta").load(new).count() == 6
    assert work.commits == 1 + 3
    assert work.jobs >= 5  # each write is at least one job, the count one more
    figures = work.figures(steps=2)
    assert figures["delta_commits"] == 4 and figures["commits_per_step"] == 2.0
    assert figures["jobs_per_step"] == work.jobs / 2
    with Work(spark, str(tmp_path / "out")) as grouped:  # as a streaming query runs its jobs
        spark.sparkContext.setJobGroup("a-streaming-query", "jobs of another group count too")
        try:
            assert spark.read.format("delta").load(new).count() == 6
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert grouped.jobs >= 1 and grouped.commits == 0

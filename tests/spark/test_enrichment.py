"""``enrichment`` (a graph with two inputs: payments, and accounts through their change data feed)
on the graph runner, checked by the independent verifier (``enrichment_data.check_enrichment``):
a long run of 12+ checkpoints in one process, and exactly once across a kill and a restore at
another parallelism."""

from __future__ import annotations

import pytest

from checkpoint_lib.pipelines.enrichment import graph
from checkpoint_lib.pipelines.enrichment_data import check_enrichment, generate
from checkpoint_lib.spark.graph_runner import GraphRunner
from in_process_kills import raise_at

pytestmark = pytest.mark.spark


def checked(w: str) -> None:
    result = check_enrichment(w)
    assert result.ok, result.summary()
    assert result.duplicates and result.rejected_rows and result.dead_letters


@pytest.mark.slow  # CI tier: CI's long run is payments' (test_long_runs.py); enrichment runs 5+ checkpoints below
def test_enrichment_runs_twelve_checkpoints_in_one_process_exactly_once(spark, tmp_path):
    w = str(tmp_path)
    generate(None, w, 1200, rounds=6, accounts=40, seed=3, commits_per_round=3)
    run = GraphRunner(graph(), w, spark, rows_per_checkpoint=50).run()
    assert len(run.completed) >= 12 and not run.aborted
    checked(w)


@pytest.mark.slow  # CI tier: a graph killed in a gate and restored at another parallelism (test_graph_cut_edges.py)
@pytest.mark.parametrize("phase", ["flush_merge:4", "commit:3"])  # in-process (tests/spark/test_graph_runner.py)
def test_enrichment_exactly_once_across_a_kill_and_a_restore_at_another_parallelism(spark, tmp_path, phase):
    w = str(tmp_path)
    generate(None, w, 600, rounds=3, accounts=30, seed=5)
    name, _, n = phase.partition(":")
    runner = GraphRunner(graph(), w, spark, rows_per_checkpoint=150)
    runner.kills.reached = raise_at(name, int(n))
    with pytest.raises(RuntimeError, match="killed"):
        runner.run()
    generate(None, w, 300, rounds=1, accounts=30, seed=6)  # more lands while it is down
    again = GraphRunner(graph(parallelism=3), w, spark, rows_per_checkpoint=150).run()
    assert again.epoch == 2 and again.restored is not None and runner.summary.completed  # killed after one
    checked(w)


def test_tag_gives_a_tie_to_the_later_change_in_commit_order(spark):
    """Two changes of an account with one ``updated_at``: the later one in commit order wins (a
    later version; within a version its post-image, numbered after its deletes: an overwrite deletes
    and inserts every row again). Before, a delete won every tie: a refreshed dimension rejected
    every later payment as an unknown account."""
    from datetime import datetime

    from checkpoint_lib.pipelines.enrichment import MAIN, TagRegion

    t, later = datetime(2026, 1, 1, 10), datetime(2026, 1, 1, 11)
    accounts = spark.createDataFrame(
        [("a", "eu", "open", t, "delete", 3, 0), ("a", "eu", "open", t, "insert", 3, 1),  # an overwrite
         ("b", "us", "open", t, "insert", 3, 2), ("b", "us", "open", t, "delete", 4, 0)],  # then a removal
        "account string, region string, status string, updated_at timestamp, change string, src_version long, "
        "src_row long")
    payments = spark.createDataFrame([("e1", "a", 5, later, 7, "f", 0), ("e2", "b", 6, later, 7, "f", 1)],
                                     "event_id string, account string, amount_cents long, ts timestamp, "
                                     "src_version long, src_file string, src_row long")
    state = spark.createDataFrame([], "account string, region string, status string, updated_at timestamp")
    new_state, out = TagRegion().apply(payments, accounts, state, "account")
    assert [r.event_id for r in out[MAIN].collect()] == ["e1"]
    assert [(r.event_id, r.reason) for r in out["rejected"].collect()] == [("e2", "unknown account")]
    assert sorted((r.account, r.status) for r in new_state.collect()) == [("a", "open"), ("b", "removed")]

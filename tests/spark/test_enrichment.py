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


@pytest.mark.slow  # CI tier: enrichment killed by SIGKILL (tests/crash/test_graph_crash.py), kills of every phase
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

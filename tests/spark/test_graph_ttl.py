"""Keyed state that expires in event time (``StateTtl``) in a graph: a two-input keyed operator
whose state a gap longer than the TTL resets and whose idle keys the cleanup deletes, exactly once
across a kill mid-MERGE and a restore at another parallelism; what a graph cannot take (a time
column one input lacks, ``max_ahead``) refused naming the operator."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from checkpoint_lib.graph import AheadBound, Graph
from checkpoint_lib.pipeline import DeltaSink, DeltaSource, StateTtl
from checkpoint_lib.pipelines.enrichment import MAIN
from checkpoint_lib.spark.graph_runner import GraphRunner
from checkpoint_lib.verify import read_delta
from in_process_kills import raise_at

pytestmark = pytest.mark.spark

EVENTS = {"user": "string", "ts": "timestamp"}
T0 = datetime(2026, 3, 1)


class Activity:
    """Two inputs (clicks, views), one count per user that a gap of over 30 minutes resets."""

    state_schema = "n long"
    state_ttl = StateTtl(timedelta(minutes=30), time_column="ts")

    def apply(self, first, second, state, key):
        from pyspark.sql import functions as F

        step = first.select(key).unionByName(second.select(key)).groupBy(key).agg(F.count(F.lit(1)).alias("n"))
        prior = state.select(key, F.col("n").alias("prior"))
        total = step.join(prior, key, "left").fillna(0, ["prior"]).select(key, (F.col("n") + F.col("prior")).alias("n"))
        return step, {MAIN: total}


def graph(parallelism: int = 2, operator=None, ahead=None):
    g = Graph("ttl")
    clicks = g.source("clicks", DeltaSource("landing/clicks", EVENTS), ahead=ahead)
    views = g.source("views", DeltaSource("landing/views", EVENTS), ahead=ahead)
    counts = (clicks.key_by("user", parallelism=parallelism).connect(views.key_by("user"))
              .process(operator or Activity(), uid="activity"))
    counts.output(MAIN).sink("counts", DeltaSink("out/counts", (("user", "string"), ("n", "long")), mode="upsert",
                                                 keys=("user",)))
    return g.build()


def land(spark, w: str) -> None:
    """Four rounds 1 h apart, a click then a view per round: ``u1`` active every round 10 minutes
    apart (never idle 30 minutes), ``u2`` in rounds 0 and 3 only (a 3 h gap: its count starts
    again), ``u3`` in round 0 only (idle: cleaned up once the newest write is 2 h past it)."""
    for k in range(4):
        users = ["u1"] + (["u2"] if k in (0, 3) else []) + (["u3"] if k == 0 else [])
        for name, minute in (("clicks", 0), ("views", 5)):
            rows = [(u, T0 + timedelta(hours=k, minutes=minute)) for u in users]
            if k:  # u1 also 10 minutes before the round: never 30 minutes idle
                rows.append(("u1", T0 + timedelta(hours=k, minutes=minute - 30)))
            spark.createDataFrame(rows, "user string, ts timestamp").write.format("delta").mode("append") \
                .save(f"{w}/landing/{name}")


def check(spark, w: str) -> None:
    counts = read_delta(f"{w}/out/counts").set_index("user")["n"].to_dict()
    # u1: 2 rows in round 0, 4 in each later one; u2: round 3 only; u3: its only round
    assert counts == {"u1": 2 + 3 * 4, "u2": 2, "u3": 2}
    from checkpoint_lib.spark.state import state_of

    state = state_of(spark, f"{w}/_checkpoints/ttl/state/activity", "user", Activity.state_ttl)
    assert sorted(r.user for r in state.collect()) == ["u1", "u2"]  # u3 cleaned up


@pytest.mark.slow  # CI tier: the TTL of a flush is one function for both runners (state.apply_with_ttl), run by
# tests/spark/test_state_ttl.py; the graph's wiring of it by the refusals below
@pytest.mark.parametrize("kill", [None, "flush_merge:3"])
def test_expiring_state_in_a_graph_resets_cleans_up_and_restores_exactly_once(spark, tmp_path, kill):
    """Straight through (CI), or killed inside a later MERGE and restored at parallelism 3."""
    w = str(tmp_path)
    land(spark, w)
    runner = GraphRunner(graph(), w, spark, rows_per_checkpoint=4)
    if kill is not None:
        phase, n = kill.split(":")
        runner.kills.reached = raise_at(phase, int(n))
        with pytest.raises(RuntimeError, match="killed"):
            runner.run()
        runner = GraphRunner(graph(parallelism=3), w, spark, rows_per_checkpoint=4)
    run = runner.run()
    assert run.epoch == (1 if kill is None else 2) and (run.restored is None) == (kill is None)
    check(spark, w)


class NoTimeColumn(Activity):
    state_ttl = StateTtl(timedelta(minutes=30), time_column="at")


class FarAhead(Activity):
    state_ttl = StateTtl(timedelta(minutes=30), time_column="ts", max_ahead=timedelta(days=1))


def test_a_ttl_a_graph_cannot_run_is_refused_naming_the_operator(spark, tmp_path):
    with pytest.raises(ValueError, match=r"operator 'activity': StateTtl.max_ahead .* declare the bound on its "
                                         r"sources instead, source\(\.\.\., ahead=AheadBound"):
        GraphRunner(graph(operator=FarAhead()), str(tmp_path), spark)
    bounded = graph(operator=FarAhead(), ahead=AheadBound("ts", timedelta(days=1)))
    assert GraphRunner(bounded, str(tmp_path), spark).sources["views"].vertex.ahead.max_ahead == timedelta(days=1)
    with pytest.raises(ValueError, match="operator 'activity' state_ttl time_column 'at' must be a timestamp column "
                                         "of the records of its input 1, got None"):
        GraphRunner(graph(operator=NoTimeColumn()), str(tmp_path), spark).open()

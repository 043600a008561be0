"""A source's bootstrap in a graph: the bootstrap table's records enter with the source's first
records (also when another source's records came first), exactly once across a kill before the
first checkpoint completed (a recovery from scratch reads them again into empty state) and a
restore of a later checkpoint (which does not)."""

from __future__ import annotations

import pytest

from checkpoint_lib.graph import Graph
from checkpoint_lib.pipeline import Bootstrap, DeltaSink, DeltaSource
from checkpoint_lib.pipelines.enrichment import MAIN
from checkpoint_lib.spark.graph_runner import GraphRunner
from checkpoint_lib.verify import read_delta
from in_process_kills import raise_at

pytestmark = pytest.mark.spark

COUNTS = {"user": "string", "n": "long"}


class Sum:
    state_schema = "n long"

    def apply(self, records, state, key):
        from pyspark.sql import functions as F

        step = records.groupBy(key).agg(F.sum("n").alias("n"))
        prior = state.select(key, F.col("n").alias("prior"))
        total = step.join(prior, key, "left").fillna(0, ["prior"]).select(key, (F.col("n") + F.col("prior")).alias("n"))
        return step, {MAIN: total}


def graph():
    g = Graph("boot")
    opening = Bootstrap("landing/opening", COUNTS, to_records=lambda df: df)
    events = g.source("events", DeltaSource("landing/events", COUNTS), bootstrap=opening)
    more = g.source("more", DeltaSource("landing/more", COUNTS))
    totals = events.union(more).key_by("user", parallelism=2).process(Sum(), uid="sum")
    totals.output(MAIN).sink("totals", DeltaSink("out/totals", tuple(COUNTS.items()), mode="upsert", keys=("user",)))
    return g.build()


def append(spark, w: str, table: str, rows) -> None:
    spark.createDataFrame(rows, "user string, n long").write.format("delta").mode("append").save(f"{w}/landing/{table}")


@pytest.mark.slow  # CI tier: the bootstrap's records are one function for both runners (sources.bootstrap_records),
# read in CI by transfers' tests (its opening balances)
def test_a_bootstrap_enters_once_with_its_sources_first_records(spark, tmp_path):
    w = str(tmp_path)
    append(spark, w, "opening", [("a", 100), ("b", 200)])
    append(spark, w, "more", [("a", 1), ("c", 1), ("c", 1)])  # committed first, and full: a step of its own
    append(spark, w, "more", [("c", 1)])
    for k in range(3):
        append(spark, w, "events", [("a", 1), ("b", 1), ("d", 1)])
    said: list[str] = []
    first = GraphRunner(graph(), w, spark, rows_per_checkpoint=2, progress=said.append)
    first.kills.reached = raise_at("ack", 2)  # the second checkpoint never completes
    with pytest.raises(RuntimeError, match="killed"):
        first.run()
    assert sum("bootstrap: reading landing/opening" in m for m in said) == 1
    assert first.summary.completed == [1]  # "more" alone: the bootstrap not read yet
    again = GraphRunner(graph(), w, spark, rows_per_checkpoint=2, progress=said.append).run()
    assert again.restored == 1
    totals = read_delta(f"{w}/out/totals").set_index("user")["n"].to_dict()
    assert totals == {"a": 100 + 1 + 3, "b": 200 + 3, "c": 3, "d": 3}
    assert sum("bootstrap: reading" in m for m in said) == 2, "\n".join(said)  # read again after the restore of checkpoint 1
    append(spark, w, "events", [("a", 1)])
    GraphRunner(graph(), w, spark, rows_per_checkpoint=2, recover=True, progress=said.append).run()
    assert sum("bootstrap: reading" in m for m in said) == 2  # restored past it: not read again
    assert read_delta(f"{w}/out/totals").set_index("user")["n"].to_dict()["a"] == 105

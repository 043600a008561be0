"""A Delta table read through its change data feed (checkpoint_lib.pipeline.ChangeFeedSource,
checkpoint_lib.spark.change_feed): inserts, updates and deletes in commit order with their kind,
offsets a re-read gives again, the refusal of a table that records no feed, and a keyed pipeline
counting each key's changes run to completion."""

from __future__ import annotations

import shutil

import pytest

from checkpoint_lib.delta.log import AddedFile
from checkpoint_lib.pipeline import CHANGE_COLUMN, ChangeFeedSource, DeltaSink, Pipeline
from checkpoint_lib.spark.change_feed import ChangeFeedUnavailableError
from checkpoint_lib.spark.runner import PipelineRunner, SchemaMismatchError
from checkpoint_lib.spark.sources import SourceSite, source_reader
from checkpoint_lib.verify import read_delta

pytestmark = pytest.mark.spark

CUSTOMERS = "id string, tier string, score string"
"""The table's columns; the pipeline declares ``score`` a long: a value that does not convert is a dead letter."""
DECLARED = "id string, tier string, score long"
FEED_ON = "TBLPROPERTIES (delta.enableChangeDataFeed = true)"


def reader(spark, path: str, schema: str = DECLARED):
    return source_reader(ChangeFeedSource("dims/customers", schema),
                         SourceSite(spark, path, f"{path}-checkpoints", "dims", lambda _m: None))


def customers(spark, path: str) -> None:
    """Version 0: the table, feed on; 1: four inserts; 2: a MERGE updating a, inserting e;
    3: b deleted; 4: c and d updated."""
    spark.sql(f"CREATE TABLE delta.`{path}` ({CUSTOMERS}) USING delta {FEED_ON}")
    spark.createDataFrame([("a", "std", "10"), ("b", "std", "20"), ("c", "gold", "x"), ("d", "std", "40")],
                          CUSTOMERS).write.format("delta").mode("append").save(path)
    spark.sql(f"MERGE INTO delta.`{path}` t USING (SELECT 'a' id, 'gold' tier, '11' score UNION ALL "
              "SELECT 'e', 'std', '50') s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 'b'")
    spark.sql(f"UPDATE delta.`{path}` SET tier = 'plat', score = '99' WHERE id IN ('c', 'd')")


@pytest.fixture(scope="module")
def customers_table(spark, tmp_path_factory) -> str:
    """The :func:`customers` table, written once for the module (tests read it, or copy it)."""
    path = str(tmp_path_factory.mktemp("feed") / "customers")
    customers(spark, path)
    return path


def rows(df) -> list[tuple]:
    return sorted((tuple(r) for r in df.collect()), key=lambda r: (r[4], r[6]))


def test_the_feed_is_read_in_commit_order_with_its_kinds_and_the_same_offsets_on_every_read(spark, customers_table):
    path = customers_table
    r = reader(spark, path)
    assert r.latest() == 4 and r.pending_rows(-1, 4) == 4 + 2 + 1 + 2  # an update's row before it not counted
    assert [(f.version, f.path, f.rows) for f in r.next_step(-1, 4, 1)] == [(1, "cdf@1", 4)]
    step = r.next_step(-1, 4, 100)
    assert [(f.version, f.path, f.rows) for f in step] == [(1, "cdf@1", 4), (2, "cdf@2", 2), (3, "cdf@3", 1),
                                                            (4, "cdf@4", 2)]

    df = r.read(step, 2)
    assert df.schema.simpleString() == ("struct<id:string,tier:string,score:bigint,change:string,src_version:bigint,"
                                        "src_file:string,src_row:bigint,sender:int,_ckpt_error:string>")
    bad = 'wrong type for score: "x" (expected bigint)'
    assert rows(df) == [
        # id, tier, score, change, src_version, src_file, src_row, sender, error
        ("a", "std", 10, "insert", 1, "cdf@1", 0, 0, None),
        ("b", "std", 20, "insert", 1, "cdf@1", 1, 0, None),
        ("c", "gold", None, "insert", 1, "cdf@1", 2, 0, bad),
        ("d", "std", 40, "insert", 1, "cdf@1", 3, 0, None),
        ("a", "gold", 11, "update", 2, "cdf@2", 0, 1, None),  # within a version: deletes, updates, inserts
        ("e", "std", 50, "insert", 2, "cdf@2", 1, 1, None),
        ("b", "std", 20, "delete", 3, "cdf@3", 0, 0, None),
        ("c", "plat", 99, "update", 4, "cdf@4", 0, 1, None),
        ("d", "plat", 99, "update", 4, "cdf@4", 1, 1, None),
    ]
    # the same step again, and its versions read in other steps: the same changes at the same offsets
    assert rows(r.read(step, 2)) == rows(df)
    offsets = {(x[4], x[6]): x[:4] for x in rows(df)}
    again = rows(reader(spark, path).read([step[3]], 3)) + rows(r.read(step[1:3], 1))
    assert {(x[4], x[6]): x[:4] for x in again} == {k: v for k, v in offsets.items() if k[0] > 1}
    assert r.missing(step) == []


def test_a_table_that_records_no_change_feed_is_refused_with_the_way_out(spark, tmp_path):
    with pytest.raises(ValueError, match="column 'change' is what a ChangeFeedSource adds"):
        ChangeFeedSource("dims/x", "id string, change string")
    assert ChangeFeedSource("dims/x", "id string").schema == {"id": "string", CHANGE_COLUMN: "string"}

    path = str(tmp_path / "dims" / "plain")
    spark.createDataFrame([("a", "std", "1")], CUSTOMERS).write.format("delta").save(path)
    with pytest.raises(ChangeFeedUnavailableError, match=r"dims/plain has no change data feed \(delta.enableChangeDataFeed "
                                                         r"is not true at version 0.*ALTER TABLE delta.`.*` SET TBLPROPERTIES"):
        reader(spark, path).next_step(-1, 0, 10)

    # the feed turned on later: the versions before it are refused, the ones after are read
    spark.sql(f"ALTER TABLE delta.`{path}` SET {FEED_ON}")
    spark.createDataFrame([("b", "gold", "2")], CUSTOMERS).write.format("delta").mode("append").save(path)
    with pytest.raises(ChangeFeedUnavailableError, match=r"version 0 changed rows before the table's change data feed "
                                                         r"was turned on \(at version 1\).*source offset is 0 or later"):
        reader(spark, path).next_step(-1, 2, 10)
    r = reader(spark, path)
    step = r.next_step(0, 2, 10)
    assert step == [AddedFile(2, "cdf@2", 1, step[0].size)]
    assert [x[:5] for x in rows(r.read(step, 1))] == [("b", "gold", 2, "insert", 2)]

    with pytest.raises(SchemaMismatchError, match="column 'region' is missing"):
        reader(spark, path, "id string, region string").next_step(0, 2, 10)


class CountChanges:
    """Per key, how many inserts, updates and deletes it saw (additive state)."""

    state_schema = "inserts long, updates long, deletes long"
    order_by = ("src_version", "src_file", "src_row")
    KINDS = ("insert", "update", "delete")

    def apply(self, records, state, key):
        from pyspark.sql import functions as F

        counts = records.groupBy(key).agg(*[F.sum(F.when(F.col(CHANGE_COLUMN) == k, 1).otherwise(0)).cast("long")
                                            .alias(f"{k}s") for k in self.KINDS])
        prior = state.select(key, *[F.col(f"{k}s").alias(f"prior_{k}s") for k in self.KINDS])
        totals = counts.join(prior, key, "left").select(
            key, *[(F.coalesce(F.col(f"prior_{k}s"), F.lit(0)) + F.col(f"{k}s")).alias(f"{k}s") for k in self.KINDS])
        return counts, {"changes": totals}


def changes_per_customer() -> Pipeline:
    from pyspark.sql import functions as F

    return (
        Pipeline("dims")
        .source(ChangeFeedSource("dims/customers", DECLARED,
                                 validate=lambda df: F.when(F.col("tier") == "banned", F.lit("banned tier"))),
                parallelism=2)
        .key_by("id", parallelism=2)
        .process(CountChanges(), uid="changes")
        .sink("changes", DeltaSink("gold/changes", "id string, inserts long, updates long, deletes long",
                                   mode="upsert", keys=("id",)))
        .dead_letters("dlq/customers")
    )


@pytest.mark.slow  # CI tier: the change feed read through enrichment's graph (the CI cases of
# tests/spark/test_graph_neighbours.py) and by the reader's tests above
def test_a_keyed_pipeline_counts_each_keys_changes_exactly_once(spark, tmp_path, customers_table):
    w = str(tmp_path)
    path = f"{w}/dims/customers"
    shutil.copytree(customers_table, path)  # a Delta table's log names its files relative to it
    first = PipelineRunner(changes_per_customer(), w, spark, rows_per_checkpoint=5).run()
    counts = {r.id: (r.inserts, r.updates, r.deletes) for r in read_delta(f"{w}/gold/changes").itertuples()}
    # c's insert did not convert (score "x"): a dead letter; its update did
    assert counts == {"a": (1, 1, 0), "b": (1, 0, 1), "c": (0, 1, 0), "d": (1, 1, 0), "e": (1, 0, 0)}

    spark.sql(f"UPDATE delta.`{path}` SET tier = 'banned' WHERE id = 'e'")  # refused by validate
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id IN ('a', 'c')")
    second = PipelineRunner(changes_per_customer(), w, spark, rows_per_checkpoint=5).run()
    assert second.final > first.final
    counts = {r.id: (r.inserts, r.updates, r.deletes) for r in read_delta(f"{w}/gold/changes").itertuples()}
    assert counts == {"a": (1, 1, 1), "b": (1, 0, 1), "c": (0, 1, 1), "d": (1, 1, 0), "e": (1, 0, 0)}
    dead = read_delta(f"{w}/dlq/customers")
    assert sorted((r["id"], r[CHANGE_COLUMN], e, v, f, n) for r, e, v, f, n in zip(
        dead["record"], dead["error"], dead["src_version"], dead["src_file"], dead["src_row"])) == [
        ("c", "insert", 'wrong type for score: "x" (expected bigint)', 1, "cdf@1", 2),
        ("e", "update", "banned tier", 5, "cdf@5", 0)]

"""Records may use the names the library uses for its own bookkeeping (issue 46): the channel
log's control columns (``kind``, ``seq``, ``checkpoint_id``, ``barrier_ts``, ``epoch``), the
dead letters' ``error``, the temporaries of a step. What must stay reserved is refused at
declaration, naming the column."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from checkpoint_lib.pipeline import DeltaSink, DeltaSource, Pipeline
from checkpoint_lib.spark.runner import PipelineRunner
from checkpoint_lib.verify import read_delta

pytestmark = pytest.mark.spark

SOURCE = {"id": "string", "account": "string", "amount": "long", "kind": "string", "error": "string"}
OUT = (("id", "string"), ("account", "string"), ("amount", "long"), ("kind", "string"), ("error", "string"))


class Totals:
    state_schema = "total long"
    order_by = ("src_version", "src_file", "src_row")

    def apply(self, records, state, key):
        deltas = records.groupBy(key).agg(F.sum("amount").alias("total"))
        return deltas, {"out": records.select(*[c for c, _ in OUT])}


def bad_amount(df):
    return F.when(F.col("amount").isNull(), F.lit("null amount"))


def pipeline(name: str) -> Pipeline:
    return (
        Pipeline(name)
        .source(DeltaSource(f"landing/{name}", SOURCE, validate=bad_amount), parallelism=2)
        .key_by("account", parallelism=2)
        .process(Totals(), uid="totals")
        .sink("out", DeltaSink(f"gold/{name}", OUT))
        .dead_letters(f"dlq/{name}")
    )


def land(spark, w: str, name: str, batch: int, rows: int = 12) -> None:
    data = [(f"e{batch}-{i}", f"a{i % 3}", None if i % 5 == 4 else i, f"k{i % 2}", f"err{i}") for i in range(rows)]
    spark.createDataFrame(data, "id string, account string, amount long, kind string, error string").coalesce(2) \
        .write.format("delta").mode("append").save(f"{w}/landing/{name}")


@pytest.mark.xfail(strict=True, reason="issue 46: [COLUMN_ALREADY_EXISTS] kind, error")
def test_records_named_kind_and_error_run_unchained(spark, tmp_path):
    w = str(tmp_path)
    for batch in range(2):
        land(spark, w, "names", batch)
    PipelineRunner(pipeline("names"), w, spark, rows_per_checkpoint=12, chaining=False).run()
    out = read_delta(f"{w}/gold/names")
    landing = read_delta(f"{w}/landing/names")
    good = landing[landing["amount"].notna()]
    assert sorted(out["id"]) == sorted(good["id"])
    assert sorted(zip(out["id"], out["kind"], out["error"])) == sorted(zip(good["id"], good["kind"], good["error"]))
    dlq = read_delta(f"{w}/dlq/names")
    assert set(dlq["error"]) == {"null amount"} and len(dlq) == len(landing) - len(good)

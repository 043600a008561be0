"""Partitioning between the source stage and the operator: rebalance, broadcast and forward (hash
by key is what every payments test uses), with a fused map(), exactly once across a recovery."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from checkpoint_lib.pipeline import DeltaSink, DeltaSource, Pipeline
from checkpoint_lib.pipelines.payments import SOURCE_SCHEMA, generate, payment_errors
from checkpoint_lib.spark.runner import PipelineRunner
from checkpoint_lib.verify import read_delta

pytestmark = pytest.mark.spark

ENRICHED = {**{c: t for c, t in SOURCE_SCHEMA.items() if c != "ts"}, "amount_eur": "double"}
OUT_SCHEMA = (
    ("event_id", "string"), ("account", "string"), ("amount_eur", "double"),
    ("handled_by", "int"), ("src_file", "string"),
)


class Tag:
    """Stateless: tags each record with the subtask that handled it and the source file it came from
    (the runner's routing columns are not the operator's to see)."""

    def apply(self, records):
        assert not {"receiver", "sender", "key_group"} & set(records.columns), records.columns
        out = records.select(
            "event_id", "account", "amount_eur", F.col("sink_subtask").alias("handled_by"), "src_file"
        )  # no bookkeeping column kept: the runner stages each instance's rows by its subtask
        return {"out": out}


def tagged(name: str, how: str, parallelism: int) -> Pipeline:
    p = (
        Pipeline(name)
        .source(DeltaSource("landing/payments", SOURCE_SCHEMA, validate=payment_errors), parallelism=2)
        .map(lambda df: df.withColumn("amount_eur", F.col("amount_cents") / 100.0).drop("ts"), schema=ENRICHED)
    )
    p = p.forward() if how == "forward" else getattr(p, how)(parallelism)
    return p.process(Tag(), uid="tag").sink("out", DeltaSink(f"gold/{name}", OUT_SCHEMA)).dead_letters(f"dlq/{name}")


def valid_ids(warehouse) -> set[str]:
    landing = read_delta(f"{warehouse}/landing/payments")
    good = landing.dropna(subset=["event_id", "account", "amount_cents"])
    return set(good["event_id"])


def test_rebalance_broadcast_forward_deliver_every_record_as_declared(spark, tmp_path):
    w = str(tmp_path)
    generate(spark, w, 240, bad_fraction=0.05, accounts=5, seed=3, files=4)

    # rebalance to 3: a stateless operator; a forced recovery half-way replays exactly once
    rebalance = tagged("tag_rebalance", "rebalance", 3)
    PipelineRunner(rebalance, w, spark, rows_per_checkpoint=60).run(max_steps=2, final_checkpoint=True)
    generate(spark, w, 120, bad_fraction=0.05, accounts=5, seed=4, files=2)
    plan = PipelineRunner(rebalance, w, spark, rows_per_checkpoint=60, recover=True)
    plan.run()
    assert plan.summary.restored is not None
    out = read_delta(f"{w}/gold/tag_rebalance")
    assert sorted(out["event_id"]) == sorted(valid_ids(w))  # each valid record exactly once
    assert set(out["handled_by"]) == {0, 1, 2}  # spread over every subtask
    assert out.groupby("handled_by").size().min() >= len(out) // 6
    assert ((out["amount_eur"] * 100).round().astype("int64") > -60_000).all()
    dlq = read_delta(f"{w}/dlq/tag_rebalance")
    landing = read_delta(f"{w}/landing/payments")
    assert len(dlq) + len(out) == len(landing)  # nothing lost: bad rows dead-lettered

    # broadcast to 3: every subtask handles every record once
    PipelineRunner(tagged("tag_broadcast", "broadcast", 3), w, spark, rows_per_checkpoint=200).run()
    out = read_delta(f"{w}/gold/tag_broadcast")
    per_event = out.groupby("event_id")["handled_by"].apply(lambda s: sorted(s))
    assert set(per_event.index) == valid_ids(w)
    assert all(v == [0, 1, 2] for v in per_event)

    # forward: source subtask i feeds operator subtask i, nothing crosses: the records of a source
    # file (read by one source subtask) are all handled by one operator subtask
    PipelineRunner(tagged("tag_forward", "forward", 2), w, spark, rows_per_checkpoint=200).run()
    out = read_delta(f"{w}/gold/tag_forward")
    assert sorted(out["event_id"]) == sorted(valid_ids(w))
    assert out.groupby("src_file")["handled_by"].nunique().max() == 1
    assert set(out["handled_by"]) == {0, 1}


def test_routing_is_a_pure_function_of_the_record_and_follows_key_group_ownership(spark):
    """What makes replays and rescaled restores route records consistently."""
    from checkpoint_lib.core.keygroups import range_for_subtask
    from checkpoint_lib.spark.partitioning import route

    rows = [(f"acct-{i % 13}", 0, f"f{i % 3}", i, i % 2) for i in range(60)]
    df = spark.createDataFrame(rows, "account string, src_version long, src_file string, src_row long, sender int")
    for parallelism in (2, 5):
        hashed = route(df, "hash", parallelism, key="account").toPandas()
        for r in hashed.itertuples():  # the receiver owns the record's key group (core.keygroups)
            assert r.key_group in range_for_subtask(r.receiver, parallelism)
        assert hashed.groupby("account")["receiver"].nunique().max() == 1
    once = route(df, "rebalance", 3).toPandas()["receiver"].tolist()
    assert once == route(df, "rebalance", 3).toPandas()["receiver"].tolist() and set(once) == {0, 1, 2}
    assert route(df, "broadcast", 4).count() == 4 * len(rows)
    forward = route(df, "forward", 2).toPandas()
    assert (forward["receiver"] == forward["sender"]).all()
    with pytest.raises(ValueError, match="unknown partitioning 'shuffle'"):
        route(df, "shuffle", 2)

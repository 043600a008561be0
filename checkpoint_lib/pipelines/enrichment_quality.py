"""The ``enrichment`` graph's after-restore quality suite: the views that
``expectations/enrichment_after_restore.json`` checks, built in Spark for checkpoint *c* (default:
the latest completed one) from what *c* committed, pinned and acknowledged. ``ckpt validate
enrichment`` and ``ckpt recover enrichment`` run it (:data:`SPEC`, declared in
:func:`.enrichment.build`).

With *p* the payments offset *c* acknowledged (``SubtaskId("payments", 0)``) and *a* the accounts
offset:

================  ==================================================================================
``events``        the ``tagged`` sink as *c* committed it, a row per row: ``landed`` (its
                  ``event_id``, ``account`` and ``amount_cents`` are a payment landed up to *p*)
``totals``        one row per region of ``region_totals`` as *c* committed it, of the tagged rows, or
                  of the ``totals`` operator's state *c* pinned: ``agrees`` (the sink's sum and count
                  = the tagged rows'), ``state_agrees`` (the state's = the sink's)
``dedup_state``   one row per event id of the ``dedup`` operator's pinned state or of the tagged
                  rows: ``in_state``, ``in_tagged`` (the state holds exactly the tagged ids)
``accounted``     one row: ``landed`` (payment rows up to *p*), ``tagged``, ``rejected`` (the two
                  sinks' rows at *c*), ``dead_letters`` (``dlq/enrichment/payments`` up to *p*),
                  ``duplicates`` (landed copies of a tagged or rejected event beyond those the sinks
                  hold), ``accounted`` (their sum), ``bad_rows`` (landed rows the source refuses)
``tag_state``     one row per account of the ``tag`` operator's pinned state or of the accounts'
                  change feed up to *a*: ``in_state``, ``in_feed``, ``agrees`` (the state holds the
                  change with the greatest ``updated_at``, a later commit winning a tie; a delete as
                  status ``removed``, as :class:`.enrichment.TagRegion` keeps it)
================  ==================================================================================

Every landed payment row is exactly one of tagged, rejected, a dead letter or a duplicate (the
semantics of :mod:`.enrichment_data`), so ``accounted`` = ``landed``: a lost, an invented or a
repeated row in a sink or in the dead letters breaks the sum.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..quality.spec import GraphQualitySpec

SUITE = "enrichment_after_restore"
"""The suite file, ``expectations/enrichment_after_restore.json``."""

PAYMENTS, ACCOUNTS = "payments", "accounts"
TAG, DEDUP, TOTALS = "tag", "dedup", "totals"
TAGGED, REJECTED, REGION_TOTALS = "tagged", "rejected", "region_totals"
REMOVED = "removed"
"""The status :class:`.enrichment.TagRegion` keeps for a deleted account."""


def views(ctx: Any, facts: Any) -> dict[str, Any]:
    """The suite's views at checkpoint ``facts`` (a :class:`~checkpoint_lib.quality.views.GraphFacts`),
    each computed once (``ctx.materialize``)."""
    from pyspark.sql import functions as F

    from ..quality import views as V
    from ..reserved import ERROR_COLUMN

    c = facts.checkpoint_id
    paid = facts.offsets[PAYMENTS]
    tagged = V.sink_at(ctx, TAGGED, c)
    payments = V.landed(ctx, PAYMENTS, paid)
    out: dict[str, Any] = {}

    # events: each tagged row is a landed payment (by event id, account and amount)
    known = (payments.select("event_id", "account", "amount_cents").distinct()
             .withColumn("landed", F.lit(True)))
    out["events"] = ctx.materialize(
        tagged.select("event_id", "account", "amount_cents", "ts", "region")
        .join(known, ["event_id", "account", "amount_cents"], "left")
        .withColumn("landed", F.coalesce("landed", F.lit(False))), "events")

    # totals: the sink = the tagged rows per region = the operator's pinned state
    def side(df: Any, name: str, total: Any, count: Any) -> Any:
        return df.select("region", F.lit(True).alias(f"in_{name}"), total.cast("long").alias(f"{name}_total_cents"),
                         count.cast("long").alias(f"{name}_payment_count"))

    recomputed = tagged.groupBy("region").agg(F.sum("amount_cents").alias("t"), F.count(F.lit(1)).alias("n"))
    joined = (side(V.sink_at(ctx, REGION_TOTALS, c), "sink", F.col("total_cents"), F.col("payment_count"))
              .join(side(recomputed, "tagged", F.col("t"), F.col("n")), "region", "full_outer")
              .join(side(V.operator_state(ctx, facts, TOTALS), "state", F.col("total_cents"), F.col("payment_count")),
                    "region", "full_outer"))

    def same(a: str, b: str) -> Any:
        return (F.col(f"{a}_total_cents").eqNullSafe(F.col(f"{b}_total_cents"))
                & F.col(f"{a}_payment_count").eqNullSafe(F.col(f"{b}_payment_count")))

    out["totals"] = ctx.materialize(joined.select(
        "region", *[F.coalesce(f"in_{s}", F.lit(False)).alias(f"in_{s}") for s in ("sink", "tagged", "state")],
        (same("sink", "tagged") & F.col("in_sink").isNotNull()).alias("agrees"),
        (same("state", "sink") & F.col("in_state").isNotNull()).alias("state_agrees"),
        *[f"{s}_{q}" for s in ("sink", "tagged", "state") for q in ("total_cents", "payment_count")],
    ), "totals")

    # dedup_state: the ids the dedup operator saw = the tagged ids
    seen = V.operator_state(ctx, facts, DEDUP).select("event_id", F.lit(True).alias("in_state"))
    ids = tagged.select("event_id").distinct().withColumn("in_tagged", F.lit(True))
    out["dedup_state"] = ctx.materialize(seen.join(ids, "event_id", "full_outer").select(
        "event_id", F.coalesce("in_state", F.lit(False)).alias("in_state"),
        F.coalesce("in_tagged", F.lit(False)).alias("in_tagged")), "dedup_state")

    # accounted: every landed row is exactly one of tagged, rejected, a dead letter, a duplicate
    rejected = V.sink_at(ctx, REJECTED, c)
    dead = V.dead_letters(ctx, paid, source=PAYMENTS)
    offset = ["src_version", "src_file", "src_row"]
    kept = payments if dead is None else payments.join(dead.select(*offset), offset, "left_anti")
    per_event = (kept.groupBy("event_id").agg(F.count(F.lit(1)).alias("copies"))
                 .join(tagged.groupBy("event_id").agg(F.count(F.lit(1)).alias("t")), "event_id", "left")
                 .join(rejected.groupBy("event_id").agg(F.count(F.lit(1)).alias("r")), "event_id", "left")
                 .fillna(0, ["t", "r"]))
    in_sinks = F.col("t") + F.col("r")
    duplicates = per_event.agg(F.sum(F.when(in_sinks > 0, F.greatest(F.col("copies") - in_sinks, F.lit(0)))
                                     .otherwise(F.lit(0))).alias("duplicates"))
    counts = (payments.agg(F.count(F.lit(1)).alias("landed"),
                           F.count(F.when(F.col(ERROR_COLUMN).isNotNull(), 1)).alias("bad_rows"))
              .crossJoin(tagged.agg(F.count(F.lit(1)).alias("tagged")))
              .crossJoin(rejected.agg(F.count(F.lit(1)).alias("rejected")))
              .crossJoin(dead.agg(F.count(F.lit(1)).alias("dead_letters")) if dead is not None
                         else ctx.spark.range(1).select(F.lit(0).alias("dead_letters")))
              .crossJoin(duplicates))
    parts = ["tagged", "rejected", "dead_letters", "duplicates"]
    total = F.lit(0)
    for part in parts:
        total = total + F.coalesce(F.col(part), F.lit(0))
    out["accounted"] = ctx.materialize(counts.select(
        *[F.coalesce(F.col(n), F.lit(0)).cast("long").alias(n) for n in ("landed", *parts)],
        total.cast("long").alias("accounted"), F.col("bad_rows").cast("long")), "accounted")

    # tag_state: per account, the newest change of the feed up to the accounts offset
    from pyspark.sql import Window

    feed = V.change_feed(ctx, ACCOUNTS, facts.offsets[ACCOUNTS])
    status = F.when(F.col("change") == "delete", F.lit(REMOVED)).otherwise(F.col("status"))
    newest = Window.partitionBy("account").orderBy(F.col("updated_at").desc_nulls_last(),
                                                   F.col("commit_version").desc(), F.col("change").asc())
    expected = (feed.select("account", "region", status.alias("status"), "updated_at", "commit_version", "change")
                .withColumn("_rank", F.row_number().over(newest)).where(F.col("_rank") == 1)
                .select("account", F.lit(True).alias("in_feed"), *[F.col(n).alias(f"feed_{n}") for n in
                                                                 ("region", "status", "updated_at")]))
    state = V.operator_state(ctx, facts, TAG).select(
        "account", F.lit(True).alias("in_state"), *[F.col(n).alias(f"state_{n}") for n in ("region", "status",
                                                                                           "updated_at")])
    agrees = F.lit(True)
    for n in ("region", "status", "updated_at"):
        agrees = agrees & F.col(f"state_{n}").eqNullSafe(F.col(f"feed_{n}"))
    out["tag_state"] = ctx.materialize(state.join(expected, "account", "full_outer").select(
        "account", F.coalesce("in_state", F.lit(False)).alias("in_state"),
        F.coalesce("in_feed", F.lit(False)).alias("in_feed"), agrees.alias("agrees"),
        *[f"{side}_{n}" for n in ("region", "status", "updated_at") for side in ("state", "feed")]), "tag_state")
    return out


def metrics(views: Mapping[str, Any]) -> dict[str, Any]:
    """The ``accounted`` row's counts, recorded with the outcome (the report reads
    ``dead_letters``, ``valid_rows`` and ``sink_rows``)."""
    import pandas as pd

    row = views["accounted"]
    first = row.head(1).to_dict("records")[0] if isinstance(row, pd.DataFrame) else row.first().asDict()
    out = {k: None if pd.isna(v) else int(v) for k, v in first.items()}
    out["valid_rows"] = out["landed"] - out["bad_rows"]
    out["sink_rows"] = out["tagged"]
    return out


SPEC = GraphQualitySpec(suite=SUITE, views=views, metrics=metrics)
"""The ``enrichment`` graph's quality suite (``Graph.quality``)."""

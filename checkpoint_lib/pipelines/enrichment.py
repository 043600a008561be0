"""``enrichment``: a dataflow graph with two inputs (the shipped example of graphs).

::

    payments (Delta, 2) --key_by(account)--> tag (two-input keyed, 2) --key_by(event_id)--> dedup (keyed, 2)
    accounts (change feed) --key_by(account)-^   |                                           |       |
                                                 +-- rejected (sink: dead letters)    tagged (sink)  +--key_by(region)--> totals (keyed) -- region_totals (sink, upsert)

- ``payments``: ``event_id, account, amount_cents, ts`` events (``landing/enrichment/payments``,
  append-only); bad rows (no event id, account or amount) to ``dlq/enrichment/payments``;
- ``accounts``: the accounts dimension table read through its change data feed
  (``landing/enrichment/accounts``: accounts opened, moved between regions, closed, removed);
- ``tag`` (:class:`TagRegion`, Flink's ``KeyedCoProcessFunction``): per account, its latest
  attributes as state (the change with the greatest ``updated_at``: a late change never wins over
  a newer one); each payment is tagged with the account's region as of the payment's ``ts`` (the
  latest change at or before it, among the state and this step's changes), or rejected ("unknown
  account": none, or removed; "closed account");
- ``dedup`` (:class:`Dedup`): the first of each ``event_id`` (a payment landed twice counts once);
- ``totals`` (:class:`RegionTotals`): per region, the running sum and count of tagged payments.

Sinks: ``tagged`` (``gold/enrichment/tagged``, append), ``region_totals``
(``gold/enrichment/region_totals``, upsert by region) and ``rejected`` (``dlq/enrichment/rejected``,
append: every rejected payment row, duplicates included). The generator and the independent
verifier are :mod:`.enrichment_data`'s; the after-restore quality suite (Great Expectations) is
:mod:`.enrichment_quality`'s.

"As of the payment" holds whatever the step boundaries are because the landing follows one rule
(the generator keeps it): an accounts change lands before any payment at or after its
``updated_at``, and none lands before a payment earlier than it; the graph runner cuts each step at
one commit time across both sources (:func:`checkpoint_lib.graph.steps.plan_step`), so when
a payment is tagged, every change it may see has been read and no later one has.
"""

from __future__ import annotations

from typing import Any, Mapping

MAIN = "main"


class TagRegion:
    """Input 1: payments; input 2: accounts changes (with the feed's ``change``); keyed by account."""

    state_schema = "region string, status string, updated_at timestamp"
    state_update = "replace"

    def apply(self, payments: Any, accounts: Any, state: Any, key: str) -> tuple[Any, Mapping[str, Any]]:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        attributes = [key, "region", "status", "updated_at"]
        removed = F.col("change") == F.lit("delete") if "change" in accounts.columns else F.lit(False)
        # a tie on updated_at goes to the later change in commit order (its offset): a later commit,
        # or within one commit its post-image, as the feed numbers a version's deletes before its
        # updates and inserts (a commit that rewrote files whole, an overwrite, deletes every row of
        # them and inserts it again); the state holds what earlier steps read, older than any change here
        changes = accounts.select(key, "region", F.when(removed, F.lit("removed")).otherwise(F.col("status"))
                                  .alias("status"), "updated_at", F.col("src_version").alias("_version"),
                                  F.col("src_row").alias("_row"))
        known = state.select(*attributes, F.lit(-1).cast("long").alias("_version"),
                             F.lit(-1).cast("long").alias("_row")).unionByName(changes)
        newest_first = (F.col("updated_at").desc(), F.col("_version").desc(), F.col("_row").desc())

        # each payment (one landed row: its offset) sees the latest change at or before its ts
        row = ["src_version", "src_file", "src_row"]
        seen = (payments.select(*row, key, "ts").join(known, key)
                .where(F.col("updated_at") <= F.col("ts"))
                .withColumn("_rank", F.row_number().over(Window.partitionBy(*row).orderBy(*newest_first)))
                .where(F.col("_rank") == 1).select(*row, "region", "status"))
        looked_up = payments.join(seen, row, "left")
        reason = (F.when(F.col("status").isNull() | (F.col("status") == "removed"), F.lit("unknown account"))
                  .when(F.col("status") == "closed", F.lit("closed account"))
                  .when(F.col("status") != "open", F.concat(F.lit("account status "), F.col("status"))))
        event = ["event_id", key, "amount_cents", "ts"]
        tagged = looked_up.where(reason.isNull()).select(*event, "region")
        rejected = looked_up.where(reason.isNotNull()).select(*event, reason.alias("reason"))

        # the new state of every account changed in this step: its newest change (or the state's)
        latest = (known.join(changes.select(key).distinct(), key, "left_semi")
                  .withColumn("_rank", F.row_number().over(Window.partitionBy(key).orderBy(*newest_first)))
                  .where(F.col("_rank") == 1).select(*attributes))
        return latest, {MAIN: tagged, "rejected": rejected}


class Dedup:
    """Keyed by event id: each event once (its copies are identical rows), state: seen ids."""

    state_schema = "seen boolean"
    state_update = "replace"

    def apply(self, records: Any, state: Any, key: str) -> tuple[Any, Mapping[str, Any]]:
        from pyspark.sql import functions as F

        columns = [c for c in records.columns if c not in ("sink_subtask",)]
        first = records.join(state.select(key), key, "left_anti").select(*columns).dropDuplicates([key])
        return first.select(key, F.lit(True).alias("seen")), {MAIN: first}


class RegionTotals:
    """Keyed by region: the running sum and count of its payments (additive state)."""

    state_schema = "total_cents long, payment_count long"

    def apply(self, records: Any, state: Any, key: str) -> tuple[Any, Mapping[str, Any]]:
        from pyspark.sql import functions as F

        step = records.groupBy(key).agg(F.sum("amount_cents").alias("total_cents"),
                                        F.count(F.lit(1)).alias("payment_count"))
        prior = state.select(key, F.col("total_cents").alias("prior_total"),
                             F.col("payment_count").alias("prior_count"))
        totals = step.join(prior, key, "left").fillna(0, ["prior_total", "prior_count"]).select(
            key, (F.col("prior_total") + F.col("total_cents")).alias("total_cents"),
            (F.col("prior_count") + F.col("payment_count")).alias("payment_count"))
        return step, {MAIN: totals}


def graph(name: str = "enrichment", *, payments_source: Any = None, accounts_source: Any = None,
          parallelism: int = 2) -> Any:
    """The enrichment graph (``payments_source``/``accounts_source``: other declarations of the
    two inputs, e.g. in tests)."""
    from ..graph import Graph
    from ..pipeline import ChangeFeedSource, DeltaSink, DeltaSource
    from .enrichment_data import (ACCOUNTS_SCHEMA, PAYMENTS_SCHEMA, REGION_TOTALS_SCHEMA, REJECTED_SCHEMA,
                                  TAGGED_SCHEMA)
    from .payments import payment_errors

    g = Graph(name)
    payments = g.source("payments", payments_source or DeltaSource(
        "landing/enrichment/payments", PAYMENTS_SCHEMA, validate=payment_errors), parallelism=parallelism)
    payments.dead_letters("dlq/enrichment/payments")
    accounts = g.source("accounts", accounts_source or ChangeFeedSource("landing/enrichment/accounts", ACCOUNTS_SCHEMA))
    accounts.dead_letters("dlq/enrichment/accounts")
    tagged = (payments.key_by("account", parallelism=parallelism).connect(accounts.key_by("account"))
              .process(TagRegion(), uid="tag"))
    tagged.output("rejected").sink("rejected", DeltaSink("dlq/enrichment/rejected", REJECTED_SCHEMA))
    unique = tagged.key_by("event_id", parallelism=parallelism).process(Dedup(), uid="dedup")
    unique.output(MAIN).sink("tagged", DeltaSink("gold/enrichment/tagged", TAGGED_SCHEMA))
    totals = unique.key_by("region").process(RegionTotals(), uid="totals")
    totals.output(MAIN).sink("region_totals", DeltaSink("gold/enrichment/region_totals", REGION_TOTALS_SCHEMA,
                                                        mode="upsert", keys=("region",)))
    return g.build()


def build() -> Any:
    """The registered ``enrichment`` graph (``ckpt run enrichment``) with its generator (``ckpt
    generate enrichment``: :func:`.enrichment_data.generate`) and its after-restore quality suite
    (``ckpt validate enrichment``, and after ``ckpt recover enrichment``:
    :mod:`.enrichment_quality`)."""
    import dataclasses

    from . import enrichment_data, enrichment_quality

    return dataclasses.replace(graph(), generator_fn=enrichment_data.generate, quality=enrichment_quality.SPEC)

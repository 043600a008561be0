"""What the generic suites need to know about a pipeline: which tables and columns play which role.

The suites in ``expectations/`` are written against *standard views* (``events``, ``keys``,
``conservation``...), never against a pipeline's own column names. A :class:`QualitySpec` maps a
pipeline onto those views, so the same suites check ``payments`` today and ``transfers`` (issue 4)
once it exists: register a spec for it in :data:`SPECS`.

Aggregates must be *additive* (sums and counts): the conservation check adds them up across keys,
across operator state and channel state, and compares them with the same aggregate over the source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class QualitySpec:
    """Roles of a pipeline's tables and columns.

    - ``event_sink`` / ``event_id`` / ``event_columns``: the append sink with one row per valid
      source record (its id column, and the columns that must equal the source's);
    - ``key_sink``: the upsert sink with one row per key holding the ``aggregates`` (optional);
    - ``aggregates``: state (and key sink) column -> a function returning the Spark aggregate that
      recomputes it from source-like records (``lambda: F.sum("amount_cents")``); additive only;
    - ``dead_letter_offset``: the dead-letter columns that identify a source row;
    - ``source_records(ctx, valid)``: the records the aggregates run over, from the valid source
      rows up to the checkpoint (default: those rows) - e.g. a transfer is a debit of ``src`` and
      a credit of ``dst``, and opening balances come from another table;
    - ``channel_records(channel, full)``: what logged in-flight records add to the state, in the
      same form (default: the records themselves). ``full=False``: what replaying them applies at
      once (the restored state); ``full=True``: all they lead to (what the pipeline converges to,
      e.g. a replayed debit also credits ``dst`` through the feedback edge).
    """

    pipeline: str
    event_sink: str | None
    event_id: str | None
    event_columns: tuple[str, ...] = ()
    key_sink: str | None = None
    aggregates: Mapping[str, Callable[[], Any]] = field(default_factory=dict)
    dead_letter_offset: tuple[str, ...] = ("src_version", "src_file", "src_row")
    source_records: Callable[[Any, Any], Any] | None = None
    channel_records: Callable[[Any, bool], Any] | None = None


def _payments() -> QualitySpec:
    def balance() -> Any:
        from pyspark.sql import functions as F

        return F.sum("amount_cents").cast("long")

    def count() -> Any:
        from pyspark.sql import functions as F

        return F.count(F.lit(1)).cast("long")

    return QualitySpec(
        pipeline="payments",
        event_sink="ledger",
        event_id="event_id",
        event_columns=("account", "amount_cents"),
        key_sink="balances",
        aggregates={"balance_cents": balance, "event_count": count},
    )


def _transfers() -> QualitySpec:
    """Balances only move: a valid transfer debits ``src`` and credits ``dst``; the openings (the
    bootstrap table) are credits. In flight, a debit not yet applied moves nothing until it is
    (``full``: both sides), a credit adds to its account."""

    def balance() -> Any:
        from pyspark.sql import functions as F

        return F.sum("amount_cents").cast("long")

    def source_records(ctx: Any, valid: Any) -> Any:
        from pyspark.sql import functions as F

        openings = ctx.spark.read.format("delta").load(ctx.path("landing/accounts")).select(
            "account", F.col("opening_cents").alias("amount_cents"))
        debits = valid.select(F.col("src").alias("account"), (-F.col("amount_cents")).alias("amount_cents"))
        credits = valid.select(F.col("dst").alias("account"), "amount_cents")
        return openings.unionByName(debits).unionByName(credits)

    def channel_records(channel: Any, full: bool) -> Any:
        from pyspark.sql import functions as F

        debit = F.col("movement") == "debit"
        applied = channel.select("account", F.when(debit, -F.col("amount_cents"))
                                 .otherwise(F.col("amount_cents")).alias("amount_cents"))
        if not full:
            return applied
        onward = channel.where(debit).select(F.col("counterparty").alias("account"), "amount_cents")
        return applied.unionByName(onward)

    return QualitySpec(
        pipeline="transfers",
        event_sink=None,
        event_id=None,
        key_sink="account_balances",
        aggregates={"balance_cents": balance},
        source_records=source_records,
        channel_records=channel_records,
    )


SPECS: dict[str, Callable[[], QualitySpec]] = {"payments": _payments, "transfers": _transfers}
"""Pipelines with quality specs, by name."""


def get_spec(pipeline_name: str) -> QualitySpec:
    try:
        return SPECS[pipeline_name]()
    except KeyError:
        raise ValueError(
            f"pipeline {pipeline_name!r} has no quality spec; known: {', '.join(sorted(SPECS))} "
            "(register one in checkpoint_lib/quality/spec.py)"
        ) from None

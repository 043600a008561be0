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
    - ``dead_letter_offset``: the dead-letter columns that identify a source row.
    """

    pipeline: str
    event_sink: str | None
    event_id: str | None
    event_columns: tuple[str, ...] = ()
    key_sink: str | None = None
    aggregates: Mapping[str, Callable[[], Any]] = field(default_factory=dict)
    dead_letter_offset: tuple[str, ...] = ("src_version", "src_file", "src_row")


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


SPECS: dict[str, Callable[[], QualitySpec]] = {"payments": _payments}
"""Pipelines with quality specs, by name. ``transfers`` (issue 4) registers here."""


def get_spec(pipeline_name: str) -> QualitySpec:
    try:
        return SPECS[pipeline_name]()
    except KeyError:
        raise ValueError(
            f"pipeline {pipeline_name!r} has no quality spec; known: {', '.join(sorted(SPECS))} "
            "(register one in checkpoint_lib/quality/spec.py)"
        ) from None

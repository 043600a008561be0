"""Custom Great Expectations for logic GX lacks: checks across tables, expressed over the computed
views of :mod:`checkpoint_lib.quality.views`.

Each is a subclass of GX 1.x's ``UnexpectedRowsExpectation`` with a fixed Spark-SQL query over
``{batch}`` (GX registers the batch as a temporary view): the expectation passes when the query
returns no row, and Data Docs show the description and how many rows broke it. Importing this
module registers them with GX under their snake-case names (``expect_conserved_totals``...), which
is how the JSON suites in ``expectations/`` refer to them.

GX runs such queries on SQL and Spark batches only. The views small enough for the driver are
validated as pandas DataFrames (:mod:`checkpoint_lib.quality.views`), so each query here also has
its pandas form (:data:`PANDAS_FORMS`, the same rows under SQL's three-valued logic: a comparison
with a null is unknown, and a row whose condition is unknown is not returned), and importing this
module registers the two metrics the expectation asks for with GX's pandas engine. A query without
a pandas form raises there (GX reports the expectation as errored): such a view belongs on Spark.
"""

from __future__ import annotations

from typing import Any, Callable

import great_expectations as gx
import pandas as pd
from great_expectations.constants import MAX_RESULT_RECORDS
from great_expectations.core.metric_domain_types import MetricDomainTypes
from great_expectations.execution_engine import PandasExecutionEngine
from great_expectations.expectations.metrics.metric_provider import MetricProvider, metric_value


class ExpectConservedTotals(gx.expectations.UnexpectedRowsExpectation):
    """Chandy-Lamport's witness: over a consistent cut, operator state plus channel state holds
    exactly what the source put in (per additive quantity of the ``conservation`` view)."""

    unexpected_rows_query: str = (
        "SELECT * FROM {batch} WHERE source_total IS NULL OR state_total IS NULL "
        "OR channel_state_total IS NULL OR state_total + channel_state_total <> source_total"
    )
    description: str = "state + channel state = source total (conservation over a consistent cut)"


class ExpectConsistentCut(gx.expectations.UnexpectedRowsExpectation):
    """Every record logged as channel state of checkpoint c lies before c's barrier on its channel
    (n >= m: the channel state is records m+1..n, never after the barrier)."""

    unexpected_rows_query: str = "SELECT * FROM {batch} WHERE barrier_seq IS NULL OR seq >= barrier_seq"
    description: str = "channel-state segments precede the barrier on their channel (n >= m)"


class ExpectNothingLost(gx.expectations.UnexpectedRowsExpectation):
    """Every source row up to the restored offsets is either valid (and in the sink) or dead-lettered."""

    unexpected_rows_query: str = (
        "SELECT * FROM {batch} WHERE valid_rows + dead_letters <> source_rows "
        "OR dead_letters <> bad_rows OR sink_rows + repeats <> record_rows"
    )
    description: str = ("valid + dead-lettered = source rows in range, sink rows = the records the valid rows "
                        "became (less repeated ids)")


class ExpectRestoredStateToMatchSnapshot(gx.expectations.UnexpectedRowsExpectation):
    """The state table right after a restore holds exactly the snapshot it came from (plus the
    channel state the restore replayed): same keys, same values."""

    unexpected_rows_query: str = (
        "SELECT * FROM {batch} WHERE NOT (in_restored AND in_snapshot AND values_equal)"
    )
    description: str = "restored state = the snapshot it came from (+ replayed channel state)"


CUSTOM = (ExpectConservedTotals, ExpectConsistentCut, ExpectNothingLost, ExpectRestoredStateToMatchSnapshot)


# --- the pandas forms: SQL's three-valued logic on pandas' nullable booleans (Kleene & | ~) ------


def _unknown_if_null(values: pd.Series, *inputs: pd.Series) -> pd.Series:
    """``values`` as nullable booleans, unknown (NA) where any of ``inputs`` is null."""
    out = values.astype("boolean")
    missing = pd.Series(False, index=values.index)
    for s in inputs:
        missing = missing | s.isna()
    return out.mask(missing, pd.NA)


def _ne(a: pd.Series, b: pd.Series) -> pd.Series:
    return _unknown_if_null(a != b, a, b)


def _ge(a: pd.Series, b: pd.Series) -> pd.Series:
    return _unknown_if_null(a >= b, a, b)


def _plus(a: pd.Series, b: pd.Series) -> pd.Series:
    return a.astype("Float64") + b.astype("Float64") if a.isna().any() or b.isna().any() else a + b


def _bool(s: pd.Series) -> pd.Series:
    return s.astype("boolean")


def _is_null(s: pd.Series) -> pd.Series:
    return s.isna().astype("boolean")


def _conservation_broken(df: pd.DataFrame) -> pd.Series:
    total = _plus(df["state_total"], df["channel_state_total"])
    return (_is_null(df["source_total"]) | _is_null(df["state_total"]) | _is_null(df["channel_state_total"])
            | _ne(total, df["source_total"]))


def _cut_broken(df: pd.DataFrame) -> pd.Series:
    return _is_null(df["barrier_seq"]) | _ge(df["seq"], df["barrier_seq"])


def _something_lost(df: pd.DataFrame) -> pd.Series:
    return (_ne(_plus(df["valid_rows"], df["dead_letters"]), df["source_rows"])
            | _ne(df["dead_letters"], df["bad_rows"])
            | _ne(_plus(df["sink_rows"], df["repeats"]), df["record_rows"]))


def _restored_differs(df: pd.DataFrame) -> pd.Series:
    return ~(_bool(df["in_restored"]) & _bool(df["in_snapshot"]) & _bool(df["values_equal"]))


def _query(cls: type) -> str:
    return cls.__fields__["unexpected_rows_query"].default


PANDAS_FORMS: dict[str, Callable[[pd.DataFrame], pd.Series]] = {
    _query(ExpectConservedTotals): _conservation_broken,
    _query(ExpectConsistentCut): _cut_broken,
    _query(ExpectNothingLost): _something_lost,
    _query(ExpectRestoredStateToMatchSnapshot): _restored_differs,
}
"""Each custom query -> the condition (nullable booleans, one per row) that selects its rows."""


def unexpected_rows(df: pd.DataFrame, query: str) -> pd.DataFrame:
    """The rows of ``df`` that ``query`` (one of :data:`PANDAS_FORMS`) returns."""
    form = PANDAS_FORMS.get(query)
    if form is None:
        raise NotImplementedError(f"no pandas form of the query {query!r}: validate this view on Spark")
    return df[form(df).fillna(False).astype(bool)]


def _batch(execution_engine: Any, metric_domain_kwargs: dict) -> pd.DataFrame:
    df, _, _ = execution_engine.get_compute_domain(metric_domain_kwargs, domain_type=MetricDomainTypes.TABLE)
    return df


class PandasUnexpectedRowsCount(MetricProvider):
    """``unexpected_rows_query.row_count`` on GX's pandas engine (GX has it for SQL and Spark)."""

    metric_name = "unexpected_rows_query.row_count"
    domain_keys = ("batch_id", "row_condition", "condition_parser")
    value_keys = ("unexpected_rows_query",)

    @metric_value(engine=PandasExecutionEngine)
    def _pandas(cls, execution_engine: Any, metric_domain_kwargs: dict, metric_value_kwargs: dict,
                metrics: dict, runtime_configuration: dict) -> int:
        return len(unexpected_rows(_batch(execution_engine, metric_domain_kwargs),
                                   metric_value_kwargs["unexpected_rows_query"]))


class PandasUnexpectedRowsTable(MetricProvider):
    """``unexpected_rows_query.table`` on GX's pandas engine: the first rows the query returns."""

    metric_name = "unexpected_rows_query.table"
    domain_keys = ("batch_id", "row_condition", "condition_parser")
    value_keys = ("unexpected_rows_query",)

    @metric_value(engine=PandasExecutionEngine)
    def _pandas(cls, execution_engine: Any, metric_domain_kwargs: dict, metric_value_kwargs: dict,
                metrics: dict, runtime_configuration: dict) -> list[dict]:
        rows = unexpected_rows(_batch(execution_engine, metric_domain_kwargs),
                               metric_value_kwargs["unexpected_rows_query"])
        return rows.head(MAX_RESULT_RECORDS).to_dict("records")

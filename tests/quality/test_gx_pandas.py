"""The custom expectations' pandas forms (no Spark): the rows each Spark-SQL query returns, under
SQL's three-valued logic (a comparison with a null is unknown; a WHERE keeps only true rows), and
GX's pandas engine running them."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from checkpoint_lib.quality import gx_expectations as G

NAN = math.nan


def _rows(df: pd.DataFrame, cls: type) -> list[int]:
    return list(G.unexpected_rows(df, cls.__fields__["unexpected_rows_query"].default).index)


def test_nothing_lost_follows_sql_nulls():
    df = pd.DataFrame({
        "valid_rows": [1, 2, NAN, NAN], "dead_letters": [0, 1, 1, 1], "source_rows": [1, 2, 5, 5],
        "bad_rows": [0, 1, 1, 2], "sink_rows": [1, 1, 1, 1], "repeats": [0, 0, 0, 0], "record_rows": [1, 2, 1, 1],
    })
    # row 1: 2 + 1 <> 2; row 2: unknown OR false OR false (not returned); row 3: unknown OR 1 <> 2 (true)
    assert _rows(df, G.ExpectNothingLost) == [1, 3]


def test_conservation_consistent_cut_and_restored_state():
    totals = pd.DataFrame({"source_total": [5, 5, NAN, 5], "state_total": [3, 4, 1, 1], "channel_state_total": [2, 2, 1, NAN]})
    assert _rows(totals, G.ExpectConservedTotals) == [1, 2, 3]  # a null total is returned
    cut = pd.DataFrame({"seq": [1, 5, NAN, 2], "barrier_seq": [3, 5, 4, NAN]})
    assert _rows(cut, G.ExpectConsistentCut) == [1, 3]  # a null seq is unknown, a null barrier returned
    restored = pd.DataFrame({"in_restored": [True, True, False, True], "in_snapshot": [True, True, True, None],
                             "values_equal": [True, False, True, True]})
    assert _rows(restored, G.ExpectRestoredStateToMatchSnapshot) == [1, 2]  # NOT (true AND null) is unknown


def test_a_query_without_a_pandas_form_is_refused():
    with pytest.raises(NotImplementedError, match="Spark"):
        G.unexpected_rows(pd.DataFrame({"a": [1]}), "SELECT * FROM {batch} WHERE a > 0")


def test_gx_pandas_engine_runs_the_custom_expectations(tmp_path):
    import great_expectations as gx

    ctx = gx.get_context(mode="ephemeral")
    batch = (ctx.data_sources.add_pandas("p").add_dataframe_asset("a").add_batch_definition_whole_dataframe("w")
             .get_batch(batch_parameters={"dataframe": pd.DataFrame({"seq": [1, 5, 7], "barrier_seq": [3, 5, 9]})}))
    result = batch.validate(G.ExpectConsistentCut())
    assert not result.success and result.result["observed_value"] == 1

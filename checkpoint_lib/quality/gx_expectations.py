"""Custom Great Expectations for logic GX lacks: checks across tables, expressed over the computed
views of :mod:`checkpoint_lib.quality.views`.

Each is a subclass of GX 1.x's ``UnexpectedRowsExpectation`` with a fixed Spark-SQL query over
``{batch}`` (GX registers the batch as a temporary view): the expectation passes when the query
returns no row, and Data Docs show the description and how many rows broke it. Importing this
module registers them with GX under their snake-case names (``expect_conserved_totals``...), which
is how the JSON suites in ``expectations/`` refer to them.
"""

from __future__ import annotations

import great_expectations as gx


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

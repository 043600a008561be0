"""What the user pipeline of tests/fixtures/userpkg (``visits``) must produce, computed with pandas
from the landing files (no Spark, no code of the pipeline's)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from checkpoint_lib.verify import read_delta, rows_in_offset_order


def expected(warehouse) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """(visit log, visitors, bad rows) of exactly-once processing."""
    landing = rows_in_offset_order(Path(warehouse) / "landing" / "visits")
    bad = landing["visit_id"].isna() | landing["visitor"].isna() | (landing["visitor"].str.strip() == "")
    good = landing[~bad].sort_values(["src_version", "src_file", "src_row"], kind="stable").copy()
    good["nth"] = good.groupby("visitor").cumcount() + 1
    log = good[["visit_id", "visitor", "page", "nth"]]
    last = good.groupby("visitor").tail(1)
    visitors = last.rename(columns={"nth": "visits", "page": "last_page"})[["visitor", "visits", "last_page"]]
    return log, visitors, int(bad.sum())


def _sorted(df: pd.DataFrame, by: str) -> pd.DataFrame:
    df = df.sort_values(by).reset_index(drop=True)
    return df.astype({c: "int64" if c in ("nth", "visits") else "object" for c in df.columns})


def check_visits(warehouse) -> None:
    """Raise AssertionError unless the gold tables and dead letters are exactly once."""
    log, visitors, bad = expected(warehouse)
    got_log = read_delta(f"{warehouse}/gold/visit_log")[list(log.columns)]
    pd.testing.assert_frame_equal(_sorted(got_log, "visit_id"), _sorted(log, "visit_id"))
    got_visitors = read_delta(f"{warehouse}/gold/visitors")[list(visitors.columns)]
    pd.testing.assert_frame_equal(_sorted(got_visitors, "visitor"), _sorted(visitors, "visitor"))
    assert len(read_delta(f"{warehouse}/dlq/visits")) == bad > 0

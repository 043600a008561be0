"""A keyed state table's state as pandas, for tests (delta-rs, no Spark): per key the newest run's
row unless it is a tombstone, as ``checkpoint_lib.spark.state.live`` reads it."""

from __future__ import annotations

from checkpoint_lib.reserved import STATE_GONE, STATE_RUN
from checkpoint_lib.verify import read_delta


def state_rows(path, key: str = "account"):
    df = read_delta(path)
    if STATE_RUN not in df.columns:
        return df
    df = df.assign(**{STATE_RUN: df[STATE_RUN].fillna(-1)}).sort_values(STATE_RUN, kind="stable")
    df = df.drop_duplicates(key, keep="last")
    df = df[~df[STATE_GONE].astype("boolean").fillna(False)]  # a tombstone; None and False are live
    return df.drop(columns=[STATE_RUN, STATE_GONE]).sort_values(key).reset_index(drop=True)

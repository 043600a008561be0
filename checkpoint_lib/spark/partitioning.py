"""Routing records from the source stage to the subtasks of the next operator.

Each function adds the ``receiver`` column (and ``key_group``, null unless hash-partitioned) to a
DataFrame of records that carry their source offset (``src_version``, ``src_file``, ``src_row``)
and ``sender``. Routing is a pure function of the record, so a replay after recovery sends every
record to the same subtask as the first time - the channel log it rebuilds is the same.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..core.keygroups import DEFAULT_MAX_PARALLELISM
from .state import KEY_GROUP, key_group_column, subtask_column


def route(
    df: DataFrame,
    partitioning: str,
    parallelism: int,
    *,
    key: str | None = None,
    max_parallelism: int = DEFAULT_MAX_PARALLELISM,
) -> DataFrame:
    """``df`` with ``key_group`` and ``receiver`` (broadcast: one row per receiver)."""
    if partitioning == "hash":
        if key is None:
            raise ValueError("hash partitioning needs a key")
        df = df.withColumn(KEY_GROUP, key_group_column(key, max_parallelism))
        return df.withColumn("receiver", subtask_column(F.col(KEY_GROUP), parallelism, max_parallelism))
    df = df.withColumn(KEY_GROUP, F.lit(None).cast("int"))
    if partitioning == "rebalance":
        offset = F.xxhash64(F.col("src_version"), F.col("src_file"), F.col("src_row"))
        return df.withColumn("receiver", F.pmod(offset, F.lit(parallelism)).cast("int"))
    if partitioning == "broadcast":
        return df.withColumn("receiver", F.explode(F.sequence(F.lit(0), F.lit(parallelism - 1))))
    if partitioning == "forward":
        return df.withColumn("receiver", F.col("sender").cast("int"))
    raise ValueError(f"unknown partitioning {partitioning!r}: hash, rebalance, broadcast or forward")


def route_records(df: DataFrame, partitioning: str, parallelism: int, *, sender: str, key: str | None = None,
                  max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> DataFrame:
    """``df`` with ``receiver``, for records that may not carry a source offset (an operator's
    output, in a graph): as :func:`route`, with the sending subtask in column ``sender`` (a
    forward edge keeps it) and, for ``rebalance`` without the offset columns, a hash of every
    column instead (a replay computes the same rows, so it routes them alike)."""
    if partitioning == "rebalance" and not {"src_version", "src_file", "src_row"} <= set(df.columns):
        digest = F.xxhash64(*[F.col(f"`{c}`") for c in df.columns if c != sender])
        return (df.withColumn(KEY_GROUP, F.lit(None).cast("int"))
                .withColumn("receiver", F.pmod(digest, F.lit(parallelism)).cast("int")))
    if partitioning == "forward":
        return df.withColumn(KEY_GROUP, F.lit(None).cast("int")).withColumn("receiver", F.col(sender).cast("int"))
    return route(df, partitioning, parallelism, key=key, max_parallelism=max_parallelism)

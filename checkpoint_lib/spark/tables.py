"""Small Delta helpers shared by the Spark adapters."""

from __future__ import annotations

import os

from pyspark.sql import Column, SparkSession
from pyspark.sql import types as T

from ..delta.log import is_delta_table


def create_if_missing(
    spark: SparkSession, path: str, schema: T.StructType, partition_by: list[str] | None = None
) -> None:
    """Create an empty Delta table at ``path`` unless one exists. Idempotent and race-safe:
    two creators racing both end with the table (the loser's commit of version 0 fails)."""
    if is_delta_table(path):
        return
    os.makedirs(os.path.dirname(path.rstrip("/")) or ".", exist_ok=True)
    from delta.tables import DeltaTable

    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
    if partition_by:
        builder = builder.partitionedBy(*partition_by)
    try:
        builder.execute()
    except Exception:
        if not is_delta_table(path):
            raise


def delete_where(spark: SparkSession, path: str, condition: Column) -> None:
    """DELETE (idempotent: deleting what is gone deletes nothing). No-op on a missing table."""
    if not is_delta_table(path):
        return
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, path).delete(condition)


def version(spark: SparkSession, path: str) -> int:
    from ..delta.log import latest_version

    v = latest_version(path)
    if v is None:
        raise FileNotFoundError(f"no Delta table at {path}")
    return v

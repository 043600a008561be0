"""The keyed state table on real Delta: what a flush writes, and that pinned versions stay whole."""

from __future__ import annotations

import pytest

from checkpoint_lib.spark.state import KeyedStateTable, key_group_column

pytestmark = pytest.mark.spark
KEYS = 4000


def _merge_metrics(spark, path: str, version: int) -> dict:
    row = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").where(f"version = {version}").first()
    assert row["operation"] == "MERGE", row["operation"]
    return {k: int(v) for k, v in row["operationMetrics"].items()}


def test_a_flush_writes_what_changed_not_the_whole_state(spark, tmp_path):
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    path = str(tmp_path / "state")
    values = T.StructType([T.StructField("balance_cents", T.LongType()), T.StructField("event_count", T.LongType())])
    table = KeyedStateTable(spark, path, "account", values)
    table.create()

    def deltas(n: int, step: int):
        return (
            spark.range(0, n * step, step, numPartitions=4)
            .select(F.format_string("acct-%05d", F.col("id")).alias("account"))
            .withColumn("key_group", key_group_column("account"))
            .withColumn("balance_cents", F.lit(10).cast("long")).withColumn("event_count", F.lit(1).cast("long"))
        )

    first = table.add(deltas(KEYS, 1))  # 4,000 keys, spread over several files
    second = table.add(deltas(20, KEYS // 20))  # 20 keys, one in every 200: they touch every file
    full, flush = _merge_metrics(spark, path, first), _merge_metrics(spark, path, second)
    assert full["numTargetRowsInserted"] == KEYS and flush["numTargetRowsUpdated"] == 20
    # the replaced rows are marked deleted, not rewritten with their files' other 3,980 rows
    assert flush["numTargetDeletionVectorsAdded"] > 0, flush
    assert flush["numTargetBytesAdded"] < full["numTargetBytesAdded"] / 5, (flush, full)

    now = table.read().agg(F.sum("balance_cents"), F.sum("event_count"), F.count("*")).first()
    assert tuple(now) == (KEYS * 10 + 20 * 10, KEYS + 20, KEYS)
    pinned = table.read(first).agg(F.sum("balance_cents"), F.count("*")).first()
    assert tuple(pinned) == (KEYS * 10, KEYS)  # the version a snapshot pinned reads as it was

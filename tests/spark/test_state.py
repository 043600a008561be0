"""The keyed state table on real Delta: what a flush writes, and that pinned versions stay whole."""

from __future__ import annotations

import pytest

from checkpoint_lib.spark.state import KeyedStateTable, key_group_column

pytestmark = pytest.mark.spark
KEYS = 4000


def _table(spark, path: str) -> KeyedStateTable:
    from pyspark.sql import types as T

    values = T.StructType([T.StructField("balance_cents", T.LongType()), T.StructField("event_count", T.LongType())])
    table = KeyedStateTable(spark, path, "account", values)
    table.create()
    return table


def _deltas(spark, ids, fmt: str = "acct-%05d"):
    """+10 cents and +1 event for the account of every id of the range ``ids`` (start, end, step)."""
    from pyspark.sql import functions as F

    return (
        spark.range(*ids, numPartitions=4)
        .select(F.format_string(fmt, F.col("id")).alias("account"))
        .withColumn("key_group", key_group_column("account"))
        .withColumn("balance_cents", F.lit(10).cast("long")).withColumn("event_count", F.lit(1).cast("long"))
    )


def _history(spark, path: str, version: int):
    return spark.sql(f"DESCRIBE HISTORY delta.`{path}`").where(f"version = {version}").first()


def test_a_flush_writes_what_changed_not_the_whole_state(spark, tmp_path):
    from pyspark.sql import functions as F

    path = str(tmp_path / "state")
    table = _table(spark, path)
    first = table.add(_deltas(spark, (0, KEYS)))  # 4,000 keys, spread over several files
    second = table.add(_deltas(spark, (0, KEYS, KEYS // 20)))  # 20 keys, one in every 200: they touch every file
    full, flush = (
        {k: int(v) for k, v in _history(spark, path, v)["operationMetrics"].items()} for v in (first, second)
    )
    assert full["numTargetRowsInserted"] == KEYS and flush["numTargetRowsUpdated"] == 20
    # the replaced rows are marked deleted, not rewritten with their files' other 3,980 rows
    assert flush["numTargetDeletionVectorsAdded"] > 0, flush
    assert flush["numTargetBytesAdded"] < full["numTargetBytesAdded"] / 5, (flush, full)

    now = table.read().agg(F.sum("balance_cents"), F.sum("event_count"), F.count("*")).first()
    assert tuple(now) == (KEYS * 10 + 20 * 10, KEYS + 20, KEYS)
    pinned = table.read(first).agg(F.sum("balance_cents"), F.count("*")).first()
    assert tuple(pinned) == (KEYS * 10, KEYS)  # the version a snapshot pinned reads as it was


def test_compaction_changes_no_row_of_any_version(spark, tmp_path):
    path = str(tmp_path / "state")
    table = _table(spark, path)
    # 300 accounts, then five flushes of 100 updates each: small files and deletion vectors pile up
    versions = [table.add(_deltas(spark, (0, 300) if i == 0 else (i * 50, i * 50 + 100))) for i in range(6)]
    rows = lambda v: sorted(map(tuple, table.read(v).collect()))  # noqa: E731
    before = {v: rows(v) for v in versions}
    files = lambda: spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["numFiles"]  # noqa: E731
    piled = files()
    compacted = table.compact()
    assert compacted > versions[-1] and files() < piled, (piled, files())
    assert _history(spark, path, compacted)["operation"] == "OPTIMIZE"
    assert rows(compacted) == before[versions[-1]]  # same rows, fewer files
    assert {v: rows(v) for v in versions} == before  # every version a snapshot may pin reads the same

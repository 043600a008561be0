"""Creating our Delta tables (``spark/tables.py::create_if_missing``) whatever an earlier attempt
left."""

from __future__ import annotations

import os

import pytest
from pyspark.sql import types as T

from checkpoint_lib.delta.log import latest_version
from checkpoint_lib.spark import tables

pytestmark = pytest.mark.spark

SCHEMA = T.StructType([T.StructField("checkpoint_id", T.LongType(), False), T.StructField("value", T.StringType())])


def test_a_table_whose_creation_was_killed_before_its_first_commit_is_created(spark, tmp_path):
    """kill -9 after Delta made ``_delta_log`` and before commit 0 landed: every later run failed
    with DELTA_TABLE_NOT_FOUND (Spark takes the folder for a table, so CREATE IF NOT EXISTS did
    nothing); chaos seed 1039 (orders, killed from outside at startup) found it on dlq/orders."""
    path = str(tmp_path / "dlq" / "orders")
    os.makedirs(f"{path}/_delta_log/_staged_commits")
    with open(f"{path}/_delta_log/.00000000000000000000.json.5f1e.tmp", "w") as f:
        f.write('{"commitInfo":{}}\n')
    tables.create_if_missing(spark, path, SCHEMA, properties={"delta.enableDeletionVectors": "true"})
    assert latest_version(path) == 0
    table = spark.read.format("delta").load(path)
    assert table.schema == SCHEMA and table.count() == 0  # NOT NULL kept, as a clean creation
    tables.create_if_missing(spark, path, SCHEMA)  # and again: nothing to do
    assert latest_version(path) == 0

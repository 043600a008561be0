"""A Delta source's schema check compares types as Spark reads them: a declaration may spell them
as DDL does (``int``, ``bigint``, ``decimal(18, 2)``), as a StructType gives them, or nested
(``array``, ``map``, ``struct``), and a table of other types is refused naming the column, the
table's type and the declared one."""

from __future__ import annotations

import pytest
from checkpoint_lib.pipeline import DeltaSource
from checkpoint_lib.spark.sources import DeltaTableReader, SchemaMismatchError, SourceSite

pytestmark = pytest.mark.spark

TABLE = ("n int, m bigint, d decimal(18,2), ts timestamp, tags array<string>, attrs map<string,bigint>, "
         "pt struct<x:int,y:string>")


def reader(spark, path: str, schema) -> DeltaTableReader:
    site = SourceSite(spark=spark, location=path, root=f"{path}_ckpt", pipeline="typed", progress=lambda _m: None)
    return DeltaTableReader(DeltaSource("landing/typed", schema), site)


def test_a_declaration_in_any_spelling_of_the_tables_types_reads_it(spark, tmp_path):
    path = str(tmp_path / "typed")
    spark.sql("SELECT 1 n, 2L m, CAST(1.5 AS decimal(18,2)) d, current_timestamp() ts, array('a') tags, "
              "map('k', 3L) attrs, named_struct('x', 1, 'y', 'b') pt").write.format("delta").save(path)
    actual = spark.read.format("delta").load(path).schema
    declarations = [
        TABLE,  # DDL, Spark's short names
        "n integer, m long, d decimal(18, 2), ts timestamp, tags array<string>, attrs map<string, long>, "
        "pt struct<x: int, y: string>",  # the long names, spaces
        actual,  # a StructType
    ]
    for schema in declarations:
        reader(spark, path, schema)._check_schema(0)  # no SchemaMismatchError

    with pytest.raises(SchemaMismatchError) as err:
        reader(spark, path, "n string, m int, d decimal(10,2), tags array<int>, gone long")._check_schema(0)
    text = str(err.value)
    for problem in ("column 'n' is integer, expected string", "column 'm' is long, expected int",
                    "column 'd' is decimal(18,2), expected decimal(10,2)",
                    "column 'tags' is array<string>, expected array<int>", "column 'gone' is missing"):
        assert problem in text, text

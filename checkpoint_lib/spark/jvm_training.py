"""The training run of the driver's class archive (:mod:`~checkpoint_lib.spark.jvm_archive`), as
a process of its own: ``python -m checkpoint_lib.spark.jvm_training PARTIAL``. It starts a driver
like ours that writes the classes it loaded to ``PARTIAL`` when it exits, and runs the kinds of
work our jobs run: Delta writes, a MERGE and a DELETE with deletion vectors, time travel, Arrow in
and out, joins, aggregates, a local checkpoint."""

from __future__ import annotations

import sys
from pathlib import Path

from .jvm_archive import quoted


def train(partial: Path) -> None:
    """Run, in a driver that writes ``partial`` at exit, the kinds of work our jobs run; then stop
    the JVM and wait for it, so the archive is complete when this returns."""
    import tempfile

    import pandas as pd
    from pyspark.sql import functions as F

    from .session import get_spark, stop_spark

    spark = get_spark(master="local[2]", app_name="jvm-archive",  # the UI as our sessions have it
                      extra_conf={"spark.driver.extraJavaOptions": quoted(f"-XX:ArchiveClassesAtExit={partial}")})
    with tempfile.TemporaryDirectory() as tmp:
        table = str(Path(tmp) / "t")
        rows = pd.DataFrame({"k": [f"k{i % 50}" for i in range(2000)], "v": range(2000)})
        df = spark.createDataFrame(rows)  # Arrow in
        df.write.format("delta").option("delta.enableDeletionVectors", "true").save(table)
        per_key = df.groupBy("k").agg(F.sum("v").alias("v"), F.count(F.lit(1)).alias("n"))
        spark.sql(f"MERGE INTO delta.`{table}` t USING (SELECT k, v FROM VALUES ('k1', 1), ('x', 2) AS s(k, v)) s "
                  "ON t.k = s.k WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *")
        spark.sql(f"DELETE FROM delta.`{table}` WHERE k = 'k2'")
        old = spark.read.format("delta").option("versionAsOf", 0).load(table)
        new = spark.read.format("delta").load(table)
        joined = old.groupBy("k").agg(F.count(F.lit(1)).alias("a")).join(
            new.groupBy("k").agg(F.count(F.lit(1)).alias("b")), "k", "full_outer")
        joined = joined.join(per_key, "k", "left").where(F.col("k").between("k0", "k9") | F.col("n").isNull())
        totals = new.agg(F.count(F.lit(1)).alias("rows"), F.countDistinct("k").alias("keys"), F.first("v"))
        joined.unionByName(joined).crossJoin(totals).where(F.col("k").eqNullSafe(F.lit("k3"))).toArrow()  # Arrow out
        new.toPandas()
        new.localCheckpoint(eager=True).count()
        new.where(F.col("v") > 10).repartition(4, "k").write.format("delta").mode("append").save(table)
    gateway = spark.sparkContext._gateway
    proc = getattr(gateway, "proc", None)
    stop_spark()
    if proc is not None:  # its stdin closed, the JVM exits (System.exit) and writes the archive
        proc.stdin.close()
        proc.wait(timeout=300)


if __name__ == "__main__":
    train(Path(sys.argv[1]))

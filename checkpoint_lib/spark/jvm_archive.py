"""The driver JVM's class archive (the JDK's class-data sharing, CDS): the classes a Spark driver
with Delta Lake loads, mapped from one file at start instead of read, parsed and verified from
the jars again by every process. On a 2-core machine that is about 3 of the 6 seconds a Spark
session takes to start, in every ``ckpt`` command, Airflow task and test process.

Set-up builds it (:func:`build`, from ``setup_main``): a training process starts a driver with
``-XX:ArchiveClassesAtExit``, runs the kinds of work our jobs run (Delta writes, a MERGE with
deletion vectors, time travel, Arrow in and out, joins and aggregates), and the JVM writes the
classes it loaded when it exits. :func:`java_options` gives every later driver
``-XX:SharedArchiveFile`` when the archive of this JVM, Spark and jar set exists (its name holds
their digest, so a changed JDK or pin is simply a missing archive until set-up runs again); the
JVM also checks the archive against itself and ignores one that does not match. An archive is an
optimisation only: none, or one refused, is a slower start, never an error.

``CKPT_JVM_ARCHIVE=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ARCHIVE_ENV = "CKPT_JVM_ARCHIVE"
_PREFIX = "driver-classes-"
_QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")  # a refused archive is a slower start, not a warning
_FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def enabled() -> bool:
    return os.environ.get(ARCHIVE_ENV, "1").strip().lower() not in _FALSE_WORDS


def _java() -> Path | None:
    """The java spark-submit runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def _spark_jars() -> list[Path]:
    import pyspark

    return sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))


def archive_path(jars: Sequence[Path], directory: Path | None = None) -> Path | None:
    """Where the archive of this JVM, pyspark and ``jars`` (the session's ``spark.jars``) lives;
    None when no java is found. The name is a digest of what the archive depends on."""
    from .jars import jar_dir

    java = _java()
    if java is None:
        return None
    digest = hashlib.sha256()
    for path in (java, *_spark_jars(), *sorted(Path(j) for j in jars)):
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_size}\0{int(stat.st_mtime)}\n".encode())
    return (directory or jar_dir()) / f"{_PREFIX}{digest.hexdigest()[:16]}.jsa"


def _quoted(option: str) -> str:
    """One JVM option in ``extraJavaOptions``, which Spark splits on whitespace unless quoted."""
    return f'"{option}"' if any(c.isspace() for c in option) else option


def java_options(jars: Sequence[Path]) -> list[str]:
    """The driver's options that map the archive, or none when there is no archive to map."""
    if not enabled():
        return []
    try:
        path = archive_path(jars)
    except OSError:
        return []
    if path is None or not path.is_file():
        return []
    return [_quoted(f"-XX:SharedArchiveFile={path}"), *_QUIET]


def build(jars: Sequence[Path], directory: Path | None = None, timeout: float = 600.0) -> tuple[Path | None, str]:
    """Make the archive for ``jars`` unless it exists: ``(path or None, what happened)``.

    The training JVM writes a file of its own (named by this process) and only a complete one is
    renamed into place, atomically, so a crash or two set-ups at once never leave a partial
    archive where a driver would map it. Archives of other JDKs, Sparks or jar sets are removed."""
    path = archive_path(jars, directory)
    if path is None:
        return None, "no java found"
    if path.is_file():
        return path, "present"
    started = time.monotonic()
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    env = {**os.environ, ARCHIVE_ENV: "0"}  # the training driver maps no archive: it writes one
    try:
        done = subprocess.run([sys.executable, "-m", __name__, str(partial)], env=env, timeout=timeout,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except subprocess.TimeoutExpired:
        partial.unlink(missing_ok=True)
        return None, f"the training run took over {timeout:.0f} s"
    if done.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
        partial.unlink(missing_ok=True)
        tail = (done.stderr or "").strip().splitlines()[-1:] or ["no archive written"]
        return None, f"the training run failed ({tail[0][:200]})"
    os.replace(partial, path)
    for other in path.parent.glob(f"{_PREFIX}*.jsa"):
        if other != path:
            other.unlink(missing_ok=True)
    return path, f"built in {time.monotonic() - started:.0f} s"


def _train(partial: Path) -> None:
    """Run, in a driver that writes ``partial`` at exit, the kinds of work our jobs run; then stop
    the JVM and wait for it, so the archive is complete when this returns."""
    import tempfile

    import pandas as pd
    from pyspark.sql import functions as F

    from .session import get_spark, stop_spark

    spark = get_spark(master="local[2]", app_name="jvm-archive",  # the UI as our sessions have it
                      extra_conf={"spark.driver.extraJavaOptions": _quoted(f"-XX:ArchiveClassesAtExit={partial}")})
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
    _train(Path(sys.argv[1]))

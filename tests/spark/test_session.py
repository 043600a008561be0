"""Tests of the Delta jar cache and the shared SparkSession.

Only the tests marked ``spark`` start a JVM; the jar tests use fake Maven runs.
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from checkpoint_lib.spark import jars
from checkpoint_lib.spark.jars import MissingJarsError, ensure_jars, fetch_jars, required_jars
from checkpoint_lib.spark.session import get_spark, session_conf


@pytest.fixture
def empty_jar_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "jars"
    monkeypatch.setenv(jars.JAR_DIR_ENV, str(directory))
    return directory


def _option(command: list[str], name: str) -> str:
    """The value of ``-Dname=value`` in a Maven command line."""
    return next(a for a in command if a.startswith(f"-D{name}=")).split("=", 1)[1]


def _fake_mvn(monkeypatch: pytest.MonkeyPatch, final_dir: Path) -> list[list[str]]:
    """Replace Maven by a function that writes a tiny valid jar; return the recorded calls."""
    calls: list[list[str]] = []

    def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        _, name, version = _option(command, "artifact").split(":")
        out_dir = Path(_option(command, "outputDirectory"))
        # Downloads go to a hidden folder inside the jar folder, never to the final name.
        assert out_dir.parent == final_dir and out_dir.name.startswith(".")
        assert not (final_dir / f"{name}-{version}.jar").exists()
        with zipfile.ZipFile(out_dir / f"{name}-{version}.jar", "w") as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(jars.shutil, "which", lambda name: "/usr/bin/mvn")
    monkeypatch.setattr(jars.subprocess, "run", run)
    return calls


def test_required_jars_names_delta_spark() -> None:
    names = required_jars()
    assert names[0] == f"delta-spark_4.2_2.13-{jars.DELTA_JAR_VERSION}.jar"
    assert f"delta-storage-{jars.DELTA_JAR_VERSION}.jar" in names
    assert len(set(names)) == len(names)


def test_jar_dir_follows_env(empty_jar_dir: Path) -> None:
    assert jars.jar_dir() == empty_jar_dir
    assert jars.jar_paths() == [empty_jar_dir / name for name in required_jars()]


def test_ensure_jars_with_empty_dir_names_the_fix(empty_jar_dir: Path) -> None:
    with pytest.raises(MissingJarsError) as info:
        ensure_jars()
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert "make setup" in message and "ckpt setup" in message
    assert all(name in message for name in required_jars())
    assert info.value.missing == required_jars()


def test_fetch_jars_downloads_missing_then_is_idempotent(
    empty_jar_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_mvn(monkeypatch, empty_jar_dir)
    fetched = fetch_jars()
    assert [path.name for path in fetched] == required_jars()
    assert len(calls) == len(required_jars())
    assert ensure_jars() == [empty_jar_dir / name for name in required_jars()]
    assert not list(empty_jar_dir.glob(".fetch-*"))

    assert fetch_jars() == []
    assert len(calls) == len(required_jars())


def test_fetch_jars_skips_present_jars(
    empty_jar_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty_jar_dir.mkdir()
    present = required_jars()[0]
    (empty_jar_dir / present).write_bytes(b"kept as is")
    calls = _fake_mvn(monkeypatch, empty_jar_dir)
    fetch_jars()
    assert len(calls) == len(required_jars()) - 1
    assert (empty_jar_dir / present).read_bytes() == b"kept as is"


def test_interrupted_fetch_leaves_no_partial_jar(
    empty_jar_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def killed(command: list[str], **kwargs: object) -> None:
        out_dir = Path(_option(command, "outputDirectory"))
        (out_dir / required_jars()[0]).write_bytes(b"PK\x03\x04 half a jar")
        raise KeyboardInterrupt

    monkeypatch.setattr(jars.shutil, "which", lambda name: "/usr/bin/mvn")
    monkeypatch.setattr(jars.subprocess, "run", killed)
    with pytest.raises(KeyboardInterrupt):
        fetch_jars()
    assert jars.missing_jars() == required_jars()

    # A kill -9 skips the clean-up; the next run removes the leftover folder.
    (empty_jar_dir / ".fetch-leftover").mkdir()
    _fake_mvn(monkeypatch, empty_jar_dir)
    fetch_jars()
    assert not list(empty_jar_dir.glob(".fetch-*"))


def test_failed_download_raises_with_maven_output(
    empty_jar_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(command, 1, "[ERROR] Could not find artifact", "")

    monkeypatch.setattr(jars.shutil, "which", lambda name: "/usr/bin/mvn")
    monkeypatch.setattr(jars.subprocess, "run", failing)
    with pytest.raises(jars.JarFetchError, match="Could not find artifact"):
        fetch_jars()
    assert jars.missing_jars() == required_jars()


def test_fetch_jars_without_maven_says_so(
    empty_jar_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jars.shutil, "which", lambda name: None)
    with pytest.raises(jars.JarFetchError, match="mvn"):
        fetch_jars()


def test_session_conf_defaults_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_SPARK_UI", "0")
    monkeypatch.setenv("CKPT_SHUFFLE_PARTITIONS", "3")
    monkeypatch.delenv("CKPT_DRIVER_MEMORY", raising=False)
    conf = session_conf(
        "spark://127.0.0.1:7077",
        jars=[Path("/j/a.jar"), Path("/j/b.jar")],
        extra_conf={"spark.jars": "/x/c.jar"},
    )
    assert conf["spark.master"] == "spark://127.0.0.1:7077"
    assert conf["spark.jars"] == "/j/a.jar,/j/b.jar,/x/c.jar"
    assert "spark.jars.packages" not in conf
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.sql.shuffle.partitions"] == "3"
    assert conf["spark.driver.memory"] == "2g"
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert session_conf("local[1]", ui=True)["spark.ui.enabled"] == "true"


def test_session_conf_rejects_bad_partition_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_SHUFFLE_PARTITIONS", "many")
    with pytest.raises(ValueError, match="CKPT_SHUFFLE_PARTITIONS"):
        session_conf("local[1]")


@pytest.mark.spark
def test_delta_round_trip_and_history(spark, tmp_path: Path) -> None:
    path = str(tmp_path / "table")
    rows = [(1, "a"), (2, "b"), (3, "c")]
    spark.createDataFrame(rows, "id INT, name STRING").write.format("delta").save(path)

    back = spark.read.format("delta").load(path)
    assert sorted((r.id, r.name) for r in back.collect()) == rows

    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    assert [(h.version, h.operation) for h in history] == [(0, "WRITE")]
    assert (tmp_path / "table" / "_delta_log" / "00000000000000000000.json").is_file()


@pytest.mark.spark
def test_session_is_shared_and_configured(spark) -> None:
    assert get_spark() is spark
    assert spark.sparkContext.master == "local[2]"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.catalog.spark_catalog").endswith("DeltaCatalog")
    assert spark.sparkContext.getConf().get("spark.ui.enabled") == "false"
    with pytest.raises(RuntimeError, match="stop_spark"):
        get_spark(master="local[1]")

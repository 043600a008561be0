"""``ckpt doctor``: each check passes on a ready machine and fails with its fix on a broken one
(a Java too old, missing or foreign jars, a warehouse that cannot be written, a master that does
not answer). Only the Spark check starts a JVM."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from checkpoint_lib import cli, doctor
from checkpoint_lib.spark import jars


def _java_home(tmp_path: Path, says: str) -> Path:
    home = tmp_path / f"jdk-{abs(hash(says))}"
    (home / "bin").mkdir(parents=True)
    script = home / "bin" / "java"
    script.write_text(f"#!/bin/sh\necho '{says}' >&2\n")
    script.chmod(0o755)
    return home


@pytest.mark.parametrize("says, major, ok", [
    ('openjdk version "17.0.15" 2025-04-15', 17, True),
    ('openjdk version "21" 2023-09-19', 21, True),
    ('openjdk version "11.0.2" 2019-01-15', 11, False),
    ('java version "1.8.0_292"', 8, False),
])
def test_java_names_the_version_spark_will_start(tmp_path, monkeypatch, says, major, ok):
    monkeypatch.setenv("JAVA_HOME", str(_java_home(tmp_path, says)))
    check = doctor.java()
    assert (check.ok, f"Java {major}" in check.detail) == (ok, True), check
    assert bool(check.fix) != ok


def test_a_java_home_without_java_fails_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    check = doctor.java()
    assert not check.ok and "has no bin/java" in check.detail and "JAVA_HOME" in check.fix


def test_jars_missing_or_foreign_fail_and_the_pinned_ones_pass(tmp_path, monkeypatch):
    monkeypatch.setenv(jars.JAR_DIR_ENV, str(tmp_path))
    check = doctor.jars()
    assert not check.ok and f"{len(jars.ARTIFACTS)} of {len(jars.ARTIFACTS)} missing" in check.detail
    assert "make setup" in check.fix
    real = Path(__file__).resolve().parents[2] / ".cache" / "jars"
    for name in jars.required_jars():
        (tmp_path / name).symlink_to(real / name)
    assert doctor.jars().ok
    foreign = jars.required_jars()[-1]
    (tmp_path / foreign).unlink()
    (tmp_path / foreign).write_bytes(b"PK\x03\x04 not the pinned bytes")
    check = doctor.jars()
    assert not check.ok and foreign in check.detail and "delete it" in check.fix


def test_the_warehouse_is_probed_without_creating_it(tmp_path):
    fresh = tmp_path / "a" / "b"
    check = doctor.warehouse(str(fresh))
    assert check.ok and "does not exist yet" in check.detail
    assert not (tmp_path / "a").exists() and not list(tmp_path.iterdir())  # nothing created, probe removed
    assert doctor.warehouse(str(tmp_path)).ok and not list(tmp_path.iterdir())
    (tmp_path / "file").write_text("")
    assert not doctor.warehouse(str(tmp_path / "file")).ok
    check = doctor.warehouse(str(tmp_path / "file" / "under"))
    assert not check.ok and "not writable" in check.detail and "--warehouse" in check.fix


def test_a_standalone_master_must_answer(tmp_path):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]
    with socket.create_server(("127.0.0.1", 0)) as server:
        live = server.getsockname()[1]
        assert doctor.master(f"spark://127.0.0.1:{live}").ok
        assert doctor.master(f"spark://127.0.0.1:{dead},127.0.0.1:{live}").ok  # a standby list: one answers
        check = doctor.master(f"spark://127.0.0.1:{dead}")
        assert not check.ok and "nothing answers" in check.detail and "--master" in check.fix
    assert doctor.master("local[2]").ok


def test_the_command_reports_every_check_and_fails_when_one_does(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(jars.JAR_DIR_ENV, str(tmp_path / "no-jars"))
    code = cli.main(["doctor", "--no-spark", "--json", "--warehouse", str(tmp_path / "w"), "--master", "local[2]"])
    checks = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [c["name"] for c in checks] == ["java", "jars", "warehouse", "master", "airflow"]
    assert [c["name"] for c in checks if not c["ok"]] == ["jars"]
    assert not (tmp_path / "no-jars").exists() and not (tmp_path / "w").exists()
    assert cli.main(["doctor", "--no-spark", "--warehouse", str(tmp_path / "w"), "--master", "local[2]"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  jars" in out and "fix: run `make setup`" in out and "4 of 5 checks OK; failed: jars" in out


def test_spark_is_not_started_when_a_check_it_needs_failed(tmp_path, monkeypatch):
    monkeypatch.setenv(jars.JAR_DIR_ENV, str(tmp_path))
    checks = doctor.diagnose(str(tmp_path), "local[2]")
    spark = next(c for c in checks if c.name == "spark")
    assert not spark.ok and "not started" in spark.detail


@pytest.mark.spark
def test_spark_starts_with_delta_and_round_trips_a_table(spark):
    check = doctor.spark(spark.sparkContext.master)
    assert check.ok, check
    assert "with Delta" in check.detail

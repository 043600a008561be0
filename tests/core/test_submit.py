"""The child processes we start: spark-submit of a job, ``ckpt run`` with fault switches (pure)."""

from __future__ import annotations

import sys

from checkpoint_lib.submit import REPO_ROOT, ckpt_run_argv, ckpt_run_env, submit_env


def test_fault_switches_are_set_only_when_asked_never_inherited():
    parent = {"CKPT_KILL_AT": "commit:1", "CKPT_PHASE_TRACE": "/old", "PYTHONPATH": "/extra", "KEEP": "1"}
    plain = ckpt_run_env("local[2]", base=parent)
    assert "CKPT_KILL_AT" not in plain and "CKPT_PHASE_TRACE" not in plain
    assert plain["CKPT_SPARK_MASTER"] == "local[2]" and plain["CKPT_SPARK_UI"] == "0" and plain["KEEP"] == "1"
    assert plain["PYTHONPATH"].split(":") == [str(REPO_ROOT), "/extra"]
    armed = ckpt_run_env("spark://m:7077", kill_at="snapshot:3", trace="/t/trace.txt", base=parent)
    assert (armed["CKPT_KILL_AT"], armed["CKPT_PHASE_TRACE"]) == ("snapshot:3", "/t/trace.txt")
    assert parent["CKPT_KILL_AT"] == "commit:1"  # the caller's mapping is not touched


def test_ckpt_run_argv_and_submit_env():
    assert ckpt_run_argv("payments", "/w", "--mode", "unaligned") == [
        sys.executable, "-m", "checkpoint_lib.cli", "run", "payments", "--warehouse", "/w", "--mode", "unaligned"]
    env = submit_env("spark://m:7077", base={"PATH": "/bin", "SPARK_HOME": "/opt/spark"})
    assert env["CKPT_SPARK_MASTER"] == "spark://m:7077" and env["SPARK_HOME"] == "/opt/spark"
    assert env["PYSPARK_PYTHON"] == sys.executable and env["PATH"].endswith(":/bin")
    assert submit_env("local[2]", base={})["SPARK_HOME"].endswith("pyspark")

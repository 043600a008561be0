"""A pipeline from outside checkpoint_lib (tests/fixtures/userpkg), found by its ``module:attr``
reference, with state that is replaced rather than added to: ``ckpt run`` killed -9 between a
checkpoint's completion and its commit, run again, recovered exactly once, and validated by the
quality suites its QualitySpec declares. Nothing in checkpoint_lib names it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from checkpoint_lib.submit import ckpt_run_argv, ckpt_run_env
from visits import check_visits

pytestmark = [pytest.mark.crash, pytest.mark.spark]
USERPKG = Path(__file__).resolve().parents[1] / "fixtures" / "userpkg"
REF = "userpkg.flows:visits"
ROWS, VERSIONS = 150, 3
TIMEOUT = float(os.environ.get("CKPT_TEST_RUN_TIMEOUT", "900"))


def _run(folder, warehouse, kill_at: str | None = None) -> subprocess.CompletedProcess:
    # run from the package's folder, as a user would: the reference is imported from there
    cmd = ckpt_run_argv(REF, warehouse, "--rows-per-checkpoint", str(ROWS))
    return subprocess.run(cmd, cwd=folder, env=ckpt_run_env("local[2]", kill_at=kill_at), capture_output=True,
                          text=True, timeout=TIMEOUT)


@pytest.mark.slow  # CI tier: tests/cli/test_readme_tutorial.py (a pipeline by reference through the CLI, replaced
# state, validated), tests/spark/test_orders.py (replaced state across a crash), test_wheel.py (registration)
def test_a_user_pipeline_by_reference_is_killed_recovered_and_validated(spark, tmp_path, monkeypatch):
    folder = shutil.copytree(USERPKG, tmp_path / "userpkg", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(folder))
    from checkpoint_lib import pipelines

    monkeypatch.setattr(pipelines, "_loaded", {})
    pipeline = pipelines.load(REF)  # this process knows "visits" by its reference now
    w = str(tmp_path / "warehouse")
    for v in range(VERSIONS):
        pipeline.generator_fn(spark, w, ROWS, bad_fraction=0.05, seed=40 + v)

    crashed = _run(folder, w, kill_at="commit:2")  # checkpoint 2 complete, its transactions not committed
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr[-3000:]
    done = _run(folder, w)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "restored checkpoint" in done.stdout, done.stdout

    check_visits(w)

    from checkpoint_lib.quality import QualityCheckFailed, validate_restore

    result = validate_restore(spark, "visits", w)
    assert result.success, result.summary(verbose=True)
    assert {"events", "keys", "totals", "restored_state"} <= {o.view for o in result.outcomes}

    # without a QualitySpec, a pipeline gets the generic suite: what needs no roles
    import userpkg.flows

    monkeypatch.setattr(userpkg.flows.visits, "quality_spec", None)
    generic = validate_restore(spark, "visits", w)
    assert generic.success and {o.view for o in generic.outcomes} == {"totals", "restored_state"}, generic.summary()
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, f"{w}/dlq/visits").delete("true")  # the dead letters lost
    with pytest.raises(QualityCheckFailed, match="totals"):
        validate_restore(spark, "visits", w)

"""``enrichment`` (a graph: two inputs, a two-input keyed operator, two keyed operators after it)
run by ``ckpt run`` as a process of its own, killed with SIGKILL in a phase of each vertex kind and
of the commit, run again, recovered exactly once (the independent verifier,
``enrichment_data.check_enrichment``)."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from checkpoint_lib.pipelines.enrichment_data import check_enrichment, generate
from checkpoint_lib.submit import ckpt_run_argv, ckpt_run_env

pytestmark = [pytest.mark.crash, pytest.mark.spark]
TIMEOUT = float(os.environ.get("CKPT_TEST_RUN_TIMEOUT", "900"))
ROWS_PER_CHECKPOINT = 150


def _run(warehouse: str, kill_at: str | None = None) -> subprocess.CompletedProcess:
    cmd = ckpt_run_argv("enrichment", warehouse, "--rows-per-checkpoint", str(ROWS_PER_CHECKPOINT))
    return subprocess.run(cmd, env=ckpt_run_env("local[2]", kill_at=kill_at), capture_output=True, text=True,
                          timeout=TIMEOUT)


@pytest.mark.parametrize("kill_at", [
    "sink_commit:4",  # checkpoint 2 complete, its first sink committed, the others not
    pytest.param("flush_merge:5", marks=pytest.mark.slow),  # CI tier: in-process kills (tests/spark/test_graph_runner.py)
    pytest.param("source_read:2", marks=pytest.mark.slow),  # CI tier: as above
    pytest.param("flush_stage:4", marks=pytest.mark.slow),  # CI tier: as above
    pytest.param("ack:2", marks=pytest.mark.slow),  # CI tier: as above
    pytest.param("commit:2", marks=pytest.mark.slow),  # CI tier: tests/spark/test_enrichment.py kills before a commit
])
def test_enrichment_killed_by_sigkill_recovers_exactly_once(tmp_path, kill_at):
    w = str(tmp_path)
    generate(None, w, 600, rounds=3, accounts=30, seed=11)
    crashed = _run(w, kill_at=kill_at)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr[-3000:]
    done = _run(w)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "restored checkpoint" in done.stdout or "starting from scratch" in done.stdout, done.stdout
    result = check_enrichment(w)
    assert result.ok, result.summary()

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
    # checkpoint 2 complete, its first sink committed, the others not. Slow (about 3.5 min of two `ckpt run`
    # processes); CI tier: a graph's in-process kill and recovery (tests/spark/test_graph_cut_edges.py) and its
    # run, resume and recovery through the CLI (tests/spark/test_graph_cli.py); CI's real kill -9 is payments on
    # S3 (tests/crash/test_object_store.py)
    pytest.param("sink_commit:4", marks=pytest.mark.slow),
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


@pytest.mark.slow  # CI tier: the graph runner answering requests in process (tests/spark/test_graph_runner.py, slow)
# and which barrier answers which request (tests/delta/test_control.py)
def test_a_savepoint_of_a_running_graph_is_taken_by_it_without_stopping_it(tmp_path):
    """``ckpt savepoint enrichment`` while ``ckpt run enrichment --follow`` runs: the running graph's
    next step takes it (no new epoch, nothing replayed, the run goes on and stops cleanly), more
    lands, and the outputs are exactly once; restoring the savepoint then is exactly once too."""
    import sys
    import time

    from checkpoint_lib.delta.store import DeltaCheckpointStore

    w = str(tmp_path)
    generate(None, w, 600, rounds=3, accounts=30, seed=12)
    store = DeltaCheckpointStore(tmp_path / "_checkpoints" / "enrichment")
    cmd = ckpt_run_argv("enrichment", w, "--rows-per-checkpoint", str(ROWS_PER_CHECKPOINT), "--follow", "--poll", "0.5")
    running = subprocess.Popen(cmd, env=ckpt_run_env("local[2]"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not store.checkpoints.all():  # under way: its first checkpoint completed
            assert running.poll() is None and time.monotonic() < deadline, running.communicate()
            time.sleep(0.5)
        epoch = store.epochs.current()
        taken = subprocess.run([sys.executable, "-m", "checkpoint_lib.cli", "savepoint", "enrichment", "--warehouse", w],
                               env=ckpt_run_env("local[2]"), capture_output=True, text=True, timeout=TIMEOUT)
        assert taken.returncode == 0 and "taken by the running pipeline" in taken.stdout, \
            taken.stdout + taken.stderr[-3000:]
        assert running.poll() is None, "the savepoint stopped the running graph"
        assert store.epochs.current() == epoch  # no recovery
        # the running graph goes on checkpointing: the savepoint is its newest savepoint
        savepoint = max((c for c in store.checkpoints.all() if c.is_savepoint), key=lambda c: c.checkpoint_id)
        assert f"savepoint {savepoint.checkpoint_id} taken" in taken.stdout
        generate(None, w, 200, rounds=1, accounts=30, seed=13)
        deadline = time.monotonic() + TIMEOUT
        while not check_enrichment(w).ok:  # the running graph reads what landed
            assert running.poll() is None and time.monotonic() < deadline, running.communicate()
            time.sleep(2)
    finally:
        running.send_signal(signal.SIGTERM)
        out, err = running.communicate(timeout=TIMEOUT)
    assert running.returncode == 0, out + err[-3000:]
    assert store.epochs.current() == epoch
    again = subprocess.run([*ckpt_run_argv("enrichment", w, "--rows-per-checkpoint", str(ROWS_PER_CHECKPOINT)),
                            "--checkpoint", str(savepoint.checkpoint_id)],
                           env=ckpt_run_env("local[2]"), capture_output=True, text=True, timeout=TIMEOUT)
    assert again.returncode == 0 and f"restored checkpoint {savepoint.checkpoint_id}" in again.stdout, \
        again.stdout + again.stderr[-3000:]
    result = check_enrichment(w)
    assert result.ok, result.summary()

"""Two attempts of one pipeline alive at once, as real ``ckpt`` processes (issue 24).

One process killed at a time is what the other crash suites prove. Here an older attempt is still
alive while a newer one takes over: a stalled zombie (``CKPT_PAUSE_AT=phase:n`` makes the process
SIGSTOP itself there - it keeps everything in memory, past every check it made, and goes on when
the test sends SIGCONT), two recoveries started at the same instant, and an abort landing while a
running pipeline is about to complete the checkpoint. Each test reports the
outcome as tried / lost / duplicated: the outputs are compared with the independent computation of
:mod:`checkpoint_lib.verify` (nothing lost, nothing twice), and the older attempt must stop with
its fence error, having landed nothing.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checkpoint_lib.submit import ckpt_run_argv, ckpt_run_env
from checkpoint_lib.verify import check_payments

from test_payments_crash import ROWS, TIMEOUT, landing

pytestmark = [pytest.mark.crash, pytest.mark.spark, pytest.mark.race]


def _start(warehouse, *args: str, pause_at: str | None = None) -> subprocess.Popen:
    cmd = ckpt_run_argv("payments", warehouse, "--rows-per-checkpoint", str(ROWS), *args)
    return subprocess.Popen(cmd, env=ckpt_run_env("local[2]", pause_at=pause_at), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _ckpt(*args: str) -> list[str]:
    return [sys.executable, "-m", "checkpoint_lib.cli", *args]


def _wait_stopped(proc: subprocess.Popen, timeout: float = TIMEOUT) -> None:
    """Until ``proc`` stopped itself at its pause point (state T in /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the pause point was not reached (exit {proc.returncode}):\n{out}\n{err[-3000:]}")
        state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T":
            return
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the pause point was not reached in time")


def _finish(proc: subprocess.Popen, sig: int) -> str:
    """Send ``sig`` (SIGCONT: wake a stalled attempt; SIGTERM: stop a following run) and wait for
    the end: its output. A process still alive when the test leaves (an assertion failed) is killed."""
    try:
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    return out + err[-3000:]


def _report(warehouse, what: str) -> None:
    check = check_payments(str(warehouse))
    assert check.ok, f"{what}: tried, and {check.summary()}"


def _zombie_then(warehouse, pause_at: str, newer: list[str], what: str) -> tuple[int, str]:
    """Attempt 1 (``ckpt run``) stops itself at ``pause_at``; the ``newer`` attempt runs to the end
    and leaves exact outputs; then attempt 1 wakes up. Its exit code and output."""
    zombie = _start(warehouse, pause_at=pause_at)
    try:
        _wait_stopped(zombie)
        done = subprocess.run([*newer, "--rows-per-checkpoint", str(ROWS)], env=ckpt_run_env("local[2]"),
                              capture_output=True, text=True, timeout=TIMEOUT)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        _report(warehouse, what)
        zombie.send_signal(signal.SIGCONT)
        out, err = zombie.communicate(timeout=TIMEOUT)
    finally:
        if zombie.poll() is None:
            zombie.kill()
    return zombie.returncode, out + err[-3000:]


@pytest.mark.slow  # ~4.5 min of two real processes; CI keeps the in-process zombies of tests/spark/test_fences.py
def test_a_stalled_zombie_released_after_a_newer_restore_lands_nothing(spark, tmp_path):
    """Attempt 1 stalls right before the MERGE of its second flush - after its epoch check, with
    the flush's deltas in hand. Attempt 2 (``ckpt recover --checkpoint 1``: an older checkpoint,
    so a rollback) restores, replays everything and commits. Then attempt 1 wakes up: its MERGE is
    refused inside the commit by the fence attempt 2 raised, it exits fenced, and the outputs are
    exact."""
    landing(spark, tmp_path)
    code, out = _zombie_then(tmp_path, "flush_merge:2", _ckpt("recover", "payments", "--warehouse", str(tmp_path),
                                                             "--checkpoint", "1"), "the newer attempt alone")
    assert code != 0, f"the zombie finished as if nothing happened:\n{out}"
    assert "fenced" in out.lower(), out
    _report(tmp_path, "a stalled zombie released after a newer restore")  # not duplicated, not lost


@pytest.mark.slow  # ~5 min of three real processes (make chaos runs it with the race rows)
def test_two_recoveries_started_together_leave_one_owner_and_exact_outputs(spark, tmp_path):
    """After a crash, both stages' processes (or a DAG task and the runner) recover at once: one
    epoch wins, the other attempt is fenced wherever it is, and a following run ends exact."""
    landing(spark, tmp_path)
    crashed = subprocess.run(
        ckpt_run_argv("payments", tmp_path, "--rows-per-checkpoint", str(ROWS)),
        env=ckpt_run_env("local[2]", kill_at="commit:2"), capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr[-3000:]
    both = [_start(tmp_path) for _ in range(2)]
    outs = [p.communicate(timeout=TIMEOUT) for p in both]
    codes = sorted(p.returncode for p in both)
    assert codes[0] == 0, outs  # at least one finished
    for p, (out, err) in zip(both, outs):
        assert p.returncode == 0 or "fenced" in (out + err).lower() or "another" in (out + err).lower(), out + err[-3000:]
    done = subprocess.run(ckpt_run_argv("payments", tmp_path, "--rows-per-checkpoint", str(ROWS)),
                          env=ckpt_run_env("local[2]"), capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    _report(tmp_path, "two recoveries at once")


@pytest.mark.slow  # ~3 min of two real processes (make chaos runs it with the race rows)
def test_a_recovery_while_a_sink_commit_is_in_flight_lands_each_record_once(spark, tmp_path):
    """Attempt 1 stalls in the middle of its first commit phase: the ledger committed, the balances
    not yet. ``ckpt recover`` (attempt 2) fences both sinks, re-commits what the restored checkpoint
    owns and replays. Attempt 1 wakes up and commits the balances: refused inside the commit, it
    exits fenced, and each record is in the outputs exactly once."""
    landing(spark, tmp_path)
    code, out = _zombie_then(tmp_path, "sink_commit:1", _ckpt("recover", "payments", "--warehouse", str(tmp_path)),
                             "the recovery alone")
    assert code != 0 and "fenced" in out.lower(), out
    _report(tmp_path, "a recovery during an in-flight commit")


@pytest.mark.slow  # ~3 min (make chaos runs it with the race rows)
def test_a_savepoint_of_a_running_pipeline_is_taken_by_it_without_stopping_it(spark, tmp_path):
    """``ckpt savepoint`` while ``ckpt run --follow`` runs: the running pipeline's next step takes
    the savepoint (no new epoch, nothing replayed, the run goes on), the savepoint restores exactly."""
    from checkpoint_lib.delta.store import DeltaCheckpointStore

    landing(spark, tmp_path)
    store = DeltaCheckpointStore(tmp_path / "_checkpoints" / "payments")
    running = _start(tmp_path, "--follow", "--poll", "0.5")
    try:
        deadline = time.monotonic() + TIMEOUT
        while not store.checkpoints.all():  # the run is under way: its first checkpoint completed
            assert running.poll() is None and time.monotonic() < deadline, running.communicate()
            time.sleep(0.5)
        epoch = store.epochs.current()
        taken = subprocess.run([*_ckpt("savepoint", "payments", "--warehouse", str(tmp_path))],
                               env=ckpt_run_env("local[2]"), capture_output=True, text=True, timeout=TIMEOUT)
        assert taken.returncode == 0 and "taken by the running pipeline" in taken.stdout, taken.stdout + taken.stderr[-3000:]
        assert running.poll() is None, "the savepoint stopped the running pipeline"
        assert store.epochs.current() == epoch  # no recovery
        # the running pipeline goes on checkpointing: the savepoint is its newest savepoint
        savepoint = max((c for c in store.checkpoints.all() if c.is_savepoint), key=lambda c: c.checkpoint_id)
        assert f"savepoint {savepoint.checkpoint_id} taken" in taken.stdout
        # taken at the running pipeline's next step, mid-backlog (a savepoint request replaces the
        # periodic barrier): the run goes on and reads the rest before it is stopped
        deadline = time.monotonic() + TIMEOUT
        while not check_payments(str(tmp_path)).ok:
            assert running.poll() is None and time.monotonic() < deadline, running.communicate()
            time.sleep(2)
    finally:
        out = _finish(running, signal.SIGTERM)
    assert running.returncode == 0, out
    _report(tmp_path, "a savepoint of a running pipeline")
    again = subprocess.run([*_ckpt("recover", "payments", "--warehouse", str(tmp_path), "--checkpoint",
                                   str(savepoint.checkpoint_id)), "--rows-per-checkpoint", str(ROWS)],
                           env=ckpt_run_env("local[2]"), capture_output=True, text=True, timeout=TIMEOUT)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    _report(tmp_path, "restoring that savepoint")


@pytest.mark.slow  # ~2 min of a real process (make chaos runs it with the race rows)
def test_an_abort_landing_before_the_completion_of_a_running_pipeline_is_not_a_job_failure(spark, tmp_path):
    """The snapshot DAG's timeout aborts a checkpoint while the running pipeline (no tolerable
    failure: the default) holds its acknowledgements and is about to complete it: the abort stands,
    the pipeline's completion loses cleanly (not counted as a failure, no crash loop), the run goes
    on to complete later checkpoints and exits 0, and each record is in the outputs exactly once."""
    from checkpoint_lib.control import PipelineControl

    landing(spark, tmp_path)
    # the acknowledgement of checkpoint 2 (a chained run acks each checkpoint once): one after the
    # first, before the last (the final checkpoint's abort would fail the run, rightly)
    running = _start(tmp_path, pause_at="ack:2")
    try:
        _wait_stopped(running)
        control = PipelineControl(str(tmp_path), "payments")
        [pending] = [h["checkpoint_id"] for h in control.store.checkpoints.history() if h["status"] == "pending"]
        outcome = control.abort(checkpoint_id=pending, reason="expired", message="the snapshot DAG's ack timeout")
        assert outcome.aborted, outcome
    finally:
        out = _finish(running, signal.SIGCONT)
    assert running.returncode == 0, out
    statuses = {h["checkpoint_id"]: h["status"] for h in control.store.checkpoints.history()}
    assert statuses[pending] == "aborted", statuses  # the abort stood: completion lost
    assert f"checkpoint {pending} aborted" in out, out  # the runner met the race and went on
    assert any(cid > pending and s == "completed" for cid, s in statuses.items()), statuses  # and the run went on
    _report(tmp_path, "an abort racing the completion of a running pipeline")

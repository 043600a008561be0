"""Two attempts of one pipeline alive at once, as real ``ckpt`` processes (issue 24).

One process killed at a time is what the other crash suites prove. Here an older attempt is still
alive while a newer one takes over: a stalled zombie (``CKPT_PAUSE_AT=phase:n`` makes the process
SIGSTOP itself there - it keeps everything in memory, past every check it made, and goes on when
the test sends SIGCONT), and two recoveries started at the same instant. Each test reports the
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

pytestmark = [pytest.mark.crash, pytest.mark.spark]


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


def _report(warehouse, what: str) -> None:
    check = check_payments(str(warehouse))
    assert check.ok, f"{what}: tried, and {check.summary()}"


def test_a_stalled_zombie_released_after_a_newer_restore_lands_nothing(spark, tmp_path):
    """Attempt 1 stalls right before the MERGE of its second flush - after its epoch check, with
    the flush's deltas in hand. Attempt 2 (``ckpt recover --checkpoint 1``: an older checkpoint,
    so a rollback) restores, replays everything and commits. Then attempt 1 wakes up: its MERGE is
    refused inside the commit by the fence attempt 2 raised, it exits fenced, and the outputs are
    exact."""
    landing(spark, tmp_path)
    zombie = _start(tmp_path, pause_at="flush_merge:2")
    try:
        _wait_stopped(zombie)
        newer = subprocess.run(
            [*_ckpt("recover", "payments", "--warehouse", str(tmp_path), "--checkpoint", "1"),
             "--rows-per-checkpoint", str(ROWS)],
            env=ckpt_run_env("local[2]"), capture_output=True, text=True, timeout=TIMEOUT,
        )
        assert newer.returncode == 0, newer.stdout + newer.stderr[-3000:]
        _report(tmp_path, "the newer attempt alone")
        zombie.send_signal(signal.SIGCONT)
        out, err = zombie.communicate(timeout=TIMEOUT)
    finally:
        if zombie.poll() is None:
            zombie.kill()
    assert zombie.returncode != 0, f"the zombie finished as if nothing happened:\n{out}\n{err[-3000:]}"
    assert "fenced" in (out + err).lower(), out + err[-3000:]
    _report(tmp_path, "a stalled zombie released after a newer restore")  # not duplicated, not lost


@pytest.mark.slow  # ~5 min of three real processes; CI keeps the stalled zombie above
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

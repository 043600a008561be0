"""kill -9 the cyclic ``transfers`` pipeline (unaligned and aligned-with-timeout checkpoints, credits
in flight on the feedback edge), recover, and get exactly the failure-free balances."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest

from checkpoint_lib.pipelines.transfers import generate
from checkpoint_lib.submit import ckpt_run_argv, ckpt_run_env
from checkpoint_lib.verify import check_transfers

pytestmark = [pytest.mark.crash, pytest.mark.spark, pytest.mark.slow]
ROWS = 300
TIMEOUT = float(os.environ.get("CKPT_TEST_RUN_TIMEOUT", "900"))


def ckpt_run(warehouse, mode: str, kill_at: str | None = None) -> subprocess.CompletedProcess:
    cmd = ckpt_run_argv("transfers", warehouse, "--rows-per-checkpoint", str(ROWS), "--mode", mode)
    if mode == "aligned_with_timeout":
        cmd += ["--alignment-timeout", "0.5"]
    return subprocess.run(cmd, env=ckpt_run_env("local[2]", kill_at=kill_at), capture_output=True, text=True,
                          timeout=TIMEOUT)


def landing(spark, warehouse, seed: int = 0) -> None:
    for v in range(3):
        generate(spark, str(warehouse), ROWS, accounts=30, bad_fraction=0.03, skew=0.3, seed=seed * 10 + v)


KILLS = [
    ("unaligned", "feedback_write:3"), ("unaligned", "snapshot:4"), ("unaligned", "ack:4"),
    ("unaligned", "commit:2"), ("unaligned", "flush_merge:5"), ("unaligned", "recover:1"),
    ("aligned_with_timeout", "feedback_write:4"), ("aligned_with_timeout", "commit:2"),
]


@pytest.mark.parametrize("mode,kill_at", KILLS)
def test_kill_the_cycle_and_recover_exactly(spark, tmp_path, mode, kill_at):
    landing(spark, tmp_path)
    first = "commit:2" if kill_at.startswith("recover") else kill_at
    crashed = ckpt_run(tmp_path, mode, first)
    assert crashed.returncode == -signal.SIGKILL, f"{first} was not reached:\n{crashed.stdout}\n{crashed.stderr[-3000:]}"
    if kill_at.startswith("recover"):  # and again while restoring the channel state
        again = ckpt_run(tmp_path, mode, kill_at)
        assert again.returncode == -signal.SIGKILL, again.stdout + again.stderr[-3000:]
    done = ckpt_run(tmp_path, mode)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    check = check_transfers(str(tmp_path))
    assert check.ok, f"after a kill at {kill_at} ({mode}): {check.summary()}"


@pytest.mark.parametrize("seed", range(2))
def test_kill_the_cycle_from_outside_at_random(spark, tmp_path, seed):
    landing(spark, tmp_path, seed)
    cmd = ckpt_run_argv("transfers", tmp_path, "--rows-per-checkpoint", str(ROWS))
    proc = subprocess.Popen(cmd, env=ckpt_run_env("local[2]"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(random.Random(seed).uniform(20, 80))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = ckpt_run(tmp_path, "unaligned")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    check = check_transfers(str(tmp_path))
    assert check.ok, check.summary()

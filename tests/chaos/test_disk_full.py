"""A warehouse that fills up, or becomes unwritable, in the middle of a checkpoint: the run fails
with the I/O error, the checkpoint fails (it is never half-written: every store write is one
Delta commit), and once there is room again the same command recovers to the exact result.

The warehouse is a real filesystem of its own, a 64 MiB tmpfs, filled to the last byte once the
first snapshot is being taken; "unwritable" is ``chattr +i`` on the checkpoint store's log
directory, which stops root too. Both need root (CAP_SYS_ADMIN / CAP_LINUX_IMMUTABLE); elsewhere
the tests skip and say why.
"""

from __future__ import annotations

import errno
import subprocess
import time
from pathlib import Path

import pytest

from checkpoint_lib.pipelines.payments import generate
from checkpoint_lib.submit import ckpt_run_argv, ckpt_run_env
from checkpoint_lib.verify import check_payments

pytestmark = [pytest.mark.crash, pytest.mark.spark, pytest.mark.slow]
ROWS = 400


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}): needs root")


def _fill(path: Path) -> Path:
    """Write zeros into ``path/filler`` until the filesystem is full (ENOSPC)."""
    filler = path / "filler"
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass
    return filler


def _run(warehouse: Path, trace: Path, when=None):
    """``ckpt run``; ``when(reached)`` is called with the kill points passed so far, every 0.1 s."""
    cmd = ckpt_run_argv("payments", warehouse, "--rows-per-checkpoint", str(ROWS))
    proc = subprocess.Popen(cmd, env=ckpt_run_env("local[2]", trace=trace), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    fired = False
    while when is not None and not fired and proc.poll() is None:
        fired = when(trace.read_text().split() if trace.exists() else [])
        time.sleep(0.1)
    out, err = proc.communicate(timeout=900)
    return proc.returncode, out, err, fired


def _landing(spark, warehouse: Path) -> None:
    for v in range(3):
        generate(spark, str(warehouse), ROWS, bad_fraction=0.03, accounts=25, seed=70 + v)


def _store_is_sound(warehouse: Path) -> None:
    from checkpoint_lib.delta.store import DeltaCheckpointStore

    store = DeltaCheckpointStore.open(str(warehouse / "_checkpoints" / "payments"))
    assert store.checkpoints.unreadable() == [], "a checkpoint row was left half-written"


def test_the_warehouse_fills_up_mid_checkpoint(spark, tmp_path):
    warehouse = tmp_path / "w"
    _mount_tmpfs(warehouse, "64m")
    try:
        _landing(spark, warehouse)
        filler = None

        def fill_at_second_snapshot(reached):
            nonlocal filler
            if reached.count("snapshot") >= 2:  # checkpoint 1 is being taken
                filler = _fill(warehouse)
                return True
            return False

        code, out, err, fired = _run(warehouse, tmp_path / "trace", fill_at_second_snapshot)
        assert fired, f"the run ended before its first snapshot:\n{out}"
        assert code != 0, f"the run went on with a full disk?\n{out}"
        assert "No space left on device" in err or "ENOSPC" in err or "os error 28" in err, err[-3000:]
        filler.unlink()  # room again
        _store_is_sound(warehouse)
        code, out, err, _ = _run(warehouse, tmp_path / "trace")
        assert code == 0, out + err[-3000:]
        assert "restored checkpoint" in out or "starting from scratch" in out, out
        check = check_payments(str(warehouse))
        assert check.ok, check.summary()
    finally:
        subprocess.run(["umount", "-l", str(warehouse)], capture_output=True)


def test_the_checkpoint_store_becomes_unwritable_mid_checkpoint(spark, tmp_path):
    warehouse = tmp_path / "w"
    _landing(spark, warehouse)
    log_dir = warehouse / "_checkpoints" / "payments" / "checkpoints" / "_delta_log"
    locked = []

    def lock_at_second_snapshot(reached):
        if reached.count("snapshot") >= 2 and log_dir.exists():
            done = subprocess.run(["chattr", "+i", str(log_dir)], capture_output=True, text=True)
            locked.append(done)
            return True
        return False

    try:
        code, out, err, fired = _run(warehouse, tmp_path / "trace", lock_at_second_snapshot)
        if locked and locked[0].returncode != 0:
            pytest.skip(f"chattr +i is not permitted here: {locked[0].stderr.strip()}")
        assert fired, f"the run ended before its first snapshot:\n{out}"
        assert code != 0, f"the run went on with an unwritable store?\n{out}"
        assert "Permission denied" in err or "Operation not permitted" in err or "os error 1" in err, err[-3000:]
    finally:
        subprocess.run(["chattr", "-i", str(log_dir)], capture_output=True)
    _store_is_sound(warehouse)
    code, out, err, _ = _run(warehouse, tmp_path / "trace")
    assert code == 0, out + err[-3000:]
    check = check_payments(str(warehouse))
    assert check.ok, check.summary()

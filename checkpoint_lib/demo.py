"""``ckpt demo``: generate payments, run with periodic checkpoints, kill -9 mid-run, recover,
show the checkpoint history, and verify the outputs independently."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


_STARTED = time.monotonic()


def _say(message: str) -> None:
    print(f"\n=== [{time.monotonic() - _STARTED:5.1f} s] {message}", flush=True)


def _note(message: str) -> None:
    print(f"  [{time.monotonic() - _STARTED:5.1f} s] {message}", flush=True)


def _run_and_kill(warehouse: Path, rows_per_checkpoint: int, kill_after: int) -> int:
    """Start ``ckpt run payments`` in a child process and SIGKILL it once ``kill_after``
    checkpoints have completed. Returns the number of completed checkpoints it reported."""
    cmd = [sys.executable, "-m", "checkpoint_lib.cli", "run", "payments", "--warehouse", str(warehouse),
           "--rows-per-checkpoint", str(rows_per_checkpoint)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    completed = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        if "completed in" in line or "restored" in line or "starting from scratch" in line:
            print(f"  child: {line.rstrip()}", flush=True)
        if "completed in" in line:
            completed += 1
            if completed >= kill_after:
                time.sleep(0.5)  # let it get into the next step: the kill lands mid-work
                os.kill(proc.pid, signal.SIGKILL)
                print(f"  kill -9 {proc.pid} after {completed} completed checkpoints", flush=True)
                break
    proc.wait()
    return completed


def run_demo(warehouse: str, rows: int = 200_000) -> int:
    global _STARTED
    _STARTED = time.monotonic()
    from .core.types import BarrierMode
    from .history import format_table, with_durations
    from .pipelines import get
    from .pipelines.payments import generate
    from .spark.runner import PipelineRunner
    from .spark.session import get_spark, use_warehouse
    from .verify import check_payments
    from .delta.store import DeltaCheckpointStore
    from .files import files_at
    from .layout import checkpoint_root, location, warehouse_location

    w = location(warehouse_location(warehouse)) / "demo"  # a local folder, or a prefix on s3://
    files_at(w).delete_tree(w)
    if isinstance(w, Path):
        w.mkdir(parents=True)
    spark = get_spark(app_name="ckpt-demo")
    use_warehouse(spark, str(w))
    per_version = max(1, rows // 8)

    _say(f"generating {rows // 2} payments (1% bad rows) in 4 table versions under {w}/landing/payments")
    for _ in range(4):
        generate(spark, str(w), per_version, bad_fraction=0.01, accounts=500)

    _say("run 1: `ckpt run payments` with a checkpoint every table version; kill -9 after 2 checkpoints")
    _run_and_kill(w, per_version, kill_after=2)

    _say(f"meanwhile {rows // 2} more payments arrive (4 more versions)")
    for _ in range(4):
        generate(spark, str(w), per_version, bad_fraction=0.01, accounts=500)

    _say("run 2: `ckpt run payments` with its default step (up to 1,000,000 rows); it finds the crashed "
         "attempt and recovers by itself")
    runner = PipelineRunner(get("payments"), str(w), spark, mode=BarrierMode.ALIGNED,
                            progress=_note)
    summary = runner.run()
    rate = summary.rows_in / summary.seconds if summary.seconds else 0
    print(f"  read {summary.rows_in} rows in {summary.seconds:.1f} s ({rate:,.0f} rows/s)")

    _say("checkpoint history (ckpt checkpoints list payments)")
    store = DeltaCheckpointStore.open(checkpoint_root(w, "payments"))
    print(format_table(with_durations(store.checkpoints.history()[:12]), ["checkpoint_id", "kind", "status", "epoch", "duration_ms",
                                               "state_bytes", "alignment_ms", "failure_reason"]))

    _say("balances (first 5 accounts of gold/balances)")
    spark.read.format("delta").load(f"{w}/gold/balances").orderBy("account").show(5)

    _say("independent check (pandas over the landing files vs gold tables and dead letters)")
    check = check_payments(str(w))
    print(check.summary())

    _say("data quality after the restore: Great Expectations suites (ckpt validate payments)")
    from .quality import QualityCheckFailed, data_docs_index, validate_checkpoint, validate_restore, write_report
    from .quality.validate import ValidationSession

    quality_ok = True
    session = ValidationSession(spark)  # as `ckpt validate`: each table loaded once, the Data Docs built once
    try:
        for validate in (validate_restore, validate_checkpoint):
            try:
                print(validate(spark, "payments", str(w), session=session).summary())
            except QualityCheckFailed as exc:
                print(exc)
                quality_ok = False
            _note("validated")
        session.publish()
    finally:
        session.close()
    report = write_report("payments", str(w))
    print(f"\nwarehouse:    {w}")
    print(f"Data Docs:    {data_docs_index(w, 'payments')}")
    print(f"HTML report:  {report}   (ckpt report payments --warehouse {w})")
    print(f"\ndemo finished in {time.monotonic() - _STARTED:.1f} s")
    return 0 if check.ok and quality_ok else 1

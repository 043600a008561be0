"""Recovery time after a kill -9 at 10%, 50% and 90% of a checkpoint interval, vs. the data replayed.

The landing table holds 1 + 10 versions of ``interval / 10`` events. A real ``ckpt run payments
--rows-per-checkpoint <interval/10> --interval 1e9`` process (checkpointing effectively off, as
:data:`bench.ours.OFF`: one checkpoint at the first step, none after) reads one version per step:
checkpoint 1 covers version 0, and the next checkpoint would come 10 versions later. With
``CKPT_KILL_AT=source_read:<n+2>`` it SIGKILLs itself as it starts reading version ``n+1``, i.e.
once versions 1..n (n/10 of the interval) went through the keyed stage but no checkpoint holds them.

Then the recovery runs in this process (warm JVM: a restarted process would also pay its Spark
session start, not counted here) with the same configuration, timed in parts:

- **restore**: ``PipelineRunner.open()``, i.e. a new epoch, the recovery plan carried out (channel
  log cut, keyed state restored by time travel, sink transactions re-committed or aborted);
- **replay**: the steps until the source offset is back where the killed process was (versions
  1..n again; the first of them also takes the restarted run's first checkpoint);
- **recovery total** = restore + replay.

Then a final checkpoint commits the outputs, which must equal the floor's over the same versions
(0..n) before the figures count.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

VERSIONS_PER_INTERVAL = 10
KILL_PHASE = "source_read"
"""``source_read`` k is hit as step k starts reading: at ``source_read:n+2`` steps 1..n+1 (version
0 with checkpoint 1, then versions 1..n) are fully processed, and nothing of step n+2 is written.
Checked with ``CKPT_PHASE_TRACE``: per step source_read, dlq, [source_ack], channel_write,
flush_stage, flush_merge, [snapshot, ack, complete, commit, sink_commit]."""
TIMEOUT = float(os.environ.get("CKPT_BENCH_RUN_TIMEOUT", "14400"))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("recovery (bench/recovery.py)")
    g.add_argument("--skip-recovery", action="store_true", help="skip the recovery-time table")
    g.add_argument("--recovery-interval", type=int, default=1_000_000,
                   help="events per checkpoint interval (10 landing versions of a tenth each; default 1,000,000)")
    g.add_argument("--recovery-kills", default="10,50,90",
                   help="kill points, in percent of the interval (multiples of 10; default 10,50,90)")


QUICK = {"recovery_interval": 2_000}


def kill_points(args: argparse.Namespace) -> list[int]:
    points = [int(p) for p in str(args.recovery_kills).split(",") if p]
    bad = [p for p in points if p % 10 or not 10 <= p <= 90]
    if bad:
        raise ValueError(f"--recovery-kills: {bad} are not multiples of 10 within 10..90")
    if args.recovery_interval < VERSIONS_PER_INTERVAL:
        raise ValueError(f"--recovery-interval must be at least {VERSIONS_PER_INTERVAL} events")
    return points


def recovery(spark: Any, base: str, args: argparse.Namespace, log) -> list[dict]:
    """One row per kill point: the kill, the recovery timed in parts, the outputs checked."""
    from bench.outputs import check, generate_landing
    from bench.floor import run_floor
    from bench.ours import copy_landing

    per_version = args.recovery_interval // VERSIONS_PER_INTERVAL
    data = f"{base}/recovery{args.recovery_interval}"
    t0 = time.monotonic()
    generate_landing(spark, data, (1 + VERSIONS_PER_INTERVAL) * per_version, per_version, args.accounts)
    log(f"recovery: 1 + {VERSIONS_PER_INTERVAL} versions of {per_version:,} events generated "
        f"in {time.monotonic() - t0:.0f} s")
    rows = []
    for pct in kill_points(args):
        n = pct * VERSIONS_PER_INTERVAL // 100
        w = f"{data}/kill{pct}"
        shutil.rmtree(w, ignore_errors=True)  # what a run that stopped (or --keep) left there
        floor_out = f"{data}/floor-v{n}"
        run_floor(spark, f"{data}/landing/payments", floor_out, version=n)  # versions 0..n; warms the JVM too
        copy_landing(data, w)
        killed_s = kill(spark, w, per_version, n)
        figures = recover(spark, w, per_version, n)
        check(spark, floor_out, w, f"recovery after a kill at {pct}%")
        rows.append({"kill_pct": pct, "killed_after_s": killed_s, **figures})
        log(f"  kill at {pct}%: {figures['rows_replayed']:,} rows replayed, restore {figures['restore_s']:.1f} s, "
            f"replay {figures['replay_s']:.1f} s")
        if not args.keep:
            shutil.rmtree(w, ignore_errors=True)
            shutil.rmtree(floor_out, ignore_errors=True)
    return rows


def kill(spark: Any, warehouse: str, per_version: int, n: int) -> float:
    """A ``ckpt run`` process that SIGKILLs itself once versions 1..n (after checkpoint 1) are
    processed. Returns its wall time; raises if it did not die exactly there."""
    from checkpoint_lib.submit import ckpt_run_argv, ckpt_run_env

    trace = Path(warehouse) / "phase-trace.txt"
    at = f"{KILL_PHASE}:{n + 2}"
    env = ckpt_run_env(spark.sparkContext.master, kill_at=at, trace=trace)
    cmd = ckpt_run_argv("payments", warehouse, "--rows-per-checkpoint", str(per_version), "--interval", "1e9")
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    seconds = time.monotonic() - started
    reached = trace.read_text().split("\n") if trace.exists() else []
    reached = [line for line in reached if line]
    if proc.returncode != -signal.SIGKILL or not reached or reached[-1] != f"{KILL_PHASE} {n + 2}":
        raise RuntimeError(f"the run with CKPT_KILL_AT={at} did not die there (exit {proc.returncode}, "
                           f"last point {reached[-1:] or 'none'}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    completed = [line for line in reached if line.startswith("complete ")]
    if completed != ["complete 1"]:
        raise RuntimeError(f"the killed run should have completed checkpoint 1 only, it reached {completed}")
    trace.unlink()
    return seconds


def recover(spark: Any, warehouse: str, per_version: int, n: int) -> dict:
    """Recover in this process, timed: open (restore), steps back to version n (replay), then a
    final checkpoint that commits the outputs."""
    from checkpoint_lib.core.decider import CheckpointConfig
    from checkpoint_lib.pipelines import get
    from checkpoint_lib.spark.runner import PipelineRunner

    config = CheckpointConfig(interval=1e9, max_concurrent=1, timeout=3600, retained=5)  # as `ckpt run` above
    messages: list[str] = []
    runner = PipelineRunner(get("payments"), warehouse, spark, mode="aligned", config=config,
                            rows_per_checkpoint=per_version, progress=messages.append)
    started = time.monotonic()
    plan = runner.open()
    restored = time.monotonic()
    if plan is None or plan.checkpoint_id != 1:
        raise RuntimeError(f"expected a recovery from checkpoint 1, got {plan and plan.checkpoint_id}: {messages}")
    offset, rows_before = runner.offset, runner.summary.rows_in  # checkpoint 1's: version 0
    died_at = offset + n  # the killed process had processed n versions more
    while runner.offset < died_at:
        moved = runner.source_step()
        consumed = runner.keyed_step() if not runner.chained else False  # chained: no channel log, as run() does
        if not (moved or consumed):
            raise RuntimeError(f"the recovery stopped at version {runner.offset}, before {died_at}")
    replayed = time.monotonic()
    summary = runner.run(max_steps=0)  # the final checkpoint (commit) and a clean end
    rows = summary.rows_in - rows_before
    return {
        "restored_checkpoint": plan.checkpoint_id,
        "restored_offset": offset,
        "versions_replayed": died_at - offset,
        "rows_replayed": rows,
        "restore_s": restored - started,
        "replay_s": replayed - restored,
        "recovery_s": replayed - started,
        "us_per_row": (replayed - restored) / rows * 1e6 if rows else 0.0,
        "final_commit_s": time.monotonic() - replayed,
    }


def render_recovery(rows: list[dict]) -> str:
    from bench.markdown import table

    return table(
        ["kill at", "rows replayed", "restore (s)", "replay (s)", "replay (µs/row)", "recovery total (s)",
         "outputs exact"],
        [[f"{r['kill_pct']}% ({r['versions_replayed']} of {VERSIONS_PER_INTERVAL} versions)",
          f"{r['rows_replayed']:,}", f"{r['restore_s']:.1f}", f"{r['replay_s']:.1f}", f"{r['us_per_row']:,.0f}",
          f"{r['recovery_s']:.1f}", "yes"] for r in rows],
    )


def describe(args: argparse.Namespace) -> str:
    per_version = args.recovery_interval // VERSIONS_PER_INTERVAL
    return (f"a checkpoint interval of {args.recovery_interval:,} events ({VERSIONS_PER_INTERVAL} steps of "
            f"{per_version:,}), {args.accounts:,} accounts, aligned")

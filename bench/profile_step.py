"""Where a step's time goes: ours on the payments pipeline, every role's Spark and Delta work timed.

    .venv/bin/python bench/profile_step.py --events 100000 --rows-per-checkpoint 25000 [--mode aligned]

Generates the landing table (as ``make bench`` does), runs the floor once to warm the JVM, then
runs ours with the roles' methods wrapped in timers (wall time, inclusive: a method's figure holds
the methods it calls), checks the outputs against the floor's, and prints one row per method:
calls, seconds, seconds per call, and the Spark jobs it started (inclusive too, counted by the DAG
scheduler's job ids as ``make bench`` counts them: the counts do not depend on the machine, so a
profile taken on a busy machine still says where each job goes). Nothing is changed in the code
that runs.

Then (``--idle-checkpoints``, default 3) the same pipeline is opened again on the caught-up
warehouse and takes checkpoints with no new data, each a step that finds nothing plus a checkpoint
(barrier, snapshot, acknowledgements, completion, the sinks' empty commits): their times, and the
methods' figures of those checkpoints alone.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (module, class, methods): what a step does, by role
TIMED = [
    ("checkpoint_lib.spark.runner", "PipelineRunner", ["open", "close", "final_checkpoint", "step"]),
    ("checkpoint_lib.spark.graph_runner", "GraphRunner",
     ["_flow", "_barrier", "_send", "_poll", "_on_effects", "_commit_up_to", "_validate_before_commit", "_truncate"]),
    ("checkpoint_lib.spark.graph_recovery", "GraphRecovery", ["recover"]),
    ("checkpoint_lib.spark.vertices.source", "SourceVertexRun", ["propose", "read"]),
    ("checkpoint_lib.spark.vertices.operator", "OperatorVertexRun", ["read_state", "step", "update_state", "acks"]),
    ("checkpoint_lib.spark.vertices.sinks", "VertexSinks", ["stage", "acks"]),
    ("checkpoint_lib.spark.vertices.gate", "Gate", ["poll", "apply", "_snapshot", "_ack", "_write_channel_state"]),
    ("checkpoint_lib.spark.dead_letters", "DeadLetterTable", ["append"]),
    ("checkpoint_lib.spark.sinks", "DeltaTwoPhaseSink", ["stage", "commit", "_merge", "_add_files", "abort", "discard"]),
    ("checkpoint_lib.spark.state", "KeyedStateTable", ["read_keys", "apply", "compact"]),
    ("checkpoint_lib.spark.channels", "DeltaChannelLog", ["write", "index", "read", "truncate_upto"]),
    ("checkpoint_lib.delta.completed", "DeltaCompletedCheckpointStore", ["record_pending", "add"]),
]


def instrument(spark: Any, timed: list[tuple[str, str, list[str]]] = TIMED) -> dict[str, list]:
    """Wrap every method of ``timed`` (:data:`TIMED`) with a timer and a count of the Spark jobs it
    starts; returns the figures (calls, seconds, jobs per method), filled as it runs."""
    import importlib

    from bench.work import spark_jobs

    figures: dict[str, list] = defaultdict(lambda: [0, 0.0, 0])
    for module, cls_name, methods in timed:
        cls = getattr(importlib.import_module(module), cls_name)
        for name in methods:
            original = getattr(cls, name)

            @functools.wraps(original)
            def timed(*a, __original=original, __key=f"{cls_name}.{name}", **kw):
                t0, j0 = time.monotonic(), spark_jobs(spark)
                try:
                    return __original(*a, **kw)
                finally:
                    figures[__key][0] += 1
                    figures[__key][1] += time.monotonic() - t0
                    figures[__key][2] += spark_jobs(spark) - j0

            setattr(cls, name, timed)
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--rows-per-checkpoint", type=int, default=25_000)
    ap.add_argument("--accounts", type=int, default=2_000)
    ap.add_argument("--mode", default="aligned", help="a barrier mode, or off (no periodic checkpoint)")
    ap.add_argument("--work", default=None, help="working folder (default: a temporary one, deleted)")
    ap.add_argument("--idle-checkpoints", type=int, default=3, help="checkpoints with no new data, timed after the run")
    args = ap.parse_args(argv)

    from bench.floor import run_floor
    from bench.ours import copy_landing, run_ours
    from bench.outputs import check, generate_landing
    from bench.work import spark_jobs
    from checkpoint_lib.spark.session import get_spark

    spark = get_spark(ui=False)
    work = Path(args.work or tempfile.mkdtemp(prefix="ckpt-profile-"))
    try:
        generate_landing(spark, str(work), args.events, args.rows_per_checkpoint, args.accounts)
        floor = run_floor(spark, f"{work}/landing/payments", f"{work}/floor")  # also warms the JVM up
        figures: dict[str, Any] = instrument(spark)
        w = f"{work}/ours"
        copy_landing(str(work), w)
        jobs = spark_jobs(spark)
        ours = run_ours(spark, w, mode=args.mode, rows_per_checkpoint=args.rows_per_checkpoint)
        jobs = spark_jobs(spark) - jobs
        check(spark, f"{work}/floor", w, "ours")
        during_run = {key: list(v) for key, v in figures.items()}
        idle = idle_checkpoints(spark, w, args.idle_checkpoints, args.rows_per_checkpoint)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{args.events:,} events, a step of {args.rows_per_checkpoint:,} rows, {args.mode}: ours "
          f"{ours['seconds']:.1f} s ({ours['steps']} steps, {ours['checkpoints']} checkpoints), "
          f"floor {floor['seconds']:.1f} s; outputs checked; {jobs} Spark jobs "
          f"({jobs / max(1, ours['steps']):.1f} a step)")
    print_figures(during_run)
    if idle:
        print(f"\n{len(idle)} checkpoints with no new data: {', '.join(f'{t:.2f}' for t in idle)} s "
              f"(median {statistics.median(idle):.2f} s); what they called:")
        before = lambda key: during_run.get(key, [0, 0.0, 0])  # noqa: E731
        print_figures({key: [calls - before(key)[0], seconds - before(key)[1], jobs - before(key)[2]]
                       for key, (calls, seconds, jobs) in figures.items()})
    return 0


def print_figures(figures: dict[str, list]) -> None:
    print("| method | calls | s | s per call | Spark jobs | jobs per call |\n|---|---:|---:|---:|---:|---:|")
    for key, (calls, seconds, jobs) in sorted(figures.items(), key=lambda kv: -kv[1][1]):
        if calls:
            print(f"| `{key}` | {calls} | {seconds:.2f} | {seconds / calls:.2f} | {jobs} | {jobs / calls:.1f} |")


def idle_checkpoints(spark: Any, warehouse: str, n: int, rows_per_checkpoint: int) -> list[float]:
    """Open payments again on a caught-up ``warehouse`` and time ``n`` checkpoints with no new data
    (each: a source step that finds nothing, then a checkpoint taken to completion)."""
    from checkpoint_lib.core.decider import CheckpointConfig
    from checkpoint_lib.pipelines import get
    from checkpoint_lib.spark.runner import PipelineRunner

    if n <= 0:
        return []
    runner = PipelineRunner(get("payments"), warehouse, spark, mode="aligned", rows_per_checkpoint=rows_per_checkpoint,
                            config=CheckpointConfig(interval=0.0, max_concurrent=1, timeout=3600, retained=5))
    runner.open()
    times = []
    try:
        for _ in range(n):
            started = time.monotonic()
            if runner.source_step():
                raise AssertionError("the landing table had new data: not an idle checkpoint")
            runner.final_checkpoint()
            times.append(time.monotonic() - started)
    finally:
        runner.close()
    return times


if __name__ == "__main__":
    raise SystemExit(main())

"""The commands that run a pipeline: ``ckpt run``, ``recover`` (its ``--dry-run`` a plan read with
delta-rs, no JVM; then the after-restore validation), ``savepoint`` (asked of the running pipeline,
else taken here) and ``demo``; on a terminal a live bar over the rows left to read."""

from __future__ import annotations

import argparse
import functools
import os
import time
from typing import Any

from ..core.types import CheckpointStatus
from . import context
from .output import EXIT_OK, RowsBar, bar_wanted, emit, progress, wants_json
from .validating import validate_suites


def _runner(args: argparse.Namespace, **kw: Any):
    from ..core.decider import CheckpointConfig
    from ..spark.runner import PipelineRunner

    config = CheckpointConfig(
        interval=args.interval, min_pause=args.min_pause, max_concurrent=1, timeout=args.timeout,
        retained=args.retained,
    )
    source, operator = getattr(args, "source_parallelism", None), getattr(args, "parallelism", None)
    given = [f"--{flag} {n}" for flag, n in (("source-parallelism", source), ("parallelism", operator)) if n is not None]
    pipeline = context.pipeline(args.pipeline).with_parallelism(
        source=source, operator=operator, origin=" ".join(given)
    )
    mode = args.mode or ("unaligned" if pipeline.feedback else "aligned")
    return PipelineRunner(
        pipeline, args.warehouse, context.spark_session(args), mode=mode,
        rows_per_checkpoint=args.rows_per_checkpoint, config=config, progress=progress,
        alignment_timeout=args.alignment_timeout, stage=args.stage,
        poll_interval=getattr(args, "poll", 1.0), lagging_sources=getattr(args, "lagging_sources", 0),
        state_compact_every=getattr(args, "state_compact_every", 32),
        chaining=not getattr(args, "no_chaining", False), **kw,
    )


def _run(args: argparse.Namespace, recover: bool = False) -> dict[str, Any]:
    """Run (or recover) the pipeline; the run's summary, printed as a line unless ``-o json``. On
    a terminal a live bar shows the rows read of the backlog, the rate and the time left."""
    runner = _runner(args, restore_checkpoint=args.checkpoint, recover=recover,
                     allow_non_restored_state=args.allow_non_restored_state)
    run = functools.partial(runner.run, until_caught_up=args.until_caught_up, max_steps=args.max_steps,
                            handle_signals=True)
    backlog = None
    if bar_wanted(args):
        runner.open()  # the recovery, if any, says what it restored before the bar starts
        backlog = runner.backlog_rows()
    if backlog:
        started = time.monotonic()
        with RowsBar(backlog) as bar:
            summary = run(on_step=lambda s: bar.update(s.rows_in, time.monotonic() - started, runner.backlog_rows()))
    else:
        summary = run()
    rate = summary.rows_in / summary.seconds if summary.seconds else 0.0
    if not wants_json(args):
        print(
            f"epoch {summary.epoch}: read {summary.rows_in:,} rows in {summary.seconds:.1f} s ({rate:,.0f} rows/s), "
            f"{len(summary.completed)} checkpoints completed, {len(summary.aborted)} aborted"
        )
    return {
        "pipeline": args.pipeline, "epoch": summary.epoch, "restored": summary.restored,
        "rows_in": summary.rows_in, "seconds": round(summary.seconds, 3), "rows_per_s": round(rate, 1),
        "steps": summary.steps, "completed": summary.completed,
        "aborted": [{"checkpoint_id": c, "reason": r} for c, r in summary.aborted], "final": summary.final,
    }


def cmd_run(args: argparse.Namespace) -> int:
    summary = _run(args)
    if wants_json(args):
        emit(summary)
    return EXIT_OK


def cmd_recover(args: argparse.Namespace) -> int:
    if args.dry_run:  # delta-rs only: no JVM
        from ..delta.inspect import recovery_preview

        preview = recovery_preview(args.warehouse, context.pipeline(args.pipeline), args.checkpoint)
        if wants_json(args):
            emit(preview.to_dict())
        else:
            print(preview.describe())
        return EXIT_OK
    if not args.no_validate:
        context.import_in_background("great_expectations")  # the validation's imports, while the run runs
    summary = _run(args, recover=True)
    code, validations = (EXIT_OK, []) if args.no_validate else validate_suites(args, kinds=("restore",))
    if wants_json(args):
        emit({**summary, "validations": validations})
    return code


def cmd_savepoint(args: argparse.Namespace) -> int:
    from ..core.types import CheckpointKind

    if args.stage == "keyed":
        raise ValueError("a savepoint is injected by the source stage: use --stage source or all")
    from ..control import PipelineControl

    control = PipelineControl(args.warehouse, args.pipeline)
    if args.request_timeout > 0 and control.source_running():
        # a running pipeline takes it at its next step, as Flink's savepoint of a running job:
        # nothing is stopped or replayed
        request_id = f"savepoint-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        checkpoint_id, state = control.savepoint_from_running(request_id, timeout=args.request_timeout,
                                                              requested_by="ckpt savepoint")
        if checkpoint_id is not None:
            done = "taken by the running pipeline" if state == CheckpointStatus.COMPLETED else \
                "injected into the running pipeline (it completes when its keyed stage runs)"
            return _savepoint_taken(args, checkpoint_id, done,
                                    CheckpointStatus.COMPLETED if state == CheckpointStatus.COMPLETED else "injected")
        progress(f"no running source step took the savepoint request within {args.request_timeout:g} s: "
                 "its process is gone; recovering and taking the savepoint here")
    checkpoint_id = _runner(args).run(max_steps=0, final_kind=CheckpointKind.SAVEPOINT).final
    done = "taken" if args.stage == "all" else "injected (it completes when the keyed stage runs)"
    return _savepoint_taken(args, checkpoint_id, done, CheckpointStatus.COMPLETED if args.stage == "all" else "injected")


def _savepoint_taken(args: argparse.Namespace, checkpoint_id: int, done: str, status: str) -> int:
    if wants_json(args):
        emit({"pipeline": args.pipeline, "savepoint": checkpoint_id, "status": status})
    else:
        print(f"savepoint {checkpoint_id} {done}; retention never deletes it; "
              f"start from it with: ckpt run {args.pipeline} --checkpoint {checkpoint_id}")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    context.import_in_background("great_expectations")  # its validation's imports, while the demo runs
    return run_demo(args.warehouse, rows=args.rows)

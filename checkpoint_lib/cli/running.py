"""The commands that run a pipeline: ``ckpt run``, ``recover`` (its ``--dry-run`` a plan read with
delta-rs, no JVM; then the after-restore validation), ``savepoint`` (asked of the running pipeline,
else taken here) and ``demo``; on a terminal a live bar over the rows left to read.

``run`` and ``recover`` also run a dataflow graph (:class:`~checkpoint_lib.spark.graph_runner.GraphRunner`:
every vertex in this process, every edge chained), with the options that make sense for it; the
others are refused before Spark starts (:func:`graph_option_problems`); ``recover --dry-run``
previews a graph's recovery vertex by vertex; ``savepoint`` of a running graph is taken by its next step, as a linear pipeline's; ``recover`` of a graph runs the after-restore suite the graph declares
(``Graph.quality``), or skips it, saying so, when it declares none."""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from typing import Any

from ..core.types import CheckpointStatus
from . import context
from .output import EXIT_OK, RowsBar, bar_wanted, emit, progress, wants_json
from .validating import validate_suites


STATE_COMPACT_EVERY = 32
"""``--state-compact-every``'s default (every keyed state table, of a linear pipeline or a graph)."""


def _config(args: argparse.Namespace):
    from ..core.decider import CheckpointConfig

    return CheckpointConfig(
        interval=args.interval, min_pause=args.min_pause, max_concurrent=1, timeout=args.timeout,
        retained=args.retained,
    )


def _runner(args: argparse.Namespace, **kw: Any):
    """The runner of ``args.pipeline``: a :class:`~checkpoint_lib.spark.runner.PipelineRunner` for a
    linear pipeline, a :class:`~checkpoint_lib.spark.graph_runner.GraphRunner` for a dataflow graph."""
    from ..pipelines import is_graph

    declared = context.declared(args.pipeline)
    if is_graph(declared):
        return _graph_runner(args, declared, **kw)
    from ..spark.runner import PipelineRunner

    source, operator = getattr(args, "source_parallelism", None), getattr(args, "parallelism", None)
    given = [f"--{flag} {n}" for flag, n in (("source-parallelism", source), ("parallelism", operator)) if n is not None]
    pipeline = declared.with_parallelism(source=source, operator=operator, origin=" ".join(given))
    mode = args.mode or ("unaligned" if pipeline.feedback else "aligned")
    compact = getattr(args, "state_compact_every", None)
    return PipelineRunner(
        pipeline, args.warehouse, context.spark_session(args), mode=mode,
        rows_per_checkpoint=args.rows_per_checkpoint, config=_config(args), progress=progress,
        alignment_timeout=args.alignment_timeout, stage=args.stage,
        poll_interval=getattr(args, "poll", 1.0), lagging_sources=getattr(args, "lagging_sources", 0),
        state_compact_every=STATE_COMPACT_EVERY if compact is None else compact,
        chaining=not getattr(args, "no_chaining", False), **kw,
    )


def graph_option_problems(args: argparse.Namespace, graph: Any = None, *, savepoint: bool = False) -> list[str]:
    """The options of ``ckpt run``/``recover`` (``savepoint``: of ``ckpt savepoint``) a dataflow
    graph does not take (yet), each with why: its runner runs every vertex in one process (``--stage
    all``), or one vertex's process group of the per-vertex layout (``--stage <vertex id>``), each
    vertex at its declared parallelism."""
    problems = []
    stage = getattr(args, "stage", "all")
    if stage != "all":
        groups = process_groups(graph) if graph is not None else []
        if savepoint:
            problems.append(f"--stage {stage} (a savepoint of a graph is taken with every vertex in one process: "
                            "--stage all)")
        elif stage not in groups:
            problems.append(f"--stage {stage} (a graph runs every vertex in one process, --stage all, or each operator "
                            "as its own process and the sources as one, --stage <process group>"
                            + (f": one of {', '.join(groups)}" if groups else "") + ")")
    given = [f"--{flag}" for flag in ("parallelism", "source-parallelism")
             if getattr(args, flag.replace("-", "_"), None) is not None]
    if given:
        problems.append(f"{' and '.join(given)} (a graph declares each vertex's parallelism: change the declaration; a "
                        "restore at another parallelism splits keyed state by key group)")
    if getattr(args, "lagging_sources", 0):
        problems.append("--lagging-sources (a graph's lagging inputs are declared by its plan, not by source subtasks)")
    return problems


def process_groups(graph: Any) -> list[str]:
    """The process groups ``--stage`` may name for ``graph``: those of the per-vertex layout (each
    operator's, the sources'), in topological order."""
    from ..graph import Layout, plan

    return [g.name for g in plan(graph, Layout.PER_VERTEX).groups]


def refuse_graph_options(args: argparse.Namespace, graph: Any = None, *, savepoint: bool = False) -> None:
    """Refuse, all at once, the options a dataflow graph does not take (:func:`graph_option_problems`)."""
    problems = graph_option_problems(args, graph, savepoint=savepoint)
    if problems:
        raise ValueError(f"{args.pipeline} is a dataflow graph, which does not take "
                         + ("; ".join(problems) if len(problems) == 1 else
                            "these options:\n" + "\n".join(f"  - {p}" for p in problems)))


def _graph_runner(args: argparse.Namespace, graph: Any, **kw: Any):
    """A :class:`~checkpoint_lib.spark.graph_runner.GraphRunner` with the run options a graph takes;
    the others are refused before Spark starts (:func:`graph_option_problems`)."""
    refuse_graph_options(args, graph)
    from ..graph import Layout, plan
    from ..spark.graph_runner import GraphRunner

    stage = getattr(args, "stage", "all")
    layout = Layout.of_stage(stage)
    cycle = any(e.feedback for e in graph.edges)
    mode = args.mode or ("unaligned" if cycle else "aligned")
    chaining = not getattr(args, "no_chaining", False)
    if mode != "aligned" and not plan(graph, layout, chaining=chaining).cut:
        progress(f"graph {graph.name}: every edge is chained in this process, so every checkpoint is aligned at a "
                 f"step's end with nothing in flight (--mode {mode} changes nothing)")
    compact = getattr(args, "state_compact_every", None)
    return GraphRunner(graph, args.warehouse, context.spark_session(args), mode=mode,
                       rows_per_checkpoint=args.rows_per_checkpoint, config=_config(args), progress=progress,
                       poll_interval=getattr(args, "poll", 1.0), processes=layout, group=stage, chaining=chaining,
                       alignment_timeout=getattr(args, "alignment_timeout", None),
                       state_compact_every=STATE_COMPACT_EVERY if compact is None else compact, **kw)


def _run(args: argparse.Namespace, recover: bool = False) -> dict[str, Any]:
    """Run (or recover) the pipeline or graph; the run's summary, printed as a line unless ``-o
    json``. On a terminal a live bar shows the rows read of the backlog, the rate and the time left."""
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
    from ..pipelines import is_graph

    graph = is_graph(context.declared(args.pipeline))
    if args.dry_run:  # delta-rs only: no JVM
        from ..delta.inspect import recovery_preview

        preview = recovery_preview(args.warehouse, context.declared(args.pipeline), args.checkpoint)
        if wants_json(args):
            emit(preview.to_dict())
        else:
            print(preview.describe())
        return EXIT_OK
    suite = not graph or getattr(context.declared(args.pipeline), "quality", None) is not None
    if not args.no_validate and suite and not (graph and graph_option_problems(args, context.declared(args.pipeline))):
        context.import_in_background("great_expectations")  # the validation's imports, while the run runs
    summary = _run(args, recover=True)
    if not suite:  # a graph brings its own suite (Graph.quality); the generic ones check linear pipelines
        skipped = (f"after-restore validation skipped: {args.pipeline} is a dataflow graph that declares no quality "
                   "suite (Graph.quality)")
        if not args.no_validate:
            print(skipped, file=sys.stderr if wants_json(args) else sys.stdout)
        code, validations = EXIT_OK, []
        summary["validation"] = "not asked" if args.no_validate else skipped
    else:
        code, validations = (EXIT_OK, []) if args.no_validate else validate_suites(args, kinds=("restore",))
    if wants_json(args):
        emit({**summary, "validations": validations})
    return code


def cmd_savepoint(args: argparse.Namespace) -> int:
    from ..core.types import CheckpointKind

    from ..pipelines import is_graph

    if is_graph(context.declared(args.pipeline)):
        refuse_graph_options(args, context.declared(args.pipeline), savepoint=True)  # before anything is opened
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

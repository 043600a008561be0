"""The data-quality suites (Great Expectations) as commands: ``ckpt validate``, and the validation
``ckpt recover`` runs after a restore (:func:`validate_suites`); on a terminal a live bar over each
suite's steps, plain lines on stderr otherwise. A dataflow graph runs the after-restore suite it
declares (``Graph.quality``; ``--suite all`` is that one); one that declares none, or its
per-checkpoint suite, is refused before Spark starts."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import Any, Sequence

from . import context
from .output import EXIT_OK, EXIT_QUALITY, StepsBar, bar_wanted, emit, wants_json


def validate_suites(args: argparse.Namespace, kinds: Sequence[str]) -> tuple[int, list[dict[str, Any]]]:
    """Run the quality suites (GX): the exit code (:data:`EXIT_QUALITY` when one failed; it is
    recorded in the pipeline's ``validations`` table either way) and one dict per suite. Their
    summaries are printed, on stderr with ``-o json``."""
    from ..quality import QualityCheckFailed, validate_checkpoint, validate_restore
    from ..quality.paths import check_pipeline_name, warehouse_root

    check_pipeline_name(args.pipeline)  # bad input fails before Spark starts
    root = warehouse_root(args.warehouse)
    from ..pipelines import is_graph
    from ..quality.context import driver_sized
    from ..quality.spec import get_spec, graph_spec
    from ..quality.validate import ValidationSession, suite_for

    run = {"restore": validate_restore, "checkpoint": validate_checkpoint}
    out = sys.stderr if wants_json(args) else sys.stdout
    declared = context.declared(args.pipeline)  # a linear pipeline, or a graph with its own suite
    if is_graph(declared):  # one without a suite, or a suite it lacks, is refused before Spark starts
        for kind in kinds:
            suite_for(kind, graph_spec(declared))
    context.import_in_background("great_expectations")  # seconds of imports, while the JVM starts
    code, results = EXIT_OK, []
    small = driver_sized(declared, root)
    spark = context.spark_session(args, short_lived=small)  # small: seconds of small jobs
    session = ValidationSession(spark)  # the suites share table loads and one Data Docs build
    try:
        for kind in kinds:
            title = f"validating {kind}"
            started = time.monotonic()
            try:
                if bar_wanted(args):  # each view computed, then validated
                    with StepsBar(title, 2 * len(suite_for(kind, get_spec(args.pipeline)).views)) as bar:
                        result = run[kind](spark, args.pipeline, args.warehouse, getattr(args, "checkpoint", None),
                                           progress=bar.step, session=session)
                else:  # plain lines on stderr: stdout keeps the summaries (or the JSON) alone
                    def line(step: str, view: str) -> None:
                        print(f"  {title}: {view} {step} ({time.monotonic() - started:.1f} s)", file=sys.stderr,
                              flush=True)

                    result = run[kind](spark, args.pipeline, args.warehouse, getattr(args, "checkpoint", None),
                                       progress=line, session=session)
            except QualityCheckFailed as exc:
                print(f"ckpt: validation failed: {exc}", file=sys.stderr)
                code, result = EXIT_QUALITY, exc.result
            else:
                print(result.summary(verbose=getattr(args, "verbose", False)), file=out)
            results.append({"suite": kind, "success": result.success, "checkpoint_id": result.checkpoint_id,
                            "expectations": len(result.outcomes), "failed": len(result.failed),
                            "headline": result.headline(), "data_docs": result.data_docs})
    except BaseException:  # a suite could not run: the pages of those that did are still built, its error stands
        with contextlib.suppress(Exception):
            session.publish()
        raise
    else:
        session.publish()
    finally:
        session.close()
    return code, results


def cmd_validate(args: argparse.Namespace) -> int:
    from ..pipelines import is_graph

    kinds = ("restore", "checkpoint") if args.suite == "all" else (args.suite,)
    if args.suite == "all" and is_graph(context.declared(args.pipeline)):
        kinds = ("restore",)  # a dataflow graph has its after-restore suite only so far
    code, results = validate_suites(args, kinds)
    if wants_json(args):
        emit(results)
    return code

"""The commands that set up, check and look after the machine and a pipeline's warehouse: ``ckpt
setup`` (the Delta jars), ``doctor`` (this machine's prerequisites), ``simulate`` (the in-memory
simulator), ``generate`` (input appended to a pipeline's landing table) and ``maintain`` (retention)."""

from __future__ import annotations

import argparse
from typing import Any, Mapping

from . import context
from .output import EXIT_FAILED, EXIT_OK, emit, wants_json


def cmd_setup(args: argparse.Namespace) -> int:
    from ..spark.jars import setup_main

    return setup_main()


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..doctor import diagnose, to_json
    from ..spark.session import resolve_master

    show = None if wants_json(args) else (lambda check: print(check.line(), flush=True))
    checks = diagnose(args.warehouse, resolve_master(args.master), with_spark=not args.no_spark, progress=show)
    if wants_json(args):
        emit(to_json(checks))
    failed = [c.name for c in checks if not c.ok]
    if not wants_json(args):
        print(f"\n{len(checks) - len(failed)} of {len(checks)} checks OK" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return EXIT_FAILED if failed else EXIT_OK


def cmd_simulate(args: argparse.Namespace) -> int:
    from ..demo_sim import run_demo

    ok = run_demo(records_per_source=args.records, seed=args.seed)
    print("\nall exactly-once modes reproduced the failure-free result" if ok else "\nMISMATCH")
    return 0 if ok else 1


def cmd_generate(args: argparse.Namespace) -> int:
    from ..pipelines import is_graph

    pipeline = context.declared(args.pipeline)  # a linear pipeline or a dataflow graph: each has its generator
    if pipeline.generator_fn is None:
        raise ValueError(f"pipeline {args.pipeline!r} has no generator (declare one with .generator(fn))")
    options = dict(args.option or ())
    for name in ("accounts", "skew"):  # shorthands of --option
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    _check_generator_options(pipeline.generator_fn, options)
    version = pipeline.generator_fn(context.spark_session(args), args.warehouse, args.rows,
                                    bad_fraction=args.bad_fraction, seed=args.seed, **options)
    if is_graph(pipeline):  # several sources: which table the version is of is the generator's to say
        sources = ", ".join(f"{v.name} {v.spec.path}" for v in pipeline.sources)
        print(f"appended {args.rows} rows to the sources of graph {pipeline.name} under {args.warehouse} ({sources}); "
              f"the generator returned version {version}")
    else:
        print(f"appended {args.rows} rows to {args.warehouse}/{pipeline.source_spec.path} as version {version}")
    return 0


def _check_generator_options(fn: Any, options: Mapping[str, Any]) -> None:
    """Unknown generator options fail before Spark starts, naming the ones it takes."""
    import inspect as _inspect

    params = _inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    known = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY and n not in ("bad_fraction", "seed")]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"the generator takes no option {', '.join(unknown)}; it takes: {', '.join(known) or 'none'}")


def cmd_maintain(args: argparse.Namespace) -> int:
    from ..maintenance import RetentionPolicy, maintain
    from ..quality.paths import check_pipeline_name, warehouse_root

    check_pipeline_name(args.pipeline)  # bad input fails before Spark starts
    warehouse_root(args.warehouse)
    policy = RetentionPolicy(request_days=args.request_days, result_days=args.result_days,
                             file_retention_hours=args.file_retention_hours)
    report = maintain(args.warehouse, args.pipeline, None if args.no_spark else context.spark_session(args),
                      dry_run=args.dry_run, policy=policy)
    if wants_json(args):
        emit(report.to_dict())
    else:
        print(report.describe())
    return 0

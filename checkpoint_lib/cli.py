# PYTHON_ARGCOMPLETE_OK
"""``ckpt``: the command line of checkpoint_lib.

Every sub-command has ``--help``. Engine-backed commands import their engines lazily, so
``ckpt --help`` works with the core alone. Exit codes (:data:`EXIT_CODES`): 0 success, 1 a run or
check failed, 2 bad arguments, 3 a clear user error (unknown pipeline, checkpoint or warehouse,
an incompatible snapshot...), 4 a data-quality suite failed. An error is one line on stderr;
``--debug`` shows the traceback (and Spark's own log).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
from typing import Any, Mapping, Sequence

from .core.decider import DEFAULT_ROWS_PER_STEP
from .core.types import MODES, CheckpointStatus

DEFAULT_WAREHOUSE = os.environ.get("CKPT_WAREHOUSE", "warehouse")
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_USER_ERROR, EXIT_QUALITY = 0, 1, 2, 3, 4
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILED: "a run or check failed",
    EXIT_USAGE: "bad arguments",
    EXIT_USER_ERROR: "a clear user error: unknown pipeline, checkpoint or warehouse, incompatible snapshot, bad input",
    EXIT_QUALITY: "a data-quality suite (Great Expectations) failed",
}
_json_stdout = False  # -o json: stdout holds the JSON alone; progress goes to stderr


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} must be within 0..1")
    return value


def _progress(message: str) -> None:
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}", file=sys.stderr if _json_stdout else sys.stdout,
          flush=True)


def _json(args: argparse.Namespace) -> bool:
    return getattr(args, "output", "table") == "json"


def _json_value(value: Any) -> Any:
    """What ``-o json`` writes for a value JSON has no type for: a time as ISO 8601, bytes as hex,
    anything else (a Decimal, a path) as its text."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return str(value)


def _emit(document: Any) -> None:
    """``-o json``: the command's one JSON document on stdout (nested objects, never JSON in a
    string); everything else a command says goes to stderr."""
    print(json.dumps(document, indent=2, default=_json_value), flush=True)


def _spark(args: argparse.Namespace):
    from .spark.session import get_spark, use_warehouse

    spark = get_spark(master=getattr(args, "master", None), app_name="ckpt",
                      extra_conf=dict(getattr(args, "spark_conf", None) or ()))
    if getattr(args, "warehouse", None):
        use_warehouse(spark, args.warehouse)
    return spark


def _import_in_background(module: str) -> None:
    """Import ``module`` on a daemon thread (its cost overlaps the caller's wait for Spark); the
    first real use waits on Python's import lock for it, and an import error shows there."""
    import importlib
    import threading

    if module in sys.modules:  # (recover asks before its run, and its validation again)
        return

    def load() -> None:
        try:
            importlib.import_module(module)
        except Exception:  # shown where the module is used
            pass

    threading.Thread(target=load, name=f"import {module}", daemon=True).start()


def _spark_conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value


def _pipeline(name: str):
    from .pipelines import get

    return get(name)


def _resolve_pipeline(args: argparse.Namespace) -> None:
    """``args.pipeline`` as a name: a ``module:attr`` reference is imported (from the current
    directory too, like ``python -m``) and known by its name to the rest of the process."""
    ref = getattr(args, "pipeline", None)
    if not isinstance(ref, str):
        return
    from .pipelines import is_reference, name_of

    if is_reference(ref) and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    args.pipeline = name_of(ref)


# --- commands --------------------------------------------------------------------------------


def _cmd_setup(args: argparse.Namespace) -> int:
    from .spark.jars import setup_main

    return setup_main()


def _cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import diagnose, to_json
    from .spark.session import resolve_master

    show = None if _json(args) else (lambda check: print(check.line(), flush=True))
    checks = diagnose(args.warehouse, resolve_master(args.master), with_spark=not args.no_spark, progress=show)
    if _json(args):
        _emit(to_json(checks))
    failed = [c.name for c in checks if not c.ok]
    if not _json(args):
        print(f"\n{len(checks) - len(failed)} of {len(checks)} checks OK" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return EXIT_FAILED if failed else EXIT_OK


def _cmd_simulate(args: argparse.Namespace) -> int:
    from .demo_sim import run_demo

    ok = run_demo(records_per_source=args.records, seed=args.seed)
    print("\nall exactly-once modes reproduced the failure-free result" if ok else "\nMISMATCH")
    return 0 if ok else 1


def _cmd_generate(args: argparse.Namespace) -> int:
    pipeline = _pipeline(args.pipeline)
    if pipeline.generator_fn is None:
        raise ValueError(f"pipeline {args.pipeline!r} has no generator (declare one with .generator(fn))")
    options = dict(args.option or ())
    for name in ("accounts", "skew"):  # shorthands of --option
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    _check_generator_options(pipeline.generator_fn, options)
    version = pipeline.generator_fn(_spark(args), args.warehouse, args.rows, bad_fraction=args.bad_fraction,
                                    seed=args.seed, **options)
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


def _generator_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``, the value a Python literal when it is one (25, 0.3, True), else the string."""
    import ast

    key, value = _spark_conf_pair(text)
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def _cmd_pipelines(args: argparse.Namespace) -> int:
    from .pipelines import get, names, ref_of

    rows = []
    for name in names():
        p = get(name)
        rows.append({"name": name, "found_by": ref_of(name) if ref_of(name) != name else "entry point",
                     "source": p.source_spec.path, "sinks": {n: s.path for n, s in p.sinks.items()},
                     "operator": p.operator_uid, "keyed": p.keyed, "generator": p.generator_fn is not None,
                     "quality": p.quality_spec is not None})
    if _json(args):
        _emit(rows)
        return 0
    for r in rows:
        extras = [w for w in ("generator", "quality") if r[w]]
        print(f"{r['name']:<16} {r['source']} -> {r['operator']} -> {', '.join(r['sinks'].values())}"
              f"  ({r['found_by']}{'; ' + ', '.join(extras) if extras else ''})")
    return 0


def _runner(args: argparse.Namespace, **kw: Any):
    from .core.decider import CheckpointConfig
    from .spark.runner import PipelineRunner

    config = CheckpointConfig(
        interval=args.interval, min_pause=args.min_pause, max_concurrent=1, timeout=args.timeout,
        retained=args.retained,
    )
    source, operator = getattr(args, "source_parallelism", None), getattr(args, "parallelism", None)
    given = [f"--{flag} {n}" for flag, n in (("source-parallelism", source), ("parallelism", operator)) if n is not None]
    pipeline = _pipeline(args.pipeline).with_parallelism(
        source=source, operator=operator, origin=" ".join(given)
    )
    mode = args.mode or ("unaligned" if pipeline.feedback else "aligned")
    return PipelineRunner(
        pipeline, args.warehouse, _spark(args), mode=mode,
        rows_per_checkpoint=args.rows_per_checkpoint, config=config, progress=_progress,
        alignment_timeout=args.alignment_timeout, stage=args.stage,
        poll_interval=getattr(args, "poll", 1.0), lagging_sources=getattr(args, "lagging_sources", 0),
        state_compact_every=getattr(args, "state_compact_every", 32),
        chaining=not getattr(args, "no_chaining", False), **kw,
    )


class RowsBar:
    """A live bar over the rows a run has to read - done, total, rate, time left - on a terminal
    (rich); the runner's progress lines print above it. ``total`` grows if more data lands."""

    def __init__(self, total: int, console: Any = None):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("[bold]reading"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"),
            TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=console, transient=False,
        )
        self.task = self.progress.add_task("rows", total=max(total, 1), rate="")

    def update(self, rows: int, seconds: float, backlog: int | None = None) -> None:
        total = rows + backlog if backlog is not None else None
        rate = f"{rows / seconds:,.0f} rows/s" if seconds > 0 else ""
        self.progress.update(self.task, completed=rows, rate=rate,
                             **({"total": max(total, rows, 1)} if total is not None else {}))

    def __enter__(self) -> "RowsBar":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()


class StepsBar:
    """A live bar over a validation's steps - each view computed, then validated - on a terminal
    (rich), naming the step in progress."""

    def __init__(self, title: str, total: int, console: Any = None):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn(f"[bold]{title}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[step]}"),
            TimeElapsedColumn(), console=console, transient=False,
        )
        self.task = self.progress.add_task(title, total=max(total, 1), step="")

    def step(self, step: str, view: str) -> None:
        self.progress.update(self.task, advance=1, step=f"{view} {step}")

    def __enter__(self) -> "StepsBar":
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.update(self.task, completed=self.progress.tasks[0].total)
        self.progress.stop()


def _bar_wanted(args: argparse.Namespace) -> bool:
    if _json(args) or not sys.stdout.isatty():
        return False  # plain lines: a log file or a pipe gets the progress messages only
    import importlib.util

    return importlib.util.find_spec("rich") is not None


def _run(args: argparse.Namespace, recover: bool = False) -> dict[str, Any]:
    """Run (or recover) the pipeline; the run's summary, printed as a line unless ``-o json``. On
    a terminal a live bar shows the rows read of the backlog, the rate and the time left."""
    runner = _runner(args, restore_checkpoint=args.checkpoint, recover=recover,
                     allow_non_restored_state=args.allow_non_restored_state)
    run = functools.partial(runner.run, until_caught_up=args.until_caught_up, max_steps=args.max_steps,
                            handle_signals=True)
    backlog = None
    if _bar_wanted(args):
        runner.open()  # the recovery, if any, says what it restored before the bar starts
        backlog = runner.backlog_rows()
    if backlog:
        started = time.monotonic()
        with RowsBar(backlog) as bar:
            summary = run(on_step=lambda s: bar.update(s.rows_in, time.monotonic() - started, runner.backlog_rows()))
    else:
        summary = run()
    rate = summary.rows_in / summary.seconds if summary.seconds else 0.0
    if not _json(args):
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


def _cmd_run(args: argparse.Namespace) -> int:
    summary = _run(args)
    if _json(args):
        _emit(summary)
    return EXIT_OK


def _cmd_recover(args: argparse.Namespace) -> int:
    if args.dry_run:  # delta-rs only: no JVM
        from .delta.inspect import recovery_preview

        preview = recovery_preview(args.warehouse, _pipeline(args.pipeline), args.checkpoint)
        if _json(args):
            _emit(preview.to_dict())
        else:
            print(preview.describe())
        return EXIT_OK
    if not args.no_validate:
        _import_in_background("great_expectations")  # the validation's imports, while the run runs
    summary = _run(args, recover=True)
    code, validations = (EXIT_OK, []) if args.no_validate else _validate(args, kinds=("restore",))
    if _json(args):
        _emit({**summary, "validations": validations})
    return code


def _cmd_savepoint(args: argparse.Namespace) -> int:
    from .core.types import CheckpointKind

    if args.stage == "keyed":
        raise ValueError("a savepoint is injected by the source stage: use --stage source or all")
    from .control import PipelineControl

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
        _progress(f"no running source step took the savepoint request within {args.request_timeout:g} s: "
                  "its process is gone; recovering and taking the savepoint here")
    checkpoint_id = _runner(args).run(max_steps=0, final_kind=CheckpointKind.SAVEPOINT).final
    done = "taken" if args.stage == "all" else "injected (it completes when the keyed stage runs)"
    return _savepoint_taken(args, checkpoint_id, done, CheckpointStatus.COMPLETED if args.stage == "all" else "injected")


def _savepoint_taken(args: argparse.Namespace, checkpoint_id: int, done: str, status: str) -> int:
    if _json(args):
        _emit({"pipeline": args.pipeline, "savepoint": checkpoint_id, "status": status})
    else:
        print(f"savepoint {checkpoint_id} {done}; retention never deletes it; "
              f"start from it with: ckpt run {args.pipeline} --checkpoint {checkpoint_id}")
    return EXIT_OK


def _cmd_checkpoints(args: argparse.Namespace) -> int:
    from .delta.store import DeltaCheckpointStore
    from .history import format_table, with_durations
    from .layout import checkpoint_root

    store = DeltaCheckpointStore.existing(checkpoint_root(args.warehouse, args.pipeline))
    if args.action == "list":
        rows = with_durations(store.checkpoints.history()[: args.limit])
        if _json(args):
            _emit([_nested_acks(r) for r in rows])
        else:
            print(format_table(rows, ["checkpoint_id", "kind", "status", "epoch", "trigger_time", "duration_ms",
                                      "state_bytes", "channel_state_rows", "alignment_ms", "unaligned",
                                      "failure_reason"]))
        return 0
    if args.id is None:
        raise ValueError("checkpoints show needs a checkpoint id")
    acks = store.checkpoints.acks(args.id)
    if _json(args):
        _emit(acks)
    else:
        print(format_table([{k: v for k, v in a.items() if k != "state"} for a in acks]))
        for a in acks:
            print(f"{a['subtask']}: {json.dumps(a['state'], default=str)}")
    return 0


def _nested_acks(row: Mapping[str, Any]) -> dict[str, Any]:
    """A history row for ``-o json``: its ``acks_json`` (the stored text) as the object ``acks``."""
    out = {k: v for k, v in row.items() if k != "acks_json"}
    text = row.get("acks_json")
    try:
        out["acks"] = json.loads(text) if text else None
    except ValueError:  # a corrupt row (``corrupt`` says so): its text, as stored
        out["acks"] = {"unreadable": text}
    return out


def _cmd_state(args: argparse.Namespace) -> int:
    """Read with delta-rs: no JVM."""
    from .delta import inspect
    from .history import format_table

    if args.key is not None and args.what != "operator":
        raise ValueError(f"--key picks a key of the operator's state: ckpt state operator {args.pipeline} --key ...")
    pipeline = _pipeline(args.pipeline)
    if args.what == "operator":
        doc = inspect.operator_state(args.warehouse, pipeline, args.checkpoint, key=args.key, limit=args.limit)
    elif args.what == "channel":
        doc = inspect.channel_state(args.warehouse, pipeline, args.checkpoint, limit=args.limit)
    else:
        doc = inspect.handles(args.warehouse, pipeline, args.checkpoint)
    if _json(args):
        _emit(doc)
        return EXIT_OK
    at = f"{doc['kind']} {doc['checkpoint_id']} (completed {_utc(doc['completed_at'])})"
    if args.what == "operator":
        versions = sorted({s["table_version"] for s in doc["subtasks"]})
        spans = [s["key_groups"] for s in doc["subtasks"]]
        print(f"operator {doc['operator']} of {doc['pipeline']} at {at}: state table "
              f"{'version' if len(versions) == 1 else 'versions'} {', '.join(map(str, versions))}, key groups "
              f"{min(lo for lo, _ in spans)}..{max(hi for _, hi in spans)} over {len(spans)} subtasks")
        which = f"key {doc['key_column']} = {doc['key']!r}: " if doc["key"] is not None else ""
        more = f"; showing the first {doc['shown']} (--limit)" if doc["shown"] < doc["keys"] else ""
        print(f"{which}{doc['keys']:,} {'key' if doc['keys'] == 1 else 'keys'}{more}")
        columns = [doc["key_column"], *[c for c in (doc["rows"][0] if doc["rows"] else {})
                                        if c not in (doc["key_column"], "subtask")], "subtask"]
        if doc["rows"]:
            print(format_table(doc["rows"], columns))
    elif args.what == "channel":
        print(f"channel state of {doc['pipeline']} at {at}: {doc['records']:,} in-flight records"
              + "".join(f"\n  {s['subtask']}: {s['rows']:,} records" for s in doc["subtasks"]))
        if doc["rows"]:
            more = f" (the first {doc['shown']}, --limit)" if doc["shown"] < doc["records"] else ""
            print(f"records{more}:")
            print(format_table(doc["rows"]))
    else:
        print(f"handles of {doc['pipeline']} at {at}")
        for subtask, state in doc["sources"].items():
            print(f"  {subtask}: offset version {state.get('version')}")
        for subtask, snapshot in doc["sinks"].items():
            pending = ", ".join(t["txn_id"] + f".e{t['epoch']}.s{t['seq']}" for t in snapshot.get("pending", []))
            print(f"  {subtask}: owns {pending or 'nothing'}; open {snapshot['current']['txn_id']}")
    return EXIT_OK


def _utc(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def _validate(args: argparse.Namespace, kinds: Sequence[str]) -> tuple[int, list[dict[str, Any]]]:
    """Run the quality suites (GX): the exit code (:data:`EXIT_QUALITY` when one failed; it is
    recorded in the pipeline's ``validations`` table either way) and one dict per suite. Their
    summaries are printed, on stderr with ``-o json``."""
    from .quality import QualityCheckFailed, validate_checkpoint, validate_restore
    from .quality.paths import check_pipeline_name, warehouse_root
    from .quality.validate import ValidationSession

    check_pipeline_name(args.pipeline)  # bad input fails before Spark starts
    warehouse_root(args.warehouse)
    from .quality.spec import get_spec
    from .quality.validate import suite_for

    run = {"restore": validate_restore, "checkpoint": validate_checkpoint}
    out = sys.stderr if _json(args) else sys.stdout
    _import_in_background("great_expectations")  # seconds of imports, while the JVM starts
    code, results = EXIT_OK, []
    spark = _spark(args)
    session = ValidationSession(spark)  # the suites share table loads and one Data Docs build
    finished = False
    try:
        for kind in kinds:
            title = f"validating {kind}"
            started = time.monotonic()
            try:
                if _bar_wanted(args):  # each view computed, then validated
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
        finished = True
    finally:
        if finished:
            session.publish()
        else:  # a suite could not run: the pages of those that did are still built, its error stands
            with contextlib.suppress(Exception):
                session.publish()
    return code, results


def _cmd_validate(args: argparse.Namespace) -> int:
    kinds = ("restore", "checkpoint") if args.suite == "all" else (args.suite,)
    code, results = _validate(args, kinds)
    if _json(args):
        _emit(results)
    return code


def _cmd_report(args: argparse.Namespace) -> int:
    from .quality import write_report

    path = write_report(args.pipeline, args.warehouse, args.out)
    if _json(args):
        _emit({"pipeline": args.pipeline, "report": str(path)})
    else:
        print(f"report: {path}")
    return 0


def _cmd_maintain(args: argparse.Namespace) -> int:
    from .maintenance import RetentionPolicy, maintain
    from .quality.paths import check_pipeline_name, warehouse_root

    check_pipeline_name(args.pipeline)  # bad input fails before Spark starts
    warehouse_root(args.warehouse)
    policy = RetentionPolicy(request_days=args.request_days, result_days=args.result_days,
                             file_retention_hours=args.file_retention_hours)
    report = maintain(args.warehouse, args.pipeline, None if args.no_spark else _spark(args), dry_run=args.dry_run,
                      policy=policy)
    if _json(args):
        _emit(report.to_dict())
    else:
        print(report.describe())
    return 0


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args.warehouse, rows=args.rows)


# --- parser ----------------------------------------------------------------------------------


def _formatter() -> type[argparse.HelpFormatter]:
    """Rich help (colours, grouped options) when rich-argparse is installed, plain otherwise."""
    try:
        from rich_argparse import RawDescriptionRichHelpFormatter

        return RawDescriptionRichHelpFormatter
    except ImportError:
        return argparse.RawDescriptionHelpFormatter


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("checkpoint_lib")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=("table", "json"), default="table",
                   help="table for people (the default) or json for machines (stdout holds the JSON alone)")
    p.add_argument("--json", dest="output", action="store_const", const="json", help=argparse.SUPPRESS)


def _add_spark(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Spark")
    g.add_argument("--master", default=None,
                   help="Spark master (local[N], spark://host:7077; default CKPT_SPARK_MASTER, else local[*])")
    g.add_argument("--spark-conf", type=_spark_conf_pair, action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for the session, e.g. spark.driver.memory=4g (repeat for more)")


def _add_warehouse(p: argparse.ArgumentParser) -> None:
    p.add_argument("--warehouse", default=DEFAULT_WAREHOUSE,
                   help=f"warehouse root (default {DEFAULT_WAREHOUSE!r}, env CKPT_WAREHOUSE)")


def _add_pipeline(p: argparse.ArgumentParser) -> None:
    p.add_argument("pipeline", help="a registered pipeline's name (ckpt pipelines lists them) or module:attr")


def _add_run_options(p: argparse.ArgumentParser) -> None:
    _add_pipeline(p)
    _add_warehouse(p)
    _add_output(p)
    _add_spark(p)
    p.add_argument("--mode", choices=MODES, default=None,
                   help="barrier handling (default aligned; unaligned for a pipeline with a cycle)")
    p.add_argument("--rows-per-checkpoint", type=_positive_int, default=DEFAULT_ROWS_PER_STEP, metavar="N",
                   help="source rows a step reads, in whole table versions; with --interval 0 each step ends with "
                        f"a checkpoint (default {DEFAULT_ROWS_PER_STEP:,})")
    p.add_argument("--interval", type=float, default=0.0, help="minimum seconds between checkpoints (default 0)")
    p.add_argument("--min-pause", type=float, default=0.0, help="seconds between a checkpoint's end and the next")
    p.add_argument("--timeout", type=float, default=3600.0, help="abort a checkpoint pending this long (s)")
    p.add_argument("--retained", type=_positive_int, default=5, help="completed checkpoints kept (default 5)")
    p.add_argument("--alignment-timeout", type=float, default=None,
                   help="aligned_with_timeout: seconds before a checkpoint switches to unaligned")
    p.add_argument("--parallelism", type=_positive_int, default=None,
                   help="subtasks of the operator after the channel (default: as declared); a change "
                        "rescales: the next start restores the latest checkpoint with state split by key group")
    p.add_argument("--source-parallelism", type=_positive_int, default=None,
                   help="source subtasks (default: as declared)")
    # a test and benchmark knob (hidden from help): the last N source subtasks' records and barrier
    # of each step reach the channel one step after the others' (barriers at different positions,
    # records in flight; unaligned checkpoints then log channel state)
    p.add_argument("--lagging-sources", type=int, default=0, metavar="N", help=argparse.SUPPRESS)
    p.add_argument("--state-compact-every", type=int, default=32, metavar="N",
                   help="OPTIMIZE the keyed state table every N flushes (its MERGEs add small files and "
                        "deletion vectors; the rows do not change). 0: never. Default 32")
    p.add_argument("--no-chaining", action="store_true",
                   help="with both stages in one process, still pass records through the persisted channel "
                        "log (as separate stage processes do) instead of chaining the source into the operator "
                        "in one Spark plan (the default when nothing lags and there is no cycle)")
    p.add_argument("--stage", choices=("all", "source", "keyed"), default="all",
                   help="run one stage as its own process (source: landing table -> channel log; keyed: "
                        "channel log -> state and sinks), or both (all, the default)")


def build_parser() -> argparse.ArgumentParser:
    from .maintenance import RetentionPolicy

    formatter = _formatter()
    epilog = "exit codes:\n" + "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_CODES.items())
    parser = argparse.ArgumentParser(
        prog="ckpt",
        description="Exactly-once checkpoints, replay and recovery for Spark pipelines.",
        epilog=epilog, formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"ckpt (checkpoint_lib) {_version()}")
    parser.add_argument("--debug", action="store_true", help="tracebacks on errors, and Spark's own log")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="tracebacks on errors, and Spark's own log")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, **kw) -> argparse.ArgumentParser:  # every sub-command: --debug, one look, the exit codes
        return sub.add_parser(name, parents=[common], formatter_class=formatter, epilog=epilog, **kw)

    p = add("setup", help="fetch the Delta Lake jars into the project cache (idempotent)")
    p.set_defaults(func=_cmd_setup)

    p = add("doctor", help="check this machine: Java, the Delta jars, the warehouse, the master, a Spark "
                                      "session with Delta, Airflow; each OK or the fix")
    _add_warehouse(p)
    p.add_argument("--master", default=None, help="Spark master to check (default: CKPT_SPARK_MASTER, else local[*])")
    p.add_argument("--no-spark", action="store_true", help="do not start Spark (the quick checks only)")
    _add_output(p)
    p.set_defaults(func=_cmd_doctor)

    p = add("simulate", help="run the in-memory simulator in every barrier mode, with a crash")
    p.add_argument("--records", type=_positive_int, default=200, help="records per source (default 200)")
    p.add_argument("--seed", type=int, default=7, help="random seed of the schedule (default 7)")
    p.set_defaults(func=_cmd_simulate)

    p = add("pipelines", help="list the registered pipelines (entry point group checkpoint_lib.pipelines)")
    _add_output(p)
    p.set_defaults(func=_cmd_pipelines)

    p = add("generate", help="append generated input to a pipeline's landing table")
    _add_pipeline(p)
    _add_warehouse(p)
    p.add_argument("--rows", type=_positive_int, required=True, help="rows to append (one new table version)")
    p.add_argument("--bad-fraction", type=_fraction, default=0.0, help="fraction of bad rows (0..1)")
    p.add_argument("--seed", type=int, default=None, help="random seed")
    p.add_argument("--option", type=_generator_option, action="append", metavar="KEY=VALUE",
                   help="an option of the pipeline's generator (repeat for more), e.g. accounts=25")
    p.add_argument("--accounts", type=_positive_int, default=None, help="shorthand of --option accounts=N")
    p.add_argument("--skew", type=_fraction, default=None, help="shorthand of --option skew=F (transfers: the "
                   "fraction sent from one hot account, a slow bank subtask)")
    _add_spark(p)
    p.set_defaults(func=_cmd_generate)

    p = add("run", help="run a pipeline (recovering first if its last run crashed)")
    _add_run_options(p)
    p.add_argument("--until-caught-up", action="store_true", default=True,
                   help="stop when everything appended so far is processed and committed (the default)")
    p.add_argument("--follow", dest="until_caught_up", action="store_false",
                   help="keep running: poll for new input every --poll seconds until interrupted")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between polls with --follow (default 1)")
    p.add_argument("--max-steps", type=_positive_int, default=None, help="stop after this many source steps")
    p.add_argument("--checkpoint", type=_positive_int, default=None, help="start from this checkpoint or savepoint")
    p.add_argument("--allow-non-restored-state", action="store_true",
                   help="drop state of operators the pipeline no longer has")
    p.set_defaults(func=_cmd_run)

    p = add("recover", help="restore the latest (or a chosen) checkpoint, re-commit, replay, go on")
    _add_run_options(p)
    p.add_argument("--checkpoint", type=_positive_int, default=None, help="checkpoint id (default: latest)")
    p.add_argument("--dry-run", action="store_true",
                   help="only print the recovery plan: per sink the version now and the one it rolls back to, per "
                        "operator the state restored, per source the rows to replay (delta-rs: no JVM)")
    p.add_argument("--no-validate", action="store_true",
                   help="skip the after-restore data-quality validation (Great Expectations)")
    p.add_argument("--allow-non-restored-state", action="store_true",
                   help="drop state of operators the pipeline no longer has")
    p.set_defaults(func=_cmd_recover, until_caught_up=True, max_steps=None)

    p = add("savepoint", help="take a savepoint: a checkpoint the user owns")
    _add_run_options(p)
    p.add_argument("--request-timeout", type=_non_negative, default=120.0,
                   help="a running pipeline is asked to take it at its next step; if none does within this "
                        "many seconds (its process is gone), recover and take it here (0: never ask, default 120)")
    p.set_defaults(func=_cmd_savepoint)

    p = add("checkpoints", help="list checkpoints or show one")
    p.add_argument("action", choices=("list", "show"))
    _add_pipeline(p)
    p.add_argument("id", nargs="?", type=_positive_int, help="checkpoint id (show)")
    _add_warehouse(p)
    p.add_argument("--limit", type=_positive_int, default=50)
    _add_output(p)
    p.set_defaults(func=_cmd_checkpoints)

    p = add("state", help="show operator state, channel state or offsets at a checkpoint (delta-rs: no JVM)")
    p.add_argument("what", choices=("operator", "channel", "handles"))
    _add_pipeline(p)
    _add_warehouse(p)
    p.add_argument("--checkpoint", type=_positive_int, default=None, help="checkpoint id (default: latest)")
    p.add_argument("--key", default=None, help="operator: only this key's state (compared as text)")
    p.add_argument("--limit", type=_positive_int, default=20, help="rows shown at most (default 20)")
    _add_output(p)
    p.set_defaults(func=_cmd_state)

    p = add("validate", help="run the data-quality suites (Great Expectations) on a checkpoint")
    _add_pipeline(p)
    _add_warehouse(p)
    p.add_argument("--checkpoint", type=_positive_int, default=None, help="checkpoint id (default: latest completed)")
    p.add_argument("--suite", choices=("all", "restore", "checkpoint"), default="all",
                   help="after-restore suite, per-checkpoint suite, or both (default)")
    p.add_argument("--verbose", action="store_true", help="list every expectation, not only failures")
    _add_output(p)
    _add_spark(p)
    p.set_defaults(func=_cmd_validate)

    p = add("report", help="write the self-contained HTML report (charts, validations, restores)")
    _add_pipeline(p)
    _add_warehouse(p)
    p.add_argument("--out", default=None, help="output file (default W/_quality/<pipeline>/report.html)")
    _add_output(p)
    p.set_defaults(func=_cmd_report)

    p = add(
        "maintain",
        help="delete what no retained checkpoint or savepoint needs (old control rows, markers, requests, "
             "validation results, channel state, removed files); safe while the pipeline runs",
    )
    _add_pipeline(p)
    _add_warehouse(p)
    p.add_argument("--dry-run", action="store_true", help="decide and report, delete nothing")
    p.add_argument("--no-spark", action="store_true",
                   help="control plane only: skip the rules that need Spark (channel state, VACUUM of the "
                        "channel logs, staging and state tables)")
    defaults = RetentionPolicy()
    p.add_argument("--request-days", type=_non_negative, default=defaults.request_days,
                   help="keep decided checkpoint requests this many days (default %(default)g)")
    p.add_argument("--result-days", type=_non_negative, default=defaults.result_days,
                   help="keep validation results that name no checkpoint this many days (default %(default)g)")
    p.add_argument("--file-retention-hours", type=_non_negative, default=defaults.file_retention_hours,
                   help="keep files a commit removed this many hours in every table (default %(default)g); the "
                        "state tables also keep every file a retained checkpoint's version needs")
    _add_output(p)
    _add_spark(p)
    p.set_defaults(func=_cmd_maintain)

    p = add("demo", help="the end-to-end demo: generate, run, kill -9, recover, verify")
    _add_warehouse(p)
    p.add_argument("--rows", type=_positive_int, default=200_000, help="payments to generate (default 200000)")
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    global _json_stdout
    parser = build_parser()
    try:  # shell completion: eval "$(register-python-argcomplete ckpt)"
        import argcomplete

        argcomplete.autocomplete(parser)
    except ImportError:
        pass
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    _json_stdout = _json(args)
    if debug:  # Spark's own log profile, for this process and the ones it starts
        os.environ.setdefault("CKPT_SPARK_LOG", "spark")
    from .core.errors import CheckpointError

    try:
        _resolve_pipeline(args)
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return code
    except BrokenPipeError:
        return _pipe_closed()
    except KeyboardInterrupt:
        print("ckpt: interrupted", file=sys.stderr)
        return 130
    except (CheckpointError, ValueError, LookupError, FileNotFoundError) as exc:
        if debug:
            raise
        print(f"ckpt: error: {_message(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as exc:  # noqa: BLE001 - a clear message; the traceback with --debug
        if debug:
            raise
        print(f"ckpt: error: {type(exc).__name__}: {_message(exc)}\n  (run again with --debug for the traceback)",
              file=sys.stderr)
        return EXIT_FAILED


def _pipe_closed() -> int:
    """The reader of stdout went away (``ckpt ... | head``): what it read was all it wanted, so
    this is a success; stdout is pointed at /dev/null so the interpreter's last flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is no file (a test's buffer)
        pass
    return EXIT_OK


MAX_ERROR_LINES = 20


def _message(exc: BaseException) -> str:
    """An exception's whole message (a refusal lists every problem, one per line), without a JVM's
    stack frames (``at org.apache...``, ``--debug`` has them), at most :data:`MAX_ERROR_LINES`."""
    lines = [line.rstrip() for line in str(exc).strip().splitlines()
             if line.strip() and not line.strip().startswith(("at ", "... "))] or [type(exc).__name__]
    if len(lines) > MAX_ERROR_LINES:
        lines = lines[:MAX_ERROR_LINES] + [f"... {len(lines) - MAX_ERROR_LINES} more lines (--debug shows them)"]
    return "\n".join(lines[:1] + [line if line[:1].isspace() else "  " + line for line in lines[1:]])


if __name__ == "__main__":
    sys.exit(main())

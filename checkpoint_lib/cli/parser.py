"""``ckpt``'s arguments: the argument types (a whole number >= 1, a fraction, ``KEY=VALUE``...), the
option groups the sub-commands share (``--warehouse``, ``-o table|json``, the Spark options, a run's
options), and :func:`build_parser`, which wires each sub-command to its command function. Rich help
when rich-argparse is installed; every sub-command's help ends with the exit codes."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..core.decider import DEFAULT_ROWS_PER_STEP
from ..core.types import MODES
from .admin import cmd_doctor, cmd_generate, cmd_maintain, cmd_setup, cmd_simulate
from .inspecting import cmd_checkpoints, cmd_graph, cmd_pipelines, cmd_report, cmd_state
from .output import EXIT_CODES
from .running import cmd_demo, cmd_recover, cmd_run, cmd_savepoint
from .validating import cmd_validate

DEFAULT_WAREHOUSE = os.environ.get("CKPT_WAREHOUSE", "warehouse")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def stage_name(text: str) -> str:
    """``--stage``: a name (a linear pipeline's all, source or keyed; a graph's all or vertex id),
    checked against the pipeline when it runs."""
    from ..layout import check_name

    try:
        return check_name("stage", text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} must be within 0..1")
    return value


def _spark_conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key.strip(), value


def _generator_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``, the value a Python literal when it is one (25, 0.3, True), else the string."""
    import ast

    key, value = _spark_conf_pair(text)
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


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
    p.add_argument("--state-compact-every", type=int, default=None, metavar="N",  # None: 32
                   help="fold the keyed state table's runs every N flushes (each flush appends the rows of the "
                        "keys it changed; folding keeps one row per key, the state does not change). "
                        "0: only when the runs outgrow the state. Default 32")
    p.add_argument("--no-chaining", action="store_true",
                   help="with both stages in one process, still pass records through the persisted channel "
                        "log (as separate stage processes do) instead of chaining the source into the operator "
                        "in one Spark plan (the default when nothing lags and there is no cycle); a graph's "
                        "every edge through its channel log, as the per-vertex layout's processes have them")
    p.add_argument("--stage", type=stage_name, default="all", metavar="STAGE",
                   help="run one stage as its own process (source: landing table -> channel log; keyed: "
                        "channel log -> state and sinks), or both (all, the default); of a dataflow graph: all "
                        "(every vertex in one process) or a process group of its per-vertex layout (an operator's "
                        "id, or its sources': every edge into and out of it through a channel log)")


def build_parser() -> argparse.ArgumentParser:
    from ..maintenance import RetentionPolicy

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
    p.set_defaults(func=cmd_setup)

    p = add("doctor", help="check this machine: Java, the Delta jars, the warehouse, the master, a Spark "
                                      "session with Delta, Airflow; each OK or the fix")
    _add_warehouse(p)
    p.add_argument("--master", default=None, help="Spark master to check (default: CKPT_SPARK_MASTER, else local[*])")
    p.add_argument("--no-spark", action="store_true", help="do not start Spark (the quick checks only)")
    _add_output(p)
    p.set_defaults(func=cmd_doctor)

    p = add("simulate", help="run the in-memory simulator in every barrier mode, with a crash")
    p.add_argument("--records", type=_positive_int, default=200, help="records per source (default 200)")
    p.add_argument("--seed", type=int, default=7, help="random seed of the schedule (default 7)")
    p.set_defaults(func=cmd_simulate)

    p = add("pipelines", help="list the registered pipelines (entry point group checkpoint_lib.pipelines)")
    _add_output(p)
    p.set_defaults(func=cmd_pipelines)

    p = add("graph", help="draw a pipeline's dataflow graph: vertices with their parallelism, edges with their "
                          "partitioning and key, sinks and dead letters (no JVM)")
    p.add_argument("graph_ref", metavar="pipeline",  # not resolved as a runnable pipeline: a graph may be drawn
                   help="a registered pipeline's or graph's name, or module:attr of a Pipeline or of a dataflow Graph")
    p.add_argument("-o", "--output", choices=("text", "dot", "json"), default="text",
                   type=lambda v: "text" if v == "table" else v,  # the other commands' word for people, accepted
                   help="text for people (the default), dot for Graphviz (ckpt graph P -o dot | dot -Tsvg > P.svg), "
                        "or json for machines")
    p.add_argument("--layout", choices=("chained", "per_vertex"), default=None,
                   help="also draw how it runs in that layout: its process groups (the names --stage takes) and "
                        "each edge chained or cut by a channel log, and why (json: under \"plan\")")
    p.add_argument("--json", dest="output", action="store_const", const="json", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_graph)

    p = add("generate", help="append generated input to a pipeline's (or a graph's) landing tables")
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
    p.set_defaults(func=cmd_generate)

    p = add("run", help="run a pipeline or a dataflow graph (recovering first if its last run crashed)")
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
    p.set_defaults(func=cmd_run)

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
    p.set_defaults(func=cmd_recover, until_caught_up=True, max_steps=None)

    p = add("savepoint", help="take a savepoint: a checkpoint the user owns")
    _add_run_options(p)
    p.add_argument("--request-timeout", type=_non_negative, default=120.0,
                   help="a running pipeline is asked to take it at its next step; if none does within this "
                        "many seconds (its process is gone), recover and take it here (0: never ask, default 120)")
    p.set_defaults(func=cmd_savepoint)

    p = add("checkpoints", help="list checkpoints or show one (per vertex of the pipeline's graph, then per subtask)")
    p.add_argument("action", choices=("list", "show"))
    _add_pipeline(p)
    p.add_argument("id", nargs="?", type=_positive_int, help="checkpoint id (show)")
    _add_warehouse(p)
    p.add_argument("--limit", type=_positive_int, default=50)
    _add_output(p)
    p.set_defaults(func=cmd_checkpoints)

    p = add("state", help="show operator state, channel state or offsets at a checkpoint (delta-rs: no JVM)")
    p.add_argument("what", choices=("operator", "channel", "handles"))
    _add_pipeline(p)
    _add_warehouse(p)
    p.add_argument("--checkpoint", type=_positive_int, default=None, help="checkpoint id (default: latest)")
    p.add_argument("--uid", default=None,
                   help="operator: the uid of the keyed operator to show (a graph's; default: a linear pipeline's "
                        "operator, or a graph's only keyed operator)")
    p.add_argument("--key", default=None, help="operator: only this key's state (compared as text)")
    p.add_argument("--limit", type=_positive_int, default=20, help="rows shown at most (default 20)")
    _add_output(p)
    p.set_defaults(func=cmd_state)

    p = add("validate", help="run the data-quality suites (Great Expectations) on a checkpoint")
    _add_pipeline(p)
    _add_warehouse(p)
    p.add_argument("--checkpoint", type=_positive_int, default=None, help="checkpoint id (default: latest completed)")
    p.add_argument("--suite", choices=("all", "restore", "checkpoint"), default="all",
                   help="after-restore suite, per-checkpoint suite, or both (default)")
    p.add_argument("--verbose", action="store_true", help="list every expectation, not only failures")
    _add_output(p)
    _add_spark(p)
    p.set_defaults(func=cmd_validate)

    p = add("report", help="write the self-contained HTML report (charts, validations, restores)")
    _add_pipeline(p)
    _add_warehouse(p)
    p.add_argument("--out", default=None, help="output file (default W/_quality/<pipeline>/report.html)")
    _add_output(p)
    p.set_defaults(func=cmd_report)

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
    p.set_defaults(func=cmd_maintain)

    p = add("demo", help="the end-to-end demo: generate, run, kill -9, recover, verify")
    _add_warehouse(p)
    p.add_argument("--rows", type=_positive_int, default=200_000, help="payments to generate (default 200000)")
    p.set_defaults(func=cmd_demo)
    return parser

# PYTHON_ARGCOMPLETE_OK
"""``ckpt``: the command line of checkpoint_lib.

Every sub-command has ``--help``. Engine-backed commands import their engines lazily, so
``ckpt --help`` works with the core alone. Exit codes (:data:`EXIT_CODES`): 0 success, 1 a run or
check failed, 2 bad arguments, 3 a clear user error (unknown pipeline, checkpoint or warehouse,
an incompatible snapshot...), 4 a data-quality suite failed. An error is one line on stderr;
``--debug`` shows the traceback (and Spark's own log).

This module is :func:`main` (the ``ckpt`` console script; ``python -m checkpoint_lib.cli`` runs
``__main__.py``). The rest, one role a module: ``parser.py`` (the arguments, :func:`build_parser`),
``output.py`` (exit codes, JSON, progress, errors, the live bars), ``context.py`` (the pipeline and
the Spark session the arguments name), and the commands: ``running.py`` (run, recover, savepoint,
demo), ``inspecting.py`` (pipelines, graph, checkpoints, state, report: no JVM), ``validating.py``
(validate, and recover's after-restore suites), ``admin.py`` (setup, doctor, simulate, generate,
maintain).
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from . import context
from .output import (EXIT_CODES, EXIT_FAILED, EXIT_OK, EXIT_QUALITY, EXIT_USAGE, EXIT_USER_ERROR, MAX_ERROR_LINES,
                     RowsBar, StepsBar, bar_wanted, emit, error_message, set_json_stdout, wants_json)
from .parser import DEFAULT_WAREHOUSE, build_parser

__all__ = ["main", "build_parser", "DEFAULT_WAREHOUSE", "EXIT_CODES", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE",
           "EXIT_USER_ERROR", "EXIT_QUALITY", "MAX_ERROR_LINES", "RowsBar", "StepsBar", "bar_wanted", "emit"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:  # shell completion: eval "$(register-python-argcomplete ckpt)"
        import argcomplete

        argcomplete.autocomplete(parser)
    except ImportError:
        pass
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    set_json_stdout(wants_json(args))
    if debug:  # Spark's own log profile, for this process and the ones it starts
        os.environ.setdefault("CKPT_SPARK_LOG", "spark")
    from ..core.errors import CheckpointError

    try:
        context.resolve_pipeline(args)
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
        print(f"ckpt: error: {error_message(exc)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as exc:  # noqa: BLE001 - a clear message; the traceback with --debug
        if debug:
            raise
        print(f"ckpt: error: {type(exc).__name__}: {error_message(exc)}\n  (run again with --debug for the traceback)",
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

"""What a ``ckpt`` command gives back: its exit code (:data:`EXIT_CODES`), its one JSON document
(``-o json``, :func:`emit`), its progress lines, an error as the lines a person reads
(:func:`error_message`), and on a terminal the live bars (:class:`RowsBar`, :class:`StepsBar`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_USER_ERROR, EXIT_QUALITY = 0, 1, 2, 3, 4
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILED: "a run or check failed",
    EXIT_USAGE: "bad arguments",
    EXIT_USER_ERROR: "a clear user error: unknown pipeline, checkpoint or warehouse, incompatible snapshot, bad input",
    EXIT_QUALITY: "a data-quality suite (Great Expectations) failed",
}
MAX_ERROR_LINES = 20
_json_stdout = False  # -o json: stdout holds the JSON alone; progress goes to stderr


def set_json_stdout(on: bool) -> None:
    """Whether stdout holds this process's JSON alone (``-o json``): :func:`progress` then writes
    to stderr."""
    global _json_stdout
    _json_stdout = on


def progress(message: str) -> None:
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}", file=sys.stderr if _json_stdout else sys.stdout,
          flush=True)


def wants_json(args: argparse.Namespace) -> bool:
    return getattr(args, "output", "table") == "json"


def _json_value(value: Any) -> Any:
    """What ``-o json`` writes for a value JSON has no type for: a time as ISO 8601, bytes as hex,
    anything else (a Decimal, a path) as its text."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return str(value)


def emit(document: Any) -> None:
    """``-o json``: the command's one JSON document on stdout (nested objects, never JSON in a
    string); everything else a command says goes to stderr."""
    print(json.dumps(document, indent=2, default=_json_value), flush=True)


def error_message(exc: BaseException) -> str:
    """An exception's whole message (a refusal lists every problem, one per line), without a JVM's
    stack frames (``at org.apache...``, ``--debug`` has them), at most :data:`MAX_ERROR_LINES`."""
    lines = [line.rstrip() for line in str(exc).strip().splitlines()
             if line.strip() and not line.strip().startswith(("at ", "... "))] or [type(exc).__name__]
    if len(lines) > MAX_ERROR_LINES:
        lines = lines[:MAX_ERROR_LINES] + [f"... {len(lines) - MAX_ERROR_LINES} more lines (--debug shows them)"]
    return "\n".join(lines[:1] + [line if line[:1].isspace() else "  " + line for line in lines[1:]])


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


def bar_wanted(args: argparse.Namespace) -> bool:
    if wants_json(args) or not sys.stdout.isatty():
        return False  # plain lines: a log file or a pipe gets the progress messages only
    import importlib.util

    return importlib.util.find_spec("rich") is not None

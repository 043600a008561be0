"""The benchmarks' results log: every measured row, one JSON line each, in ``bench/results.jsonl``
(committed with the code it measured).

A full ``make bench`` takes longer than any one sitting (20M events through six contenders is
hours on 2 cores), so a run must be able to stop and go on later. Each row is appended, and
flushed to disk, as soon as its contender's outputs were checked against the floor. A run with
``--resume`` skips what the log already holds for the same configuration, and the tables of
``docs/benchmarks.md`` are rendered from the log, not from one process's memory. A row that was
being measured when the process died is simply not there: it is measured again.

A row names its section, its **configuration** (what must match for two rows to share a table:
``events``, ``rows_per_checkpoint``, ``accounts``), who ran (``contender``), its figures, and where
and when it ran (``commit``, ``measured_at``, ``machine``, ``command``). Ratios are never stored:
they are computed when rendering, against the floor of the same configuration.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

DEFAULT = Path(__file__).resolve().parent / "results.jsonl"
CONFIG_KEYS = ("events", "rows_per_checkpoint", "accounts")


def git_commit(cwd: str | Path | None = None) -> str:
    """The code that ran: ``git rev-parse --short HEAD`` (``+`` when checkpoint_lib/ has changes
    not committed), or ``unknown`` outside a checkout."""
    cwd = str(cwd or Path(__file__).resolve().parent.parent)
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=cwd).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "checkpoint_lib"], capture_output=True,
                               text=True, check=True, cwd=cwd).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


def config_of(row: Mapping[str, Any]) -> tuple:
    return tuple(row.get(k) for k in CONFIG_KEYS)


class ResultsLog:
    """Append-only JSON lines. Appends are whole lines written with one ``write`` and fsynced; a
    torn last line (the process died inside the write) is ignored when reading. With ``path``
    None nothing is written or read: rows are stamped alone (``make bench-quick``)."""

    def __init__(self, path: str | Path | None = DEFAULT, *, commit: str | None = None, machine: str = "",
                 command: str = ""):
        self.path = None if path is None else Path(path)
        self.commit = commit if commit is not None else git_commit()
        self.machine = machine
        self.command = command

    def rows(self, section: str | None = None) -> list[dict]:
        if self.path is None or not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn append: that row is measured again
            if isinstance(row, dict) and (section is None or row.get("section") == section):
                out.append(row)
        return out

    def stamped(self, section: str, row: Mapping[str, Any]) -> dict:
        """``row`` with where and when it was measured, as the log keeps it (a quick run's rows get
        the same stamp without being logged)."""
        return {
            "section": section, **row, "commit": self.commit,
            "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "machine": self.machine, "command": self.command,
        }

    def append(self, section: str, row: Mapping[str, Any]) -> dict:
        full = self.stamped(section, row)
        if self.path is None:
            return full
        line = json.dumps(full, sort_keys=True, default=_plain) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            if f.tell() and not self.path.read_bytes().endswith(b"\n"):
                line = "\n" + line  # after a torn line: start a fresh one
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        return full

    def find(self, section: str, config: tuple, contender: str) -> dict | None:
        """The latest row of ``contender`` in ``section`` with this configuration."""
        hits = [r for r in self.rows(section) if config_of(r) == config and r.get("contender") == contender]
        return hits[-1] if hits else None


def latest_by_config(rows: Iterable[Mapping[str, Any]]) -> dict[tuple, dict[str, dict]]:
    """``{configuration: {contender: its latest row}}``, configurations in first-seen order."""
    out: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        out.setdefault(config_of(r), {})[r["contender"]] = dict(r)
    return out


def ranked_with_ratios(rows: list[dict], order: list[str], against: Mapping[str, str]) -> list[dict]:
    """``rows`` by configuration, then in contender ``order`` (a contender not in it last), each
    with ``events_per_s`` and, for every ``{key: contender}`` of ``against``, its time / that
    contender's latest time of the same configuration (None without one)."""
    rank = {c: i for i, c in enumerate(order)}
    latest = latest_by_config(rows)
    out = []
    for r in sorted(rows, key=lambda r: (config_of(r), rank.get(r["contender"], len(order)))):
        same = latest[config_of(r)]
        out.append({**r, "events_per_s": r["events"] / r["seconds"],
                    **{key: r["seconds"] / same[c]["seconds"] if c in same else None for key, c in against.items()}})
    return out


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return str(value)

"""Log retention: the Delta logs of the state tables (cleaned below what is pinned, without a commit)
and of the control tables (their log retention set, then Delta's own clean-up)."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any, Sequence

from ..core.cas import commit_on_snapshot
from ..files import FileStat, Files, Location, files_at
from ..layout import location
from .context import Context, delta_tables
from .control import REWRITE_ATTEMPTS, control_tables
from .data_plane import pinned_state_versions
from .report import FILES, RuleOutcome


class _Exhausted(Exception):
    """Every attempt to change a table's properties lost to a concurrent commit (their number)."""


_LOG_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d+)\.(\d+))?\.parquet$")


def log_checkpoints(table: Location | str, names: Sequence[str] | None = None) -> list[int]:
    """Versions of ``table`` with a complete Delta log checkpoint (one file, or every part of a
    multi-part one), ascending, from the ``names`` in its ``_delta_log`` (default: listed). V2
    checkpoints are not counted (never treated as a start)."""
    if names is None:
        names = files_at(table).names(location(table) / "_delta_log")
    single: set[int] = set()
    parts: dict[tuple[int, int], set[int]] = defaultdict(set)
    for name in names:
        m = _LOG_CHECKPOINT.match(name)
        if m is None:
            continue
        if m.group(2) is None:
            single.add(int(m.group(1)))
        else:
            parts[(int(m.group(1)), int(m.group(3)))].add(int(m.group(2)))
    complete = single | {v for (v, n), got in parts.items() if got == set(range(1, n + 1))}
    return sorted(complete)


def state_logs(ctx: Context) -> None:
    """Each state table's Delta log keeps its 100-year retention (time travel to a savepoint needs
    it, and changing it is a commit on the table), so Delta never cleans it up. This rule does what
    Delta's clean-up would, below what is pinned: with P the oldest version a protected or pending
    checkpoint pins, and C the newest complete log checkpoint at or before P, every log file of a
    version below C goes (once older than the VACUUM window, for readers in flight). Every version
    from C on stays reproducible (C's checkpoint and the commits after it), so a restore of any
    retained checkpoint or savepoint, a running MERGE and a stopped stage resuming read what they
    read before; no commit is made on the table."""
    cutoff, files = ctx.file_cutoff, ctx.files
    for table in delta_tables(files, ctx.root / "state"):
        log_dir = table / "_delta_log"
        outcome = ctx.add(RuleOutcome("delta log", ctx.rel(log_dir), FILES))
        pinned = pinned_state_versions(ctx.store, ctx.needs, table.name)
        if not pinned:
            outcome.skipped = "no protected or pending checkpoint pins a version of it"
            continue
        oldest = min(pinned.values())
        listed = files.entries(log_dir)  # one listing, with sizes and times
        start = max((v for v in log_checkpoints(table, [n for n, _ in listed]) if v <= oldest), default=None)
        if start is None:
            outcome.skipped = f"no log checkpoint at or before version {oldest}, the oldest pinned"
            continue
        outcome.keeps = (f"the log checkpoint of version {start} and every commit after it (version {oldest} is "
                         "the oldest a protected or pending checkpoint pins)")
        doomed = _log_files_below(listed, start, cutoff)
        outcome.deleted, outcome.kept = len(doomed), len(listed) - len(doomed)
        outcome.bytes_freed = sum(size for _, size in doomed)
        if not ctx.dry_run:
            for name, _ in sorted(doomed):  # oldest first: a gap never opens above what is left
                files.delete(log_dir / name)


_LOG_FILE = re.compile(r"^(\d{20})\.(json|crc|checkpoint(\.\d+\.\d+)?\.parquet)$")


def _log_retention(hours: float) -> str:
    return f"interval {int(math.ceil(hours * 60))} minutes"


def _expired_log_files(files: Files, table: Location, cutoff: float) -> list[tuple[str, int]]:
    """Commit files Delta's log clean-up takes (name, size): older than ``cutoff`` and below the
    latest log checkpoint (a reader starts from that checkpoint; nothing before it is read)."""
    log_dir = table / "_delta_log"
    try:
        last = int((files.read_json(log_dir / "_last_checkpoint") or {})["version"])
    except (ValueError, KeyError, TypeError):  # no log checkpoint yet, or not one we can read
        return []
    return _log_files_below(files.entries(log_dir), last, cutoff)


def _log_files_below(listed: Sequence[tuple[str, FileStat]], version: int, cutoff: float) -> list[tuple[str, int]]:
    """Of a ``_delta_log`` listing, the log files of versions below ``version`` written before
    ``cutoff`` (name, size): what a log clean-up that starts readers at ``version`` may delete."""
    return [(name, stat.size) for name, stat in listed
            if (m := _LOG_FILE.match(name)) and int(m.group(1)) < version and stat.modification_time / 1000 < cutoff]


def control_logs(ctx: Context) -> None:
    """The control tables' Delta logs: their log retention is set to ``control_log_hours`` and
    their deleted-file retention (the tombstones each log checkpoint repeats) to the VACUUM window
    (one metadata commit per table, once; every writer of these tables retries a commit that lost a
    race), and Delta's own clean-up deletes the commit files older than that, below the latest log
    checkpoint. Nothing reads a control table's history; every read starts at its latest log
    checkpoint."""
    from deltalake import CommitProperties, DeltaTable
    from deltalake.exceptions import CommitFailedError

    # the tombstones Delta keeps in each log checkpoint: those of files older than the VACUUM
    # window are of files this maintenance deletes anyway (Delta's default: 7 days, the same)
    wanted = {"delta.logRetentionDuration": _log_retention(ctx.policy.control_log_hours),
              "delta.deletedFileRetentionDuration": _log_retention(ctx.policy.file_retention_hours)}
    cutoff = ctx.wall - math.ceil(ctx.policy.control_log_hours * 60) * 60
    for path, dt in control_tables(ctx):
        outcome = ctx.add(RuleOutcome("delta log", ctx.rel(path / "_delta_log"), FILES,
                                      keeps=f"commit files of the last {ctx.policy.control_log_hours:g} h, and every one "
                                            "from the latest log checkpoint on"))
        expired = _expired_log_files(ctx.files, path, cutoff)
        outcome.deleted = len(expired)
        outcome.bytes_freed = sum(size for _, size in expired)
        listed = set(ctx.files.names(path / "_delta_log"))
        if ctx.dry_run:
            outcome.kept = len(listed) - len(expired)
            continue

        def retention(dt: Any) -> None:
            config = dt.metadata().configuration or {}
            if not all(config.get(k) == v for k, v in wanted.items()):
                dt.alter.set_table_properties(wanted, commit_properties=CommitProperties(max_commit_retries=0))

        try:
            commit_on_snapshot(lambda: DeltaTable(str(path)), retention, lost=CommitFailedError,
                               attempts=REWRITE_ATTEMPTS, exhausted=_Exhausted)
        except _Exhausted as exc:
            outcome.skipped = f"could not set the log retention: {exc} commits lost to concurrent writers"
            continue
        DeltaTable(str(path)).cleanup_metadata()  # (a commit's own hook may have cleaned up already)
        after = set(ctx.files.names(path / "_delta_log"))
        outcome.deleted, outcome.kept = len(listed - after), len(after)

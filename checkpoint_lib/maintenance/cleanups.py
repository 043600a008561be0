"""The files a pipeline accumulates beside its tables: the checkpoint-id reservation markers (and
the legacy epoch and session ones), the "checkpoint now" request files, and the GX validation
results and Data Docs pages of old runs."""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

from ..core.retention import Needs
from ..files import Files, Location, files_at, fsync_dir
from ..layout import reservation_markers
from .context import Context, du, relative_parts
from .report import MARKERS, REQUESTS, RUNS, RuleOutcome

_RUN_CHECKPOINT = re.compile(r"-c(\d+)-e")
_RUN_TIME = "%Y%m%dT%H%M%S.%fZ"
_MARKER = re.compile(r"^\d{20}$")


def _unlink(files: Files, path: Location, dry_run: bool, size: int | None = None) -> int:
    """Delete one file (unless ``dry_run``); returns its size (``size`` if a listing gave it, else
    asked; 0 if it was gone already)."""
    if size is None:
        try:
            size = files.stat(path).size
        except FileNotFoundError:
            return 0
    if not dry_run:
        files.delete(path)
    return size


def _sync(folder: Location) -> None:
    """Make deletions in ``folder`` durable: a directory fsync on a filesystem; an object store's
    DELETE is durable once answered."""
    if isinstance(folder, Path):
        fsync_dir(folder)


def delete_markers(ctx: Context) -> None:
    needs, files = ctx.needs, ctx.files
    ids_dir = reservation_markers(ctx.root, "ids")
    outcome = ctx.add(RuleOutcome("id markers", ctx.rel(ids_dir), MARKERS,
                                  keeps=f"markers of ids >= {needs.floor} (the counter starts above the largest "
                                        f"id in the table, {needs.max_id}, which is kept)"))
    kept = 0
    for name, stat in files.entries(ids_dir):
        if _MARKER.match(name) and int(name) < needs.floor:
            outcome.bytes_freed += _unlink(files, ids_dir / name, ctx.dry_run, stat.size)
            outcome.deleted += 1
        else:
            kept += 1
    outcome.kept = kept
    if not ctx.dry_run and outcome.deleted:
        _sync(ids_dir)
    legacy = ctx.add(RuleOutcome("legacy markers", ctx.rel(ctx.root), MARKERS, kept=0,
                                 keeps="none: epochs and sessions are no longer reserved with marker files"))
    for namespace in ("epochs", "sessions"):
        directory = reservation_markers(ctx.root, namespace)
        if not files.is_dir(directory):
            continue
        for _path, stat in files.walk_entries(directory):
            legacy.bytes_freed += stat.size
            legacy.deleted += 1
        if not ctx.dry_run:
            files.delete_tree(directory)


def delete_requests(ctx: Context) -> None:
    from ..checkpoint_requests import REQUEST_ID, CheckpointRequests

    files = ctx.files
    requests = CheckpointRequests(ctx.root)
    cutoff = ctx.now - ctx.policy.request_days * 86400
    outcome = ctx.add(RuleOutcome("requests", ctx.rel(requests.directory), REQUESTS, kept=0,
                                  keeps=f"open requests, and decided ones made in the last {ctx.policy.request_days:g} days"))
    listed = dict(files.entries(requests.directory))  # one listing, with sizes and times
    if not listed:
        return
    names = set(listed)

    def size(name: str) -> int | None:
        return listed[name].size if name in listed else None

    for name in sorted(names):
        if not name.endswith(".request"):
            continue
        request_id = name[: -len(".request")]
        request = requests.get(request_id) if REQUEST_ID.match(request_id) else None
        if request is None or request.state == "requested" or request.requested_at >= cutoff:
            outcome.kept = (outcome.kept or 0) + 1
            continue
        # the request first: without it the outcome is ignored (open() lists requests), whereas an
        # outcome deleted first would show the request as open and a source step would honour it again
        outcome.bytes_freed += _unlink(files, requests.directory / name, ctx.dry_run, size(name))
        outcome.bytes_freed += _unlink(files, requests.directory / f"{request_id}.outcome", ctx.dry_run,
                                       size(f"{request_id}.outcome"))
        outcome.deleted += 1
    for name in sorted(names):  # an outcome whose request went (a maintenance killed in between)
        if name.endswith(".outcome") and f"{name[: -len('.outcome')]}.request" not in names:
            outcome.bytes_freed += _unlink(files, requests.directory / name, ctx.dry_run, size(name))
        elif name.startswith(".") and name.endswith(".tmp"):  # a writer killed before its link (on a filesystem)
            # by the clock, never a simulated now: a writer's file in flight is seconds old
            if listed[name].modification_time / 1000 < ctx.wall - max(ctx.policy.request_days * 86400, 3600):
                outcome.bytes_freed += _unlink(files, requests.directory / name, ctx.dry_run, size(name))
    if not ctx.dry_run and outcome.deleted:
        _sync(requests.directory)


def _gx_runs(files: Files, base: Location, suffix: str) -> dict[tuple[str, ...], list[tuple[str, str, Location]]]:
    """``<base>/<suite path...>/<run name>/<run time>/<file><suffix>``: per suite path, its runs as
    ``(run time, run name, run-time directory)``."""
    runs: dict[tuple[str, ...], dict[Location, tuple[str, str, Location]]] = defaultdict(dict)
    for path in files.walk(base):
        if not str(path).endswith(suffix):
            continue
        parts = relative_parts(path, base)
        if len(parts) < 4:
            continue
        run_dir = path.parent
        runs[tuple(parts[:-3])][run_dir] = (parts[-2], parts[-3], run_dir)
    return {suite: sorted(found.values()) for suite, found in runs.items()}


def delete_gx_runs(ctx: Context) -> None:
    needs = ctx.needs
    cutoff = ctx.now - ctx.policy.result_days * 86400
    files = files_at(ctx.quality)  # GX works on a local folder, whatever the warehouse
    kinds = (("gx results", ctx.quality / "gx" / "uncommitted" / "validations", ".json"),
             ("data docs pages", ctx.quality / "data_docs" / "validations", ".html"))
    for rule, base, suffix in kinds:
        outcome = ctx.add(RuleOutcome(rule, ctx.rel(base), RUNS, kept=0,
                                      keeps="runs on protected ids and ids at or above the floor, the newest run of "
                                            f"each suite's view, runs naming no checkpoint for {ctx.policy.result_days:g} days"))
        for suite, runs in _gx_runs(files, base, suffix).items():
            for i, (run_time, run_name, run_dir) in enumerate(runs):
                if i == len(runs) - 1 or not _gx_run_droppable(needs, run_name, run_time, cutoff):
                    outcome.kept = (outcome.kept or 0) + 1
                    continue
                outcome.deleted += 1
                outcome.bytes_freed += du(run_dir)
                if not ctx.dry_run:
                    files.delete_tree(run_dir)
                    if isinstance(run_dir, Path):  # a filesystem keeps the folders a run emptied
                        _rmdir_empty(run_dir.parent, stop=base)


def _gx_run_droppable(needs: Needs, run_name: str, run_time: str, cutoff: float) -> bool:
    m = _RUN_CHECKPOINT.search(run_name)
    if m is not None:
        return needs.droppable(int(m.group(1)))
    try:
        when = datetime.strptime(run_time, _RUN_TIME).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return False  # not a run of ours: leave it
    return when < cutoff


def _rmdir_empty(directory: Path, *, stop: Path) -> None:
    while directory != stop and stop in directory.parents:
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent

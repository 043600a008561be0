"""Bounded growth: one retention rule for everything a pipeline accumulates, tied to what the
retained checkpoints and savepoints still need.

A year of hourly runs otherwise leaves, under ``<warehouse>/_checkpoints/<p>`` and
``<warehouse>/_quality/<p>``, one reservation marker and a few rows of the ``checkpoints``,
``acks`` and ``sessions`` tables per checkpoint (read whole on every checkpoint), a request file per
snapshot run, a GX result and a Data Docs page per validation, the channel state of every unaligned
checkpoint, and every file a DELETE, MERGE or OPTIMIZE of the channel logs, staging tables and the
state table ever removed (the state table keeps removed files for 100 years, so that what a
checkpoint pins stays readable). :func:`maintain` applies the rules below; ``ckpt maintain`` and the
``<pipeline>_maintenance`` DAG run it.

What the retained checkpoints need (:class:`Needs`, read first)
---------------------------------------------------------------
- **retained**: ``store.checkpoints.all()`` of a reader (no retention of its own: exactly what the writers
  recorded), so every savepoint, and a checkpoint that retention evicted but a crash left unmarked.
- **protected ids**: the retained ones, every pending one, every unreadable completed one (a
  recovery rolls the sinks back below it and discards it), the checkpoint the newest finished
  restore restored (the after-restore suite reads its acks and pinned state), the target of an owed
  rollback, and the largest id ever written (the id counter starts above it).
- **the floor**: the oldest retained regular checkpoint (savepoints excluded: one kept for ever must
  not pin everything after it), lowered to the oldest pending one and to the largest id. Only ids
  below the floor that are not protected are dropped: each is aborted or discarded, at least one
  newer checkpoint completed after it, so no live process writes it again.

The rules (each says in the report what it kept, what it deleted, or why it skipped)
------------------------------------------------------------------------------------
- ``checkpoints``, ``acks``, ``sessions``, ``validations`` rows: rewritten by one overwrite placed
  exactly on top of the snapshot it decided on (delta-rs ``max_commit_retries=0``): if anyone
  committed in between, nothing of ours lands and the rule reads and decides again, so a concurrent
  append is never lost. The decision is remade on every snapshot. ``checkpoints``: every row of a
  protected id or of an id at or above the floor. ``acks``: the acks of checkpoints still pending (a
  completed row repeats its acks). ``sessions``: every row of the newest epoch that finished
  restoring and of later ones (an owed rollback is always among them), and within those epochs, per
  stage, the last session, the last ended one and any session that started and never ended: what
  resuming, ``begin_session`` and ``owed_rollback`` read. ``validations``: rows of protected ids or
  ids at or above the floor, rows without a checkpoint younger than ``result_days``, and the newest
  row of each kind. Epoch fences (Delta application transactions) survive an overwrite.
- ``_ids/`` markers below the floor: the counter starts at 1 + the largest id in the table, which
  is kept, so it never probes below; the legacy ``_epochs/`` and ``_sessions/`` markers are read by
  nothing.
- request files honoured or cancelled (final: created with ``link``) and made more than
  ``request_days`` ago; the ``.request`` goes first, so a half-deleted request is never open again.
- GX validation results and their Data Docs pages of runs on ids below the floor that are not
  protected (runs without a checkpoint id: older than ``result_days``), never the newest run of a
  suite's view. The Data Docs index drops the links at the next validation (GX rebuilds it from
  the results that remain).
- ``channel_state`` rows of ids below the floor that are not protected (a Spark DELETE; a
  concurrent append is a blind append, which Delta never conflicts with).
- VACUUM of the channel logs, the staging tables and ``channel_state``: files removed more than
  ``file_retention_hours`` ago (restores rewrite the channel logs from the cut and read only the
  latest staging and channel state, so no older version is needed; the window protects readers
  and writers in flight). The state tables: Delta VACUUM goes by time, so the window reaches back to
  the commit of the oldest version a protected checkpoint (or pending one) pins, and
  ``pinned_margin_hours`` before it (a file that version needs was removed by a later commit, whose
  remove is stamped no earlier than that commit began), and at least to the newest restore. Delta 4
  ignores ``RETAIN n HOURS`` unless n is 0 (it then uses the table's own retention, 100 years on the
  state table) and rounds n to the nearest hour, so our VACUUMs run with
  ``vacuum.retentionWindowIgnore.enabled`` off and the window rounded up to whole hours; also with
  the duration check off and without VACUUM's own log commits (a new state version would make a
  stopped keyed stage recover). A table with no file outside its latest version older than the
  window gets no VACUUM (no Spark job).
- the state tables' Delta logs: they keep the 100-year log retention that time travel to an old
  savepoint needs (lowering it would take a metadata commit, which fails a running MERGE and moves
  the version a stopped keyed stage resumes at), so Delta never cleans them. The rule does what
  Delta's clean-up would, below what is pinned, without a commit: the log files of versions below
  the newest complete log checkpoint at or before the oldest pinned version, once older than
  ``file_retention_hours``. Every version from that checkpoint on stays reproducible.
- the control tables' removed files (delta-rs VACUUM, ``full``: also files of commits that lost a
  race), older than ``file_retention_hours``.
- the control tables' Delta logs: their ``delta.logRetentionDuration`` is set to
  ``control_log_hours`` and ``delta.deletedFileRetentionDuration`` to ``file_retention_hours`` (the
  tombstones every log checkpoint repeats; one metadata commit per table, once; every writer of
  these tables retries a commit that lost a race), and Delta's log clean-up deletes older commit
  files below the latest log checkpoint. Nothing reads a control table's history, and every load
  lists the whole log.

Not touched: sink tables and the dead-letter table (the user's), the source manifest (append-only),
``epochs`` (a row per recovery), and the Delta logs of the channel logs and staging (cleaned by
Delta after 30 days).

``dry_run=True`` decides everything the same way and deletes nothing. Spark (``spark=``) is needed
for the data-plane rules only; without it they are reported as skipped.

On an object store (``s3://bucket/prefix``) the rules are the same: files are listed, aged and
deleted through :mod:`checkpoint_lib.files` (one listing gives names, sizes and times; ages come
from ``Last-Modified``, whole seconds, which windows of hours and days do not notice), the control
tables go through delta-rs and the data plane through Spark's S3A, both on the URI. GX works in this
machine's working copy (:func:`~checkpoint_lib.quality.paths.quality_root`), so the GX runs are
deleted there and leave the bucket's Data Docs at the next publish. A store that ignores
conditional puts is refused before the first overwrite, as every writer refuses it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence
from urllib.parse import unquote

from .core.cas import commit_on_snapshot
from .files import FileStat, Files, Location, files_at, fsync_dir
from .history import human_bytes
from .layout import (
    CONTROL_TABLES, below, channel_state_table, checkpoint_root, control_table, location, reservation_markers,
    warehouse_location,
)
from .layout import check_pipeline_name as validate_pipeline_name
from .objectstore import is_remote, verify_conditional_put
from .quality.paths import quality_root

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .delta.store import DeltaCheckpointStore

log = logging.getLogger(__name__)

__all__ = ["MaintenanceReport", "Needs", "RetentionPolicy", "RuleOutcome", "maintain"]

_REWRITE_ATTEMPTS = 60
_RUN_CHECKPOINT = re.compile(r"-c(\d+)-e")
_RUN_TIME = "%Y%m%dT%H%M%S.%fZ"
_MARKER = re.compile(r"^\d{20}$")

ROWS, FILES, MARKERS, REQUESTS, RUNS = "rows", "files", "markers", "requests", "runs"


@dataclass(frozen=True)
class RetentionPolicy:
    """The time windows of the rules (everything else is decided by what checkpoints need)."""

    request_days: float = 7.0
    """Honoured or cancelled checkpoint requests made longer ago are deleted (a retried Airflow
    task finds its own request by run id well within it)."""
    result_days: float = 7.0
    """Validation rows and GX runs that name no checkpoint (a validation that failed before it
    knew one) are deleted after this long."""
    file_retention_hours: float = 168.0
    """A file some commit removed stays this long in every table (Delta's default, 7 days): a
    reader of an older snapshot, or a writer whose files are not committed yet, may still use it."""
    pinned_margin_hours: float = 24.0
    """The state tables' VACUUM window starts this long before the commit of the oldest pinned
    version (transactions that began before that commit, clock skew between hosts)."""
    control_log_hours: float = 48.0
    """The control tables' Delta commit files are kept this long (Delta's default is 30 days, and
    every table load lists them all); nothing reads a control table's history."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 or math.isnan(value):
                raise ValueError(f"RetentionPolicy.{name} must be a number >= 0, got {value!r}")


@dataclass
class RuleOutcome:
    """What one rule did to one target (or would do, in a dry run)."""

    rule: str
    target: str
    """Relative to the warehouse."""
    unit: str
    deleted: int = 0
    kept: int | None = None
    bytes_freed: int = 0
    keeps: str = ""
    """What it keeps, and why that is all anyone needs."""
    skipped: str | None = None
    """Why the rule did nothing (it could not be sure, or had nothing to work on)."""
    retries: int = 0
    """Rewrites: how often a concurrent commit refused ours, so it read and decided again."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Needs:
    """What the retained checkpoints and savepoints (and the live pipeline) still need."""

    retained: list[int] = field(default_factory=list)
    savepoints: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    corrupt: list[int] = field(default_factory=list)
    restored: int | None = None
    """The checkpoint the newest finished restore restored (None: none, or from scratch)."""
    restored_epoch: int | None = None
    restored_at: float | None = None
    owed_rollback: int | None = None
    max_id: int = 0
    floor: int = 0
    protected: set[int] = field(default_factory=set)

    def droppable(self, checkpoint_id: int | None) -> bool:
        """Whether nothing needs what belongs to ``checkpoint_id`` any more."""
        return checkpoint_id is not None and checkpoint_id < self.floor and checkpoint_id not in self.protected

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["protected"] = sorted(self.protected)
        return d


@dataclass
class MaintenanceReport:
    pipeline: str
    warehouse: str
    dry_run: bool
    started_at: float
    finished_at: float | None = None
    needs: Needs | None = None
    oldest_pinned_state: dict[str, Any] = field(default_factory=dict)
    """Per state table: the oldest pinned version, its commit time and the VACUUM window (hours)."""
    bytes_before: int = 0
    bytes_after: int = 0
    rules: list[RuleOutcome] = field(default_factory=list)

    @property
    def deleted(self) -> int:
        return sum(r.deleted for r in self.rules)

    @property
    def skipped(self) -> list[RuleOutcome]:
        return [r for r in self.rules if r.skipped]

    def rule(self, rule: str, target: str | None = None) -> RuleOutcome:
        """The outcome of ``rule`` (on ``target``: a path relative to the warehouse)."""
        for r in self.rules:
            if r.rule == rule and (target is None or r.target == target):
                return r
        raise KeyError(f"no outcome of rule {rule!r}{'' if target is None else f' on {target!r}'}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline, "warehouse": self.warehouse, "dry_run": self.dry_run,
            "started_at": self.started_at, "finished_at": self.finished_at,
            "needs": None if self.needs is None else self.needs.to_dict(),
            "oldest_pinned_state": self.oldest_pinned_state, "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after, "rules": [r.to_dict() for r in self.rules],
        }

    def describe(self) -> str:
        """A readable summary: what the checkpoints need, then one line per rule."""
        from .history import format_table

        n = self.needs
        verb = "would delete" if self.dry_run else "deleted"
        lines = [f"maintenance of {self.pipeline} in {self.warehouse}" + (" (DRY RUN: nothing deleted)" if self.dry_run else "")]
        if n is not None:
            lines.append(
                f"retained {_ids(n.retained)} (savepoints {_ids(n.savepoints)}), pending {_ids(n.pending)}, "
                f"unreadable {_ids(n.corrupt)}, restored by the newest restore: {n.restored}, owed rollback: "
                f"{n.owed_rollback}, largest id {n.max_id}; ids below {n.floor} that none of these need are dropped"
            )
        for table, pin in sorted(self.oldest_pinned_state.items()):
            lines.append(f"state {table}: {pin.get('note', '')}")
        rows = [{"rule": r.rule, "target": r.target, verb: r.deleted, "kept": r.kept, "unit": r.unit,
                 "freed": human_bytes(r.bytes_freed) if r.bytes_freed else "",
                 "note": r.skipped and f"SKIPPED: {r.skipped}" or r.keeps} for r in self.rules]
        lines.append(format_table(rows, ["rule", "target", verb, "kept", "unit", "freed", "note"]))
        lines.append(f"pipeline directories: {human_bytes(self.bytes_before)} before, {human_bytes(self.bytes_after)} after")
        return "\n".join(lines)


def _ids(values: Sequence[int]) -> str:
    values = list(values)
    if len(values) > 8:
        return f"[{values[0]}..{values[-1]}] ({len(values)})"
    return str(values)


# --- the entry point --------------------------------------------------------------------------


def maintain(
    warehouse: str | os.PathLike[str],
    pipeline_name: str,
    spark: "SparkSession | None" = None,
    *,
    dry_run: bool = False,
    now: float | None = None,
    policy: RetentionPolicy | None = None,
) -> MaintenanceReport:
    """Apply every retention rule (see the module docstring) to pipeline ``pipeline_name`` in
    ``warehouse`` and return what each did. Safe while the pipeline runs: each rule deletes only what
    nothing retained needs and nobody writes any more, and skips (saying why) when it cannot be sure.

    ``spark``: the data-plane rules (channel state, VACUUM of the Spark tables) need it; without,
    they are skipped. ``dry_run``: decide, count, delete nothing. ``now`` (seconds since the epoch,
    default the clock): the instant the ages of request files and of validation results that name
    no checkpoint are measured from (tests and benchmarks simulate time with it). The VACUUM windows
    are always measured on the clock: Delta stamps removed files with the clock, and a window shorter
    than a commit in flight would delete that commit's new files. ``policy``: the time windows."""
    name = validate_pipeline_name(pipeline_name)
    policy = policy or RetentionPolicy()
    wall = time.time()
    now = wall if now is None else float(now)
    warehouse = warehouse_location(warehouse)
    root = checkpoint_root(warehouse, name)
    files = files_at(root)
    quality = quality_root(warehouse, name)  # GX's folder: on this machine (a working copy for a remote warehouse)
    report = MaintenanceReport(name, warehouse, dry_run, wall)
    report.bytes_before = _du(root) + _du(quality)
    if not files.is_dir(root):
        report.rules.append(RuleOutcome("everything", _rel(root, warehouse), ROWS,
                                        skipped="the pipeline has no checkpoint store here (never ran)"))
        report.finished_at = time.time()
        return report
    if is_remote(warehouse) and not dry_run:
        # the rewrites' compare-and-swap is delta-rs's conditional put of the commit file: never
        # overwrite a table on a store that ignores it (checked once per process, as the store does)
        verify_conditional_put(str(root))
    from .delta.store import DeltaCheckpointStore

    store = DeltaCheckpointStore(str(root))  # a reader: no retention of its own, creates nothing
    ctx = _Context(store, files, location(warehouse), root, quality, policy, now, wall, dry_run, report)
    report.needs = needs = read_needs(store)
    log.info("maintenance of %s: %s", name, needs.to_dict())

    rules: list[Callable[[], None]] = [
        lambda: _rewrite_acks(ctx),  # before the checkpoints rows go: it reads their statuses
        lambda: _rewrite_checkpoints(ctx),
        lambda: _rewrite_sessions(ctx),
        lambda: _rewrite_validations(ctx),
        lambda: _delete_markers(ctx),
        lambda: _delete_requests(ctx),
        lambda: _delete_gx_runs(ctx),
        lambda: _data_plane(ctx, spark),
        lambda: _state_logs(ctx),
        lambda: _vacuum_control_tables(ctx),
        lambda: _control_logs(ctx),
    ]
    for rule in rules:
        rule()
    report.bytes_after = _du(root) + _du(quality)
    report.finished_at = time.time()
    return report


@dataclass
class _Context:
    store: "DeltaCheckpointStore"
    files: Files
    """The files of the checkpoint root (local, or on the object store); ``quality`` is always local."""
    warehouse: Location
    root: Location
    quality: Path
    policy: RetentionPolicy
    now: float
    wall: float
    dry_run: bool
    report: MaintenanceReport

    @property
    def needs(self) -> Needs:
        assert self.report.needs is not None
        return self.report.needs

    def add(self, outcome: RuleOutcome) -> RuleOutcome:
        self.report.rules.append(outcome)
        if outcome.skipped:
            log.info("maintenance %s on %s skipped: %s", outcome.rule, outcome.target, outcome.skipped)
        return outcome

    def rel(self, path: Location | str) -> str:
        return _rel(path, self.warehouse)

    def hours_back_to(self, cutoff: float) -> float:
        """The retention of a VACUUM that deletes only files removed before ``cutoff`` (wall-clock
        seconds), in hours before now on the clock."""
        return max(0.0, (self.wall - cutoff) / 3600.0)

    @property
    def file_cutoff(self) -> float:
        """Files removed before this instant may go: always measured on the clock (files and Delta
        commits carry wall-clock times), never on a simulated ``now``."""
        return self.wall - self.policy.file_retention_hours * 3600


def _rel(path: Location | str, warehouse: Location | str) -> str:
    """``path`` relative to the warehouse (as given when it lies elsewhere: GX's working copy of a
    remote warehouse)."""
    if is_remote(str(path)) or is_remote(str(warehouse)):
        try:
            return below(path, warehouse)
        except ValueError:
            return str(path)
    for base in (Path(warehouse), Path(warehouse).resolve()):  # quality_root resolves symbolic links
        try:
            return str(Path(path).relative_to(base))
        except ValueError:
            continue
    return str(path)


# --- what is needed --------------------------------------------------------------------------


def read_needs(store: "DeltaCheckpointStore", view: Any = None, sessions: Sequence[Mapping[str, Any]] | None = None,
               *, from_sessions: Needs | None = None) -> Needs:
    """What the checkpoints of ``store`` need, from ``view`` (a :class:`~checkpoint_lib.delta.checkpoint_table.CheckpointsView`; default: a fresh
    read) and the ``sessions`` rows (default: a fresh read; or copied ``from_sessions``)."""
    from .core.types import CheckpointKind, CheckpointStatus

    view = store.checkpoints.table.view() if view is None else view
    needs = Needs()
    needs.retained = [c.checkpoint_id for c in view.kept]
    needs.savepoints = [c.checkpoint_id for c in view.kept if c.kind is CheckpointKind.SAVEPOINT]
    needs.pending = sorted(i for i, r in view.effective.items() if r["status"] == CheckpointStatus.PENDING)
    needs.corrupt = sorted(view.corrupt)
    needs.max_id = max(view.rows_by_id, default=0)
    if from_sessions is not None:
        needs.restored, needs.restored_epoch = from_sessions.restored, from_sessions.restored_epoch
        needs.restored_at, needs.owed_rollback = from_sessions.restored_at, from_sessions.owed_rollback
    else:
        if sessions is None:
            sessions = store.sessions.table.rows()
        _sessions_needs(needs, sessions)
    regular = [c.checkpoint_id for c in view.kept if c.kind is not CheckpointKind.SAVEPOINT]
    candidates = [min(regular, default=None), min(needs.pending, default=None), needs.max_id or None]
    needs.floor = min((c for c in candidates if c is not None), default=0)
    needs.protected = {*needs.retained, *needs.pending, *needs.corrupt, needs.max_id}
    needs.protected |= {i for i in (needs.restored, needs.owed_rollback) if i}
    return needs


def _sessions_needs(needs: Needs, rows: Sequence[Mapping[str, Any]]) -> None:
    """The newest finished restore and an owed rollback, as the runner and the store read them."""
    from .delta.sessions import RESTORED, ROLLBACK

    restored = [r for r in rows if r["event"] == RESTORED]
    if restored:
        epoch = max(r["epoch"] for r in restored)
        first = min((r for r in restored if r["epoch"] == epoch), key=lambda r: (r["recorded_at"], r["session"]))
        needs.restored_epoch, needs.restored_at = int(epoch), float(first["recorded_at"])
        needs.restored = None if first["checkpoint_id"] is None else int(first["checkpoint_id"])
    rollbacks = [r for r in rows if r["event"] == ROLLBACK]
    if rollbacks:  # DeltaCheckpointStore.owed_rollback, on the same rows
        last = max(rollbacks, key=lambda r: (r["epoch"], r["recorded_at"]))
        if not any(r["event"] == RESTORED and r["epoch"] >= last["epoch"] for r in rows):
            needs.owed_rollback = int(last["checkpoint_id"])


# --- compare-and-swap rewrites of the control tables -------------------------------------------


class _Exhausted(Exception):
    """Every attempt to change a table's properties lost to a concurrent commit (their number)."""


def _table_schema(dt: Any):
    import pyarrow as pa

    return pa.schema(dt.schema().to_arrow())


def rewrite(
    load: Callable[[], Any],
    read: Callable[[Any], list[dict[str, Any]]],
    decide: Callable[[list[dict[str, Any]]], list[dict[str, Any]] | None],
    *,
    dry_run: bool = False,
    before_commit: Callable[[], None] | None = None,
) -> tuple[int, int, int]:
    """Replace a Delta table's rows by ``decide(rows)`` in ONE overwrite placed exactly on top of
    the snapshot the rows were read from: delta-rs with ``max_commit_retries=0`` refuses the commit
    when anyone committed since, and then the table is read and decided again (nothing of ours is
    visible; a concurrent append is never lost). ``decide`` returns the rows to keep, or None when
    nothing is to go. Returns ``(dropped, kept, retries)``. ``before_commit`` runs between the decision and
    the commit (tests use it to race the rewrite)."""
    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake
    from deltalake.exceptions import CommitFailedError

    def attempt(dt: Any) -> tuple[int, int]:
        if dt is None:
            return 0, 0
        rows = read(dt)
        keep = decide(rows)
        if keep is None or len(keep) == len(rows):
            return 0, len(rows)
        if dry_run:
            return len(rows) - len(keep), len(keep)
        if before_commit is not None:
            before_commit()
        write_deltalake(dt, pa.Table.from_pylist(keep, schema=_table_schema(dt)), mode="overwrite",
                        commit_properties=CommitProperties(max_commit_retries=0))
        return len(rows) - len(keep), len(keep)

    (dropped, kept), retries = commit_on_snapshot(
        load, attempt, lost=CommitFailedError, attempts=_REWRITE_ATTEMPTS,
        exhausted=lambda n: RuntimeError(f"{n} attempts to rewrite a control table lost to concurrent writers"))
    return dropped, kept, retries


def _store_rewrite(ctx: _Context, name: str, decide: Callable[[Any, list[dict[str, Any]]], list[dict[str, Any]] | None],
                   keeps: str) -> RuleOutcome:
    store = ctx.store
    snapshot: dict[str, Any] = {}

    def read(dt: Any) -> list[dict[str, Any]]:
        snapshot["dt"] = dt
        return store.table(name).rows(dt)

    dropped, kept, retries = rewrite(store.table(name).load, read, lambda rows: decide(snapshot["dt"], rows),
                                     dry_run=ctx.dry_run)
    return ctx.add(RuleOutcome(f"{name} rows", ctx.rel(control_table(ctx.root, name)), ROWS, dropped, kept, keeps=keeps,
                               retries=retries))


def _rewrite_checkpoints(ctx: _Context) -> None:
    base = ctx.needs

    def decide(dt: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        # decided again on the very snapshot the overwrite lands on (a concurrent completion,
        # pending row or discard is part of it); the restore and rollback come from the sessions
        needs = read_needs(ctx.store, ctx.store.checkpoints.table.view(dt), from_sessions=base)
        keep = [r for r in rows if not needs.droppable(r["checkpoint_id"])]
        return keep if len(keep) < len(rows) else None

    _store_rewrite(ctx, "checkpoints", decide,
                   "every row of a retained, pending, unreadable, restored or owed checkpoint, of the "
                   "largest id, and of every id at or above the floor")


def _rewrite_acks(ctx: _Context) -> None:
    from .core.types import CheckpointStatus

    def decide(dt: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        view = ctx.store.checkpoints.table.view()  # statuses only move forward: one that is final stays final
        needs = read_needs(ctx.store, view, from_sessions=ctx.needs)

        def needed(r: Mapping[str, Any]) -> bool:
            row = view.effective.get(r["checkpoint_id"])
            if row is None:  # no status row: in flight (the pending row comes first), or long gone
                return not needs.droppable(r["checkpoint_id"])
            return row["status"] == CheckpointStatus.PENDING

        keep = [r for r in rows if needed(r)]
        return keep if len(keep) < len(rows) else None

    _store_rewrite(ctx, "acks", decide, "acks of checkpoints still pending (a completed row repeats all its acks)")


def sessions_to_keep(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The session rows resuming, ``begin_session``, ``end_session`` and ``owed_rollback`` read:
    every row of the newest epoch that finished restoring and of later epochs, except the start and
    end rows of sessions that ended and are neither the last session of their stage nor the last
    one that ended. Everything when no epoch finished restoring."""
    from .delta.sessions import ALL_STAGES, END, RESTORED, START

    restored = [r["epoch"] for r in rows if r["event"] == RESTORED]
    if not restored:
        return list(rows)
    newest = max(restored)
    events: dict[tuple[int, str], dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    for r in rows:
        if r["epoch"] >= newest and r["stage"] != ALL_STAGES:
            events[(r["epoch"], r["stage"])][r["session"]].add(r["event"])
    needed: dict[tuple[int, str], set[int]] = {}
    for key, sessions in events.items():
        ended = [s for s, ev in sessions.items() if END in ev]
        live_or_odd = {s for s, ev in sessions.items() if ev != {START, END}}
        needed[key] = {max(sessions), *([max(ended)] if ended else []), *live_or_odd}
    return [r for r in rows if r["epoch"] >= newest
            and (r["stage"] == ALL_STAGES or r["session"] in needed[(r["epoch"], r["stage"])])]


def _rewrite_sessions(ctx: _Context) -> None:
    def decide(dt: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        keep = sessions_to_keep(rows)
        return list(keep) if len(keep) < len(rows) else None

    _store_rewrite(ctx, "sessions", decide,
                   "rows of the newest epoch that finished restoring and later ones (restores, rollbacks); "
                   "per stage the last session, the last ended one, any that never ended")


def _rewrite_validations(ctx: _Context) -> None:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    path = control_table(ctx.root, "validations")
    cutoff = ctx.now - ctx.policy.result_days * 86400

    def load() -> Any:
        try:
            return DeltaTable(str(path))
        except TableNotFoundError:
            return None

    def read(dt: Any) -> list[dict[str, Any]]:
        return dt.to_pyarrow_table().to_pylist()

    def decide(rows: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        needs = read_needs(ctx.store, from_sessions=ctx.needs)  # ids only grow: a fresh read is safe
        newest: dict[str, dict[str, Any]] = {}
        for r in rows:
            if r["kind"] not in newest or r["finished_at"] > newest[r["kind"]]["finished_at"]:
                newest[r["kind"]] = r
        keep_ids = {r["validation_id"] for r in newest.values()}

        def needed(r: Mapping[str, Any]) -> bool:
            if r["validation_id"] in keep_ids:
                return True
            if r["checkpoint_id"] is None:
                return r["finished_at"] >= cutoff
            return not needs.droppable(r["checkpoint_id"])

        keep = [r for r in rows if needed(r)]
        return keep if len(keep) < len(rows) else None

    dropped, kept, retries = rewrite(load, read, decide, dry_run=ctx.dry_run)
    ctx.add(RuleOutcome("validations rows", ctx.rel(path), ROWS, dropped, kept, retries=retries,
                        keeps="validations of protected ids and ids at or above the floor, the newest of each "
                              f"kind, those naming no checkpoint for {ctx.policy.result_days:g} days"))


# --- files: markers, requests, GX results --------------------------------------------------


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


def _relative_parts(path: Location, base: Location) -> list[str]:
    """The segments of ``path`` below ``base`` (both a Path or both an object-store URI)."""
    return below(path, base).split("/")


def _delete_markers(ctx: _Context) -> None:
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


def _delete_requests(ctx: _Context) -> None:
    from .checkpoint_requests import REQUEST_ID, CheckpointRequests

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
        parts = _relative_parts(path, base)
        if len(parts) < 4:
            continue
        run_dir = path.parent
        runs[tuple(parts[:-3])][run_dir] = (parts[-2], parts[-3], run_dir)
    return {suite: sorted(found.values()) for suite, found in runs.items()}


def _delete_gx_runs(ctx: _Context) -> None:
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
                outcome.bytes_freed += _du(run_dir)
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


# --- the data plane (Spark) -----------------------------------------------------------------


def _delta_tables(files: Files, directory: Location) -> list[Location]:
    """The Delta tables directly under ``directory`` (sorted by name)."""
    return [directory / name for name in files.names(directory) if files.is_dir(directory / name / "_delta_log")]


def _data_plane(ctx: _Context, spark: "SparkSession | None") -> None:
    files = ctx.files
    channel_state = channel_state_table(ctx.root)
    logs = _delta_tables(files, ctx.root / "channels")
    staging = _delta_tables(files, ctx.root / "staging")
    states = _delta_tables(files, ctx.root / "state")
    has_channel_state = files.is_dir(channel_state / "_delta_log")
    others = [*logs, *staging, *([channel_state] if has_channel_state else [])]
    if spark is None:
        why = "no Spark session: the data-plane rules need one (ckpt maintain without --no-spark)"
        ctx.add(RuleOutcome("channel_state rows", ctx.rel(channel_state), ROWS, skipped=why))
        for table in [*others, *states]:
            ctx.add(RuleOutcome("vacuum", ctx.rel(table), FILES, skipped=why))
        return
    if has_channel_state:
        _delete_channel_state(ctx, spark, channel_state)
    cutoff = ctx.file_cutoff
    for table in others:
        _vacuum_spark(ctx, spark, table, ctx.hours_back_to(cutoff),
                      f"files removed in the last {ctx.policy.file_retention_hours:g} h (restores read the latest "
                      "version only)")
    for table in states:
        _vacuum_state(ctx, spark, table, cutoff)


def _delete_channel_state(ctx: _Context, spark: "SparkSession", path: Location) -> None:
    from pyspark.sql import functions as F

    from .spark import tables

    needs = ctx.needs
    keeps = "the channel state of protected ids and of ids at or above the floor"
    protected = sorted(i for i in needs.protected if i < needs.floor)
    condition = F.col("checkpoint_id") < F.lit(needs.floor)
    if protected:
        condition = condition & ~F.col("checkpoint_id").isin(protected)
    counts = spark.read.format("delta").load(str(path)).agg(
        F.count(F.lit(1)).alias("rows"), F.count(F.when(condition, 1)).alias("doomed")).first()
    doomed = int(counts["doomed"])
    ctx.add(RuleOutcome("channel_state rows", ctx.rel(path), ROWS, doomed, int(counts["rows"]) - doomed,
                                  keeps=keeps))
    if doomed and not ctx.dry_run:
        # a concurrent append of a new checkpoint's channel state is a blind append: Delta never
        # lets it conflict with (or be undone by) this DELETE; a conflict of ours is planned again
        tables.retry_conflicts(lambda: tables.delete_where(spark, str(path), condition),
                               f"maintenance: DELETE of old channel state in {path}")


_VACUUM_SETTINGS = {
    # our window is honoured: Delta 4 ignores ``RETAIN n HOURS`` unless n is 0 and uses the table's
    # deleted-file retention instead (100 years on the state table, so nothing would ever go)
    "spark.databricks.delta.vacuum.retentionWindowIgnore.enabled": "false",
    # the window is ours, computed from what is pinned
    "spark.databricks.delta.retentionDurationCheck.enabled": "false",
    # no VACUUM START/END commits: a new state version would make a stopped keyed stage recover
    # (it resumes only at its own version)
    "spark.databricks.delta.vacuum.logging.enabled": "false",
}


def _vacuum_spark(ctx: _Context, spark: "SparkSession", table: Location, hours: float, keeps: str) -> RuleOutcome:
    """VACUUM ``table`` keeping files removed less than ``hours`` ago, rounded up to whole hours.
    A table with no file old enough to go (none outside its latest version older than the window:
    VACUUM takes nothing younger) gets no VACUUM at all; a dry run lists what would go."""
    from .spark import tables

    outcome = ctx.add(RuleOutcome("vacuum", ctx.rel(table), FILES, keeps=keeps))
    # Delta rounds RETAIN to the NEAREST whole hour (0.4 h would keep nothing): round up ourselves
    hours = math.ceil(hours)
    before = _data_files(ctx.files, table)
    outcome.kept = len(before)
    if not _may_vacuum(table, before, ctx.wall - hours * 3600):
        return outcome
    quoted = str(table).replace("`", "``")
    with tables.session_confs(spark, _VACUUM_SETTINGS):
        if ctx.dry_run:
            listed = [r[0] for r in spark.sql(f"VACUUM delta.`{quoted}` RETAIN {hours} HOURS DRY RUN").collect()]
            gone = {_file_key(p) for p in listed} & set(before)  # files (the listing also names empty directories)
        else:
            spark.sql(f"VACUUM delta.`{quoted}` RETAIN {hours} HOURS").collect()
            gone = set(before) - set(_data_files(ctx.files, table))
    outcome.deleted = len(gone)
    outcome.bytes_freed = sum(before[p].size for p in gone)
    outcome.kept = len(before) - len(gone)
    return outcome


def _file_key(uri: str) -> str:
    """One spelling of a file's location, whoever names it: a local path normalized (Spark says
    ``file:/x``, delta-rs ``file:///x`` or ``/x``), an object-store URI as it is, but ``s3a://`` as
    ``s3://`` (the scheme a warehouse is given in)."""
    if is_remote(uri):
        return "s3://" + uri[len("s3a://"):] if uri.startswith("s3a://") else uri
    for prefix in ("file://", "file:"):
        if uri.startswith(prefix):
            uri = uri[len(prefix):]
            break
    return os.path.normpath(uri)


def _data_files(files: Files, table: Location) -> dict[str, FileStat]:
    """Every file of a Delta table outside its log and hidden files (what VACUUM considers), by
    :func:`_file_key`, with its size and time (one listing)."""
    out = {}
    for path, stat in files.walk_entries(table):
        if not any(part.startswith(("_", ".")) for part in _relative_parts(path, table)):
            out[_file_key(str(path))] = stat
    return out


def _may_vacuum(table: Location, files: Mapping[str, FileStat], cutoff: float) -> bool:
    """False only when VACUUM surely deletes nothing: every file not in the latest version was
    written after ``cutoff`` (VACUUM deletes only files older than its window). Saves a Spark job
    per table on most days."""
    from deltalake import DeltaTable

    try:
        live = {_file_key(unquote(u)) for u in DeltaTable(str(table)).file_uris()}
    except Exception:  # delta-rs cannot read this table's log: let Delta decide
        return True
    return any(path not in live and stat.modification_time / 1000 < cutoff for path, stat in files.items())


def pinned_state_versions(store: "DeltaCheckpointStore", needs: Needs, operator: str) -> dict[int, int]:
    """Checkpoint id -> the oldest version of ``state/<operator>`` it pins, for every protected
    checkpoint with readable acks and every pending one (their acks so far)."""
    pinned: dict[int, int] = {}
    for checkpoint_id in sorted(needs.protected):
        try:
            acks = store.checkpoints.acks(checkpoint_id)
        except Exception:  # no row (the largest id may be a bare pending one), or unreadable
            continue
        versions = [int(a["state"]["table_version"]) for a in acks
                    if a["operator"] == operator and "table_version" in a["state"]]
        if versions:
            pinned[checkpoint_id] = min(versions)
    for r in store.acks.table.rows():
        if r["checkpoint_id"] not in needs.pending or not r["subtask"].startswith(f"{operator}["):
            continue
        try:
            version = json.loads(r["ack_json"])["state"].get("table_version")
        except (ValueError, KeyError, AttributeError):
            continue
        if version is not None:
            pinned[r["checkpoint_id"]] = min(int(version), pinned.get(r["checkpoint_id"], int(version)))
    return pinned


def commit_time(table: Location | str, version: int) -> float | None:
    """When ``version`` of a Delta table was committed (seconds): the earliest of its commit's own
    timestamps and the commit file's modification time (whole seconds on an object store, rounded
    down: never later). None when its commit file is gone."""
    files = files_at(table)
    path = location(table) / "_delta_log" / f"{version:020d}.json"
    try:
        text = files.read_text(path)
        stamps = [files.stat(path).modification_time / 1000]
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        info = action.get("commitInfo")
        if info:
            for key in ("timestamp", "inCommitTimestamp"):
                if isinstance(info.get(key), (int, float)):
                    stamps.append(info[key] / 1000.0)
    return min(stamps)


def _vacuum_state(ctx: _Context, spark: "SparkSession", table: Location, cutoff: float) -> None:
    operator = table.name
    needs = ctx.needs
    pinned = pinned_state_versions(ctx.store, needs, operator)
    note: dict[str, Any] = {"pinned": {str(k): v for k, v in sorted(pinned.items())}}
    window = cutoff
    if pinned:
        oldest_id, oldest = min(pinned.items(), key=lambda kv: (kv[1], kv[0]))
        committed = commit_time(table, oldest)
        if committed is None:
            ctx.report.oldest_pinned_state[operator] = {**note, "note": f"version {oldest} has no commit file"}
            ctx.add(RuleOutcome("vacuum", ctx.rel(table), FILES, skipped=(
                f"cannot date version {oldest} (pinned by checkpoint {oldest_id}): its commit file is gone")))
            return
        window = min(window, committed - ctx.policy.pinned_margin_hours * 3600)
        note.update(oldest_version=oldest, pinned_by=oldest_id, committed_at=committed)
    if needs.restored_at is not None:  # the after-restore suite reads the state as that restore left it
        window = min(window, needs.restored_at - ctx.policy.pinned_margin_hours * 3600)
    hours = ctx.hours_back_to(window)
    note["retain_hours"] = round(hours, 3)
    note["note"] = (f"oldest pinned version {note.get('oldest_version')} (checkpoint {note.get('pinned_by')}) "
                    f"and what came after need the files removed in the last {hours:,.2f} h: VACUUM keeps "
                    f"{math.ceil(hours)} h")
    ctx.report.oldest_pinned_state[operator] = note
    _vacuum_spark(ctx, spark, table, hours,
                  "every file of every version from the oldest one a protected or pending checkpoint pins "
                  f"({ctx.policy.pinned_margin_hours:g} h before its commit) and the newest restore on")


# --- the state tables' Delta logs ----------------------------------------------------------------

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


def _state_logs(ctx: _Context) -> None:
    """Each state table's Delta log keeps its 100-year retention (time travel to a savepoint needs
    it, and changing it is a commit on the table), so Delta never cleans it up. This rule does what
    Delta's clean-up would, below what is pinned: with P the oldest version a protected or pending
    checkpoint pins, and C the newest complete log checkpoint at or before P, every log file of a
    version below C goes (once older than the VACUUM window, for readers in flight). Every version
    from C on stays reproducible (C's checkpoint and the commits after it), so a restore of any
    retained checkpoint or savepoint, a running MERGE and a stopped stage resuming read what they
    read before; no commit is made on the table."""
    cutoff, files = ctx.file_cutoff, ctx.files
    for table in _delta_tables(files, ctx.root / "state"):
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


# --- the control tables' removed files ----------------------------------------------------------


def _control_tables(ctx: _Context) -> Iterator[tuple[Location, Any]]:
    """Each control table that exists, with its delta-rs handle."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    for name in CONTROL_TABLES:
        path = control_table(ctx.root, name)
        try:
            yield path, DeltaTable(str(path))
        except TableNotFoundError:
            continue


def _vacuum_control_tables(ctx: _Context) -> None:
    hours = math.ceil(ctx.hours_back_to(ctx.file_cutoff))  # delta-rs takes whole hours: round up, never shorter
    for path, dt in _control_tables(ctx):
        outcome = ctx.add(RuleOutcome("vacuum", ctx.rel(path), FILES,
                                      keeps=f"files removed in the last {ctx.policy.file_retention_hours:g} h "
                                            "(a reader of an older snapshot, a commit in flight)"))
        listed = dt.vacuum(retention_hours=hours, dry_run=True, enforce_retention_duration=False, full=True)
        outcome.deleted = len(listed)
        if listed:  # paths relative to the table
            sizes = {"/".join(_relative_parts(f, path)): stat.size for f, stat in ctx.files.walk_entries(path)}
            outcome.bytes_freed = sum(sizes.get(f, 0) for f in listed)
        if listed and not ctx.dry_run:  # a VACUUM commits twice (start, end): only when it has work
            dt.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False, full=True)
        outcome.kept = len(dt.file_uris())


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


def _control_logs(ctx: _Context) -> None:
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
    for path, dt in _control_tables(ctx):
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
                               attempts=_REWRITE_ATTEMPTS, exhausted=_Exhausted)
        except _Exhausted as exc:
            outcome.skipped = f"could not set the log retention: {exc} commits lost to concurrent writers"
            continue
        DeltaTable(str(path)).cleanup_metadata()  # (a commit's own hook may have cleaned up already)
        after = set(ctx.files.names(path / "_delta_log"))
        outcome.deleted, outcome.kept = len(listed - after), len(after)


def _du(path: Location) -> int:
    """The bytes of every file under ``path`` (one listing on an object store)."""
    return sum(stat.size for _, stat in files_at(path).walk_entries(path))

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

What the retained checkpoints need (:class:`~checkpoint_lib.core.retention.Needs`, read first)
-----------------------------------------------------------------------------------------------
The retained checkpoints (``store.checkpoints.all()`` of a reader, so every savepoint), the
*protected* ids (retained, pending, unreadable, restored by the newest restore, an owed rollback's
target, the largest id) and the *floor* (the oldest retained regular checkpoint, lowered to the
oldest pending one and the largest id): :mod:`checkpoint_lib.core.retention` defines them. Only ids
below the floor that are not protected are dropped.

The rules (each says in the report what it kept, what it deleted, or why it skipped)
------------------------------------------------------------------------------------
- ``checkpoints``, ``acks``, ``sessions``, ``validations`` rows: each of these stores is a
  :class:`~checkpoint_lib.core.retention.PrunedStore` and says which of its rows it keeps
  (``rows_to_keep``); maintenance rewrites each table to them by one overwrite placed exactly on
  top of the snapshot it decided on (:func:`rewrite`, delta-rs ``max_commit_retries=0``): if anyone
  committed in between, nothing of ours lands and the store is asked again, so a concurrent append
  is never lost. The decision is remade on every snapshot. ``checkpoints``: every row of a
  protected id or of an id at or above the floor. ``acks``: the acks of checkpoints still pending
  (a completed row repeats its acks). ``sessions``: every row of the newest epoch that finished
  restoring and of later ones (an owed rollback is always among them), and within those epochs,
  per stage, the last session, the last ended one and any session that started and never ended:
  what resuming, ``begin`` and ``owed_rollback`` read. ``validations``: rows of protected ids or
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
- channel-state rows of ids below the floor that are not protected, in every channel-state table
  (each cut edge's ``edge_state/<edge>`` and the one-table ``channel_state`` of before the graph
  runtime; a Spark DELETE; a concurrent append is a blind append, which Delta never conflicts with).
- VACUUM of the channel logs, the staging tables and the channel-state tables: files removed more than
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

Not touched: sink tables and the dead-letter table (the user's; a PostgreSQL sink prunes its own
bookkeeping tables at each commit), the source manifest (append-only),
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

The modules: :mod:`.report` (the policy and the report), :mod:`.context` (what the rules share,
the needs read first), :mod:`.control` (the rewrite, the control tables' VACUUM), :mod:`.cleanups`
(markers, requests, GX runs), :mod:`.data_plane` (channel state, Spark VACUUM), :mod:`.logs` (the
state and control tables' Delta logs); this one runs them.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable

from ..core.retention import Needs, PrunedStore, Restores, Retention
from ..files import files_at
from ..layout import check_pipeline_name as validate_pipeline_name
from ..layout import checkpoint_root, control_table, location, warehouse_location
from ..objectstore import is_remote, verify_conditional_put
from ..quality.paths import quality_root
from .cleanups import delete_gx_runs, delete_markers, delete_requests
from .context import Context, du, read_needs, rel
from .control import rewrite, vacuum_control_tables
from .data_plane import commit_time, data_plane, pinned_state_versions
from .logs import control_logs, log_checkpoints, state_logs
from .report import ROWS, MaintenanceReport, RetentionPolicy, RuleOutcome

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

__all__ = [
    "MaintenanceReport", "Needs", "PrunedStore", "Restores", "Retention", "RetentionPolicy", "RuleOutcome",
    "commit_time", "log_checkpoints", "maintain", "pinned_state_versions", "read_needs", "rewrite",
    "sessions_to_keep",
]


def __getattr__(name: str) -> Any:
    if name == "sessions_to_keep":  # the sessions store's rule, importable from here (without deltalake at import)
        from ..delta.sessions import sessions_to_keep

        return sessions_to_keep
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    report.bytes_before = du(root) + du(quality)
    if not files.is_dir(root):
        report.rules.append(RuleOutcome("everything", rel(root, warehouse), ROWS,
                                        skipped="the pipeline has no checkpoint store here (never ran)"))
        report.finished_at = time.time()
        return report
    if is_remote(warehouse) and not dry_run:
        # the rewrites' compare-and-swap is delta-rs's conditional put of the commit file: never
        # overwrite a table on a store that ignores it (checked once per process, as the store does)
        verify_conditional_put(str(root))
    from ..delta.store import DeltaCheckpointStore
    from ..quality.records import ValidationLog

    store = DeltaCheckpointStore(str(root))  # a reader: no retention of its own, creates nothing
    ctx = Context(store, files, location(warehouse), root, quality, policy, now, wall, dry_run, report)
    report.needs = needs = read_needs(store)
    log.info("maintenance of %s: %s", name, needs.to_dict())

    # the acks first: they are kept by the statuses of the checkpoints rows, which go next
    pruned: list[PrunedStore] = [store.acks, store.checkpoints, store.sessions, ValidationLog(root)]
    for each in pruned:
        _prune(ctx, each)
    rules: list[Callable[[Context], None]] = [
        delete_markers, delete_requests, delete_gx_runs, lambda c: data_plane(c, spark), state_logs,
        vacuum_control_tables, control_logs,
    ]
    for rule in rules:
        rule(ctx)
    report.bytes_after = du(root) + du(quality)
    report.finished_at = time.time()
    return report


def _prune(ctx: Context, store: PrunedStore) -> RuleOutcome:
    """Rewrite ``store``'s table to the rows it keeps (:func:`rewrite`: asked again on each snapshot
    until the overwrite lands on the one it decided on; looked up in this module, so a test that
    replaces ``maintenance.rewrite`` races every pruned store)."""
    snapshot: dict[str, Any] = {}

    def read(dt: Any) -> list[dict[str, Any]]:
        snapshot["dt"] = dt
        return store.rows_at(dt)

    def decide(rows: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        keep = store.rows_to_keep(snapshot["dt"], rows, ctx.retention())
        return list(keep) if len(keep) < len(rows) else None

    dropped, kept, retries = rewrite(store.load, read, decide, dry_run=ctx.dry_run)
    return ctx.add(RuleOutcome(f"{store.name} rows", ctx.rel(control_table(ctx.root, store.name)), ROWS, dropped,
                               kept, keeps=store.keeps(ctx.retention()), retries=retries))

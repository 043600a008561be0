"""The control tables: the one compare-and-swap rewrite of a table's rows (:func:`rewrite`, which
maintenance runs on every :class:`~checkpoint_lib.core.retention.PrunedStore`), and the VACUUM of
their removed files."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

from ..core.cas import commit_on_snapshot
from ..files import Location
from ..layout import CONTROL_TABLES, control_table
from .context import Context, relative_parts
from .report import FILES, RuleOutcome

REWRITE_ATTEMPTS = 60
"""How many races a rewrite or a table-property change may lose before it gives up."""


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
        load, attempt, lost=CommitFailedError, attempts=REWRITE_ATTEMPTS,
        exhausted=lambda n: RuntimeError(f"{n} attempts to rewrite a control table lost to concurrent writers"))
    return dropped, kept, retries


def control_tables(ctx: Context) -> Iterator[tuple[Location, Any]]:
    """Each control table that exists, with its delta-rs handle."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    for name in CONTROL_TABLES:
        path = control_table(ctx.root, name)
        try:
            yield path, DeltaTable(str(path))
        except TableNotFoundError:
            continue


def vacuum_control_tables(ctx: Context) -> None:
    hours = math.ceil(ctx.hours_back_to(ctx.file_cutoff))  # delta-rs takes whole hours: round up, never shorter
    for path, dt in control_tables(ctx):
        outcome = ctx.add(RuleOutcome("vacuum", ctx.rel(path), FILES,
                                      keeps=f"files removed in the last {ctx.policy.file_retention_hours:g} h "
                                            "(a reader of an older snapshot, a commit in flight)"))
        listed = dt.vacuum(retention_hours=hours, dry_run=True, enforce_retention_duration=False, full=True)
        outcome.deleted = len(listed)
        if listed:  # paths relative to the table
            sizes = {"/".join(relative_parts(f, path)): stat.size for f, stat in ctx.files.walk_entries(path)}
            outcome.bytes_freed = sum(sizes.get(f, 0) for f in listed)
        if listed and not ctx.dry_run:  # a VACUUM commits twice (start, end): only when it has work
            dt.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False, full=True)
        outcome.kept = len(dt.file_uris())

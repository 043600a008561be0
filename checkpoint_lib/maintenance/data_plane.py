"""The data plane (Spark): the channel state of checkpoints nothing needs (a DELETE in every
channel-state table: the old one-table ``channel_state`` and each cut edge's ``edge_state/<edge>``),
and the VACUUM of the channel logs, the staging tables, the channel-state tables and the state tables, whose window reaches
back to what the protected and pending checkpoints pin."""

from __future__ import annotations

import json
import math
import os
from typing import TYPE_CHECKING, Any, Mapping
from urllib.parse import unquote

from ..core.acks import PinnedState
from ..core.retention import Needs
from ..files import FileStat, Files, Location, files_at
from ..layout import CHANNELS, EDGE_STATE, channel_state_table, location
from ..objectstore import is_remote
from .context import Context, delta_tables, relative_parts
from .report import FILES, ROWS, RuleOutcome

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from ..delta.store import DeltaCheckpointStore


def data_plane(ctx: Context, spark: "SparkSession | None") -> None:
    files = ctx.files
    logs = delta_tables(files, ctx.root / CHANNELS)
    staging = delta_tables(files, ctx.root / "staging")
    states = delta_tables(files, ctx.root / "state")
    channel_state = channel_state_tables(ctx)
    others = [*logs, *staging, *channel_state]
    if spark is None:
        why = "no Spark session: the data-plane rules need one (ckpt maintain without --no-spark)"
        for table in channel_state or [channel_state_table(ctx.root)]:
            ctx.add(RuleOutcome("channel_state rows", ctx.rel(table), ROWS, skipped=why))
        for table in [*others, *states]:
            ctx.add(RuleOutcome("vacuum", ctx.rel(table), FILES, skipped=why))
        return
    for table in channel_state:
        _delete_channel_state(ctx, spark, table)
    cutoff = ctx.file_cutoff
    for table in others:
        _vacuum_spark(ctx, spark, table, ctx.hours_back_to(cutoff),
                      f"files removed in the last {ctx.policy.file_retention_hours:g} h (restores read the latest "
                      "version only)")
    for table in states:
        _vacuum_state(ctx, spark, table, cutoff)


def channel_state_tables(ctx: Context) -> list[Location]:
    """Every channel-state table under the checkpoint root: a linear pipeline's one-table
    ``channel_state`` of before the graph runtime, and one per cut edge (``edge_state/<edge>``)."""
    legacy = channel_state_table(ctx.root)
    return [*([legacy] if ctx.files.is_dir(legacy / "_delta_log") else []),
            *delta_tables(ctx.files, ctx.root / EDGE_STATE)]


def _delete_channel_state(ctx: Context, spark: "SparkSession", path: Location) -> None:
    from pyspark.sql import functions as F

    from ..spark import tables

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
        tables.delete_where(spark, str(path), condition, what=f"maintenance: DELETE of old channel state in {path}")


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


def _vacuum_spark(ctx: Context, spark: "SparkSession", table: Location, hours: float, keeps: str) -> RuleOutcome:
    """VACUUM ``table`` keeping files removed less than ``hours`` ago, rounded up to whole hours.
    A table with no file old enough to go (none outside its latest version older than the window:
    VACUUM takes nothing younger) gets no VACUUM at all; a dry run lists what would go."""
    from ..spark import tables

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
        if not any(part.startswith(("_", ".")) for part in relative_parts(path, table)):
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
        versions = [pinned.table_version for a in acks if a["operator"] == operator
                    for pinned in [PinnedState.held_in(a["state"])] if pinned is not None]
        if versions:
            pinned[checkpoint_id] = min(versions)
    for r in store.acks.table.rows():
        if r["checkpoint_id"] not in needs.pending or not r["subtask"].startswith(f"{operator}["):
            continue
        try:
            held = PinnedState.held_in(json.loads(r["ack_json"])["state"])
        except (ValueError, KeyError, AttributeError, TypeError):
            continue
        if held is not None:
            version = held.table_version
            pinned[r["checkpoint_id"]] = min(version, pinned.get(r["checkpoint_id"], version))
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


def _vacuum_state(ctx: Context, spark: "SparkSession", table: Location, cutoff: float) -> None:
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

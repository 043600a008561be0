"""Reading a Delta table's transaction log: which files each version added, and its schema.

Sources use it to plan replayable, incremental reads: an offset is a table version, and the data of
versions ``(a, b]`` is exactly the files those commits added (the table must be append-only). Only
the log's JSON commit files are read, on the driver: metadata, never data; from a local table or
one on an object store alike (:mod:`checkpoint_lib.files`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping
from urllib.parse import unquote

from ..files import files_at
from ..layout import location
from ..objectstore import ObjectUri

_COMMIT = re.compile(r"^(\d{20})\.json$")


class NotAppendOnlyError(ValueError):
    """The table was rewritten in place (a commit removed data): it cannot be read incrementally."""


class MissingLogError(RuntimeError):
    """A commit file the source needs is gone (log retention cleaned it up)."""


@dataclass(frozen=True, order=True)
class AddedFile:
    version: int
    path: str
    """As in the log: relative to the table root (URL-encoded, as Delta writes it)."""
    rows: int
    size: int


def _log(table: str | os.PathLike) -> Path | ObjectUri:
    return location(table) / "_delta_log"


def is_delta_table(table: str | os.PathLike) -> bool:
    return latest_version(table) is not None


def latest_version(table: str | os.PathLike) -> int | None:
    """The newest version with a JSON commit (one listing of ``_delta_log``); None: not a Delta table."""
    log = _log(table)
    versions = [int(m.group(1)) for name in files_at(log).names(log) if (m := _COMMIT.match(name))]
    return max(versions, default=None)


def clear_abandoned_creation(table: str | os.PathLike) -> bool:
    """Remove what a table creation killed before its first commit left, and say whether there was
    any. Delta makes the ``_delta_log`` folder before it writes commit 0, and Spark takes any such
    folder for a table: ``CREATE TABLE IF NOT EXISTS`` then does nothing and the table is "not
    found", in every later run. Everything under a ``_delta_log`` without a commit goes (temporary
    and checksum files, empty folders); a commit never does, so a creation that lands meanwhile
    keeps it (a creator racing this one may lose its temporary file: it raises, the next attempt
    creates the table). False, touching nothing, when the table has a commit or no log folder."""
    log = _log(table)
    files = files_at(log)
    if not files.exists(log) or latest_version(table) is not None:
        return False
    for path in list(files.walk(log)):
        if not _COMMIT.match(path.name):
            files.delete(path)
    if isinstance(log, Path):  # a filesystem's folders, deepest first; one a creator wrote into stays
        for folder, _, _ in os.walk(log, topdown=False):
            try:
                os.rmdir(folder)
            except OSError:
                pass
    return True


def commit_actions(table: str | os.PathLike, version: int) -> Iterator[dict[str, Any]]:
    path = _log(table) / f"{version:020d}.json"
    try:
        text = files_at(path).read_text(path)
    except FileNotFoundError:
        raise MissingLogError(
            f"{path} is gone (Delta log retention): version {version} can no longer be read "
            "incrementally; recover from a newer checkpoint or re-ingest"
        ) from None
    for line in text.splitlines():
        if line.strip():
            yield json.loads(line)


def added_files(table: str | os.PathLike, after: int, upto: int) -> list[AddedFile]:
    """Files added by versions ``after+1 .. upto``, in (version, path) order.

    Raises :class:`NotAppendOnlyError` if any of those commits removed data (a DELETE, UPDATE,
    MERGE or overwrite); compaction (``dataChange: false``) is allowed.
    """
    files: list[AddedFile] = []
    for version in range(after + 1, upto + 1):
        files += _added(table, version, list(commit_actions(table, version)))
    return sorted(files)


def _added(table: str | os.PathLike, version: int, actions: list[dict[str, Any]]) -> list[AddedFile]:
    """The files commit ``version`` (its ``actions``) added; NotAppendOnlyError if it removed data."""
    files = []
    for action in actions:
        add = action.get("add")
        removed = action["remove"]["path"] if "remove" in action and action["remove"].get("dataChange", True) else None
        if removed is None and add is not None and add.get("deletionVector"):
            removed = f"rows of {add['path']}, by a deletion vector"
        if removed is not None:
            operation = next((a["commitInfo"].get("operation") for a in actions if "commitInfo" in a), None)
            raise NotAppendOnlyError(
                f"{table} version {version}{f' ({operation})' if operation else ''} removed data ({removed}): "
                "a source reads each version's added rows once and cannot take rows back, so the landing table must "
                "be append-only (write corrections as new rows). Nothing was read. To go on, undo that commit "
                f"(RESTORE TABLE delta.`{table}` TO VERSION AS OF {version - 1}), or restore a checkpoint taken after "
                f"version {version} (ckpt recover <pipeline> --checkpoint N)"
            )
        if add is None or not add.get("dataChange", True):
            continue
        stats = json.loads(add["stats"]) if add.get("stats") else {}
        files.append(AddedFile(version, add["path"], int(stats.get("numRecords", -1)), int(add["size"])))
    return sorted(files)


def commit_time_of(actions: Iterable[Mapping[str, Any]]) -> int | None:
    """A commit's time (ms since the epoch) from its actions: the in-commit timestamp when the
    table has them, else the writer's ``commitInfo.timestamp``; None when the commit says neither."""
    for action in actions:
        info = action.get("commitInfo")
        if info is not None:
            stamp = info.get("inCommitTimestamp", info.get("timestamp"))
            return None if stamp is None else int(stamp)
    return None


def _changes_metadata(action: Mapping[str, Any]) -> bool:
    """Whether a log action changes the table's schema, properties or protocol."""
    return "metaData" in action or "protocol" in action


def user_metadata_at(table: str | os.PathLike, version: int) -> str | None:
    """The user metadata of the newest commit at or before ``version`` that changed rows or has
    some, walking back past commits that changed no row (a fence's stamp, an OPTIMIZE, a schema
    change); None if the first such commit has none, or a commit file it needs is gone."""
    try:
        for v in range(version, -1, -1):
            actions = list(commit_actions(table, v))
            info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            if info.get("userMetadata"):
                return str(info["userMetadata"])
            if any((a.get("add") or a.get("remove") or {}).get("dataChange", False) for a in actions):
                return None
    except MissingLogError:
        return None
    return None


def rows_unchanged_since(table: str | os.PathLike, version: int) -> bool:
    """Whether every commit after ``version`` left the table's rows as ``version`` had them: no file
    added or removed with a data change and no schema, property or protocol change (a fence's
    stamp-only commit, an OPTIMIZE). False if a commit file it needs is gone."""
    latest = latest_version(table)
    if latest is None or latest < version:
        return False
    try:
        for v in range(version + 1, latest + 1):
            for action in commit_actions(table, v):
                if _changes_metadata(action):
                    return False
                change = action.get("add") or action.get("remove")
                if change is not None and change.get("dataChange", True):
                    return False
    except MissingLogError:
        return False
    return True


def data_changes_since(table: str | os.PathLike, version: int, ours: str | None = None) -> list[tuple[int, str]]:
    """The commits after ``version`` that changed the table's rows (a file added or removed with a
    data change: an append, a RESTORE, a DELETE, an overwrite; not an OPTIMIZE, a fence's stamp or a
    schema change), as (version, operation), leaving out those stamped by application id ``ours``
    (a ``txn`` action of it). A commit file that is gone counts as a change (``"unknown"``)."""
    latest = latest_version(table)
    found: list[tuple[int, str]] = []
    for v in range(version + 1, (latest if latest is not None else version) + 1):
        try:
            actions = list(commit_actions(table, v))
        except MissingLogError:
            found.append((v, "unknown"))
            continue
        if ours is not None and any((a.get("txn") or {}).get("appId") == ours for a in actions):
            continue
        if any((a.get("add") or a.get("remove") or {}).get("dataChange", True)
               for a in actions if "add" in a or "remove" in a):
            info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            found.append((v, str(info.get("operation", "a commit"))))
    return found


class StepPlanner:
    """The next source step of an append-only landing table, planned incrementally: each commit of
    the log is parsed once (then kept until the offset passes it), and a step stops parsing once it
    has its rows, so a backlog of many versions costs each step only what it reads."""

    def __init__(self, table: str | os.PathLike):
        self.table = table
        # version -> (files added, metadata changed, commit time)
        self._versions: dict[int, tuple[list[AddedFile], bool, int | None]] = {}

    def _version(self, version: int) -> tuple[list[AddedFile], bool, int | None]:
        if version not in self._versions:
            actions = list(commit_actions(self.table, version))
            changed = any(_changes_metadata(a) for a in actions)
            self._versions[version] = (_added(self.table, version, actions), changed, commit_time_of(actions))
        return self._versions[version]

    def commit_time(self, version: int) -> int | None:
        """When ``version`` was committed (ms since the epoch, :func:`commit_time_of`)."""
        return self._version(version)[2]

    def next_step(self, after: int, upto: int, rows_per_step: int) -> list[AddedFile]:
        """The files of the versions after ``after`` (at most ``upto``), whole versions, until they
        hold at least ``rows_per_step`` rows: what :func:`plan_steps` makes the first step of."""
        if rows_per_step < 1:
            raise ValueError(f"rows_per_step must be >= 1, got {rows_per_step}")
        for v in [v for v in self._versions if v <= after]:
            del self._versions[v]  # consumed: never planned again
        step: list[AddedFile] = []
        rows = 0
        for version in range(after + 1, upto + 1):
            files = self._version(version)[0]
            step += files
            rows += sum(max(f.rows, 0) for f in files)
            if files and rows >= rows_per_step:
                break
        return step

    def rows_between(self, after: int, upto: int) -> int:
        """The rows the versions after ``after`` (at most ``upto``) added (what a run has to read;
        each version parsed once, and kept for the steps that read it)."""
        return sum(max(f.rows, 0) for v in range(after + 1, upto + 1) for f in self._version(v)[0])

    def metadata_changed(self, after: int, upto: int) -> bool:
        """Whether a commit after ``after`` (at most ``upto``) changed the schema, the table
        properties or the protocol."""
        return any(self._version(v)[1] for v in range(after + 1, upto + 1))


CHANGE_DATA_FEED = "delta.enableChangeDataFeed"
"""The table property that makes Delta record a table's row changes (its change data feed)."""


@dataclass(frozen=True)
class ChangeVersion:
    """What one commit holds for a change-data-feed reader, from its log entry alone.

    ``entry``: the version as one entry of a step (``path`` ``cdf@<version>``, ``rows`` the rows it
    changed, -1 when the log does not say, ``size`` the bytes of the files a read opens); None
    when the commit changed no row (a metadata change, an OPTIMIZE). ``files``: those files
    (relative to the table, as the log writes them): its change files (``cdc`` actions) when it
    has any, else the data files it added and removed. ``feed``: the change-data-feed property
    its ``metaData`` action sets (None: no metaData). ``metadata_changed``: schema, properties or
    protocol changed. ``time``: when it was committed (:func:`commit_time_of`). ``restore``: what it
    restored, when it is a RESTORE (:func:`restore_of`)."""

    entry: AddedFile | None
    files: tuple[str, ...]
    feed: bool | None
    metadata_changed: bool
    time: int | None = None
    restore: Restore | None = None


CHANGE_ENTRY_PREFIX = "cdf@"


def change_entry_path(version: int) -> str:
    """The name of a version in a change-data-feed step (its rows' ``src_file``): ``cdf@<version>``."""
    return f"{CHANGE_ENTRY_PREFIX}{version}"


def configuration_at(table: str | os.PathLike, version: int) -> dict[str, str]:
    """The table properties in force at ``version`` (from the newest metaData action)."""
    metadata, _ = _metadata_and_protocol(table, version)
    return dict(metadata.get("configuration") or {})


def _feed_on(configuration: Mapping[str, str] | None) -> bool:
    """Whether table properties ``configuration`` turn the change data feed on."""
    return str((configuration or {}).get(CHANGE_DATA_FEED, "")).lower() == "true"


def _records(action: Mapping[str, Any]) -> int | None:
    stats = json.loads(action["stats"]) if action.get("stats") else {}
    return None if stats.get("numRecords") is None else int(stats["numRecords"])


def _hidden(action: Mapping[str, Any]) -> int:
    """The rows a file's deletion vector hides."""
    return int((action.get("deletionVector") or {}).get("cardinality", 0))


def _file_changes(adds: list[dict[str, Any]], removes: list[dict[str, Any]]) -> int | None:
    """The rows a commit without change files inserted and deleted, from its files' row counts: an
    added file's rows are inserts, a removed file's deletes, a file removed and added again with a
    larger deletion vector deleted the rows the vector grew by. None: a count is missing."""
    removed = {r["path"]: r for r in removes}
    added = {a["path"]: a for a in adds}
    rows = 0
    for path, action in [*added.items(), *((p, r) for p, r in removed.items() if p not in added)]:
        if path in added and path in removed:
            rows += _hidden(action) - _hidden(removed[path])
            continue
        n = _records(action)
        if n is None:
            return None
        rows += n - _hidden(action)
    return rows


def _metric_changes(actions: list[dict[str, Any]]) -> int | None:
    """The rows a commit inserted, updated or deleted by its commit info's operation metrics (Spark's
    camelCase names or delta-rs's snake_case ones); None when it has none that say."""
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    metrics = {}
    for name, value in (info.get("operationMetrics") or {}).items():
        try:
            metrics[name.replace("_", "").lower()] = int(value)
        except (TypeError, ValueError):
            continue
    for names in (("numtargetrowsinserted", "numtargetrowsupdated", "numtargetrowsdeleted"),  # MERGE
                  ("numupdatedrows", "numdeletedrows"),  # UPDATE, DELETE
                  ("numoutputrows",), ("numaddedrows",)):  # a write
        if any(n in metrics for n in names):
            return sum(metrics.get(n, 0) for n in names)
    return None


def change_version(table: str | os.PathLike, version: int, actions: list[dict[str, Any]]) -> ChangeVersion:
    """What commit ``version`` (its ``actions``) holds for a change-data-feed reader
    (:class:`ChangeVersion`). Its rows: of a commit with change files, its operation metrics
    (the rows inserted, updated and deleted; an update's row before it is not counted), else the
    change files' row counts; of a commit without, its files' row counts (:func:`_file_changes`),
    else its metrics. -1 when neither says."""
    metadata = next((a["metaData"] for a in actions if "metaData" in a), None)
    feed = None if metadata is None else _feed_on(metadata.get("configuration"))
    changed = any(_changes_metadata(a) for a in actions)
    cdc = [a["cdc"] for a in actions if "cdc" in a]
    adds = [a["add"] for a in actions if "add" in a and a["add"].get("dataChange", True)]
    removes = [a["remove"] for a in actions if "remove" in a and a["remove"].get("dataChange", True)]
    if cdc:
        files = cdc
        counts = [_records(c) for c in cdc]
        rows = _metric_changes(actions)
        if rows is None and None not in counts:
            rows = sum(counts)
    elif adds or removes:
        files = adds + [r for r in removes if r["path"] not in {a["path"] for a in adds}]
        rows = _file_changes(adds, removes)
        if rows is None:
            rows = _metric_changes(actions)
    else:
        return ChangeVersion(None, (), feed, changed, commit_time_of(actions), restore_of(version, actions))
    entry = AddedFile(version, change_entry_path(version), -1 if rows is None else rows,
                      sum(int(f.get("size") or 0) for f in files))
    return ChangeVersion(entry, tuple(f["path"] for f in files), feed, changed, commit_time_of(actions),
                         restore_of(version, actions))


class ChangeFeedPlanner:
    """A table's commits as a change-data-feed reader plans them: each commit parsed once (then
    kept until the offset passes it), and whether the feed was on at each version, carried forward
    from the version before (the log walked back once, for the first)."""

    def __init__(self, table: str | os.PathLike):
        self.table = table
        self._versions: dict[int, ChangeVersion] = {}
        self._feed: dict[int, bool] = {}  # version -> the feed was on at it

    def version(self, version: int) -> ChangeVersion:
        if version not in self._versions:
            self._versions[version] = change_version(self.table, version, list(commit_actions(self.table, version)))
        return self._versions[version]

    def feed_on(self, version: int) -> bool:
        """Whether the table recorded its changes at ``version`` (the property in force after it)."""
        if version not in self._feed:
            own = self.version(version).feed
            if own is not None:
                self._feed[version] = own
            elif version - 1 in self._feed:
                self._feed[version] = self._feed[version - 1]
            else:
                self._feed[version] = _feed_on(configuration_at(self.table, version))
        return self._feed[version]

    def feed_turned_on(self, after: int, upto: int) -> int | None:
        """The first version after ``after`` (at most ``upto``) that turned the feed on; None."""
        return next((v for v in range(after + 1, upto + 1) if self.version(v).feed), None)

    def forget(self, upto: int) -> None:
        """Versions up to ``upto`` are consumed: never planned again (the feed at ``upto`` is kept,
        the next version's is carried from it)."""
        self._versions = {v: c for v, c in self._versions.items() if v > upto}
        self._feed = {v: on for v, on in self._feed.items() if v >= upto}

    def commit_time(self, version: int) -> int | None:
        """When ``version`` was committed (ms since the epoch, :func:`commit_time_of`)."""
        return self.version(version).time

    def rows_between(self, after: int, upto: int) -> int:
        """The rows the versions after ``after`` (at most ``upto``) changed (unknown counts as none)."""
        return sum(max(c.entry.rows, 0) for v in range(after + 1, upto + 1) if (c := self.version(v)).entry)

    def metadata_changed(self, after: int, upto: int) -> bool:
        """Whether a commit after ``after`` (at most ``upto``) changed the schema, the table
        properties or the protocol."""
        return any(self.version(v).metadata_changed for v in range(after + 1, upto + 1))


_SEQUENCE = (1 << 32) - 1


def stamped_checkpoints(table: str | os.PathLike, version: int, app_prefix: str) -> list[int]:
    """The checkpoints commit ``version`` is stamped with by app ids starting with ``app_prefix``
    (each stamp's low 32 bits; the high ones name the writer's epoch). Empty: not one of ours."""
    return [int(a["txn"]["version"]) & _SEQUENCE for a in commit_actions(table, version)
            if "txn" in a and str(a["txn"].get("appId", "")).startswith(app_prefix)]


def version_before_txn_above(table: str | os.PathLike, app_prefix: str, checkpoint_id: int) -> int | None:
    """The table version just before the first commit stamped by an app id starting with
    ``app_prefix`` with a transaction version above ``checkpoint_id`` (what the table held when
    checkpoint ``checkpoint_id`` was the latest one committed to it). None: no such commit.

    A stamp's checkpoint is its low 32 bits (the high ones name the writer's epoch: see
    :func:`checkpoint_lib.spark.tables.fenced_version`). Stamps of one pipeline only grow along the log (checkpoint ids grow, and recovery re-commits
    only the latest completed checkpoint), so the log is walked back from the end and the walk
    stops at the first commit of ours stamped at or below ``checkpoint_id``."""
    latest = latest_version(table)
    if latest is None:
        return None
    first_above: int | None = None
    for version in range(latest, -1, -1):
        stamps = stamped_checkpoints(table, version, app_prefix)
        if not stamps:
            continue
        if max(stamps) > checkpoint_id:
            first_above = version
        else:
            break
    return None if first_above is None else first_above - 1


def files_added_since_epoch(table: str | os.PathLike, app_id: str, epoch: int) -> set[str] | None:
    """The paths (relative to the table, decoded) that any commit added since the first commit
    stamped by ``app_id`` in ``epoch`` or later: every file that a version a writer of ``epoch``
    (or of a later one) could have committed references, whatever the current snapshot holds
    (an OPTIMIZE removes committed files from it; older versions still reference them). The log is
    walked back from the end, and the walk stops at a commit stamped by ``app_id`` in an older
    epoch (a stamp's epoch is its high 32 bits: see :func:`checkpoint_lib.spark.tables.fenced_version`;
    a writer's commits carry its own epoch's stamp, and a recovery fences the table before its epoch
    commits anything). None when a commit on the way is gone (log retention): nobody can say."""
    latest = latest_version(table)
    added: set[str] = set()
    for version in range(-1 if latest is None else latest, -1, -1):
        try:
            actions = list(commit_actions(table, version))
        except MissingLogError:
            return None
        stamps = [int(a["txn"]["version"]) >> 32 for a in actions if "txn" in a and a["txn"].get("appId") == app_id]
        if stamps and max(stamps) < epoch:
            break
        added.update(unquote(a["add"]["path"]) for a in actions if "add" in a)
    return added


@dataclass(frozen=True)
class Restore:
    """A RESTORE commit of a table's log: ``version`` restored ``restored`` (a version; None when it
    named a timestamp, ``timestamp``, instead)."""

    version: int
    restored: int | None
    timestamp: str | None


def restore_of(version: int, actions: Iterable[Mapping[str, Any]]) -> Restore | None:
    """The RESTORE commit ``version`` (its ``actions``) is, from its commit info; None: another operation."""
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    if info.get("operation") != "RESTORE":
        return None
    params = info.get("operationParameters") or {}
    restored = params.get("version")
    return Restore(version, None if restored in (None, "", "null") else int(restored), params.get("timestamp") or None)


MAX_WALK = 1000
"""How many commits :func:`restore_since_stamp` reads back at most."""


def restore_since_stamp(table: str | os.PathLike, app_id: str, checkpoint: int, ours: str,
                        latest: int | None = None) -> Restore | None:
    """The newest RESTORE by someone else since the commits that stamped ``checkpoint`` with
    ``app_id`` (or just before them): walked back from the end, stopping at a commit stamped below
    ``checkpoint`` (what was committed before it is out of question), at a RESTORE whose commit
    info's ``userMetadata`` starts with ``ours`` (the pipeline's own rollback, which leaves the table
    exactly as a checkpoint committed it), at a commit gone from the log, or after
    :data:`MAX_WALK` commits. A RESTORE does not touch the stamps, so a table RESTOREd to an older
    version still says the newer checkpoint is committed: the caller compares. ``latest``: the
    newest version, when the caller knows it (else the log is listed)."""
    latest = latest_version(table) if latest is None else latest
    if latest is None:
        return None
    for version in range(latest, max(latest - MAX_WALK, -1), -1):
        try:
            actions = list(commit_actions(table, version))
        except MissingLogError:
            return None
        restore = restore_of(version, actions)
        if restore is not None:
            info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            return None if str(info.get("userMetadata") or "").startswith(ours) else restore
        stamps = [int(a["txn"]["version"]) & _SEQUENCE for a in actions
                  if "txn" in a and a["txn"].get("appId") == app_id]
        if stamps and max(stamps) < checkpoint:
            return None
    return None


def _metadata_and_protocol(table: str | os.PathLike, version: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The newest ``metaData`` action at or before ``version``, and the newest ``protocol`` action
    seen on the way back to it (empty if none). Walks the JSON commits back; when log retention
    has already removed the commit that set them, reads the snapshot at ``version`` instead
    (Delta log checkpoint + later commits, through delta-rs)."""
    protocol: dict[str, Any] = {}
    for v in range(version, -1, -1):
        try:
            actions = list(commit_actions(table, v))
        except MissingLogError:
            return _metadata_and_protocol_of_snapshot(table, version)
        for action in actions:
            if "protocol" in action and not protocol:
                protocol = action["protocol"]
        for action in actions:
            if "metaData" in action:
                return action["metaData"], protocol
    raise MissingLogError(f"no metadata found in {table}/_delta_log at or before version {version}")


def _metadata_and_protocol_of_snapshot(table: str | os.PathLike, version: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The metaData and protocol in force at ``version``, as log actions, from the table snapshot."""
    from deltalake import DeltaTable

    try:
        dt = DeltaTable(str(table), version=version)
    except Exception as exc:  # delta-rs cannot rebuild it either (no log checkpoint covers it)
        raise MissingLogError(
            f"{table}: the metadata in force at version {version} can no longer be read ({exc})"
        ) from exc
    protocol = dt.protocol()
    metadata = {"schemaString": dt.schema().to_json(), "configuration": dict(dt.metadata().configuration or {})}
    features = {
        "minReaderVersion": protocol.min_reader_version, "minWriterVersion": protocol.min_writer_version,
        "readerFeatures": list(protocol.reader_features or []), "writerFeatures": list(protocol.writer_features or []),
    }
    return metadata, features


def schema_at(table: str | os.PathLike, version: int) -> dict[str, str]:
    """Column name -> Delta type name, from the newest metaData action at or before ``version``."""
    fields = schema_json_at(table, version)["fields"]
    return {f["name"]: f["type"] if isinstance(f["type"], str) else "struct" for f in fields}


def schema_json_at(table: str | os.PathLike, version: int) -> dict[str, Any]:
    """The table's schema at ``version`` as Delta writes it (a struct type in Spark's JSON form:
    ``pyspark.sql.types.StructType.fromJson`` reads it), from the newest metaData action."""
    metadata, _ = _metadata_and_protocol(table, version)
    return json.loads(metadata["schemaString"])


def table_features(table: str | os.PathLike, version: int) -> set[str]:
    """Reader/writer features and column mapping in force at ``version`` (from the log)."""
    metadata, protocol = _metadata_and_protocol(table, version)
    features = set(protocol.get("readerFeatures") or []) | set(protocol.get("writerFeatures") or [])
    config = metadata.get("configuration") or {}
    if config.get("delta.columnMapping.mode", "none") != "none":
        features.add("columnMapping")
    if config.get("delta.enableDeletionVectors") == "true":
        features.add("deletionVectors")
    return features


def plan_steps(files: list[AddedFile], rows_per_step: int) -> list[list[AddedFile]]:
    """Group files into steps of whole versions with at least ``rows_per_step`` rows each (the
    last may be smaller). A step never splits a version: a version is the unit of an offset."""
    if rows_per_step < 1:
        raise ValueError(f"rows_per_step must be >= 1, got {rows_per_step}")
    steps: list[list[AddedFile]] = []
    current: list[AddedFile] = []
    rows = 0
    for i, f in enumerate(files):
        current.append(f)
        rows += max(f.rows, 0)
        version_ends = i + 1 == len(files) or files[i + 1].version != f.version
        if version_ends and rows >= rows_per_step:
            steps.append(current)
            current, rows = [], 0
    if current:
        steps.append(current)
    return steps

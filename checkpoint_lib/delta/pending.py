"""The files of sink transactions that are not committed yet, written once.

A two-phase-commit sink writes each record once: at a flush, Spark writes the transaction's rows
as Parquet files straight into their final place (for an append sink, inside the target table's
folder, where nothing refers to them yet, so no reader sees them); at the commit the sink adds
those very files to the table in one Delta commit (:meth:`PendingFiles.add_actions`), or MERGEs
them (an upsert sink, whose files stay outside the target). Nothing is copied, and an abort
deletes the files.

What a transaction wrote is known from its **control folder** (``<control>/<handle>/``), never
from listing the data: ``txn.json`` (the transaction, written when it is first written to), then
per write ``w-<write id>`` (the intent: the data folder it is about to fill) and, once the files
are complete, ``w-<write id>.json`` (the manifest: each file's path, size, modification time and
Delta statistics, read from the Parquet footers). So

- a commit adds exactly the files of the manifests, and refuses, naming them, if one is gone
  (a VACUUM of the target with a retention shorter than the transaction's age);
- an abort deletes every data folder an intent names, finished or not, then the control folder;
- recovery finds every transaction that wrote anything by listing the control folders.

The folders are local or on an object store (``s3://...``), through :mod:`checkpoint_lib.files`;
the paths an append sink's add actions carry are relative to the table root either way.

:class:`PendingFiles` is the core's :class:`~checkpoint_lib.core.stores.TransactionStore`; its contract
is ``tests/delta/test_pending.py``, run on a local folder and on the S3 server.

Pure Python and pyarrow (no Spark, no JVM). The data folders of one write hold a folder per
transaction (``<data>/<write id>/txn_handle=<handle>/``: one Spark job writes every subtask's
transaction of a flush).
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import quote

from ..core.twophase import Transaction
from ..files import files_at
from ..layout import below, location
from ..objectstore import ObjectUri
from ..reserved import HANDLE_COLUMN

TXN_FILE = "txn.json"
WRITE_PREFIX = "w-"
# HANDLE_COLUMN (checkpoint_lib.reserved): the column a flush's Spark write partitions by, each
# transaction's files in their own folder.


class PendingFilesLostError(RuntimeError):
    """A file a transaction wrote is gone before the transaction committed (a VACUUM of the
    target with a retention shorter than the transaction's age, or a hand): committing it would
    lose rows silently, so the commit is refused."""


@dataclass(frozen=True)
class PendingFile:
    path: str  # relative to the table root (append sinks) or absolute (upsert sinks)
    size: int
    modification_time: int  # ms
    rows: int
    stats: str  # Delta's per-file statistics (JSON)


class PendingFiles:
    """The pending files of one sink: data written under ``data`` (inside the target for an append
    sink, whose add actions are then relative to ``table_root``), bookkeeping under ``control``.
    Each a local path or an object-store URI. No I/O in the constructor."""

    def __init__(self, control: str | os.PathLike[str], data: str | os.PathLike[str],
                 table_root: str | os.PathLike[str] | None = None):
        self.control = location(control)
        self.data = location(data)
        self.table_root = None if table_root is None else location(table_root)
        self._control_files = files_at(self.control)
        self._data_files = files_at(self.data)

    # writing ----------------------------------------------------------------------------------

    def begin_write(self, txns: Iterable[Transaction]) -> str:
        """Before a flush's Spark write: a new write id, and for each transaction its control folder
        (with ``txn.json``) and the intent naming the write. Returns the folder Spark writes to,
        partitioned by :data:`HANDLE_COLUMN`."""
        write = uuid.uuid4().hex
        for t in txns:
            folder = self.control / t.handle
            self._control_files.write_once(folder / TXN_FILE, t.to_dict())  # False: an earlier write made it
            self._control_files.write_once(folder / (WRITE_PREFIX + write), {})
        return str(self.data / write)

    def seal_write(self, write_dir: str, txns: Iterable[Transaction]) -> int:
        """After the Spark write into ``write_dir``: each transaction's manifest of the files it got
        (statistics from the Parquet footers; the write's bookkeeping files removed). Returns the
        rows written."""
        written = location(write_dir)
        _drop_markers(written)
        total = 0
        for t in txns:
            files = _describe_folder(written / f"{HANDLE_COLUMN}={t.handle}", self.table_root)
            total += sum(f.rows for f in files)
            manifest = {"write": written.name, "files": [dataclasses.asdict(f) for f in files]}
            self._control_files.write_once(self.control / t.handle / f"{WRITE_PREFIX}{written.name}.json", manifest)
        return total

    # reading ----------------------------------------------------------------------------------

    def transactions(self) -> list[Transaction]:
        """Every transaction that wrote (or began to write) something and was not forgotten."""
        out = []
        for handle in self._control_files.names(self.control):
            doc = self._control_files.read_json(self.control / handle / TXN_FILE)
            if doc is not None:
                out.append(Transaction.from_dict({**doc, "checkpoint_id": None}))
            # no txn.json: a crash before the first write of it finished starting; nothing was written
        return sorted(out)

    def files(self, txns: Iterable[Transaction], *, missing_ok: bool = False) -> list[PendingFile]:
        """The files of ``txns``' finished writes; :class:`PendingFilesLostError` if one is gone
        (unless ``missing_ok``)."""
        txns = list(txns)
        out: list[PendingFile] = []
        for t in txns:
            folder = self.control / t.handle
            for name in self._control_files.names(folder):
                if name.startswith(WRITE_PREFIX) and name.endswith(".json"):
                    out += [PendingFile(**f) for f in self._control_files.read_json(folder / name)["files"]]
        lost = [] if missing_ok else self._gone(out)
        if lost:
            raise PendingFilesLostError(
                f"{len(lost)} files of transactions {sorted(t.handle for t in txns)} are gone before their commit "
                f"(e.g. {self._absolute(lost[0])}): was the table VACUUMed with a retention shorter than a "
                "checkpoint's duration? Committing them would lose rows; restore an older checkpoint instead."
            )
        return out

    def lost(self, txns: Iterable[Transaction]) -> list[str]:
        """The files ``txns``' finished writes made that are gone (their paths as the manifests name them)."""
        return self._gone(self.files(txns, missing_ok=True))

    def _gone(self, files: list[PendingFile]) -> list[str]:
        return [f.path for f in files if not self._data_files.exists(self._absolute(f.path))]

    def _absolute(self, path: str) -> Path | ObjectUri:
        return location(path) if self.table_root is None else self.table_root / path

    # forgetting --------------------------------------------------------------------------------

    def forget(self, txns: Iterable[Transaction], *, delete_data: bool) -> None:
        """Drop ``txns``' bookkeeping and, with ``delete_data``, every file their writes made (an
        abort; or the staged files of a committed upsert). Idempotent; data first, so a crash in
        between leaves an intent that names what is left to delete."""
        for t in txns:
            folder = self.control / t.handle
            if delete_data:
                for name in self._control_files.names(folder):
                    if name.startswith(WRITE_PREFIX) and not name.endswith(".json"):
                        write_dir = self.data / name[len(WRITE_PREFIX):]
                        self._data_files.delete_tree(write_dir / f"{HANDLE_COLUMN}={t.handle}")
                        _remove_if_no_transaction_left(write_dir)
            self._control_files.delete_tree(folder)


def add_actions(files: Iterable[PendingFile]) -> list:
    """delta-rs add actions of ``files``: what one commit adds to a table (data changed)."""
    from deltalake.transaction import AddAction

    return [AddAction(f.path, f.size, {}, f.modification_time, True, f.stats) for f in files]


def describe_written(folder: str | os.PathLike[str], table_root: str | os.PathLike[str] | None) -> list[PendingFile]:
    """The Parquet files one Spark write left in ``folder`` (its markers removed), each with its
    Delta statistics from the footer: what a commit adds. Paths relative to ``table_root``."""
    written = location(folder)
    _drop_markers(written)
    return _describe_folder(written, None if table_root is None else location(table_root))


def files_with_rows(folder: str | os.PathLike[str], table_root: str | os.PathLike[str] | None) -> list[PendingFile]:
    """The files of :func:`describe_written` that hold rows: Spark writes a file for each empty task,
    which nothing needs; those are deleted (the whole ``folder`` when no file holds a row)."""
    written = describe_written(folder, table_root)
    files = [f for f in written if f.rows]
    where = location(folder)
    if not files:
        files_at(where).delete_tree(where)
        return []
    for empty in (f for f in written if not f.rows):
        path = location(empty.path) if table_root is None else location(table_root) / empty.path
        files_at(path).delete(path)
    return files


def _describe_folder(folder: Path | ObjectUri, table_root: Path | ObjectUri | None) -> list[PendingFile]:
    """The Parquet files directly in ``folder`` (none if it is missing), by name."""
    names = [n for n in files_at(folder).names(folder) if n.endswith(".parquet")]
    return [_describe(folder / n, table_root) for n in names]


def _drop_markers(write_dir: Path | ObjectUri) -> None:
    """Spark's job markers and the local file system's checksums: nobody reads them, and a VACUUM
    would never delete the hidden ones."""
    files = files_at(write_dir)
    for path in files.walk(write_dir):
        if path.name == "_SUCCESS" or (path.name.startswith(".") and path.name.endswith(".crc")):
            files.delete(path)


def _remove_if_no_transaction_left(write_dir: Path | ObjectUri) -> None:
    """Delete a write's folder once no transaction's files are left in it (what else is there is
    Spark's: markers, or the temporary files of a write a crash interrupted)."""
    files = files_at(write_dir)
    if not any(n.startswith(HANDLE_COLUMN + "=") for n in files.names(write_dir)):
        files.delete_tree(write_dir)


def _relative(path: Path | ObjectUri, table_root: Path | ObjectUri | None) -> str:
    """``path`` as an add action names it: relative to ``table_root`` (``os.path.relpath`` on a
    filesystem, the rest of the URI after the root's on an object store), or whole without one."""
    if table_root is None:
        return str(path)
    if isinstance(table_root, Path):
        return os.path.relpath(path, table_root)
    return below(path, table_root)


def _describe(path: Path | ObjectUri, table_root: Path | ObjectUri | None) -> PendingFile:
    import pyarrow.parquet as pq

    files = files_at(path)
    st = files.stat(path)
    with closing(files.open(path)) as fh:
        meta = pq.ParquetFile(fh).metadata
    relative = _relative(path, table_root)
    # A path relative to the table goes into the Delta log, where it is a URI: ours never need escaping.
    # (An absolute one, of an upsert sink's file, is only read by Spark.)
    if table_root is not None and quote(relative, safe="/=") != relative:
        raise ValueError(f"{relative!r} would need URI escaping in the Delta log")
    return PendingFile(
        path=relative, size=st.size, modification_time=st.modification_time, rows=meta.num_rows,
        stats=json.dumps(_stats(meta)),
    )


def _stats(meta: Any) -> dict[str, Any]:
    """Delta's per-file statistics from a Parquet footer: the exact row count, and for integer and
    string columns whose row groups all carry statistics, min, max and null count (what a reader
    skips files with). Other columns get none, which Delta reads as "unknown"."""
    out: dict[str, Any] = {"numRecords": meta.num_rows}
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    schema = meta.schema
    for i in range(meta.num_columns):
        col = schema.column(i)
        if col.max_definition_level > 1 or "." in col.path:  # nested: not described
            continue
        kind = col.physical_type
        logical = str(col.logical_type)
        integer = kind in ("INT32", "INT64") and (logical in ("None", "Int(bitWidth=64, isSigned=true)",
                                                              "Int(bitWidth=32, isSigned=true)"))
        string = kind == "BYTE_ARRAY" and logical == "String"
        groups = [meta.row_group(g).column(i).statistics for g in range(meta.num_row_groups)]
        if not groups or any(s is None or not s.has_null_count for s in groups):
            continue
        nulls[col.name] = int(sum(s.null_count for s in groups))
        if not (integer or string):
            continue
        ranged = [s for s in groups if s.has_min_max]
        if len(ranged) != len([s for s in groups if s.num_values > 0]):  # num_values: the non-null ones
            continue
        if ranged:
            mins[col.name] = min(s.min for s in ranged)
            maxs[col.name] = max(s.max for s in ranged)
    out["minValues"], out["maxValues"], out["nullCount"] = mins, maxs, nulls
    return out

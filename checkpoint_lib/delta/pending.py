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

Pure Python and pyarrow (no Spark, no JVM). The data folders of one write hold a folder per
transaction (``<data>/<write id>/txn_handle=<handle>/``: one Spark job writes every subtask's
transaction of a flush).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import quote

from ..core.twophase import Transaction
from ..files import read_json, write_once

TXN_FILE = "txn.json"
WRITE_PREFIX = "w-"
HANDLE_COLUMN = "txn_handle"
"""The column a flush's Spark write partitions by: each transaction's files in their own folder."""


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
    sink, whose add actions are then relative to ``table_root``), bookkeeping under ``control``."""

    def __init__(self, control: str, data: str, table_root: str | None = None):
        self.control = control
        self.data = data
        self.table_root = table_root

    # writing ----------------------------------------------------------------------------------

    def begin_write(self, txns: Iterable[Transaction]) -> str:
        """Before a flush's Spark write: a new write id, and for each transaction its control folder
        (with ``txn.json``) and the intent naming the write. Returns the folder Spark writes to,
        partitioned by :data:`HANDLE_COLUMN`."""
        write = uuid.uuid4().hex
        for t in txns:
            folder = os.path.join(self.control, t.handle)
            os.makedirs(folder, exist_ok=True)
            write_once(Path(folder, TXN_FILE), t.to_dict())  # False: an earlier write made it
            write_once(Path(folder, WRITE_PREFIX + write), {})
        return os.path.join(self.data, write)

    def seal_write(self, write_dir: str, txns: Iterable[Transaction]) -> int:
        """After the Spark write into ``write_dir``: each transaction's manifest of the files it got
        (statistics from the Parquet footers; the write's bookkeeping files removed). Returns the
        rows written."""
        write = os.path.basename(write_dir)
        _drop_markers(write_dir)
        total = 0
        for t in txns:
            folder = os.path.join(write_dir, f"{HANDLE_COLUMN}={t.handle}")
            files = [_describe(os.path.join(folder, n), self.table_root)
                     for n in sorted(os.listdir(folder)) if n.endswith(".parquet")] if os.path.isdir(folder) else []
            total += sum(f.rows for f in files)
            manifest = {"write": write, "files": [dataclasses.asdict(f) for f in files]}
            write_once(Path(self.control, t.handle, WRITE_PREFIX + write + ".json"), manifest)
        return total

    # reading ----------------------------------------------------------------------------------

    def transactions(self) -> list[Transaction]:
        """Every transaction that wrote (or began to write) something and was not forgotten."""
        if not os.path.isdir(self.control):
            return []
        out = []
        for handle in os.listdir(self.control):
            doc = read_json(Path(self.control, handle, TXN_FILE))
            if doc is not None:
                out.append(Transaction.from_dict({**doc, "checkpoint_id": None}))
            # no txn.json: a crash before the first write of it finished starting; nothing was written
        return sorted(out)

    def files(self, txns: Iterable[Transaction], *, missing_ok: bool = False) -> list[PendingFile]:
        """The files of ``txns``' finished writes; :class:`PendingFilesLostError` if one is gone
        (unless ``missing_ok``)."""
        out: list[PendingFile] = []
        for t in txns:
            folder = os.path.join(self.control, t.handle)
            names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
            for name in names:
                if name.startswith(WRITE_PREFIX) and name.endswith(".json"):
                    out += [PendingFile(**f) for f in read_json(Path(folder, name))["files"]]
        lost = [] if missing_ok else [f.path for f in out if not os.path.exists(self._absolute(f.path))]
        if lost:
            raise PendingFilesLostError(
                f"{len(lost)} files of transactions {sorted(t.handle for t in txns)} are gone before their commit "
                f"(e.g. {self._absolute(lost[0])}): was the table VACUUMed with a retention shorter than a "
                "checkpoint's duration? Committing them would lose rows; restore an older checkpoint instead."
            )
        return out

    def _absolute(self, path: str) -> str:
        return path if self.table_root is None else os.path.join(self.table_root, path)

    # forgetting --------------------------------------------------------------------------------

    def forget(self, txns: Iterable[Transaction], *, delete_data: bool) -> None:
        """Drop ``txns``' bookkeeping and, with ``delete_data``, every file their writes made (an
        abort; or the staged files of a committed upsert). Idempotent; data first, so a crash in
        between leaves an intent that names what is left to delete."""
        for t in txns:
            folder = os.path.join(self.control, t.handle)
            if not os.path.isdir(folder):
                continue
            if delete_data:
                for name in os.listdir(folder):
                    if name.startswith(WRITE_PREFIX) and not name.endswith(".json"):
                        write_dir = os.path.join(self.data, name[len(WRITE_PREFIX):])
                        shutil.rmtree(os.path.join(write_dir, f"{HANDLE_COLUMN}={t.handle}"), ignore_errors=True)
                        _remove_if_no_transaction_left(write_dir)
            shutil.rmtree(folder, ignore_errors=True)


def add_actions(files: Iterable[PendingFile]) -> list:
    """delta-rs add actions of ``files``: what one commit adds to a table (data changed)."""
    from deltalake.transaction import AddAction

    return [AddAction(f.path, f.size, {}, f.modification_time, True, f.stats) for f in files]


def describe_written(folder: str, table_root: str | None) -> list[PendingFile]:
    """The Parquet files one Spark write left in ``folder`` (its markers removed), each with its
    Delta statistics from the footer: what a commit adds. Paths relative to ``table_root``."""
    _drop_markers(folder)
    names = sorted(n for n in os.listdir(folder) if n.endswith(".parquet")) if os.path.isdir(folder) else []
    return [_describe(os.path.join(folder, n), table_root) for n in names]


def _drop_markers(write_dir: str) -> None:
    """Spark's job markers and the local file system's checksums: nobody reads them, and a VACUUM
    would never delete the hidden ones."""
    for root, _dirs, names in os.walk(write_dir):
        for n in names:
            if n == "_SUCCESS" or (n.startswith(".") and n.endswith(".crc")):
                os.remove(os.path.join(root, n))


def _remove_if_no_transaction_left(write_dir: str) -> None:
    """Delete a write's folder once no transaction's files are left in it (what else is there is
    Spark's: markers, or the temporary files of a write a crash interrupted)."""
    try:
        names = os.listdir(write_dir)
    except FileNotFoundError:
        return
    if not any(n.startswith(HANDLE_COLUMN + "=") for n in names):
        shutil.rmtree(write_dir, ignore_errors=True)


def _describe(path: str, table_root: str | None) -> PendingFile:
    import pyarrow.parquet as pq

    st = os.stat(path)
    meta = pq.ParquetFile(path).metadata
    relative = os.path.relpath(path, table_root) if table_root is not None else path
    if quote(relative, safe="/=") != relative:  # a Delta log path is a URI: ours never need escaping
        raise ValueError(f"{relative!r} would need URI escaping in the Delta log")
    return PendingFile(
        path=relative,
        size=st.st_size, modification_time=int(st.st_mtime * 1000), rows=meta.num_rows,
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

"""One control table of a pipeline (``checkpoints``, ``epochs``, ``acks``, ``sessions``): a small
Delta table written and read from the driver with delta-rs, and the plumbing every control store
shares.

:class:`ControlTable` creates its table on first write, reads it as one snapshot, and appends by
compare-and-swap on the snapshot that decided (:func:`~checkpoint_lib.core.cas.commit_on_snapshot`,
``max_commit_retries=0``), fenced inside that same commit when the writer names its epoch: the
table's application transaction ``FENCE_APP_ID`` carries the newest epoch that began, and a write
of an older epoch finds it on the very snapshot it would land on (:class:`FencedError`, nothing
landed). :class:`ControlRoot` is where a pipeline's control tables live.

Reads load the whole (small) table fresh every time (through delta-rs' DataFusion reader, several
times faster than ``to_pyarrow_table`` on many small files): nothing is cached across calls, so
several processes see each other's writes. Tables are created with a Delta log checkpoint every 10
commits, and compacted by :meth:`ControlTable.compact` (one optimize commit; concurrent appends do
not conflict with it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, Union

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, QueryBuilder, write_deltalake
from deltalake import Transaction as AppTransaction
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from ..core.cas import commit_on_snapshot
from ..core.clock import Clock
from ..core.errors import CheckpointError, FencedError
from ..layout import control_table
from ..objectstore import is_remote, verify_conditional_put

COMMIT_ATTEMPTS = 60
FENCE_APP_ID = "checkpoint_lib/epoch"
"""The Delta application transaction every fenced control table carries: its version is the newest
epoch that began. :meth:`~checkpoint_lib.delta.epochs.DeltaEpochStore.begin` raises it on every
fenced table before it returns, and a fenced write checks it on the very snapshot its commit lands
on top of."""
TABLE_CONFIGURATION = {"delta.checkpointInterval": "10"}
"""Opening a Delta table replays the JSON commits since its last log checkpoint; at the default
interval (100) that replay dominates every read of these tiny tables (~35 ms vs ~17 ms)."""


class CorruptControlTableError(CheckpointError):
    """A control table (``checkpoints``, ``acks``, ``sessions``, ``epochs``) cannot be read: a data
    file or a commit of its Delta log is damaged. Not something a kill leaves (Delta makes a file
    visible only once it is whole), so nothing is decided on it: every reader stops, before writing
    anything, naming the file."""


def diagnose_table(path: str) -> str:
    """Which file of the Delta table at ``path`` is damaged, as precisely as can be found: a commit
    file that is not JSON lines, or a data file whose Parquet footer does not read."""
    import pyarrow.parquet as pq

    log_dir = Path(path) / "_delta_log"
    for commit in sorted(log_dir.glob("*.json")):
        try:
            for n, line in enumerate(commit.read_text().splitlines(), 1):
                if line.strip():
                    json.loads(line)
        except (ValueError, UnicodeDecodeError) as exc:
            return f"commit file {commit} is damaged (line {n}: {exc})"
    try:
        uris = DeltaTable(path).file_uris()
    except Exception as exc:  # noqa: BLE001 - the log itself: say what delta-rs says
        return f"its Delta log cannot be read ({str(exc).splitlines()[0]})"
    for uri in uris:
        local = uri[len("file://"):] if uri.startswith("file://") else uri
        try:
            pq.read_metadata(local)
        except Exception as exc:  # noqa: BLE001 - truncated, not Parquet, or gone
            return f"data file {local} is damaged or missing ({str(exc).splitlines()[0]})"
    return "no damaged file found (the error above is all there is)"


def _corrupt_table(uri: str, exc: BaseException) -> CorruptControlTableError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return CorruptControlTableError(
        f"the control table {uri} cannot be read: {diagnose_table(uri)}. Nothing was written and nothing "
        f"was decided on it. A crash does not leave this (Delta shows a file only once it is whole): the "
        f"disk or a tool damaged it. Put the file back from a copy of the warehouse, then run again. "
        f"(delta-rs: {first})"
    )


# --- where the tables live ---------------------------------------------------------------------


@dataclass(frozen=True)
class ControlRoot:
    """A pipeline's control folder: a local path, or an object-store URI (``s3://bucket/prefix``,
    ``gs://``, ``az://``) with its delta-rs ``storage_options``; ``now`` stamps the rows."""

    root: str
    is_local: bool
    storage_options: Mapping[str, str] | None = None
    now: Callable[[], float] = field(default=time.time, compare=False)

    @classmethod
    def at(cls, root: Union[str, Path], storage_options: Mapping[str, str] | None = None,
           clock: Union[Clock, Callable[[], float], None] = None) -> "ControlRoot":
        root_str = str(root)
        local = root_str[len("file://"):] if root_str.startswith("file://") else root_str
        is_local = not is_remote(local)
        if is_local and "://" in local:
            raise ValueError(f"{root_str}: not a local path nor an object-store URI (s3://, gs://, az://)")
        if clock is None:
            now: Callable[[], float] = time.time
        elif callable(getattr(clock, "now", None)):
            now = clock.now  # type: ignore[union-attr]
        else:
            now = clock  # type: ignore[assignment]
        return cls(str(Path(local)) if is_local else local.rstrip("/"), is_local,
                   dict(storage_options) if storage_options else None, now)


class ControlTable:
    """One control table: created on first write, read as one snapshot, appended by
    compare-and-swap on the snapshot that decided, fenced by epoch inside that commit."""

    def __init__(self, place: ControlRoot, name: str, schema: pa.Schema):
        self.place = place
        self.name = name
        self.schema = schema
        self.uri = str(control_table(place.root, name))
        self._created = False

    def __repr__(self) -> str:
        return f"ControlTable({self.uri!r})"

    def ensure(self) -> None:
        """Create the table if missing (idempotent; racing creators: one wins, all succeed)."""
        if self._created:
            return
        if not self.place.is_local:
            # every write reaches here first: delta-rs's commits are as unique as the store's
            # create-if-absent, so a store that ignores it is refused before anything is written
            verify_conditional_put(self.place.root, self.place.storage_options)
        DeltaTable.create(self.uri, self.schema, mode="ignore", name=self.name,
                          configuration=TABLE_CONFIGURATION, storage_options=self.place.storage_options)
        self._created = True

    def exists(self) -> bool:
        return DeltaTable.is_deltatable(self.uri, storage_options=self.place.storage_options)

    def load(self) -> DeltaTable | None:
        """The latest snapshot, or None when the table was never created."""
        try:
            return DeltaTable(self.uri, storage_options=self.place.storage_options)
        except TableNotFoundError:
            return None
        except (DeltaError, OSError, ValueError) as exc:  # a damaged commit file
            raise _corrupt_table(self.uri, exc) from exc

    def read(self, select: str = "*", dt: DeltaTable | None = None) -> tuple[pa.Table, int]:
        """``select <select> from`` one snapshot of the table (``dt``'s, or the latest), and its
        number of data files. An empty table of the schema when it was never created."""
        if dt is None:
            dt = self.load()
        if dt is None:
            return self.schema.empty_table(), 0
        try:
            table = pa.table(QueryBuilder().register("t", dt).execute(f"select {select} from t"))
        except (DeltaError, OSError, pa.ArrowException) as exc:  # a damaged or missing data file
            raise _corrupt_table(self.uri, exc) from exc
        return table, len(dt.file_uris())

    def rows(self, dt: DeltaTable | None = None) -> list[dict[str, Any]]:
        return self.read(dt=dt)[0].to_pylist()

    def max(self, column: str, dt: DeltaTable | None = None) -> int:
        table, _ = self.read(f"max({column}) as m", dt=dt)
        value = table["m"][0].as_py() if table.num_rows else None
        return value or 0

    def commit(
        self,
        build: Callable[[DeltaTable], Sequence[dict[str, Any]] | None],
        *,
        fence: int | None = None,
        stamp: AppTransaction | None = None,
    ) -> int:
        """Append ``build(snapshot)`` as ONE Delta commit placed exactly on top of the snapshot
        ``build`` read: a compare-and-swap on the table's version. If anyone committed in between,
        nothing of ours is visible; we read the new snapshot and decide again. So every check
        ``build`` makes (a status, a live session, the next number) and the epoch fence (``fence``:
        :class:`FencedError` when the table's fence names a newer epoch) hold at the instant the
        rows land, however long this process stalled before committing.

        ``build`` returns the rows (``[]`` with a ``stamp``: commit the stamp alone), or None for
        nothing to do; it may raise to refuse. ``stamp``: an application transaction committed with
        the rows (the epoch fence). Returns the number of data files the snapshot had."""
        def read() -> DeltaTable:
            self.ensure()  # two first writers racing to create it: one retries
            dt = self.load()
            assert dt is not None, f"{self.uri} was just created"
            return dt

        def attempt(dt: DeltaTable) -> int:
            if fence is not None:
                self.check_fence(dt, fence)
            rows = build(dt)
            if rows is None or (not rows and stamp is None):
                return len(dt.file_uris())
            properties = CommitProperties(max_commit_retries=0, app_transactions=None if stamp is None else [stamp])
            write_deltalake(
                dt, pa.Table.from_pylist(list(rows), schema=self.schema), mode="append",
                commit_properties=properties, schema_mode="merge",  # a table of an older version
            )
            return len(dt.file_uris())

        files, _ = commit_on_snapshot(
            read, attempt, lost=CommitFailedError, attempts=COMMIT_ATTEMPTS,
            exhausted=lambda n: CommitFailedError(f"{self.uri}: {n} attempts to commit lost to concurrent writers"))
        return files

    def fenced_by(self, dt: DeltaTable | None = None) -> int:
        """The newest epoch that fenced this table (0: none yet)."""
        dt = self.load() if dt is None else dt
        version = None if dt is None else dt.transaction_version(FENCE_APP_ID)
        return int(version or 0)

    def check_fence(self, dt: DeltaTable, epoch: int) -> None:
        fenced_by = self.fenced_by(dt)
        if epoch < fenced_by:
            raise FencedError(
                f"{self.place.root}: epoch {epoch} is fenced: epoch {fenced_by} has taken over "
                f"(this is a zombie of an older attempt; its write to {self.name} was refused)"
            )

    def raise_fence(self, epoch: int) -> None:
        """Fence the table at ``epoch``: from the return on, no write of an older epoch lands."""
        self.commit(lambda dt: [], fence=epoch, stamp=AppTransaction(FENCE_APP_ID, epoch))

    def compact(self, vacuum: bool | None = True) -> None:
        """Rewrite the table's small files into one (one atomic commit; concurrent appends do not
        conflict with it), then vacuum: delete files tombstoned longer ago than Delta's retention
        (7 days), which no reader of a recent version needs. ``vacuum=None``: only when the table
        version crossed a multiple of 100 (vacuum lists every file, so not on every compaction)."""
        dt = self.load()
        if dt is None:
            return
        before = dt.version()
        dt.optimize.compact()
        if vacuum or (vacuum is None and dt.version() // 100 != before // 100):
            dt.vacuum(dry_run=False)


class StoreOnTable:
    """What a store on one :class:`ControlTable` (``self.table``) answers maintenance by (the
    ``name``, ``load`` and ``rows_at`` of :class:`~checkpoint_lib.core.retention.PrunedStore`)."""

    table: ControlTable

    @property
    def name(self) -> str:
        return self.table.name

    def load(self) -> DeltaTable | None:
        return self.table.load()

    def rows_at(self, snapshot: DeltaTable) -> list[dict[str, Any]]:
        return self.table.rows(snapshot)

"""``DeltaCheckpointStore``: a pipeline's checkpoint ids, completed checkpoints and epochs, durable.

Layout under ``root`` (e.g. ``<warehouse>/_checkpoints/<pipeline>``)::

    root/checkpoints/   Delta table, append-only event log: one row per status change
    root/epochs/        Delta table, one row per attempt (epoch)
    root/acks/          Delta table, acks of pending checkpoints as they arrive (stages in separate processes)
    root/sessions/      Delta table, runs of each stage within an epoch, restore and rollback records
    root/_ids/          one reservation marker per checkpoint id ever handed out or written

Every write is a compare-and-swap, and fenced inside its own commit
-------------------------------------------------------------------
Each write to a control table (:meth:`DeltaCheckpointStore._commit`) reads a snapshot, decides on
it (a checkpoint's status, whether a session of the stage is live, the next epoch number) and
commits exactly on top of it: delta-rs with ``max_commit_retries=0`` refuses the commit when any
other commit took the next version, and the writer then reads again and decides again. So what a
write checked still holds when it lands: exactly one of ``completed`` and ``aborted`` wins, a stage
has at most one live session per epoch, epochs are unique. The epoch fence rides the same way:
:meth:`~DeltaCheckpointStore.begin_epoch` commits its row on top of the largest epoch, then raises
the fence (the application transaction ``FENCE_APP_ID``, version = the epoch) of every table it
fences (``checkpoints``, ``acks``, ``sessions``) before it returns, and a fenced write reads the
fence on the very snapshot it commits on. A zombie that stalled between its checks and its write
finds its commit refused and the newer fence on the next read: :class:`FencedError`, nothing
landed. (Epochs and sessions used to be reserved with ``O_EXCL`` marker files: a marker orphaned by
a kill between the marker and the row stalled a stage for good. Leftover marker files are ignored.)

Why markers for checkpoint ids
------------------------------
Two Delta appends never conflict: delta-rs (checked with deltalake 1.6.6, four processes appending
concurrently) rebases a blind append onto whatever committed first and both land. So "1 + the
largest id in the table" is not unique under a race, and a pending row cannot reserve an id.
Uniqueness comes from creating ``root/_ids/<id>`` with ``O_CREAT | O_EXCL``: exactly one creator
succeeds, atomically, on a local or POSIX filesystem, and the marker survives a crash the instant
it exists (the directory is fsynced before the id is returned, so also a power loss). An object
store needs the equivalent conditional put (``If-None-Match: *`` on S3, GCS's
``ifGenerationMatch=0``, Azure's ``If-None-Match``): :mod:`checkpoint_lib.objectstore` is that
:class:`Reservations` for an ``s3://``, ``gs://`` or ``az://`` root.

Every id that is written to the table (``record_pending``, ``record_aborted``, ``add``) is also
marked first, so the markers are a superset of the ids in the table and a counter that probes
``1 + max(table, what this process handed out)`` upwards, skipping existing markers, never returns
an id anyone has used, even one whose process died before writing any row. Markers are tiny and
never deleted (deleting them safely would need a fence of its own); the hot path never lists the
directory, it only probes the next few names.

Decision: ``get_and_increment`` only reserves (the marker is the durable reservation) and writes
no row, because it does not know the checkpoint's kind or epoch. ``record_pending`` writes the
``pending`` row for the history, explicitly, when the adapter triggers the checkpoint. A crash
between the two leaves a marker and no row: the id is skipped forever and the history never shows
it, which is what a checkpoint that was never triggered should look like.

Status of a checkpoint
----------------------
The latest status per id is the row of highest rank: ``pending`` < ``aborted`` < ``completed`` <
``discarded`` (the statuses only move forward, so rank order is time order; a read never depends
on the order Delta returns files in, which compaction changes). Between two rows of the same rank
(only racing writers produce them) the earliest ``recorded_at`` wins, for every reader alike.

Crash safety (kill -9 between any two writes)
---------------------------------------------
Each Delta commit is atomic: a reader sees a commit's rows entirely or not at all. Data files of a
failed or unfinished commit are unreferenced and invisible. Per method:

- ``get_and_increment``: (1) create the marker, (2) fsync the directory. Before (1): nothing
  happened. After (1)/(2): the number is burnt (never handed out again) but unused.
- ``begin_epoch``: (1) the epoch row, (2) one fence commit per fenced table. After (1), before the
  last of (2): the epoch is current but nobody acts as it; the next ``begin_epoch`` takes the next
  number and fences above it.
- ``record_pending`` / ``record_aborted``: (1) mark the id, (2) one append. A crash leaves the
  previous status; the id is never reused.
- ``add``: (1) mark the id, (2) append the ``completed`` row: **the durability point**, (3) append
  ``discarded`` rows for what retention evicted, (4) maybe compact. A crash before (2): the
  checkpoint is not complete (recovery uses the previous one, the coordinator never told anyone
  it completed). After (2), before (3): readers re-apply retention, so the evicted checkpoints are
  already gone from ``all()``/``latest()``/``get()``; only their snapshot data may not have been
  discarded yet: :meth:`DeltaCheckpointStore.pending_discards` lists them for the recovering driver
  (discarding is idempotent) and :meth:`~DeltaCheckpointStore.mark_discarded` records it. (4) is a
  single Delta commit (remove + add of the same rows): before or after it the rows are the same.
- ``compact``: one optimize commit, then a vacuum of files tombstoned more than a week ago.

A row that cannot be decoded (e.g. its ``acks_json`` does not parse) is skipped with a
:class:`CorruptCheckpointWarning` (and a logged warning): it is not completed, ``latest()`` falls
back to the previous completed checkpoint.

Reads load the whole (small) table fresh every time (through delta-rs' DataFusion reader, several
times faster than ``to_pyarrow_table`` on many small files): nothing is cached across calls, so
several processes see each other's writes. Every append adds a data file and a commit, and the cost
of a read grows with both, so the tables are created with a Delta log checkpoint every 10 commits
and compacted automatically once they have ``compact_after_files`` data files (default 8); that
keeps an append at ~20 ms and a full read at ~15-20 ms on a local disk, whatever the history length.

Do not ``fork`` a process after it used a store (delta-rs' runtime does not survive a fork and the
child deadlocks): use the ``spawn`` start method for worker processes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import socket
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, Union

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, QueryBuilder, write_deltalake
from deltalake import Transaction as AppTransaction
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from ..core.cas import commit_on_snapshot
from ..core.checkpoints import CompletedCheckpoint
from ..core.clock import Clock
from ..core.errors import (
    CheckpointAbortedError, CheckpointError, FailureReason, FencedError, NoCheckpointError, UnknownCheckpointError,
)
from ..core.recovery import SINK_STATE_KEY, RecoveryPlan, plan_recovery
from ..core.twophase import SinkSnapshot, Transaction
from ..core.stores import apply_retention
from ..core.types import CheckpointId, CheckpointKind, CheckpointStatus, SubtaskAck, SubtaskId
from ..files import fsync_dir
from ..layout import control_table, reservation_markers
from ..objectstore import ObjectStoreReservations, is_remote, verify_conditional_put

log = logging.getLogger(__name__)

STATUSES = (CheckpointStatus.PENDING, CheckpointStatus.ABORTED, CheckpointStatus.COMPLETED, CheckpointStatus.DISCARDED)
"""Every status, in the order a later row of one checkpoint may follow an earlier one."""
ONCE_COMPLETED = (CheckpointStatus.COMPLETED, CheckpointStatus.DISCARDED)
"""The statuses of a checkpoint that completed (a discarded one completed before)."""
_RANK = {status: rank for rank, status in enumerate(STATUSES)}

ACKS_FORMAT_VERSION = 1

CHECKPOINTS_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("trigger_time", pa.float64(), nullable=False),
        pa.field("completion_time", pa.float64()),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("failure_reason", pa.string()),
        pa.field("message", pa.string()),
        pa.field("acks_json", pa.string()),
        pa.field("state_bytes", pa.int64(), nullable=False),
        pa.field("channel_state_rows", pa.int64(), nullable=False),
        pa.field("channel_state_bytes", pa.int64(), nullable=False),
        pa.field("alignment_ms", pa.float64(), nullable=False),
        pa.field("unaligned", pa.bool_(), nullable=False),
        pa.field("recorded_at", pa.float64(), nullable=False),
        pa.field("validated_at", pa.float64()),
    ]
)
"""The ``checkpoints`` table: append-only, one row per status change of a checkpoint.
``validated_at`` (added later: older tables gain it on their next write) is set only on the
``completed`` row :meth:`DeltaCheckpointStore.record_validation` appends when the per-checkpoint
validation passed."""

EPOCHS_SCHEMA = pa.schema(
    [
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("started_at", pa.float64(), nullable=False),
        pa.field("owner", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
    ]
)
"""The ``epochs`` table: one row per attempt; the largest epoch is the current one."""

ACKS_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("subtask", pa.string(), nullable=False),
        pa.field("ack_json", pa.string(), nullable=False),
        pa.field("ack_time", pa.float64(), nullable=False),
        pa.field("recorded_at", pa.float64(), nullable=False),
    ]
)
"""The ``acks`` table: acknowledgements of pending checkpoints, durable as they arrive, so that
stages running as separate processes complete a checkpoint together (whoever writes the last ack
completes it). A completed row repeats every ack (``acks_json``): this table is only read for
pending checkpoints."""

SESSIONS_SCHEMA = pa.schema(
    [
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("session", pa.int64(), nullable=False),
        pa.field("event", pa.string(), nullable=False),
        pa.field("checkpoint_id", pa.int64()),
        pa.field("resume_json", pa.string()),
        pa.field("owner", pa.string(), nullable=False),
        pa.field("recorded_at", pa.float64(), nullable=False),
    ]
)
"""The ``sessions`` table: within an epoch, each run of a stage (a process) is a session with a
``start`` row and, when it stopped cleanly, an ``end`` row carrying where the next session of the
stage resumes. The epoch's ``restored`` row (stage ``*``) says which checkpoint it restored (null:
none) once the restore is done. A start without an end means the process died: the next start of
that stage recovers (a new epoch)."""

_SCHEMAS = {
    "checkpoints": CHECKPOINTS_SCHEMA, "epochs": EPOCHS_SCHEMA, "acks": ACKS_SCHEMA, "sessions": SESSIONS_SCHEMA,
}
START, END, RESTORED, ROLLBACK = "start", "end", "restored", "rollback"
ALL_STAGES = "*"
_TABLE_CONFIGURATION = {"delta.checkpointInterval": "10"}
"""Opening a Delta table replays the JSON commits since its last log checkpoint; at the default
interval (100) that replay dominates every read of these tiny tables (~35 ms vs ~17 ms)."""
_SUBTASK = re.compile(r"^(.+)\[(\d+)\]$")
_COMMIT_ATTEMPTS = 60
FENCE_APP_ID = "checkpoint_lib/epoch"
"""The Delta application transaction every fenced control table carries: its version is the newest
epoch that began. :meth:`DeltaCheckpointStore.begin_epoch` raises it on every table before it
returns, and a fenced write checks it on the very snapshot its commit lands on top of."""
_FENCED_TABLES = ("checkpoints", "acks", "sessions")
_STAGE = re.compile(r"^[a-z][a-z0-9_]*$")


class CorruptCheckpointWarning(UserWarning):
    """A row of the checkpoints table could not be decoded; it is treated as not completed."""


class _Corrupt(ValueError):
    pass


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


# --- reservations ------------------------------------------------------------------------------


class Reservations(Protocol):
    """Create-if-absent markers: the one primitive that makes ids and epochs unique under races."""

    def claim(self, namespace: str, number: int) -> bool:
        """Atomically create marker ``number``; True iff this call created it. Durable on return."""
        ...

    def exists(self, namespace: str, number: int) -> bool:
        ...


class LocalReservations:
    """Markers as files ``<directory>/_<namespace>/<number:020d>`` created with ``O_EXCL``."""

    def __init__(self, directory: Union[str, Path]):
        self.directory = Path(directory)
        self._made: set[str] = set()

    def _path(self, namespace: str, number: int) -> Path:
        return Path(reservation_markers(self.directory, namespace)) / f"{number:020d}"

    def claim(self, namespace: str, number: int) -> bool:
        path = self._path(namespace, number)
        if namespace not in self._made:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._made.add(namespace)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            # Informative only (who took it, when): an empty marker reserves just as well.
            os.write(fd, f"{socket.gethostname()}:{os.getpid()} {time.time():.6f}\n".encode())
        finally:
            os.close(fd)
        fsync_dir(path.parent)
        return True

    def exists(self, namespace: str, number: int) -> bool:
        return self._path(namespace, number).exists()


def _reserve_from(reservations: Reservations, namespace: str, start: int) -> int:
    number = start
    while not reservations.claim(namespace, number):
        number += 1
    return number


# --- acks (de)serialisation ----------------------------------------------------------------------


def _ack_fields(ack: SubtaskAck) -> dict[str, Any]:
    """Every field of ``ack`` (its state as a plain dict)."""
    return {**dataclasses.asdict(ack), "state": dict(ack.state)}


def _digest(acks: Any, ack_times: Any) -> str:
    """SHA-256 of the acks as JSON: a row whose acks were edited or damaged into other valid JSON
    (e.g. an ack dropped) no longer matches it."""
    text = json.dumps({"acks": acks, "ack_times": ack_times}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def encode_acks(checkpoint: CompletedCheckpoint) -> str:
    """The checkpoint's ``acks`` and ``ack_times`` as JSON, subtasks keyed ``"operator[index]"``,
    with their ``digest``."""
    acks = {str(subtask): _ack_fields(ack) for subtask, ack in checkpoint.acks.items()}
    ack_times = {str(subtask): t for subtask, t in checkpoint.ack_times.items()}
    try:
        return json.dumps(
            {"version": ACKS_FORMAT_VERSION, "acks": acks, "ack_times": ack_times,
             "digest": _digest(acks, ack_times)},
            sort_keys=True,
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"checkpoint {checkpoint.checkpoint_id}: acks are not JSON-serialisable: {exc}"
        ) from exc


_ACK_FIELDS = {f.name for f in dataclasses.fields(SubtaskAck)}


def _subtask(text: Any) -> SubtaskId:
    m = _SUBTASK.match(text) if isinstance(text, str) else None
    if m is None:
        raise _Corrupt(f"bad subtask key {text!r}")
    return SubtaskId(m.group(1), int(m.group(2)))


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Corrupt(f"{what} is not an integer: {value!r}")
    return value


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Corrupt(f"{what} is not a number: {value!r}")
    return value


def decode_acks(text: Any) -> tuple[dict[SubtaskId, SubtaskAck], dict[SubtaskId, float]]:
    """Inverse of :func:`encode_acks`; raises ``ValueError`` on anything malformed."""
    if not isinstance(text, str):
        raise _Corrupt("acks_json is missing")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise _Corrupt(f"acks_json does not parse: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != ACKS_FORMAT_VERSION:
        raise _Corrupt(f"acks_json has no known format version: {str(doc)[:80]!r}")
    raw_acks, raw_times = doc.get("acks"), doc.get("ack_times")
    if not isinstance(raw_acks, dict) or not isinstance(raw_times, dict):
        raise _Corrupt("acks_json lacks 'acks' or 'ack_times'")
    if "digest" in doc and doc["digest"] != _digest(raw_acks, raw_times):
        raise _Corrupt("acks_json does not match its digest (edited or damaged after it was written)")
    acks: dict[SubtaskId, SubtaskAck] = {}
    for key, a in raw_acks.items():
        if not isinstance(a, dict) or not isinstance(a.get("state"), dict):
            raise _Corrupt(f"ack of {key!r} is malformed")
        unaligned = a.get("unaligned")
        if not isinstance(unaligned, bool):
            raise _Corrupt(f"ack of {key!r}: unaligned is not a boolean")
        acks[_subtask(key)] = SubtaskAck(
            state=a["state"],
            state_size_bytes=_int(a.get("state_size_bytes"), "state_size_bytes"),
            channel_state_rows=_int(a.get("channel_state_rows"), "channel_state_rows"),
            channel_state_bytes=_int(a.get("channel_state_bytes"), "channel_state_bytes"),
            alignment_ms=_number(a.get("alignment_ms"), "alignment_ms"),
            unaligned=unaligned,
            duration_ms=_number(a.get("duration_ms"), "duration_ms"),
        )
    times = {_subtask(key): _number(t, "ack time") for key, t in raw_times.items()}
    _check_structure(acks)
    return acks, times


def _check_structure(acks: Mapping[SubtaskId, SubtaskAck]) -> None:
    """What every restorable checkpoint satisfies, digest or not: each 2PC sink ack holds a
    transaction snapshot that parses (with its ``current`` transaction), and each keyed operator's
    ``key_groups`` ranges tile ``0..n`` with no gap and no overlap (restore would otherwise leave
    some keys without state, silently)."""
    ranges: dict[str, list[Any]] = {}
    for subtask, ack in acks.items():
        if SINK_STATE_KEY in ack.state or subtask.sink is not None:
            try:
                SinkSnapshot.from_dict(ack.state[SINK_STATE_KEY])
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise _Corrupt(f"ack of {subtask}: its sink transactions are missing or malformed ({exc!r})") from None
        if "key_groups" in ack.state:
            ranges.setdefault(subtask.operator, []).append(ack.state["key_groups"])
    for operator, spans in ranges.items():
        try:
            bounds = sorted((_int(lo, "key group"), _int(hi, "key group")) for lo, hi in spans)
        except (TypeError, ValueError):
            raise _Corrupt(f"operator {operator!r}: malformed key_groups {spans!r}") from None
        expected = 0
        for lo, hi in bounds:
            if lo != expected or hi < lo:
                raise _Corrupt(
                    f"operator {operator!r}: its subtasks' key groups {bounds} leave a gap or overlap "
                    f"at key group {expected}: restoring would lose or double keyed state"
                )
            expected = hi + 1


def _reason(value: Any) -> FailureReason | None:
    try:
        return FailureReason(value)
    except ValueError:
        return None


def _decode_row(row: Mapping[str, Any]) -> CompletedCheckpoint:
    try:
        kind = CheckpointKind(row["kind"])
    except ValueError:
        raise _Corrupt(f"unknown kind {row['kind']!r}") from None
    if row["completion_time"] is None:
        raise _Corrupt("a completed checkpoint without completion_time")
    acks, ack_times = decode_acks(row["acks_json"])
    return CompletedCheckpoint(
        checkpoint_id=row["checkpoint_id"],
        kind=kind,
        trigger_time=row["trigger_time"],
        completion_time=row["completion_time"],
        acks=acks,
        ack_times=ack_times,
    )


# --- the store -------------------------------------------------------------------------------------


@dataclass
class _View:
    """One consistent read of the checkpoints table, interpreted."""

    rows_by_id: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    effective: dict[int, dict[str, Any]] = field(default_factory=dict)
    kept: list[CompletedCheckpoint] = field(default_factory=list)
    evicted: list[CompletedCheckpoint] = field(default_factory=list)
    corrupt: set[int] = field(default_factory=set)
    validated: dict[int, float] = field(default_factory=dict)
    """id -> when its per-checkpoint validation passed (first record)."""
    file_count: int = 0


def _effective_row(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The row that states the checkpoint's status: highest rank, then earliest recorded."""
    return min(
        rows,
        key=lambda r: (-_RANK[r["status"]], r["recorded_at"], r["acks_json"] or "", r["message"] or ""),
    )


class DeltaCheckpointStore:
    """A pipeline's durable ``CheckpointIdCounter`` + ``CompletedCheckpointStore`` + epochs.

    The constructor does no I/O; tables and directories are created on first write (or eagerly by
    :meth:`open`). ``root`` is a local path (or ``file://`` URI) or an object-store URI
    (``s3://bucket/prefix``, ``gs://``, ``az://``), whose ids and epochs are reserved by conditional
    puts (:class:`~checkpoint_lib.objectstore.ObjectStoreReservations`; a store that ignores them is
    refused); ``storage_options`` are delta-rs / object_store settings, the environment's by default.

    ``epoch``: the attempt this instance writes as (set by :meth:`begin_epoch`, or given). When set,
    :meth:`add` refuses with :class:`FencedError` once a newer epoch exists, and rows carry it;
    otherwise rows carry epoch 0.
    """

    def __init__(
        self,
        root: Union[str, Path],
        retained: int | None = None,
        *,
        clock: Union[Clock, Callable[[], float], None] = None,
        epoch: int | None = None,
        reservations: Reservations | None = None,
        storage_options: Mapping[str, str] | None = None,
        compact_after_files: int = 8,
    ):
        if retained is not None and retained < 1:
            raise ValueError("retained must be >= 1")
        root_str = str(root)
        local = root_str[len("file://") :] if root_str.startswith("file://") else root_str
        is_local = not is_remote(local)
        if is_local and "://" in local:
            raise ValueError(f"{root_str}: not a local path nor an object-store URI (s3://, gs://, az://)")
        if reservations is None:
            # on an object store: conditional puts, the store checked to honour them on first use
            reservations = LocalReservations(local) if is_local else ObjectStoreReservations(local, storage_options)
        self.root = local.rstrip("/") if not is_local else str(Path(local))
        self.retained = retained
        self.epoch = epoch
        self.compact_after_files = compact_after_files
        self._is_local = is_local
        self._reservations = reservations
        self._storage_options = dict(storage_options) if storage_options else None
        if clock is None:
            self._now: Callable[[], float] = time.time
        elif callable(getattr(clock, "now", None)):
            self._now = clock.now  # type: ignore[union-attr]
        else:
            self._now = clock  # type: ignore[assignment]
        self._lock = threading.RLock()
        self._created: set[str] = set()
        self._logged: set[str] = set()
        self._id_high_water = 0

    @classmethod
    def open(cls, root: Union[str, Path], retained: int | None = None, **kwargs: Any) -> "DeltaCheckpointStore":
        """A store on ``root``, with its directory and both tables created if missing.

        ``retained``: how many completed checkpoints the *writer* keeps (it evicts on ``add`` and
        re-applies it on reads, covering a crash between the completed and discarded commits).
        None (a reader, e.g. ``ckpt checkpoints list``): only the recorded discards evict, so
        every reader sees what the writer decided."""
        store = cls(root, retained, **kwargs)
        if store._is_local:
            Path(store.root).mkdir(parents=True, exist_ok=True)
        for name in _SCHEMAS:
            store._ensure_table(name)
        return store

    @classmethod
    def existing(cls, root: Union[str, Path], **kwargs: Any) -> "DeltaCheckpointStore":
        """A reader's store on ``root``, which must hold one already: creates nothing, and raises
        :class:`NoCheckpointError` naming what it looked for (and, locally, the pipelines that do
        have checkpoints next to it) when the pipeline never ran there."""
        store = cls(root, None, **kwargs)
        if not DeltaTable.is_deltatable(store._uri("checkpoints"), storage_options=store._storage_options):
            here = Path(store.root)
            known = sorted(p.name for p in here.parent.iterdir()
                           if Path(control_table(p, "checkpoints")).is_dir()) \
                if store._is_local and here.parent.is_dir() else []
            raise NoCheckpointError(
                f"no checkpoints at {store.root}: pipeline {here.name!r} never ran in this warehouse"
                + (f" (pipelines with checkpoints here: {', '.join(known)})" if known else
                   "; check --warehouse and the pipeline name"))
        return store

    def __repr__(self) -> str:
        return f"DeltaCheckpointStore({self.root!r}, retained={self.retained}, epoch={self.epoch})"

    # --- Delta plumbing -------------------------------------------------------------------------

    def _uri(self, name: str) -> str:
        return str(control_table(self.root, name))

    def _ensure_table(self, name: str) -> None:
        if name in self._created:
            return
        if not self._is_local:
            # every write reaches here first: delta-rs's commits are as unique as the store's
            # create-if-absent, so a store that ignores it is refused before anything is written
            verify_conditional_put(self.root, self._storage_options)
        DeltaTable.create(
            self._uri(name),
            _SCHEMAS[name],
            mode="ignore",
            name=name,
            configuration=_TABLE_CONFIGURATION,
            storage_options=self._storage_options,
        )
        self._created.add(name)

    def _load(self, name: str) -> DeltaTable | None:
        try:
            return DeltaTable(self._uri(name), storage_options=self._storage_options)
        except TableNotFoundError:
            return None
        except (DeltaError, OSError, ValueError) as exc:  # a damaged commit file
            raise _corrupt_table(self._uri(name), exc) from exc

    def _read(self, name: str, select: str = "*", dt: DeltaTable | None = None) -> tuple[pa.Table, int]:
        """``select <select> from`` one snapshot of the table (``dt``'s, or the latest), and its
        number of data files."""
        if dt is None:
            dt = self._load(name)
        if dt is None:
            return _SCHEMAS[name].empty_table(), 0
        try:
            table = pa.table(QueryBuilder().register("t", dt).execute(f"select {select} from t"))
        except (DeltaError, OSError, pa.ArrowException) as exc:  # a damaged or missing data file
            raise _corrupt_table(self._uri(name), exc) from exc
        return table, len(dt.file_uris())

    def check_readable(self) -> None:
        """Read every control table whole: :class:`CorruptControlTableError` naming the damaged
        file if one cannot be read. A recovery calls it before it writes anything."""
        for name in _SCHEMAS:
            self._read(name)

    def _max(self, name: str, column: str) -> int:
        table, _ = self._read(name, f"max({column}) as m")
        value = table["m"][0].as_py() if table.num_rows else None
        return value or 0

    def _commit(
        self,
        name: str,
        build: Callable[[DeltaTable], Sequence[dict[str, Any]] | None],
        *,
        fence: int | None = None,
        stamp: AppTransaction | None = None,
    ) -> int:
        """Append ``build(snapshot)`` to table ``name`` as ONE Delta commit placed exactly on top of
        the snapshot ``build`` read: a compare-and-swap on the table's version. If anyone committed
        in between, nothing of ours is visible; we read the new snapshot and decide again. So every
        check ``build`` makes (a status, a live session, the next number) and the epoch fence
        (``fence``: :class:`FencedError` when the table's fence names a newer epoch) hold at the
        instant the rows land, however long this process stalled before committing.

        ``build`` returns the rows (``[]`` with a ``stamp``: commit the stamp alone), or None for
        nothing to do; it may raise to refuse. ``stamp``: an application transaction committed with
        the rows (the epoch fence). Returns the number of data files the snapshot had."""
        def read() -> DeltaTable:
            self._ensure_table(name)  # two first writers racing to create it: one retries
            dt = self._load(name)
            assert dt is not None, f"{self._uri(name)} was just created"
            return dt

        def attempt(dt: DeltaTable) -> int:
            if fence is not None:
                self._check_fence(name, dt, fence)
            rows = build(dt)
            if rows is None or (not rows and stamp is None):
                return len(dt.file_uris())
            properties = CommitProperties(max_commit_retries=0, app_transactions=None if stamp is None else [stamp])
            write_deltalake(
                dt, pa.Table.from_pylist(list(rows), schema=_SCHEMAS[name]), mode="append",
                commit_properties=properties, schema_mode="merge",  # a table of an older version
            )
            return len(dt.file_uris())

        files, _ = commit_on_snapshot(
            read, attempt, lost=CommitFailedError, attempts=_COMMIT_ATTEMPTS,
            exhausted=lambda n: CommitFailedError(f"{self._uri(name)}: {n} attempts to commit lost to concurrent writers"))
        return files

    def fence(self, name: str) -> int:
        """The newest epoch that fenced table ``name`` (0: none yet)."""
        dt = self._load(name)
        version = None if dt is None else dt.transaction_version(FENCE_APP_ID)
        return int(version or 0)

    def _check_fence(self, name: str, dt: DeltaTable, epoch: int) -> None:
        fenced_by = int(dt.transaction_version(FENCE_APP_ID) or 0)
        if epoch < fenced_by:
            raise FencedError(
                f"{self.root}: epoch {epoch} is fenced: epoch {fenced_by} has taken over "
                f"(this is a zombie of an older attempt; its write to {name} was refused)"
            )

    def compact(self, vacuum: bool | None = True) -> None:
        """Rewrite each table's small files into one (one atomic commit; concurrent appends do not
        conflict with it), then vacuum: delete files tombstoned longer ago than Delta's retention
        (7 days), which no reader of a recent version needs. ``vacuum=None``: only when the table
        version crossed a multiple of 100 (vacuum lists every file, so not on every compaction)."""
        self._prune_acks()
        for name in _SCHEMAS:
            dt = self._load(name)
            if dt is None:
                continue
            before = dt.version()
            dt.optimize.compact()
            if vacuum or (vacuum is None and dt.version() // 100 != before // 100):
                dt.vacuum(dry_run=False)

    def _prune_acks(self) -> None:
        """Drop the ack rows of checkpoints that are no longer pending (their completed or aborted
        row says all there is). One delete commit; an ack appended concurrently is a new file the
        delete never touches, and acks of a still-pending checkpoint are kept."""
        dt = self._load("acks")
        if dt is None:
            return
        pending = {r["checkpoint_id"] for r in self.pending()}
        table, _ = self._read("acks", "distinct checkpoint_id")
        done = sorted(set(table["checkpoint_id"].to_pylist()) - pending)
        if done:
            dt.delete(f"checkpoint_id IN ({', '.join(str(int(i)) for i in done)})")

    def _maybe_compact(self, file_count: int) -> None:
        if file_count < self.compact_after_files:
            return
        try:
            self.compact(vacuum=None)
        except Exception as exc:  # best effort: another process may be compacting too
            log.info("compaction of %s skipped: %r", self.root, exc)

    # --- interpretation -------------------------------------------------------------------------

    def _view(self, dt: DeltaTable | None = None) -> _View:
        """The checkpoints table interpreted, as of ``dt``'s snapshot (default: the latest)."""
        table, file_count = self._read("checkpoints", dt=dt)
        view = _View(file_count=file_count)
        for row in table.to_pylist():
            if row["status"] not in _RANK:
                self._warn_corrupt(row["checkpoint_id"], f"unknown status {row['status']!r}")
                continue
            view.rows_by_id.setdefault(row["checkpoint_id"], []).append(row)
            if row["status"] == CheckpointStatus.COMPLETED and row.get("validated_at") is not None:
                at = view.validated.get(row["checkpoint_id"], row["validated_at"])
                view.validated[row["checkpoint_id"]] = min(at, row["validated_at"])
        completed: list[CompletedCheckpoint] = []
        for checkpoint_id in sorted(view.rows_by_id):
            row = _effective_row(view.rows_by_id[checkpoint_id])
            view.effective[checkpoint_id] = row
            if row["status"] != CheckpointStatus.COMPLETED:
                continue
            try:
                completed.append(_decode_row(row))
            except _Corrupt as exc:
                view.corrupt.add(checkpoint_id)
                self._warn_corrupt(checkpoint_id, str(exc))
        if self.retained is None:  # a reader: the writer's recorded discards are the truth
            view.kept, view.evicted = completed, []
        else:
            view.kept, view.evicted = apply_retention(completed, self.retained)
        return view

    def _warn_corrupt(self, checkpoint_id: Any, why: str) -> None:
        text = (
            f"{self.root}: checkpoint {checkpoint_id} has a corrupt row ({why}); "
            "treating it as not completed"
        )
        if text not in self._logged:  # every read meets it again: log once per instance
            self._logged.add(text)
            log.warning(text)
        warnings.warn(text, CorruptCheckpointWarning, stacklevel=4)

    def _max_id(self) -> int:
        return self._max("checkpoints", "checkpoint_id")

    def _row(
        self,
        checkpoint_id: CheckpointId,
        kind: CheckpointKind,
        status: CheckpointStatus,
        trigger_time: float,
        epoch: int,
        *,
        completed: CompletedCheckpoint | None = None,
        failure_reason: str | None = None,
        message: str | None = None,
    ) -> dict[str, Any]:
        row: dict[str, Any] = {
            "checkpoint_id": int(checkpoint_id),
            "kind": kind.value,
            "status": str(status),
            "trigger_time": float(trigger_time),
            "completion_time": None,
            "epoch": int(epoch),
            "failure_reason": failure_reason,
            "message": message,
            "acks_json": None,
            "state_bytes": 0,
            "channel_state_rows": 0,
            "channel_state_bytes": 0,
            "alignment_ms": 0.0,
            "unaligned": False,
            "recorded_at": float(self._now()),
            "validated_at": None,
        }
        if completed is not None:
            row.update(
                completion_time=float(completed.completion_time),
                acks_json=encode_acks(completed),
                state_bytes=completed.state_size_bytes,
                channel_state_rows=sum(a.channel_state_rows for a in completed.acks.values()),
                channel_state_bytes=completed.channel_state_bytes,
                alignment_ms=float(completed.alignment_ms),
                unaligned=completed.unaligned,
            )
        return row

    def _completed_row(self, c: CompletedCheckpoint, status: CheckpointStatus, epoch: int) -> dict[str, Any]:
        return self._row(c.checkpoint_id, c.kind, status, c.trigger_time, epoch, completed=c)

    def _epoch_of(self, epoch: int | None) -> int:
        if epoch is not None:
            return epoch
        return self.epoch if self.epoch is not None else 0

    # --- CheckpointIdCounter --------------------------------------------------------------------

    def get_and_increment(self) -> CheckpointId:
        """Reserve and return the next id: durable (its marker exists) before it is returned.

        Starts at 1 + max(every id in the table, every id this instance handed out) and skips
        markers left by other processes (alive, racing, or dead). Writes no row (see module doc).
        """
        with self._lock:
            start = max(self._max_id(), self._id_high_water) + 1
            checkpoint_id = _reserve_from(self._reservations, "ids", start)
            self._id_high_water = checkpoint_id
            return checkpoint_id

    def peek(self) -> CheckpointId:
        """The id the next ``get_and_increment`` returns (unless another process takes it first)."""
        with self._lock:
            candidate = max(self._max_id(), self._id_high_water) + 1
            while self._reservations.exists("ids", candidate):
                candidate += 1
            return candidate

    # --- CompletedCheckpointStore ---------------------------------------------------------------

    def add(self, checkpoint: CompletedCheckpoint) -> list[CompletedCheckpoint]:
        """Make ``checkpoint`` durable (one Delta commit) and return what retention evicted.

        Raises ``ValueError`` if the id is already completed/discarded or was aborted, or if the
        state does not survive JSON (e.g. tuples, non-string keys): better to fail the checkpoint
        than restore something else. Raises :class:`FencedError` when this store has an epoch and
        a newer one exists. Crash points: see the module docstring.
        """
        with self._lock:
            checkpoint_id = checkpoint.checkpoint_id
            row = self._completed_row(checkpoint, CheckpointStatus.COMPLETED, self._epoch_of(None))
            self._check_round_trip(checkpoint, row)
            decided: dict[str, Any] = {}

            def build(dt: DeltaTable) -> list[dict[str, Any]]:
                view = self._view(dt)
                previous = view.effective.get(checkpoint_id)
                if previous is not None and previous["status"] in ONCE_COMPLETED:
                    raise ValueError(f"checkpoint {checkpoint_id} is already stored")
                if previous is not None and previous["status"] == CheckpointStatus.ABORTED:
                    raise CheckpointAbortedError(
                        f"checkpoint {checkpoint_id} was aborted ({previous['failure_reason']}: "
                        f"{previous['message'] or ''}) before it could complete",
                        _reason(previous["failure_reason"]),
                    )
                # A savepoint may complete after a newer checkpoint: keep the list ordered by id.
                ordered = sorted([*view.kept, checkpoint], key=lambda c: c.checkpoint_id)
                decided["evicted"] = apply_retention(ordered, self.retained)[1] if self.retained else []
                return [row]

            self._reservations.claim("ids", checkpoint_id)  # so the counter never hands it out
            # the durability point: fenced and status-checked on the snapshot it lands on
            file_count = self._commit("checkpoints", build, fence=self.epoch)
            evicted = decided["evicted"]
            if evicted:
                try:
                    self.mark_discarded(evicted)
                except FencedError:
                    raise
                except Exception as exc:  # safe to lose: readers re-apply retention
                    log.warning("%s: marking %s discarded failed: %r", self.root,
                                [c.checkpoint_id for c in evicted], exc)
            self._maybe_compact(file_count + 2)
            return evicted

    @staticmethod
    def _check_round_trip(checkpoint: CompletedCheckpoint, row: Mapping[str, Any]) -> None:
        acks, ack_times = decode_acks(row["acks_json"])
        if acks == dict(checkpoint.acks) and ack_times == dict(checkpoint.ack_times):
            return
        for subtask, ack in checkpoint.acks.items():
            if acks.get(subtask) != ack:
                raise ValueError(
                    f"checkpoint {checkpoint.checkpoint_id}: the ack of {subtask} does not survive "
                    f"JSON (state must use str keys, lists, numbers, strings, bools, None): {ack}"
                )
        raise ValueError(f"checkpoint {checkpoint.checkpoint_id}: ack_times do not survive JSON")

    def all(self) -> Sequence[CompletedCheckpoint]:
        """Every retained completed checkpoint (and every savepoint), oldest first."""
        return tuple(self._view().kept)

    def latest(self) -> CompletedCheckpoint | None:
        kept = self._view().kept
        return kept[-1] if kept else None

    def get(self, checkpoint_id: CheckpointId) -> CompletedCheckpoint:
        kept = self._view().kept
        for c in kept:
            if c.checkpoint_id == checkpoint_id:
                return c
        raise UnknownCheckpointError(
            f"checkpoint {checkpoint_id} is not a retained completed checkpoint "
            f"(retained: {[c.checkpoint_id for c in kept]})"
        )

    # --- status changes -------------------------------------------------------------------------

    def record_pending(
        self,
        checkpoint_id: CheckpointId,
        kind: CheckpointKind = CheckpointKind.CHECKPOINT,
        trigger_time: float | None = None,
        epoch: int | None = None,
    ) -> None:
        """Write the ``pending`` row of a triggered checkpoint (history only; the id was already
        reserved by ``get_and_increment``). Refused for an id that is already past pending, and
        fenced (:class:`FencedError`) for a writer of an epoch (``epoch``, else the store's) that a
        newer one replaced."""
        with self._lock:
            self._reservations.claim("ids", checkpoint_id)
            when = self._now() if trigger_time is None else trigger_time
            row = self._row(checkpoint_id, CheckpointKind(kind), CheckpointStatus.PENDING, when, self._epoch_of(epoch))

            def build(dt: DeltaTable) -> list[dict[str, Any]]:
                previous = self._view(dt).effective.get(checkpoint_id)
                if previous is not None and previous["status"] != CheckpointStatus.PENDING:
                    raise ValueError(f"checkpoint {checkpoint_id} is already {previous['status']}")
                return [row]

            file_count = self._commit("checkpoints", build, fence=self.epoch if epoch is None else epoch)
            self._maybe_compact(file_count + 1)

    def record_aborted(
        self,
        checkpoint_id: CheckpointId,
        reason: FailureReason,
        message: str = "",
        epoch: int | None = None,
        *,
        kind: CheckpointKind | None = None,
        trigger_time: float | None = None,
    ) -> None:
        """Write the ``aborted`` row (``epoch``: the checkpoint's; kind and trigger time default to
        the pending row's). Decided on the snapshot the row lands on, so exactly one of completed
        and aborted wins a race between them.

        A no-op if it is already aborted; ``ValueError`` if it completed (a completed row is
        durable and wins: recovery may use it, so it must not be presented as aborted). A store
        with an epoch writes fenced by it.
        """
        reason = FailureReason(reason)
        with self._lock:
            self._reservations.claim("ids", checkpoint_id)

            def build(dt: DeltaTable) -> list[dict[str, Any]] | None:
                previous = self._view(dt).effective.get(checkpoint_id)
                if previous is not None and previous["status"] in ONCE_COMPLETED:
                    raise ValueError(f"checkpoint {checkpoint_id} is already {previous['status']}")
                if previous is not None and previous["status"] == CheckpointStatus.ABORTED:
                    return None
                row_kind = kind if kind is not None else (
                    CheckpointKind(previous["kind"]) if previous else CheckpointKind.CHECKPOINT)
                when = trigger_time if trigger_time is not None else (
                    previous["trigger_time"] if previous else self._now())
                return [self._row(checkpoint_id, CheckpointKind(row_kind), CheckpointStatus.ABORTED,
                                  when, self._epoch_of(epoch), failure_reason=reason.value, message=message or None)]

            file_count = self._commit("checkpoints", build, fence=self.epoch)
            self._maybe_compact(file_count + 1)

    def pending_discards(self) -> list[CompletedCheckpoint]:
        """Completed checkpoints retention evicts that are not yet marked ``discarded`` (a crash
        hit ``add`` between its two commits): discard their data, then :meth:`mark_discarded`."""
        return list(self._view().evicted)

    def mark_discarded(self, checkpoints: Iterable[CompletedCheckpoint], message: str | None = None) -> None:
        """One commit of ``discarded`` rows (idempotent in effect: discarded stays discarded)."""
        rows = [{**self._completed_row(c, CheckpointStatus.DISCARDED, self._epoch_of(None)), "message": message}
                for c in checkpoints]
        if rows:
            self._commit("checkpoints", lambda dt: rows, fence=self.epoch)

    def validated(self, checkpoint_id: CheckpointId) -> bool:
        """Whether the per-checkpoint validation of ``checkpoint_id`` passed and was recorded."""
        return checkpoint_id in self._view().validated

    def record_validation(self, checkpoint_id: CheckpointId, passed: bool, message: str | None = None) -> bool:
        """Record the verdict of ``checkpoint_id``'s per-checkpoint validation, decided on the
        snapshot it lands on, so exactly one verdict stands however many attempts validate it at
        once: passed appends a copy of its ``completed`` row with ``validated_at`` (the commit gate:
        a pipeline that validates commits only a validated checkpoint), failed appends
        ``discarded`` (never committed, recovery falls back to the previous one).

        Returns True when the verdict stands (also when the same verdict was recorded before).
        Returns False, writing nothing, when the other verdict won: a failed validation of a
        checkpoint already validated (it may be committed: it stays), or a passed one of a
        checkpoint discarded meanwhile (it must not commit). Raises
        :class:`UnknownCheckpointError` if ``checkpoint_id`` was never completed."""
        outcome: list[bool] = []

        def build(dt: DeltaTable) -> list[dict[str, Any]] | None:
            outcome.clear()
            view = self._view(dt)
            row = view.effective.get(checkpoint_id)
            if row is None or row["status"] not in ONCE_COMPLETED or checkpoint_id in view.corrupt:
                raise UnknownCheckpointError(
                    f"checkpoint {checkpoint_id} is not a readable completed checkpoint: nothing to validate"
                )
            if row["status"] == CheckpointStatus.DISCARDED or checkpoint_id in view.validated:
                outcome.append((row["status"] == CheckpointStatus.COMPLETED) == passed)
                return None
            outcome.append(True)
            now = float(self._now())
            if passed:
                return [{**row, "recorded_at": now, "validated_at": now, "message": message}]
            return [{**row, "status": CheckpointStatus.DISCARDED, "epoch": self._epoch_of(None), "recorded_at": now,
                     "message": message}]

        self._commit("checkpoints", build, fence=self.epoch)
        return outcome[0]

    def unreadable(self) -> list[CheckpointId]:
        """Ids of checkpoints recorded as completed whose row does not decode (see the module doc):
        they cannot be restored, but their sinks may have committed."""
        return sorted(self._view().corrupt)

    def discard_unreadable(self, checkpoint_ids: Iterable[CheckpointId], message: str | None = None) -> None:
        """One commit of ``discarded`` rows for unreadable completed checkpoints (their status and
        times copied, no acks): they stop counting as completed-but-unreadable. Idempotent."""
        wanted = set(checkpoint_ids)

        def build(dt: DeltaTable) -> list[dict[str, Any]]:
            view = self._view(dt)
            rows = []
            for checkpoint_id in sorted(wanted & view.corrupt):
                old = view.effective[checkpoint_id]
                kinds = {k.value for k in CheckpointKind}
                kind = old["kind"] if old["kind"] in kinds else CheckpointKind.CHECKPOINT.value
                row = self._row(checkpoint_id, CheckpointKind(kind), CheckpointStatus.DISCARDED,
                                old["trigger_time"] or 0.0, self._epoch_of(None), message=message)
                row["completion_time"] = old["completion_time"]
                rows.append(row)
            return rows

        self._commit("checkpoints", build, fence=self.epoch)

    def recovery_plan(
        self,
        checkpoint_id: CheckpointId | None = None,
        *,
        current_epoch: int | None = None,
        open_transactions: Iterable[Transaction] = (),
    ) -> RecoveryPlan:
        """What a recovery to ``checkpoint_id`` (None: the latest completed) does, from what this
        store holds: a rollback an earlier recovery left owed is finished first (it names the
        checkpoint when none is asked for), and unreadable completed checkpoints roll the sinks
        back below them. Read-only: the runner carries it out, a dry run prints it."""
        owed = self.owed_rollback()
        plan = plan_recovery(
            self.all(), current_epoch=self.current_epoch() if current_epoch is None else current_epoch,
            checkpoint_id=checkpoint_id if checkpoint_id is not None else (owed or None),
            open_transactions=open_transactions, unreadable=self.unreadable(),
        )
        if plan.rollback_after is None and owed is not None:
            plan = dataclasses.replace(plan, rollback_after=owed)
        return plan

    # --- history --------------------------------------------------------------------------------

    def history(self) -> list[dict[str, Any]]:
        """The latest status row per checkpoint id, newest id first, with every column, plus
        ``retained`` (returned by ``all()``), ``corrupt`` (a completed row that does not decode) and
        ``discarded_in_epoch``; ``epoch`` is the attempt that took the checkpoint, also for a
        discarded one.

        A completed checkpoint that retention evicted but a crash left unmarked still says
        ``completed`` here, with ``retained`` False.
        """
        view = self._view()
        kept = {c.checkpoint_id for c in view.kept}
        return [
            {**view.effective[i], **self._epochs_of(view.rows_by_id[i], view.effective[i]),
             "retained": i in kept, "corrupt": i in view.corrupt, "validated_at": view.validated.get(i)}
            for i in sorted(view.effective, reverse=True)
        ]

    @staticmethod
    def _epochs_of(rows: Sequence[dict[str, Any]], effective: Mapping[str, Any]) -> dict[str, Any]:
        """``epoch``: the attempt that took the checkpoint (a discarded one's row carries the epoch
        that discarded it: that is ``discarded_in_epoch``)."""
        if effective["status"] != CheckpointStatus.DISCARDED:
            return {"discarded_in_epoch": None}
        taken = min((r for r in rows if r["status"] != CheckpointStatus.DISCARDED), key=lambda r: r["recorded_at"],
                    default=effective)
        return {"epoch": taken["epoch"], "discarded_in_epoch": effective["epoch"]}

    def acks(self, checkpoint_id: CheckpointId) -> list[dict[str, Any]]:
        """Per-subtask acknowledgements of a completed (or since discarded) checkpoint, sorted by
        subtask: ``subtask``, ``operator``, ``index``, ``state``, the sizes, ``alignment_ms``,
        ``unaligned``, ``duration_ms``, ``ack_time``. Empty for a pending or aborted one."""
        rows = self._view().rows_by_id.get(checkpoint_id)
        if not rows:
            raise UnknownCheckpointError(f"checkpoint {checkpoint_id} is not in {self.root}")
        with_acks = [r for r in rows if r["status"] in ONCE_COMPLETED and r["acks_json"]]
        if not with_acks:
            return []
        try:
            acks, ack_times = decode_acks(min(with_acks, key=lambda r: r["recorded_at"])["acks_json"])
        except _Corrupt as exc:
            self._warn_corrupt(checkpoint_id, str(exc))
            return []
        return [
            {
                "subtask": str(subtask),
                "operator": subtask.operator,
                "index": subtask.index,
                **_ack_fields(ack),
                "ack_time": ack_times.get(subtask),
            }
            for subtask, ack in sorted(acks.items())
        ]

    # --- epochs ---------------------------------------------------------------------------------

    def current_epoch(self) -> int:
        """The newest epoch anyone began (0 before the first)."""
        return self._max("epochs", "epoch")

    def begin_epoch(self, owner: str | None = None, reason: str = "") -> int:
        """Begin a new attempt and make it this store's ``epoch``: (1) its row, committed on top of
        the snapshot whose largest epoch it follows (so the number is unique under races), then (2)
        the fence of every control table raised to it. From the return on, no write of an older
        epoch can land in them, however long its writer stalled between its checks and its commit.
        A crash between (1) and (2) leaves an epoch nobody acts as; the next one fences above it.
        :class:`FencedError` if a newer epoch began meanwhile (this one lost before it started)."""
        with self._lock:
            row = {
                "started_at": float(self._now()),
                "owner": owner or f"{socket.gethostname()}:{os.getpid()}",
                "reason": reason,
            }
            chosen: dict[str, int] = {}

            def build(dt: DeltaTable) -> list[dict[str, Any]]:
                table, _ = self._read("epochs", "max(epoch) as m", dt=dt)
                chosen["epoch"] = (table["m"][0].as_py() or 0) + 1
                return [{"epoch": chosen["epoch"], **row}]

            self._commit("epochs", build)
            epoch = chosen["epoch"]
            for name in _FENCED_TABLES:
                self._commit(name, lambda dt: [], fence=epoch, stamp=AppTransaction(FENCE_APP_ID, epoch))
            self.epoch = epoch
            return epoch

    def check_epoch(self, epoch: int) -> None:
        """Raise :class:`FencedError` if an epoch newer than ``epoch`` has begun."""
        current = self.current_epoch()
        if epoch < current:
            raise FencedError(
                f"{self.root}: epoch {epoch} is fenced: epoch {current} has taken over "
                "(this is a zombie of an older attempt)"
            )

    def epochs(self) -> list[dict[str, Any]]:
        """Every epoch row, newest first."""
        table, _ = self._read("epochs")
        return sorted(table.to_pylist(), key=lambda r: r["epoch"], reverse=True)

    # --- acks of pending checkpoints ------------------------------------------------------------

    def record_acks(
        self, checkpoint_id: CheckpointId, acks: Mapping[SubtaskId, SubtaskAck], epoch: int,
        ack_time: float | None = None,
    ) -> None:
        """Durably record acknowledgements of a pending checkpoint (one Delta commit). Refused with
        :class:`FencedError` for a writer of an older epoch."""
        if not acks:
            return
        now = float(self._now())
        when = now if ack_time is None else float(ack_time)
        rows = []
        for subtask, ack in sorted(acks.items()):
            try:
                text = json.dumps(_ack_fields(ack), sort_keys=True)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"checkpoint {checkpoint_id}: the ack of {subtask} is not JSON: {exc}") from exc
            rows.append({"checkpoint_id": int(checkpoint_id), "epoch": int(epoch), "subtask": str(subtask),
                         "ack_json": text, "ack_time": when, "recorded_at": now})
        self._maybe_compact(self._commit("acks", lambda dt: rows, fence=epoch) + 1)

    def pending_acks(self, checkpoint_id: CheckpointId, epoch: int) -> dict[SubtaskId, tuple[SubtaskAck, float]]:
        """The acks ``epoch`` recorded for ``checkpoint_id`` (the first per subtask), with times."""
        table, _ = self._read("acks")
        rows = [r for r in table.to_pylist() if r["checkpoint_id"] == checkpoint_id and r["epoch"] == epoch]
        out: dict[SubtaskId, tuple[SubtaskAck, float]] = {}
        for r in sorted(rows, key=lambda r: r["recorded_at"]):
            subtask = _subtask(r["subtask"])
            if subtask in out:
                continue
            a = json.loads(r["ack_json"])
            out[subtask] = (SubtaskAck(**{k: a[k] for k in a if k in _ACK_FIELDS}), r["ack_time"])
        return out

    def pending(self) -> list[dict[str, Any]]:
        """The rows of checkpoints whose status is still ``pending``, oldest first."""
        view = self._view()
        return [view.effective[i] for i in sorted(view.effective)
                if view.effective[i]["status"] == CheckpointStatus.PENDING]

    def status(self, checkpoint_id: CheckpointId) -> dict[str, Any] | None:
        """The effective row of ``checkpoint_id`` (None if no row was ever written)."""
        return self._view().effective.get(checkpoint_id)

    # --- sessions: each run of a stage within an epoch ------------------------------------------

    def sessions(self, epoch: int, dt: DeltaTable | None = None) -> list[dict[str, Any]]:
        """Every session row of ``epoch`` (as of ``dt``'s snapshot), in the order they were recorded."""
        table, _ = self._read("sessions", dt=dt)
        rows = [r for r in table.to_pylist() if r["epoch"] == epoch]
        return sorted(rows, key=lambda r: (r["recorded_at"], r["session"]))

    def record_restored(
        self, epoch: int, checkpoint_id: CheckpointId | None, resume: Mapping[str, Any]
    ) -> None:
        """``epoch`` finished restoring ``checkpoint_id`` (None: started from scratch); ``resume``
        maps each stage to where its first session of the epoch starts. Stages may join it now.
        Fenced in its commit."""
        text = json.dumps(dict(resume), sort_keys=True)
        row = self._session_row(epoch, ALL_STAGES, 0, RESTORED, checkpoint_id, text)
        self._commit("sessions", lambda dt: [row], fence=epoch)

    def begin_session(self, epoch: int, stage: str, after: int | None = None) -> int | None:
        """Start the next session of ``stage`` in ``epoch`` and return its number, or None when the
        caller lost a race: a session of the stage is live (started, not ended), or, with ``after``
        (the session whose end row the caller resumes from; 0: the epoch's restored row), another
        session started since. Decided on the snapshot the start row lands on, so a stage has at
        most one live session per epoch, provably. Fenced in its commit."""
        if not _STAGE.match(stage):
            raise ValueError(f"bad stage name {stage!r}")
        got: dict[str, int | None] = {}

        def build(dt: DeltaTable) -> list[dict[str, Any]] | None:
            mine = [r for r in self.sessions(epoch, dt) if r["stage"] == stage]
            started = {r["session"] for r in mine if r["event"] == START}
            ended = {r["session"] for r in mine if r["event"] == END}
            last = max(started, default=0)
            if started - ended or (after is not None and last != after):
                got["number"] = None
                return None
            got["number"] = last + 1
            return [self._session_row(epoch, stage, last + 1, START, None, None)]

        file_count = self._commit("sessions", build, fence=epoch)
        if got["number"] is not None:
            self._maybe_compact(file_count + 1)
        return got["number"]

    def end_session(self, epoch: int, stage: str, session: int, resume: Mapping[str, Any]) -> None:
        """The live ``session`` stopped cleanly; ``resume`` (JSON) is where the next one continues.
        ``ValueError`` if it is not live (never started, or already ended). Fenced in its commit."""
        row = self._session_row(epoch, stage, session, END, None, json.dumps(dict(resume), sort_keys=True))

        def build(dt: DeltaTable) -> list[dict[str, Any]]:
            events = {r["event"] for r in self.sessions(epoch, dt) if r["stage"] == stage and r["session"] == session}
            if events != {START}:
                raise ValueError(f"session {session} of stage {stage} in epoch {epoch} is not live ({sorted(events)})")
            return [row]

        self._commit("sessions", build, fence=epoch)

    def record_rollback(self, epoch: int, checkpoint_id: CheckpointId) -> None:
        """Intent, written before anything is rolled back: ``epoch`` restores ``checkpoint_id``, older
        than the latest completed one, so the sinks must be rolled back to it and every later
        checkpoint discarded. It stays owed (:meth:`owed_rollback`) until an epoch at or after it
        finishes restoring. Fenced in its commit."""
        row = self._session_row(epoch, ALL_STAGES, 0, ROLLBACK, checkpoint_id, None)
        self._commit("sessions", lambda dt: [row], fence=epoch)

    def owed_rollback(self) -> CheckpointId | None:
        """The checkpoint of a rollback whose epoch crashed before it finished restoring (and no
        later epoch finished one either): the next recovery must complete it. None otherwise."""
        table, _ = self._read("sessions")
        rows = table.to_pylist()
        rollbacks = [r for r in rows if r["event"] == ROLLBACK]
        if not rollbacks:
            return None
        last = max(rollbacks, key=lambda r: (r["epoch"], r["recorded_at"]))
        if any(r["event"] == RESTORED and r["epoch"] >= last["epoch"] for r in rows):
            return None
        return int(last["checkpoint_id"])

    def _session_row(self, epoch, stage, session, event, checkpoint_id, resume_json) -> dict[str, Any]:
        return {
            "epoch": int(epoch), "stage": stage, "session": int(session), "event": event,
            "checkpoint_id": None if checkpoint_id is None else int(checkpoint_id),
            "resume_json": resume_json, "owner": f"{socket.gethostname()}:{os.getpid()}",
            "recorded_at": float(self._now()),
        }

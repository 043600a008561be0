"""``DeltaCheckpointStore``: a pipeline's durable control plane, one store per role.

Layout under ``root`` (e.g. ``<warehouse>/_checkpoints/<pipeline>``)::

    root/checkpoints/   Delta table, append-only event log: one row per status change
    root/epochs/        Delta table, one row per attempt (epoch)
    root/acks/          Delta table, acks of pending checkpoints as they arrive (stages in separate processes)
    root/sessions/      Delta table, runs of each stage within an epoch, restore and rollback records
    root/_ids/          one reservation marker per checkpoint id ever handed out or written

The roles, each behind the core's protocol where it has one (Flink's ``CheckpointIDCounter`` and
``CompletedCheckpointStore`` are the model):

- ``store.ids``: :class:`~.ids.DeltaCheckpointIdCounter`, checkpoint ids (markers + the table);
- ``store.checkpoints``: :class:`~.completed.DeltaCompletedCheckpointStore`, each checkpoint's
  status, the retained completed checkpoints, the history;
- ``store.verdicts``: :class:`~.verdicts.DeltaValidationVerdicts`, the per-checkpoint validation gate;
- ``store.epochs``: :class:`~.epochs.DeltaEpochStore`, attempts and the fence;
- ``store.acks``: :class:`~.acks.DeltaAckStore`, acknowledgements of pending checkpoints;
- ``store.sessions``: :class:`~.sessions.DeltaSessionStore`, stage sessions, restores, rollbacks.

Every write is a compare-and-swap, and fenced inside its own commit
-------------------------------------------------------------------
Each write to a control table (:meth:`~.control_table.ControlTable.commit`) reads a snapshot,
decides on it (a checkpoint's status, whether a session of the stage is live, the next epoch
number) and commits exactly on top of it: delta-rs with ``max_commit_retries=0`` refuses the commit
when any other commit took the next version, and the writer then reads again and decides again. So
what a write checked still holds when it lands: exactly one of ``completed`` and ``aborted`` wins,
a stage has at most one live session per epoch, epochs are unique. The epoch fence rides the same
way: :meth:`~.epochs.DeltaEpochStore.begin` commits its row on top of the largest epoch, then
raises the fence (the application transaction ``FENCE_APP_ID``, version = the epoch) of every table
it fences (``checkpoints``, ``acks``, ``sessions``) before it returns, and a fenced write reads the
fence on the very snapshot it commits on. A zombie that stalled between its checks and its write
finds its commit refused and the newer fence on the next read: :class:`FencedError`, nothing
landed. The epoch is a value the attempt passes to each write; no store holds one. (Epochs and
sessions used to be reserved with ``O_EXCL`` marker files: a marker orphaned by a kill between the
marker and the row stalled a stage for good. Leftover marker files are ignored.)

Every append adds a data file and a commit, and the cost of a read grows with both, so the tables
are compacted automatically once one has ``compact_after_files`` data files (default 8); that keeps
an append at ~20 ms and a full read at ~15-20 ms on a local disk, whatever the history length.
``compact``: one optimize commit per table, then a vacuum of files tombstoned more than a week ago.

Do not ``fork`` a process after it used a store (delta-rs' runtime does not survive a fork and the
child deadlocks): use the ``spawn`` start method for worker processes.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Union

from ..core.clock import Clock
from ..core.errors import NoCheckpointError
from ..core.recovery import RecoveryPlan, plan_recovery
from ..core.twophase import Transaction
from ..layout import control_table
from ..objectstore import ObjectStoreReservations
from .acks import DeltaAckStore
from .checkpoint_table import CheckpointTable
from .completed import DeltaCompletedCheckpointStore
from .control_table import ControlRoot, ControlTable
from .epochs import DeltaEpochStore
from .ids import DeltaCheckpointIdCounter
from .reservations import LocalReservations, Reservations
from .sessions import DeltaSessionStore
from .verdicts import DeltaValidationVerdicts

log = logging.getLogger(__name__)


class DeltaCheckpointStore:
    """A pipeline's control stores on one root (see the module doc for the roles).

    The constructor does no I/O; tables and directories are created on first write (or eagerly by
    :meth:`open`). ``root`` is a local path (or ``file://`` URI) or an object-store URI
    (``s3://bucket/prefix``, ``gs://``, ``az://``), whose ids are reserved by conditional puts
    (:class:`~checkpoint_lib.objectstore.ObjectStoreReservations`; a store that ignores them is
    refused); ``storage_options`` are delta-rs / object_store settings, the environment's by default.

    ``retained``: how many completed checkpoints the *writer* keeps (it evicts on ``add`` and
    re-applies it on reads, covering a crash between the completed and discarded commits). None (a
    reader, e.g. ``ckpt checkpoints list``): only the recorded discards evict, so every reader sees
    what the writer decided.
    """

    def __init__(
        self,
        root: Union[str, Path],
        retained: int | None = None,
        *,
        clock: Union[Clock, Callable[[], float], None] = None,
        reservations: Reservations | None = None,
        storage_options: Mapping[str, str] | None = None,
        compact_after_files: int = 8,
    ):
        if retained is not None and retained < 1:
            raise ValueError("retained must be >= 1")
        self.place = ControlRoot.at(root, storage_options, clock)
        self.root = self.place.root
        if reservations is None:
            # on an object store: conditional puts, the store checked to honour them on first use
            reservations = (LocalReservations(self.root) if self.place.is_local
                            else ObjectStoreReservations(self.root, storage_options))
        self.compact_after_files = compact_after_files
        checkpoints = CheckpointTable(self.place, retained)
        self.ids = DeltaCheckpointIdCounter(checkpoints, reservations)
        self.checkpoints = DeltaCompletedCheckpointStore(checkpoints, self.ids, self._maybe_compact)
        self.verdicts = DeltaValidationVerdicts(checkpoints)
        self.acks = DeltaAckStore(self.place, self._maybe_compact)
        self.sessions = DeltaSessionStore(self.place, self._maybe_compact)
        self.epochs = DeltaEpochStore(self.place, fenced=(checkpoints, self.acks.table, self.sessions.table))

    @property
    def retained(self) -> int | None:
        return self.checkpoints.retained

    @property
    def tables(self) -> tuple[ControlTable, ...]:
        """The four control tables."""
        return (self.checkpoints.table, self.epochs.table, self.acks.table, self.sessions.table)

    @classmethod
    def open(cls, root: Union[str, Path], retained: int | None = None, **kwargs: Any) -> "DeltaCheckpointStore":
        """A store on ``root``, with its directory and every table created if missing."""
        store = cls(root, retained, **kwargs)
        if store.place.is_local:
            Path(store.root).mkdir(parents=True, exist_ok=True)
        for table in store.tables:
            table.ensure()
        return store

    @classmethod
    def existing(cls, root: Union[str, Path], **kwargs: Any) -> "DeltaCheckpointStore":
        """A reader's store on ``root``, which must hold one already: creates nothing, and raises
        :class:`NoCheckpointError` naming what it looked for (and, locally, the pipelines that do
        have checkpoints next to it) when the pipeline never ran there."""
        store = cls(root, None, **kwargs)
        if not store.checkpoints.table.exists():
            here = Path(store.root)
            known = sorted(p.name for p in here.parent.iterdir()
                           if Path(control_table(p, "checkpoints")).is_dir()) \
                if store.place.is_local and here.parent.is_dir() else []
            raise NoCheckpointError(
                f"no checkpoints at {store.root}: pipeline {here.name!r} never ran in this warehouse"
                + (f" (pipelines with checkpoints here: {', '.join(known)})" if known else
                   "; check --warehouse and the pipeline name"))
        return store

    def table(self, name: str) -> ControlTable:
        """The control table ``name`` (``checkpoints``, ``epochs``, ``acks``, ``sessions``)."""
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(f"no control table {name!r} (the tables: {[t.name for t in self.tables]})")

    def __repr__(self) -> str:
        return f"DeltaCheckpointStore({self.root!r}, retained={self.retained})"

    def check_readable(self) -> None:
        """Read every control table whole: :class:`CorruptControlTableError` naming the damaged
        file if one cannot be read. A recovery calls it before it writes anything."""
        for table in self.tables:
            table.read()

    def compact(self, vacuum: bool | None = True) -> None:
        """Prune the acks of checkpoints no longer pending, then compact every table
        (:meth:`ControlTable.compact`; ``vacuum=None``: vacuum only every 100 versions)."""
        self.acks.prune(r["checkpoint_id"] for r in self.checkpoints.pending())
        for table in self.tables:
            table.compact(vacuum)

    def _maybe_compact(self, file_count: int) -> None:
        if file_count < self.compact_after_files:
            return
        try:
            self.compact(vacuum=None)
        except Exception as exc:  # best effort: another process may be compacting too
            log.info("compaction of %s skipped: %r", self.root, exc)

    def recovery_plan(
        self,
        checkpoint_id: int | None = None,
        *,
        current_epoch: int | None = None,
        open_transactions: Iterable[Transaction] = (),
    ) -> RecoveryPlan:
        """What a recovery to ``checkpoint_id`` (None: the latest completed) does, from what this
        store holds: a rollback an earlier recovery left owed is finished first (it names the
        checkpoint when none is asked for), and unreadable completed checkpoints roll the sinks
        back below them. Read-only: the runner carries it out, a dry run prints it."""
        owed = self.sessions.owed_rollback()
        plan = plan_recovery(
            self.checkpoints.all(), current_epoch=self.epochs.current() if current_epoch is None else current_epoch,
            checkpoint_id=checkpoint_id if checkpoint_id is not None else (owed or None),
            open_transactions=open_transactions, unreadable=self.checkpoints.unreadable(),
        )
        if plan.rollback_after is None and owed is not None:
            plan = dataclasses.replace(plan, rollback_after=owed)
        return plan

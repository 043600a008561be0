"""The durable ``CompletedCheckpointStore``: each checkpoint's status rows in the ``checkpoints``
table (pending, aborted, completed, discarded), the retained completed checkpoints, and their
history for the UI.

Every write names the epoch it writes as (``epoch``; None: an unfenced writer, rows carry 0) and is
fenced by it inside its own commit; a store holds no epoch of its own. :class:`FencedCheckpoints`
is the core's ``CompletedCheckpointStore`` for a coordinator of one epoch.

Crash safety (kill -9 between any two writes):

- ``record_pending`` / ``record_aborted``: (1) mark the id, (2) one append. A crash leaves the
  previous status; the id is never reused.
- ``add``: (1) mark the id, (2) append the ``completed`` row: **the durability point**, (3) append
  ``discarded`` rows for what retention evicted, (4) maybe compact. A crash before (2): the
  checkpoint is not complete (recovery uses the previous one, the coordinator never told anyone
  it completed). After (2), before (3): readers re-apply retention, so the evicted checkpoints are
  already gone from ``all()``/``latest()``/``get()``; only their snapshot data may not have been
  discarded yet: :meth:`DeltaCompletedCheckpointStore.pending_discards` lists them for the
  recovering driver (discarding is idempotent) and :meth:`~DeltaCompletedCheckpointStore.mark_discarded`
  records it. (4) is a single Delta commit (remove + add of the same rows): before or after it the
  rows are the same.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from deltalake import DeltaTable

from ..core.checkpoints import CompletedCheckpoint
from ..core.errors import (CheckpointAbortedError, CheckpointAlreadyStoredError, FailureReason, FencedError,
                           UnknownCheckpointError)
from ..core.retention import Needs, Restores, Retention
from ..core.stores import apply_retention
from ..core.types import CheckpointId, CheckpointKind, CheckpointStatus
from .ack_codec import Corrupt, ack_fields, decode_acks, failure_reason
from .checkpoint_table import ONCE_COMPLETED, CheckpointsView, CheckpointTable
from .control_table import StoreOnTable
from .ids import DeltaCheckpointIdCounter

log = logging.getLogger(__name__)


class DeltaCompletedCheckpointStore(StoreOnTable):
    """Status rows and the retained completed checkpoints (with every savepoint), oldest first.

    ``after_commit(file_count)``: told the table's data-file count after each write (compaction)."""

    def __init__(self, table: CheckpointTable, ids: DeltaCheckpointIdCounter,
                 after_commit: Callable[[int], None] = lambda files: None):
        self.table = table
        self._ids = ids
        self._after_commit = after_commit
        self._lock = threading.RLock()

    @property
    def retained(self) -> int | None:
        return self.table.retained

    # --- CompletedCheckpointStore ---------------------------------------------------------------

    def add(self, checkpoint: CompletedCheckpoint, epoch: int | None = None) -> list[CompletedCheckpoint]:
        """Make ``checkpoint`` durable (one Delta commit) as epoch ``epoch`` and return what
        retention evicted.

        Raises ``ValueError`` if the id is already completed/discarded or was aborted, or if the
        state does not survive JSON (e.g. tuples, non-string keys): better to fail the checkpoint
        than restore something else. Raises :class:`FencedError` when a newer epoch than
        ``epoch`` exists. Crash points: see the module docstring.
        """
        with self._lock:
            checkpoint_id = checkpoint.checkpoint_id
            row = self.table.completed_row(checkpoint, CheckpointStatus.COMPLETED, epoch or 0)
            self._check_round_trip(checkpoint, row)
            decided: dict[str, Any] = {}

            def build(dt: DeltaTable) -> list[dict[str, Any]]:
                view = self.table.view(dt)
                previous = view.effective.get(checkpoint_id)
                if previous is not None and previous["status"] in ONCE_COMPLETED:
                    raise CheckpointAlreadyStoredError(
                        f"checkpoint {checkpoint_id} is already stored",
                        completed=previous["status"] == CheckpointStatus.COMPLETED)
                if previous is not None and previous["status"] == CheckpointStatus.ABORTED:
                    raise CheckpointAbortedError(
                        f"checkpoint {checkpoint_id} was aborted ({previous['failure_reason']}: "
                        f"{previous['message'] or ''}) before it could complete",
                        failure_reason(previous["failure_reason"]),
                    )
                # A savepoint may complete after a newer checkpoint: keep the list ordered by id.
                ordered = sorted([*view.kept, checkpoint], key=lambda c: c.checkpoint_id)
                decided["evicted"] = apply_retention(ordered, self.retained)[1] if self.retained else []
                return [row]

            self._ids.claim(checkpoint_id)  # so the counter never hands it out
            # the durability point: fenced and status-checked on the snapshot it lands on
            file_count = self.table.commit(build, fence=epoch)
            evicted = decided["evicted"]
            if evicted:
                try:
                    self.mark_discarded(evicted, epoch=epoch)
                except FencedError:
                    raise
                except Exception as exc:  # safe to lose: readers re-apply retention
                    log.warning("%s: marking %s discarded failed: %r", self.table.place.root,
                                [c.checkpoint_id for c in evicted], exc)
            self._after_commit(file_count + 2)
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
        return tuple(self.table.view().kept)

    def latest(self) -> CompletedCheckpoint | None:
        kept = self.table.view().kept
        return kept[-1] if kept else None

    def get(self, checkpoint_id: CheckpointId) -> CompletedCheckpoint:
        kept = self.table.view().kept
        for c in kept:
            if c.checkpoint_id == checkpoint_id:
                return c
        raise UnknownCheckpointError(
            f"checkpoint {checkpoint_id} is not a retained completed checkpoint "
            f"(retained: {[c.checkpoint_id for c in kept]})"
        )

    def fenced(self, epoch: int) -> "FencedCheckpoints":
        """This store as the ``CompletedCheckpointStore`` of a coordinator of ``epoch``."""
        return FencedCheckpoints(self, epoch)

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
        fenced (:class:`FencedError`) for a writer of an epoch (``epoch``) that a newer one
        replaced."""
        with self._lock:
            self._ids.claim(checkpoint_id)
            when = self.table.place.now() if trigger_time is None else trigger_time
            row = self.table.row(checkpoint_id, CheckpointKind(kind), CheckpointStatus.PENDING, when, epoch or 0)

            def build(dt: DeltaTable) -> list[dict[str, Any]]:
                previous = self.table.view(dt).effective.get(checkpoint_id)
                if previous is not None and previous["status"] != CheckpointStatus.PENDING:
                    raise ValueError(f"checkpoint {checkpoint_id} is already {previous['status']}")
                return [row]

            self._after_commit(self.table.commit(build, fence=epoch) + 1)

    def record_aborted(
        self,
        checkpoint_id: CheckpointId,
        reason: FailureReason,
        message: str = "",
        epoch: int | None = None,
        *,
        fence: int | None = None,
        kind: CheckpointKind | None = None,
        trigger_time: float | None = None,
    ) -> None:
        """Write the ``aborted`` row (``epoch``: the checkpoint's; kind and trigger time default to
        the pending row's), fenced by the writer's epoch ``fence`` (None: unfenced). Decided on the
        snapshot the row lands on, so exactly one of completed and aborted wins a race between them.

        A no-op if it is already aborted; ``ValueError`` if it completed (a completed row is
        durable and wins: recovery may use it, so it must not be presented as aborted).
        """
        reason = FailureReason(reason)
        with self._lock:
            self._ids.claim(checkpoint_id)

            def build(dt: DeltaTable) -> list[dict[str, Any]] | None:
                previous = self.table.view(dt).effective.get(checkpoint_id)
                if previous is not None and previous["status"] in ONCE_COMPLETED:
                    raise ValueError(f"checkpoint {checkpoint_id} is already {previous['status']}")
                if previous is not None and previous["status"] == CheckpointStatus.ABORTED:
                    return None
                row_kind = kind if kind is not None else (
                    CheckpointKind(previous["kind"]) if previous else CheckpointKind.CHECKPOINT)
                when = trigger_time if trigger_time is not None else (
                    previous["trigger_time"] if previous else self.table.place.now())
                return [self.table.row(checkpoint_id, CheckpointKind(row_kind), CheckpointStatus.ABORTED, when,
                                       epoch or 0, failure_reason=reason.value, message=message or None)]

            self._after_commit(self.table.commit(build, fence=fence) + 1)

    def pending_discards(self) -> list[CompletedCheckpoint]:
        """Completed checkpoints retention evicts that are not yet marked ``discarded`` (a crash
        hit ``add`` between its two commits): discard their data, then :meth:`mark_discarded`."""
        return list(self.table.view().evicted)

    def mark_discarded(self, checkpoints: Iterable[CompletedCheckpoint], message: str | None = None,
                       epoch: int | None = None) -> None:
        """One commit of ``discarded`` rows as epoch ``epoch`` (idempotent in effect: discarded
        stays discarded)."""
        rows = [{**self.table.completed_row(c, CheckpointStatus.DISCARDED, epoch or 0), "message": message}
                for c in checkpoints]
        if rows:
            self.table.commit(lambda dt: rows, fence=epoch)

    def unreadable(self) -> list[CheckpointId]:
        """Ids of checkpoints recorded as completed whose row does not decode (see the module doc):
        they cannot be restored, but their sinks may have committed."""
        return sorted(self.table.view().corrupt)

    def discard_unreadable(self, checkpoint_ids: Iterable[CheckpointId], message: str | None = None,
                           epoch: int | None = None) -> None:
        """One commit of ``discarded`` rows for unreadable completed checkpoints (their status and
        times copied, no acks), as epoch ``epoch``: they stop counting as completed-but-unreadable.
        Idempotent."""
        wanted = set(checkpoint_ids)

        def build(dt: DeltaTable) -> list[dict[str, Any]]:
            view = self.table.view(dt)
            rows = []
            for checkpoint_id in sorted(wanted & view.corrupt):
                old = view.effective[checkpoint_id]
                kinds = {k.value for k in CheckpointKind}
                kind = old["kind"] if old["kind"] in kinds else CheckpointKind.CHECKPOINT.value
                row = self.table.row(checkpoint_id, CheckpointKind(kind), CheckpointStatus.DISCARDED,
                                     old["trigger_time"] or 0.0, epoch or 0, message=message)
                row["completion_time"] = old["completion_time"]
                rows.append(row)
            return rows

        self.table.commit(build, fence=epoch)

    # --- reads ----------------------------------------------------------------------------------

    def pending(self) -> list[dict[str, Any]]:
        """The rows of checkpoints whose status is still ``pending``, oldest first."""
        view = self.table.view()
        return [view.effective[i] for i in sorted(view.effective)
                if view.effective[i]["status"] == CheckpointStatus.PENDING]

    def status(self, checkpoint_id: CheckpointId) -> dict[str, Any] | None:
        """The effective row of ``checkpoint_id`` (None if no row was ever written)."""
        return self.table.view().effective.get(checkpoint_id)

    def acks(self, checkpoint_id: CheckpointId) -> list[dict[str, Any]]:
        """Per-subtask acknowledgements of a completed (or since discarded) checkpoint, sorted by
        subtask: ``subtask``, ``operator``, ``index``, ``state``, the sizes, ``alignment_ms``,
        ``unaligned``, ``duration_ms``, ``ack_time``. Empty for a pending or aborted one."""
        rows = self.table.view().rows_by_id.get(checkpoint_id)
        if not rows:
            raise UnknownCheckpointError(f"checkpoint {checkpoint_id} is not in {self.table.place.root}")
        with_acks = [r for r in rows if r["status"] in ONCE_COMPLETED and r["acks_json"]]
        if not with_acks:
            return []
        try:
            acks, ack_times = decode_acks(min(with_acks, key=lambda r: r["recorded_at"])["acks_json"])
        except Corrupt as exc:
            self.table.warn_corrupt(checkpoint_id, str(exc))
            return []
        return [
            {
                "subtask": str(subtask),
                "operator": subtask.operator,
                "index": subtask.index,
                **ack_fields(ack),
                "ack_time": ack_times.get(subtask),
            }
            for subtask, ack in sorted(acks.items())
        ]

    def history(self) -> list[dict[str, Any]]:
        """The latest status row per checkpoint id, newest id first, with every column, plus
        ``retained`` (returned by ``all()``), ``corrupt`` (a completed row that does not decode) and
        ``discarded_in_epoch``; ``epoch`` is the attempt that took the checkpoint, also for a
        discarded one.

        A completed checkpoint that retention evicted but a crash left unmarked still says
        ``completed`` here, with ``retained`` False.
        """
        view = self.table.view()
        kept = {c.checkpoint_id for c in view.kept}
        return [
            {**view.effective[i], **_epochs_of(view.rows_by_id[i], view.effective[i]),
             "retained": i in kept, "corrupt": i in view.corrupt, "validated_at": view.validated.get(i)}
            for i in sorted(view.effective, reverse=True)
        ]

    # --- what the retained checkpoints need; what maintenance may prune (core.retention) --------

    def needs(self, restores: Restores = Restores(), view: CheckpointsView | None = None) -> Needs:
        """What the checkpoints need (:class:`~checkpoint_lib.core.retention.Needs`), as of
        ``view`` (default: a fresh read), with the sessions' ``restores``."""
        view = self.table.view() if view is None else view
        return Needs.of(view.kept, view.statuses, view.corrupt, restores)

    def rows_to_keep(self, snapshot: DeltaTable, rows: Sequence[dict[str, Any]],
                     retention: Retention) -> list[dict[str, Any]]:
        """Every row of an id that is not droppable, decided on the very ``snapshot`` the rows are
        of (a concurrent completion, pending row or discard is part of it); the restore and the
        rollback are ``retention``'s."""
        needs = self.needs(retention.restores, self.table.view(snapshot))
        return [r for r in rows if not needs.droppable(r["checkpoint_id"])]

    def keeps(self, retention: Retention | None = None) -> str:
        return ("every row of a retained, pending, unreadable, restored or owed checkpoint, of the "
                "largest id, and of every id at or above the floor")


def _epochs_of(rows: Sequence[dict[str, Any]], effective: Mapping[str, Any]) -> dict[str, Any]:
    """``epoch``: the attempt that took the checkpoint (a discarded one's row carries the epoch
    that discarded it: that is ``discarded_in_epoch``)."""
    if effective["status"] != CheckpointStatus.DISCARDED:
        return {"discarded_in_epoch": None}
    taken = min((r for r in rows if r["status"] != CheckpointStatus.DISCARDED), key=lambda r: r["recorded_at"],
                default=effective)
    return {"epoch": taken["epoch"], "discarded_in_epoch": effective["epoch"]}


@dataclass(frozen=True)
class FencedCheckpoints:
    """The core's ``CompletedCheckpointStore`` for a coordinator of epoch ``epoch``: each ``add``
    writes as that epoch, fenced by it (a value: the epoch never changes under the coordinator)."""

    store: DeltaCompletedCheckpointStore
    epoch: int

    def add(self, checkpoint: CompletedCheckpoint) -> list[CompletedCheckpoint]:
        return self.store.add(checkpoint, epoch=self.epoch)

    def all(self) -> Sequence[CompletedCheckpoint]:
        return self.store.all()

    def latest(self) -> CompletedCheckpoint | None:
        return self.store.latest()

    def get(self, checkpoint_id: CheckpointId) -> CompletedCheckpoint:
        return self.store.get(checkpoint_id)

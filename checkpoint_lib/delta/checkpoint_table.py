"""The ``checkpoints`` control table and how it reads: an append-only event log, one row per status
change of a checkpoint, interpreted into each checkpoint's status (:class:`CheckpointsView`).

Status of a checkpoint
----------------------
The latest status per id is the row of highest rank: ``pending`` < ``aborted`` < ``completed`` <
``discarded`` (the statuses only move forward, so rank order is time order; a read never depends
on the order Delta returns files in, which compaction changes). Between two rows of the same rank
(only racing writers produce them) the earliest ``recorded_at`` wins, for every reader alike.

A row that cannot be decoded (e.g. its ``acks_json`` does not parse) is skipped with a
:class:`CorruptCheckpointWarning` (and a logged warning): it is not completed, ``latest()`` falls
back to the previous completed checkpoint.

Three stores share this table, each for its role: the id counter (its largest id), the completed
checkpoints (:mod:`.completed`) and the validation verdicts (:mod:`.verdicts`).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import pyarrow as pa
from deltalake import DeltaTable

from ..core.checkpoints import CompletedCheckpoint
from ..core.stores import apply_retention
from ..core.types import CheckpointId, CheckpointKind, CheckpointStatus
from .ack_codec import Corrupt, decode_row, encode_acks
from .control_table import ControlRoot, ControlTable

log = logging.getLogger(__name__)

STATUSES = (CheckpointStatus.PENDING, CheckpointStatus.ABORTED, CheckpointStatus.COMPLETED, CheckpointStatus.DISCARDED)
"""Every status, in the order a later row of one checkpoint may follow an earlier one."""
ONCE_COMPLETED = (CheckpointStatus.COMPLETED, CheckpointStatus.DISCARDED)
"""The statuses of a checkpoint that completed (a discarded one completed before)."""
RANK = {status: rank for rank, status in enumerate(STATUSES)}

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
``completed`` row :meth:`~checkpoint_lib.delta.verdicts.DeltaValidationVerdicts.record` appends when the per-checkpoint
validation passed."""


class CorruptCheckpointWarning(UserWarning):
    """A row of the checkpoints table could not be decoded; it is treated as not completed."""


@dataclass
class CheckpointsView:
    """One consistent read of the checkpoints table, interpreted."""

    rows_by_id: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    effective: dict[int, dict[str, Any]] = field(default_factory=dict)
    kept: list[CompletedCheckpoint] = field(default_factory=list)
    evicted: list[CompletedCheckpoint] = field(default_factory=list)
    corrupt: set[int] = field(default_factory=set)
    validated: dict[int, float] = field(default_factory=dict)
    """id -> when its per-checkpoint validation passed (first record)."""
    file_count: int = 0

    @property
    def statuses(self) -> dict[int, str]:
        """Each checkpoint id with its status."""
        return {i: r["status"] for i, r in self.effective.items()}


def effective_row(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The row that states the checkpoint's status: highest rank, then earliest recorded."""
    return min(
        rows,
        key=lambda r: (-RANK[r["status"]], r["recorded_at"], r["acks_json"] or "", r["message"] or ""),
    )


class CheckpointTable(ControlTable):
    """The ``checkpoints`` table: its rows built and read back as each checkpoint's status.

    ``retained``: how many completed checkpoints the *writer* keeps (re-applied on reads, covering
    a crash between the completed and discarded commits); None (a reader): only the recorded
    discards evict, so every reader sees what the writer decided."""

    def __init__(self, place: ControlRoot, retained: int | None = None):
        super().__init__(place, "checkpoints", CHECKPOINTS_SCHEMA)
        self.retained = retained
        self._logged: set[str] = set()

    def view(self, dt: DeltaTable | None = None) -> CheckpointsView:
        """The table interpreted, as of ``dt``'s snapshot (default: the latest)."""
        table, file_count = self.read(dt=dt)
        view = CheckpointsView(file_count=file_count)
        for row in table.to_pylist():
            if row["status"] not in RANK:
                self.warn_corrupt(row["checkpoint_id"], f"unknown status {row['status']!r}")
                continue
            view.rows_by_id.setdefault(row["checkpoint_id"], []).append(row)
            if row["status"] == CheckpointStatus.COMPLETED and row.get("validated_at") is not None:
                at = view.validated.get(row["checkpoint_id"], row["validated_at"])
                view.validated[row["checkpoint_id"]] = min(at, row["validated_at"])
        completed: list[CompletedCheckpoint] = []
        for checkpoint_id in sorted(view.rows_by_id):
            row = effective_row(view.rows_by_id[checkpoint_id])
            view.effective[checkpoint_id] = row
            if row["status"] != CheckpointStatus.COMPLETED:
                continue
            try:
                completed.append(decode_row(row))
            except Corrupt as exc:
                view.corrupt.add(checkpoint_id)
                self.warn_corrupt(checkpoint_id, str(exc))
        if self.retained is None:  # a reader: the writer's recorded discards are the truth
            view.kept, view.evicted = completed, []
        else:
            view.kept, view.evicted = apply_retention(completed, self.retained)
        return view

    def warn_corrupt(self, checkpoint_id: Any, why: str) -> None:
        text = (
            f"{self.place.root}: checkpoint {checkpoint_id} has a corrupt row ({why}); "
            "treating it as not completed"
        )
        if text not in self._logged:  # every read meets it again: log once per instance
            self._logged.add(text)
            log.warning(text)
        warnings.warn(text, CorruptCheckpointWarning, stacklevel=4)

    def row(
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
        """A row of the table (``completed``: its acks and sizes too)."""
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
            "recorded_at": float(self.place.now()),
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

    def completed_row(self, c: CompletedCheckpoint, status: CheckpointStatus, epoch: int) -> dict[str, Any]:
        return self.row(c.checkpoint_id, c.kind, status, c.trigger_time, epoch, completed=c)

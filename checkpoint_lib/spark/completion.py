"""What a running process does with the coordinator's completion effects, one definition each:
adopting a checkpoint another process triggered, making an abort durable (a completion that won
the race stands), the error that stops a run after too many failed checkpoints, and how often the
channel logs are truncated.
"""

from __future__ import annotations

from typing import Any

from ..core.coordinator import CheckpointAborted, FailJob
from ..core.errors import TooManyFailedCheckpointsError
from ..core.types import CheckpointKind, CheckpointStatus

TRUNCATE_EVERY = 5
"""Completions between two clean-ups (every truncation of a channel log is a Delta commit)."""


def adopt(store: Any, coordinator: Any, cid: int, epoch: int) -> list:
    """Make ``coordinator`` know checkpoint ``cid``, which another process triggered (its barrier
    arrived on a channel log), with the acks already recorded; the completion effects if those
    complete it. One it knows, or that is no longer pending in ``epoch``, is left alone (its barrier
    is still processed; the acks are then discarded)."""
    if coordinator.status_of(cid) != "unknown":
        return []
    row = store.checkpoints.status(cid)
    if row is None or row["status"] != CheckpointStatus.PENDING or row["epoch"] != epoch:
        return []
    acks = store.acks.pending(cid, epoch)
    return coordinator.adopt(cid, row["trigger_time"], CheckpointKind(row["kind"]), acks)


def record_aborted(store: Any, e: CheckpointAborted, epoch: int) -> bool:
    """Make the coordinator's abort of ``e.checkpoint_id`` durable (fenced by ``epoch``). False:
    it completed first (elsewhere), and completion wins."""
    try:
        store.checkpoints.record_aborted(e.checkpoint_id, e.reason, e.message, epoch, fence=epoch)
    except ValueError:
        return False
    return True


def too_many_failed(e: FailJob) -> TooManyFailedCheckpointsError:
    """The error that stops a run when the coordinator fails the job (too many failed checkpoints in a row)."""
    return TooManyFailedCheckpointsError(f"{e.consecutive_failures} consecutive checkpoints failed "
                                         f"(last: {e.reason.value})")

"""The per-checkpoint validation verdicts: the commit gate of a pipeline that validates its
checkpoints, recorded as rows of the ``checkpoints`` table so that a verdict and the checkpoint's
status are decided on one snapshot."""

from __future__ import annotations

from typing import Any

from deltalake import DeltaTable

from ..core.errors import UnknownCheckpointError
from ..core.types import CheckpointId, CheckpointStatus
from .checkpoint_table import ONCE_COMPLETED, CheckpointTable


class DeltaValidationVerdicts:
    """Passed (a copy of the ``completed`` row with ``validated_at``) or failed (``discarded``)."""

    def __init__(self, table: CheckpointTable):
        self.table = table

    def validated(self, checkpoint_id: CheckpointId) -> bool:
        """Whether the per-checkpoint validation of ``checkpoint_id`` passed and was recorded."""
        return checkpoint_id in self.table.view().validated

    def record(self, checkpoint_id: CheckpointId, passed: bool, message: str | None = None,
               epoch: int | None = None) -> bool:
        """Record the verdict of ``checkpoint_id``'s per-checkpoint validation as epoch ``epoch``
        (fenced by it; None: unfenced), decided on the snapshot it lands on, so exactly one verdict
        stands however many attempts validate it at once: passed appends a copy of its ``completed``
        row with ``validated_at`` (the commit gate: a pipeline that validates commits only a
        validated checkpoint), failed appends ``discarded`` (never committed, recovery falls back to
        the previous one).

        Returns True when the verdict stands (also when the same verdict was recorded before).
        Returns False, writing nothing, when the other verdict won: a failed validation of a
        checkpoint already validated (it may be committed: it stays), or a passed one of a
        checkpoint discarded meanwhile (it must not commit). Raises
        :class:`UnknownCheckpointError` if ``checkpoint_id`` was never completed."""
        outcome: list[bool] = []

        def build(dt: DeltaTable) -> list[dict[str, Any]] | None:
            outcome.clear()
            view = self.table.view(dt)
            row = view.effective.get(checkpoint_id)
            if row is None or row["status"] not in ONCE_COMPLETED or checkpoint_id in view.corrupt:
                raise UnknownCheckpointError(
                    f"checkpoint {checkpoint_id} is not a readable completed checkpoint: nothing to validate"
                )
            if row["status"] == CheckpointStatus.DISCARDED or checkpoint_id in view.validated:
                outcome.append((row["status"] == CheckpointStatus.COMPLETED) == passed)
                return None
            outcome.append(True)
            now = float(self.table.place.now())
            if passed:
                return [{**row, "recorded_at": now, "validated_at": now, "message": message}]
            return [{**row, "status": CheckpointStatus.DISCARDED, "epoch": epoch or 0, "recorded_at": now,
                     "message": message}]

        self.table.commit(build, fence=epoch)
        return outcome[0]

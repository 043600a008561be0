"""The ``validations`` Delta table: every validation run of a pipeline, durable (delta-rs, no JVM).

``W/_checkpoints/<pipeline>/validations`` holds one row per run of a suite (``kind``: ``restore``
or ``checkpoint``) with the checkpoint it judged, the epoch, success, a readable summary, the Data
Docs path and the per-expectation details (JSON). It is an append-only log: a later run of the same
suite on the same checkpoint adds a row, and readers take the newest (``latest()``).

Crash safety: a row is one Delta commit (atomic); a run killed before it never appears, a retry
appends a new row with a new ``validation_id``. A failed validation is recorded *before* the error
is raised, so "the restore of epoch 3 failed its checks" is durable even if the caller dies.
The table lives beside the checkpoint store's tables but is written by this module only (the store's
own tables are not touched).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa

from ..core.cas import commit_on_snapshot
from ..core.retention import Retention
from ..layout import control_table
from ..objectstore import is_remote
from .result import QualityResult

SCHEMA = pa.schema(
    [
        pa.field("validation_id", pa.string(), nullable=False),
        pa.field("pipeline", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("checkpoint_id", pa.int64()),
        pa.field("epoch", pa.int64()),
        pa.field("restored_checkpoint_id", pa.int64()),
        pa.field("success", pa.bool_(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("summary", pa.string(), nullable=False),
        pa.field("failed", pa.int64(), nullable=False),
        pa.field("evaluated", pa.int64(), nullable=False),
        pa.field("data_docs", pa.string()),
        pa.field("run_name", pa.string(), nullable=False),
        pa.field("started_at", pa.float64(), nullable=False),
        pa.field("finished_at", pa.float64(), nullable=False),
        pa.field("details_json", pa.string()),
    ]
)
PASSED, FAILED, ERROR = "passed", "failed", "error"
_RETRIES = 8


class ValidationLog:
    """Append and read the ``validations`` table under a pipeline's checkpoint root."""

    def __init__(self, checkpoint_root: str | Path):
        self.path = str(control_table(checkpoint_root, "validations"))

    def _create(self) -> None:
        from deltalake import DeltaTable

        if not is_remote(self.path):
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        DeltaTable.create(self.path, SCHEMA, mode="ignore", name="validations",
                          configuration={"delta.checkpointInterval": "10"})

    def record(self, result: QualityResult) -> dict[str, Any]:
        """Append ``result`` as one row (one commit); returns the row."""
        from deltalake import write_deltalake
        from deltalake.exceptions import CommitFailedError

        status = ERROR if result.error else (PASSED if result.success else FAILED)
        row = {
            "validation_id": result.validation_id,
            "pipeline": result.pipeline,
            "kind": result.kind,
            "checkpoint_id": result.checkpoint_id,
            "epoch": result.epoch,
            "restored_checkpoint_id": result.restored_checkpoint_id,
            "success": result.success,
            "status": status,
            "summary": result.summary(),
            "failed": len(result.failed),
            "evaluated": len(result.outcomes),
            "data_docs": result.data_docs or None,
            "run_name": result.run_name,
            "started_at": float(result.started_at),
            "finished_at": float(result.finished_at or time.time()),
            "details_json": result.details_json(),
        }
        data = pa.Table.from_pylist([row], schema=SCHEMA)
        def append(_: None) -> None:
            self._create()
            write_deltalake(self.path, data, mode="append")

        # a racing create or append: nothing of ours is visible, append again
        commit_on_snapshot(lambda: None, append, lost=CommitFailedError, attempts=_RETRIES,
                           exhausted=lambda n: CommitFailedError(f"{self.path}: {n} appends lost to concurrent writers"))
        return row

    def rows(self) -> list[dict[str, Any]]:
        """Every row, newest first (empty when nothing was ever validated)."""
        dt = self.load()
        if dt is None:
            return []
        return sorted(self.rows_at(dt), key=lambda r: r["finished_at"], reverse=True)

    def latest(self, kind: str | None = None, checkpoint_id: int | None = None) -> dict[str, Any] | None:
        """The newest row (of ``kind``, on ``checkpoint_id``), or None."""
        for r in self.rows():
            if (kind is None or r["kind"] == kind) and (checkpoint_id is None or r["checkpoint_id"] == checkpoint_id):
                return r
        return None

    # --- what maintenance may prune (core.retention.PrunedStore) ---------------------------------

    name = "validations"

    def load(self) -> Any:
        """The latest snapshot of the table (a ``deltalake.DeltaTable``), None when nothing was
        ever validated."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.path)
        except TableNotFoundError:
            return None

    def rows_at(self, snapshot: Any) -> list[dict[str, Any]]:
        return snapshot.to_pyarrow_table().to_pylist()

    def rows_to_keep(self, snapshot: Any, rows: Sequence[dict[str, Any]], retention: Retention) -> list[dict[str, Any]]:
        """The newest row of each kind, rows naming no checkpoint finished since
        ``retention.results_since``, and rows of checkpoints that are not droppable (by the latest
        checkpoints: ids only grow, so a read after the snapshot is safe)."""
        newest: dict[str, dict[str, Any]] = {}
        for r in rows:
            if r["kind"] not in newest or r["finished_at"] > newest[r["kind"]]["finished_at"]:
                newest[r["kind"]] = r
        keep_ids = {r["validation_id"] for r in newest.values()}

        def needed(r: Mapping[str, Any]) -> bool:
            if r["validation_id"] in keep_ids:
                return True
            if r["checkpoint_id"] is None:
                return r["finished_at"] >= retention.results_since
            return not retention.needs.droppable(r["checkpoint_id"])

        return [r for r in rows if needed(r)]

    def keeps(self, retention: Retention) -> str:
        return ("validations of protected ids and ids at or above the floor, the newest of each "
                f"kind, those naming no checkpoint for {retention.result_days:g} days")

"""Acknowledgements of pending checkpoints, durable as they arrive, so that stages running as
separate processes complete a checkpoint together (whoever writes the last ack completes it)."""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Mapping, Sequence

import pyarrow as pa

from ..core.retention import Retention
from ..core.types import CheckpointId, CheckpointStatus, SubtaskAck, SubtaskId
from .ack_codec import ACK_FIELDS, ack_fields, subtask_id
from .control_table import ControlRoot, ControlTable, StoreOnTable

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
"""The ``acks`` table. A completed row repeats every ack (``acks_json``): this table is only read
for pending checkpoints."""


class DeltaAckStore(StoreOnTable):
    """The ``acks`` table: appended per subtask group, read per pending checkpoint and epoch.

    ``after_commit(file_count)``: told the table's data-file count after each write (compaction)."""

    def __init__(self, place: ControlRoot, after_commit: Callable[[int], None] = lambda files: None):
        self.table = ControlTable(place, "acks", ACKS_SCHEMA)
        self._after_commit = after_commit

    def record(
        self, checkpoint_id: CheckpointId, acks: Mapping[SubtaskId, SubtaskAck], epoch: int,
        ack_time: float | None = None,
    ) -> None:
        """Durably record acknowledgements of a pending checkpoint (one Delta commit). Refused with
        :class:`FencedError` for a writer of an older epoch."""
        if not acks:
            return
        now = float(self.table.place.now())
        when = now if ack_time is None else float(ack_time)
        rows = []
        for subtask, ack in sorted(acks.items()):
            try:
                text = json.dumps(ack_fields(ack), sort_keys=True)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"checkpoint {checkpoint_id}: the ack of {subtask} is not JSON: {exc}") from exc
            rows.append({"checkpoint_id": int(checkpoint_id), "epoch": int(epoch), "subtask": str(subtask),
                         "ack_json": text, "ack_time": when, "recorded_at": now})
        self._after_commit(self.table.commit(lambda dt: rows, fence=epoch) + 1)

    def pending(self, checkpoint_id: CheckpointId, epoch: int) -> dict[SubtaskId, tuple[SubtaskAck, float]]:
        """The acks ``epoch`` recorded for ``checkpoint_id`` (the first per subtask), with times."""
        rows = [r for r in self.table.rows() if r["checkpoint_id"] == checkpoint_id and r["epoch"] == epoch]
        out: dict[SubtaskId, tuple[SubtaskAck, float]] = {}
        for r in sorted(rows, key=lambda r: r["recorded_at"]):
            subtask = subtask_id(r["subtask"])
            if subtask in out:
                continue
            a = json.loads(r["ack_json"])
            out[subtask] = (SubtaskAck(**{k: a[k] for k in a if k in ACK_FIELDS}), r["ack_time"])
        return out

    def checkpoint_ids(self) -> set[CheckpointId]:
        """Every checkpoint id with an ack row."""
        table, _ = self.table.read("distinct checkpoint_id")
        return set(table["checkpoint_id"].to_pylist())

    def prune(self, pending: Iterable[CheckpointId]) -> None:
        """Drop the ack rows of checkpoints that are no longer pending (their completed or aborted
        row says all there is; ``pending``: the ids still pending). One delete commit; an ack
        appended concurrently is a new file the delete never touches."""
        dt = self.table.load()
        if dt is None:
            return
        done = sorted(self.checkpoint_ids() - set(pending))
        if done:
            dt.delete(f"checkpoint_id IN ({', '.join(str(int(i)) for i in done)})")

    # --- what maintenance may prune (core.retention.PrunedStore) ---------------------------------

    def rows_to_keep(self, snapshot: Any, rows: Sequence[dict[str, Any]], retention: Retention) -> list[dict[str, Any]]:
        """The acks of checkpoints still pending (a completed row repeats all its acks), by the
        latest statuses (they only move forward: one that is final stays final), and of ids with
        no status row (in flight: the pending row comes first; or long gone) that are not
        droppable."""
        def needed(r: Mapping[str, Any]) -> bool:
            status = retention.statuses.get(r["checkpoint_id"])
            if status is None:
                return not retention.needs.droppable(r["checkpoint_id"])
            return status == CheckpointStatus.PENDING

        return [r for r in rows if needed(r)]

    def keeps(self, retention: Retention | None = None) -> str:
        return "acks of checkpoints still pending (a completed row repeats all its acks)"

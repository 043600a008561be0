"""A synthetic checkpoint history written through the real store (delta-rs, no Spark), for the
pages that draw one (the HTML report, the Checkpoints page): two epochs, a recovery that restored
checkpoint 3, an aborted checkpoint 4, unaligned checkpoints with channel state, a validation."""

from __future__ import annotations

from pathlib import Path

from checkpoint_lib.core.checkpoints import CompletedCheckpoint
from checkpoint_lib.core.errors import FailureReason
from checkpoint_lib.core.types import CheckpointKind, SubtaskAck, SubtaskId
from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.quality.records import ValidationLog
from checkpoint_lib.quality.result import ExpectationOutcome, QualityResult


def completed(cid: int, t: float, cs_rows: int = 0) -> CompletedCheckpoint:
    acks = {SubtaskId("source", i): SubtaskAck(state={"version": cid, "next_seq": 2 * cid, "barrier_seq": 2 * cid - 1})
            for i in range(2)}
    for i in range(3):
        acks[SubtaskId("balance", i)] = SubtaskAck(
            state={"table_version": cid, "key_groups": [i * 43, min(127, i * 43 + 42)], "cursor": 2 * cid},
            state_size_bytes=1000 + 150 * cid + 10 * i, channel_state_rows=cs_rows, channel_state_bytes=64 * cs_rows,
            alignment_ms=2.5 * cid, unaligned=cs_rows > 0, duration_ms=40.0 + cid)
    return CompletedCheckpoint(cid, CheckpointKind.CHECKPOINT, t, t + 0.2 + 0.05 * cid, acks,
                               {s: t + 0.1 for s in acks})


def synthetic_history(w: Path) -> Path:
    """Write the history of ``payments`` into warehouse ``w``; returns ``w``."""
    root = w / "_checkpoints" / "payments"
    store = DeltaCheckpointStore.open(root, retained=10)
    t = 1_790_000_000.0
    e1 = store.epochs.begin("test", "recover (all)")
    store.sessions.record_restored(e1, None, {})
    for cid in (1, 2, 3):
        store.checkpoints.record_pending(cid, epoch=e1, trigger_time=t + cid)
        store.checkpoints.add(completed(cid, t + cid, cs_rows=cid - 1), epoch=e1)
    store.checkpoints.record_pending(4, epoch=e1, trigger_time=t + 4)  # the crash: 4 never completes
    e2 = store.epochs.begin("test", "recover (all)")
    store.checkpoints.record_aborted(4, FailureReason.TASK_FAILURE, "epoch 1 ended before it completed", e1,
                                     fence=e2)
    store.sessions.record_restored(e2, 3, {})
    for cid in (5, 6):
        store.checkpoints.record_pending(cid, epoch=e2, trigger_time=t + cid)
        store.checkpoints.add(completed(cid, t + cid), epoch=e2)
    result = QualityResult("payments", "restore", 6, e2, 3, "payments-restore-c6-e2-test",
                           str(w / "_quality" / "payments" / "data_docs" / "index.html"),
                           [ExpectationOutcome("ledger", "expect_column_values_to_be_unique", "event_id", True)],
                           metrics={"valid_rows": 291, "dead_letters": 9, "sink_rows": 291, "restored_state_keys": 12},
                           started_at=t + 7, finished_at=t + 8, validation_id="v1", restore_known=True)
    ValidationLog(root).record(result)
    return w

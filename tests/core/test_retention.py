"""core/retention.py: what the retained checkpoints need (pure), and what a pruned store is told."""

from __future__ import annotations

from checkpoint_lib.core.checkpoints import CompletedCheckpoint
from checkpoint_lib.core.retention import Needs, PrunedStore, Restores, Retention
from checkpoint_lib.core.types import CheckpointKind, CheckpointStatus


def completed(cid: int, kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> CompletedCheckpoint:
    return CompletedCheckpoint(cid, kind, float(cid), float(cid) + 1, {}, {})


def test_the_floor_is_the_oldest_retained_regular_checkpoint_lowered_to_the_oldest_pending():
    kept = [completed(2, CheckpointKind.SAVEPOINT), completed(7), completed(8)]
    statuses = {i: CheckpointStatus.ABORTED for i in range(1, 11)}
    statuses |= {2: CheckpointStatus.COMPLETED, 7: CheckpointStatus.COMPLETED, 8: CheckpointStatus.COMPLETED}
    needs = Needs.of(kept, statuses, corrupt=[4], restores=Restores(restored=3, restored_epoch=2, restored_at=9.0))
    assert needs.retained == [2, 7, 8] and needs.savepoints == [2] and needs.pending == []
    assert needs.floor == 7  # the savepoint does not pin everything after it
    assert needs.protected == {2, 3, 4, 7, 8, 10} and needs.max_id == 10
    assert [i for i in range(1, 11) if needs.droppable(i)] == [1, 5, 6]
    assert not needs.droppable(None)

    statuses[6] = CheckpointStatus.PENDING
    pending = Needs.of(kept, statuses, restores=Restores(owed_rollback=5))
    assert pending.pending == [6] and pending.floor == 6 and 5 in pending.protected
    assert pending.restores == Restores(owed_rollback=5)
    assert Needs.of([], {}).floor == 0 and Needs.of([], {3: CheckpointStatus.ABORTED}).floor == 3  # the largest id


def test_needs_to_dict_lists_the_protected_ids_sorted():
    needs = Needs.of([completed(5)], {5: CheckpointStatus.COMPLETED, 1: CheckpointStatus.PENDING})
    d = needs.to_dict()
    assert d["protected"] == [1, 5] and d["floor"] == 1 and list(d)[:4] == ["retained", "savepoints", "pending", "corrupt"]


def test_a_retention_reads_the_checkpoints_once_and_only_when_asked():
    reads = []

    def latest():
        reads.append(1)
        return Needs.of([], {1: CheckpointStatus.PENDING}), {1: CheckpointStatus.PENDING}

    retention = Retention(Restores(), latest, now=100 * 86400.0, result_days=7)
    assert retention.results_since == 93 * 86400.0 and reads == []
    assert retention.needs.pending == [1] and retention.statuses == {1: CheckpointStatus.PENDING}
    assert reads == [1]


def test_a_store_that_says_what_it_keeps_is_a_pruned_store():
    class Rows:
        name = "rows"

        def load(self):
            return [1, 2, 3]

        def rows_at(self, snapshot):
            return [{"checkpoint_id": i} for i in snapshot]

        def rows_to_keep(self, snapshot, rows, retention):
            return [r for r in rows if not retention.needs.droppable(r["checkpoint_id"])]

        def keeps(self, retention):
            return "rows of ids that are not droppable"

    assert isinstance(Rows(), PrunedStore) and not isinstance(object(), PrunedStore)

"""Unit tests for checkpoint_lib.core.recovery: choosing a checkpoint and planning recovery."""

from __future__ import annotations

import json

import pytest

from checkpoint_lib.core.acks import KeyedAckState, PinnedState
from checkpoint_lib.core.checkpoints import CompletedCheckpoint
from checkpoint_lib.core.errors import NoCheckpointError, SnapshotIncompatibleError, UnknownCheckpointError
from checkpoint_lib.core.keygroups import KeyGroupRange
from checkpoint_lib.core.recovery import SINK_STATE_KEY, RecoveryPlan, check_fits, choose_checkpoint, plan_recovery
from checkpoint_lib.core.twophase import SinkRecovery, SinkSnapshot, Transaction
from checkpoint_lib.core.types import CheckpointKind, SubtaskAck, SubtaskId

SRC = SubtaskId("src", 0)
MAP = SubtaskId("map", 0)
SINK0 = SubtaskId("sink", 0)
SINK1 = SubtaskId("sink", 1)


def t(subtask: int, seq: int, epoch: int = 1, checkpoint_id: int | None = None, prefix: str = "out") -> Transaction:
    """Transaction number ``seq`` of sink subtask ``subtask`` (pool slot = seq)."""
    return Transaction(seq, f"{prefix}-{subtask}-{seq}", epoch, checkpoint_id)


def sink_ack(current: Transaction, *pending: Transaction, next_seq: int | None = None, **extra) -> SubtaskAck:
    snapshot = SinkSnapshot(current, pending, current.seq + 1 if next_seq is None else next_seq)
    return SubtaskAck(state={SINK_STATE_KEY: snapshot.to_dict(), **extra})


def completed(checkpoint_id: int, acks: dict | None = None, *, savepoint: bool = False) -> CompletedCheckpoint:
    return CompletedCheckpoint(
        checkpoint_id=checkpoint_id,
        kind=CheckpointKind.SAVEPOINT if savepoint else CheckpointKind.CHECKPOINT,
        trigger_time=float(checkpoint_id),
        completion_time=checkpoint_id + 0.25,
        acks=acks if acks is not None else {SRC: SubtaskAck(state={"offset": checkpoint_id})},
    )


# --- choose_checkpoint -------------------------------------------------------------------------------


def test_choose_latest_by_id_regardless_of_order():
    cps = [completed(3), completed(1), completed(2)]
    assert choose_checkpoint(cps).checkpoint_id == 3


def test_choose_named_checkpoint():
    cps = [completed(1), completed(2), completed(3)]
    assert choose_checkpoint(cps, 2) is cps[1]


def test_choose_named_savepoint():
    cps = [completed(1, savepoint=True), completed(2)]
    assert choose_checkpoint(cps, 1).is_savepoint


def test_choose_unknown_raises_listing_known_ids():
    with pytest.raises(
        UnknownCheckpointError,
        match=r"^checkpoint 7 is not a retained completed checkpoint; known: \[1, 2, 3\]$",
    ):
        choose_checkpoint([completed(3), completed(1), completed(2)], 7)


def test_choose_unknown_with_nothing_completed():
    with pytest.raises(UnknownCheckpointError, match=r"known: none$"):
        choose_checkpoint([], 1)


def test_choose_none_when_nothing_completed():
    assert choose_checkpoint([]) is None


# --- plan_recovery: basics ---------------------------------------------------------------------------


def test_plan_bumps_epoch_and_restores_every_subtask():
    acks = {
        SRC: SubtaskAck(state={"offset": 42}),
        MAP: SubtaskAck(state={"version": 7, "key_groups": [0, 1]}),
    }
    plan = plan_recovery([completed(1), completed(2, acks)], current_epoch=4)
    assert plan.checkpoint_id == 2
    assert plan.new_epoch == 5
    assert {s: dict(v) for s, v in plan.restore.items()} == {
        SRC: {"offset": 42},
        MAP: {"version": 7, "key_groups": [0, 1]},
    }
    assert plan.sinks == {}
    assert plan.recommit == [] and plan.abort == [] and plan.orphans == ()


def test_plan_named_checkpoint():
    plan = plan_recovery([completed(1), completed(2)], current_epoch=0, checkpoint_id=1)
    assert plan.checkpoint_id == 1
    assert dict(plan.restore[SRC]) == {"offset": 1}


def test_plan_unknown_checkpoint_raises():
    with pytest.raises(UnknownCheckpointError, match=r"known: \[1\]$"):
        plan_recovery([completed(1)], current_epoch=0, checkpoint_id=5)


def test_plan_replays_channel_state_of_subtasks_with_rows_only():
    acks = {
        SRC: SubtaskAck(channel_state_rows=0, channel_state_bytes=0),
        SubtaskId("map", 1): SubtaskAck(channel_state_rows=3, unaligned=True),
        MAP: SubtaskAck(channel_state_rows=1, unaligned=True),
        SINK0: SubtaskAck(channel_state_rows=0, unaligned=True),
    }
    plan = plan_recovery([completed(1, acks)], current_epoch=0)
    assert plan.replay_channel_state == (MAP, SubtaskId("map", 1))


def test_restoring_the_latest_never_rolls_back():
    assert plan_recovery([completed(1), completed(2)], current_epoch=0).rollback_after is None


def test_restoring_an_older_checkpoint_rolls_sinks_back_to_it():
    assert plan_recovery([completed(1), completed(2)], current_epoch=0, checkpoint_id=1).rollback_after == 1


def test_an_unreadable_completed_checkpoint_above_the_chosen_one_rolls_sinks_back():
    """Checkpoint 3 completed (its sinks may have committed) but its record is corrupt: restoring
    2 must undo what 3 committed, or the replay commits it again."""
    plan = plan_recovery([completed(1), completed(2)], current_epoch=0, unreadable=[3])
    assert plan.checkpoint_id == 2 and plan.rollback_after == 2
    assert "  roll sinks back to what checkpoint 2 committed" in plan.describe().splitlines()


def test_an_unreadable_checkpoint_below_the_chosen_one_changes_nothing():
    plan = plan_recovery([completed(1), completed(3)], current_epoch=0, unreadable=[2])
    assert plan.checkpoint_id == 3 and plan.rollback_after is None


def test_nothing_readable_but_something_completed_rolls_back_to_before_the_first_checkpoint():
    plan = plan_recovery([], current_epoch=0, unreadable=[1])
    assert plan.checkpoint is None and plan.rollback_after == 0
    assert plan_recovery([], current_epoch=0).rollback_after is None


# --- plan_recovery: sinks ----------------------------------------------------------------------------


def test_plan_recommits_pending_and_aborts_current_per_sink():
    acks = {
        SRC: SubtaskAck(state={"offset": 9}),
        SINK0: sink_ack(t(0, 2), t(0, 0, checkpoint_id=1), t(0, 1, checkpoint_id=2)),
        SINK1: sink_ack(t(1, 1), t(1, 0, checkpoint_id=2)),
    }
    plan = plan_recovery([completed(2, acks)], current_epoch=1)
    assert plan.sinks == {
        SINK0: SinkRecovery(recommit=(t(0, 0, checkpoint_id=1), t(0, 1, checkpoint_id=2)), abort=(t(0, 2),)),
        SINK1: SinkRecovery(recommit=(t(1, 0, checkpoint_id=2),), abort=(t(1, 1),)),
    }
    assert set(plan.sinks) == {SINK0, SINK1}  # the source has no sink state
    assert sorted(x.handle for x in plan.recommit) == ["out-0-0.e1.s0", "out-0-1.e1.s1", "out-1-0.e1.s0"]
    assert [x.handle for x in plan.abort] == ["out-1-1.e1.s1", "out-0-2.e1.s2"]


def test_plan_aborts_open_transactions_of_each_sink_not_owned():
    acks = {SINK0: sink_ack(t(0, 2), t(0, 1, checkpoint_id=2)), SINK1: sink_ack(t(1, 1))}
    open_txns = [
        t(0, 1),  # staged, owned by checkpoint 2: re-committed, not aborted
        t(0, 3, checkpoint_id=3),  # pre-committed for checkpoint 3, which never completed
        t(1, 2),  # sink 1's transaction begun after the checkpoint
        t(0, 0, epoch=0),  # a zombie of an older epoch
    ]
    plan = plan_recovery([completed(2, acks)], current_epoch=1, open_transactions=open_txns)
    assert plan.sinks[SINK0] == SinkRecovery(
        recommit=(t(0, 1, checkpoint_id=2),), abort=(t(0, 0, epoch=0), t(0, 2), t(0, 3, checkpoint_id=3))
    )
    assert plan.sinks[SINK1] == SinkRecovery(recommit=(), abort=(t(1, 1), t(1, 2)))
    assert plan.orphans == ()
    aborted = [x.handle for x in plan.abort]
    assert len(aborted) == len(set(aborted)) == 5
    assert "out-0-1.e1.s1" not in aborted


def test_plan_aborts_orphan_open_transactions():
    acks = {SINK0: sink_ack(t(0, 1), t(0, 0, checkpoint_id=1))}
    orphan_a = t(5, 0, prefix="other")  # a sink subtask the checkpoint knows nothing of
    orphan_b = t(3, 4)  # sink subtask 3 did not exist when checkpoint 1 was taken
    plan = plan_recovery(
        [completed(1, acks)], current_epoch=1, open_transactions=[orphan_b, t(0, 2), orphan_a]
    )
    assert plan.orphans == (orphan_a, orphan_b)  # sorted (seq first)
    assert plan.sinks[SINK0].abort == (t(0, 1), t(0, 2))
    assert plan.abort == [t(0, 1), t(0, 2), orphan_a, orphan_b]


def test_plan_with_other_state_beside_sink_state():
    acks = {SINK0: sink_ack(t(0, 1), t(0, 0, checkpoint_id=1), version=12)}
    plan = plan_recovery([completed(1, acks)], current_epoch=0)
    assert plan.restore[SINK0]["version"] == 12
    assert plan.recommit == [t(0, 0, checkpoint_id=1)]


# --- plan_recovery: nothing completed ------------------------------------------------------------------


def test_fresh_start_plan_when_nothing_completed():
    open_txns = [t(0, 3), t(0, 1)]
    plan = plan_recovery([], current_epoch=2, open_transactions=open_txns)
    assert plan == RecoveryPlan(None, 3, {}, (), {}, (t(0, 1), t(0, 3)))
    assert plan.checkpoint_id is None
    assert plan.recommit == []
    assert plan.abort == [t(0, 1), t(0, 3)]


def test_require_checkpoint_raises_when_nothing_completed():
    with pytest.raises(NoCheckpointError, match="^there is no completed checkpoint to recover from$"):
        plan_recovery([], current_epoch=0, require_checkpoint=True)


def test_require_checkpoint_with_a_completed_one_plans():
    assert plan_recovery([completed(1)], current_epoch=0, require_checkpoint=True).checkpoint_id == 1


# --- describe --------------------------------------------------------------------------------------------


def test_describe_mentions_checkpoint_recommits_and_aborts():
    acks = {
        SRC: SubtaskAck(state={"offset": 42}),
        MAP: SubtaskAck(channel_state_rows=2),
        SINK0: sink_ack(t(0, 1), t(0, 0, checkpoint_id=3)),
    }
    plan = plan_recovery([completed(3, acks)], current_epoch=1, open_transactions=[t(9, 0, prefix="x")])
    lines = plan.describe().splitlines()
    assert lines[0] == "restore checkpoint 3 (completed 1970-01-01 00:00:03 UTC) as epoch 2"
    assert "  restore src[0]: {'offset': 42}" in lines
    assert "  replay channel state of map[0]" in lines
    assert "  re-commit out-0-0.e1.s0 (checkpoint 3)" in lines
    assert "  abort out-0-1.e1.s1" in lines
    assert "  abort x-9-0.e1.s0" in lines
    assert len(lines) == 1 + 3 + 1 + 1 + 2
    as_json = json.loads(json.dumps(plan.to_dict()))  # what `ckpt recover --dry-run -o json` prints
    assert as_json["checkpoint_id"] == 3 and as_json["new_epoch"] == 2 and as_json["kind"] == "checkpoint"
    assert as_json["restore"]["src[0]"] == {"offset": 42} and as_json["replay_channel_state"] == ["map[0]"]
    assert as_json["recommit"] == [{"handle": "out-0-0.e1.s0", "checkpoint_id": 3}]
    assert as_json["abort"] == ["out-0-1.e1.s1", "x-9-0.e1.s0"]


def test_describe_savepoint_kind():
    plan = plan_recovery([completed(4, savepoint=True)], current_epoch=0)
    assert plan.describe().splitlines()[0] == "restore savepoint 4 (completed 1970-01-01 00:00:04 UTC) as epoch 1"


def test_describe_fresh_start():
    plan = plan_recovery([], current_epoch=0, open_transactions=[t(0, 0)])
    assert plan.describe() == "no completed checkpoint: start from scratch as epoch 1\n  abort out-0-0.e1.s0"


# --- whether a snapshot fits the pipeline ---------------------------------------------------------


def keyed(*spans: tuple[int, int], rows: int = 0) -> dict[SubtaskId, SubtaskAck]:
    return {SubtaskId("op", i): SubtaskAck(state=KeyedAckState(0, PinnedState(1, KeyGroupRange(*span))).to_state(),
                                           channel_state_rows=rows)
            for i, span in enumerate(spans)}


def fits(acks: dict, subtasks, **kw):
    kw = {"keyed_operator": "op", "max_parallelism": 128, "partitioning": "hash", **kw}
    return check_fits(completed(7, acks), subtasks, **kw)


def test_a_snapshot_at_another_parallelism_rescales_and_a_new_operator_starts_empty():
    acks = {SRC: SubtaskAck(), **keyed((0, 63), (64, 127))}
    subtasks = [SRC, *(SubtaskId("op", i) for i in range(3)), SINK0]
    assert fits(acks, subtasks) == ["op 2 -> 3", "operator 'sink' is not in the snapshot (new operator: starts empty)"]


def test_key_groups_that_stop_short_of_max_parallelism_are_refused():
    """Tiling 0..95 passes the store's structure check, but keys of groups 96..127 would restore
    without state (their running totals silently reset)."""
    acks = keyed((0, 47), (48, 95))
    with pytest.raises(SnapshotIncompatibleError, match=r"key groups end at 95, not at 127.*96\.\.127 would restore without state"):
        fits(acks, list(acks))
    with pytest.raises(SnapshotIncompatibleError, match="more key groups than max parallelism 64"):
        fits(keyed((0, 63), (64, 127)), [SubtaskId("op", 0), SubtaskId("op", 1)], max_parallelism=64)


def test_removed_operators_and_unroutable_channel_state_are_refused_with_every_reason():
    acks = {**keyed((0, 127), rows=5), SubtaskId("dedup", 0): SubtaskAck()}
    with pytest.raises(SnapshotIncompatibleError) as err:
        fits(acks, [SubtaskId("op", 0), SubtaskId("op", 1)], partitioning="forward")
    message = str(err.value)
    assert "removed operators ['dedup']: pass --allow-non-restored-state" in message
    assert "in-flight channel state on a forward edge" in message
    assert fits(acks, [SubtaskId("op", 0)], allow_non_restored_state=True) == []


def test_every_keyed_operator_of_a_graph_must_cover_every_key_group():
    """A graph has several keyed operators: each one's snapshot is checked, and a problem names it."""
    acks = {SRC: SubtaskAck(), **keyed((0, 127))}
    acks[SubtaskId("other", 0)] = SubtaskAck(state=KeyedAckState(0, PinnedState(1, KeyGroupRange(0, 63))).to_state())
    subtasks = [SRC, SubtaskId("op", 0), SubtaskId("other", 0), SINK0]
    assert not [c for c in fits(acks, subtasks, keyed_operator=["op"]) if "key groups" in c]
    with pytest.raises(SnapshotIncompatibleError, match="operator 'other': the snapshot's key groups end at 63"):
        fits(acks, subtasks, keyed_operator=["op", "other"])

"""Unit tests for checkpoint_lib.core.types, .errors (vocabulary) and .clock."""

from __future__ import annotations

import pytest

from checkpoint_lib.core.clock import ManualClock
from checkpoint_lib.core.errors import FailureReason
from checkpoint_lib.core.types import (
    Barrier,
    BarrierMode,
    CheckpointKind,
    SubtaskAck,
    SubtaskId,
)

# --- SubtaskId ------------------------------------------------------------------------------------


def test_subtask_id_str_and_order():
    assert str(SubtaskId("keyed", 2)) == "keyed[2]"
    assert sorted([SubtaskId("b", 0), SubtaskId("a", 1), SubtaskId("a", 0)]) == [
        SubtaskId("a", 0),
        SubtaskId("a", 1),
        SubtaskId("b", 0),
    ]


def test_subtask_id_is_hashable_value():
    assert SubtaskId("src", 0) == SubtaskId("src", 0)
    assert len({SubtaskId("src", 0), SubtaskId("src", 0), SubtaskId("src", 1)}) == 2


def test_subtask_id_index_zero_is_valid():
    assert SubtaskId("src", 0).index == 0


def test_subtask_id_rejects_empty_operator():
    with pytest.raises(ValueError, match=r"^SubtaskId.operator must be a non-empty string$"):
        SubtaskId("", 0)


def test_subtask_id_rejects_negative_index():
    with pytest.raises(ValueError, match=r"^SubtaskId.index must be >= 0, got -1$"):
        SubtaskId("src", -1)


# --- Barrier ----------------------------------------------------------------------------------------


def test_barrier_defaults_to_checkpoint_kind():
    barrier = Barrier(1, 12.5)
    assert (barrier.checkpoint_id, barrier.timestamp, barrier.kind) == (1, 12.5, CheckpointKind.CHECKPOINT)


@pytest.mark.parametrize("bad_id", [0, -3])
def test_barrier_rejects_non_positive_ids(bad_id):
    with pytest.raises(ValueError, match=rf"^checkpoint ids start at 1, got {bad_id}$"):
        Barrier(bad_id, 0.0)


def test_barrier_is_immutable():
    barrier = Barrier(1, 0.0)
    with pytest.raises(AttributeError):
        barrier.checkpoint_id = 2  # type: ignore[misc]


# --- BarrierMode ----------------------------------------------------------------------------------

BARRIER_MODE_EXACTLY_ONCE = {
    BarrierMode.ALIGNED: True,
    BarrierMode.UNALIGNED: True,
    BarrierMode.ALIGNED_WITH_TIMEOUT: True,
    BarrierMode.AT_LEAST_ONCE: False,
}


def test_barrier_mode_table_covers_every_member():
    assert set(BARRIER_MODE_EXACTLY_ONCE) == set(BarrierMode)


@pytest.mark.parametrize("mode", list(BarrierMode), ids=lambda m: m.name)
def test_barrier_mode_exactly_once(mode):
    assert mode.exactly_once is BARRIER_MODE_EXACTLY_ONCE[mode]


# --- FailureReason.counts_as_failure ------------------------------------------------------------

# Deciding whether a new reason counts toward tolerable_failed_checkpoints is a design decision:
# adding a member to FailureReason without adding it here breaks the tests below on purpose.
COUNTS_AS_FAILURE = {
    FailureReason.NOT_ALL_TASKS_RUNNING: False,
    FailureReason.TOO_MANY_CONCURRENT_CHECKPOINTS: False,
    FailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS: False,
    FailureReason.COORDINATOR_SHUTDOWN: False,
    FailureReason.SUBSUMED: False,
    FailureReason.EXPIRED: True,
    FailureReason.DECLINED: True,
    FailureReason.ALIGNMENT_ABANDONED: False,
    FailureReason.TASK_FAILURE: False,
    FailureReason.IO_ERROR: True,
    FailureReason.FINALIZE_FAILED: True,
    FailureReason.USER_ABORT: False,
}


def test_counts_as_failure_table_covers_every_member():
    assert set(COUNTS_AS_FAILURE) == set(FailureReason)


@pytest.mark.parametrize("reason", list(FailureReason), ids=lambda r: r.name)
def test_failure_reason_counts_as_failure(reason):
    assert reason.counts_as_failure is COUNTS_AS_FAILURE[reason]


# --- SubtaskAck -------------------------------------------------------------------------------------


def test_subtask_ack_defaults_are_empty():
    ack = SubtaskAck()
    assert dict(ack.state) == {}
    assert (ack.state_size_bytes, ack.channel_state_rows, ack.channel_state_bytes) == (0, 0, 0)
    assert (ack.alignment_ms, ack.unaligned, ack.duration_ms) == (0.0, False, 0.0)


def test_subtask_ack_default_states_are_not_shared():
    assert SubtaskAck().state is not SubtaskAck().state


# --- ManualClock ------------------------------------------------------------------------------------


def test_manual_clock_starts_where_told():
    assert ManualClock().now() == 0.0
    assert ManualClock(5).now() == 5.0


def test_manual_clock_advance_returns_new_time():
    clock = ManualClock(1.0)
    assert clock.advance(2.5) == 3.5
    assert clock.now() == 3.5
    assert clock.advance(0) == 3.5


def test_manual_clock_never_goes_backwards_on_advance():
    clock = ManualClock(10.0)
    with pytest.raises(ValueError, match="a clock never goes backwards"):
        clock.advance(-0.001)
    assert clock.now() == 10.0


def test_manual_clock_set_forward_and_to_same_time():
    clock = ManualClock(10.0)
    clock.set(10.0)
    assert clock.now() == 10.0
    clock.set(42)
    assert clock.now() == 42.0


def test_manual_clock_never_goes_backwards_on_set():
    clock = ManualClock(10.0)
    with pytest.raises(ValueError, match="a clock never goes backwards"):
        clock.set(9.999)
    assert clock.now() == 10.0

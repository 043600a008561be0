"""Barrier handlers: every rule of BRIEF.md "Three ways to handle barriers", error paths included."""

from __future__ import annotations

import pytest

from checkpoint_lib.core.barriers import (
    ChannelStateComplete,
    CheckpointDone,
    DeclineCheckpoint,
    Deliver,
    ForwardBarrier,
    LogChannelState,
    TakeSnapshot,
    create_handler,
)
from checkpoint_lib.core.clock import ManualClock
from checkpoint_lib.core.errors import CorruptStreamError
from checkpoint_lib.core.types import Barrier, BarrierMode


def b(cid: int) -> Barrier:
    return Barrier(cid, float(cid))


def kinds(effects) -> list[str]:
    """A compact picture of effects: D0:a (deliver), S1 (snapshot), F1, L1/0:a, C1/0, A1, X1."""
    out = []
    for e in effects:
        if isinstance(e, Deliver):
            out.append(f"D{e.channel}:{e.record}")
        elif isinstance(e, TakeSnapshot):
            out.append(f"S{e.checkpoint_id}{'u' if e.unaligned else ''}")
        elif isinstance(e, ForwardBarrier):
            out.append(f"F{e.barrier.checkpoint_id}")
        elif isinstance(e, LogChannelState):
            out.append(f"L{e.checkpoint_id}/{e.channel}:{e.record}")
        elif isinstance(e, ChannelStateComplete):
            out.append(f"C{e.checkpoint_id}/{e.channel}")
        elif isinstance(e, CheckpointDone):
            out.append(f"A{e.checkpoint_id}")
        elif isinstance(e, DeclineCheckpoint):
            out.append(f"X{e.checkpoint_id}:{e.reason.value}")
    return out


def handler(mode, n=3, clock=None, **kw):
    return create_handler(n, mode, clock or ManualClock(), **kw)


# --- construction -----------------------------------------------------------------------------


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown barrier mode 'exactly'; expected one of: aligned"):
        create_handler(2, "exactly", ManualClock())


@pytest.mark.parametrize("n", [0, -1])
def test_needs_a_channel(n):
    with pytest.raises(ValueError, match="at least one input channel"):
        create_handler(n, "aligned", ManualClock())


def test_timeout_only_with_aligned_with_timeout():
    with pytest.raises(ValueError, match="needs alignment_timeout"):
        create_handler(2, "aligned_with_timeout", ManualClock())
    with pytest.raises(ValueError, match="only applies to aligned_with_timeout"):
        create_handler(2, "aligned", ManualClock(), alignment_timeout=1.0)


def test_channel_out_of_range():
    h = handler("aligned", 2)
    with pytest.raises(ValueError, match="channel 2 out of range 0..1"):
        h.on_record(2, "x")


# --- rules shared by every mode ---------------------------------------------------------------


@pytest.mark.parametrize("mode", list(BarrierMode))
def test_same_barrier_twice_on_a_channel_is_corrupt(mode):
    h = handler(mode, 2, alignment_timeout=5.0 if mode is BarrierMode.ALIGNED_WITH_TIMEOUT else None)
    h.on_barrier(0, b(1))
    with pytest.raises(CorruptStreamError, match="delivered the barrier of checkpoint 1 twice"):
        h.on_barrier(0, b(1))


@pytest.mark.parametrize("mode", list(BarrierMode))
def test_barrier_going_backwards_on_a_channel_is_corrupt(mode):
    h = handler(mode, 1, alignment_timeout=5.0 if mode is BarrierMode.ALIGNED_WITH_TIMEOUT else None)
    h.on_barrier(0, b(3))
    with pytest.raises(CorruptStreamError, match="delivered barrier 2 after barrier 3"):
        h.on_barrier(0, b(2))


@pytest.mark.parametrize("mode", list(BarrierMode))
def test_nothing_after_end_of_channel(mode):
    h = handler(mode, 2, alignment_timeout=5.0 if mode is BarrierMode.ALIGNED_WITH_TIMEOUT else None)
    h.on_end_of_channel(1)
    with pytest.raises(CorruptStreamError, match="channel 1 delivered a record after its end"):
        h.on_record(1, "late")


@pytest.mark.parametrize("mode", list(BarrierMode))
def test_single_channel_snapshots_at_once(mode):
    h = handler(mode, 1, alignment_timeout=5.0 if mode is BarrierMode.ALIGNED_WITH_TIMEOUT else None)
    assert kinds(h.on_record(0, "a")) == ["D0:a"]
    snapshot = "S1u" if mode is BarrierMode.UNALIGNED else "S1"  # unaligned mode reports as such
    assert kinds(h.on_barrier(0, b(1))) == [snapshot, "F1", "A1"]


# --- aligned ----------------------------------------------------------------------------------


def test_aligned_blocks_until_all_channels_delivered_then_releases_held_first():
    h = handler("aligned", 3)
    assert kinds(h.on_record(0, "a")) == ["D0:a"]
    assert kinds(h.on_barrier(0, b(1))) == []
    assert h.blocked == {0} and h.aligning == 1
    assert kinds(h.on_record(0, "after")) == []  # held, not delivered
    assert kinds(h.on_record(1, "b")) == ["D1:b"]  # not blocked yet
    assert kinds(h.on_barrier(1, b(1))) == []
    assert kinds(h.on_record(1, "after1")) == []
    assert h.held == 2
    # the last barrier: snapshot, forward, acknowledge, then the held records in arrival order
    assert kinds(h.on_barrier(2, b(1))) == ["S1", "F1", "A1", "D0:after", "D1:after1"]
    assert h.blocked == set() and h.held == 0 and h.aligning is None


def test_aligned_reports_alignment_time():
    clock = ManualClock()
    h = handler("aligned", 2, clock)
    h.on_barrier(0, b(1))
    clock.advance(2.5)
    (snap, *_) = h.on_barrier(1, b(1))
    assert isinstance(snap, TakeSnapshot) and snap.alignment_s == pytest.approx(2.5) and not snap.unaligned


def test_aligned_higher_barrier_abandons_and_realigns():
    h = handler("aligned", 3)
    h.on_barrier(0, b(1))
    h.on_record(0, "held")
    effects = h.on_barrier(1, b(2))
    # checkpoint 1 declined, held record released, then alignment of 2 starts on channel 1
    assert kinds(effects) == ["X1:alignment_abandoned", "D0:held"]
    assert h.aligning == 2 and h.blocked == {1}
    assert kinds(h.on_barrier(0, b(2))) == []
    assert kinds(h.on_barrier(2, b(2))) == ["S2", "F2", "A2"]


def test_aligned_lower_barrier_is_ignored():
    h = handler("aligned", 2)
    h.on_barrier(0, b(2))
    assert kinds(h.on_barrier(1, b(1))) == []  # lower id from another channel: ignored
    assert h.aligning == 2 and h.blocked == {0}
    assert kinds(h.on_barrier(1, b(2))) == ["S2", "F2", "A2"]


def test_aligned_late_barrier_of_finished_checkpoint_is_ignored():
    h = handler("aligned", 2)
    h.on_barrier(0, b(1))
    h.on_barrier(1, b(2))  # abandons 1
    h.on_barrier(0, b(2))  # completes 2
    assert kinds(h.on_barrier(1, b(3))) == []
    assert h.aligning == 3


def test_aligned_end_of_open_channel_completes_alignment():
    h = handler("aligned", 3)
    h.on_barrier(0, b(1))
    h.on_barrier(1, b(1))
    assert kinds(h.on_end_of_channel(2)) == ["S1", "F1", "A1"]
    # from now on channel 2 counts as closed: two barriers are enough
    h.on_barrier(0, b(2))
    assert kinds(h.on_barrier(1, b(2))) == ["S2", "F2", "A2"]


def test_aligned_end_of_blocked_channel_is_held_like_any_event():
    h = handler("aligned", 2)
    h.on_barrier(0, b(1))
    assert kinds(h.on_end_of_channel(0)) == []  # held behind the barrier
    assert 0 not in h.ended
    assert kinds(h.on_barrier(1, b(1))) == ["S1", "F1", "A1"]
    assert 0 in h.ended and not h.finished
    h.on_end_of_channel(1)
    assert h.finished


def test_aligned_held_barrier_of_next_checkpoint_starts_next_alignment():
    h = handler("aligned", 2)
    h.on_barrier(0, b(1))
    h.on_record(0, "x")
    h.on_barrier(0, b(2))  # held behind barrier 1
    effects = h.on_barrier(1, b(1))
    assert kinds(effects) == ["S1", "F1", "A1", "D0:x"]
    assert h.aligning == 2 and h.blocked == {0}


def test_aligned_abort_from_coordinator_releases():
    h = handler("aligned", 2)
    h.on_barrier(0, b(1))
    h.on_record(0, "x")
    assert kinds(h.on_checkpoint_aborted(1)) == ["D0:x"]
    assert h.aligning is None and h.blocked == set()
    assert kinds(h.on_barrier(1, b(1))) == []  # the aborted checkpoint's late barrier is ignored


@pytest.mark.parametrize("mode,timeout", [("aligned", None), ("aligned_with_timeout", 5.0)])
def test_aligned_newer_barrier_abandons_alignment_also_after_the_coordinator_aborted_it(mode, timeout):
    """Channel 1's sender skipped checkpoint 1 and forwarded barrier 2, which the coordinator then
    aborted: barrier 2 still abandons the alignment of 1. Kept blocked, channel 0 would wait for a
    checkpoint that can never align, and channel 1's end would acknowledge 1 with records that
    came after barrier 2 (an inconsistent cut)."""
    h = handler(mode, 2, alignment_timeout=timeout)
    h.on_barrier(0, b(1))
    h.on_record(0, "held")
    assert kinds(h.on_checkpoint_aborted(2)) == []  # checkpoint 1 may still align
    assert h.aligning == 1
    assert kinds(h.on_barrier(1, b(2))) == ["X1:alignment_abandoned", "D0:held"]
    assert h.aligning is None and h.blocked == set()
    assert kinds(h.on_record(1, "after 2")) == ["D1:after 2"]
    assert kinds(h.on_end_of_channel(1)) == []  # nothing left to acknowledge


# --- unaligned --------------------------------------------------------------------------------


def test_unaligned_snapshots_on_first_barrier_and_logs_in_flight_records():
    h = handler("unaligned", 3)
    assert kinds(h.on_barrier(1, b(1))) == ["S1u", "F1"]
    assert h.logging_channel_state == {1: frozenset({0, 2})}
    # records before the barrier on channels 0 and 2 are processed and logged as channel state
    assert kinds(h.on_record(0, "a")) == ["L1/0:a", "D0:a"]
    assert kinds(h.on_record(1, "after")) == ["D1:after"]  # after its barrier: not channel state
    assert kinds(h.on_barrier(0, b(1))) == ["C1/0"]
    assert kinds(h.on_record(2, "c")) == ["L1/2:c", "D2:c"]
    assert kinds(h.on_barrier(2, b(1))) == ["C1/2", "A1"]
    assert h.logging_channel_state == {}


def test_unaligned_never_blocks():
    h = handler("unaligned", 2)
    h.on_barrier(0, b(1))
    assert h.blocked == set()
    assert kinds(h.on_record(0, "x")) == ["D0:x"]


def test_unaligned_overlapping_checkpoints_log_independently():
    h = handler("unaligned", 2)
    h.on_barrier(0, b(1))
    h.on_barrier(0, b(2))
    assert kinds(h.on_record(1, "r")) == ["L1/1:r", "L2/1:r", "D1:r"]
    assert kinds(h.on_barrier(1, b(1))) == ["C1/1", "A1"]
    assert kinds(h.on_barrier(1, b(2))) == ["C2/1", "A2"]


def test_unaligned_end_of_channel_completes_its_channel_state():
    h = handler("unaligned", 2)
    h.on_barrier(0, b(1))
    assert kinds(h.on_end_of_channel(1)) == ["C1/1", "A1"]


def test_unaligned_lower_id_from_other_channel_is_ignored():
    h = handler("unaligned", 3)
    h.on_barrier(0, b(5))
    assert kinds(h.on_barrier(1, b(4))) == []
    # channel 1 still owes barrier 5: what it delivers until then is channel state of 5
    assert h.logging_channel_state == {5: frozenset({1, 2})}
    assert kinds(h.on_record(1, "r")) == ["L5/1:r", "D1:r"]


def test_unaligned_abort_from_coordinator_stops_logging():
    h = handler("unaligned", 2)
    h.on_barrier(0, b(1))
    h.on_checkpoint_aborted(1)
    assert kinds(h.on_record(1, "r")) == ["D1:r"]
    assert kinds(h.on_barrier(1, b(1))) == []


# --- aligned with timeout ---------------------------------------------------------------------


def test_aligned_with_timeout_stays_aligned_when_fast():
    clock = ManualClock()
    h = handler("aligned_with_timeout", 2, clock, alignment_timeout=5.0)
    h.on_barrier(0, b(1))
    clock.advance(4.9)
    assert kinds(h.on_barrier(1, b(1))) == ["S1", "F1", "A1"]


def test_aligned_with_timeout_switches_to_unaligned_on_timer():
    clock = ManualClock()
    h = handler("aligned_with_timeout", 3, clock, alignment_timeout=5.0)
    h.on_barrier(0, b(1))
    h.on_record(0, "post-barrier")  # held: it is after channel 0's barrier
    h.on_barrier(1, b(1))
    clock.advance(5.0)
    effects = h.on_timer()
    assert kinds(effects) == ["S1u", "F1", "D0:post-barrier"]
    assert effects[0].alignment_s == pytest.approx(5.0)
    assert h.blocked == set() and h.logging_channel_state == {1: frozenset({2})}
    assert kinds(h.on_record(2, "in-flight")) == ["L1/2:in-flight", "D2:in-flight"]
    assert kinds(h.on_barrier(2, b(1))) == ["C1/2", "A1"]


def test_aligned_with_timeout_switches_when_the_next_event_arrives_late():
    clock = ManualClock()
    h = handler("aligned_with_timeout", 2, clock, alignment_timeout=1.0)
    h.on_barrier(0, b(1))
    clock.advance(3.0)
    assert kinds(h.on_record(1, "x")) == ["S1u", "F1", "L1/1:x", "D1:x"]


def test_aligned_with_zero_timeout_is_unaligned_from_the_first_barrier():
    h = handler("aligned_with_timeout", 2, alignment_timeout=0.0)
    assert kinds(h.on_barrier(0, b(1))) == ["S1u", "F1"]


def test_aligned_with_timeout_next_checkpoint_aligns_again():
    clock = ManualClock()
    h = handler("aligned_with_timeout", 2, clock, alignment_timeout=1.0)
    h.on_barrier(0, b(1))
    clock.advance(2.0)
    h.on_timer()
    h.on_barrier(1, b(1))
    h.on_barrier(0, b(2))
    assert h.aligning == 2 and h.blocked == {0}
    assert kinds(h.on_barrier(1, b(2))) == ["S2", "F2", "A2"]


# --- at-least-once (tracker) ------------------------------------------------------------------


def test_tracker_never_blocks_and_snapshots_when_all_barriers_counted():
    h = handler("at_least_once", 3)
    assert kinds(h.on_barrier(0, b(1))) == []
    assert kinds(h.on_record(0, "after")) == ["D0:after"]  # not blocked: may be counted twice later
    assert h.blocked == set()
    h.on_barrier(1, b(1))
    assert kinds(h.on_barrier(2, b(1))) == ["S1", "F1", "A1"]


def test_tracker_completion_drops_older_pending():
    h = handler("at_least_once", 2)
    h.on_barrier(0, b(1))
    h.on_barrier(0, b(2))
    h.on_barrier(1, b(2))  # channel 1 never delivered 1
    assert h.tracked == []
    assert kinds(h.on_barrier(0, b(3))) == []
    assert h.tracked == [3]


def test_tracker_ignores_barriers_of_finished_checkpoints():
    h = handler("at_least_once", 2)
    h.on_checkpoint_aborted(5)
    assert kinds(h.on_barrier(0, b(4))) == []
    assert kinds(h.on_barrier(0, b(5))) == []
    assert h.tracked == []
    h.on_barrier(0, b(6))
    assert kinds(h.on_barrier(1, b(6))) == ["S6", "F6", "A6"]


def test_tracker_end_of_channel_after_an_abort_does_not_revive_the_aborted_checkpoint():
    """An abort of a newer checkpoint, then an end of channel that completes an older one: the
    aborted checkpoint's late barrier is still a barrier of a finished checkpoint (ignored)."""
    h = handler("at_least_once", 2)
    h.on_barrier(0, b(1))
    h.on_checkpoint_aborted(2)
    assert kinds(h.on_end_of_channel(1)) == ["S1", "F1", "A1"]
    assert kinds(h.on_barrier(0, b(2))) == []  # checkpoint 2 was aborted: no snapshot, no ack
    assert h.tracked == []
    assert kinds(h.on_barrier(0, b(3))) == ["S3", "F3", "A3"]


def test_tracker_bounded_pending_forgets_the_oldest():
    h = handler("at_least_once", 2, max_tracked=2)
    for cid in (1, 2, 3):
        h.on_barrier(0, b(cid))
    assert h.tracked == [2, 3]
    assert kinds(h.on_barrier(1, b(1))) == []  # forgotten: cannot complete any more
    assert kinds(h.on_barrier(1, b(3))) == ["S3", "F3", "A3"]
    assert h.tracked == []


def test_tracker_end_of_channel_completes_pending():
    h = handler("at_least_once", 2)
    h.on_barrier(0, b(1))
    assert kinds(h.on_end_of_channel(1)) == ["S1", "F1", "A1"]


def test_effects_are_carried_out_with_a_flush_before_each_round_of_snapshots():
    """``carry_out``: each subtask's effects in order; before the snapshots of a round, one flush of
    everything delivered; a last flush at the end (what the keyed stage and a graph's gate share)."""
    from checkpoint_lib.core.barriers import Deliver, TakeSnapshot, carry_out
    from checkpoint_lib.core.types import Barrier

    done = []
    b = Barrier(1, 0.0)
    carry_out({0: [Deliver(0, "a"), TakeSnapshot(b), Deliver(0, "c")], 1: [Deliver(1, "b"), Deliver(1, "d")]},
              lambda r, e: done.append((r, e.record)), lambda: done.append("flush"),
              lambda r, e: done.append(("snapshot", r)))
    assert done == [(0, "a"), (1, "b"), (1, "d"), "flush", ("snapshot", 0), (0, "c"), "flush"]

"""Flink's AlternatingCheckpointsTest, on our aligned-with-timeout handler.

Three things of Flink's have no counterpart here, and most differences below come from them:

- announcements: Flink reads a barrier's announcement ahead of the records queued before it, so
  its timeout can start, and the barrier can overtake those records, before the barrier itself is
  read. Our handler sees a barrier when its channel delivers it: the timeout counts from the first
  barrier of a checkpoint that is processed, and records queued before a barrier are taken into
  the operator's state (not logged as channel state);
- per-barrier alignment: Flink's barrier says aligned, aligned with a timeout, or unaligned (an
  upstream that timed out sends unaligned barriers), and savepoints are always aligned. Ours is
  the receiving handler's mode and timeout, whatever the barrier's kind;
- local and remote channels, and active (timer) versus passive (next event) timeouts as separate
  paths: our handler checks the timeout on every event and on ``on_timer()``, whichever comes first.

Notation: flink_gate.py (``T`` fires the timer, ``t`` does not); a timeout of 0.1 s stands for
Flink's 100 ms.
"""

from __future__ import annotations

import pytest

from checkpoint_lib.core.types import Barrier
from flink_gate import Gate, violations


def timed(channels: int, script: str, timeout: float = 0.1) -> Gate:
    g = Gate(channels, "aligned_with_timeout", timeout=timeout)
    g.feed(script)
    return g


def test_channel_reset_on_new_barrier():
    """Flink: AlternatingCheckpointsTest.testChannelResetOnNewBarrier.

    A savepoint aligns on channel 0 (a record is held behind it) when checkpoint 2's barrier comes
    on channel 1: the savepoint is abandoned and the record comes out before 2's snapshot, so no
    record is lost between them; when 2 turns unaligned, channel 0's next record is 2's channel
    state.

    Differs: in Flink barrier 2 is unaligned from its upstream and channel 0's record is captured as
    channel state at once; ours turns unaligned on its own timeout and the record, taken before the
    snapshot, is in the operator's state instead (see the module docstring)."""
    g = timed(2, "s1@0 0 2@1", timeout=1.0)
    assert g.declined == [1] and g.delivered == [1] and g.h.blocked == {1}
    g.feed("T1.5 0 2@0")
    assert g.unaligned == g.acknowledged == [2] and g.cut(2) == [1]
    assert g.in_flight == {2: [4]} and violations(g) == []


def test_switch_to_unaligned_by_upstream():
    """Flink: AlternatingCheckpointsTest.testSwitchToUnalignedByUpstream.

    Flink: an unaligned barrier from upstream on one channel, while the other channel's aligned
    barrier is only announced, triggers the checkpoint at once, unaligned.

    Differs: our barriers carry no alignment: the receiver aligns until its own timeout, then goes
    unaligned (the nearest equivalent of the upstream's switch)."""
    g = timed(2, "1@1", timeout=10.0)
    assert g.triggered == []
    g.feed("T10")
    assert g.unaligned == [1] and g.h.logging_channel_state == {1: frozenset({0})}


def test_checkpoint_handling():
    """Flink: AlternatingCheckpointsTest.testCheckpointHandling.

    A checkpoint taken unaligned is triggered at the fast channel's barrier and completes at the
    slow one's.

    Differs: Flink's barrier is unaligned by its options; ours is by a timeout of 0 (unaligned
    from the first barrier)."""
    g = timed(2, "1@0", timeout=0.0)
    assert g.triggered == g.unaligned == [1] and g.acknowledged == []
    g.feed("1@1")
    assert g.triggered == g.acknowledged == [1] and g.h.blocked == set()


def test_savepoint_handling():
    """Flink: AlternatingCheckpointsTest.testSavepointHandling.

    A savepoint aligns: triggered only at the slow channel's barrier, and both channels are
    released after.

    Differs: Flink never times a savepoint out; our handler does not look at a barrier's kind, so
    with a timeout of 0 a savepoint is taken unaligned like a checkpoint (pinned below)."""
    g = timed(2, "s1@0", timeout=10.0)
    assert g.triggered == [] and g.h.blocked == {0}
    g.feed("s1@1")
    assert g.triggered == [1] and g.unaligned == [] and g.h.blocked == set()
    assert timed(2, "s1@0", timeout=0.0).unaligned == [1]


def test_alternation():
    """Flink: AlternatingCheckpointsTest.testAlternation.

    123 channels, 123 barriers alternating checkpoint and savepoint, each delivered on every
    channel: all 123 are triggered, in order, aligned."""
    script = " ".join(f"{'s' if cid % 2 else ''}{cid}@{k}" for cid in range(1, 124) for k in range(123))
    g = timed(123, script, timeout=10.0)
    assert g.triggered == g.acknowledged == list(range(1, 124)) and g.unaligned == []


def test_aligned_after_timed_out():
    """Flink: AlternatingCheckpointsTest.testAlignedAfterTimedOut.

    One channel: Flink starts checkpoint 1's timeout at its announcement, so when the barrier is
    read after the timeout 1 is taken unaligned, and 2, read at once, aligned.

    Differs: without announcements the wait before a barrier is read does not count, and one
    channel never waits: both are taken aligned, at their barrier."""
    g = timed(1, "t0.101 1@0 2@0")
    assert g.triggered == [1, 2] and g.unaligned == []


def test_aligned_never_timeoutable_checkpoint():
    """Flink: AlternatingCheckpointsTest.testAlignedNeverTimeoutableCheckpoint.

    A checkpoint that never times out waits for the second channel's barrier, whatever the other
    channel delivers meanwhile."""
    g = timed(2, "1@0 1 1 1", timeout=1e9)
    assert g.triggered == [] and g.delivered == [1, 2, 3]
    g.feed("1@1")
    assert g.triggered == [1] and g.unaligned == []


def test_timeout_alignment():
    """Flink: AlternatingCheckpointsTest.testTimeoutAlignment,
    AlternatingCheckpointsTest.testActiveTimeoutAlignmentOnAnnouncement.

    (The same scenario.) Channel 0 delivers two records and its barrier; the timer fires before
    channel 1's barrier: the checkpoint is taken unaligned and channel 1's record before its
    barrier is channel state.

    Differs: Flink's barrier overtakes channel 0's two queued records too (channel state); ours
    cannot overtake what its channel delivers first, so they are in the operator's state."""
    g = timed(2, "0 0 1@0", timeout=0.01)
    assert g.triggered == []
    g.feed("T0.02 1 1@1")
    assert g.unaligned == g.acknowledged == [1]
    assert g.cut(1) == [0, 1] and g.in_flight == {1: [4]} and violations(g) == []


def test_timeout_alignment_after_processing_barrier():
    """Flink: AlternatingCheckpointsTest.testTimeoutAlignmentAfterProcessingBarrier.

    The alignment's timeout counts from the first barrier processed (channel 2's), not from the
    later ones: the timer fires 11 ms after it, 6 ms after channel 0's barrier."""
    g = timed(3, "1@2 t0.005 0 0 1@0", timeout=0.01)
    assert g.triggered == []
    g.feed("T0.006 1 1@1")
    assert g.unaligned == g.acknowledged == [1]
    assert g.snapshot(1).alignment_s == pytest.approx(0.011)
    assert g.in_flight == {1: [6]} and violations(g) == []


def test_timeout_alignment_on_first_barrier():
    """Flink: AlternatingCheckpointsTest.testTimeoutAlignmentOnFirstBarrier.

    Flink: both barriers are announced, time passes, and the first barrier read finds the timeout
    past: unaligned.

    Differs: without announcements the time before the first barrier is processed does not count:
    the checkpoint aligns, and only time after that barrier (the passive check on the next event)
    turns it unaligned."""
    g = timed(2, "t0.4 1@0 1@1")
    assert g.triggered == [1] and g.unaligned == []
    g.feed("2@0 t0.4 2@1")
    assert g.unaligned == [2]


def test_timeout_alignment_before_first_barrier():
    """Flink: AlternatingCheckpointsTest.testTimeoutAlignmentBeforeFirstBarrier.

    Flink (local channels): a barrier created more than the timeout ago starts the checkpoint
    unaligned as soon as it is received.

    Differs: our timeout counts from the arrival of the checkpoint's first barrier, not from its
    creation (the barrier's timestamp): the old barrier starts an aligned wait."""
    g = timed(2, "t0.101")
    assert g.h.on_barrier(0, Barrier(1, timestamp=0.0)) == []
    assert g.h.aligning == 1
    assert g.h.on_timer() == []  # its timeout starts now, at the barrier's arrival


def test_timeout_alignment_when_local_barrier_first():
    """Flink: AlternatingCheckpointsTest.testTimeoutAlignmentWhenLocalBarrierFirst.

    Checkpoint 1 aligns at once; time passes; 2's first barrier starts its timeout (nothing
    happens), and its second barrier, later than the timeout, finds it past: 2 is unaligned."""
    g = timed(3, "1@0 1@1 1@2 t0.101 2@0")
    assert g.triggered == [1] and g.unaligned == []
    g.feed("t0.101 2@1")
    assert g.triggered == [1, 2] and g.unaligned == [2]
    assert g.h.logging_channel_state == {2: frozenset({2})}


def test_one_snapshot_when_passive_and_active_timeouts_both_fire():
    """Flink: AlternatingCheckpointsTest.testActiveTimeoutAfterLocalBarrierPassiveTimeout,
    AlternatingCheckpointsTest.testActiveTimeoutAfterAnnouncementPassiveTimeout.

    The next event notices the timeout first (passive), then the timer fires (active): one
    unaligned snapshot, and the record that event carried is channel state."""
    g = timed(2, "0 0 1@0 1 t0.011 1", timeout=0.01)
    assert g.unaligned == [1] and g.in_flight == {1: [5]}
    assert g.feed("T0") == []
    g.feed("1@1")
    assert g.triggered == g.acknowledged == [1] and violations(g) == []


def test_timeout_alignment_on_announcement_for_second_checkpoint():
    """Flink: AlternatingCheckpointsTest.testTimeoutAlignmentOnAnnouncementForSecondCheckpoint.

    After an aligned first checkpoint, the second one times out: each checkpoint has its own
    alignment clock."""
    g = timed(2, "1@0 1@1 0 2@0 t0.4 1 2@1")
    assert g.triggered == [1, 2] and g.unaligned == [2]
    assert g.in_flight == {2: [5]} and violations(g) == []


def test_passive_timeout_alignment_on_announcement():
    """Flink: AlternatingCheckpointsTest.testPassiveTimeoutAlignmentOnAnnouncement.

    No timer fires; the second barrier, later than the timeout, turns the checkpoint unaligned and
    completes it at once: one snapshot."""
    g = timed(2, "1@0 t0.4 1@1")
    assert g.triggered == g.unaligned == g.acknowledged == [1]


def test_active_timeout_alignment_on_first_barrier():
    """Flink: AlternatingCheckpointsTest.testActiveTimeoutAlignmentOnFirstBarrier.

    The timer turns the checkpoint unaligned with only its first barrier in."""
    g = timed(2, "1@0 T0.101")
    assert g.unaligned == [1] and g.acknowledged == []


def test_all_channels_unblocked_after_aligned_checkpoint_timeout():
    """Flink: AlternatingCheckpointsTest.testAllChannelsUnblockedAfteralignedCheckpointTimeout.

    After the timeout no channel is blocked, also once the late channel delivers its barrier."""
    g = timed(2, "1@0 T0.101")
    assert g.unaligned == [1] and g.h.blocked == set()
    g.feed("1@1")
    assert g.triggered == [1] and g.acknowledged == [1] and g.h.blocked == set()


def test_no_active_timeout_alignment_after_last_barrier():
    """Flink: AlternatingCheckpointsTest.testNoActiveTimeoutAlignmentAfterLastBarrier.

    A timer firing after the checkpoint aligned does nothing."""
    g = timed(2, "1@0 1@1 T0.101")
    assert g.triggered == [1] and g.unaligned == []


def test_no_active_timeout_alignment_after_abort():
    """Flink: AlternatingCheckpointsTest.testNoActiveTimeoutAlignmentAfterAbort.

    A timer firing after the checkpoint was aborted does nothing."""
    g = timed(2, "1@0 X1@0 X1@1 T0.101")
    assert g.triggered == [] and g.h.aligning is None


def test_no_active_timeout_alignment_after_close():
    """Flink: AlternatingCheckpointsTest.testNoActiveTimeoutAlignmentAfterClose.

    Flink: a timer firing after the gate was closed triggers nothing.

    Differs: a handler is never closed; the nearest is an alignment that ended because the inputs
    did (an ended channel counts as closed, so it completes aligned): the timer then does nothing."""
    g = timed(2, "1@0 E1 E0 T0.101")
    assert g.triggered == [1] and g.unaligned == [] and g.h.finished


def test_active_timeout_before_first_announcement_passive_timeout():
    """Flink: AlternatingCheckpointsTest.testActiveTimeoutBeforeFirstAnnouncementPassiveTimeout.

    Flink: the timeout passes before the first announcement is read; the timer then fires and the
    barriers overtake the records: unaligned.

    Differs: the time before the first barrier is processed does not count; the timer after it
    turns the checkpoint unaligned, and channel 1's record read after that is channel state."""
    g = timed(2, "0 t0.011 1@0", timeout=0.01)
    assert g.triggered == []
    g.feed("T0.011 1 1@1")
    assert g.unaligned == g.acknowledged == [1] and g.in_flight == {1: [4]}


def test_active_timeout_after_barrier_passive_timeout():
    """Flink: AlternatingCheckpointsTest.testActiveTimeoutAfterBarrierPassiveTimeout.

    Channel 0's barrier times out (time passes, then the timer fires); channel 1's record and
    barrier come later: one unaligned snapshot, the record is channel state."""
    g = timed(2, "0 0 1@0 t0.011 T0 1 1@1", timeout=0.01)
    assert g.triggered == g.unaligned == g.acknowledged == [1]
    assert g.in_flight == {1: [5]} and violations(g) == []


def test_timeout_alignment_on_unaligned_checkpoint():
    """Flink: AlternatingCheckpointsTest.testTimeoutAlignmentOnUnalignedCheckpoint.

    Flink: channel 0's barrier is aligned, channel 1's comes unaligned from an upstream that timed
    out, overtaking channel 1's two records, which become channel state.

    Differs: our barriers carry no alignment: the checkpoint keeps aligning on the third channel
    until the receiver's own timeout, and channel 1's records, read before its barrier, are in
    the operator's state."""
    g = timed(3, "1@0 1 1 1@1")
    assert g.triggered == [] and g.delivered == [1, 2]
    g.feed("T0.101")
    assert g.unaligned == [1] and g.h.logging_channel_state == {1: frozenset({2})}


def test_timeout_alignment_after_received_end_of_partition():
    """Flink: AlternatingCheckpointsTest.testTimeoutAlignmentAfterReceivedEndOfPartition.

    The timeout passes without a timer; the next event (a record on channel 1) turns the checkpoint
    unaligned; channels 1 and 2 then end, each after a record that is channel state."""
    g = timed(3, "1@0 t0.101 1 E1 2 E2")
    assert g.triggered == g.unaligned == g.acknowledged == [1]
    assert g.in_flight == {1: [2, 4]} and violations(g) == []


def test_start_new_checkpoint_via_announcement():
    """Flink: AlternatingCheckpointsTest.testStartNewCheckpointViaAnnouncement.

    Channel 0's barrier, channel 1's end, then channel 2's barrier: one aligned checkpoint, whose
    alignment runs from the first barrier."""
    g = timed(3, "1@0 E1 t1 1@2", timeout=10.0)
    assert g.triggered == [1] and g.unaligned == []
    assert g.snapshot(1).alignment_s == 1.0


def test_metrics_alternation():
    """Flink: AlternatingCheckpointsTest.testMetricsAlternation.

    An aligned checkpoint (6 ms), a savepoint (5 ms), then a checkpoint that times out and is taken
    unaligned at its last barrier (10 ms): each snapshot reports its alignment.

    Differs: Flink's third checkpoint is unaligned by its barrier and reports bytes and start delay;
    ours turns unaligned on its 8 ms timeout (noticed at the last barrier) and reports time only."""
    g = timed(2, "1@0 0 1 t0.006 1@1 0 s2@0 1 t0.005 s2@1 0 3@0 0 1 t0.01 3@1", timeout=0.008)
    assert g.triggered == g.acknowledged == [1, 2, 3] and g.unaligned == [3]
    alignments = [g.snapshot(c).alignment_s for c in (1, 2, 3)]
    assert alignments == pytest.approx([0.006, 0.005, 0.01])
    assert g.during_alignment(1) == [2] and violations(g) == []


def test_previous_handler_reset():
    """Flink: AlternatingCheckpointsTest.testPreviousHandlerReset.

    Savepoints and checkpoints alternate on alternating channels: each newer barrier abandons the
    previous alignment (declined, its channel released); the newest is pending, not complete.

    Differs: in Flink the checkpoints here are unaligned and block nothing, the savepoints block
    their channel; ours aligns both kinds until the timeout, so each blocks its channel."""
    g = Gate(2, "aligned_with_timeout", timeout=10.0)
    for cid, token in enumerate(["s1@0", "2@1", "s3@0", "4@1"], start=1):
        g.feed(token)
        assert g.h.aligning == cid and g.h.blocked == {(cid - 1) % 2}
    assert g.declined == [1, 2, 3] and g.acknowledged == []


def test_has_in_flight_data_before_process_barrier():
    """Flink: AlternatingCheckpointsTest.testHasInflightDataBeforeProcessBarrier.

    After the first of two barriers the checkpoint is not complete."""
    g = timed(2, "1@0")
    assert g.h.aligning == 1 and g.acknowledged == []


def test_out_of_order_barrier():
    """Flink: AlternatingCheckpointsTest.testOutOfOrderBarrier.

    A savepoint's barrier older than the checkpoint being aligned is ignored: the latest stays 10
    and its channel is not blocked."""
    g = timed(2, "10@0 s5@1")
    assert g.h.latest_started == 10 and g.h.aligning == 10 and g.h.blocked == {0}

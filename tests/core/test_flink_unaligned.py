"""Flink's UnalignedCheckpointsTest, on our unaligned handler.

Scripts are Flink's sequences in the notation of flink_gate.py; a record is its index in the whole
sequence (Flink's tests restart the count at each ``addSequence``; the comments give the offsets).
"""

from __future__ import annotations

import pytest

from flink_gate import Gate, violations


def unaligned(channels: int, script: str) -> Gate:
    g = Gate(channels, "unaligned")
    g.feed(script)
    return g


def test_multi_channel_with_barriers():
    """Flink: UnalignedCheckpointsTest.testMultiChannelWithBarriers.

    Nothing is ever blocked; each checkpoint snapshots at its first barrier and logs the records
    that arrive on the other channels before their barrier: one for 1, none for 2, 3 and 4, four
    for 5 (Flink's sequence5[4, 5, 6, 10]; sequence 5 starts at index 27)."""
    g = unaligned(3, "0 2 0 1@1 1@2 2 1 0 1@0")
    assert g.in_flight == {1: [7]}
    g.feed("0 0 1 1 2 2@0 2@1 2@2  2 2 3@2 2 2 3@0 3@1  4@1 4@2 4@0")
    g.feed("0 2 0 5@1 2 0 2 1 5@2 1 0 2 1 5@0  0 E0 E1 E2")
    assert g.delivered == g.records
    assert g.triggered == g.unaligned == g.acknowledged == [1, 2, 3, 4, 5]
    assert g.in_flight == {1: [7], 5: [31, 32, 33, 37]}
    assert violations(g) == []


def test_metrics():
    """Flink: UnalignedCheckpointsTest.testMetrics.

    Six records are processed between the first barrier and the last.

    Differs: Flink reports as alignment time the wait for the last barrier; our unaligned snapshot
    is taken at the first barrier and reports 0 s (the runtime times the channel state itself)."""
    g = unaligned(3, "0 1 2 1@1 0 1 2 1@0 0 1 2")
    g.clock.advance(0.01)
    g.feed("1@2 0 1 2 E0 E1 E2")
    assert g.snapshot(1).alignment_s == 0.0 and g.acknowledged == [1]
    assert g.during_alignment(1) == [4, 5, 6, 8, 9, 10]


def test_multi_channel_trailing_in_flight_data():
    """Flink: UnalignedCheckpointsTest.testMultiChannelTrailingInflightData,
    UnalignedCheckpointsTest.testEarlyCleanup.

    (The same sequence.) Channel 1 delivers barrier 2 and ends; channel 2 delivers it later;
    channel 0 never does and ends.

    Differs: Flink gives up checkpoint 2 at the first end of partition and logs nothing (its test
    says "TODO: treat EndOfPartitionEvent as a special CheckpointBarrier?"). We do just that: an
    ended channel counts as closed, so what channels 0 and 2 delivered before their barrier or end
    (13, 14, 18) is 2's channel state, and 2 completes at channel 0's end: a consistent cut."""
    g = unaligned(3, "0 1 2 1@1 1@2 1@0 2 1 0 2@1 1 1 E1 0 2 2@2 2 E2 0 E0")
    assert g.delivered == g.records
    assert g.triggered == g.acknowledged == [1, 2]
    assert g.in_flight == {2: [13, 14, 18]}
    assert violations(g) == []


def test_missing_cancellation_barriers():
    """Flink: UnalignedCheckpointsTest.testMissingCancellationBarriers.

    Checkpoint 1 starts on channel 0; 2 and 3 are aborted.

    Differs: Flink's cancellation marker of 2 on channel 0 aborts 1 too. Our aborts are not
    channel markers: they say nothing of 1, whose channel state completes when channel 1 ends
    (nothing was in flight), so 1 is acknowledged; 2 and 3 never start."""
    g = unaligned(2, "1@0 X2@0 X3@0 X3@1 0 E0 E1")
    assert g.triggered == g.acknowledged == [1] and g.in_flight == {}
    assert g.h.latest_started == 3


def test_start_alignment_with_closed_channels():
    """Flink: UnalignedCheckpointsTest.testStartAlignmentWithClosedChannels.

    Channels 2 and 1 end first; checkpoint 3 logs channel 0's record before its barrier (Flink's
    sequence2[4]: index 11); 5 on the last open channel completes at its only barrier."""
    g = unaligned(4, "E2 E1 0 0 3 2@3 2@0")
    assert g.triggered == [2] and g.in_flight == {}
    g.feed("3 0 3@3 3 0 3@0  4@0 4@3  0 0 3 E0")
    assert g.triggered == [2, 3, 4] and g.in_flight == {3: [11]}
    g.feed("3 5@3 3 E3")
    assert g.triggered == g.acknowledged == [2, 3, 4, 5]
    assert violations(g) == []


def test_end_of_stream_while_checkpoint():
    """Flink: UnalignedCheckpointsTest.testEndOfStreamWhileCheckpoint.

    Checkpoint 2 starts on channel 2; channel 1 never delivers its barrier and ends: its record
    before the end (Flink's sequence2[7]: index 10) is 2's channel state."""
    g = unaligned(3, "1@0 1@1 1@2  0 0 2 2@2 2@0 0 2 1 E2 E1 0 E0")
    assert g.triggered == g.acknowledged == [1, 2]
    assert g.in_flight == {2: [10]} and violations(g) == []


def test_notify_abort_checkpoint_before_cancelling_async_checkpoint():
    """Flink: UnalignedCheckpointsTest.testNotifyAbortCheckpointBeforeCanellingAsyncCheckpoint.

    Checkpoint 1 is aborted while its channel state is still open: the handler stops logging at
    once and never completes or acknowledges it, also when the channels end."""
    g = unaligned(2, "1@0 X1@1")
    assert g.triggered == [1] and g.h.logging_channel_state == {}
    assert [type(e).__name__ for e in g.feed("1 E0 E1")] == ["Deliver"]  # not logged either
    assert g.acknowledged == [] and g.in_flight == {}


def test_multi_channel_abort_checkpoint():
    """Flink: UnalignedCheckpointsTest.testMultiChannelAbortCheckpoint.

    1, 3 and 5 complete with nothing in flight; 2 is aborted after its snapshot (its channel state
    is dropped); 4 and 6 are aborted before their first barrier and never start."""
    g = unaligned(3, "0 2 0 1@1 1@2 2 1 1@0 0 2  2@0 2@2 0 2 X2@1  2 1 3@1 3@2 3@0")
    assert g.triggered == [1, 2, 3]
    g.feed("0 1 X4@1 4@2 0 4@0")
    assert g.triggered == [1, 2, 3] and g.h.latest_started == 4
    g.feed("0 1 2 5@2 5@1 5@0 0 1  X6@1 X6@2 6@0 0 E0 E1 E2")
    assert g.triggered == [1, 2, 3, 5] and g.acknowledged == [1, 3, 5]
    assert g.in_flight == {} and g.delivered == g.records


@pytest.mark.parametrize("cancelled", [1, 2])
def test_process_cancellation_barrier_after_process_barrier(cancelled):
    """Flink: UnalignedCheckpointsTest.testProcessCancellationBarrierAfterProcessBarrier.

    Checkpoint 1 is pending after its first barrier; an abort of 1 (or of 2) moves the latest
    checkpoint there, and a further abort moves it on.

    Differs: in Flink a cancellation of 2 also ends the pending 1. Our abort of 2 is the
    coordinator's and says nothing of 1, whose channel state stays open."""
    g = unaligned(2, "1@0")
    assert g.h.logging_channel_state == {1: frozenset({1})}
    g.feed(f"X{cancelled}")
    assert g.h.latest_started == cancelled
    assert g.h.logging_channel_state == ({} if cancelled == 1 else {1: frozenset({1})})
    g.feed(f"X{cancelled + 1}")
    assert g.h.latest_started == cancelled + 1 and g.triggered == [1]


def test_process_cancellation_barrier_before_process_and_receive_barrier():
    """Flink: UnalignedCheckpointsTest.testProcessCancellationBarrierBeforeProcessAndReceiveBarrier.

    An abort that arrives before the checkpoint's first barrier: the barrier starts nothing."""
    g = unaligned(1, "X1 1@0")
    assert g.triggered == [] and g.h.latest_started == 1


def test_end_of_stream_with_pending_checkpoint():
    """Flink: UnalignedCheckpointsTest.testEndOfStreamWithPendingCheckpoint.

    Checkpoint 1 is pending on one of two channels when the other ends.

    Differs: Flink aborts the pending checkpoint at the end of partition; ours completes it (an
    ended channel counts as closed: its channel state is complete)."""
    g = unaligned(2, "1@0")
    assert g.h.logging_channel_state == {1: frozenset({1})}
    g.feed("E1")
    assert g.acknowledged == [1] and g.h.ended == {1} and g.h.logging_channel_state == {}

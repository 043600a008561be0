"""Flink's CheckpointBarrierTrackerTest, on our at-least-once handler (the tracker).

The tracker never blocks, so in every scenario each record comes out at once, in arrival order;
the tests check which checkpoints it snapshots. Notation: flink_gate.py.
"""

from __future__ import annotations

from flink_gate import Gate, violations


def tracker(channels: int, script: str) -> Gate:
    g = Gate(channels, "at_least_once")
    g.feed(script)
    assert g.delivered == g.records and g.h.blocked == set()
    return g


def test_single_channel_with_skipped_barriers():
    """Flink: CheckpointBarrierTrackerTest.testSingleChannelWithSkippedBarriers.

    Barrier ids with gaps: each barrier of the one channel is a checkpoint."""
    g = tracker(1, "0 1@0 0 0 3@0 0 4@0 6@0 0 7@0 0 10@0 0")
    assert g.triggered == g.acknowledged == [1, 3, 4, 6, 7, 10]


def test_multi_channel_with_barriers():
    """Flink: CheckpointBarrierTrackerTest.testMultiChannelWithBarriers.

    Four checkpoints, each snapshotted when its last channel's barrier is counted."""
    g = tracker(3, "0 2 0 1@1 1@2 2 1 1@0 0 0 1 1 2 2@0 2@1 2@2 2 2 3@2 2 2 3@0 3@1 4@1 4@2 4@0 0")
    assert g.triggered == [1, 2, 3, 4]
    assert g.cut(1) == [0, 1, 2, 5, 6]  # records after a channel's barrier are in: at least once


def test_multi_channel_skipping_checkpoints():
    """Flink: CheckpointBarrierTrackerTest.testMultiChannelSkippingCheckpoints.

    Checkpoint 3 has a barrier on one channel only; 4 completes and drops it."""
    g = tracker(3, "0 2 0 1@1 1@2 2 1 1@0 0 0 1 1 2 2@0 2@1 2@2 2 2 3@2 2 2 4@0 0 1 2 4@1 1 4@2 0")
    assert g.triggered == [1, 2, 4] and g.h.tracked == []


def test_complete_checkpoints_on_late_barriers():
    """Flink: CheckpointBarrierTrackerTest.testCompleteCheckpointsOnLateBarriers.

    A barrier of a later checkpoint does not discard a pending one: 3 completes after barriers of
    4 came, 7 after those of 8 and 9, and so on; only 6, never complete, is dropped by 7."""
    g = tracker(
        3,
        "1 1 0 2 2@1 2@0 2@2  1 0 3@1 3@2  1 0 4@2 4@1 1 2  3@0  0 4@0  1 2 5@1 0 5@0 1 5@2  "
        "1 6@1 0 6@0  1 7@1 0 7@2 2 8@2 0 8@1 1 9@1  7@0 0 9@2 2 10@2  8@0 1 2 9@0  1 0 2  10@0 10@1",
    )
    assert g.triggered == [2, 3, 4, 5, 7, 8, 9, 10] and g.h.tracked == []


def test_multi_channel_abort_checkpoint():
    """Flink: CheckpointBarrierTrackerTest.testMultiChannelAbortCheckpoint.

    1, 3 and 5 complete; 2, 4 and 6 are aborted (2 after two of its barriers, 4 and 6 before
    their first), and their remaining barriers are ignored.

    Differs: the coordinator's aborts are not channel markers; the handler emits nothing for them
    (Flink tells the task of each)."""
    g = tracker(
        3,
        "0 2 0 1@1 1@2 2 1 1@0  0 2 2@0 2@2 0 2 X2@1  2 1 3@1 3@2 3@0  0 1 X4@1 4@2 0 4@0  "
        "0 1 2 5@2 5@1 5@0  0 1 X6@1 X6@2 6@0 0",
    )
    assert g.triggered == [1, 3, 5] and g.declined == [] and g.h.tracked == []


def test_interleaved_cancellation_barriers():
    """Flink: CheckpointBarrierTrackerTest.testInterleavedCancellationBarriers.

    Aborts of 1 and 2, each repeated (Flink: a marker per channel), after one barrier of 1:
    nothing is snapshotted, nothing stays tracked, and repeating an abort changes nothing.

    Differs: Flink checks the task is told of each abort once; our handler is told by the
    coordinator and tells nobody, so there is nothing to count but its state."""
    g = tracker(3, "1@0 X2@0 X1@1")
    assert g.h.tracked == [] and g.h.latest_started == 2
    assert [type(e).__name__ for e in g.feed("X2@1 X1@2 X2@2 0")] == ["Deliver"]
    assert g.triggered == [] and g.h.tracked == [] and g.h.latest_started == 2


def test_trigger_checkpoints_with_end_of_partition():
    """Flink: CheckpointBarrierTrackerTest.testTriggerCheckpointsWithEndOfPartition.

    When channel 2 ends, 2 and 4 are both complete: only the newest (4) is snapshotted and 1, 2, 3
    are dropped; 5 stays pending, two channels open."""
    g = tracker(3, "1@0 2@0 2@1 3@0 4@0 4@1 5@1 E2")
    assert g.triggered == [4] and g.declined == []
    assert g.h.tracked == [5] and g.h.num_channels - len(g.h.ended) == 2


def test_no_fast_path_with_channel_finished_during_checkpoints():
    """Flink: CheckpointBarrierTrackerTest.testNoFastPathWithChannelFinishedDuringCheckpoints.

    A channel delivers barrier 1 and then ends; the other channel's barrier completes 1 once, and
    nothing stays pending."""
    g = tracker(2, "1@0 E0 1@1")
    assert g.triggered == [1] and g.h.tracked == []


def test_complete_and_remove_aborted_checkpoint_with_end_of_partition():
    """Flink: CheckpointBarrierTrackerTest.testCompleteAndRemoveAbortedCheckpointWithEndOfPartition.

    4 is aborted before its barrier comes; 5 stays pending when channel 2 ends (channel 0 owes it).

    Differs: the abort is the coordinator's; nothing is emitted for it (Flink tells the task)."""
    g = tracker(3, "X4@0 4@1 5@1 E2")
    assert g.triggered == [] and g.h.tracked == [5]
    assert g.h.num_channels - len(g.h.ended) == 2


def test_abort_checkpoints_after_end_of_partition_received():
    """Flink: CheckpointBarrierTrackerTest.testAbortCheckpointsAfterEndOfPartitionReceived.

    After channel 2 ends, channel 0 delivers barriers 5 and 6; 6 is aborted, then channel 1 ends.

    Differs: Flink's cancellation marker of 6 on channel 1 also aborts the older pending 5 (a
    marker means the channel will carry no older barrier). Our abort of 6 is the coordinator's and
    says nothing of 5, so channel 1's end completes 5: a snapshot at least once is harmless here.
    6 and the later-aborted 7 are never snapshotted."""
    g = tracker(3, "E2 5@0 6@0 X6@1 E1 X7@0")
    assert g.triggered == [5] and g.h.tracked == [] and g.h.latest_started == 7
    assert violations(g) == []


def test_no_fast_path_with_channel_finished_during_checkpoints_cancel():
    """Flink: CheckpointBarrierTrackerTest.testNoFastPathWithChannelFinishedDuringCheckpointsCancel.

    Barrier 1 on a channel that then ends, then 1 is aborted: nothing stays pending."""
    g = tracker(2, "1@0 E0 X1@1")
    assert g.triggered == [] and g.h.tracked == [] and g.h.latest_started == 1


def test_two_last_barriers_one_by_one():
    """Flink: CheckpointBarrierTrackerTest.testTwoLastBarriersOneByOne.

    Barriers of 1 and 2 on channel 1, then 1 and 2 on channel 0, a second apart: both complete, in
    order.

    Differs: Flink measures 2's alignment (2 s, from its first barrier); the tracker reports none."""
    g = tracker(2, "1@1 t1 2@1 t1 1@0 t1 2@0")
    assert g.triggered == [1, 2]
    assert [g.snapshot(c).alignment_s for c in (1, 2)] == [0.0, 0.0]

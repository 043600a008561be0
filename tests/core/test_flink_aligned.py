"""Flink's AlignedCheckpointsTest and the older BarrierBufferTest, on our aligned handler.

Scripts are Flink's sequences in the notation of flink_gate.py; a record is its index in the
sequence, so ``delivered`` lists Flink's ``check(sequence[i])`` calls in order (events left out).
"""

from __future__ import annotations

import pytest

from flink_gate import Gate, violations


def aligned(channels: int, script: str) -> Gate:
    g = Gate(channels, "aligned")
    g.feed(script)
    return g


def test_multi_channel_with_barriers():
    """Flink: AlignedCheckpointsTest.testMultiChannelWithBarriers.

    Four checkpoints on three channels: with data from several channels, barriers together, data
    from one channel only, and empty; channels are unblocked after each."""
    g = Gate(3, "aligned")
    g.feed("0 2 0 1@1 1@2 0")
    assert g.h.blocked == {1, 2} and g.triggered == []
    g.feed("1@0")
    assert g.triggered == [1] and g.h.blocked == set() and g.cut(1) == [0, 1, 2, 5]
    g.feed("0 0 1 1 2 2@0 2@1 2@2 2 2 3@2 0 0 3@0 3@1 4@1 4@2 4@0 0 E0 E1 E2")
    assert g.triggered == [1, 2, 3, 4] and g.h.blocked == set()
    assert g.delivered == [0, 1, 2, 5, 7, 8, 9, 10, 11, 15, 16, 18, 19, 25]
    assert violations(g) == []


def test_multi_channel_with_blocked_data():
    """Flink: BarrierBufferTest.testMultiChannelWithBarriers.

    The older sequence: records behind a channel's barrier are held and come out, in arrival order,
    right after the snapshot (checkpoint 5 with blocked data in mixed order)."""
    g = aligned(
        3,
        "0 2 0 1@1 1@2 2 1 0 1@0 0 0 1 1 2 2@0 2@1 2@2 2 2 3@2 2 2 3@0 3@1 4@1 4@2 4@0 "
        "0 2 0 5@1 2 0 2 1 5@2 1 0 2 1 5@0 0 E0 E1 E2",
    )
    assert g.delivered == [0, 1, 2, 7, 5, 6, 9, 10, 11, 12, 13, 17, 18, 20, 21,
                           27, 28, 29, 31, 32, 33, 37, 34, 36, 38, 39, 41]
    assert g.triggered == [1, 2, 3, 4, 5] and g.cut(5)[-4:] == [31, 32, 33, 37]
    assert violations(g) == []


def test_multi_channel_jumping_over_checkpoint():
    """Flink: AlignedCheckpointsTest.testMultiChannelJumpingOverCheckpoint.

    Barrier 3 on a channel not blocked abandons 2, barrier 4 then abandons 3 (both declined).

    Differs: Flink aborts 4 when channel 0 ends during its alignment; in our model an ended channel
    counts as closed (BRIEF.md), so 4 completes when channel 2 ends too. Every record still comes
    out in the same order."""
    g = Gate(3, "aligned")
    g.feed("0 2 0 1@1 1@2 0 1@0 1 0 2@1 2 2@0 2")
    assert g.h.latest_started == 2 and g.h.blocked == {0, 1}
    g.feed("3@2")
    assert g.h.latest_started == 3 and g.h.blocked == {2}
    g.feed("1 0 3@0")
    assert g.h.blocked == {0, 2}
    g.feed("4@1")
    assert g.h.latest_started == 4 and g.h.blocked == {1}
    g.feed("2 0 E0 2 E2 1 E1")
    assert g.declined == [2, 3] and g.triggered == [1, 4]
    assert g.delivered == [0, 1, 2, 5, 7, 8, 10, 12, 14, 15, 18, 19, 21, 23]
    assert violations(g) == []


def test_multi_channel_jumping_over_checkpoint_with_queued_barriers():
    """Flink: BarrierBufferTest.testMultiChannelJumpingOverCheckpoint.

    The older sequence: barriers of 3 wait behind blocked channels; barrier 4 on the open channel
    abandons 2, the released barriers of 3 start 3, which 4 abandons at once; the records of 2's
    alignment come out in arrival order.

    Differs: Flink aborts 4 at channel 1's end and releases its held records there; in our model
    the ended channel counts as closed, 4 completes at the last end, and the held records of
    channel 2 (24, 27) come out after it."""
    g = aligned(
        3,
        "0 2 0 1@1 1@2 2 1 0 1@0 1 0 2@1 1 2 2@0 2 0 3@1 1 2 3@0 2 0 4@2 2 1 E1 2 E2 0 E0",
    )
    assert g.delivered[:16] == [0, 1, 2, 7, 5, 6, 9, 10, 13, 15, 19, 21, 12, 16, 18, 22]
    assert g.delivered[16:] == [25, 29, 24, 27]
    assert g.declined == [2, 3] and g.triggered == [1, 4]
    assert violations(g) == []


def test_missing_cancellation_barriers():
    """Flink: AlignedCheckpointsTest.testMissingCancellationBarriers.

    Flink: barrier 1 on channel 0, then cancellation markers of 3 (channel 1), 2 and 3 (channel 0)
    unblock everything.

    Differs: our aborts are not channel markers. The aborts of 2 and 3 say nothing about channel 1,
    which may still deliver barrier 1, so 1 keeps aligning and channel 0's record is held. When
    channel 1 then delivers barrier 2 (its sender skipped 1, and 2 is aborted), the alignment of 1
    is abandoned and the record released: the nearest equivalent of Flink's unblocking."""
    g = aligned(2, "1@0 X3@1 X2@0 X3@0 0")
    assert g.h.aligning == 1 and g.h.blocked == {0} and g.h.held_records == [4]
    g.feed("2@1")
    assert g.declined == [1] and g.delivered == [4]
    assert g.h.blocked == set() and g.h.aligning is None and g.triggered == []


@pytest.mark.parametrize(
    "script,delivered,triggered",
    [
        ("E2 E1 0 0 3 2@3 2@0 3@0 3@3 0 0 3 E0 3 4@3 3 E3", [2, 3, 4, 9, 10, 11, 13, 15], [2, 3, 4]),
        ("E2 E1 0 0 3 2@3 2@0 3 0 3@3 3 0 3@0 4@0 4@3 0 0 3 E0 3 5@3 3 E3",
         [2, 3, 4, 7, 8, 11, 10, 15, 16, 17, 19, 21], [2, 3, 4, 5]),
    ],
    ids=["AlignedCheckpointsTest", "BarrierBufferTest"],
)
def test_start_alignment_with_closed_channels(script, delivered, triggered):
    """Flink: AlignedCheckpointsTest.testStartAlignmentWithClosedChannels,
    BarrierBufferTest.testStartAlignmentWithClosedChannels.

    Two of four channels end first; checkpoints then align on the open ones only, and the last
    on channel 3 alone (it snapshots at its first barrier)."""
    g = aligned(4, script)
    assert g.delivered == delivered and g.triggered == triggered
    assert g.h.blocked == set() and g.h.held == 0 and g.h.finished
    assert violations(g) == []


def test_end_of_stream_while_checkpoint():
    """Flink: AlignedCheckpointsTest.testEndOfStreamWhileCheckpoint.

    Checkpoint 2 has barriers from channels 2 and 0 when channel 1 ends; nothing stays blocked.

    Differs: Flink says 2 "will not be completed"; in our model the end of channel 1 counts as
    its barrier (BRIEF.md: received + closed = all), so 2 completes there, a consistent cut."""
    g = aligned(3, "1@0 1@1 1@2 0 0 2 2@2 2@0 1 E1")
    assert g.triggered == [1, 2] and g.h.blocked == set()
    g.feed("E2 0 E0")
    assert g.delivered == [3, 4, 5, 8, 11] and violations(g) == []


def test_end_of_stream_while_checkpoint_with_blocked_data():
    """Flink: BarrierBufferTest.testEndOfStreamWhileCheckpoint.

    The older sequence: records and an end behind the barriers of 2 are held until channel 1
    ends, then come out in arrival order.

    Differs: Flink aborts 2 at that end; ours completes it (an ended channel counts as closed)."""
    g = aligned(3, "1@0 1@1 1@2 0 0 2 2@2 2@0 0 2 1 E2 E1 0 E0")
    assert g.delivered == [3, 4, 5, 10, 8, 9, 13]
    assert g.triggered == [1, 2] and g.cut(2) == [3, 4, 5, 10]
    assert violations(g) == []


@pytest.mark.parametrize(
    "script,delivered",
    [
        ("0 2 0 1@1 1@2 0 1@0 0 2 2@0 2@2 1 X2@1 2 1 3@1 3@2 3@0 0 1 X4@1 4@2 2 4@0 "
         "0 1 2 5@2 5@1 5@0 0 1 X6@1 X6@2 6@0 0",
         [0, 1, 2, 5, 7, 8, 11, 13, 14, 18, 19, 22, 24, 25, 26, 30, 31, 35]),
        ("0 2 0 1@1 1@2 2 1 1@0 0 2 2@0 2@2 0 2 X2@1 2 1 3@1 3@2 3@0 0 1 X4@1 4@2 0 4@0 "
         "0 1 2 5@2 5@1 5@0 0 1 X6@1 X6@2 6@0 0",
         [0, 1, 2, 5, 6, 8, 9, 12, 13, 15, 16, 20, 21, 24, 26, 27, 28, 32, 33, 37]),
    ],
    ids=["AlignedCheckpointsTest", "BarrierBufferTest"],
)
def test_multi_channel_abort_checkpoint(script, delivered):
    """Flink: AlignedCheckpointsTest.testMultiChannelAbortCheckpoint,
    BarrierBufferTest.testMultiChannelAbortCheckpoint.

    1, 3 and 5 complete; 2 is aborted during its alignment (the held records come out at once);
    4 and 6 are aborted before or while their barriers arrive, which are then ignored: nothing is
    blocked for them.

    Differs: the aborts come from the coordinator, not as markers, so the handler emits nothing
    for them (Flink tells the task of each)."""
    g = aligned(3, script)
    assert g.delivered == delivered
    assert g.triggered == [1, 3, 5] and g.declined == []
    assert g.h.blocked == set() and g.h.held == 0
    assert violations(g) == []


def test_abort_on_canceled_barriers():
    """Flink: AlignedCheckpointsTest.testAbortOnCanceledBarriers.

    1 is aborted while aligning; 2 starts on channel 1; 1's late barrier on channel 2 is ignored
    and does not unblock channel 1; 2 completes."""
    g = aligned(3, "1 1@1 2 0 X1@0 1")
    assert g.h.blocked == set() and g.h.aligning is None
    g.feed("2@1 2 0 1@2")
    assert g.h.blocked == {1} and g.h.aligning == 2
    g.feed("0 2 2@0 2@2 0 1 2")
    assert g.triggered == [2] and g.h.blocked == set()
    assert g.delivered == [0, 2, 3, 5, 7, 8, 10, 11, 14, 15, 16]


def test_abort_while_having_queued_barriers():
    """Flink: BarrierBufferTest.testAbortWhileHavingQueuedBarriers.

    Barrier 2 waits behind channel 1's barrier 1 when 1 is aborted: the held events come out, 2
    starts aligning on channel 1 and completes later with its own held records."""
    g = aligned(3, "1 1@1 2 0 1 2@1 2 1 X1@0 2 1 0 1@2 0 1 2 2@0 2@2 0 1 2")
    assert g.delivered == [0, 2, 3, 6, 4, 9, 11, 13, 15, 7, 10, 14, 18, 19, 20]
    assert g.triggered == [2] and g.declined == []


def test_abort_via_queued_barriers():
    """Flink: BarrierBufferTest.testAbortViaQueuedBarriers.

    Checkpoint 2 is aborted while 1 aligns; 2's barriers then change nothing.

    Differs: Flink's cancellation marker of 2 waits behind blocked channel 2 and is read after 1
    completes; ours reaches the handler at once (an abort is not a channel marker). The outcome is
    Flink's: 1 completes, 2 never starts, the records come out in the same order."""
    g = aligned(3, "1 1@1 1@2 2 0 1 X2@2 2@1 0 1 2 1@0 2 1 0 2@0 0 1 2")
    assert g.delivered == [0, 4, 8, 3, 5, 9, 10, 12, 13, 14, 16, 17, 18]
    assert g.triggered == [1] and g.h.aligning is None and g.h.blocked == set()


@pytest.mark.parametrize(
    "script,delivered",
    [
        ("2 3@1 3@0 2 5@2 1 0 X3@0 0 1 5@0 5@1 0 1 2", [0, 3, 5, 6, 8, 9, 12, 13, 14]),
        ("2 3@1 3@0 0 1 2 5@2 2 1 0 X3@2 2 0 1 5@0 5@1 0 1 2",
         [0, 5, 3, 4, 8, 9, 12, 13, 7, 11, 16, 17, 18]),
    ],
    ids=["AlignedCheckpointsTest", "BarrierBufferTest"],
)
def test_ignore_cancel_barrier_if_checkpoint_subsumed(script, delivered):
    """Flink: AlignedCheckpointsTest.testIgnoreCancelBarrierIfCheckpointSubsumed,
    BarrierBufferTest.testIgnoreCancelBarrierIfCheckpointSubsumed.

    Barrier 5 abandons 3 (declined once, as subsumed); the later abort of 3 does nothing."""
    g = aligned(3, script)
    assert g.delivered == delivered
    assert g.declined == [3] and g.triggered == [5]


def test_trigger_checkpoints_with_end_of_partition():
    """Flink: AlignedCheckpointsTest.testTriggerCheckpointsWithEndOfPartition.

    Two barriers and the third channel's end complete checkpoint 1."""
    g = aligned(3, "1@0 1@1 E2")
    assert g.triggered == [1] and g.declined == [] and g.h.aligning is None


def test_multi_channel_trailing_blocked_data():
    """Flink: BarrierBufferTest.testMultiChannelTrailingBlockedData, BarrierBufferTest.testEarlyCleanup.

    (The same sequence.) Channels 1 and 2 deliver barrier 2 and then records and their end, all
    held; when channel 0 ends, 2 completes and the held records come out.

    Differs: Flink only checks the order and drains the rest; ours snapshots 2 at channel 0's end
    (an ended channel counts as closed)."""
    g = aligned(3, "0 1 2 1@1 1@2 1@0 2 1 0 2@1 1 1 E1 0 2 2@2 2 E2 0 E0")
    assert g.delivered == [0, 1, 2, 6, 7, 8, 13, 14, 18, 10, 11, 16]
    assert g.triggered == [1, 2] and g.h.finished and g.h.held == 0
    assert violations(g) == []


def test_multi_channel_with_queued_future_barriers():
    """Flink: BarrierBufferTest.testMultiChannelWithQueuedFutureBarriers.

    Barriers of 3, 4, 5 and 6 queue behind the alignments of 2, 3 and 4; each completes in turn and
    releases exactly the records that arrived behind its barriers.

    Differs: Flink aborts 5 when channel 2 ends and releases its held record (37) there; ours
    completes 5 at channel 0's end (ended channels count as closed), then 6, whose only open
    channel had delivered its barrier; 37 comes out after 47 instead of before."""
    g = aligned(
        3,
        "0 2 0 1@1 1@2 2 1 0 1@0 1 0 2@1 1 2 2@0 3@0 0 3@1 0 1 2 4@1 1 2 2@2 2 1 2 0 4@0 2 1 2 0 "
        "5@1 3@2 2 1 2 0 6@1 4@2 2 1 E1 2 E2 0 E0",
    )
    assert g.delivered[:28] == [0, 1, 2, 7, 5, 6, 9, 10, 13, 20, 23, 12, 25, 27, 30, 32,
                                16, 18, 19, 28, 36, 38, 22, 26, 31, 33, 39, 42]
    assert g.delivered[28:] == [45, 47, 37, 43]
    assert g.triggered == [1, 2, 3, 4, 5, 6] and g.declined == []
    assert violations(g) == []


def test_multi_channel_skipping_checkpoints():
    """Flink: BarrierBufferTest.testMultiChannelSkippingCheckpoints.

    Barrier 3 on a channel not blocked abandons 2 (declined) and releases its held records.

    Differs: Flink aborts 3 when channel 1 ends; ours completes it at channel 0's end (ended
    channels count as closed), so the record held behind barrier 3 (18) comes out after 23."""
    g = aligned(3, "0 2 0 1@1 1@2 2 1 0 1@0 1 0 2@1 1 2 2@0 2 0 3@2 2 1 E1 2 E2 0 E0")
    assert g.delivered == [0, 1, 2, 7, 5, 6, 9, 10, 13, 15, 12, 16, 19, 23, 18, 21]
    assert g.declined == [2] and g.triggered == [1, 3]
    assert violations(g) == []


def test_multi_channel_skipping_checkpoints_via_blocked_inputs():
    """Flink: BarrierBufferTest.testMultiChannelSkippingCheckpointsViaBlockedInputs.

    Barriers of 3 and 4 wait behind the alignment of 2. Once 2 completes, the released barrier 3
    starts 3 and the released barrier 4 abandons it; 3's late barrier on channel 2 is ignored and 4
    completes with the records held behind its barriers."""
    g = aligned(
        3,
        "0 2 0 1@1 1@2 2 1 0 1@0 1 0 2@1 1 2 2@0 1 0 3@0 0 4@1 1 0 2 2@2 0 3@2 2 4@0 0 1 2 4@2 "
        "1 E1 2 E2 0 E0",
    )
    assert g.delivered == [0, 1, 2, 7, 5, 6, 9, 10, 13, 22, 12, 15, 16, 18, 21, 24, 26, 30,
                           20, 28, 29, 32, 34, 36]
    assert g.triggered == [1, 2, 4] and g.declined == [3]
    assert violations(g) == []

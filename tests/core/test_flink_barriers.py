"""Flink's barrier-handling tests ported onto our handlers: the inventory, and the scenarios Flink
runs against several handlers (one test each, over our matching modes).

Every test of tests/core/test_flink_*.py starts its docstring with ``Flink: Class.method, ...``,
the Flink tests it ports; a paragraph ``Differs:`` says where our model deliberately gives another
outcome and why (the nearest equivalent is what the test checks). ``FLINK_TESTS`` lists every
method of the Flink classes ported, and ``test_every_flink_method_is_ported`` keeps the two in step:
no method is dropped silently. Sources: apache/flink, flink-streaming-java/src/test/java/org/apache/
flink/streaming/runtime/io/checkpointing/ (``BarrierBufferTest`` is the older
``runtime/io/BarrierBufferTestBase``, which ``BarrierBufferTest`` ran).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from flink_gate import ALL_MODES, Gate, violations

FLINK_TESTS: dict[str, tuple[str, ...]] = {
    "AlignedCheckpointsTest": (
        "testSingleChannelNoBarriers", "testMultiChannelNoBarriers", "testSingleChannelWithBarriers",
        "testMultiChannelWithBarriers", "testMultiChannelJumpingOverCheckpoint", "testMetrics",
        "testMissingCancellationBarriers", "testStartAlignmentWithClosedChannels",
        "testEndOfStreamWhileCheckpoint", "testSingleChannelAbortCheckpoint",
        "testMultiChannelAbortCheckpoint", "testAbortOnCanceledBarriers",
        "testIgnoreCancelBarrierIfCheckpointSubsumed", "testTriggerCheckpointsWithEndOfPartition",
        "testDeduplicateChannelsWithBothBarrierAndEndOfPartition",
        "testTriggerCheckpointsAfterReceivedEndOfPartition",
    ),
    "BarrierBufferTest": (
        "testSingleChannelNoBarriers", "testMultiChannelNoBarriers", "testSingleChannelWithBarriers",
        "testMultiChannelWithBarriers", "testMultiChannelTrailingBlockedData",
        "testMultiChannelWithQueuedFutureBarriers", "testMultiChannelSkippingCheckpoints",
        "testMultiChannelJumpingOverCheckpoint", "testMultiChannelSkippingCheckpointsViaBlockedInputs",
        "testEarlyCleanup", "testStartAlignmentWithClosedChannels", "testEndOfStreamWhileCheckpoint",
        "testSingleChannelAbortCheckpoint", "testMultiChannelAbortCheckpoint",
        "testAbortViaQueuedBarriers", "testAbortWhileHavingQueuedBarriers",
        "testIgnoreCancelBarrierIfCheckpointSubsumed",
    ),
    "UnalignedCheckpointsTest": (
        "testSingleChannelNoBarriers", "testMultiChannelNoBarriers", "testSingleChannelWithBarriers",
        "testMultiChannelWithBarriers", "testMetrics", "testMultiChannelTrailingInflightData",
        "testMissingCancellationBarriers", "testEarlyCleanup", "testStartAlignmentWithClosedChannels",
        "testEndOfStreamWhileCheckpoint", "testNotifyAbortCheckpointBeforeCanellingAsyncCheckpoint",
        "testSingleChannelAbortCheckpoint", "testMultiChannelAbortCheckpoint",
        "testProcessCancellationBarrierAfterProcessBarrier",
        "testProcessCancellationBarrierBeforeProcessAndReceiveBarrier",
        "testEndOfStreamWithPendingCheckpoint",
    ),
    "CheckpointBarrierTrackerTest": (
        "testSingleChannelNoBarriers", "testMultiChannelNoBarriers", "testSingleChannelWithBarriers",
        "testSingleChannelWithSkippedBarriers", "testMultiChannelWithBarriers",
        "testMultiChannelSkippingCheckpoints", "testCompleteCheckpointsOnLateBarriers",
        "testNextFirstCheckpointBarrierOvertakesCancellationBarrier", "testSingleChannelAbortCheckpoint",
        "testMultiChannelAbortCheckpoint", "testInterleavedCancellationBarriers", "testMetrics",
        "testSingleChannelMetrics", "testTriggerCheckpointsWithEndOfPartition",
        "testDeduplicateChannelsWithBothBarrierAndEndOfPartition",
        "testTriggerCheckpointsAfterReceivedEndOfPartition",
        "testNoFastPathWithChannelFinishedDuringCheckpoints",
        "testCompleteAndRemoveAbortedCheckpointWithEndOfPartition",
        "testAbortCheckpointsAfterEndOfPartitionReceived",
        "testNoFastPathWithChannelFinishedDuringCheckpointsCancel", "testTwoLastBarriersOneByOne",
    ),
    "AlternatingCheckpointsTest": (
        "testChannelResetOnNewBarrier", "testSwitchToUnalignedByUpstream", "testCheckpointHandling",
        "testSavepointHandling", "testAlternation", "testAlignedAfterTimedOut",
        "testAlignedNeverTimeoutableCheckpoint", "testTimeoutAlignment",
        "testTimeoutAlignmentAfterProcessingBarrier", "testTimeoutAlignmentOnFirstBarrier",
        "testTimeoutAlignmentBeforeFirstBarrier", "testTimeoutAlignmentWhenLocalBarrierFirst",
        "testActiveTimeoutAfterLocalBarrierPassiveTimeout",
        "testTimeoutAlignmentOnAnnouncementForSecondCheckpoint",
        "testPassiveTimeoutAlignmentOnAnnouncement", "testActiveTimeoutAlignmentOnFirstBarrier",
        "testAllChannelsUnblockedAfteralignedCheckpointTimeout",
        "testNoActiveTimeoutAlignmentAfterLastBarrier", "testNoActiveTimeoutAlignmentAfterAbort",
        "testNoActiveTimeoutAlignmentAfterClose", "testActiveTimeoutAlignmentOnAnnouncement",
        "testActiveTimeoutAfterAnnouncementPassiveTimeout",
        "testActiveTimeoutBeforeFirstAnnouncementPassiveTimeout",
        "testActiveTimeoutAfterBarrierPassiveTimeout", "testTimeoutAlignmentOnUnalignedCheckpoint",
        "testTimeoutAlignmentAfterReceivedEndOfPartition", "testStartNewCheckpointViaAnnouncement",
        "testMetricsAlternation", "testMetricsSingleChannel", "testPreviousHandlerReset",
        "testHasInflightDataBeforeProcessBarrier", "testOutOfOrderBarrier",
        "testNextFirstCheckpointBarrierOvertakesCancellationBarrier",
    ),
    "AlignedCheckpointsMassiveRandomTest": ("testWithTwoChannelsAndRandomBarriers",),
}

_NAME = re.compile(r"(\w+Test)\.(test\w+)")


def ported() -> dict[tuple[str, str], list[tuple[str, bool]]]:
    """(Flink class, method) -> [(our test, whether it says how it differs)], from the docstrings."""
    found: dict[tuple[str, str], list[tuple[str, bool]]] = {}
    for path in sorted(Path(__file__).parent.glob("test_flink_*.py")):
        for node in ast.parse(path.read_text()).body:
            doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
            if not doc or not doc.startswith("Flink: "):
                continue
            names = doc.split("\n\n")[0]
            for cls, method in _NAME.findall(names):
                found.setdefault((cls, method), []).append((f"{path.stem}::{node.name}", "Differs:" in doc))
    return found


def test_every_flink_method_is_ported():
    """Each method of ``FLINK_TESTS`` is ported by at least one test, and every test names real
    Flink methods only: a scenario is never dropped silently."""
    listed = {(cls, m) for cls, methods in FLINK_TESTS.items() for m in methods}
    found = ported()
    assert sorted(listed - set(found)) == []
    assert sorted(set(found) - listed) == []


# --- scenarios Flink runs against several handlers -------------------------------------------


@pytest.mark.parametrize("mode", ALL_MODES)
def test_single_channel_no_barriers(mode):
    """Flink: AlignedCheckpointsTest.testSingleChannelNoBarriers,
    BarrierBufferTest.testSingleChannelNoBarriers, UnalignedCheckpointsTest.testSingleChannelNoBarriers,
    CheckpointBarrierTrackerTest.testSingleChannelNoBarriers.

    Records only: delivered in order, nothing snapshotted, nothing logged."""
    g = Gate(1, mode)
    g.feed("0 0 0 E0")
    assert (g.delivered, g.triggered, g.in_flight) == ([0, 1, 2], [], {})
    assert g.h.finished


@pytest.mark.parametrize("mode", ALL_MODES)
def test_multi_channel_no_barriers(mode):
    """Flink: AlignedCheckpointsTest.testMultiChannelNoBarriers,
    BarrierBufferTest.testMultiChannelNoBarriers, UnalignedCheckpointsTest.testMultiChannelNoBarriers,
    CheckpointBarrierTrackerTest.testMultiChannelNoBarriers.

    Four channels ending one by one (the tracker's version has no ends): all delivered in order."""
    g = Gate(4, mode)
    g.feed("2 2 0 1 0 E0 3 1 E3 1 E1 2 E2")
    assert g.delivered == [0, 1, 2, 3, 4, 6, 7, 9, 11]
    assert (g.triggered, g.h.blocked, g.h.held) == ([], set(), 0)
    assert g.h.finished


@pytest.mark.parametrize("mode", ALL_MODES)
def test_single_channel_with_barriers(mode):
    """Flink: AlignedCheckpointsTest.testSingleChannelWithBarriers,
    BarrierBufferTest.testSingleChannelWithBarriers,
    UnalignedCheckpointsTest.testSingleChannelWithBarriers,
    CheckpointBarrierTrackerTest.testSingleChannelWithBarriers.

    One channel: every barrier is the last one, so each checkpoint snapshots at its barrier, in order,
    with exactly the records before it."""
    g = Gate(1, mode)
    g.feed("0 0 0 1@0 0 0 0 0 2@0 3@0 0 0 4@0 5@0 6@0 0 E0")
    assert g.triggered == g.acknowledged == [1, 2, 3, 4, 5, 6]
    assert g.delivered == [0, 1, 2, 4, 5, 6, 7, 10, 11, 15]
    assert g.cut(1) == [0, 1, 2] and g.cut(3) == g.cut(2) == [0, 1, 2, 4, 5, 6, 7]
    assert violations(g) == []


@pytest.mark.parametrize("mode", ALL_MODES)
def test_single_channel_abort_checkpoint(mode):
    """Flink: AlignedCheckpointsTest.testSingleChannelAbortCheckpoint,
    BarrierBufferTest.testSingleChannelAbortCheckpoint,
    UnalignedCheckpointsTest.testSingleChannelAbortCheckpoint,
    CheckpointBarrierTrackerTest.testSingleChannelAbortCheckpoint.

    Checkpoints 1, 2 and 5 are taken; 4 and 6 are aborted and their barriers (5's comes after the
    abort of 4) change nothing else.

    Differs: Flink's cancellation markers travel in the channel and the task is told of each
    (``abortCheckpointOnBarrier``); our aborts come from the coordinator, which already knows, so
    the handler only records them (its latest checkpoint moves to 4, then 6) and emits nothing."""
    g = Gate(1, mode)
    g.feed("0 1@0 0 2@0 0")
    assert g.feed("X4@0") == [] and g.h.latest_started == 4
    g.feed("5@0 0")
    assert g.feed("X6@0") == [] and g.h.latest_started == 6
    g.feed("0")
    assert g.triggered == g.acknowledged == [1, 2, 5] and g.delivered == [0, 2, 4, 7, 9]
    assert g.declined == [] and violations(g) == []


@pytest.mark.parametrize("mode", ["aligned", "at_least_once"])
def test_deduplicate_channels_with_both_barrier_and_end_of_partition(mode):
    """Flink: AlignedCheckpointsTest.testDeduplicateChannelsWithBothBarrierAndEndOfPartition,
    CheckpointBarrierTrackerTest.testDeduplicateChannelsWithBothBarrierAndEndOfPartition.

    A channel that delivered the barrier and then ended counts once: the third channel's barrier,
    not the end, completes checkpoint 2."""
    g = Gate(3, mode)
    g.feed("2@0 2@1 E1")
    assert g.triggered == []
    g.feed("2@2")
    assert g.triggered == [2] and g.h.aligning is None and g.h.tracked == []


@pytest.mark.parametrize(
    "mode,script",
    [("aligned", "E2 6@0 6@1 E1 7@0"), ("at_least_once", "E2 5@0 6@0 6@1 E1 7@0")],
)
def test_trigger_checkpoints_after_received_end_of_partition(mode, script):
    """Flink: AlignedCheckpointsTest.testTriggerCheckpointsAfterReceivedEndOfPartition,
    CheckpointBarrierTrackerTest.testTriggerCheckpointsAfterReceivedEndOfPartition.

    Ended channels count as closed: 6 needs the two open channels, 7 the last one; the tracker's
    incomplete 5 is dropped when 6 completes."""
    g = Gate(3, mode)
    g.feed(script)
    assert g.triggered == [6, 7] and g.declined == []
    assert g.h.aligning is None and g.h.tracked == []


@pytest.mark.parametrize("mode,alignment", [("aligned", 2.5), ("at_least_once", 0.0)])
def test_metrics(mode, alignment):
    """Flink: AlignedCheckpointsTest.testMetrics, CheckpointBarrierTrackerTest.testMetrics.

    The alignment lasts from the first barrier to the last (2.5 s here) and three records are
    processed meanwhile.

    Differs: the tracker reports no alignment time (its snapshot says 0) and no handler reports
    the start delay or bytes; the records processed during the alignment are read off the effects."""
    g = Gate(3, mode)
    g.feed("0 1 2 1@1 0 2 1@0 2")
    g.clock.advance(2.5)
    g.feed("1@2 0 1 2 E0 E1 E2")
    assert g.triggered == [1] and g.snapshot(1).alignment_s == alignment
    assert g.during_alignment(1) == [4, 5, 7]


@pytest.mark.parametrize("mode", ["at_least_once", "aligned_with_timeout"])
def test_single_channel_metrics(mode):
    """Flink: CheckpointBarrierTrackerTest.testSingleChannelMetrics,
    AlternatingCheckpointsTest.testMetricsSingleChannel.

    With one channel a barrier needs no alignment: 0 s, no record processed during it, for a
    checkpoint and a savepoint alike."""
    g = Gate(1, mode, timeout=0.1 if mode == "aligned_with_timeout" else None)
    g.feed("0 1@0 0 t0.006 0 s2@0 0 t0.005 E0")
    assert g.triggered == [1, 2] and g.unaligned == []
    assert [g.snapshot(c).alignment_s for c in (1, 2)] == [0.0, 0.0]
    assert g.during_alignment(1) == g.during_alignment(2) == []


@pytest.mark.parametrize("mode,alignment", [("at_least_once", 0.0), ("aligned_with_timeout", 1.0)])
def test_next_first_checkpoint_barrier_overtakes_cancellation_barrier(mode, alignment):
    """Flink: CheckpointBarrierTrackerTest.testNextFirstCheckpointBarrierOvertakesCancellationBarrier,
    AlternatingCheckpointsTest.testNextFirstCheckpointBarrierOvertakesCancellationBarrier.

    Barrier 2 on channel 0 comes before checkpoint 1 is aborted; 2 then completes, one second apart
    each. Flink measures 2's alignment from its first barrier: 2 s.

    Differs: the tracker reports no alignment time. Aligned with timeout, barrier 2 waits behind
    channel 0's barrier 1 (held like any event of a blocked channel) until the abort releases it,
    so 2's alignment starts then and lasts 1 s."""
    g = Gate(2, mode, timeout=10.0 if mode == "aligned_with_timeout" else None)
    g.feed("1@0 t1 2@0 t1 X1@1 t1 2@1")
    assert g.triggered == [2] and g.unaligned == []
    assert g.snapshot(2).alignment_s == alignment

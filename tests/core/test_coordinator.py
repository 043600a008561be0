"""Unit tests for checkpoint_lib.core.coordinator: the checkpoint coordinator state machine."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from checkpoint_lib.core.clock import ManualClock
from checkpoint_lib.core.coordinator import (
    AckOutcome,
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointCoordinator,
    CheckpointTriggerError,
    DiscardCheckpoint,
    FailJob,
    NotifyCheckpointComplete,
    TriggerCheckpoint,
    effects_of,
)
from checkpoint_lib.core.decider import CheckpointConfig
from checkpoint_lib.core.errors import AckResult, CheckpointError, FailureReason
from checkpoint_lib.core.stores import InMemoryCheckpointIdCounter, InMemoryCompletedCheckpointStore
from checkpoint_lib.core.types import Barrier, CheckpointKind, SubtaskAck, SubtaskId

SRC0 = SubtaskId("src", 0)
SRC1 = SubtaskId("src", 1)
MAP = SubtaskId("map", 0)
SINK = SubtaskId("sink", 0)
TASKS = (SRC0, SRC1, MAP, SINK)
SOURCES = (SRC0, SRC1)
STRANGER = SubtaskId("elsewhere", 0)

SAVEPOINT = CheckpointKind.SAVEPOINT
CHECKPOINT = CheckpointKind.CHECKPOINT


@dataclass
class Rig:
    coordinator: CheckpointCoordinator
    clock: ManualClock
    counter: InMemoryCheckpointIdCounter
    store: InMemoryCompletedCheckpointStore

    def restart(self) -> "Rig":
        """A new coordinator (a new process) over the same durable counter and store."""
        return make(self.coordinator.config, counter=self.counter, store=self.store, clock=self.clock)


class FailingStore(InMemoryCompletedCheckpointStore):
    """A store whose add() raises while ``failing`` is set (metadata could not be made durable)."""

    def __init__(self, retained: int = 3):
        super().__init__(retained)
        self.failing = True

    def add(self, checkpoint):
        if self.failing:
            raise OSError("disk full")
        return super().add(checkpoint)


def make(
    config: CheckpointConfig | None = None,
    *,
    running: bool = True,
    counter: InMemoryCheckpointIdCounter | None = None,
    store: InMemoryCompletedCheckpointStore | None = None,
    clock: ManualClock | None = None,
) -> Rig:
    config = config or CheckpointConfig(interval=10, timeout=100)
    clock = clock or ManualClock()
    counter = counter or InMemoryCheckpointIdCounter()
    store = store if store is not None else InMemoryCompletedCheckpointStore(config.retained)
    coordinator = CheckpointCoordinator(config, TASKS, SOURCES, counter, store, clock)
    if running:
        coordinator.all_running()
    return Rig(coordinator, clock, counter, store)


def tick_trigger(rig: Rig) -> int:
    """Tick and expect exactly one periodic trigger; return its id."""
    effects = rig.coordinator.tick()
    triggers = effects_of(TriggerCheckpoint, effects)
    assert len(triggers) == 1, effects
    return triggers[0].checkpoint_id


def ack_all(rig: Rig, checkpoint_id: int, states: dict | None = None) -> list:
    """Acknowledge ``checkpoint_id`` from every task; return the effects of the last ack."""
    outcomes = [
        rig.coordinator.acknowledge(checkpoint_id, task, SubtaskAck(state=(states or {}).get(task, {})))
        for task in TASKS
    ]
    assert [o.result for o in outcomes] == [AckResult.SUCCESS] * len(TASKS)
    assert all(o.effects == () for o in outcomes[:-1])
    return list(outcomes[-1].effects)


def aborted(checkpoint_id: int, reason: FailureReason, message: str = "") -> CheckpointAborted:
    return CheckpointAborted(checkpoint_id, reason, TASKS, message)


def notify(checkpoint_id: int) -> NotifyCheckpointComplete:
    return NotifyCheckpointComplete(checkpoint_id, TASKS)


# --- construction and task lifecycle ---------------------------------------------------------------


def test_needs_a_source():
    with pytest.raises(ValueError, match="^a pipeline needs at least one source subtask$"):
        CheckpointCoordinator(
            CheckpointConfig(), TASKS, (), InMemoryCheckpointIdCounter(), InMemoryCompletedCheckpointStore(), ManualClock()
        )


def test_sources_must_be_tasks():
    with pytest.raises(ValueError, match=r"^sources \['elsewhere\[0\]'\] are not among the tasks$"):
        CheckpointCoordinator(
            CheckpointConfig(),
            TASKS,
            (SRC0, STRANGER),
            InMemoryCheckpointIdCounter(),
            InMemoryCompletedCheckpointStore(),
            ManualClock(),
        )


def test_duplicate_tasks_are_collapsed():
    coordinator = CheckpointCoordinator(
        CheckpointConfig(), (SRC0, MAP, SRC0), (SRC0, SRC0), InMemoryCheckpointIdCounter(),
        InMemoryCompletedCheckpointStore(), ManualClock(),
    )
    assert coordinator.tasks == (SRC0, MAP)
    assert coordinator.sources == (SRC0,)


@pytest.mark.parametrize("method", ["task_running", "task_failed"])
def test_unknown_task_lifecycle_events_raise(method):
    rig = make()
    with pytest.raises(ValueError, match=r"^elsewhere\[0\] is not a task of this pipeline$"):
        getattr(rig.coordinator, method)(STRANGER)


# --- periodic triggering ---------------------------------------------------------------------------


def test_periodic_trigger_only_when_all_tasks_running():
    rig = make(running=False)
    assert rig.coordinator.tick() == []
    for task in TASKS[:-1]:
        rig.coordinator.task_running(task)
        assert rig.coordinator.tick() == []
    assert not rig.coordinator.all_tasks_running
    rig.coordinator.task_running(TASKS[-1])
    assert rig.coordinator.all_tasks_running
    assert tick_trigger(rig) == 1
    assert rig.counter.peek() == 2  # refused ticks consumed no ids


def test_no_periodic_trigger_after_a_task_failed():
    rig = make()
    rig.coordinator.task_failed(MAP)
    rig.clock.advance(1000)
    assert rig.coordinator.tick() == []
    rig.coordinator.task_running(MAP)
    assert tick_trigger(rig) == 1


def test_trigger_goes_to_sources_only():
    rig = make()
    rig.clock.set(3.5)
    effects = rig.coordinator.tick()
    assert effects == [TriggerCheckpoint(Barrier(1, 3.5, CHECKPOINT), SOURCES)]
    assert effects[0].checkpoint_id == 1
    assert rig.coordinator.pending[1].tasks == frozenset(TASKS)


def test_periodic_trigger_respects_interval():
    rig = make(CheckpointConfig(interval=10, timeout=100))
    assert tick_trigger(rig) == 1
    ack_all(rig, 1)
    rig.clock.set(9.99)
    assert rig.coordinator.tick() == []
    rig.clock.set(10)
    assert tick_trigger(rig) == 2


def test_periodic_trigger_respects_max_concurrent():
    rig = make(CheckpointConfig(interval=1, max_concurrent=2, timeout=100))
    assert tick_trigger(rig) == 1
    rig.clock.advance(1)
    assert tick_trigger(rig) == 2
    rig.clock.advance(1)
    assert rig.coordinator.tick() == []
    ack_all(rig, 2)  # completes 2, subsumes 1: nothing pending
    assert tick_trigger(rig) == 3


def test_pending_savepoint_does_not_count_toward_max_concurrent():
    rig = make(CheckpointConfig(interval=1, max_concurrent=1, timeout=100))
    assert rig.coordinator.trigger().checkpoint_id == 1
    rig.clock.advance(1)
    assert tick_trigger(rig) == 2


def test_ids_strictly_increase_also_after_aborts():
    rig = make(CheckpointConfig(interval=1, timeout=100, tolerable_failed_checkpoints=10))
    seen = []
    for _ in range(3):
        seen.append(tick_trigger(rig))
        rig.coordinator.decline(seen[-1], MAP)
        rig.clock.advance(1)
    seen.append(tick_trigger(rig))
    assert seen == [1, 2, 3, 4]


def test_ids_survive_a_restart_with_the_same_counter_and_store():
    rig = make()
    assert tick_trigger(rig) == 1
    ack_all(rig, 1)
    rig.clock.advance(10)
    assert tick_trigger(rig) == 2  # pending when the process dies
    restarted = rig.restart()
    assert restarted.coordinator.pending == {}
    assert tick_trigger(restarted) == 3  # no interval wait: the new process never triggered
    ack_all(restarted, 3)
    assert [c.checkpoint_id for c in restarted.store.all()] == [1, 3]


def test_counter_not_restored_raises():
    rig = make()
    for _ in range(2):
        checkpoint_id = tick_trigger(rig)
        ack_all(rig, checkpoint_id)
        rig.clock.advance(10)
    # a new process over the same store but a fresh counter (the counter was not restored)
    fresh = make(rig.coordinator.config, store=rig.store, clock=rig.clock)
    with pytest.raises(
        CheckpointError,
        match=r"^id counter returned 1, not above the latest completed checkpoint 2: the counter was not restored$",
    ):
        fresh.coordinator.tick()
    assert fresh.coordinator.pending == {}
    with pytest.raises(CheckpointError):  # 2 is not above 2 either
        fresh.coordinator.trigger()
    assert fresh.coordinator.tick() != []  # 3 is


# --- acknowledgements ------------------------------------------------------------------------------------


def test_completes_only_after_all_acks():
    rig = make()
    tick_trigger(rig)
    for task in TASKS[:-1]:
        assert rig.coordinator.acknowledge(1, task) == AckOutcome(AckResult.SUCCESS)
        assert rig.coordinator.status_of(1) == "pending"
    assert rig.store.latest() is None
    rig.clock.advance(2)
    outcome = rig.coordinator.acknowledge(1, TASKS[-1], SubtaskAck(state={"v": 1}))
    assert outcome.result is AckResult.SUCCESS
    completed = rig.store.latest()
    assert outcome.effects == (CheckpointCompleted(completed), notify(1))
    assert (completed.checkpoint_id, completed.kind, completed.trigger_time, completed.completion_time) == (
        1, CHECKPOINT, 0.0, 2.0,
    )
    assert dict(completed.acks[TASKS[-1]].state) == {"v": 1}
    assert completed.acks[SRC0] == SubtaskAck()  # an ack without payload counts as an empty one
    assert completed.ack_times == {SRC0: 0.0, SRC1: 0.0, MAP: 0.0, SINK: 2.0}
    assert rig.coordinator.pending == {}
    assert rig.coordinator.status_of(1) == "completed"


def test_duplicate_ack():
    rig = make()
    tick_trigger(rig)
    rig.coordinator.acknowledge(1, MAP, SubtaskAck(state={"first": True}))
    assert rig.coordinator.acknowledge(1, MAP, SubtaskAck(state={"second": True})) == AckOutcome(AckResult.DUPLICATE)
    assert dict(rig.coordinator.pending[1].acks[MAP].state) == {"first": True}


def test_ack_from_unknown_subtask():
    rig = make()
    tick_trigger(rig)
    assert rig.coordinator.acknowledge(1, STRANGER) == AckOutcome(AckResult.UNKNOWN)
    assert rig.coordinator.pending[1].acks == {}


def test_late_ack_after_completion_is_discarded():
    rig = make()
    tick_trigger(rig)
    ack_all(rig, 1)
    assert rig.coordinator.acknowledge(1, MAP) == AckOutcome(AckResult.DISCARDED)
    assert rig.coordinator.acknowledge(1, STRANGER) == AckOutcome(AckResult.DISCARDED)


def test_ack_for_never_existing_checkpoint_is_discarded():
    rig = make()
    assert rig.coordinator.acknowledge(42, MAP) == AckOutcome(AckResult.DISCARDED)
    tick_trigger(rig)
    assert rig.coordinator.acknowledge(2, MAP) == AckOutcome(AckResult.DISCARDED)


def test_ack_after_abort_is_discarded():
    rig = make(CheckpointConfig(interval=10, timeout=100, tolerable_failed_checkpoints=1))
    tick_trigger(rig)
    rig.coordinator.decline(1, MAP)
    assert rig.coordinator.acknowledge(1, SRC0) == AckOutcome(AckResult.DISCARDED)


# --- completion effects, subsumption and retention ------------------------------------------------------


def test_completion_effects_order():
    rig = make(CheckpointConfig(interval=1, max_concurrent=3, timeout=100, retained=1))
    assert tick_trigger(rig) == 1
    ack_all(rig, 1)
    first = rig.store.get(1)
    rig.clock.advance(1)
    assert tick_trigger(rig) == 2
    assert rig.coordinator.trigger().checkpoint_id == 3  # a savepoint
    rig.clock.advance(1)
    assert tick_trigger(rig) == 4
    rig.clock.advance(1)
    assert tick_trigger(rig) == 5

    effects = ack_all(rig, 5)
    assert effects == [
        CheckpointCompleted(rig.store.get(5)),
        aborted(2, FailureReason.SUBSUMED),
        aborted(4, FailureReason.SUBSUMED),
        notify(5),
        DiscardCheckpoint(first),
    ]
    assert list(rig.coordinator.pending) == [3]  # the savepoint is not subsumed
    assert rig.coordinator.consecutive_failures == 0

    # the savepoint completes after the newer checkpoint; nothing to evict (savepoints are kept)
    effects = ack_all(rig, 3)
    assert effects == [CheckpointCompleted(rig.store.get(3)), notify(3)]
    assert [(c.checkpoint_id, c.kind) for c in rig.store.all()] == [(3, SAVEPOINT), (5, CHECKPOINT)]


def test_newer_pending_checkpoints_are_not_subsumed():
    rig = make(CheckpointConfig(interval=1, max_concurrent=2, timeout=100))
    tick_trigger(rig)
    rig.clock.advance(1)
    tick_trigger(rig)
    assert ack_all(rig, 1) == [CheckpointCompleted(rig.store.get(1)), notify(1)]
    assert list(rig.coordinator.pending) == [2]


def test_retention_keeps_last_n_plus_all_savepoints():
    rig = make(CheckpointConfig(interval=1, timeout=100, retained=2))
    discarded = []
    for kind in (CHECKPOINT, SAVEPOINT, CHECKPOINT, CHECKPOINT, SAVEPOINT, CHECKPOINT):
        rig.clock.advance(1)
        checkpoint_id = rig.coordinator.trigger(kind).checkpoint_id
        discarded += [e.checkpoint.checkpoint_id for e in effects_of(DiscardCheckpoint, ack_all(rig, checkpoint_id))]
    assert [c.checkpoint_id for c in rig.store.all()] == [2, 4, 5, 6]
    assert [c.is_savepoint for c in rig.store.all()] == [True, False, True, False]
    assert discarded == [1, 3]


# --- declines, aborts, timeouts --------------------------------------------------------------------------


def test_decline_aborts_with_message():
    rig = make(CheckpointConfig(interval=10, timeout=100, tolerable_failed_checkpoints=5))
    tick_trigger(rig)
    rig.clock.advance(3)
    effects = rig.coordinator.decline(1, MAP, message="disk full")
    assert effects == [aborted(1, FailureReason.DECLINED, "declined by map[0]: disk full")]
    assert rig.coordinator.pending == {}
    assert rig.coordinator.status_of(1) == "aborted"
    assert rig.coordinator.last_end_time == 3.0
    assert rig.coordinator.consecutive_failures == 1


def test_decline_without_message_and_with_reason():
    rig = make(CheckpointConfig(interval=1, timeout=100, tolerable_failed_checkpoints=5))
    tick_trigger(rig)
    assert rig.coordinator.decline(1, SINK) == [aborted(1, FailureReason.DECLINED, "declined by sink[0]")]
    rig.clock.advance(1)
    tick_trigger(rig)
    assert rig.coordinator.decline(2, SINK, FailureReason.IO_ERROR, "write failed") == [
        aborted(2, FailureReason.IO_ERROR, "declined by sink[0]: write failed")
    ]


@pytest.mark.parametrize("message", ["expected one of: ", "bad value:", "  "])
def test_decline_message_is_kept_verbatim(message):
    rig = make(CheckpointConfig(interval=10, timeout=100, tolerable_failed_checkpoints=5))
    tick_trigger(rig)
    assert rig.coordinator.decline(1, MAP, message=message) == [
        aborted(1, FailureReason.DECLINED, f"declined by map[0]: {message}")
    ]


def test_late_decline_is_ignored():
    rig = make()
    tick_trigger(rig)
    ack_all(rig, 1)
    assert rig.coordinator.decline(1, MAP, message="too late") == []
    assert rig.coordinator.decline(99, MAP) == []
    assert rig.coordinator.status_of(1) == "completed"
    assert rig.coordinator.consecutive_failures == 0


def test_abort_of_unknown_checkpoint_is_a_no_op():
    rig = make()
    assert rig.coordinator.abort(7, FailureReason.USER_ABORT) == []


def test_timeout_expires_on_tick():
    rig = make(CheckpointConfig(interval=1, timeout=5, tolerable_failed_checkpoints=1))
    tick_trigger(rig)
    rig.clock.set(4.99)
    assert rig.coordinator.tick() == []  # not yet expired, and 1 is still in flight
    rig.clock.set(5)
    effects = rig.coordinator.tick()
    assert effects == [aborted(1, FailureReason.EXPIRED), TriggerCheckpoint(Barrier(2, 5.0), SOURCES)]
    assert rig.coordinator.status_of(1) == "aborted"


def test_expiry_that_fails_the_job_triggers_nothing():
    rig = make(CheckpointConfig(interval=1, timeout=5, tolerable_failed_checkpoints=0))
    tick_trigger(rig)
    rig.clock.set(6)
    assert rig.coordinator.tick() == [aborted(1, FailureReason.EXPIRED), FailJob(FailureReason.EXPIRED, 1)]
    assert rig.coordinator.pending == {}


def test_pending_savepoints_expire_too():
    rig = make(CheckpointConfig(interval=100, timeout=5, tolerable_failed_checkpoints=3))
    tick_trigger(rig)
    rig.clock.set(1)
    rig.coordinator.trigger()
    rig.clock.set(6)
    assert rig.coordinator.tick() == [aborted(1, FailureReason.EXPIRED), aborted(2, FailureReason.EXPIRED)]


# --- tolerable failed checkpoints -------------------------------------------------------------------------


def test_fail_job_only_after_more_than_tolerable_consecutive_failures():
    rig = make(CheckpointConfig(interval=1, timeout=100, tolerable_failed_checkpoints=2))
    fail_jobs = []
    for _ in range(3):
        rig.clock.advance(1)
        checkpoint_id = tick_trigger(rig)
        fail_jobs.append(effects_of(FailJob, rig.coordinator.decline(checkpoint_id, MAP)))
    assert fail_jobs == [[], [], [FailJob(FailureReason.DECLINED, 3)]]


def test_completion_resets_consecutive_failures():
    rig = make(CheckpointConfig(interval=1, timeout=100, tolerable_failed_checkpoints=1))

    def next_id():
        rig.clock.advance(1)
        return tick_trigger(rig)

    assert rig.coordinator.decline(next_id(), MAP) == [aborted(1, FailureReason.DECLINED, "declined by map[0]")]
    ack_all(rig, next_id())
    assert rig.coordinator.consecutive_failures == 0
    assert effects_of(FailJob, rig.coordinator.decline(next_id(), MAP)) == []
    assert effects_of(FailJob, rig.coordinator.decline(next_id(), MAP)) == [FailJob(FailureReason.DECLINED, 2)]


@pytest.mark.parametrize(
    "reason", [FailureReason.SUBSUMED, FailureReason.ALIGNMENT_ABANDONED, FailureReason.USER_ABORT]
)
def test_uncounted_aborts_never_fail_the_job(reason):
    rig = make(CheckpointConfig(interval=1, timeout=100, tolerable_failed_checkpoints=0))
    for _ in range(3):
        rig.clock.advance(1)
        checkpoint_id = tick_trigger(rig)
        assert rig.coordinator.abort(checkpoint_id, reason) == [aborted(checkpoint_id, reason)]
    assert rig.coordinator.consecutive_failures == 0


def test_uncounted_abort_does_not_reset_the_count():
    rig = make(CheckpointConfig(interval=1, timeout=100, tolerable_failed_checkpoints=1))
    rig.coordinator.decline(tick_trigger(rig), MAP)
    rig.clock.advance(1)
    rig.coordinator.abort(tick_trigger(rig), FailureReason.ALIGNMENT_ABANDONED)
    rig.clock.advance(1)
    assert effects_of(FailJob, rig.coordinator.decline(tick_trigger(rig), MAP)) == [
        FailJob(FailureReason.DECLINED, 2)
    ]


def test_subsumption_does_not_count_as_failure():
    rig = make(CheckpointConfig(interval=1, max_concurrent=2, timeout=100, tolerable_failed_checkpoints=0))
    tick_trigger(rig)
    rig.clock.advance(1)
    tick_trigger(rig)
    effects = ack_all(rig, 2)
    assert effects_of(FailJob, effects) == []
    assert effects_of(CheckpointAborted, effects) == [aborted(1, FailureReason.SUBSUMED)]
    assert rig.coordinator.consecutive_failures == 0


# --- task failure -------------------------------------------------------------------------------------------


def test_task_failed_aborts_all_pending_with_task_failure():
    rig = make(CheckpointConfig(interval=1, max_concurrent=2, timeout=100, tolerable_failed_checkpoints=5))
    tick_trigger(rig)
    rig.coordinator.trigger()
    rig.clock.advance(1)
    tick_trigger(rig)
    effects = rig.coordinator.task_failed(SINK)
    assert effects == [
        aborted(1, FailureReason.TASK_FAILURE, "sink[0] failed"),
        aborted(2, FailureReason.TASK_FAILURE, "sink[0] failed"),
        aborted(3, FailureReason.TASK_FAILURE, "sink[0] failed"),
    ]
    assert rig.coordinator.pending == {}
    assert not rig.coordinator.all_tasks_running
    assert rig.coordinator.consecutive_failures == 0  # the job fails over; not a checkpoint failure


def test_fail_job_is_emitted_once_when_tolerance_is_first_exceeded():
    rig = make(CheckpointConfig(interval=1, max_concurrent=3, timeout=100, tolerable_failed_checkpoints=1))
    for _ in range(3):
        tick_trigger(rig)
        rig.clock.advance(1)
    effects = [e for cid in (1, 2, 3) for e in rig.coordinator.decline(cid, SINK)]
    assert [e for e in effects if isinstance(e, FailJob)] == [FailJob(FailureReason.DECLINED, 2)]
    assert rig.coordinator.consecutive_failures == 3


def test_task_failed_with_nothing_pending():
    rig = make()
    assert rig.coordinator.task_failed(SRC1) == []
    assert rig.coordinator.running == {SRC0, MAP, SINK}


# --- forced triggers (savepoints) -----------------------------------------------------------------------


def test_forced_trigger_raises_when_tasks_not_running():
    rig = make(running=False)
    with pytest.raises(CheckpointTriggerError, match="^checkpoint not triggered: not_all_tasks_running$") as info:
        rig.coordinator.trigger()
    assert info.value.reason is FailureReason.NOT_ALL_TASKS_RUNNING
    assert isinstance(info.value, CheckpointError)
    assert rig.coordinator.pending == {}
    assert rig.counter.peek() == 1


def test_forced_trigger_ignores_max_concurrent_interval_and_min_pause():
    rig = make(CheckpointConfig(interval=100, min_pause=50, max_concurrent=1, timeout=1000))
    assert tick_trigger(rig) == 1
    rig.clock.advance(1)
    trigger = rig.coordinator.trigger()
    assert trigger == TriggerCheckpoint(Barrier(2, 1.0, SAVEPOINT), SOURCES)
    # a completed savepoint subsumes the older periodic checkpoint like any completion does
    assert effects_of(CheckpointAborted, ack_all(rig, 2)) == [aborted(1, FailureReason.SUBSUMED)]
    # just completed: the min pause (and the interval) would hold a periodic trigger back
    assert rig.coordinator.tick() == []
    assert rig.coordinator.trigger(CHECKPOINT) == TriggerCheckpoint(Barrier(3, 1.0, CHECKPOINT), SOURCES)
    assert rig.coordinator.trigger() == TriggerCheckpoint(Barrier(4, 1.0, SAVEPOINT), SOURCES)
    assert sorted(rig.coordinator.pending) == [3, 4]
    assert rig.coordinator.pending[3].kind is CHECKPOINT


def test_savepoint_completes_as_savepoint():
    rig = make()
    rig.coordinator.trigger()
    effects = ack_all(rig, 1)
    assert effects[0] == CheckpointCompleted(rig.store.get(1))
    assert rig.store.get(1).is_savepoint


# --- finalisation failure --------------------------------------------------------------------------------


def test_store_add_failure_aborts_with_finalize_failed():
    store = FailingStore()
    rig = make(CheckpointConfig(interval=1, timeout=100, tolerable_failed_checkpoints=1), store=store)
    tick_trigger(rig)
    effects = ack_all(rig, 1)
    assert effects == [aborted(1, FailureReason.FINALIZE_FAILED, "OSError('disk full')")]
    assert rig.coordinator.status_of(1) == "aborted"
    assert rig.coordinator.pending == {}
    assert store.all() == ()
    assert rig.coordinator.consecutive_failures == 1
    # the next failure is one too many
    rig.clock.advance(1)
    tick_trigger(rig)
    assert effects_of(FailJob, ack_all(rig, 2)) == [FailJob(FailureReason.FINALIZE_FAILED, 2)]
    # and once the store works again, a completion resets the count
    store.failing = False
    rig.clock.advance(1)
    assert tick_trigger(rig) == 3
    assert effects_of(CheckpointCompleted, ack_all(rig, 3)) == [CheckpointCompleted(store.get(3))]
    assert rig.coordinator.consecutive_failures == 0


def test_store_add_failure_subsumes_nothing():
    rig = make(CheckpointConfig(interval=1, max_concurrent=2, timeout=100, tolerable_failed_checkpoints=5),
               store=FailingStore())
    tick_trigger(rig)
    rig.clock.advance(1)
    tick_trigger(rig)
    ack_all(rig, 2)
    assert list(rig.coordinator.pending) == [1]


# --- min pause and next trigger time -------------------------------------------------------------------


def test_min_pause_honoured_after_completion():
    rig = make(CheckpointConfig(interval=10, min_pause=8, timeout=100))
    tick_trigger(rig)
    rig.clock.set(5)
    ack_all(rig, 1)
    rig.clock.set(10)  # the interval has passed, the pause (until 13) has not
    assert rig.coordinator.tick() == []
    assert rig.coordinator.next_trigger_time() == 13.0
    rig.clock.set(12.99)
    assert rig.coordinator.tick() == []
    rig.clock.set(13)
    assert tick_trigger(rig) == 2


def test_min_pause_honoured_after_abort():
    rig = make(CheckpointConfig(interval=1, min_pause=4, timeout=100, tolerable_failed_checkpoints=5))
    tick_trigger(rig)
    rig.clock.set(2)
    rig.coordinator.decline(1, MAP)
    rig.clock.set(5.5)
    assert rig.coordinator.tick() == []
    rig.clock.set(6)
    assert tick_trigger(rig) == 2


def test_next_trigger_time():
    rig = make(CheckpointConfig(interval=10, min_pause=3, timeout=100))
    assert rig.coordinator.next_trigger_time() is None  # may trigger now
    rig.clock.set(1)
    tick_trigger(rig)
    assert rig.coordinator.next_trigger_time() == 11.0
    rig.clock.set(9)
    ack_all(rig, 1)
    assert rig.coordinator.next_trigger_time() == 12.0  # pause end after the interval
    rig.clock.set(12)
    assert rig.coordinator.next_trigger_time() is None


# --- status_of and helpers ----------------------------------------------------------------------------------


def test_status_of():
    rig = make(CheckpointConfig(interval=1, max_concurrent=2, timeout=100, tolerable_failed_checkpoints=5))
    tick_trigger(rig)
    rig.clock.advance(1)
    tick_trigger(rig)
    rig.coordinator.decline(1, MAP)
    assert [rig.coordinator.status_of(i) for i in (1, 2, 3)] == ["aborted", "pending", "unknown"]
    ack_all(rig, 2)
    assert rig.coordinator.status_of(2) == "completed"


def test_status_of_remembers_the_last_1000_finished_ids():
    rig = make(CheckpointConfig(interval=1, timeout=100, tolerable_failed_checkpoints=10_000))
    for _ in range(1001):
        checkpoint_id = rig.coordinator.trigger().checkpoint_id
        rig.coordinator.abort(checkpoint_id, FailureReason.USER_ABORT)
    assert rig.coordinator.status_of(1) == "unknown"
    assert rig.coordinator.status_of(2) == "aborted"
    assert rig.coordinator.status_of(1001) == "aborted"


def test_effects_of_filters_in_order():
    effects = [notify(1), aborted(2, FailureReason.SUBSUMED), notify(3)]
    assert effects_of(NotifyCheckpointComplete, effects) == [notify(1), notify(3)]
    assert effects_of(FailJob, effects) == []


def test_expire_aborts_old_checkpoints_without_triggering():
    rig = make(CheckpointConfig(interval=0, timeout=5, tolerable_failed_checkpoints=1))
    first = tick_trigger(rig)
    rig.clock.advance(5)
    assert rig.coordinator.expire() == [aborted(first, FailureReason.EXPIRED)]
    assert rig.coordinator.pending == {}
    assert rig.coordinator.expire() == []  # and nothing was triggered


def test_a_fenced_store_stops_the_coordinator_instead_of_counting_a_failure():
    from checkpoint_lib.core.errors import FencedError

    class FencedStore(InMemoryCompletedCheckpointStore):
        def add(self, checkpoint):
            raise FencedError("epoch 2 has taken over")

    rig = make(CheckpointConfig(interval=0, tolerable_failed_checkpoints=5))
    rig.coordinator.store = FencedStore()
    checkpoint_id = tick_trigger(rig)
    with pytest.raises(FencedError, match="epoch 2 has taken over"):
        for subtask in TASKS:
            rig.coordinator.acknowledge(checkpoint_id, subtask)
    assert rig.coordinator.consecutive_failures == 0


def test_a_completion_that_lost_to_an_abort_elsewhere_is_not_a_failure_of_this_process():
    """The snapshot DAG's timeout aborted the checkpoint while this stage was completing it: the
    abort is durable and wins; with zero tolerable failures this must not fail the job (a slow
    checkpoint would otherwise become a crash loop)."""
    from checkpoint_lib.core.errors import CheckpointAbortedError

    class AbortedElsewhere(InMemoryCompletedCheckpointStore):
        def add(self, checkpoint):
            raise CheckpointAbortedError("checkpoint 1 was aborted (expired: ack timeout)", FailureReason.EXPIRED)

    rig = make(CheckpointConfig(interval=0, tolerable_failed_checkpoints=0))
    rig.coordinator.store = AbortedElsewhere()
    checkpoint_id = tick_trigger(rig)
    effects = ack_all(rig, checkpoint_id)
    assert effects == [aborted(checkpoint_id, FailureReason.EXPIRED, "checkpoint 1 was aborted (expired: ack timeout)")]
    assert effects_of(FailJob, effects) == []
    assert rig.coordinator.consecutive_failures == 0
    assert rig.coordinator.status_of(checkpoint_id) == "aborted"


def test_a_completion_another_process_stored_first_is_complete_and_this_process_commits_its_sinks():
    """Two process groups of a graph each saw every ack and both completed the checkpoint: the one
    whose commit landed second finds it stored. It is complete (not a failure, no second
    announcement), and this process still commits its own sinks up to it."""
    from checkpoint_lib.core.errors import CheckpointAlreadyStoredError

    class StoredElsewhere(InMemoryCompletedCheckpointStore):
        completed = True

        def add(self, checkpoint):
            raise CheckpointAlreadyStoredError(f"checkpoint {checkpoint.checkpoint_id} is already stored",
                                               completed=self.completed)

    rig = make(CheckpointConfig(interval=0, tolerable_failed_checkpoints=0))
    rig.coordinator.store = StoredElsewhere()
    checkpoint_id = tick_trigger(rig)
    effects = ack_all(rig, checkpoint_id)
    assert effects_of(CheckpointCompleted, effects) == [] and effects_of(CheckpointAborted, effects) == []
    assert [e.checkpoint_id for e in effects_of(NotifyCheckpointComplete, effects)] == [checkpoint_id]
    assert rig.coordinator.status_of(checkpoint_id) == "completed" and rig.coordinator.consecutive_failures == 0
    # stored and since discarded (a rollback elsewhere): nothing to commit
    rig.coordinator.store.completed = False
    rig.clock.advance(10)
    later = tick_trigger(rig)
    assert ack_all(rig, later) == [] and rig.coordinator.status_of(later) == "discarded"


def test_the_in_memory_store_refuses_a_second_completion_as_already_stored():
    from checkpoint_lib.core.errors import CheckpointAlreadyStoredError

    rig = make()
    checkpoint_id = tick_trigger(rig)
    ack_all(rig, checkpoint_id)
    with pytest.raises(CheckpointAlreadyStoredError, match="already stored"):
        rig.coordinator.store.add(rig.coordinator.store.latest())


# --- checkpoints shared between processes (a stage per process) -------------------------------


def test_adopted_checkpoint_completes_with_the_acks_recorded_elsewhere():
    source_side, keyed_side = make(), make()
    (trigger,) = effects_of(TriggerCheckpoint, source_side.coordinator.tick())
    cid = trigger.checkpoint_id
    recorded = {SRC0: (SubtaskAck(state={"offset": 1}), 0.5), SRC1: (SubtaskAck(state={"offset": 2}), 0.5)}
    assert keyed_side.coordinator.adopt(cid, trigger.barrier.timestamp, CHECKPOINT, recorded) == []
    assert keyed_side.coordinator.status_of(cid) == "pending"
    assert keyed_side.coordinator.adopt(cid, 0.0, CHECKPOINT, {}) == []  # a second adopt is a no-op
    keyed_side.coordinator.acknowledge(cid, MAP)
    effects = keyed_side.coordinator.acknowledge(cid, SINK).effects
    (done,) = effects_of(CheckpointCompleted, effects)
    assert done.checkpoint.acks[SRC1].state == {"offset": 2}
    assert effects_of(NotifyCheckpointComplete, effects)


def test_adopt_completes_at_once_when_every_ack_was_recorded():
    rig = make()
    acks = {t: (SubtaskAck(), 1.0) for t in TASKS}
    (done,) = effects_of(CheckpointCompleted, rig.coordinator.adopt(7, 0.0, CHECKPOINT, acks))
    assert done.checkpoint.checkpoint_id == 7 and rig.store.latest().checkpoint_id == 7
    assert rig.coordinator.adopt(7, 0.0, CHECKPOINT, acks) == []  # known (finished): ignored


def test_finished_elsewhere_frees_the_concurrency_slot_and_starts_the_pause():
    rig = make(CheckpointConfig(interval=0, min_pause=5, max_concurrent=1))
    (trigger,) = effects_of(TriggerCheckpoint, rig.coordinator.tick())
    assert effects_of(TriggerCheckpoint, rig.coordinator.tick()) == []  # one pending: no second
    rig.coordinator.finished_elsewhere(trigger.checkpoint_id, "completed", rig.clock.now())
    assert rig.coordinator.status_of(trigger.checkpoint_id) == "completed"
    assert effects_of(TriggerCheckpoint, rig.coordinator.tick()) == []  # min pause from completion
    rig.clock.advance(5)
    assert effects_of(TriggerCheckpoint, rig.coordinator.tick())
    with pytest.raises(ValueError, match="status must be"):
        rig.coordinator.finished_elsewhere(1, "pending", 0.0)

"""The checkpoint coordinator: a pure state machine.

It decides when to trigger (through :func:`.decider.decide`), hands out ids, tracks pending
checkpoints, classifies acknowledgements, completes, aborts, subsumes and retains checkpoints.
It returns effects for the runtime to carry out and never does I/O of its own; the only things it
calls are the injected :class:`~.stores.CheckpointIdCounter` and
:class:`~.stores.CompletedCheckpointStore` (durable in production, in-memory in tests).

>>> coordinator = CheckpointCoordinator(CheckpointConfig(interval=10), tasks, sources,
...                                     InMemoryCheckpointIdCounter(),
...                                     InMemoryCompletedCheckpointStore(), ManualClock())
>>> coordinator.tick()           # -> [TriggerCheckpoint(checkpoint_id=1, ...)]
>>> coordinator.acknowledge(1, SubtaskId("src", 0), SubtaskAck(state={"offset": 42}))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence, Union

from .checkpoints import CompletedCheckpoint, PendingCheckpoint
from .clock import Clock
from .decider import CheckpointConfig, Verdict, decide
from .errors import (AckResult, CheckpointAbortedError, CheckpointAlreadyStoredError, CheckpointError, FailureReason,
                     FencedError)
from .stores import CheckpointIdCounter, CompletedCheckpointStore
from .types import Barrier, CheckpointId, CheckpointKind, CheckpointStatus, SubtaskAck, SubtaskId


# --- effects -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TriggerCheckpoint:
    """Inject ``barrier`` at every source subtask."""

    barrier: Barrier
    sources: tuple[SubtaskId, ...]

    @property
    def checkpoint_id(self) -> CheckpointId:
        return self.barrier.checkpoint_id


@dataclass(frozen=True)
class CheckpointCompleted:
    """``checkpoint`` is complete and already in the completed-checkpoint store."""

    checkpoint: CompletedCheckpoint


@dataclass(frozen=True)
class NotifyCheckpointComplete:
    """Tell every subtask that ``checkpoint_id`` is complete (sinks commit on it)."""

    checkpoint_id: CheckpointId
    subtasks: tuple[SubtaskId, ...]


@dataclass(frozen=True)
class CheckpointAborted:
    """``checkpoint_id`` was aborted; subtasks drop what they staged for it (sinks abort)."""

    checkpoint_id: CheckpointId
    reason: FailureReason
    subtasks: tuple[SubtaskId, ...]
    message: str = ""


@dataclass(frozen=True)
class DiscardCheckpoint:
    """Retention evicted ``checkpoint``: its snapshot data may be deleted."""

    checkpoint: CompletedCheckpoint


@dataclass(frozen=True)
class FailJob:
    """More consecutive failed checkpoints than tolerated."""

    reason: FailureReason
    consecutive_failures: int


Effect = Union[
    TriggerCheckpoint,
    CheckpointCompleted,
    NotifyCheckpointComplete,
    CheckpointAborted,
    DiscardCheckpoint,
    FailJob,
]


class CheckpointTriggerError(CheckpointError):
    """A forced trigger (savepoint, manual checkpoint) was refused; ``reason`` says why."""

    def __init__(self, reason: FailureReason):
        super().__init__(f"checkpoint not triggered: {reason.value}")
        self.reason = reason


@dataclass(frozen=True)
class AckOutcome:
    result: AckResult
    effects: tuple[Effect, ...] = ()


# --- the coordinator -----------------------------------------------------------------------------


class CheckpointCoordinator:
    def __init__(
        self,
        config: CheckpointConfig,
        tasks: Sequence[SubtaskId],
        sources: Sequence[SubtaskId],
        id_counter: CheckpointIdCounter,
        store: CompletedCheckpointStore,
        clock: Clock,
    ):
        self.config = config
        self.tasks: tuple[SubtaskId, ...] = tuple(dict.fromkeys(tasks))
        self.sources: tuple[SubtaskId, ...] = tuple(dict.fromkeys(sources))
        if not self.sources:
            raise ValueError("a pipeline needs at least one source subtask")
        unknown = set(self.sources) - set(self.tasks)
        if unknown:
            raise ValueError(f"sources {sorted(map(str, unknown))} are not among the tasks")
        self.id_counter = id_counter
        self.store = store
        self.clock = clock
        self.pending: dict[CheckpointId, PendingCheckpoint] = {}
        self.running: set[SubtaskId] = set()
        self.consecutive_failures = 0
        self.last_trigger_time: float | None = None
        self.last_end_time: float | None = None
        self._finished_ids: dict[CheckpointId, CheckpointStatus] = {}  # id -> completed/aborted, bounded

    # task lifecycle ---------------------------------------------------------------------------

    def task_running(self, subtask: SubtaskId) -> None:
        self._check_task(subtask)
        self.running.add(subtask)

    def all_running(self) -> None:
        self.running = set(self.tasks)

    def task_failed(self, subtask: SubtaskId) -> list[Effect]:
        """A subtask failed: it is no longer running and every pending checkpoint is aborted."""
        self._check_task(subtask)
        self.running.discard(subtask)
        return self.abort_all(FailureReason.TASK_FAILURE, f"{subtask} failed")

    @property
    def all_tasks_running(self) -> bool:
        return self.running.issuperset(self.tasks)

    # triggering -------------------------------------------------------------------------------

    def tick(self) -> list[Effect]:
        """Expire timed-out checkpoints, then trigger a periodic one if the policy allows it."""
        effects = self._expire()
        if any(isinstance(e, FailJob) for e in effects):
            return effects
        decision = decide(
            self.config,
            self.clock.now(),
            forced=False,
            all_tasks_running=self.all_tasks_running,
            pending_periodic=sum(1 for p in self.pending.values() if p.kind is CheckpointKind.CHECKPOINT),
            last_trigger_time=self.last_trigger_time,
            last_completion_time=self.last_end_time,
        )
        if decision.verdict is Verdict.EXECUTE:
            effects.append(self._start(CheckpointKind.CHECKPOINT))
        return effects

    def expire(self) -> list[Effect]:
        """Abort pending checkpoints older than the timeout, without triggering a new one."""
        return self._expire()

    def trigger(self, kind: CheckpointKind = CheckpointKind.SAVEPOINT) -> TriggerCheckpoint:
        """A forced trigger: a savepoint or a user's "checkpoint now". Raises when refused."""
        decision = decide(
            self.config,
            self.clock.now(),
            forced=True,
            all_tasks_running=self.all_tasks_running,
            pending_periodic=0,
            last_trigger_time=None,
            last_completion_time=None,
        )
        if decision.verdict is not Verdict.EXECUTE:
            assert decision.reason is not None
            raise CheckpointTriggerError(decision.reason)
        return self._start(kind)

    def next_trigger_time(self) -> float | None:
        """When ``tick`` may next trigger (for schedulers that sleep), None if it may now."""
        decision = decide(
            self.config,
            self.clock.now(),
            forced=False,
            all_tasks_running=True,
            pending_periodic=0,
            last_trigger_time=self.last_trigger_time,
            last_completion_time=self.last_end_time,
        )
        return decision.not_before

    def _start(self, kind: CheckpointKind) -> TriggerCheckpoint:
        now = self.clock.now()
        checkpoint_id = self.id_counter.get_and_increment()
        latest = self.store.latest()
        if latest is not None and checkpoint_id <= latest.checkpoint_id:
            raise CheckpointError(
                f"id counter returned {checkpoint_id}, not above the latest completed checkpoint "
                f"{latest.checkpoint_id}: the counter was not restored"
            )
        self.pending[checkpoint_id] = PendingCheckpoint(checkpoint_id, now, self.tasks, kind)
        self.last_trigger_time = now
        return TriggerCheckpoint(Barrier(checkpoint_id, now, kind), self.sources)

    # acknowledgements -------------------------------------------------------------------------

    def acknowledge(
        self, checkpoint_id: CheckpointId, subtask: SubtaskId, ack: SubtaskAck | None = None
    ) -> AckOutcome:
        """Record ``subtask``'s ack. Never raises for late, duplicate or unknown acks."""
        pending = self.pending.get(checkpoint_id)
        if pending is None:
            return AckOutcome(AckResult.DISCARDED)
        result = pending.acknowledge(subtask, ack or SubtaskAck(), self.clock.now())
        if result is not AckResult.SUCCESS or not pending.fully_acknowledged:
            return AckOutcome(result)
        return AckOutcome(result, tuple(self._complete(pending)))

    def decline(
        self,
        checkpoint_id: CheckpointId,
        subtask: SubtaskId,
        reason: FailureReason = FailureReason.DECLINED,
        message: str = "",
    ) -> list[Effect]:
        """A subtask could not snapshot ``checkpoint_id``: abort it (a late decline is ignored)."""
        if checkpoint_id not in self.pending:
            return []
        # Only drop the separator when there is no message: rstrip(": ") would eat the message's
        # own trailing colons and spaces.
        text = f"declined by {subtask}: {message}" if message else f"declined by {subtask}"
        return self.abort(checkpoint_id, reason, text)

    def abort(self, checkpoint_id: CheckpointId, reason: FailureReason, message: str = "") -> list[Effect]:
        pending = self.pending.pop(checkpoint_id, None)
        if pending is None:
            return []
        pending.abort(reason)
        self._remember(checkpoint_id, CheckpointStatus.ABORTED)
        self.last_end_time = self.clock.now()
        return [CheckpointAborted(checkpoint_id, reason, self.tasks, message), *self._count_failure(reason)]

    def abort_all(self, reason: FailureReason, message: str = "") -> list[Effect]:
        effects: list[Effect] = []
        for checkpoint_id in sorted(self.pending):
            effects.extend(self.abort(checkpoint_id, reason, message))
        return effects

    # checkpoints shared with other processes --------------------------------------------------

    def adopt(
        self,
        checkpoint_id: CheckpointId,
        trigger_time: float,
        kind: CheckpointKind,
        acks: Mapping[SubtaskId, tuple[SubtaskAck, float]] | None = None,
    ) -> list[Effect]:
        """Take over a pending checkpoint another process triggered (a stage running as its own
        process), with the acks it already recorded. A no-op for an id this coordinator knows
        (pending or finished). Returns the completion effects if those acks already complete it."""
        if checkpoint_id in self.pending or checkpoint_id in self._finished_ids:
            return []
        pending = PendingCheckpoint(checkpoint_id, trigger_time, self.tasks, kind)
        self.pending[checkpoint_id] = pending
        if self.last_trigger_time is None or trigger_time > self.last_trigger_time:
            self.last_trigger_time = trigger_time
        for subtask, (ack, when) in sorted((acks or {}).items()):
            pending.acknowledge(subtask, ack, when)
        return self._complete(pending) if pending.fully_acknowledged else []

    def finished_elsewhere(self, checkpoint_id: CheckpointId, status: CheckpointStatus | str, when: float) -> None:
        """Another process completed or aborted ``checkpoint_id``: forget it as pending (it no
        longer counts against max concurrent checkpoints; min pause runs from ``when``)."""
        if status not in (CheckpointStatus.COMPLETED, CheckpointStatus.ABORTED):
            raise ValueError(f"status must be 'completed' or 'aborted', got {status!r}")
        pending = self.pending.pop(checkpoint_id, None)
        if pending is None:
            return
        self._remember(checkpoint_id, CheckpointStatus(status))
        self.last_end_time = max(self.last_end_time or when, when)
        if status == CheckpointStatus.COMPLETED:
            self.consecutive_failures = 0

    def status_of(self, checkpoint_id: CheckpointId) -> str:
        """'pending', 'completed', 'aborted' or 'unknown' (for recently finished ids)."""
        if checkpoint_id in self.pending:
            return CheckpointStatus.PENDING
        return self._finished_ids.get(checkpoint_id, "unknown")

    # internals --------------------------------------------------------------------------------

    def _complete(self, pending: PendingCheckpoint) -> list[Effect]:
        now = self.clock.now()
        completed = pending.complete(now)
        del self.pending[pending.checkpoint_id]
        try:
            evicted = self.store.add(completed)
        except FencedError:
            raise  # a newer attempt took over: this coordinator is a zombie and must stop
        except CheckpointAbortedError as exc:
            # Another process (the snapshot DAG's timeout) aborted it first, durably: its abort
            # won the race and it counted the failure; losing that race is not ours to count.
            self._remember(pending.checkpoint_id, CheckpointStatus.ABORTED)
            self.last_end_time = now
            return [CheckpointAborted(pending.checkpoint_id, exc.reason or FailureReason.DECLINED,
                                      self.tasks, str(exc))]
        except CheckpointAlreadyStoredError as exc:
            # another process of the job completed it first (each process group acknowledges its
            # own subtasks, and the last two may both see every ack): it is complete, not ours to
            # announce; this process still commits its own sinks up to it
            status = CheckpointStatus.COMPLETED if exc.completed else CheckpointStatus.DISCARDED
            self._remember(pending.checkpoint_id, status)
            self.last_end_time = now
            if not exc.completed:
                return []
            self.consecutive_failures = 0
            return [NotifyCheckpointComplete(pending.checkpoint_id, self.tasks)]
        except Exception as exc:  # the store is the adapter's: any failure means "not durable"
            self._remember(pending.checkpoint_id, CheckpointStatus.ABORTED)
            self.last_end_time = now
            reason = FailureReason.FINALIZE_FAILED
            return [
                CheckpointAborted(pending.checkpoint_id, reason, self.tasks, repr(exc)),
                *self._count_failure(reason),
            ]
        self._remember(pending.checkpoint_id, CheckpointStatus.COMPLETED)
        self.consecutive_failures = 0
        self.last_end_time = now
        effects = [CheckpointCompleted(completed)]
        # Subsumption: an older periodic checkpoint can no longer be useful.
        for older_id in sorted(i for i in self.pending if i < completed.checkpoint_id):
            if self.pending[older_id].kind is CheckpointKind.CHECKPOINT:
                effects.extend(self.abort(older_id, FailureReason.SUBSUMED))
        effects.append(NotifyCheckpointComplete(completed.checkpoint_id, self.tasks))
        effects.extend(DiscardCheckpoint(c) for c in evicted)
        return effects

    def _count_failure(self, reason: FailureReason) -> list[Effect]:
        """Count a failed checkpoint; ``FailJob`` once, when the tolerance is first exceeded."""
        if not reason.counts_as_failure:
            return []
        self.consecutive_failures += 1
        if self.consecutive_failures == self.config.tolerable_failed_checkpoints + 1:
            return [FailJob(reason, self.consecutive_failures)]
        return []

    def _expire(self) -> list[Effect]:
        now = self.clock.now()
        effects: list[Effect] = []
        for checkpoint_id in sorted(self.pending):
            if now - self.pending[checkpoint_id].trigger_time >= self.config.timeout:
                effects.extend(self.abort(checkpoint_id, FailureReason.EXPIRED))
        return effects

    def _remember(self, checkpoint_id: CheckpointId, status: CheckpointStatus) -> None:
        self._finished_ids[checkpoint_id] = status
        if len(self._finished_ids) > 1000:
            del self._finished_ids[min(self._finished_ids)]

    def _check_task(self, subtask: SubtaskId) -> None:
        if subtask not in self.tasks:
            raise ValueError(f"{subtask} is not a task of this pipeline")


def effects_of(kind: type, effects: Iterable[Effect]) -> list:
    """The effects of one type, in order: ``effects_of(TriggerCheckpoint, coordinator.tick())``."""
    return [e for e in effects if isinstance(e, kind)]

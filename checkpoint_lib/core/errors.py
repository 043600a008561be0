"""Closed vocabularies and the exceptions of the core."""

from __future__ import annotations

import enum


class AckResult(enum.Enum):
    """How the coordinator classified an acknowledgement. Never an exception: acks race."""

    SUCCESS = "success"
    """First ack of this subtask for a pending checkpoint."""
    DUPLICATE = "duplicate"
    """This subtask had already acknowledged this checkpoint."""
    UNKNOWN = "unknown"
    """The subtask is not one the checkpoint waits for."""
    DISCARDED = "discarded"
    """The checkpoint is no longer pending (completed, aborted, subsumed, or never existed)."""


class FailureReason(enum.Enum):
    """Why a checkpoint was declined, aborted or not triggered. A closed set, as in Flink."""

    # Not triggered; never counted as a failure.
    NOT_ALL_TASKS_RUNNING = "not_all_tasks_running"
    TOO_MANY_CONCURRENT_CHECKPOINTS = "too_many_concurrent_checkpoints"
    MINIMUM_TIME_BETWEEN_CHECKPOINTS = "minimum_time_between_checkpoints"
    COORDINATOR_SHUTDOWN = "coordinator_shutdown"
    # Aborted after triggering.
    SUBSUMED = "subsumed"
    """A newer checkpoint completed first; not a failure."""
    EXPIRED = "expired"
    """The checkpoint timed out before all acks arrived."""
    DECLINED = "declined"
    """A subtask declined the checkpoint (it could not snapshot)."""
    ALIGNMENT_ABANDONED = "alignment_abandoned"
    """A subtask saw a newer barrier before alignment finished; the newer one supersedes it."""
    TASK_FAILURE = "task_failure"
    """A subtask failed while the checkpoint was pending (not counted: the job fails over anyway)."""
    IO_ERROR = "io_error"
    """Writing the snapshot, channel state or metadata failed."""
    FINALIZE_FAILED = "finalize_failed"
    """All acks arrived but the completed checkpoint could not be made durable."""
    USER_ABORT = "user_abort"

    @property
    def counts_as_failure(self) -> bool:
        """Whether this reason counts toward ``tolerable_failed_checkpoints``."""
        return self in _COUNTED


_COUNTED = frozenset(
    {
        FailureReason.EXPIRED,
        FailureReason.DECLINED,
        FailureReason.IO_ERROR,
        FailureReason.FINALIZE_FAILED,
    }
)


class CheckpointError(Exception):
    """Base class of every error the core raises."""


class CorruptStreamError(CheckpointError):
    """A channel delivered something impossible (the same barrier twice, an event after its end)."""


class IllegalTransitionError(CheckpointError):
    """A state machine was asked to do something its current state does not allow."""


class FencedError(CheckpointError):
    """A writer of an older attempt (a zombie) tried to act after a newer attempt fenced it."""


class CheckpointAbortedError(CheckpointError, ValueError):
    """Completing a checkpoint lost the race to its abort (another process, e.g. the snapshot DAG's
    timeout, aborted it first). Exactly one of the two is durable; this side lost, which is not a
    failure of the process that tried to complete it. ``reason`` is the abort's recorded reason."""

    def __init__(self, message: str, reason: "FailureReason | None" = None):
        super().__init__(message)
        self.reason = reason


class CheckpointAlreadyStoredError(CheckpointError, ValueError):
    """Completing a checkpoint found it already stored: another process of the job (a dataflow
    graph's process groups each acknowledge their subtasks) completed it first. ``completed``:
    whether it stands completed (else it was since discarded)."""

    def __init__(self, message: str, completed: bool = True):
        super().__init__(message)
        self.completed = completed


class UnknownCheckpointError(CheckpointError, LookupError):
    """A checkpoint id that the store does not hold as completed."""


class NoCheckpointError(CheckpointError, LookupError):
    """Recovery was asked for, but there is no completed checkpoint to recover from."""


class CommitError(CheckpointError):
    """One or more transactions failed to commit. ``errors`` holds (transaction, exception)."""

    def __init__(self, message: str, errors: list[tuple[object, BaseException]]):
        super().__init__(message)
        self.errors = errors


class TooManyFailedCheckpointsError(CheckpointError):
    """More consecutive checkpoint failures than ``tolerable_failed_checkpoints``: fail the job."""


class SnapshotIncompatibleError(CheckpointError, ValueError):
    """The checkpoint to restore does not fit the pipeline (operators or state changed)."""

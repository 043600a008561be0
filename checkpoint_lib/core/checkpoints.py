"""Pending and completed checkpoints.

A :class:`PendingCheckpoint` collects acknowledgements; when every subtask has acknowledged it,
it turns into an immutable :class:`CompletedCheckpoint` (pending -> completed). It may instead be
aborted with a :class:`~.errors.FailureReason` (declined, expired, subsumed, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from .errors import AckResult, FailureReason, IllegalTransitionError
from .types import CheckpointId, CheckpointKind, CheckpointStatus, SubtaskAck, SubtaskId


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A checkpoint every subtask acknowledged. Its ``acks`` hold the state handles to restore."""

    checkpoint_id: CheckpointId
    kind: CheckpointKind
    trigger_time: float
    completion_time: float
    acks: Mapping[SubtaskId, SubtaskAck]
    ack_times: Mapping[SubtaskId, float] = field(default_factory=dict)

    @property
    def is_savepoint(self) -> bool:
        return self.kind is CheckpointKind.SAVEPOINT

    @property
    def duration(self) -> float:
        return self.completion_time - self.trigger_time

    @property
    def state_size_bytes(self) -> int:
        return sum(a.state_size_bytes for a in self.acks.values())

    @property
    def channel_state_bytes(self) -> int:
        return sum(a.channel_state_bytes for a in self.acks.values())

    @property
    def alignment_ms(self) -> float:
        return max((a.alignment_ms for a in self.acks.values()), default=0.0)

    @property
    def unaligned(self) -> bool:
        return any(a.unaligned for a in self.acks.values())


class PendingCheckpoint:
    """A triggered checkpoint waiting for the acknowledgements of ``tasks``."""

    def __init__(
        self,
        checkpoint_id: CheckpointId,
        trigger_time: float,
        tasks: Iterable[SubtaskId],
        kind: CheckpointKind = CheckpointKind.CHECKPOINT,
    ):
        self.checkpoint_id = checkpoint_id
        self.trigger_time = trigger_time
        self.kind = kind
        self.tasks: frozenset[SubtaskId] = frozenset(tasks)
        if not self.tasks:
            raise ValueError("a checkpoint needs at least one subtask to acknowledge it")
        self.acks: dict[SubtaskId, SubtaskAck] = {}
        self.ack_times: dict[SubtaskId, float] = {}
        self.status = CheckpointStatus.PENDING
        self.failure: FailureReason | None = None

    @property
    def not_yet_acknowledged(self) -> frozenset[SubtaskId]:
        return self.tasks - self.acks.keys()

    @property
    def fully_acknowledged(self) -> bool:
        return not self.not_yet_acknowledged

    def acknowledge(self, subtask: SubtaskId, ack: SubtaskAck, now: float) -> AckResult:
        if self.status is not CheckpointStatus.PENDING:
            return AckResult.DISCARDED
        if subtask not in self.tasks:
            return AckResult.UNKNOWN
        if subtask in self.acks:
            return AckResult.DUPLICATE
        self.acks[subtask] = ack
        self.ack_times[subtask] = now
        return AckResult.SUCCESS

    def complete(self, now: float) -> CompletedCheckpoint:
        if self.status is not CheckpointStatus.PENDING:
            raise IllegalTransitionError(f"checkpoint {self.checkpoint_id} is {self.status.value}")
        if not self.fully_acknowledged:
            missing = ", ".join(sorted(map(str, self.not_yet_acknowledged)))
            raise IllegalTransitionError(
                f"checkpoint {self.checkpoint_id} still waits for acks from {missing}"
            )
        self.status = CheckpointStatus.COMPLETED
        return CompletedCheckpoint(
            checkpoint_id=self.checkpoint_id,
            kind=self.kind,
            trigger_time=self.trigger_time,
            completion_time=now,
            acks=dict(self.acks),
            ack_times=dict(self.ack_times),
        )

    def abort(self, reason: FailureReason) -> None:
        if self.status is not CheckpointStatus.PENDING:
            raise IllegalTransitionError(f"checkpoint {self.checkpoint_id} is {self.status.value}")
        self.status = CheckpointStatus.ABORTED
        self.failure = reason

    def __repr__(self) -> str:
        return (
            f"PendingCheckpoint(id={self.checkpoint_id}, kind={self.kind.value}, "
            f"acked={len(self.acks)}/{len(self.tasks)}, status={self.status.value})"
        )

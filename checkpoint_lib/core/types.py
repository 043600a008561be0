"""Identifiers and small immutable values shared by the whole core."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

CheckpointId = int
"""Checkpoint ids are positive integers that increase strictly, also across restarts."""


SINK_PREFIX = "sink_"
"""A sink's subtasks are the operator ``sink_<name>``: the one definition of that convention."""


def sink_operator(sink: str) -> str:
    """The operator id of sink ``sink``'s subtasks."""
    return SINK_PREFIX + sink


@dataclass(frozen=True, order=True)
class SubtaskId:
    """One parallel instance of an operator: ``SubtaskId("keyed", 2)``."""

    operator: str
    index: int

    @property
    def sink(self) -> str | None:
        """The sink this subtask writes (its operator is :func:`sink_operator` of it), or None."""
        return self.operator[len(SINK_PREFIX):] if self.operator.startswith(SINK_PREFIX) else None

    def __post_init__(self) -> None:
        if not self.operator:
            raise ValueError("SubtaskId.operator must be a non-empty string")
        if self.index < 0:
            raise ValueError(f"SubtaskId.index must be >= 0, got {self.index}")

    def __str__(self) -> str:
        return f"{self.operator}[{self.index}]"


class CheckpointStatus(enum.StrEnum):
    """Where a checkpoint is in its life: pending -> completed or aborted; a completed one may later
    be discarded (retention, a failed validation, a rollback below it). The one vocabulary of
    checkpoint status: the coordinator, the stores, the control plane and the pages all use it.
    Its members are strings, so a status written to a table reads back equal to its member."""

    PENDING = "pending"
    COMPLETED = "completed"
    ABORTED = "aborted"
    DISCARDED = "discarded"


class CheckpointKind(enum.Enum):
    """A checkpoint is the system's; a savepoint is the user's and is never deleted by retention."""

    CHECKPOINT = "checkpoint"
    SAVEPOINT = "savepoint"


class BarrierMode(enum.Enum):
    """How a subtask handles barriers (see BRIEF.md, "Three ways to handle barriers")."""

    ALIGNED = "aligned"
    """Exactly-once: block channels that delivered the barrier until all have."""
    UNALIGNED = "unaligned"
    """Exactly-once: snapshot on the first barrier, log in-flight records as channel state."""
    ALIGNED_WITH_TIMEOUT = "aligned_with_timeout"
    """Start aligned; switch the checkpoint to unaligned when alignment takes too long."""
    AT_LEAST_ONCE = "at_least_once"
    """Never block: count barriers (the tracker). Effects may repeat after recovery."""

    @property
    def exactly_once(self) -> bool:
        return self is not BarrierMode.AT_LEAST_ONCE


MODES: tuple[str, ...] = tuple(m.value for m in BarrierMode)
"""The barrier modes by name, as the CLI, the DAGs' forms and the job scripts take them."""


@dataclass(frozen=True)
class Barrier:
    """A checkpoint barrier, injected at the sources and forwarded by every operator."""

    checkpoint_id: CheckpointId
    timestamp: float
    kind: CheckpointKind = CheckpointKind.CHECKPOINT

    def __post_init__(self) -> None:
        if self.checkpoint_id <= 0:
            raise ValueError(f"checkpoint ids start at 1, got {self.checkpoint_id}")


@dataclass(frozen=True)
class SubtaskAck:
    """What one subtask reports when it acknowledges a checkpoint.

    ``state`` is a small JSON-able handle, stored as it is: in the Spark runtime the dict of one of
    the typed states of :mod:`.acks` (a source offset, a Delta table version and the key groups it
    covers, a sink's pending transactions), built and read through them; the simulator keeps its
    own. The coordinator never looks inside. The numbers feed the checkpoint history.
    """

    state: Mapping[str, Any] = field(default_factory=dict)
    state_size_bytes: int = 0
    channel_state_rows: int = 0
    channel_state_bytes: int = 0
    alignment_ms: float = 0.0
    unaligned: bool = False
    duration_ms: float = 0.0

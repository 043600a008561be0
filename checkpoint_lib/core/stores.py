"""Small storage interfaces the coordinator depends on, with in-memory implementations.

Durable implementations (Delta tables) live in the adapters and pass the same contract tests
(``tests/core/test_store_contract.py``).
"""

from __future__ import annotations

from typing import Protocol, Sequence

from .checkpoints import CompletedCheckpoint
from .errors import UnknownCheckpointError
from .types import CheckpointId


class CheckpointIdCounter(Protocol):
    """Hands out strictly increasing checkpoint ids; a durable one survives restarts."""

    def get_and_increment(self) -> CheckpointId:
        ...

    def peek(self) -> CheckpointId:
        """The id the next ``get_and_increment`` will return."""
        ...


class CompletedCheckpointStore(Protocol):
    """A bounded LIFO of completed checkpoints plus every savepoint."""

    def add(self, checkpoint: CompletedCheckpoint) -> list[CompletedCheckpoint]:
        """Store ``checkpoint``; return the checkpoints retention evicted (to discard)."""
        ...

    def all(self) -> Sequence[CompletedCheckpoint]:
        """Every retained checkpoint, oldest first."""
        ...

    def latest(self) -> CompletedCheckpoint | None:
        ...

    def get(self, checkpoint_id: CheckpointId) -> CompletedCheckpoint:
        ...


class InMemoryCheckpointIdCounter:
    def __init__(self, start: CheckpointId = 1):
        if start < 1:
            raise ValueError("checkpoint ids start at 1")
        self._next = start

    def get_and_increment(self) -> CheckpointId:
        value = self._next
        self._next += 1
        return value

    def peek(self) -> CheckpointId:
        return self._next


def apply_retention(
    checkpoints: Sequence[CompletedCheckpoint], retained: int
) -> tuple[list[CompletedCheckpoint], list[CompletedCheckpoint]]:
    """Split ``checkpoints`` (oldest first) into (kept, evicted).

    Keeps the newest ``retained`` non-savepoint checkpoints and every savepoint: savepoints are
    the user's, and retention never deletes them.
    """
    if retained < 1:
        raise ValueError("retained must be >= 1")
    regular = [c for c in checkpoints if not c.is_savepoint]
    evicted_ids = {c.checkpoint_id for c in regular[:-retained]}
    kept = [c for c in checkpoints if c.checkpoint_id not in evicted_ids]
    evicted = [c for c in checkpoints if c.checkpoint_id in evicted_ids]
    return kept, evicted


class InMemoryCompletedCheckpointStore:
    def __init__(self, retained: int = 3):
        if retained < 1:
            raise ValueError("retained must be >= 1")
        self.retained = retained
        self._checkpoints: list[CompletedCheckpoint] = []

    def add(self, checkpoint: CompletedCheckpoint) -> list[CompletedCheckpoint]:
        if any(c.checkpoint_id == checkpoint.checkpoint_id for c in self._checkpoints):
            raise ValueError(f"checkpoint {checkpoint.checkpoint_id} is already stored")
        # A savepoint may complete after a newer checkpoint: keep the list ordered by id.
        ordered = sorted([*self._checkpoints, checkpoint], key=lambda c: c.checkpoint_id)
        self._checkpoints, evicted = apply_retention(ordered, self.retained)
        return evicted

    def all(self) -> Sequence[CompletedCheckpoint]:
        return tuple(self._checkpoints)

    def latest(self) -> CompletedCheckpoint | None:
        return self._checkpoints[-1] if self._checkpoints else None

    def get(self, checkpoint_id: CheckpointId) -> CompletedCheckpoint:
        for c in self._checkpoints:
            if c.checkpoint_id == checkpoint_id:
                return c
        raise UnknownCheckpointError(
            f"checkpoint {checkpoint_id} is not a retained completed checkpoint "
            f"(retained: {[c.checkpoint_id for c in self._checkpoints]})"
        )

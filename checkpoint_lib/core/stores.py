"""Small storage interfaces of the control plane, one per role: the two the coordinator depends on
(with in-memory implementations) and those of the durable control plane (epochs, acknowledgements
of pending checkpoints, stage sessions, validation verdicts).

Durable implementations (Delta tables) live in the adapters and pass the contract tests of
``tests/core/test_store_contract.py`` on a local folder and on an object store.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

from .checkpoints import CompletedCheckpoint
from .errors import CheckpointAlreadyStoredError, UnknownCheckpointError
from .types import CheckpointId, SubtaskAck, SubtaskId


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


class EpochStore(Protocol):
    """Attempts of a pipeline: strictly increasing epochs; beginning one fences every older one."""

    def current(self) -> int:
        """The newest epoch begun (0 before the first)."""
        ...

    def begin(self, owner: str | None = None, reason: str = "") -> int:
        """Begin the next epoch and return it, every older one fenced from then on."""
        ...

    def check(self, epoch: int) -> None:
        """Raise :class:`~checkpoint_lib.core.errors.FencedError` if a newer epoch began."""
        ...

    def all(self) -> list[dict[str, Any]]:
        """Every epoch (``epoch``, ``started_at``, ``owner``, ``reason``), newest first."""
        ...


class AckStore(Protocol):
    """Acknowledgements of pending checkpoints, durable as they arrive (stages in several processes)."""

    def record(self, checkpoint_id: CheckpointId, acks: Mapping[SubtaskId, SubtaskAck], epoch: int,
               ack_time: float | None = None) -> None:
        ...

    def pending(self, checkpoint_id: CheckpointId, epoch: int) -> dict[SubtaskId, tuple[SubtaskAck, float]]:
        """What ``epoch`` acknowledged for ``checkpoint_id``: the first ack per subtask, with its time."""
        ...


class SessionStore(Protocol):
    """Runs of each stage within an epoch (at most one live), where the next resumes, restores and
    rollbacks."""

    def of_epoch(self, epoch: int) -> list[dict[str, Any]]:
        ...

    def record_restored(self, epoch: int, checkpoint_id: CheckpointId | None, resume: Mapping[str, Any]) -> None:
        ...

    def begin(self, epoch: int, stage: str, after: int | None = None) -> int | None:
        """The next session's number, or None when one is live or (``after``) another started since."""
        ...

    def end(self, epoch: int, stage: str, session: int, resume: Mapping[str, Any]) -> None:
        ...

    def record_rollback(self, epoch: int, checkpoint_id: CheckpointId) -> None:
        ...

    def owed_rollback(self) -> CheckpointId | None:
        """The target of a rollback no epoch at or after it finished restoring."""
        ...


class ValidationVerdicts(Protocol):
    """The per-checkpoint validation gate: exactly one verdict stands per completed checkpoint."""

    def validated(self, checkpoint_id: CheckpointId) -> bool:
        ...

    def record(self, checkpoint_id: CheckpointId, passed: bool, message: str | None = None,
               epoch: int | None = None) -> bool:
        """True when this verdict stands; False (nothing written) when the other one won."""
        ...


class TransactionStore(Protocol):
    """A sink's pre-committed transactions: what each wrote, durable before the checkpoint
    completes, so that a commit adds exactly those files (or refuses, naming one that is gone), an
    abort deletes exactly them, and a recovery finds every transaction that wrote anything."""

    def begin_write(self, txns: Sequence[Any]) -> str:
        """Before a write: each transaction's record and the intent; returns where to write."""
        ...

    def seal_write(self, write_dir: str, txns: Sequence[Any]) -> int:
        """After it: each transaction's manifest of its files; returns the rows written."""
        ...

    def transactions(self) -> list[Any]:
        """Every transaction that began to write and was not forgotten."""
        ...

    def lost(self, txns: Sequence[Any]) -> list[str]:
        """The files ``txns`` wrote that are gone."""
        ...

    def forget(self, txns: Sequence[Any], *, delete_data: bool) -> None:
        """Drop their records (and, with ``delete_data``, their files). Idempotent."""
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
            raise CheckpointAlreadyStoredError(f"checkpoint {checkpoint.checkpoint_id} is already stored")
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

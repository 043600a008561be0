"""What the retained checkpoints still need, and the interface of a store whose old rows may go.

Pure: maintenance (``checkpoint_lib.maintenance``) reads the facts, each store says from them which
of its rows it keeps, and nothing here touches a table.

What the retained checkpoints need (:class:`Needs`)
---------------------------------------------------
- **retained**: the completed checkpoints a reader keeps (no retention of its own: exactly what the
  writers recorded), so every savepoint, and a checkpoint that retention evicted but a crash left
  unmarked.
- **protected ids**: the retained ones, every pending one, every unreadable completed one (a
  recovery rolls the sinks back below it and discards it), the checkpoint the newest finished
  restore restored (the after-restore suite reads its acks and pinned state), the target of an owed
  rollback (:class:`Restores`), and the largest id ever written (the id counter starts above it).
- **the floor**: the oldest retained regular checkpoint (savepoints excluded: one kept for ever must
  not pin everything after it), lowered to the oldest pending one and to the largest id. Only ids
  below the floor that are not protected are :meth:`Needs.droppable`: each is aborted or discarded,
  at least one newer checkpoint completed after it, so no live process writes it again.

A store maintenance prunes (:class:`PrunedStore`)
-------------------------------------------------
Maintenance reads one snapshot of the store's table, asks the store which of its rows to keep
(:meth:`PrunedStore.rows_to_keep`, told a :class:`Retention`), and overwrites the table with them
exactly on top of that snapshot, or reads and asks again when anyone committed in between.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from .checkpoints import CompletedCheckpoint
from .types import CheckpointKind, CheckpointStatus


@dataclass(frozen=True)
class Restores:
    """What the sessions say retention must keep: the newest finished restore and an owed rollback."""

    restored: int | None = None
    """The checkpoint the newest finished restore restored (None: none, or from scratch)."""
    restored_epoch: int | None = None
    restored_at: float | None = None
    owed_rollback: int | None = None
    """The checkpoint of a rollback no later restore finished (None: none owed)."""


@dataclass
class Needs:
    """What the retained checkpoints and savepoints (and the live pipeline) still need."""

    retained: list[int] = field(default_factory=list)
    savepoints: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    corrupt: list[int] = field(default_factory=list)
    restored: int | None = None
    """The checkpoint the newest finished restore restored (None: none, or from scratch)."""
    restored_epoch: int | None = None
    restored_at: float | None = None
    owed_rollback: int | None = None
    max_id: int = 0
    floor: int = 0
    protected: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, kept: Sequence[CompletedCheckpoint], statuses: Mapping[int, str], corrupt: Iterable[int] = (),
           restores: Restores = Restores()) -> "Needs":
        """The needs of the checkpoints ``kept`` (the retained ones, oldest first) among every id
        with a status (``statuses``: id -> its status), ``corrupt`` (completed, unreadable) and
        ``restores``."""
        needs = cls(restored=restores.restored, restored_epoch=restores.restored_epoch,
                    restored_at=restores.restored_at, owed_rollback=restores.owed_rollback)
        needs.retained = [c.checkpoint_id for c in kept]
        needs.savepoints = [c.checkpoint_id for c in kept if c.kind is CheckpointKind.SAVEPOINT]
        needs.pending = sorted(i for i, status in statuses.items() if status == CheckpointStatus.PENDING)
        needs.corrupt = sorted(corrupt)
        needs.max_id = max(statuses, default=0)
        regular = [c.checkpoint_id for c in kept if c.kind is not CheckpointKind.SAVEPOINT]
        candidates = [min(regular, default=None), min(needs.pending, default=None), needs.max_id or None]
        needs.floor = min((c for c in candidates if c is not None), default=0)
        needs.protected = {*needs.retained, *needs.pending, *needs.corrupt, needs.max_id}
        needs.protected |= {i for i in (needs.restored, needs.owed_rollback) if i}
        return needs

    @property
    def restores(self) -> Restores:
        return Restores(self.restored, self.restored_epoch, self.restored_at, self.owed_rollback)

    def droppable(self, checkpoint_id: int | None) -> bool:
        """Whether nothing needs what belongs to ``checkpoint_id`` any more."""
        return checkpoint_id is not None and checkpoint_id < self.floor and checkpoint_id not in self.protected

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["protected"] = sorted(self.protected)
        return d


class Retention:
    """What maintenance tells a store when it asks which rows to keep.

    ``restores``: the newest finished restore and an owed rollback, as maintenance began.
    :attr:`needs` and :attr:`statuses` (each checkpoint id's status) come from the latest
    checkpoints, read by ``checkpoints()`` when a store first asks for either: a store that decides
    from its own rows reads nothing. Rows that name no checkpoint are kept ``result_days`` back from
    ``now`` (:attr:`results_since`)."""

    def __init__(self, restores: Restores, checkpoints: Callable[[], tuple[Needs, Mapping[int, str]]], *,
                 now: float, result_days: float):
        self.restores = restores
        self.now = now
        self.result_days = result_days
        self._checkpoints = checkpoints
        self._read: tuple[Needs, Mapping[int, str]] | None = None

    def _latest(self) -> tuple[Needs, Mapping[int, str]]:
        if self._read is None:
            self._read = self._checkpoints()
        return self._read

    @property
    def needs(self) -> Needs:
        return self._latest()[0]

    @property
    def statuses(self) -> Mapping[int, str]:
        return self._latest()[1]

    @property
    def results_since(self) -> float:
        return self.now - self.result_days * 86400


@runtime_checkable
class PrunedStore(Protocol):
    """A store whose table maintenance rewrites to the rows it says it keeps."""

    @property
    def name(self) -> str:
        """Its table's name (the report's rule is ``<name> rows``)."""
        ...

    def load(self) -> Any:
        """The latest snapshot of its table (None: the table was never created)."""
        ...

    def rows_at(self, snapshot: Any) -> list[dict[str, Any]]:
        """Every row of ``snapshot``."""
        ...

    def rows_to_keep(self, snapshot: Any, rows: Sequence[dict[str, Any]], retention: Retention) -> list[dict[str, Any]]:
        """The rows of ``snapshot`` (``rows``) anyone may still read, given ``retention``."""
        ...

    def keeps(self, retention: Retention) -> str:
        """What :meth:`rows_to_keep` keeps, in words (the report's)."""
        ...

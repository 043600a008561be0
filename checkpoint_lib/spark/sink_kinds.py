"""What every kind of sink shares: the writer's protocol (:class:`SinkWriter`), what its factory is
given (:class:`SinkSite`), the registry of kinds (:func:`register_sink`, :func:`sink_writer`) and
the errors a sink reports about its configuration. A kind of sink is one file that imports this
module (``spark/sinks.py``: Delta; ``spark/postgres_sink.py``: PostgreSQL), and ``spark/sinks.py``
builds a pipeline's sinks of every kind (``pipeline_sinks``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

from ..core.twophase import Transaction
from ..killpoints import KillPoints
from ..kinds import Kinds

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class SinkWriter(Protocol):
    """One logical sink of a pipeline (every subtask of it shares it), as the runtime uses it;
    the transactions' bookkeeping is the core's (:mod:`checkpoint_lib.core.twophase`).

    - :meth:`create`: the target and the sink's own folders, if missing (idempotent);
    - :meth:`stage`: write ``rows`` (a DataFrame with :data:`~checkpoint_lib.delta.pending.HANDLE_COLUMN`
      naming each row's transaction, one of ``handles``) durably into those open transactions, as
      flush ``flush``: nothing visible in the target;
    - :meth:`commit`: make ``txns`` (every subtask's, up to ``checkpoint_id``) visible in the
      target, idempotently (a repeated commit is a no-op) and fenced inside the commit itself (a
      writer of an epoch older than the sink's fence is refused with ``FencedError``); returns
      the ones it committed;
    - :meth:`discard`: forget ``txns`` once committed (and delete what they wrote that the target
      does not hold); :meth:`abort`: delete what ``txns`` wrote and forget them, never a file the
      target refers to (one committed before a crash kept it from being forgotten); both idempotent;
    - :meth:`fence`: from now on refuse every commit of an older epoch (recovery, before restoring);
    - :meth:`uncommitted` / :meth:`is_committed`: which transactions the target does not hold yet;
    - :meth:`lost`: why ``txns`` (not committed yet) can never be committed, or None: what they
      wrote is gone (a VACUUM with a retention shorter than the downtime): a recovery then
      restores an older checkpoint instead;
    - :meth:`rollback_version` / :meth:`rollback_to`: the target as checkpoint ``checkpoint_id``
      committed it (for a rollback to an older checkpoint or savepoint);
    - :meth:`open_transactions`: every transaction with files or bookkeeping left (recovery
      aborts those no checkpoint owns).

    Optional: ``pre_commit(handles, checkpoint_id)``, called at the barrier of ``checkpoint_id``
    before the subtasks' transactions ``handles`` (subtask -> transaction) are pre-committed: what
    the sink must make durable and committable then (a database's ``PREPARE TRANSACTION``). A writer
    that has it also gets ``stage(..., barrier=checkpoint_id)`` for a flush that barrier follows
    before any other flush of those transactions, so that it may write and pre-commit at once.
    ``fences_first_epoch = True``: :meth:`fence` is called at a warehouse's first epoch too (a
    target outside the warehouse, whose fence another warehouse may hold: refused at the start).
    """

    name: str

    def create(self) -> None: ...

    def stage(self, rows: DataFrame, handles: dict[int, Transaction], flush: int) -> None: ...

    def commit(self, txns: list[Transaction], checkpoint_id: int, writer_epoch: int) -> list[Transaction]: ...

    def abort(self, txns: Iterable[Transaction]) -> None: ...

    def discard(self, txns: Iterable[Transaction]) -> None: ...

    def fence(self, epoch: int) -> None: ...

    def uncommitted(self, txns: Iterable[Transaction]) -> list[Transaction]: ...

    def is_committed(self, txn: Transaction) -> bool: ...

    def lost(self, txns: Iterable[Transaction]) -> str | None: ...

    def rollback_version(self, checkpoint_id: int) -> int | None: ...

    def rollback_to(self, checkpoint_id: int) -> int | None: ...

    def open_transactions(self) -> list[Transaction]: ...


@dataclass(frozen=True)
class SinkSite:
    """Where a sink writes and for whom: what a writer's factory gets. ``spark`` is None for the
    readers that need only the control plane (the commit stamps, the rollback version)."""

    spark: SparkSession | None
    name: str  # the sink's name in the pipeline
    location: str  # the declaration's path in the warehouse
    transactions: str  # the sink's bookkeeping folder under the checkpoint root
    app_prefix: str  # what the pipeline's Delta application ids start with
    check_epoch: Callable[[int], None] | None = None
    parallelism: int | None = None  # the sink's subtasks (its vertex's)
    kill_points: KillPoints | None = None  # the process's (checkpoint_lib.killpoints)
    pending_checkpoints: int = 1  # how many checkpoints may be pending at once (max_concurrent)
    sinks: tuple[tuple[str, Any, int], ...] = ()
    """Every sink of the pipeline, this one included, as (name, declaration, parallelism): what a
    sink that shares a resource with others sizes it by (the PostgreSQL sinks on one server share
    its prepared transactions)."""


_KINDS: Kinds[SinkWriter] = Kinds("sink", "writer", "checkpoint_lib.spark.sinks.register_sink")
register_sink = _KINDS.register
"""``register_sink(declaration type, factory)``: sinks declared as instances of that type (or of a
subclass with none of its own) are run by ``factory(declaration, SinkSite)``."""


def sink_writer(declaration: Any, site: SinkSite) -> SinkWriter:
    return _KINDS.build(declaration, site, f"sink {site.name!r}")


class SinkConfigurationError(ValueError):
    """A sink table is configured against the commit protocol (see
    :meth:`DeltaTwoPhaseSink.check_configuration`)."""


class RollbackUnavailableError(SinkConfigurationError):
    """A sink can no longer be rolled back to what an older checkpoint committed: the commits of
    its log back to that point were deleted (log retention) or that version's files vacuumed."""

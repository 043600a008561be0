"""Two-phase-commit sink bookkeeping (Flink's ``TwoPhaseCommitSinkFunction``, without the I/O).

Lifecycle of one sink subtask:

1. Records are written inside :attr:`TwoPhaseCommitSink.current`.
2. At the barrier of checkpoint ``c`` the adapter calls :meth:`~TwoPhaseCommitSink.pre_commit`:
   it gets back the transaction to flush (so that a later commit cannot fail for lack of data),
   the pending transactions now include it under ``c``, a new current transaction begins, and the
   :class:`SinkSnapshot` to store in the subtask's acknowledgement.
3. When ``c`` completes: :func:`commit_up_to` commits every pending transaction with id <= c of
   every subtask of each sink (late or skipped notifications are subsumed), tries them all and
   raises the first error in a :class:`~.errors.CommitError`. Commit must be idempotent. The
   Spark runtime and the simulator both commit through it.
4. An aborted checkpoint leaves its transaction pending: the next completed checkpoint owns it.
5. On recovery, :func:`recover` lists what to re-commit (the restored snapshot's pending
   transactions) and what to abort (its current transaction and every other open one).

Transaction ids come from a :class:`TransactionIdPool`; an epoch (the attempt number, bumped by
every recovery) is stored with every transaction; the adapters fence zombie writers with it (the
checkpoint store's epoch fence, the sinks' commit stamps).
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from .errors import CommitError, IllegalTransitionError
from .types import CheckpointId


_HANDLE = re.compile(r"^(?P<txn_id>.+)\.e(?P<epoch>\d+)\.s(?P<seq>\d+)$")  # Transaction.handle


@dataclass(frozen=True, order=True)
class Transaction:
    """A sink transaction. ``handle`` is unique; ``txn_id`` is a pool slot reused over time."""

    seq: int
    txn_id: str
    epoch: int
    checkpoint_id: CheckpointId | None = None
    """The checkpoint whose barrier pre-committed it (None while open)."""

    @property
    def handle(self) -> str:
        return f"{self.txn_id}.e{self.epoch}.s{self.seq}"

    @classmethod
    def from_handle(cls, handle: str) -> Transaction:
        """The open transaction whose :attr:`handle` is ``handle``; ValueError for anything else."""
        m = _HANDLE.match(handle)
        if not m:
            raise ValueError(f"not a transaction handle: {handle!r}")
        return cls(int(m["seq"]), m["txn_id"], int(m["epoch"]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "txn_id": self.txn_id,
            "epoch": self.epoch,
            "checkpoint_id": self.checkpoint_id,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Transaction":
        return cls(int(d["seq"]), str(d["txn_id"]), int(d["epoch"]), d.get("checkpoint_id"))


class TransactionIdPool:
    """Transaction ids ``{prefix}-{subtask}-{slot}`` for ``slot`` in ``0 .. size-1``.

    A sink subtask never has more than ``size`` transactions open or pending at once (current +
    pending <= max concurrent checkpoints + 1), so the pool is finite and recovery can fence every
    id of it, as Flink's Kafka sink does.
    """

    def __init__(self, prefix: str, subtask_index: int, size: int = 8):
        if not prefix or any(c in prefix for c in "/\\ \t\n"):
            raise ValueError(f"transaction id prefix must be a non-empty word, got {prefix!r}")
        if size < 2:
            raise ValueError(f"the pool needs at least 2 ids (current + one pending), got {size}")
        self.prefix = prefix
        self.subtask_index = subtask_index
        self.size = size

    @classmethod
    def of_sink(cls, pipeline: str, sink: str, subtask_index: int, max_concurrent: int) -> "TransactionIdPool":
        """The pool of sink ``sink``'s subtask ``subtask_index`` in pipeline (or graph) ``pipeline``
        with up to ``max_concurrent`` checkpoints pending: the one definition both runners use
        (ids ``<pipeline>.<sink>-<subtask>-<slot>``, at least 4 slots, 3 beyond the pending ones)."""
        return cls(f"{pipeline}.{sink}", subtask_index, size=max(4, max_concurrent + 3))

    def ids(self) -> list[str]:
        return [self._id(slot) for slot in range(self.size)]

    def _id(self, slot: int) -> str:
        return f"{self.prefix}-{self.subtask_index}-{slot}"

    def acquire(self, seq: int, in_use: Iterable[str]) -> str:
        """The id for transaction number ``seq``: its natural slot, or the next free one."""
        busy = set(in_use)
        for k in range(self.size):
            candidate = self._id((seq + k) % self.size)
            if candidate not in busy:
                return candidate
        raise IllegalTransitionError(
            f"all {self.size} transaction ids of {self.prefix}-{self.subtask_index} are in use: "
            "too many pending checkpoints for the pool size"
        )


@dataclass(frozen=True)
class SinkSnapshot:
    """What a 2PC sink subtask stores in its checkpoint: (current, pending)."""

    current: Transaction
    pending: tuple[Transaction, ...]
    next_seq: int

    @property
    def owned(self) -> tuple[Transaction, ...]:
        """What the checkpoint this snapshot belongs to owns: its pending transactions, each
        pre-committed at that checkpoint or an earlier one (a later notification subsumes earlier
        ones). A recovery to the checkpoint re-commits them, and nothing else of the sink. The one
        definition, for the runtime, the control plane and the simulator."""
        return self.pending

    def to_dict(self) -> dict[str, Any]:
        return {
            "current": self.current.to_dict(),
            "pending": [t.to_dict() for t in self.pending],
            "next_seq": self.next_seq,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SinkSnapshot":
        return cls(
            Transaction.from_dict(d["current"]),
            tuple(Transaction.from_dict(t) for t in d["pending"]),
            int(d["next_seq"]),
        )


@dataclass(frozen=True)
class PreCommit:
    """Flush ``transaction`` durably, then acknowledge with ``snapshot``."""

    transaction: Transaction
    snapshot: SinkSnapshot


class TwoPhaseCommitSink:
    """The bookkeeping of one sink subtask. The adapter does the writing, flushing and committing."""

    def __init__(self, pool: TransactionIdPool, epoch: int, *, next_seq: int = 0):
        self.pool = pool
        self.epoch = epoch
        self._next_seq = next_seq
        self.pending: dict[CheckpointId, Transaction] = {}
        self._last_pre_committed: CheckpointId | None = None
        self.current = self._begin()

    def _begin(self, also_in_use: Iterable[str] = ()) -> Transaction:
        in_use = [*(t.txn_id for t in self.pending.values()), *also_in_use]
        seq = self._next_seq
        txn = Transaction(seq, self.pool.acquire(seq, in_use), self.epoch)
        self._next_seq += 1  # only once acquired: a refused begin changes nothing
        return txn

    def pre_commit(self, checkpoint_id: CheckpointId) -> PreCommit:
        # Compare with the last pre-committed id, not just the pending ones: those may have been
        # committed already, and a stale or repeated barrier must still be refused.
        last = self._last_pre_committed
        if last is not None and checkpoint_id <= last:
            raise IllegalTransitionError(
                f"pre-commit for checkpoint {checkpoint_id} after checkpoint {last}"
            )
        txn = Transaction(self.current.seq, self.current.txn_id, self.current.epoch, checkpoint_id)
        # Begin the next transaction before changing anything: if the pool is exhausted the sink
        # stays as it was (its current transaction is not also left pending).
        next_current = self._begin(also_in_use=[txn.txn_id])
        self.pending[checkpoint_id] = txn
        self.current = next_current
        self._last_pre_committed = checkpoint_id
        return PreCommit(txn, self.snapshot())

    def snapshot(self) -> SinkSnapshot:
        return SinkSnapshot(self.current, tuple(self.pending[c] for c in sorted(self.pending)), self._next_seq)

    def committable(self, checkpoint_id: CheckpointId) -> list[Transaction]:
        return [self.pending[c] for c in sorted(self.pending) if c <= checkpoint_id]

    def commit_up_to(
        self, checkpoint_id: CheckpointId, commit: Callable[[Transaction], None]
    ) -> list[Transaction]:
        """Commit every pending transaction with id <= ``checkpoint_id``, oldest first.

        Tries them all; committed ones leave ``pending``; if any failed, raises a
        :class:`CommitError` naming the first failure (the rest are in ``errors``). The rule is
        :func:`commit_up_to`'s, for a sink of this one subtask committing one transaction at a time.
        """
        return commit_up_to({None: [self]}, checkpoint_id, lambda _, txns: commit_all(txns, commit)).get(None, [])

    def resume_state(self) -> dict[str, Any]:
        """Everything needed to continue this sink in a later process of the same epoch (a stage
        that stopped cleanly): the snapshot plus the last pre-committed checkpoint."""
        return {**self.snapshot().to_dict(), "last_pre_committed": self._last_pre_committed}

    @classmethod
    def resumed(cls, state: Mapping[str, Any], pool: TransactionIdPool) -> "TwoPhaseCommitSink":
        """The inverse of :meth:`resume_state`: same epoch, same open and pending transactions."""
        snap = SinkSnapshot.from_dict(state)
        sink = cls.__new__(cls)
        sink.pool = pool
        sink.epoch = snap.current.epoch
        sink._next_seq = snap.next_seq
        sink.pending = {t.checkpoint_id: t for t in snap.pending if t.checkpoint_id is not None}
        last = state.get("last_pre_committed")
        sink._last_pre_committed = None if last is None else int(last)
        sink.current = snap.current
        return sink

    @classmethod
    def restored(cls, snapshot: SinkSnapshot, pool: TransactionIdPool, epoch: int) -> "TwoPhaseCommitSink":
        """A sink resuming after recovery: nothing pending (recovery re-committed it), a fresh
        transaction in the new epoch, sequence numbers continuing after the snapshot's."""
        return cls(pool, epoch, next_seq=snapshot.next_seq)


def commit_all(
    transactions: Iterable[Transaction],
    commit: Callable[[Transaction], None],
    pending: dict[CheckpointId, Transaction] | None = None,
) -> list[Transaction]:
    """Commit ``transactions`` in order, trying all; raise the first error after the last try."""
    done: list[Transaction] = []
    errors: list[tuple[object, BaseException]] = []
    for txn in transactions:
        try:
            commit(txn)
        except Exception as exc:  # every failure is reported; none stops the others
            errors.append((txn, exc))
            continue
        done.append(txn)
        if pending is not None and txn.checkpoint_id is not None:
            pending.pop(txn.checkpoint_id, None)
    if errors:
        first_txn, first = errors[0]
        raise CommitError(
            f"{len(errors)} of {len(errors) + len(done)} commits failed; first: "
            f"{getattr(first_txn, 'handle', first_txn)}: {first!r}",
            errors,
        ) from first
    return done


K = TypeVar("K")


def commit_up_to(
    sinks: Mapping[K, Sequence[TwoPhaseCommitSink]],
    checkpoint_id: CheckpointId,
    commit: Callable[[K, list[Transaction]], object],
    after: Callable[[K, list[Transaction]], None] | None = None,
) -> dict[K, list[Transaction]]:
    """Checkpoint ``checkpoint_id`` is complete: commit, for each sink of ``sinks`` (its subtasks'
    bookkeeping), every pending transaction with an id <= ``checkpoint_id`` (a late or skipped
    notification is subsumed by a later one), oldest checkpoint first, in ONE call
    ``commit(sink, transactions)`` (an engine may make them visible in one transaction; it must
    be idempotent: a recovery or a repeated notification commits them again). Committed
    transactions leave their subtask's ``pending``, then ``after(sink, transactions)`` runs (a
    failure there, a kill, propagates at once). Every sink is tried; a failure leaves that sink's
    transactions pending (a :class:`CommitError` from ``commit`` names the ones that failed: the
    others leave) and, after the last sink, the first failure is raised as a :class:`CommitError`.

    The Spark runtime's completion and the simulator both commit through this: what the property
    tests check is what commits users' data."""
    done: dict[K, list[Transaction]] = {}
    errors: list[tuple[object, BaseException]] = []
    tried = 0
    for key, subtasks in sinks.items():
        txns = sorted((t for book in subtasks for t in book.committable(checkpoint_id)),
                      key=lambda t: (t.checkpoint_id, t.handle))
        if not txns:
            continue
        tried += len(txns)
        try:
            commit(key, txns)
        except CommitError as exc:
            failed = {id(t) for t, _ in exc.errors}
            errors += exc.errors
            committed = [t for t in txns if id(t) not in failed]
        except Exception as exc:  # noqa: BLE001 - reported after every sink was tried
            errors += [(t, exc) for t in txns]
            committed = []
        else:
            committed = txns
        for book in subtasks:
            for t in committed:
                if book.pending.get(t.checkpoint_id) == t:
                    del book.pending[t.checkpoint_id]
        if committed:
            done[key] = committed
            if after is not None:
                after(key, committed)
    if errors:
        first_txn, first = errors[0]
        raise CommitError(
            f"{len(errors)} of {tried} commits failed; first: "
            f"{getattr(first_txn, 'handle', first_txn)}: {first!r}",
            errors,
        ) from first
    return done


@dataclass(frozen=True)
class SinkRecovery:
    """What recovering one sink subtask must do before it writes again."""

    recommit: tuple[Transaction, ...]
    abort: tuple[Transaction, ...]


def recover(snapshot: SinkSnapshot | None, open_transactions: Iterable[Transaction]) -> SinkRecovery:
    """Re-commit what the restored snapshot owns; abort everything else that is still open.

    ``open_transactions`` are those the adapter found staged but not committed (from any epoch).
    """
    recommit = snapshot.owned if snapshot else ()
    owned = {t.handle for t in recommit}
    abort = {t.handle: t for t in open_transactions if t.handle not in owned}
    if snapshot is not None and snapshot.current.handle not in owned:
        abort.setdefault(snapshot.current.handle, snapshot.current)
    return SinkRecovery(recommit, tuple(sorted(abort.values())))

"""The sinks attached to one vertex of a running graph, and their subtasks' transactions.

A vertex's sink has the vertex's parallelism: subtask ``i`` of the vertex stages its rows into
transaction ``i`` of the sink (:data:`~checkpoint_lib.reserved.SINK_SUBTASK` says whose each row
is), pre-commits it at a checkpoint and hands it over for the commit after the checkpoint
completes (:func:`checkpoint_lib.core.twophase.commit_up_to`, run by the graph runner on every
vertex's books at once).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from pyspark.sql import DataFrame

from ...core.acks import SinkAckState
from ...core.twophase import SinkSnapshot, TransactionIdPool, TwoPhaseCommitSink
from ...core.types import SubtaskAck, SubtaskId, sink_operator


class VertexSinks:
    """Sinks ``writers`` (name -> (SinkWriter, the vertex output it writes)) of a vertex of
    ``parallelism`` subtasks; ``pool(sink, subtask)`` gives a subtask's transaction ids."""

    def __init__(self, writers: Mapping[str, tuple[Any, str]], parallelism: int,
                 pool: Callable[[str, int], TransactionIdPool]):
        self.writers = {name: w for name, (w, _) in writers.items()}
        self.outputs = {name: output for name, (_, output) in writers.items()}
        self.P, self.pool = parallelism, pool
        self.ids = {name: [SubtaskId(sink_operator(name), i) for i in range(parallelism)] for name in writers}
        self.books: dict[str, list[TwoPhaseCommitSink]] = {}

    def __bool__(self) -> bool:
        return bool(self.writers)

    def fresh(self, epoch: int) -> None:
        """New transactions for every subtask (a start from scratch)."""
        self.books = {name: [TwoPhaseCommitSink(self.pool(name, i), epoch) for i in range(self.P)]
                      for name in self.writers}

    def restored(self, snapshots: Mapping[str, list[SinkSnapshot | None]], epoch: int) -> None:
        """Transactions continuing, in ``epoch``, from each subtask's snapshot (None: a subtask the
        checkpoint did not have starts afresh)."""
        self.books = {
            name: [TwoPhaseCommitSink(self.pool(name, i), epoch) if snap is None
                   else TwoPhaseCommitSink.restored(snap, self.pool(name, i), epoch)
                   for i, snap in enumerate(snapshots.get(name, [None] * self.P))]
            for name in self.writers
        }

    def snapshots_in(self, acks: Mapping[SubtaskId, Any]) -> dict[str, list[SinkSnapshot | None]]:
        """Each subtask's sink snapshot in a checkpoint's ``acks`` (None: not in it)."""
        return {name: [SinkAckState.from_state(acks[sid].state).snapshot if sid in acks else None for sid in ids]
                for name, ids in self.ids.items()}

    def resume_state(self) -> dict[str, list[dict[str, Any]]]:
        return {name: [b.resume_state() for b in books] for name, books in self.books.items()}

    def resumed(self, states: Mapping[str, list[Mapping[str, Any]]]) -> None:
        self.books = {name: [TwoPhaseCommitSink.resumed(s, self.pool(name, i)) for i, s in enumerate(states[name])]
                      for name in self.writers}

    def stage(self, outputs: Mapping[str, DataFrame], flush: int, what: str,
              subtasks: list[int] | None = None, *, barrier: int | None = None) -> None:
        """Write the step's rows of each sink (its output of ``outputs``) into the open transaction
        of each of ``subtasks`` (None: every subtask), whose rows they are: nothing visible in the
        target. ``barrier``: the checkpoint whose barrier follows this flush before any other flush
        of these transactions (the chained step that ends with it), told to a writer with a
        pre-commit of its own (it may write this flush and pre-commit at once)."""
        missing = sorted({o for o in self.outputs.values() if o not in outputs})
        if missing:
            raise ValueError(f"{what} returned no DataFrame for {missing} (its sinks write them)")
        subtasks = range(self.P) if subtasks is None else subtasks
        for name, writer in self.writers.items():
            handles = {r: self.books[name][r].current for r in subtasks}
            if barrier is not None and hasattr(writer, "pre_commit"):
                writer.stage(outputs[self.outputs[name]], handles, flush, barrier=barrier)
            else:
                writer.stage(outputs[self.outputs[name]], handles, flush)

    def acks(self, checkpoint_id: int, subtasks: list[int] | None = None) -> dict[SubtaskId, SubtaskAck]:
        """Each sink subtask's snapshot of ``checkpoint_id`` (of ``subtasks``; None: every one): its
        transaction pre-committed. A writer with a pre-commit of its own (a database's prepared
        transaction) makes the open transactions durable first: a failure there leaves the books
        as they were."""
        subtasks = range(self.P) if subtasks is None else subtasks
        for name, writer in self.writers.items():
            pre_commit = getattr(writer, "pre_commit", None)
            if pre_commit is not None:
                pre_commit({r: self.books[name][r].current for r in subtasks}, checkpoint_id)
        return {self.ids[name][r]: SubtaskAck(state=SinkAckState(books[r].pre_commit(checkpoint_id).snapshot).to_state())
                for name, books in self.books.items() for r in subtasks}

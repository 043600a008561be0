"""Completion: what a process does with the coordinator's effects, and the commit of the sinks.

A checkpoint completes in whichever process writes its last acknowledgement. Then (validated
first, for a pipeline that validates its checkpoints) every sink commits its transactions up to
it, one Delta commit per sink and checkpoint, and forgets what it committed at once (so a recovery
never sees a committed transaction as open); now and then the clean-up truncates the channel data
no retained checkpoint needs. An aborted checkpoint
is recorded (a completion that won the race stands) and the keyed subtasks drop it.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from ..core.acks import KeyedAckState, SourceAckState
from ..core.coordinator import (
    CheckpointAborted,
    CheckpointCompleted,
    DiscardCheckpoint,
    FailJob,
    NotifyCheckpointComplete,
)
from ..core.errors import TooManyFailedCheckpointsError
from ..core.types import CheckpointKind, CheckpointStatus
from ..core.twophase import Transaction
from ..delta import log as delta_log
from .context import RunContext

TRUNCATE_EVERY = 5
"""Completions between two clean-ups (every truncation of a channel log is a Delta commit)."""


class KeyedView(Protocol):
    """What completion needs of the keyed stage of its process."""

    cursor: int
    fcursor: int
    executing: int

    def abort(self, checkpoint_id: int) -> None: ...

    def commit_up_to(self, checkpoint_id: int, commit: Callable[[str, list[Transaction]], object],
                     after: Callable[[str, list[Transaction]], None]) -> None: ...

    def lowest_unconsumed(self) -> tuple[float, float]: ...


def adopt(store: Any, coordinator: Any, cid: int, epoch: int) -> list:
    """Make ``coordinator`` know checkpoint ``cid``, which another process triggered (its barrier
    arrived on a channel log), with the acks already recorded; the completion effects if those
    complete it. One it knows, or that is no longer pending in ``epoch``, is left alone (its barrier
    is still processed; the acks are then discarded). One definition for both runners."""
    if coordinator.status_of(cid) != "unknown":
        return []
    row = store.checkpoints.status(cid)
    if row is None or row["status"] != CheckpointStatus.PENDING or row["epoch"] != epoch:
        return []
    acks = store.acks.pending(cid, epoch)
    return coordinator.adopt(cid, row["trigger_time"], CheckpointKind(row["kind"]), acks)


def record_aborted(store: Any, e: CheckpointAborted, epoch: int) -> bool:
    """Make the coordinator's abort of ``e.checkpoint_id`` durable (fenced by ``epoch``). False:
    it completed first (elsewhere), and completion wins: one definition for both runners."""
    try:
        store.checkpoints.record_aborted(e.checkpoint_id, e.reason, e.message, epoch, fence=epoch)
    except ValueError:
        return False
    return True


def too_many_failed(e: FailJob) -> TooManyFailedCheckpointsError:
    """The error that stops a run when the coordinator fails the job (too many failed checkpoints in a row)."""
    return TooManyFailedCheckpointsError(f"{e.consecutive_failures} consecutive checkpoints failed "
                                         f"(last: {e.reason.value})")


class Completion:
    def __init__(self, ctx: RunContext, *, validate_checkpoints: bool, keyed: KeyedView, runs_keyed: bool):
        self.ctx = ctx
        self.validate_checkpoints = validate_checkpoints
        self.keyed = keyed  # the process's keyed stage: it holds the sink transactions, and its positions
        self.runs_keyed = runs_keyed  # whether its subtasks run here (an abort reaches them)
        self.reset()

    def reset(self) -> None:
        """A new process: nothing completed or owed yet."""
        self.completions = 0
        self.last_completed: int | None = None
        self.cleanup_due = False
        self._truncated: tuple[int | None, int] | None = None  # (channel log version, position) after the last truncation

    def on_effects(self, effects: Any) -> None:
        ctx = self.ctx
        for e in effects:
            if isinstance(e, CheckpointCompleted):
                ctx.reached("complete")
                c = e.checkpoint
                ctx.summary.completed.append(c.checkpoint_id)
                ctx.metrics.checkpoint_completed(c)
                source = SourceAckState.from_state(c.acks[ctx.topology.sources[0]].state)
                ctx.progress(
                    f"checkpoint {c.checkpoint_id} completed in {c.duration * 1000:.0f} ms "
                    f"(source version {source.version}, "
                    f"{ctx.summary.rows_in} rows read)"
                )
            elif isinstance(e, NotifyCheckpointComplete):
                if self.validate_checkpoints:
                    self._validate_before_commit(e.checkpoint_id)
                self._commit_up_to(e.checkpoint_id)
            elif isinstance(e, CheckpointAborted):
                if not record_aborted(ctx.store, e, ctx.epoch):  # the keyed stage (another process) completed it first
                    ctx.progress(f"checkpoint {e.checkpoint_id} completed elsewhere before it expired here")
                    continue
                ctx.summary.aborted.append((e.checkpoint_id, e.reason.value))
                ctx.metrics.checkpoint_failed(e.reason.value)
                if self.runs_keyed:
                    self.keyed.abort(e.checkpoint_id)
                ctx.progress(f"checkpoint {e.checkpoint_id} aborted: {e.reason.value} {e.message}".rstrip())
            elif isinstance(e, DiscardCheckpoint):
                pass  # state versions stay until VACUUM; the store marks it discarded
            elif isinstance(e, FailJob):
                raise too_many_failed(e)

    def _validate_before_commit(self, cid: int) -> None:
        """The per-checkpoint GX suite on ``cid`` (durable, not committed yet), and its verdict
        recorded (:meth:`~checkpoint_lib.delta.verdicts.DeltaValidationVerdicts.record`):
        nothing commits ``cid`` before it is validated - not this process, the snapshot DAG's
        commit task or a recovery. A failure (or a validation that cannot run) discards ``cid``
        and stops the run: its transactions never commit, the next start restores the last
        checkpoint that passed. A verdict that lost to another attempt's follows theirs."""
        from ..quality import validate_before_commit

        ctx = self.ctx
        validate_before_commit(ctx.spark, ctx.pipeline.name, ctx.topology.warehouse, ctx.store, cid, ctx.progress,
                               epoch=ctx.epoch, kill_point=ctx.reached)

    def _commit_up_to(self, cid: int) -> None:
        """Checkpoint ``cid`` is complete: commit every sink's transactions up to it (one Delta
        commit per sink, through the core's rule :func:`~checkpoint_lib.core.twophase.commit_up_to`,
        which the keyed stage runs on its bookkeeping) and forget them, then now and then clean up."""
        ctx = self.ctx
        ctx.reached("commit")
        sinks = ctx.topology.sinks

        def committed(name: str, txns: list) -> None:
            ctx.reached("sink_commit")  # this sink committed, the next ones not yet
            sinks[name].discard(txns)

        self.keyed.commit_up_to(cid, lambda name, txns: sinks[name].commit(txns, cid, ctx.epoch), after=committed)
        self.completions += 1
        self.last_completed = cid
        if self.completions % TRUNCATE_EVERY == 0:  # every truncation is a Delta commit: batch them
            self.cleanup_due = True
        self.cleanup_if_due()

    def cleanup_if_due(self) -> None:
        """Run the owed clean-up, unless the keyed stage is carrying out effects (it runs it when
        it is done: a checkpoint completes at its last ack, while deliveries, channel state and
        held records of that very step still point into the channel logs)."""
        if self.cleanup_due and not self.keyed.executing:
            self.cleanup()

    def cleanup(self) -> None:
        """Delete the channel data that is consumed for good: at or before the latest completed
        checkpoint's barriers, read by the keyed stage (the cursors), and not pointed at by anything still in memory (deliveries not flushed, channel
        state of a checkpoint still logging, records an aligning handler holds). Idempotent."""
        ctx, t = self.ctx, self.ctx.topology
        self.cleanup_due = False
        if self.last_completed is None:
            return
        source_in_use, feedback_in_use = self.keyed.lowest_unconsumed()
        upto = min(self.keyed.cursor, self._barrier_seq(self.last_completed), source_in_use - 1)
        truncation = (delta_log.latest_version(t.channel.path), upto)
        if truncation != self._truncated:  # the log moved, or more of it is consumed (chained: never)
            t.channel.truncate_upto(upto, ctx.epoch)
            self._truncated = (delta_log.latest_version(t.channel.path), upto)
        if t.feedback_log is not None:
            acks = ctx.store.checkpoints.get(self.last_completed).acks
            operator = ctx.pipeline.operator_uid
            keyed = [KeyedAckState.from_state(a.state) for s, a in acks.items() if s.operator == operator]
            fb = [k.feedback_barrier_seq for k in keyed if k.feedback_barrier_seq is not None]
            if len(fb) == t.P:
                t.feedback_log.truncate_upto(min(self.keyed.fcursor, *fb, feedback_in_use - 1), ctx.epoch)
        self.last_completed = None

    def _barrier_seq(self, cid: int) -> int:
        source = self.ctx.store.checkpoints.get(cid).acks[self.ctx.topology.sources[0]]
        return SourceAckState.from_state(source.state).barrier_seq

"""Recovery: where a process's stages resume, or a new attempt that restores a checkpoint.

A stage resumes in the current epoch where its last session ended cleanly (:meth:`Recovery.resume_points`).
Otherwise the process recovers (:meth:`Recovery.recover`): it begins a new epoch (the fence of the
control plane), raises the data plane's fence on every sink and the state table, aborts what older
epochs left pending, plans the recovery (the latest or a chosen completed checkpoint; a validating
pipeline's must be validated; an older one rolls the sinks back), restores the state, re-commits
the sink transactions the checkpoint owns and aborts the others, cuts the channel logs, replays the
channel state, and publishes every stage's starting point. Each step is idempotent, so a kill
anywhere in it leaves a recovery that the next start completes.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from typing import Any

from ..core.acks import KeyedAckState, KeyedPosition, SinkAckState, SourceAckState, SourcePosition
from ..core.errors import FailureReason, SnapshotIncompatibleError
from ..core.recovery import RecoveryPlan, check_fits
from ..core.twophase import SinkSnapshot, Transaction
from ..delta.pending import PendingFilesLostError
from ..delta.sessions import resume_of
from .context import RunContext


class Recovery:
    def __init__(self, ctx: RunContext, *, stages: tuple[str, ...], parallelism: dict[str, int], source: Any,
                 keyed: Any, restore_checkpoint: int | None, allow_non_restored_state: bool,
                 validate_checkpoints: bool):
        self.ctx = ctx
        self.t = ctx.topology
        self.stages = stages  # the stages this process runs
        self.parallelism = parallelism
        self.source, self.keyed = source, keyed  # the stages: each applies the position a restore gives it
        self.restore_checkpoint = restore_checkpoint
        self.allow_non_restored_state = allow_non_restored_state
        self.validate_checkpoints = validate_checkpoints
        self._resumes_after: dict[str, int] = {}  # per stage: the session its resume point ended

    def resumes_after(self, stage: str) -> int:
        """The session whose end ``stage`` resumes from (0: the restore)."""
        return self._resumes_after[stage]

    def fence_data_plane(self) -> None:
        """A recovery's first act on the data, before it reads or rolls back anything: raise this
        epoch's fence on every table an older attempt could still write with effect (each sink and
        the keyed state). From each fence commit on, Delta refuses a write of an older epoch inside
        its own commit (its idempotent-write version is below the fence), however long that writer
        stalled after its last check. The channel logs need none: their deletes are scoped to the
        writer's epoch and older, their readers read only their own epoch's rows. The first epoch
        has no older attempt to fence out (a racing first start is a newer epoch, and fences it)."""
        if self.ctx.epoch > 1:
            for sink in self.t.sinks.values():
                sink.fence(self.ctx.epoch)
            if self.t.state is not None:
                self.t.state.fence(self.ctx.epoch)
        self.ctx.reached("fence")

    def resume_points(self, epoch: int) -> dict[str, dict[str, Any]] | None:
        """Where each of this runner's stages resumes in ``epoch``, or None if it must recover."""
        if epoch < 1:
            return None
        rows = self.ctx.store.sessions.of_epoch(epoch)
        points: dict[str, dict[str, Any]] = {}
        for stage in self.stages:
            resume = resume_of(rows, stage)
            if resume.why == "unclean":
                self.ctx.progress(f"the last {stage} process of epoch {epoch} did not stop cleanly: recovering")
            if resume.point is None:
                return None
            points[stage] = resume.point
            self._resumes_after[stage] = resume.after
        now = self.parallelism
        for stage, point in points.items():
            was = point.get("parallelism", now)
            if was != now:
                self.ctx.progress(rescale_message(stage, was, now, self.ctx.pipeline.parallelism_origin))
                return None
        keyed = points.get("keyed")
        if keyed is not None and self.t.state is not None and keyed["state_version"] != self.t.state.version():
            self.ctx.progress(
                f"the state table moved past where the keyed stage stopped (version "
                f"{self.t.state.version()} != {keyed['state_version']}): recovering"
            )
            return None
        return points

    def recover(self) -> RecoveryPlan:
        """Begin a new epoch and restore the latest (or the chosen) completed checkpoint."""
        started = time.monotonic()
        self.ctx.store.check_readable()  # a damaged control table: refused before anything is written
        stage = "all" if len(self.stages) > 1 else self.stages[0]
        self.ctx.epoch = self.ctx.store.epochs.begin(f"{socket.gethostname()}:{os.getpid()}", f"recover ({stage})")
        self.fence_data_plane()
        self._abort_stale_pending()
        open_txns = [t for sink in self.t.sinks.values() for t in sink.open_transactions()]
        for cid in self.ctx.store.checkpoints.unreadable():  # completed, so maybe committed, but not restorable
            self.ctx.progress(f"checkpoint {cid} completed but its record is unreadable: it cannot be restored")
        # (an owed rollback is one an earlier recovery began and a crash interrupted)
        plan = self.ctx.store.recovery_plan(self.restore_checkpoint, current_epoch=self.ctx.epoch - 1, open_transactions=open_txns)
        plan = self._validated(plan, open_txns)
        plan = self._committable(plan, open_txns)
        if plan.checkpoint is not None:
            self._check_compatible(plan)
        if plan.rollback_after is not None:  # refused here, before anything is discarded or restored
            for sink in self.t.sinks.values():
                sink.rollback_version(plan.rollback_after)
        self.ctx.reached("recover")
        if plan.rollback_after is not None:
            self._rollback(plan.rollback_after)
        source, keyed = self._restore(plan)
        self.source.restore(source)
        self.keyed.restore(keyed)
        if plan.checkpoint:
            self.keyed.replay_channel_state(plan)
        resume = {"source": self.source.point(self.parallelism), "keyed": self.keyed.point(self.parallelism)}
        self.ctx.store.sessions.record_restored(self.ctx.epoch, plan.checkpoint_id, resume)
        self.ctx.summary.restored = plan.checkpoint_id
        self.ctx.metrics.recovered(time.monotonic() - started)
        if plan.checkpoint:
            self.ctx.progress(f"restored checkpoint {plan.checkpoint_id} as epoch {self.ctx.epoch}")
        else:
            self.ctx.progress(f"no completed checkpoint: starting from scratch as epoch {self.ctx.epoch}")
        return plan

    def _validated(self, plan: RecoveryPlan, open_txns: list[Transaction]) -> RecoveryPlan:
        """A validating pipeline restores and re-commits only a validated checkpoint. One that
        completed but was never validated (its process died in between) is validated now, before
        anything is written; if it fails it is discarded and the previous one is planned instead,
        with a rollback of the sinks to what that one committed (a no-op unless a run without
        validation committed the failed one). A checkpoint the user chose must pass."""
        from ..quality import QualityCheckError, validate_before_commit

        fell_back = False
        while self.validate_checkpoints and plan.checkpoint is not None and not self.ctx.store.verdicts.validated(plan.checkpoint_id):
            self.ctx.progress(f"checkpoint {plan.checkpoint_id} completed but was never validated: validating it first")
            try:
                validate_before_commit(self.ctx.spark, self.ctx.pipeline.name, self.t.warehouse, self.ctx.store,
                                       plan.checkpoint_id, self.ctx.progress, epoch=self.ctx.epoch)
            except QualityCheckError:
                if self.restore_checkpoint is not None:
                    raise
                plan = self.ctx.store.recovery_plan(None, current_epoch=self.ctx.epoch - 1, open_transactions=open_txns)
                fell_back = True
        if fell_back and plan.rollback_after is None:
            plan = dataclasses.replace(plan, rollback_after=plan.checkpoint_id or 0)
        return plan

    def _committable(self, plan: RecoveryPlan, open_txns: list[Transaction]) -> RecoveryPlan:
        """A checkpoint whose transactions can never be committed (a sink says what they wrote is
        gone: a VACUUM with a retention shorter than the downtime after a crash between completion
        and commit) is not restored: the newest older one is, with a rollback of every sink to what
        it committed (``_rollback`` then discards the lost one with the later ones), and the replay
        writes the lost records again. A checkpoint the user chose is refused, naming why."""
        while plan.checkpoint is not None:
            why = next((w for name, sink in self.t.sinks.items()
                        if (owned := plan.recommit_of(name)) and (w := sink.lost(owned))), None)
            if why is None:
                return plan
            cid = plan.checkpoint_id
            if self.restore_checkpoint is not None:
                raise PendingFilesLostError(f"checkpoint {cid} cannot be restored: {why}. Nothing was written. "
                                            "Restore an older checkpoint (ckpt recover --checkpoint N).")
            older = [c.checkpoint_id for c in self.ctx.store.checkpoints.all() if c.checkpoint_id < cid]
            self.ctx.progress(f"checkpoint {cid} can never be committed ({why}): restoring "
                              + (f"checkpoint {max(older)}" if older else "from scratch") + " and replaying it")
            if not older:
                return RecoveryPlan(None, self.ctx.epoch, {}, (), orphans=tuple(sorted(set(open_txns))),
                                    rollback_after=0)
            plan = self.ctx.store.recovery_plan(max(older), current_epoch=self.ctx.epoch - 1,
                                                open_transactions=open_txns)
        return plan

    def _rollback(self, cid: int) -> None:
        """Restoring ``cid``, older than the latest completed checkpoint: what later checkpoints
        committed would be committed again by the replay, so (1) record the intent, (2) discard
        every later checkpoint (savepoints included: their commits are undone), (3) roll every
        sink back to what ``cid`` committed. A crash anywhere in between leaves the rollback owed
        (no restored row yet): the next recovery completes it, and (3) is idempotent until then."""
        self.ctx.store.sessions.record_rollback(self.ctx.epoch, cid)
        later = [c for c in self.ctx.store.checkpoints.all() if c.checkpoint_id > cid]
        why = f"rolled back to checkpoint {cid} by epoch {self.ctx.epoch}"
        if later:
            self.ctx.store.checkpoints.mark_discarded(later, why, epoch=self.ctx.epoch)
        unreadable = [i for i in self.ctx.store.checkpoints.unreadable() if i > cid]
        if unreadable:
            self.ctx.store.checkpoints.discard_unreadable(unreadable, f"{why} (its record was unreadable)",
                                                          epoch=self.ctx.epoch)
        self.ctx.reached("rollback")
        for name, sink in self.t.sinks.items():
            version = sink.rollback_to(cid)
            if version is not None:
                self.ctx.progress(f"sink {name}: rolled back to version {version} (what checkpoint {cid} committed)")
        self.ctx.progress(f"discarded checkpoints {sorted([c.checkpoint_id for c in later] + unreadable)} (after {cid})")

    def _abort_stale_pending(self) -> None:
        abort_stale_pending(self.ctx.store, self.ctx.epoch)

    def _check_compatible(self, plan: RecoveryPlan) -> None:
        """The snapshot must fit the pipeline (:func:`core.recovery.check_fits`)."""
        assert plan.checkpoint is not None
        p = self.ctx.pipeline
        try:
            changes = check_fits(plan.checkpoint, self.t.tasks, keyed_operator=p.operator_uid,
                                 max_parallelism=p.max_parallelism, partitioning=p.partitioning,
                                 allow_non_restored_state=self.allow_non_restored_state)
        except SnapshotIncompatibleError as exc:
            raise SnapshotIncompatibleError(str(exc).replace("the pipeline", f"pipeline {p.name!r}", 1)) from None
        rescaled = [c for c in changes if "new operator" not in c]
        if rescaled:
            self.ctx.progress(f"rescaling from checkpoint {plan.checkpoint_id}: {', '.join(rescaled)}")

    def _restore(self, plan: RecoveryPlan) -> tuple[SourcePosition, KeyedPosition]:
        """Carry out the recovery plan on the data (every stage), and return where each stage goes on
        from (its channel state not replayed yet: that needs the keyed stage at its position)."""
        acks = plan.checkpoint.acks if plan.checkpoint else {}
        source = SourcePosition()  # from scratch, unless a checkpoint says where
        if plan.checkpoint:
            source = SourceAckState.from_state(acks[self.t.sources[0]].state).position
        cursor = source.next_seq - 1
        # Everything the old attempt wrote after the cut is rewritten by this one.
        # (Deletes of the channel logs touch this epoch's and older rows only; readers read their
        # own epoch's: a stalled older attempt cannot delete or add anything this one reads.)
        self.t.channel.truncate_after(cursor, self.ctx.epoch)
        if self.t.feedback_log is not None:
            # What was in flight on the feedback edge at the checkpoint is in the receivers' state
            # or channel state; what came after it is sent again by the replay.
            self.t.feedback_log.clear(self.ctx.epoch)
        operator = self.ctx.pipeline.operator_uid
        if self.t.state is None:
            pass  # a stateless operator: its position is the channel cursor, nothing else
        elif pinned := [KeyedAckState.from_state(a.state).pinned for s, a in acks.items() if s.operator == operator]:
            # the snapshot's own subtasks (any parallelism): together they cover every key group
            self.t.state.restore(pinned, epoch=self.ctx.epoch)
        else:  # nothing to restore, or a new operator (uid not in the snapshot): it starts empty
            self.t.state.clear(epoch=self.ctx.epoch)
        self.ctx.reached("restore")
        # Sinks: re-commit what the checkpoint owns (a no-op for what was committed) and forget it,
        # then abort every other transaction that wrote something (never a file a table refers to).
        for name, sink in self.t.sinks.items():
            owned = plan.recommit_of(name)
            if owned:
                sink.commit(owned, int(plan.checkpoint_id), self.ctx.epoch)
                self.ctx.reached("restore")  # between two sinks' re-commits
            sink.discard(owned)
            sink.abort(plan.abort)
        # Bookkeeping resumes in the new epoch, from each sink subtask's snapshot.
        sinks: dict[str, tuple[SinkSnapshot | None, ...]] = {
            name: tuple(SinkAckState.from_state(acks[sid].state).snapshot if sid in acks else None
                        for sid in self.t.sink_ids[name])
            for name in self.t.sinks
        }
        state_version = self.t.state.version() if self.t.state is not None else -1
        return source, KeyedPosition(cursor, state_version, sinks)


def abort_stale_pending(store: Any, epoch: int) -> None:
    """Pending checkpoints of epochs older than ``epoch`` can never complete (their writers are
    fenced): recorded aborted (a recovery's, after its fences)."""
    for row in store.checkpoints.pending():
        if row["epoch"] < epoch:
            try:
                store.checkpoints.record_aborted(
                    row["checkpoint_id"], FailureReason.TASK_FAILURE,
                    f"epoch {row['epoch']} ended before it completed", row["epoch"], fence=epoch,
                )
            except ValueError:
                pass  # completed meanwhile by its (now fenced) epoch: the completed row wins


def rescale_message(stage: str, was: dict[str, int], now: dict[str, int], origin: str | None) -> str:
    """Why a start rescales: the parallelism ``stage`` stopped at, the one now and where that comes
    from (``origin``, e.g. ``--parallelism 4``; None: the pipeline's declaration), and how to keep
    the old one."""
    order = sorted({*was, *now}, key=lambda k: (k != "source", k))  # the sources first, as the records flow

    def shown(p: dict[str, int]) -> str:
        return ", ".join(f"{k} {p[k]}" for k in order if k in p)

    source = f"from {origin}" if origin else "as the pipeline declares it"
    keep = " ".join(f"--{'parallelism' if k == 'operator' else 'source-parallelism'} {was[k]}"
                    for k in order if k in was and now.get(k) != was[k])
    return (f"parallelism changed: the {stage} stage stopped at {shown(was)}, now {shown(now)} ({source}); "
            f"recovering to rescale the latest checkpoint (to keep the earlier parallelism, run with {keep})")

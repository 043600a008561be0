"""Recovery of a running graph: where its process resumes, or a new attempt that restores a
checkpoint vertex by vertex.

A graph's process resumes in the current epoch where its last session ended cleanly
(:meth:`GraphRecovery.resume_point`). Otherwise it recovers (:meth:`GraphRecovery.recover`), as the
linear pipeline's :mod:`.recovery` does, per vertex: a new epoch; the data plane's fence raised on
every sink and every operator's state table (an older attempt's write is then refused inside its
own commit); what older epochs left pending aborted; the plan (the latest or a chosen completed
checkpoint; an older one rolls the sinks back and discards the later ones); the snapshot checked
against the graph (operators matched by uid: a new one starts empty, a removed one needs
``allow_non_restored_state``, a changed key or state schema is refused naming the operator; any
parallelism: keyed state is split by key group); every operator's state restored from its
subtasks' pinned versions; what the checkpoint owns re-committed and every other transaction
aborted; the sources going on from their offsets. Each step is idempotent: a kill anywhere leaves
a recovery the next start completes.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import Any

from pyspark.sql import types as T

from ..core.acks import KeyedAckState, SourceAckState, SourcePosition
from ..core.errors import FailureReason, SnapshotIncompatibleError
from ..core.recovery import RecoveryPlan, check_fits
from ..core.twophase import Transaction
from ..core.types import SubtaskId
from ..delta import log as delta_log
from ..delta.pending import PendingFilesLostError
from ..delta.sessions import resume_of


class GraphRecovery:
    def __init__(self, runner: Any):
        self.r = runner
        self.resumes_after = 0  # the session whose end the process resumes from (0: the restore)

    def resume_point(self, epoch: int) -> dict[str, Any] | None:
        """Where the graph's process resumes in ``epoch``, or None if it must recover."""
        r = self.r
        if epoch < 1:
            return None
        resume = resume_of(r.store.sessions.of_epoch(epoch), r.stage)  # this process's group
        if resume.why == "unclean":
            r.progress(f"the last process of {r.noun} ({r._what}) in epoch {epoch} did not stop cleanly: "
                       "recovering")
        if resume.why == "layout":
            r.progress(f"{r.noun} ran in another layout in epoch {epoch} (no point for {r._what}): recovering")
        if resume.point is None:
            return None
        if not {"offsets", "state_versions", "flushes", "sinks"} <= set(resume.point):
            r.progress(f"the last process of {r.noun} ({r._what}) in epoch {epoch} stopped before the graph runtime "
                       "ran it (another resume point): recovering")
            return None
        point, self.resumes_after = resume.point, resume.after
        was = point.get("parallelism", r.parallelism)
        if was != r.parallelism:
            r.progress(r.rescale_message(was, r.parallelism))
            return None
        for uid, op in r._members(r.operators):  # another group's tables move while it runs
            version = point["state_versions"].get(uid, -1)
            if op.state is not None and version != op.state.version():
                r.progress(f"the state table of {uid!r} moved past where the graph stopped (version "
                           f"{op.state.version()} != {version}): recovering")
                return None
        return point

    def recover(self) -> RecoveryPlan:
        """Begin a new epoch and restore the latest (or the chosen) completed checkpoint."""
        r = self.r
        r.store.check_readable()
        r.epoch = r.store.epochs.begin(f"{socket.gethostname()}:{os.getpid()}", f"recover (graph {r.graph.name})")
        # the data plane's fence, before anything is read or rolled back (at a warehouse's first epoch
        # only where another warehouse may have fenced the target: a sink outside the warehouse)
        for writer in r.writers.values():
            if r.epoch > 1 or getattr(writer, "fences_first_epoch", False):
                writer.fence(r.epoch)
        if r.epoch > 1:
            for op in r.operators.values():
                if op.state is not None:
                    op.state.fence(r.epoch)
        r.reached("fence")
        abort_stale_pending(r.store, r.epoch)
        open_txns = [t for w in r.writers.values() for t in w.open_transactions()]
        for cid in r.store.checkpoints.unreadable():  # completed, so maybe committed, but not restorable
            r.progress(f"checkpoint {cid} completed but its record is unreadable: it cannot be restored")
        # (an owed rollback is one an earlier recovery began and a crash interrupted)
        plan = r.store.recovery_plan(r.restore_checkpoint, current_epoch=r.epoch - 1, open_transactions=open_txns)
        plan = self._validated(plan, open_txns)
        plan = self._committable(plan, open_txns)
        if plan.checkpoint is not None:
            self._check_compatible(plan)
        if plan.rollback_after is not None:  # refused here, before anything is discarded or restored
            for writer in r.writers.values():
                writer.rollback_version(plan.rollback_after)
        r.reached("recover")
        if plan.rollback_after is not None:
            self._rollback(plan.rollback_after)
        self._restore(plan)
        # where every process group goes on from: this process restored every vertex (a full restart)
        r.store.sessions.record_restored(r.epoch, plan.checkpoint_id, {g.name: r.point(g.name) for g in r.job.groups})
        r.summary.restored = plan.checkpoint_id
        if plan.checkpoint:
            r.progress(f"restored checkpoint {plan.checkpoint_id} as epoch {r.epoch}")
        else:
            r.progress(f"no completed checkpoint: starting from scratch as epoch {r.epoch}")
        return plan

    def _check_compatible(self, plan: RecoveryPlan) -> None:
        """The snapshot must fit the graph (:func:`~checkpoint_lib.core.recovery.check_fits`, every
        keyed operator), and each operator's state table must still have its key and its columns."""
        r = self.r
        keyed = [uid for uid, op in r.operators.items() if op.state is not None]
        try:
            changes = check_fits(plan.checkpoint, r.tasks, keyed_operator=keyed,
                                 max_parallelism=r.graph.max_parallelism, partitioning="hash",
                                 allow_non_restored_state=r.allow_non_restored_state)
        except SnapshotIncompatibleError as exc:
            raise SnapshotIncompatibleError(str(exc).replace("the pipeline", r.noun, 1)) from None
        problems = []
        for uid in keyed:
            pinned = self._pinned(plan, uid)
            if not pinned:
                continue
            state = r.operators[uid].state
            snapshotted = T.StructType.fromJson(delta_log.schema_json_at(state.path, pinned[0].table_version))
            have = {f.name: f.dataType.simpleString() for f in snapshotted.fields}
            want = {f.name: f.dataType.simpleString() for f in state.schema.fields}
            if have != want:
                problems.append(f"operator {uid!r}: its state was snapshotted as {shown(have)}, the graph now "
                                f"declares {shown(want)} (a changed key or state schema: give the operator a new "
                                "uid to start it empty, with allow_non_restored_state to drop the old state)")
        if problems:
            raise SnapshotIncompatibleError(f"checkpoint {plan.checkpoint_id} does not fit {r.noun}:\n  - "
                                            + "\n  - ".join(problems))
        rescaled = [c for c in changes if "new operator" not in c]
        if rescaled:
            r.progress(f"rescaling from checkpoint {plan.checkpoint_id}: {', '.join(rescaled)}")

    @staticmethod
    def _pinned(plan: RecoveryPlan, uid: str) -> list:
        acks = plan.checkpoint.acks if plan.checkpoint else {}
        return [p for s, a in acks.items() if s.operator == uid
                and (p := KeyedAckState.from_state(a.state).pinned) is not None]

    def _validated(self, plan: RecoveryPlan, open_txns: list[Transaction]) -> RecoveryPlan:
        """A validating pipeline restores and re-commits only a validated checkpoint. One that
        completed but was never validated (its process died in between) is validated now, before
        anything is written; if it fails it is discarded and the previous one is planned instead,
        with a rollback of the sinks to what that one committed (a no-op unless a run without
        validation committed the failed one). A checkpoint the user chose must pass."""
        r = self.r
        if not r.validate_checkpoints:
            return plan
        from ..quality import QualityCheckError, validate_before_commit

        fell_back = False
        while plan.checkpoint is not None and not r.store.verdicts.validated(plan.checkpoint_id):
            r.progress(f"checkpoint {plan.checkpoint_id} completed but was never validated: validating it first")
            try:
                validate_before_commit(r.spark, r.graph.name, r.warehouse, r.store, plan.checkpoint_id, r.progress,
                                       epoch=r.epoch)
            except QualityCheckError:
                if r.restore_checkpoint is not None:
                    raise
                plan = r.store.recovery_plan(None, current_epoch=r.epoch - 1, open_transactions=open_txns)
                fell_back = True
        if fell_back and plan.rollback_after is None:
            plan = dataclasses.replace(plan, rollback_after=plan.checkpoint_id or 0)
        return plan

    def _committable(self, plan: RecoveryPlan, open_txns: list[Transaction]) -> RecoveryPlan:
        """A checkpoint whose transactions can never be committed (a sink says what they wrote is
        gone: a VACUUM with a retention shorter than the downtime after a crash between completion
        and commit) is not restored: the newest older one is, with a rollback of every sink to what
        it committed (:meth:`_rollback` then discards the lost one with the later ones), and the
        replay writes the lost records again. A checkpoint the user chose is refused, naming why."""
        r = self.r
        while plan.checkpoint is not None:
            why = next((w for name, writer in r.writers.items()
                        if (owned := plan.recommit_of(name)) and (w := writer.lost(owned))), None)
            if why is None:
                return plan
            cid = plan.checkpoint_id
            if r.restore_checkpoint is not None:
                raise PendingFilesLostError(f"checkpoint {cid} cannot be restored: {why}. Nothing was written. "
                                            f"Restore an older checkpoint (ckpt recover {r.graph.name} --checkpoint N).")
            older = [c.checkpoint_id for c in r.store.checkpoints.all() if c.checkpoint_id < cid]
            r.progress(f"checkpoint {cid} can never be committed ({why}): restoring "
                       + (f"checkpoint {max(older)}" if older else "from scratch") + " and replaying it")
            if not older:
                return RecoveryPlan(None, r.epoch, {}, (), orphans=tuple(sorted(set(open_txns))), rollback_after=0)
            plan = r.store.recovery_plan(max(older), current_epoch=r.epoch - 1, open_transactions=open_txns)
        return plan

    def _rollback(self, cid: int) -> None:
        """Restoring ``cid``, older than the latest completed checkpoint: what later checkpoints
        committed would be committed again by the replay, so (1) record the intent, (2) discard
        every later checkpoint (savepoints included: their commits are undone; unreadable records
        too), (3) roll every sink back to what ``cid`` committed. A crash anywhere in between leaves
        the rollback owed (no restored row yet): the next recovery completes it, and (3) is
        idempotent until then."""
        r = self.r
        r.store.sessions.record_rollback(r.epoch, cid)
        later = [c for c in r.store.checkpoints.all() if c.checkpoint_id > cid]
        why = f"rolled back to checkpoint {cid} by epoch {r.epoch}"
        if later:
            r.store.checkpoints.mark_discarded(later, why, epoch=r.epoch)
        unreadable = [i for i in r.store.checkpoints.unreadable() if i > cid]
        if unreadable:
            r.store.checkpoints.discard_unreadable(unreadable, f"{why} (its record was unreadable)", epoch=r.epoch)
        r.reached("rollback")
        for name, writer in r.writers.items():
            version = writer.rollback_to(cid)
            if version is not None:
                r.progress(f"sink {name}: rolled back to version {version} (what checkpoint {cid} committed)")
        r.progress(f"discarded checkpoints {sorted([c.checkpoint_id for c in later] + unreadable)} (after {cid})")

    def _restore(self, plan: RecoveryPlan) -> None:
        """Carry the plan out on the data, vertex by vertex, and put every vertex at its position."""
        r = self.r
        acks = plan.checkpoint.acks if plan.checkpoint else {}
        for name, source in r.sources.items():
            first = SubtaskId(name, 0)  # every subtask of a source acks the same offset
            position = SourceAckState.from_state(acks[first].state).position if first in acks else SourcePosition()
            source.offset, source.time_reference = position.offset, position.time_reference
        for uid, op in r.operators.items():
            op.flushes = 0
            if op.state is None:
                continue
            pinned = self._pinned(plan, uid)
            if pinned:  # the snapshot's own subtasks (any parallelism): together every key group
                op.state.restore(pinned, epoch=r.epoch)
            else:  # nothing to restore, or an operator new to the snapshot: it starts empty
                op.state.clear(epoch=r.epoch)
            op.state_version = op.state.version()
        r.reached("restore")
        for name, writer in r.writers.items():
            owned = plan.recommit_of(name)
            if owned:
                writer.commit(owned, int(plan.checkpoint_id), r.epoch)
                r.reached("restore")  # between two sinks' re-commits
            writer.discard(owned)
            writer.abort(plan.abort)
        for vs in r.vertex_sinks.values():
            vs.restored(vs.snapshots_in(acks), r.epoch)
        r._source_flushes = {}
        # every channel log starts empty in the new epoch (a reader reads only its own epoch's rows):
        # what was in flight is in the restored state or channel state, what came after is sent again
        for name, log in r.logs.items():
            log.clear(r.epoch - 1)
        r.seq, r.parts, r.deferred = 0, {}, {}
        for gate in r.gates.values():
            gate.reset()
        if plan.checkpoint is not None:
            for gate in r.gates.values():
                gate.replay_channel_state(plan)


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


def shown(columns: dict[str, Any]) -> str:
    """``columns`` (name -> a type, or a vertex -> its parallelism) as ``(a x, b y)``, for messages."""
    return "(" + ", ".join(f"{k} {v}" for k, v in columns.items()) + ")"

"""The commit phase of a pipeline's completed checkpoints, run from outside its stage processes.

Two-phase commit's second phase: the sink transactions a completed checkpoint owns (pre-committed
at its barrier) are committed, each exactly once. The stage process that completed the checkpoint
normally committed them already; an orchestrator's commit task (or a recovery) calls this to make
sure, and it then only reads the sinks' commit stamps (delta-rs, no JVM).
:class:`~checkpoint_lib.control.PipelineControl` hands its calls here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .core.errors import CheckpointError, UnknownCheckpointError
from .core.types import CheckpointStatus
from .layout import parse_checkpoint_id

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .delta.store import DeltaCheckpointStore
    from .pipeline import Pipeline


@dataclass(frozen=True)
class CommitOutcome:
    checkpoint_id: int
    epoch: int
    committed: dict[str, list[str]] = field(default_factory=dict)
    """Per sink, the handles of the transactions this call committed (empty: nothing to do)."""
    already_committed: dict[str, list[str]] = field(default_factory=dict)

    @property
    def noop(self) -> bool:
        return not any(self.committed.values())

    def describe(self) -> str:
        if self.noop:
            owned = sum(len(v) for v in self.already_committed.values())
            return (f"checkpoint {self.checkpoint_id}: every one of its {owned} sink transactions was "
                    "already committed (nothing to do)")
        parts = [f"{name}: {len(h)}" for name, h in sorted(self.committed.items()) if h]
        return f"checkpoint {self.checkpoint_id}: committed transactions ({', '.join(parts)}) as epoch {self.epoch}"


class CommitPhase:
    """Commits what completed checkpoints of pipeline ``pipeline_name`` own, through ``store``
    (its checkpoint store) into the sinks under ``warehouse``; ``root`` is the checkpoint root."""

    def __init__(self, store: "DeltaCheckpointStore", pipeline_name: str, warehouse: str,
                 root: str | os.PathLike[str]):
        self.store = store
        self.pipeline_name = pipeline_name
        self.warehouse = warehouse
        self.root = root

    def pipeline(self) -> "Pipeline | Any":
        """What the pipeline declares: a linear pipeline or a dataflow graph."""
        from .pipelines import declared

        return declared(self.pipeline_name)

    def commit(self, checkpoint_id: Any, spark: "SparkSession | None" = None) -> CommitOutcome:
        """Commit phase of a completed checkpoint: re-commit the sink transactions it owns.

        Idempotent: a transaction is committed exactly when its epoch's Delta stamp reached its
        checkpoint; what is committed is skipped, and when everything is (the usual case: the stage
        process that completed the checkpoint committed it) no Spark session is started.
        A pipeline that validates its checkpoints commits only a validated one: a checkpoint not
        validated yet (its stage process died between completion and verdict) is validated first,
        and a failure discards it and raises :class:`~checkpoint_lib.quality.QualityCheckFailed`.
        Raises :class:`UnknownCheckpointError` (no such id), :class:`CheckpointError` (not
        completed: pending, aborted or discarded) and :class:`FencedError` (a newer epoch took over:
        this checkpoint's attempt is a zombie, recovery owns its sinks).
        """
        cid = parse_checkpoint_id(checkpoint_id)
        if cid is None:
            raise ValueError("commit needs a checkpoint id")
        row = self.store.checkpoints.status(cid)
        if row is None:
            raise UnknownCheckpointError(f"checkpoint {cid} of {self.pipeline_name} does not exist")
        if row["status"] != CheckpointStatus.COMPLETED:
            aborted = row["status"] == CheckpointStatus.ABORTED
            why = f" ({row['failure_reason']}: {row['message'] or ''})" if aborted else ""
            raise CheckpointError(f"checkpoint {cid} is {row['status']}{why}: only a completed checkpoint commits")
        epoch = int(row["epoch"])
        self.store.epochs.check(epoch)  # FencedError for a zombie epoch
        owned = self.owned_transactions(cid)
        sinks = self.sinks(None)
        todo: dict[str, list] = {}
        done: dict[str, list[str]] = {}
        for name, txns in owned.items():
            todo[name] = sinks[name].uncommitted(txns)  # one read of the sink's stamps
            done[name] = [t.handle for t in txns if t not in todo[name]]
        if not any(todo.values()):
            return CommitOutcome(cid, epoch, {}, done)
        if spark is None:
            from .spark.session import get_spark, use_warehouse

            spark = get_spark(app_name=f"ckpt-commit-{self.pipeline_name}")
            use_warehouse(spark, self.warehouse)
        if getattr(self.pipeline(), "validate_checkpoints", False) and not self.store.verdicts.validated(cid):
            # the gate: validated first (the stage process may have died before its verdict)
            from .quality import validate_before_commit

            validate_before_commit(spark, self.pipeline_name, str(self.warehouse), self.store, cid)
        sinks = self.sinks(spark)
        committed: dict[str, list[str]] = {}
        for name, txns in todo.items():
            if txns:
                committed[name] = [t.handle for t in sinks[name].commit(txns, cid, epoch)]
        return CommitOutcome(cid, epoch, committed, done)

    def all_committed(self, checkpoint_id: int | str) -> bool:
        """Whether every sink transaction completed checkpoint ``checkpoint_id`` owns has committed
        (read from the sinks' stamps, no Spark): the commit phase then needs no Spark session.
        Raises what :meth:`commit` would for an id that is not a retained completed checkpoint."""
        cid = parse_checkpoint_id(checkpoint_id)
        if cid is None:
            raise ValueError("all_committed needs a checkpoint id")
        sinks = self.sinks(None)
        return all(sinks[n].is_committed(t) for n, txns in self.owned_transactions(cid).items() for t in txns)

    def owned_transactions(self, cid: int) -> dict[str, list]:
        """Per sink, the pre-committed transactions completed checkpoint ``cid`` owns."""
        from .core.recovery import owned_transactions

        from .spark.sinks import declared_sinks

        return {name: [] for name in declared_sinks(self.pipeline())} | owned_transactions(
            self.store.checkpoints.get(cid))

    def sinks(self, spark: "SparkSession | None") -> dict[str, Any]:
        """The pipeline's sinks as :class:`~checkpoint_lib.spark.sinks.SinkWriter` (the same
        construction as the runner's: :func:`~checkpoint_lib.spark.sinks.pipeline_sinks`). With ``spark=None`` only the
        control-plane reads work (the commit stamps): parsing the schema needs a running Spark context."""
        from .spark.sinks import pipeline_sinks

        return pipeline_sinks(spark, self.pipeline(), self.warehouse, str(self.root), check_epoch=self.store.epochs.check)

"""Running a linear pipeline on Spark + Delta: one process of it, run by the graph runtime.

A linear :class:`~checkpoint_lib.pipeline.Pipeline` is lowered to its dataflow graph of two
vertices (:func:`~checkpoint_lib.graph.lowering.from_pipeline`: the source vertex ``source``, its
``map()`` steps fused into it, and the operator with its sinks, plus ``transfers``' feedback edge)
and run by :class:`~.graph_runner.GraphRunner`, which owns the lifecycle, the steps, the
checkpoints and the recovery. :class:`PipelineRunner` adds the options a linear pipeline takes:

- ``stage``: ``all`` runs both vertices in one process (the chained layout: the source edge
  chained unless it lags or the operator has a feedback edge); ``source`` and ``keyed`` run one
  stage each (the :attr:`~checkpoint_lib.graph.Layout.STAGES` layout, the channel log
  ``source_<uid>`` between them), as the Airflow DAGs' tasks do;
- ``lagging_sources=k``: the last ``k`` source subtasks lag a step behind the others (their
  records and barriers reach the operator one step late): the source edge is cut ``lagging``;
- ``validate_checkpoints``: the pipeline's per-checkpoint suite gates every commit;
- ``mode="aligned_with_timeout"``: an alignment that lasts ``alignment_timeout`` (1 s by default)
  goes unaligned.

Snapshots use the ids a linear pipeline's always did (``Pipeline.operator_ids()``), and its tables
the same paths (state, channel logs, sinks, dead letters). A checkpoint taken before the graph
runtime ran linear pipelines restores too: its channel state, in the one table ``channel_state``
(feedback channels numbered from the source parallelism), is replayed from there
(:meth:`PipelineRunner.legacy_channel_state`).

Kill points (:mod:`checkpoint_lib.killpoints`): ``CKPT_KILL_AT=phase:n`` SIGKILLs the process the
n-th time it reaches ``phase``, ``CKPT_PAUSE_AT=phase:n`` SIGSTOPs it there (a stalled zombie until
SIGCONT), ``CKPT_PHASE_TRACE=file`` logs every point passed (tests/crash, tests/chaos); the phases
are the graph runner's.
"""

from __future__ import annotations

from typing import Any, Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..core.clock import Clock
from ..core.decider import DEFAULT_ROWS_PER_STEP, CheckpointConfig
from ..core.types import BarrierMode
from ..delta import log as delta_log
from ..graph.jobgraph import ALL, Layout
from ..graph.lowering import SOURCE, from_pipeline
from ..layout import channel_state_table
from ..pipeline import Pipeline
from .channels import read_channel_state, source_senders
from .context import RunSummary
from .graph_runner import GraphRunner
from .sources import SchemaMismatchError

STAGES = ("source", "keyed")
"""The stages of a linear pipeline: each may run as its own process (``stage="source"`` /
``"keyed"``), joined by the channel log; ``"all"`` runs both in one process."""


class PipelineRunner(GraphRunner):
    """One process of a linear pipeline: its ``source`` stage, its ``keyed`` stage, or both (``all``)."""

    def __init__(
        self,
        pipeline: Pipeline,
        warehouse: str,
        spark: SparkSession,
        *,
        mode: BarrierMode | str = BarrierMode.ALIGNED,
        rows_per_checkpoint: int = DEFAULT_ROWS_PER_STEP,
        config: CheckpointConfig | None = None,
        clock: Clock | None = None,
        progress: Callable[[str], None] | None = None,
        restore_checkpoint: int | None = None,
        allow_non_restored_state: bool = False,
        alignment_timeout: float | None = None,
        stage: str = ALL,
        recover: bool = False,
        poll_interval: float = 1.0,
        lagging_sources: int = 0,
        validate_checkpoints: bool | None = None,
        state_compact_every: int = 32,
        chaining: bool = True,
    ):
        self.pipeline = p = pipeline.validate()
        if stage not in (ALL, *STAGES):
            raise ValueError(f"stage must be one of all, {', '.join(STAGES)}; got {stage!r}")
        mode = BarrierMode(mode)
        if p.feedback and mode in (BarrierMode.ALIGNED, BarrierMode.AT_LEAST_ONCE):
            raise ValueError(
                f"pipeline {p.name!r} has a feedback edge (a cycle): {mode.value} checkpoints "
                "cannot wait for its barrier, which comes only after the snapshot. Use --mode unaligned "
                "(or aligned_with_timeout): the records in flight on the feedback edge are then logged "
                "as channel state, as Chandy-Lamport does.")
        if mode is BarrierMode.ALIGNED_WITH_TIMEOUT:
            alignment_timeout = 1.0 if alignment_timeout is None else alignment_timeout
        else:
            alignment_timeout = None
        S = p.source_parallelism
        if not 0 <= lagging_sources < S:
            raise ValueError(f"lagging_sources must be within 0..{S - 1} (at least one source subtask keeps pace), "
                             f"got {lagging_sources}")
        super().__init__(
            from_pipeline(p), warehouse, spark, mode=mode, rows_per_checkpoint=rows_per_checkpoint, config=config,
            clock=clock, progress=progress, restore_checkpoint=restore_checkpoint,
            allow_non_restored_state=allow_non_restored_state, recover=recover, poll_interval=poll_interval,
            lagging=[(p.operator_uid, 1)] if lagging_sources else (),
            lagging_senders={SOURCE: range(S - lagging_sources, S)} if lagging_sources else None,
            chaining=chaining, alignment_timeout=alignment_timeout,
            processes=Layout.CHAINED if stage == ALL else Layout.STAGES, group=stage,
            state_compact_every=state_compact_every,
            validate_checkpoints=p.validate_checkpoints if validate_checkpoints is None else validate_checkpoints)

    # what the CLI, the Airflow hook, the benchmarks and the tests read --------------------------

    @property
    def ctx(self) -> "PipelineRunner":
        """Itself (what the linear runner's run context held: ``kills``, ``epoch``, ``summary``...)."""
        return self

    @property
    def operator(self) -> Any:
        return self.operators[self.pipeline.operator_uid]

    @property
    def state(self) -> Any:
        """The operator's keyed state table (None: a stateless operator)."""
        return self.operator.state

    @property
    def sinks(self) -> dict[str, Any]:
        return self.writers

    @property
    def channel(self) -> Any:
        """The channel log of the source edge (``source_<uid>``; None when it is chained)."""
        return next((self.logs[e.channel_log] for e in self.job.cut if e.sender == SOURCE), None)

    @property
    def chained(self) -> bool:
        """Whether the source edge flows into the operator in one Spark plan (no channel log)."""
        return not any(e.sender == SOURCE for e in self.job.cut)

    @property
    def offset(self) -> int:
        return self.sources[SOURCE].offset

    @property
    def runs_source(self) -> bool:
        return SOURCE in self.members

    @property
    def runs_keyed(self) -> bool:
        return self.pipeline.operator_uid in self.members

    def source_step(self) -> bool:
        """The next step from the landing table (a source stage, or both stages). False: nothing new."""
        self._check_open()
        return self.step()

    def keyed_step(self) -> bool:
        """Consume what the channel log holds beyond the operator's cursor. False: nothing new."""
        self._check_open()
        return self._poll()

    def backlog_rows(self) -> int | None:
        """Rows landed and not read yet (None in a keyed-only process): a progress bar's total."""
        return super().backlog_rows() if self.runs_source else None

    def legacy_channel_state(self, edge: Any, plan: Any, receivers: list[int], schema: Any) -> DataFrame | None:
        """What checkpoint ``plan`` logged in flight on ``edge`` for ``receivers`` in the one
        channel-state table of checkpoints taken before the graph runtime ran linear pipelines
        (``channel_state``: the source subtasks' channels ``0..S-1``, the feedback channels
        ``S + i``), as the edge's own table gives them (``schema``); None when there is no such
        table. Read only: a restore of a newer checkpoint finds none of its rows there."""
        path = str(channel_state_table(self.root))
        if not delta_log.is_delta_table(path):
            return None
        sources = source_senders((s.operator for s in plan.checkpoint.acks), self.pipeline.source_parallelism)
        df = read_channel_state(self.spark, path, plan.checkpoint_id).where(F.col("receiver").isin(receivers))
        feedback = edge.sender != SOURCE
        df = df.where(F.col("sender") >= sources) if feedback else df.where(F.col("sender") < sources)
        if feedback:
            df = df.withColumn("sender", F.col("sender") - F.lit(sources))
        return df.select(*[F.col(f"`{f.name}`").cast(f.dataType) if f.name in df.columns
                           else F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields])

    @property
    def noun(self) -> str:
        return f"pipeline {self.pipeline.name!r}"

    def rescale_message(self, was: dict[str, int], now: dict[str, int]) -> str:
        uid = self.pipeline.operator_uid

        def stages(p: dict[str, int]) -> dict[str, int]:
            return {("operator" if k == uid else k): n for k, n in p.items()}

        return rescale_message(self.stage, stages(was), stages(now), self.pipeline.parallelism_origin)


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
    who = "the pipeline" if stage == ALL else f"the {stage} stage"
    return (f"parallelism changed: {who} stopped at {shown(was)}, now {shown(now)} ({source}); "
            f"recovering to rescale the latest checkpoint (to keep the earlier parallelism, run with {keep})")


__all__ = ["PipelineRunner", "RunSummary", "SchemaMismatchError", "STAGES", "rescale_message"]

"""Running a pipeline on Spark + Delta under the checkpoint core: one process, its lifecycle.

One :class:`PipelineRunner` drives one process of a pipeline: its ``source`` stage, its ``keyed``
stage, or both (``stage="all"``). Within an epoch (an attempt) each run of a stage is a session.
The runner owns the lifecycle and the event loop; each role owns its state in its own module:

- :mod:`.topology`: the pipeline wired to its tables (subtasks, source, channel logs, state, sinks);
- :mod:`.recovery` (**open**): join the current epoch where the stage's last session ended cleanly,
  or recover: a new epoch that fences every older process, restores the latest (or a chosen)
  completed checkpoint and publishes every stage's starting point;
- :mod:`.source_stage` (**source steps**): the next whole versions of the landing table (about
  ``rows_per_checkpoint`` rows: a million by default), bad rows to the dead-letter table, the
  ``map()`` steps and the partitioner; then chained into the operator (both stages here, nothing
  lagging, no cycle) or appended to the Delta channel log, with the barrier after the records;
- :mod:`.keyed_stage` (**keyed steps**): one barrier handler per operator subtask; deliveries
  applied in flushes (sink rows written once into each subtask's open transaction, state MERGEd),
  snapshots that pin the state version and pre-commit the transactions, channel state, acks;
- :mod:`.completion`: acks are durable as they arrive; whichever process writes the last one
  completes the checkpoint and commits the sinks (idempotent Delta commits), then cleans up;
- **close**: end the session(s) with their resume points.

Kill points (:mod:`checkpoint_lib.killpoints`): ``CKPT_KILL_AT=phase:n`` SIGKILLs the process the
n-th time it reaches ``phase``, ``CKPT_PAUSE_AT=phase:n`` SIGSTOPs it there (a stalled zombie until
SIGCONT), ``CKPT_PHASE_TRACE=file`` logs every point passed (tests/crash, tests/chaos).
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager, nullcontext
from typing import Any, Callable

from pyspark.sql import SparkSession

from ..core.clock import Clock, SystemClock
from ..core.coordinator import CheckpointCoordinator
from ..core.decider import DEFAULT_ROWS_PER_STEP, CheckpointConfig
from ..core.errors import CheckpointError
from ..core.recovery import RecoveryPlan
from ..core.twophase import TransactionIdPool
from ..core.types import BarrierMode, CheckpointKind, CheckpointStatus
from ..delta import log as delta_log
from ..delta.store import DeltaCheckpointStore
from ..killpoints import KillPoints
from ..layout import warehouse_location
from ..metrics import PipelineMetrics
from ..pipeline import Pipeline
from . import tables
from .completion import Completion
from .context import RunContext, RunSummary
from .keyed_stage import KeyedStage
from .recovery import Recovery
from .session import use_warehouse
from .source_stage import SourceStage
from .sources import SchemaMismatchError
from .topology import Topology

__all__ = ["PipelineRunner", "RunSummary", "SchemaMismatchError", "STAGES"]

STAGES = ("source", "keyed")
"""The stages of a pipeline: each may run as its own process (``stage="source"`` / ``"keyed"``),
joined by the persisted channel log; ``"all"`` runs both in one process."""


class PipelineRunner:
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
        stage: str = "all",
        recover: bool = False,
        poll_interval: float = 1.0,
        lagging_sources: int = 0,
        validate_checkpoints: bool | None = None,
        state_compact_every: int = 32,
        chaining: bool = True,
    ):
        self.pipeline = p = pipeline.validate()
        if stage not in ("all", *STAGES):
            raise ValueError(f"stage must be one of all, {', '.join(STAGES)}; got {stage!r}")
        self.stage = stage
        self.force_recover = recover
        self.restore_checkpoint = restore_checkpoint
        self.poll_interval = poll_interval
        self.sessions: dict[str, int] = {}
        self._opened = False
        self._closed = False
        self._stop_requested = False
        self.mode = BarrierMode(mode)
        if p.feedback and self.mode in (BarrierMode.ALIGNED, BarrierMode.AT_LEAST_ONCE):
            raise ValueError(
                f"pipeline {p.name!r} has a feedback edge (a cycle): {self.mode.value} checkpoints "
                "cannot wait for its barrier, which comes only after the snapshot. Use --mode unaligned "
                "(or aligned_with_timeout): the records in flight on the feedback edge are then logged "
                "as channel state, as Chandy-Lamport does."
            )
        if rows_per_checkpoint < 1:
            raise ValueError(f"rows_per_checkpoint must be >= 1, got {rows_per_checkpoint}")
        if state_compact_every < 0:
            raise ValueError(f"state_compact_every must be >= 0 (0: never), got {state_compact_every}")
        self.warehouse = warehouse_location(warehouse)
        use_warehouse(spark, self.warehouse)
        self.spark = spark
        self.rows_per_checkpoint = rows_per_checkpoint
        self.config = config or CheckpointConfig(interval=0, max_concurrent=1, timeout=3600, retained=5)
        self.clock = clock or SystemClock()
        self.progress = progress or (lambda _msg: None)
        if self.mode is BarrierMode.ALIGNED_WITH_TIMEOUT and alignment_timeout is None:
            alignment_timeout = 1.0
        self.alignment_timeout = alignment_timeout if self.mode is BarrierMode.ALIGNED_WITH_TIMEOUT else None
        self.validate_checkpoints = p.validate_checkpoints if validate_checkpoints is None else validate_checkpoints

        self.topology = t = Topology(p, self.warehouse, spark, check_epoch=lambda epoch: self.store.epochs.check(epoch))
        self.store = DeltaCheckpointStore.open(t.root, retained=self.config.retained)
        self.ctx = ctx = RunContext(p, t, spark, self.store, KillPoints(), self.progress, PipelineMetrics(p.name))
        if not 0 <= lagging_sources < t.S:
            raise ValueError(
                f"lagging_sources must be within 0..{t.S - 1} (at least one source subtask keeps pace), "
                f"got {lagging_sources}"
            )
        # Chained stages (Flink's operator chaining): with both stages in this process, no cycle
        # and no lagging source subtask, a step's records go from the landing read to the keyed
        # operator in one Spark plan, and its barrier reaches every channel at the same instant
        # with nothing in flight, so the channel log holds nothing worth writing.
        self.chained = chaining and stage == "all" and not lagging_sources and not p.feedback
        # Every process has both stages' positions (a recovery publishes every stage's); it runs
        # the steps of its own stage(s) only.
        self.keyed_stage = KeyedStage(
            ctx, mode=self.mode, alignment_timeout=self.alignment_timeout, state_compact_every=state_compact_every,
            clock=self.clock, pool=self._pool, on_effects=self._on_effects,
        )
        self.completion = Completion(ctx, validate_checkpoints=self.validate_checkpoints, keyed=self.keyed_stage,
                                     runs_keyed=self.runs_keyed)
        self.keyed_stage.after_execute = self.completion.cleanup_if_due
        self.source_stage = SourceStage(
            ctx, rows_per_step=rows_per_checkpoint, lagging=list(range(t.S - lagging_sources, t.S)),
            runs_keyed=self.runs_keyed, keyed=self.keyed_stage if self.chained else None,
            on_effects=self._on_effects,
        )
        self.recovery = Recovery(
            ctx, stages=self._stages(), parallelism={"source": t.S, "operator": t.P}, source=self.source_stage,
            keyed=self.keyed_stage, restore_checkpoint=restore_checkpoint,
            allow_non_restored_state=allow_non_restored_state, validate_checkpoints=self.validate_checkpoints,
        )

    # what a process shares: read by the CLI, the Airflow hook, the benchmarks and the tests ------

    @property
    def epoch(self) -> int:
        return self.ctx.epoch

    @property
    def coordinator(self) -> CheckpointCoordinator:
        return self.ctx.coordinator

    @property
    def summary(self) -> RunSummary:
        return self.ctx.summary

    @property
    def root(self) -> str:
        return self.topology.root

    @property
    def channel(self):
        return self.topology.channel

    @property
    def state(self):
        return self.topology.state

    @property
    def sinks(self):
        return self.topology.sinks

    @property
    def offset(self) -> int:
        return self.source_stage.offset

    @property
    def runs_source(self) -> bool:
        return self.stage in ("all", "source")

    @property
    def runs_keyed(self) -> bool:
        return self.stage in ("all", "keyed")

    def _stages(self) -> tuple[str, ...]:
        return tuple(s for s in STAGES if self.stage in ("all", s))

    def _pool(self, sink: str, index: int) -> TransactionIdPool:
        return TransactionIdPool.of_sink(self.pipeline.name, sink, index, self.config.max_concurrent)

    def _on_effects(self, effects: Any) -> None:
        self.completion.on_effects(effects)

    # opening: join the current epoch, or recover -------------------------------------------

    def open(self) -> RecoveryPlan | None:
        """Join the current epoch where this pipeline's stage(s) stopped cleanly, or recover.

        Each stage (``source``, ``keyed``) runs in sessions: a process begins one, and ends it
        cleanly with the point where the next session resumes. A stage resumes in the current
        epoch unless a recovery is asked for (``restore_checkpoint`` or ``recover=True``), no epoch
        finished restoring yet, or its last session in the epoch never ended (the process died,
        or one is still running: it will be fenced). Recovery begins a new epoch (fencing every
        process of older ones), restores the whole pipeline to the latest (or the chosen)
        completed checkpoint and publishes every stage's resume point. Returns the recovery plan,
        or None when the stage(s) joined the current epoch."""
        if self._opened or self._closed:
            raise RuntimeError("this runner was already opened: use a new one")
        t = self.topology
        if not self.chained:  # a chained process reads the log only if an unchained one left it
            t.channel.create()
        if t.feedback_log is not None:
            t.feedback_log.create()
        if t.state is not None:
            t.state.create()
        for sink in t.sinks.values():
            sink.create()
        tables.create_if_missing(self.spark, t.dlq_path, t.dlq_schema())
        t.channel_state.create()
        self.ctx.summary = RunSummary(0, None)
        for role in (self.source_stage, self.keyed_stage, self.completion):
            role.reset()
        epoch = self.store.epochs.current()
        recovery = self.recovery
        points = None if (self.force_recover or self.restore_checkpoint is not None) else recovery.resume_points(epoch)
        plan = None
        if points is None:
            plan = recovery.recover()
            points = recovery.resume_points(self.epoch)
            assert points is not None, "the epoch just restored must be joinable"
        else:
            self.ctx.epoch = epoch
        for stage in self._stages():
            # on top of the very session whose end this process resumes from: a racing starter of
            # the stage, or one that started and ended meanwhile, makes this None (never a second
            # live session, never a stale resume point)
            number = self.store.sessions.begin(self.epoch, stage, after=recovery.resumes_after(stage))
            if number is None:
                raise CheckpointError(
                    f"another {stage} process of pipeline {self.pipeline.name!r} started at the same "
                    f"instant in epoch {self.epoch}: run one process per stage"
                )
            self.sessions[stage] = number
        for stage in self._stages():
            (self.source_stage if stage == "source" else self.keyed_stage).resume(points[stage])
        self.ctx.coordinator = CheckpointCoordinator(
            self.config, t.tasks, t.sources, self.store.ids, self.store.checkpoints.fenced(self.epoch), self.clock
        )
        self.coordinator.all_running()
        self.summary.epoch = self.epoch
        self._opened = True
        if (self.chained and self.keyed_stage.cursor < self.source_stage.next_seq - 1
                and delta_log.is_delta_table(t.channel.path)):
            self.keyed_stage.step()  # what a process of the unchained stages left in the channel log, first
        if plan is None:
            self.progress(
                f"{'+'.join(self._stages())} joined epoch {self.epoch} "
                f"(sessions {', '.join(f'{k} {v}' for k, v in self.sessions.items())})"
            )
        return plan

    def close(self) -> None:
        """Stop cleanly: finish pending clean-ups and end this process's session(s) with their
        resume points. The runner cannot be used afterwards; a new one resumes where it ended."""
        if not self._opened:
            return
        if self.runs_source:
            self.source_stage.catch_up()
        if self.runs_keyed:
            keyed = self.keyed_stage
            busy = keyed.busy()
            if busy or keyed.snapshots or keyed.channel_state:
                # Cannot describe a half-aligned subtask in a resume point: leave the session
                # open, so the next start recovers from the latest completed checkpoint.
                self.progress(f"keyed subtasks {busy} are inside a checkpoint: not ending the session cleanly")
                self.sessions.pop("keyed", None)
            else:
                self.completion.cleanup()
        parallelism = self.recovery.parallelism
        for stage, number in self.sessions.items():
            role = self.source_stage if stage == "source" else self.keyed_stage
            self.store.sessions.end(self.epoch, stage, number, role.point(parallelism))
        self._opened = False
        self._closed = True

    # the run loop ----------------------------------------------------------------------------

    def run(
        self,
        until_caught_up: bool = True,
        max_steps: int | None = None,
        final_checkpoint: bool = True,
        final_kind: CheckpointKind = CheckpointKind.CHECKPOINT,
        handle_signals: bool = False,
        on_step: Callable[[RunSummary], None] | None = None,
    ) -> RunSummary:
        """Open, process (until caught up, or ``max_steps`` steps), take a final checkpoint (of
        ``final_kind``) and close. A source-only run injects the final barrier and does not wait
        for it; a keyed-only run stops when the channel log holds nothing new. With
        ``handle_signals`` (the CLI), SIGTERM/SIGINT stop the loop cleanly (:meth:`request_stop`);
        otherwise the host's handlers stay (e.g. Airflow's task runner). ``on_step`` is told the
        summary after every step (a progress bar)."""
        started = time.monotonic()
        if not self._opened:
            self.open()
        steps = 0
        with stop_on_signals(self.request_stop) if handle_signals else nullcontext():
            while (max_steps is None or steps < max_steps) and not self._stop_requested:
                steps += 1
                moved = self.source_step() if self.runs_source else False
                consumed = self.keyed_step() if self.runs_keyed and not self.chained else False
                if on_step is not None:
                    on_step(self.summary)
                if not (moved or consumed) and self.runs_keyed and self.keyed_stage.aligning_with_timeout():
                    self._idle_briefly()  # an alignment will time out: wait for it, then go on
                    continue
                if not (moved or consumed):
                    if until_caught_up:
                        break
                    self._idle()
        if final_checkpoint and self.runs_source:
            self.summary.final = self.final_checkpoint(final_kind)
        self.close()
        self.summary.steps = steps
        self.summary.seconds = time.monotonic() - started
        return self.summary

    def backlog_rows(self) -> int | None:
        """Rows landed and not read yet (None in a keyed-only process): a progress bar's total."""
        self._check_open()
        return self.source_stage.backlog_rows() if self.runs_source else None

    def source_step(self) -> bool:
        """Read the next versions of the landing table into the operator (chained) or the channel
        log. False: nothing new."""
        self._check_open()
        return self.source_stage.step()

    def keyed_step(self) -> bool:
        """Consume everything the channel log holds beyond the cursor. False: nothing new."""
        self._check_open()
        return self.keyed_stage.step()

    def request_stop(self) -> None:
        """Stop the run loop after its current step, then finish as a normal end (final
        checkpoint, clean session end). SIGTERM and Ctrl-C do this during :meth:`run` (a second
        one interrupts at once; the next start then recovers). Safe to call from another thread."""
        if not self._stop_requested:
            self.progress("stop requested: finishing the current step, then stopping cleanly")
        self._stop_requested = True

    def _idle_briefly(self) -> None:
        time.sleep(min(0.05, self.alignment_timeout or 0.05))

    def _idle(self) -> None:
        deadline = time.monotonic() + self.poll_interval
        while not self._stop_requested and time.monotonic() < deadline:
            time.sleep(min(0.2, self.poll_interval))

    def final_checkpoint(self, kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> int:
        """Take a checkpoint now (every record read so far is in it). With the keyed stage in this
        process, wait for it to complete; a source-only process injects the barrier and returns."""
        self._check_open()
        if not self.runs_source:
            raise CheckpointError("only a process running the source stage can inject a checkpoint barrier")
        self.source_stage.sync_pending()
        trigger = self.coordinator.trigger(kind)
        self.source_stage.send(None, [], trigger)
        if not self.runs_keyed:
            self.progress(f"{kind.value} {trigger.checkpoint_id} injected: it completes when the keyed stage runs")
            return trigger.checkpoint_id
        deadline = time.monotonic() + self.config.timeout
        while not self.chained and self.coordinator.status_of(trigger.checkpoint_id) == CheckpointStatus.PENDING:
            if self.keyed_stage.step():
                continue  # a cycle: the feedback barriers come back in later steps
            if self.keyed_stage.aligning_with_timeout() and time.monotonic() < deadline:
                time.sleep(0.05)  # the alignment times out, then the checkpoint goes unaligned
                continue
            break
        status = self.coordinator.status_of(trigger.checkpoint_id)
        if status != CheckpointStatus.COMPLETED:
            raise CheckpointError(f"final {kind.value} {trigger.checkpoint_id} did not complete: {status}")
        return trigger.checkpoint_id

    def _check_open(self) -> None:
        if not self._opened:
            raise RuntimeError("the runner is closed" if self._closed else "call open() first")


@contextmanager
def stop_on_signals(stop: Callable[[], None]):
    """While running, SIGTERM/SIGINT ask for a clean stop (a second one raises KeyboardInterrupt).
    Only the main thread can install handlers; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    asked = []

    def handler(signum, _frame):
        if asked:
            raise KeyboardInterrupt(f"signal {signum} again: stopping at once")
        asked.append(signum)
        stop()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)

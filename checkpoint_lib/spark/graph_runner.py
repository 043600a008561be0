"""Running a dataflow graph (:class:`~checkpoint_lib.graph.StreamGraph`) on Spark + Delta: one
process group of its job graph per process.

:class:`GraphRunner` runs one process group of the job graph :func:`~checkpoint_lib.graph.plan`
makes of the graph (by default :attr:`~checkpoint_lib.graph.Layout.CHAINED`: every vertex in this
process, every edge chained, so a step flows from every source through every operator in
topological order within Spark plans (Spark does the shuffles), and a checkpoint's barrier reaches
every input channel of every subtask at the step's end with nothing in flight: aligned in every
mode, no channel state). Where the plan cuts an edge (a lagging input, a cycle, another process
group), the operators reading from channel logs run as gates (:mod:`.vertices.gate`: barrier
handlers over all their input channels, channel state per input edge), the step's flow writes
one segment per step on each cut edge it sends on (a lagging one a step late), and with several
process groups each process completes the checkpoints it acknowledges last and commits its own
sinks (see :meth:`GraphRunner.acknowledge`). A step:

1. **plans across all sources** (:func:`~checkpoint_lib.graph.steps.plan_step`): each source proposes its next whole versions
   (about ``rows_per_checkpoint`` rows); a full proposal ends at a commit time, and every source
   reads only versions committed by then (a cut of the sources' logs at one instant, so a
   dimension table is read up to what had landed when the events that follow it landed);
2. **reads** each source's share (bad rows to its dead letters), **routes** each edge's records to
   the receiver's subtasks (:func:`~checkpoint_lib.spark.partitioning.route_records`) and **runs**
   each operator (:mod:`.vertices.operator`): sinks staged into every subtask's open transaction,
   keyed state MERGEd into the operator's state table;
3. at a checkpoint (the step's barrier: a periodic one, or one answering "checkpoint now" and
   savepoint requests, :func:`~checkpoint_lib.checkpoint_requests.next_trigger`, also in a step that
   reads nothing), **snapshots** every vertex: each source acknowledges its offset, each operator
   subtask pins its state version (its key groups) and pre-commits its sinks' transactions; the
   acks are durable in one commit, then the coordinator completes the checkpoint and every sink
   commits up to it (:func:`~checkpoint_lib.core.twophase.commit_up_to`).

Opening joins the current epoch where the last process ended cleanly, or **recovers**
(:mod:`.graph_recovery`): a new epoch fences every older process inside each sink's and state
table's commits, restores every operator's state from the checkpoint (per uid; any parallelism:
key groups), re-commits what the checkpoint owns, aborts the rest, and the sources go on from
their offsets: a full restart, whichever process group recovers (every vertex's state, every sink,
every gate's channel state; every channel log starts empty in the new epoch).

Kill points (:mod:`checkpoint_lib.killpoints`): ``source_read``, ``dlq``, ``flush_stage``,
``flush_merge``, ``state_run`` (a flush's run written, its commit not yet), ``state_compact`` (a
flush's run committed, the compaction after it not yet),
``channel_write`` (``feedback_write`` onto a feedback edge), ``snapshot``,
``source_ack`` (a group with sources, just before ``ack``), ``ack``, ``channel_state``,
``validate``, ``complete``, ``commit``, ``sink_commit``, and the recovery's ``fence``,
``recover``, ``rollback``, ``restore``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from contextlib import nullcontext
from typing import Any, Callable, Iterable, Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..checkpoint_requests import CheckpointRequests, next_trigger
from ..core import twophase
from ..core.clock import Clock, SystemClock
from ..core.coordinator import (CheckpointAborted, CheckpointCompleted, CheckpointCoordinator, FailJob,
                                NotifyCheckpointComplete, TriggerCheckpoint)
from ..core.decider import DEFAULT_ROWS_PER_STEP, CheckpointConfig
from ..core.errors import CheckpointError
from ..core.twophase import TransactionIdPool
from ..core.types import BarrierMode, CheckpointKind, CheckpointStatus, SubtaskAck, SubtaskId
from ..delta.store import DeltaCheckpointStore
from ..graph.jobgraph import ALL, CutReason, plan
from ..graph.steps import plan_step
from ..graph.model import RECORDS, OperatorKind, StreamGraph
from ..killpoints import KillPoints
from ..layout import checkpoint_root, warehouse_location
from ..metrics import PipelineMetrics
from ..pipeline import FolderSource
from ..reserved import KEY_GROUP, SINK_SUBTASK
from . import completion
from .completion import adopt, record_aborted, too_many_failed
from .context import RunSummary, StepCache
from .partitioning import route_records
from .session import use_warehouse
from .sinks import pipeline_sinks
from .channels import BARRIER, DATA, DeltaChannelLog
from .vertices.gate import Gate, payload_of, segment
from .vertices.operator import OperatorVertexRun
from .vertices.sinks import VertexSinks
from .vertices.source import SourceVertexRun

STAGE = ALL
"""The session stage of a graph's one process: its process group (as the linear runner's ``stage="all"``)."""


def _width(held: dict[str, list[tuple]]) -> int:
    """The positions what lagging senders held back takes: its longest log's count of parts."""
    return max((len(parts) for parts in held.values()), default=0)


def _split(part: tuple, slow: frozenset[int] | None) -> tuple[tuple | None, tuple | None]:
    """A log entry of a step (a segment, a barrier) as what its senders that keep pace write now and
    what ``slow`` senders (None: all) write a step late; None where a side has nothing."""
    if slow is None:
        return None, part
    if part[0] == DATA:
        kind, seq, df = part
        lag = F.col("sender").isin(sorted(slow))
        return (kind, seq, df.where(~lag)), (kind, seq, df.where(lag))
    kind, seq, *rest, senders, receivers = part
    now, late = [s for s in senders if s not in slow], [s for s in senders if s in slow]
    return ((kind, seq, *rest, now, receivers) if now else None), ((kind, seq, *rest, late, receivers) if late else None)


class GraphRunner:
    def __init__(
        self,
        graph: StreamGraph,
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
        recover: bool = False,
        poll_interval: float = 1.0,
        lagging: Any = (),
        lagging_senders: Mapping[str, Iterable[int]] | None = None,
        chaining: bool = True,
        alignment_timeout: float | None = None,
        processes: Any = None,
        group: str | None = None,
        state_compact_every: int = 32,
        validate_checkpoints: bool = False,
    ):
        self.graph = graph
        self.validate_checkpoints = validate_checkpoints
        """Every checkpoint passes the graph's per-checkpoint GX suite before anything commits it
        (here, another process group's sync, a recovery)."""
        self.job = plan(graph, processes, lagging=lagging, chaining=chaining)
        if group is None:
            if len(self.job.groups) > 1:
                raise ValueError(f"graph {graph.name!r} is planned as {len(self.job.groups)} process groups "
                                 f"({', '.join(g.name for g in self.job.groups)}): name the one this process runs")
            group = self.job.groups[0].name
        self.group = self.job.group(group)
        self.members = frozenset(self.group.vertices)
        """The vertices this process runs (its process group's); it knows every vertex of the graph, as a
        recovery here restores them all (a full restart, as Flink's)."""
        self.alone = len(self.job.groups) == 1  # every vertex in this process
        self.mode = BarrierMode(mode)
        cycles = [e for e in self.job.edges if e.feedback]
        if cycles and self.mode in (BarrierMode.ALIGNED, BarrierMode.AT_LEAST_ONCE) and alignment_timeout is None:
            raise ValueError(
                f"graph {graph.name!r} has a feedback edge (a cycle, {cycles[0].sender} -> {cycles[0].receiver}): "
                f"{self.mode.value} checkpoints cannot wait for its barrier, which comes only after the snapshot. Use "
                "mode unaligned (or aligned with an alignment timeout): the records in flight on the feedback edge "
                "are then logged as channel state, as Chandy-Lamport does.")
        problems = []
        if sum(isinstance(v.spec, FolderSource) for v in graph.sources) > 1:
            problems.append("more than one landing-folder source (their manifests would share one folder)")
        problems += [f"operator {v.uid!r} has dead letters: write its bad rows with a sink (output(name).sink(...))"
                     for v in graph.operators if graph.dead_letters_of(v.uid)]
        if problems:
            raise ValueError(f"graph {graph.name!r} cannot run yet: " + "; ".join(problems))
        if rows_per_checkpoint < 1:
            raise ValueError(f"rows_per_checkpoint must be >= 1, got {rows_per_checkpoint}")
        if state_compact_every < 0:
            raise ValueError(f"state_compact_every must be >= 0 (0: never), got {state_compact_every}")
        self.alignment_timeout = alignment_timeout
        self.warehouse = warehouse_location(warehouse)
        use_warehouse(spark, self.warehouse)
        self.spark = spark
        self.rows_per_checkpoint = rows_per_checkpoint
        self.config = config or CheckpointConfig(interval=0, max_concurrent=1, timeout=3600, retained=5)
        self.clock = clock or SystemClock()
        self.progress = progress or (lambda _msg: None)
        self.restore_checkpoint = restore_checkpoint
        self.allow_non_restored_state = allow_non_restored_state
        self.force_recover = recover
        self.poll_interval = poll_interval
        self.root = str(checkpoint_root(self.warehouse, graph.name))
        self.store = DeltaCheckpointStore.open(self.root, retained=self.config.retained)
        self.kills = KillPoints()
        self.metrics = PipelineMetrics(graph.name)  # StatsD, off unless configured (checkpoint_lib.metrics)
        self.epoch = 0
        self.coordinator: CheckpointCoordinator | None = None
        self.summary = RunSummary(0, None)
        self.session: int | None = None
        self._opened = self._closed = self._stop_requested = False
        self.step_cache = StepCache()  # what several writes of a step read, computed once
        self.cached, self.uncache = self.step_cache.cached, self.step_cache.uncache
        self._step_started, self._done_at = time.monotonic(), {}  # when the step began, each vertex was done
        self._source_flushes: dict[str, int] = {}  # a source vertex's sink flushes (the operators keep theirs)
        self._completions = 0  # checkpoints this process committed: every few, the gates truncate their logs
        self._truncation_due = False

        self.writers = pipeline_sinks(spark, graph, self.warehouse, self.root, self.store.epochs.check, self.kills,
                                      self.config.max_concurrent)
        self.sources = {v.name: SourceVertexRun(v, graph, spark=spark, warehouse=self.warehouse, root=self.root,
                                                progress=self.progress) for v in graph.sources}
        self.vertex_sinks = {v.id: VertexSinks({s.name: (self.writers[s.name], s.output) for s in graph.sinks_of(v.id)},
                                               v.parallelism, self._pool) for v in graph.vertices}
        self.operators = {
            v.uid: OperatorVertexRun(v, graph, spark=spark, root=self.root, sinks=self.vertex_sinks[v.uid],
                                     key=graph.inputs_of(v.uid)[0].key if v.kind is not OperatorKind.STATELESS else None,
                                     compact_every=state_compact_every)
            for v in graph.operators
        }
        self.order = [v.id for v in graph.topological_order()]
        self.readers: Counter[tuple[str, str]] = Counter(
            [(e.sender, e.output) for e in graph.edges] + [(s.vertex, s.output) for s in graph.sinks])
        """How many sinks and edges read each output of each vertex."""
        self.gated = self.job.gated  # operators reading their inputs from channel logs (gates), of every group
        self.logs: dict[str, DeltaChannelLog] = {}  # every cut edge's channel log (open: their columns known)
        self.gates: dict[str, Gate] = {}
        self.sends = frozenset(e.channel_log for e in self.job.cut
                               if e.sender not in self.gated and e.sender in self.members)
        """The cut edges a vertex of the step's flow sends on."""
        self.seq = 0
        """The next position on those edges' logs: one count for all, so a step's segments share a
        position on every log, and its barriers the next one (a gate reads across its logs in
        position order: a step's records of every input before the step's barrier on any)."""
        self.parts: dict[str, list[tuple]] = {}  # what the step's flow sends on its cut edges, not written yet
        self.lags = frozenset(e.channel_log for e in self.job.cut
                              if CutReason.LAGGING in e.reasons and e.channel_log in self.sends)
        self.deferred: dict[str, list[tuple]] = {}  # a lagging edge's step, written with the next one
        self.slow = self._slow_senders(lagging_senders or {})
        """Per lagging edge, the sending subtasks that lag on it (None: all of them): theirs is a step
        late, the others' keeps pace (as ``--lagging-sources`` makes slow source subtasks)."""
        self.schemas: dict[tuple[str, str], Any] = {}  # each vertex output's columns
        self.tasks = [sid for v in graph.vertices for sid in self._vertex(v.id).ids]
        self.tasks += [sid for vs in self.vertex_sinks.values() for ids in vs.ids.values() for sid in ids]
        self.source_ids = [sid for s in self.sources.values() for sid in s.ids]

    def legacy_channel_state(self, edge: Any, plan: Any, receivers: list[int], schema: Any) -> DataFrame | None:
        """What checkpoint ``plan`` logged in flight on ``edge`` for ``receivers`` in a table of an
        earlier layout (columns as ``schema``), or None: a graph has none (a linear pipeline's
        checkpoints taken before the graph runtime ran it have, :class:`~.runner.PipelineRunner`)."""
        return None

    @property
    def noun(self) -> str:
        """What messages call what runs: ``graph 'name'`` (``pipeline 'name'`` for a linear one)."""
        return f"graph {self.graph.name!r}"

    def rescale_message(self, was: dict[str, int], now: dict[str, int]) -> str:
        """Why a start rescales (each vertex's parallelism it stopped at, and now)."""
        from .graph_recovery import shown

        return (f"parallelism changed: graph {self.graph.name} stopped at {shown(was)}, now {shown(now)}: "
                "recovering to rescale the latest checkpoint")

    def _vertex(self, vertex_id: str) -> SourceVertexRun | OperatorVertexRun:
        return self.sources.get(vertex_id) or self.operators[vertex_id]

    def _pool(self, sink: str, index: int) -> TransactionIdPool:
        return TransactionIdPool.of_sink(self.graph.name, sink, index, self.config.max_concurrent)

    @property
    def parallelism(self) -> dict[str, int]:
        return {v.id: v.parallelism for v in self.graph.vertices}

    # what every part shares --------------------------------------------------------------------

    def reached(self, phase: str) -> None:
        self.kills.reached(phase)

    def fence(self) -> None:
        """The early, cheap epoch check before a data-plane write (the fence itself is inside each
        write's commit)."""
        self.store.epochs.check(self.epoch)

    # opening -----------------------------------------------------------------------------------

    def open(self):
        """Join the current epoch where the last process stopped cleanly, or recover (a new epoch
        restoring the latest, or the chosen, completed checkpoint). Returns the recovery plan, or
        None when it joined."""
        from .graph_recovery import GraphRecovery

        if self._opened or self._closed:
            raise RuntimeError("this runner was already opened: use a new one")
        self._wire_state()
        self._wire_logs()
        for op in self.operators.values():
            if op.state is not None:
                op.state.create()
        for writer in self.writers.values():
            writer.create()
        for source in self.sources.values():
            source.create()
        recovery = GraphRecovery(self)
        epoch = self.store.epochs.current()
        point = None if (self.force_recover or self.restore_checkpoint is not None) else recovery.resume_point(epoch)
        recovery_plan = None
        if point is None:
            started = time.monotonic()
            recovery_plan = recovery.recover()
            self.metrics.recovered(time.monotonic() - started)
            point = recovery.resume_point(self.epoch)
            assert point is not None, "the epoch just restored must be joinable"
        else:
            self.epoch = epoch
        self.session = self.store.sessions.begin(self.epoch, self.stage, after=recovery.resumes_after)
        if self.session is None:
            raise CheckpointError(f"another process of {self.noun} ({self._what}) started at the "
                                  f"same instant in epoch {self.epoch}: run one process per process group")
        self.resume(point)
        self.coordinator = CheckpointCoordinator(self.config, self.tasks, self.source_ids, self.store.ids,
                                                 self.store.checkpoints.fenced(self.epoch), self.clock)
        self.coordinator.all_running()
        self.summary.epoch = self.epoch
        self._opened = True
        if recovery_plan is None:
            self.progress(f"{self.noun} ({self._what}) joined epoch {self.epoch} (session {self.session})")
        self._sync()  # commit this group's sinks up to what other processes completed since it stopped
        return recovery_plan

    @property
    def stage(self) -> str:
        """This process's session stage: its process group's name."""
        return self.group.name

    @property
    def _what(self) -> str:
        return "every vertex" if self.alone else f"process group {self.group.name}"

    def _wire_state(self) -> None:
        """Each keyed operator's state table, keyed by its input key's type: the schemas flow from
        the sources' declared columns through every operator's plan on empty inputs (nothing runs)."""
        frames: dict[tuple[str, str], DataFrame] = {}
        for vertex_id in self.order:
            if vertex_id in self.sources:
                frames[(vertex_id, RECORDS)] = self.sources[vertex_id].empty()
                continue
            op = self.operators[vertex_id]
            inputs = self._inputs(op, frames)
            state = None
            if op.kind is not OperatorKind.STATELESS:
                key_type = inputs[1].schema[op.key].dataType
                op.wire_state(key_type, inputs)
                state = op.empty_state(key_type)
            _, outputs = op.run(inputs, state)
            for name, df in outputs.items():
                frames[(vertex_id, name)] = df
        self.schemas = {k: df.schema for k, df in frames.items()}

    def _wire_logs(self) -> None:
        """Every cut edge's channel log (the columns its sender's output carries) and a gate for
        every operator that reads its inputs from them."""
        for e in self.job.cut:
            log = DeltaChannelLog(self.spark, str(e.log(self.root)), payload_of(self.schemas[(e.sender, e.output)]))
            log.create()
            self.logs[e.channel_log] = log
        self.gates = {uid: Gate(self, self.operators[uid], self.job, mode=self.mode,
                                alignment_timeout=self.alignment_timeout) for uid in self.gated}
        for gate in self.gates.values():
            gate.create()

    def point(self, group: str | None = None) -> dict[str, Any]:
        """Where a later process of process group ``group`` (None: this one's) goes on from in this
        epoch (a clean end's resume point; a restore records one for every group)."""
        members = self.members if group is None else set(self.job.group(group).vertices)
        return {
            "parallelism": self.parallelism,
            "offsets": {name: s.offset for name, s in self.sources.items() if name in members},
            "time_references": {name: s.time_reference for name, s in self.sources.items()
                                if name in members and s.time_reference is not None},
            "state_versions": {uid: op.state_version for uid, op in self.operators.items() if uid in members},
            "flushes": {uid: op.flushes for uid, op in self.operators.items() if uid in members},
            "sinks": {vid: vs.resume_state() for vid, vs in self.vertex_sinks.items() if vs and vid in members},
            "source_flushes": {name: self._source_flushes.get(name, 0) for name in self.sources if name in members},
            "seq": self.seq,
            "gates": {uid: gate.point() for uid, gate in self.gates.items() if uid in members},
        }

    def resume(self, point: dict[str, Any]) -> None:
        for name, source in self._members(self.sources):
            source.offset = int(point["offsets"].get(name, -1))
            source.time_reference = point.get("time_references", {}).get(name)
        for uid, op in self._members(self.operators):
            op.state_version = int(point["state_versions"].get(uid, -1))
            op.flushes = int(point["flushes"].get(uid, 0))
        self._source_flushes = {name: int(n) for name, n in point.get("source_flushes", {}).items()}
        self.seq = int(point.get("seq", 0))
        for uid, gate in self._members(self.gates):
            gate.resume(point.get("gates", {}).get(uid))
        for vid, vs in self._members(self.vertex_sinks):
            if vs:
                vs.resumed(point["sinks"][vid])

    def _members(self, runs: dict[str, Any]) -> list[tuple[str, Any]]:
        """The items of ``runs`` (vertex id -> its run) of this process's group."""
        return [(k, v) for k, v in runs.items() if k in self.members]

    def close(self) -> None:
        """Stop cleanly: end this process's session with its resume point."""
        if not self._opened:
            return
        self._catch_up()
        busy = [uid for uid, gate in self._members(self.gates) if gate.busy()]
        if busy:  # what they hold lives in this process only: the next start restores a checkpoint
            self.progress(f"graph {self.graph.name}: stopping with operators {', '.join(busy)} inside a checkpoint "
                          "(records held or in flight): the next start recovers from the latest completed checkpoint")
            self._opened, self._closed = False, True
            return
        self._truncate()
        self.store.sessions.end(self.epoch, self.stage, self.session, self.point())
        self._opened, self._closed = False, True

    # the run loop --------------------------------------------------------------------------------

    def run(self, until_caught_up: bool = True, max_steps: int | None = None, final_checkpoint: bool = True,
            final_kind: CheckpointKind = CheckpointKind.CHECKPOINT,
            on_step: Callable[[RunSummary], None] | None = None, handle_signals: bool = False) -> RunSummary:
        """Open, step (until caught up, or ``max_steps`` steps), take a final checkpoint (of
        ``final_kind``) and close. With ``handle_signals`` (the CLI), SIGTERM/SIGINT stop the loop
        cleanly (:meth:`request_stop`), as :meth:`PipelineRunner.run
        <checkpoint_lib.spark.runner.PipelineRunner.run>`."""
        from .signals import stop_on_signals

        started = time.monotonic()
        if not self._opened:
            self.open()
        steps = 0
        with stop_on_signals(self.request_stop) if handle_signals else nullcontext():
            while (max_steps is None or steps < max_steps) and not self._stop_requested:
                steps += 1
                moved = self.step()
                if on_step is not None:
                    on_step(self.summary)
                if not moved:
                    if until_caught_up:
                        break
                    self._idle()
        if final_checkpoint and self.group.plans_steps:
            self.summary.final = self.final_checkpoint(final_kind)
        self.close()
        self.summary.steps = steps
        self.summary.seconds = time.monotonic() - started
        return self.summary

    def request_stop(self) -> None:
        """Stop the run loop after its current step, then finish as a normal end (final
        checkpoint, clean session end). SIGTERM and Ctrl-C do this during :meth:`run` (a second
        one interrupts at once; the next start then recovers). Safe to call from another thread."""
        if not self._stop_requested:
            self.progress("stop requested: finishing the current step, then stopping cleanly")
        self._stop_requested = True

    def backlog_rows(self) -> int:
        """Rows landed in the sources beyond their offsets: what is left to read (a progress bar's
        total). Control plane only: the logs' row counts, no data read."""
        self._check_open()
        left = 0
        for _, source in self._members(self.sources):
            latest = source.reader.latest()
            if latest is not None:
                left += source.reader.pending_rows(source.offset, latest)
        return left

    def _idle(self) -> None:
        deadline = time.monotonic() + self.poll_interval
        while not self._stop_requested and time.monotonic() < deadline:
            time.sleep(min(0.2, self.poll_interval))

    def step(self) -> bool:
        """Read every source's share of the next step through the whole graph; at a checkpoint,
        snapshot every vertex. False: no source had anything new."""
        self._check_open()
        self._sync()
        polled = self._poll()  # the gates first: what their logs held before this step
        if not self.group.plans_steps:
            return polled  # the barriers come from the groups with sources, through the logs
        sources = self._members(self.sources)
        if any(s.reader.writes_on_discover for _, s in sources):
            self.fence()  # a folder source registers what landed
        proposals = {name: s.propose(self.rows_per_checkpoint) for name, s in sources}
        moved = any(p is not None for p in proposals.values())
        # the step's barrier: a periodic checkpoint (only if something new is read), or one that
        # answers "checkpoint now" requests (the snapshot DAG, ckpt savepoint of a running graph)
        effects, trigger = next_trigger(CheckpointRequests(self.root), self.coordinator, moved=moved, epoch=self.epoch,
                                        fence=self.fence, progress=self.progress)
        self._on_effects(effects)
        if not moved and trigger is None:
            return polled
        if trigger is not None:
            self.store.checkpoints.record_pending(trigger.checkpoint_id, trigger.barrier.kind,
                                                  trigger.barrier.timestamp, self.epoch)
        self._step_started, self._done_at = time.monotonic(), {}
        try:
            if moved:
                self._flow(plan_step(proposals), None if trigger is None else trigger.checkpoint_id)
            if trigger is not None:
                self._barrier(trigger)
            else:
                self._send()
        finally:
            self.uncache()
        return True

    def _poll(self) -> bool:
        """Every gate, in topological order, consumes what its input logs hold (a gate's output
        reaches the next gate in the same round). False: none had anything new."""
        moved = False
        for _, gate in self._members(self.gates):
            moved = gate.poll() or moved
        if self._truncation_due:
            self._truncate()
        return moved

    def _truncate(self) -> None:
        """Every gate of this process deletes what it consumed for good of its input logs (between
        polls: no effect is being carried out)."""
        self._truncation_due = False
        for _, gate in self._members(self.gates):
            gate.truncate()

    def _sync(self) -> None:
        """With other process groups: forget the pending checkpoints they completed or aborted, and
        commit this group's sinks up to the latest completed one (their pre-committed transactions
        wait for it; commits are idempotent, so another committer racing this one lands nothing twice)."""
        if self.alone or self.coordinator is None:
            return
        owed = any(book.pending for _, vs in self._members(self.vertex_sinks) for books in vs.books.values()
                   for book in books)
        if not owed and not self.coordinator.pending:
            return
        latest = None
        for row in self.store.checkpoints.history():
            cid, status = int(row["checkpoint_id"]), row["status"]
            if status == CheckpointStatus.COMPLETED and row["epoch"] == self.epoch:
                latest = max(latest or cid, cid)
            if cid in self.coordinator.pending and status in (CheckpointStatus.COMPLETED, CheckpointStatus.ABORTED):
                self.coordinator.finished_elsewhere(cid, status, row["completion_time"] or row["recorded_at"])
                if status == CheckpointStatus.ABORTED:
                    for gate in self.gates.values():
                        gate.abort(cid)
        if owed and latest is not None and (not self.validate_checkpoints or self.store.verdicts.validated(latest)):
            self._commit_up_to(latest)  # (validating: the process that completed it validates it first)

    def acknowledge(self, cid: int, acks: dict[SubtaskId, SubtaskAck]) -> None:
        """Subtasks of this process acknowledge checkpoint ``cid``: durable first (another process
        adopting it reads them), then the coordinator has them. With other process groups, the
        acks they recorded come first: whoever records the last ack sees every other one, so one
        of the processes completes the checkpoint (two may: the second finds it stored)."""
        if self.coordinator.status_of(cid) == CheckpointStatus.PENDING:
            self.store.acks.record(cid, acks, self.epoch)
            self._others_acks(cid, acks)
        for sid, ack in acks.items():
            self._on_effects(self.coordinator.acknowledge(cid, sid, ack).effects)

    def _others_acks(self, cid: int, mine: dict[SubtaskId, SubtaskAck]) -> None:
        """With other process groups: the acks of ``cid`` they recorded, given to the coordinator."""
        if self.alone:
            return
        for sid, (ack, _when) in sorted(self.store.acks.pending(cid, self.epoch).items()):
            if sid not in mine and self.coordinator.status_of(cid) == CheckpointStatus.PENDING:
                self._on_effects(self.coordinator.acknowledge(cid, sid, ack).effects)

    def _send(self, barrier: TriggerCheckpoint | None = None) -> None:
        """Append the step's segments on every cut edge the flow sends on, and the barrier after
        them (``barrier``), in one commit per log."""
        if self.parts:
            self.seq += 1  # past the step's segments
        held, self.deferred = self.deferred, {}
        at, self.seq = self.seq, self.seq + _width(held)  # the step before's, of the senders that lag: next
        if barrier is not None and self.sends:
            mark = (barrier.checkpoint_id, barrier.barrier.timestamp)
            for e in self.job.cut:
                if e.channel_log in self.sends:
                    senders = range(self.graph.vertex(e.sender).parallelism)
                    receivers = range(self.graph.vertex(e.receiver).parallelism)
                    self.parts.setdefault(e.channel_log, []).append(
                        (BARRIER, self.seq, mark, list(senders), list(receivers)))
            self.seq += 1
        for name in self.lags:  # a lagging sender's segment and barrier go with the next step: one step late
            slow = self.slow.get(name)
            now, later = [], []
            for part in self.parts.pop(name, []):
                keeps, lags = _split(part, slow)
                now += [keeps] if keeps is not None else []
                later += [lags] if lags is not None else []
            if now:
                self.parts[name] = now
            if later:
                self.deferred[name] = later
        self._place(held, at)
        self._write_parts()

    def _place(self, held: dict[str, list[tuple]], at: int) -> None:
        """Put what lagging senders held back (each log's parts in their order) at positions from
        ``at`` on (:func:`_width` of them): past everything a gate may have read on the log since,
        as the senders that keep pace wrote on."""
        for name, parts in held.items():
            for i, part in enumerate(sorted(parts, key=lambda part: part[1])):
                self.parts.setdefault(name, []).append((part[0], at + i, *part[2:]))

    def _catch_up(self) -> None:
        """What the lagging edges hold back reaches their logs (before a final checkpoint completes,
        and before a clean stop: a resume point's offsets are past it)."""
        if self.deferred:
            held, self.deferred = self.deferred, {}
            at, self.seq = self.seq, self.seq + _width(held)
            self._place(held, at)
            self._write_parts()

    def _slow_senders(self, lagging_senders: Mapping[str, Iterable[int]]) -> dict[str, frozenset[int] | None]:
        """``lagging_senders`` (vertex id -> its subtasks that lag) per lagging edge: an edge whose
        sender is not named lags whole (None)."""
        slow: dict[str, frozenset[int] | None] = {}
        for vertex_id, subtasks in lagging_senders.items():
            subtasks = frozenset(subtasks)
            n = self.graph.vertex(vertex_id).parallelism
            if not subtasks or not subtasks < frozenset(range(n)):
                raise ValueError(f"the lagging subtasks of {vertex_id!r} must be some of 0..{n - 1} and not all of "
                                 f"them (at least one keeps pace), got {sorted(subtasks)}")
            edges = [e.channel_log for e in self.job.cut if e.sender == vertex_id and e.channel_log in self.lags]
            if not edges:
                raise ValueError(f"{vertex_id!r} sends on no lagging input (lag one of its receivers' inputs)")
            slow.update({name: subtasks for name in edges})
        return slow

    def _write_parts(self) -> None:
        if not self.parts:
            return
        self.reached("channel_write")
        self.fence()
        for name, parts in self.parts.items():
            self.logs[name].write(sorted(parts, key=lambda part: part[1]), epoch=self.epoch)
        self.parts = {}

    def _flow(self, shares: dict[str, tuple[list, int]], barrier: int | None = None) -> None:
        """One step's records from the sources' ``shares`` through every vertex, in topological
        order: each operator with anything new runs (its sinks staged, its state MERGEd).
        ``barrier``: the checkpoint whose barrier ends the step (its sinks' last flush before it)."""
        frames: dict[tuple[str, str], DataFrame] = {}
        live: set[str] = set()
        for vertex_id in self.order:
            if vertex_id not in self.members:
                continue  # another process group's
            if vertex_id in self.sources:
                source = self.sources[vertex_id]
                files, end = shares.get(vertex_id, ([], source.offset))
                if files:
                    try:
                        df = source.read(files, end, self.epoch, self.reached)
                    except Exception as exc:
                        lost = source.lost(files)
                        if lost is not None:
                            raise lost from exc
                        raise
                    self.summary.rows_in += sum(max(f.rows, 0) for f in files)
                    live.add(vertex_id)
                    sinks = self.vertex_sinks[vertex_id]
                    if sinks:
                        n = self._source_flushes[vertex_id] = self._source_flushes.get(vertex_id, 0) + 1
                        self.reached("flush_stage")
                        self.fence()
                        sinks.stage({RECORDS: df.withColumn(SINK_SUBTASK, F.col("sender"))}, n,
                                    f"source {vertex_id!r}", barrier=barrier)
                    self._segments(vertex_id, RECORDS, df, "sender")
                else:
                    df = source.empty()
                frames[(vertex_id, RECORDS)] = df
                self._done_at[vertex_id] = time.monotonic()
                continue
            if vertex_id in self.gates:
                continue  # it reads its inputs from logs (its gate, polled at the step's start)
            op = self.operators[vertex_id]
            senders = {e.sender for e in self.graph.inputs_of(vertex_id)}
            inputs = self._inputs(op, frames)
            if not senders & live:
                # nothing new reaches it: no state read or change, no sink rows, nothing sent on (as a
                # Flink operator emits only for records); its plan on empty state gives its outputs' columns
                empty = op.empty_state(inputs[1].schema[op.key].dataType) if op.state is not None else None
                _, outputs = op.run(inputs, empty)
                frames.update({(vertex_id, name): df.limit(0) for name, df in outputs.items()})
                continue
            live.add(vertex_id)
            state = None
            if op.state is not None:
                state = self.cached(op.read_state(inputs))
            deltas, outputs, newest = op.step(inputs, state, self.cached)
            # an output read more than once (by sinks and edges) is computed once; caching one read
            # once would cost more (planning the cache) than it saves
            outputs = {name: self.cached(df) if self.readers[(vertex_id, name)] > 1 else df
                       for name, df in outputs.items()}
            op.flushes += 1
            self.reached("flush_stage")
            self.fence()
            op.sinks.stage(outputs, op.flushes, f"operator {vertex_id!r}", barrier=barrier)
            if deltas is not None:
                self.fence()
                self.reached("flush_merge")  # past its epoch check, the state's run not yet committed
                op.update_state(deltas, self.fence, self.epoch, newest, current=state, reached=self.reached)
            frames.update({(vertex_id, name): df for name, df in outputs.items()})
            for name, df in outputs.items():
                self._segments(vertex_id, name, df, SINK_SUBTASK)
            self._done_at[vertex_id] = time.monotonic()
        for name, (_files, end) in shares.items():
            self.sources[name].advance(end)

    def _segments(self, vertex_id: str, output: str, df: DataFrame, sender: str) -> None:
        """The step's records of ``vertex_id``'s ``output`` as one segment on each cut edge it
        sends them on (the sending subtask in column ``sender``), written with the step's end."""
        for e in self.job.outputs_of(vertex_id):
            if e.output == output and e.channel_log in self.sends:
                receiver = self.graph.vertex(e.receiver)
                routed = segment(df, e, receiver.parallelism, sender=sender, key=e.edge.key,
                                 max_parallelism=self.graph.max_parallelism)
                self.parts.setdefault(e.channel_log, []).append((DATA, self.seq, routed))

    def _inputs(self, op: OperatorVertexRun, frames: dict[tuple[str, str], DataFrame]) -> dict[int, DataFrame]:
        """The operator's inputs this step: per input, every edge into it routed to its subtasks
        (:data:`SINK_SUBTASK`: the receiving one), the columns the operator sees."""
        inputs: dict[int, DataFrame] = {}
        for edge in self.graph.inputs_of(op.uid):
            if (edge.sender, edge.output) not in frames:
                continue  # a feedback edge, while the columns are inferred (it carries the operator's own output)
            df = frames[(edge.sender, edge.output)]
            sender = "sender" if edge.sender in self.sources else SINK_SUBTASK
            routed = route_records(df, str(edge.partitioning), op.P, sender=sender, key=edge.key,
                                   max_parallelism=self.graph.max_parallelism)
            ours = {"sender", "receiver", KEY_GROUP, SINK_SUBTASK}
            routed = routed.select(*[F.col(f"`{c}`") for c in df.columns if c not in ours],
                                   F.col("receiver").alias(SINK_SUBTASK))
            have = inputs.get(edge.input)
            inputs[edge.input] = routed if have is None else have.unionByName(routed, allowMissingColumns=True)
        return inputs

    # checkpoints ---------------------------------------------------------------------------------

    def _barrier(self, trigger: TriggerCheckpoint) -> None:
        """The step's end is checkpoint ``trigger``'s barrier on every channel at once: every
        vertex snapshots, the acks are durable in one commit, then the coordinator has them."""
        cid = trigger.checkpoint_id
        self.reached("snapshot")
        acks: dict[SubtaskId, SubtaskAck] = {}
        for vertex_id in self.order:
            if vertex_id in self.gates or vertex_id not in self.members:
                continue  # its subtasks snapshot when their handlers align (Gate), or in another process
            vertex = self._vertex(vertex_id)
            if vertex_id in self.sources:
                mine = {**vertex.acks(), **self.vertex_sinks[vertex_id].acks(cid)}
            else:
                mine = vertex.acks(cid)
            # a chained step has no per-subtask timing: each subtask's ack reports when its vertex
            # was done with the step (its reads, sink rows and MERGE), from the step's start
            done = (self._done_at.get(vertex_id, time.monotonic()) - self._step_started) * 1000
            acks.update({sid: dataclasses.replace(ack, duration_ms=round(done, 1)) for sid, ack in mine.items()})
        if self.group.plans_steps:
            self.reached("source_ack")  # the sources' offsets (with the chained vertices' acks) not durable yet
        self.reached("ack")
        self.store.acks.record(cid, acks, self.epoch)  # durable before the barrier enters a log
        self._send(trigger)
        self._others_acks(cid, acks)  # none yet, unless a group downstream outran this one's commit
        for sid, ack in acks.items():
            self._on_effects(self.coordinator.acknowledge(cid, sid, ack).effects)

    def final_checkpoint(self, kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> int:
        """Take a checkpoint now (every record read so far is in it) and wait for it to complete.
        A process group with sources but not every vertex injects the barrier and returns: the
        checkpoint completes when the groups downstream have run (as a linear source stage's)."""
        self._check_open()
        if not self.group.plans_steps:
            raise CheckpointError(f"process group {self.group.name} of graph {self.graph.name!r} has no source: only "
                                  "a group with sources injects a checkpoint barrier")
        self._sync()
        trigger = self.coordinator.trigger(kind)
        self.store.checkpoints.record_pending(trigger.checkpoint_id, trigger.barrier.kind, trigger.barrier.timestamp,
                                              self.epoch)
        self._step_started, self._done_at = time.monotonic(), {}
        self._barrier(trigger)
        self._catch_up()
        if not self.alone:
            self.progress(f"{kind.value} {trigger.checkpoint_id} injected: it completes when the process groups "
                          "downstream have run")
            return trigger.checkpoint_id
        while self.coordinator.status_of(trigger.checkpoint_id) == CheckpointStatus.PENDING and self.gates:
            if not self._poll():  # its barrier travels through the gates
                if any(g.alignment_timeout is not None for g in self.gates.values()):
                    self._idle()
                    continue
                break
        status = self.coordinator.status_of(trigger.checkpoint_id)
        if status != CheckpointStatus.COMPLETED:
            raise CheckpointError(f"final {kind.value} {trigger.checkpoint_id} did not complete: {status}")
        return trigger.checkpoint_id

    def adopt(self, cid: int) -> None:
        """Make the coordinator know checkpoint ``cid``, triggered by another process of this graph,
        with the acks already recorded (one it knows, or that is no longer pending, is left alone)."""
        self._on_effects(adopt(self.store, self.coordinator, cid, self.epoch))

    def on_effects(self, effects: Any) -> None:
        """Carry out the coordinator's effects (what a gate's ack or decline returns)."""
        self._on_effects(effects)

    def _on_effects(self, effects: Any) -> None:
        for e in effects:
            if isinstance(e, CheckpointCompleted):
                self.reached("complete")
                c = e.checkpoint
                self.metrics.checkpoint_completed(c)
                self.summary.completed.append(c.checkpoint_id)
                if len(self.sources) == 1:  # one source (a linear pipeline's): no name needed
                    offsets = f"source version {next(iter(self.sources.values())).offset}, "
                else:
                    offsets = "source versions: " + ", ".join(f"{n} {s.offset}" for n, s in self.sources.items()) + "; "
                self.progress(f"checkpoint {c.checkpoint_id} completed in {c.duration * 1000:.0f} ms "
                              f"({offsets}{self.summary.rows_in} rows read)")
            elif isinstance(e, NotifyCheckpointComplete):
                if self.validate_checkpoints:
                    self._validate_before_commit(e.checkpoint_id)
                self._commit_up_to(e.checkpoint_id)
            elif isinstance(e, CheckpointAborted):
                if not record_aborted(self.store, e, self.epoch):
                    continue
                self.metrics.checkpoint_failed(e.reason.value)
                self.summary.aborted.append((e.checkpoint_id, e.reason.value))
                self.progress(f"checkpoint {e.checkpoint_id} aborted: {e.reason.value} {e.message}".rstrip())
                for gate in self.gates.values():
                    gate.abort(e.checkpoint_id)
            elif isinstance(e, FailJob):
                raise too_many_failed(e)

    def _validate_before_commit(self, cid: int) -> None:
        """The per-checkpoint GX suite on ``cid`` (durable, not committed yet), and its verdict
        recorded (:func:`~checkpoint_lib.quality.validate_before_commit`): nothing commits ``cid``
        before it is validated. A failure (or a validation that cannot run) discards ``cid`` and
        stops the run: its transactions never commit, the next start restores the last checkpoint
        that passed. A verdict that lost to another attempt's follows theirs."""
        from ..quality import validate_before_commit

        validate_before_commit(self.spark, self.graph.name, self.warehouse, self.store, cid, self.progress,
                               epoch=self.epoch, kill_point=self.reached)

    def _commit_up_to(self, cid: int) -> None:
        """Checkpoint ``cid`` is complete: every sink commits its transactions up to it (one Delta
        commit per sink, idempotent and fenced inside the commit), then forgets them."""
        self.reached("commit")
        books = {name: books for _, vs in self._members(self.vertex_sinks) for name, books in vs.books.items()}

        def committed(name: str, txns: list) -> None:
            self.reached("sink_commit")  # this sink committed, the next ones not yet
            self.writers[name].discard(txns)

        twophase.commit_up_to(books, cid, lambda name, txns: self.writers[name].commit(txns, cid, self.epoch),
                              after=committed)
        self._completions += 1
        if self._completions % completion.TRUNCATE_EVERY == 0:  # every truncation is a Delta commit: batch them
            self._truncation_due = True

    def _check_open(self) -> None:
        if not self._opened:
            raise RuntimeError("the runner is closed" if self._closed else "call open() first")


__all__ = ["GraphRunner", "plan_step"]

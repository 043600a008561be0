"""Running a dataflow graph (:class:`~checkpoint_lib.graph.StreamGraph`) on Spark + Delta: one
process, every edge chained.

:class:`GraphRunner` runs the job graph :func:`~checkpoint_lib.graph.plan` makes of the graph in
:attr:`~checkpoint_lib.graph.Layout.CHAINED`: every vertex in this process, every edge chained, so
a step flows from every source through every operator in topological order within Spark plans
(Spark does the shuffles), and a checkpoint's barrier reaches every input channel of every subtask
at the step's end with nothing in flight: aligned in every mode, no channel state. A step:

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
their offsets. A graph with a cycle (``iterate``) or a layout of several processes is not run here
yet: the linear runner (:class:`~checkpoint_lib.spark.runner.PipelineRunner`) runs ``transfers``.

Kill points (:mod:`checkpoint_lib.killpoints`): ``source_read``, ``dlq``, ``flush_stage``,
``flush_merge``, ``snapshot``, ``ack``, ``complete``, ``commit``, ``sink_commit``, and the
recovery's ``fence``, ``recover``, ``restore``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from contextlib import nullcontext
from typing import Any, Callable

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
from ..graph.jobgraph import ALL, plan
from ..graph.steps import plan_step
from ..graph.model import RECORDS, OperatorKind, StreamGraph
from ..killpoints import KillPoints
from ..layout import checkpoint_root, warehouse_location
from ..pipeline import FolderSource
from ..reserved import KEY_GROUP, SINK_SUBTASK
from .completion import record_aborted, too_many_failed
from .context import RunSummary, StepCache
from .partitioning import route_records
from .session import use_warehouse
from .sinks import pipeline_sinks
from .vertices.operator import OperatorVertexRun
from .vertices.sinks import VertexSinks
from .vertices.source import SourceVertexRun

STAGE = ALL
"""The session stage of a graph's one process: its process group (as the linear runner's ``stage="all"``)."""


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
    ):
        self.graph = graph
        self.job = plan(graph)
        cut = [e for e in self.job.edges if e.channel_log is not None]
        if cut:
            raise ValueError(
                f"graph {graph.name!r}: edges {', '.join(f'{e.sender} -> {e.receiver}' for e in cut)} must be cut by a "
                "channel log (a cycle through iterate()): the graph runner runs graphs whose edges all chain in one "
                "process; run a cycle as a linear pipeline (PipelineRunner)")
        problems = []
        if sum(isinstance(v.spec, FolderSource) for v in graph.sources) > 1:
            problems.append("more than one landing-folder source (their manifests would share one folder)")
        problems += [f"operator {v.uid!r} has dead letters: write its bad rows with a sink (output(name).sink(...))"
                     for v in graph.operators if graph.dead_letters_of(v.uid)]
        if problems:
            raise ValueError(f"graph {graph.name!r} cannot run yet: " + "; ".join(problems))
        if rows_per_checkpoint < 1:
            raise ValueError(f"rows_per_checkpoint must be >= 1, got {rows_per_checkpoint}")
        self.mode = BarrierMode(mode)  # every mode is aligned here: every edge is chained
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
        self.epoch = 0
        self.coordinator: CheckpointCoordinator | None = None
        self.summary = RunSummary(0, None)
        self.session: int | None = None
        self._opened = self._closed = self._stop_requested = False
        self.step_cache = StepCache()  # what several writes of a step read, computed once
        self.cached, self.uncache = self.step_cache.cached, self.step_cache.uncache
        self._step_started, self._done_at = time.monotonic(), {}  # when the step began, each vertex was done
        self._source_flushes: dict[str, int] = {}  # a source vertex's sink flushes (the operators keep theirs)

        self.writers = pipeline_sinks(spark, graph, self.warehouse, self.root, self.store.epochs.check)
        self.sources = {v.name: SourceVertexRun(v, graph, spark=spark, warehouse=self.warehouse, root=self.root,
                                                progress=self.progress) for v in graph.sources}
        self.vertex_sinks = {v.id: VertexSinks({s.name: (self.writers[s.name], s.output) for s in graph.sinks_of(v.id)},
                                               v.parallelism, self._pool) for v in graph.vertices}
        self.operators = {
            v.uid: OperatorVertexRun(v, graph, spark=spark, root=self.root, sinks=self.vertex_sinks[v.uid],
                                     key=graph.inputs_of(v.uid)[0].key if v.kind is not OperatorKind.STATELESS else None)
            for v in graph.operators
        }
        self.order = [v.id for v in graph.topological_order()]
        self.readers: Counter[tuple[str, str]] = Counter(
            [(e.sender, e.output) for e in graph.edges] + [(s.vertex, s.output) for s in graph.sinks])
        """How many sinks and edges read each output of each vertex."""
        self.tasks = [sid for v in graph.vertices for sid in self._vertex(v.id).ids]
        self.tasks += [sid for vs in self.vertex_sinks.values() for ids in vs.ids.values() for sid in ids]
        self.source_ids = [sid for s in self.sources.values() for sid in s.ids]

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
            recovery_plan = recovery.recover()
            point = recovery.resume_point(self.epoch)
            assert point is not None, "the epoch just restored must be joinable"
        else:
            self.epoch = epoch
        self.session = self.store.sessions.begin(self.epoch, STAGE, after=recovery.resumes_after)
        if self.session is None:
            raise CheckpointError(f"another process of graph {self.graph.name!r} started at the same instant in "
                                  f"epoch {self.epoch}: run one process per graph")
        self.resume(point)
        self.coordinator = CheckpointCoordinator(self.config, self.tasks, self.source_ids, self.store.ids,
                                                 self.store.checkpoints.fenced(self.epoch), self.clock)
        self.coordinator.all_running()
        self.summary.epoch = self.epoch
        self._opened = True
        if recovery_plan is None:
            self.progress(f"graph {self.graph.name} joined epoch {self.epoch} (session {self.session})")
        return recovery_plan

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

    def point(self) -> dict[str, Any]:
        """Where a later process of this epoch goes on from (a clean end's resume point)."""
        return {
            "parallelism": self.parallelism,
            "offsets": {name: s.offset for name, s in self.sources.items()},
            "state_versions": {uid: op.state_version for uid, op in self.operators.items()},
            "flushes": {uid: op.flushes for uid, op in self.operators.items()},
            "sinks": {vid: vs.resume_state() for vid, vs in self.vertex_sinks.items() if vs},
            "source_flushes": {name: self._source_flushes.get(name, 0) for name in self.sources},
        }

    def resume(self, point: dict[str, Any]) -> None:
        for name, source in self.sources.items():
            source.offset = int(point["offsets"].get(name, -1))
        for uid, op in self.operators.items():
            op.state_version = int(point["state_versions"].get(uid, -1))
            op.flushes = int(point["flushes"].get(uid, 0))
        self._source_flushes = {name: int(n) for name, n in point.get("source_flushes", {}).items()}
        for vid, vs in self.vertex_sinks.items():
            if vs:
                vs.resumed(point["sinks"][vid])

    def close(self) -> None:
        """Stop cleanly: end this process's session with its resume point."""
        if not self._opened:
            return
        self.store.sessions.end(self.epoch, STAGE, self.session, self.point())
        self._opened, self._closed = False, True

    # the run loop --------------------------------------------------------------------------------

    def run(self, until_caught_up: bool = True, max_steps: int | None = None, final_checkpoint: bool = True,
            final_kind: CheckpointKind = CheckpointKind.CHECKPOINT,
            on_step: Callable[[RunSummary], None] | None = None, handle_signals: bool = False) -> RunSummary:
        """Open, step (until caught up, or ``max_steps`` steps), take a final checkpoint (of
        ``final_kind``) and close. With ``handle_signals`` (the CLI), SIGTERM/SIGINT stop the loop
        cleanly (:meth:`request_stop`), as :meth:`PipelineRunner.run
        <checkpoint_lib.spark.runner.PipelineRunner.run>`."""
        from .runner import stop_on_signals

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
        if final_checkpoint:
            self.summary.final = self.final_checkpoint(final_kind)
        self.close()
        self.summary.steps = steps
        self.summary.seconds = time.monotonic() - started
        return self.summary

    def request_stop(self) -> None:
        self._stop_requested = True

    def backlog_rows(self) -> int:
        """Rows landed in the sources beyond their offsets: what is left to read (a progress bar's
        total). Control plane only: the logs' row counts, no data read."""
        self._check_open()
        left = 0
        for source in self.sources.values():
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
        if any(s.reader.writes_on_discover for s in self.sources.values()):
            self.fence()  # a folder source registers what landed
        proposals = {name: s.propose(self.rows_per_checkpoint) for name, s in self.sources.items()}
        moved = any(p is not None for p in proposals.values())
        # the step's barrier: a periodic checkpoint (only if something new is read), or one that
        # answers "checkpoint now" requests (the snapshot DAG, ckpt savepoint of a running graph)
        effects, trigger = next_trigger(CheckpointRequests(self.root), self.coordinator, moved=moved, epoch=self.epoch,
                                        fence=self.fence, progress=self.progress)
        self._on_effects(effects)
        if not moved and trigger is None:
            return False
        if trigger is not None:
            self.store.checkpoints.record_pending(trigger.checkpoint_id, trigger.barrier.kind,
                                                  trigger.barrier.timestamp, self.epoch)
        self._step_started, self._done_at = time.monotonic(), {}
        if moved:
            try:
                self._flow(plan_step(proposals))
            finally:
                self.uncache()
        if trigger is not None:
            self._barrier(trigger)
        return True

    def _flow(self, shares: dict[str, tuple[list, int]]) -> None:
        """One step's records from the sources' ``shares`` through every vertex, in topological
        order: each operator with anything new runs (its sinks staged, its state MERGEd)."""
        frames: dict[tuple[str, str], DataFrame] = {}
        live: set[str] = set()
        for vertex_id in self.order:
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
                                    f"source {vertex_id!r}")
                else:
                    df = source.empty()
                frames[(vertex_id, RECORDS)] = df
                self._done_at[vertex_id] = time.monotonic()
                continue
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
                state = self.cached(op.state.read(op.state_version if op.state_version >= 0 else None).drop(KEY_GROUP))
            deltas, outputs, expire_before = op.step(inputs, state, self.cached)
            # an output read more than once (by sinks and edges) is computed once; caching one read
            # once would cost more (planning the cache) than it saves
            outputs = {name: self.cached(df) if self.readers[(vertex_id, name)] > 1 else df
                       for name, df in outputs.items()}
            op.flushes += 1
            self.reached("flush_stage")
            self.fence()
            op.sinks.stage(outputs, op.flushes, f"operator {vertex_id!r}")
            if deltas is not None:
                self.fence()
                self.reached("flush_merge")  # past its epoch check, the MERGE not yet committed
                op.update_state(deltas, self.fence, self.epoch, expire_before)
            frames.update({(vertex_id, name): df for name, df in outputs.items()})
            self._done_at[vertex_id] = time.monotonic()
        for name, (_files, end) in shares.items():
            self.sources[name].advance(end)

    def _inputs(self, op: OperatorVertexRun, frames: dict[tuple[str, str], DataFrame]) -> dict[int, DataFrame]:
        """The operator's inputs this step: per input, every edge into it routed to its subtasks
        (:data:`SINK_SUBTASK`: the receiving one), the columns the operator sees."""
        inputs: dict[int, DataFrame] = {}
        for edge in self.graph.inputs_of(op.uid):
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
            vertex = self._vertex(vertex_id)
            if vertex_id in self.sources:
                mine = {**vertex.acks(), **self.vertex_sinks[vertex_id].acks(cid)}
            else:
                mine = vertex.acks(cid)
            # a chained step has no per-subtask timing: each subtask's ack reports when its vertex
            # was done with the step (its reads, sink rows and MERGE), from the step's start
            done = (self._done_at.get(vertex_id, time.monotonic()) - self._step_started) * 1000
            acks.update({sid: dataclasses.replace(ack, duration_ms=round(done, 1)) for sid, ack in mine.items()})
        self.reached("ack")
        self.store.acks.record(cid, acks, self.epoch)
        for sid, ack in acks.items():
            self._on_effects(self.coordinator.acknowledge(cid, sid, ack).effects)

    def final_checkpoint(self, kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> int:
        """Take a checkpoint now (every record read so far is in it) and wait for it to complete."""
        self._check_open()
        trigger = self.coordinator.trigger(kind)
        self.store.checkpoints.record_pending(trigger.checkpoint_id, trigger.barrier.kind, trigger.barrier.timestamp,
                                              self.epoch)
        self._step_started, self._done_at = time.monotonic(), {}
        self._barrier(trigger)
        status = self.coordinator.status_of(trigger.checkpoint_id)
        if status != CheckpointStatus.COMPLETED:
            raise CheckpointError(f"final {kind.value} {trigger.checkpoint_id} did not complete: {status}")
        return trigger.checkpoint_id

    def _on_effects(self, effects: Any) -> None:
        for e in effects:
            if isinstance(e, CheckpointCompleted):
                self.reached("complete")
                c = e.checkpoint
                self.summary.completed.append(c.checkpoint_id)
                offsets = ", ".join(f"{n} {s.offset}" for n, s in self.sources.items())
                self.progress(f"checkpoint {c.checkpoint_id} completed in {c.duration * 1000:.0f} ms "
                              f"(source versions: {offsets}; {self.summary.rows_in} rows read)")
            elif isinstance(e, NotifyCheckpointComplete):
                self._commit_up_to(e.checkpoint_id)
            elif isinstance(e, CheckpointAborted):
                if not record_aborted(self.store, e, self.epoch):
                    continue
                self.summary.aborted.append((e.checkpoint_id, e.reason.value))
                self.progress(f"checkpoint {e.checkpoint_id} aborted: {e.reason.value} {e.message}".rstrip())
            elif isinstance(e, FailJob):
                raise too_many_failed(e)

    def _commit_up_to(self, cid: int) -> None:
        """Checkpoint ``cid`` is complete: every sink commits its transactions up to it (one Delta
        commit per sink, idempotent and fenced inside the commit), then forgets them."""
        self.reached("commit")
        books = {name: books for vs in self.vertex_sinks.values() for name, books in vs.books.items()}

        def committed(name: str, txns: list) -> None:
            self.reached("sink_commit")  # this sink committed, the next ones not yet
            self.writers[name].discard(txns)

        twophase.commit_up_to(books, cid, lambda name, txns: self.writers[name].commit(txns, cid, self.epoch),
                              after=committed)

    def _check_open(self) -> None:
        if not self._opened:
            raise RuntimeError("the runner is closed" if self._closed else "call open() first")


__all__ = ["GraphRunner", "plan_step"]

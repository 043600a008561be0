"""A gated vertex of a running graph: an operator that reads its inputs from channel logs.

Where the job graph cuts an operator's inputs (:attr:`~checkpoint_lib.graph.JobGraph.gated`: its
sender runs in another process, a cycle, a lagging input, or a sender that is itself gated), the
operator's subtasks align barriers over **all** their input channels, whatever edge they come from,
as Flink's input gates do: one core barrier handler per subtask
(:func:`~checkpoint_lib.core.barriers.create_handler`), its channels numbered across the input edges
by the plan's :class:`~checkpoint_lib.graph.ChannelMap`. :meth:`Gate.poll` indexes each input edge's
log past its cursor (metadata: one small aggregation; none when the log did not move), hands the
segments, barriers and ends to the handlers and carries out their effects in Spark, as the linear
runner's keyed stage does:

- deliveries are applied in **flushes** (every subtask's delivered segments up to the next
  snapshot, read per input edge, one run of the operator): its sinks' rows staged into each
  subtask's open transaction, its keyed state MERGEd, and what it sends on appended to each output
  edge's log as one segment (sender = the producing subtask);
- a **snapshot** (after a flush) pins the subtask's key groups of the state table's version and
  pre-commits its sinks' transactions; its **forwarded barrier** goes onto every output edge's log
  on the subtask's channels, after what it sent before the snapshot and before what it sends after;
- in unaligned mode the in-flight segments it logs are copied, at its acknowledgement, to the
  channel-state table of their edge (:func:`~checkpoint_lib.layout.channel_state_table`): channel
  state per input edge;
- the acknowledgement is made durable, then given to the coordinator;
- now and then (:meth:`Gate.truncate`) what it consumed for good of its input logs is deleted.

A new epoch (a recovery) starts every log empty (a reader reads only its own epoch's rows): what was
in flight at the checkpoint restored is in its state or its channel state (replayed first,
:meth:`Gate.replay_channel_state`), what came after is sent again by the replay upstream.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ...core.acks import KeyedAckState, PinnedState
from ...core.barriers import (ChannelStateComplete, CheckpointDone, DeclineCheckpoint, Deliver, ForwardBarrier,
                              LogChannelState, TakeSnapshot, carry_out, create_handler)
from ...core.keygroups import range_for_subtask
from ...core.recovery import RecoveryPlan
from ...core.types import Barrier, BarrierMode, SubtaskAck
from ...graph.jobgraph import JobEdge, JobGraph
from ...layout import channel_state_table
from ...reserved import KEY_GROUP, SINK_SUBTASK
from ..channels import BARRIER, CHANNEL_STATE_ROW_BYTES, DATA, END, ChannelEvent, ChannelStateTable
from ..partitioning import route_records
from .operator import OperatorVertexRun

OURS = ("sender", "receiver", KEY_GROUP, SINK_SUBTASK)
"""Routing columns of ours that a channel log's records never carry."""


def payload_of(schema: T.StructType) -> T.StructType:
    """What a channel log of an edge carries: the sender's output columns, without ours, every one
    nullable (a log carries records, it does not hold them to the nullability a plan on empty
    inputs inferred: a literal is never null there, a column of a left join may be)."""
    return T.StructType([T.StructField(f.name, _nullable(f.dataType), True) for f in schema.fields if f.name not in OURS])


def _nullable(kind: T.DataType) -> T.DataType:
    if isinstance(kind, T.StructType):
        return T.StructType([T.StructField(f.name, _nullable(f.dataType), True) for f in kind.fields])
    if isinstance(kind, T.ArrayType):
        return T.ArrayType(_nullable(kind.elementType), True)
    if isinstance(kind, T.MapType):
        return T.MapType(kind.keyType, _nullable(kind.valueType), True)
    return kind


def segment(df: DataFrame, edge: JobEdge, parallelism: int, *, sender: str, key: str | None,
            max_parallelism: int) -> DataFrame:
    """``df`` (a sender's output, the sending subtask in column ``sender``) routed to the
    receiver's ``parallelism`` subtasks over ``edge``: what one segment of its log holds
    (``sender``, ``receiver`` and the record)."""
    routed = route_records(df, str(edge.edge.partitioning), parallelism, sender=sender, key=key,
                           max_parallelism=max_parallelism)
    if sender != "sender":
        routed = routed.drop("sender").withColumnRenamed(sender, "sender")
    return routed


@dataclass
class _Snapshot:
    """A subtask's snapshot of a checkpoint, kept until it acknowledges."""

    acks: dict[Any, SubtaskAck]  # its own (without timings) and each of its sink subtasks'
    unaligned: bool
    alignment_ms: float
    started: float


class Gate:
    """Operator vertex ``op`` reading its inputs from their channel logs (see the module).
    ``runner``: the graph runner it runs in (the epoch, the store, the coordinator, the fences,
    the kill points, the step cache and ``logs``: every cut edge's :class:`DeltaChannelLog`)."""

    def __init__(self, runner: Any, op: OperatorVertexRun, job: JobGraph, *, mode: BarrierMode,
                 alignment_timeout: float | None):
        self.r, self.op = runner, op
        self.inputs = job.inputs_of(op.uid)
        self.outputs = job.outputs_of(op.uid)
        self.map = job.channel_map(op.uid)
        self.mode, self.alignment_timeout = mode, alignment_timeout
        graph = job.graph
        self.receivers = {e.channel_log: graph.vertex(e.receiver).parallelism for e in self.outputs}
        self.channel_state = {e.channel_log: ChannelStateTable(
            runner.spark, str(channel_state_table(runner.root, e.channel_log)), runner.logs[e.channel_log].payload)
            for e in self.inputs}
        self.reset()

    def reset(self) -> None:
        """Fresh in-memory state of one process (handlers, positions, buffers)."""
        self.handlers = [create_handler(self.map.channels, self.mode, self.r.clock,
                                        alignment_timeout=self.alignment_timeout) for _ in range(self.op.P)]
        self.cursors = {e.channel_log: -1 for e in self.inputs}  # the last position read of each input log
        self.seq = 0  # the next position on its output logs (one count for all of them)
        self.parts: dict[str, list[tuple]] = defaultdict(list)  # per output log: not written yet
        self.pending: dict[int, list[tuple[int, ChannelEvent]]] = defaultdict(list)  # delivered, not applied
        self.logged: dict[tuple[int, int], list[tuple[int, ChannelEvent]]] = defaultdict(list)  # channel state
        self.snapshots: dict[tuple[int, int], _Snapshot] = {}
        self.barrier_seqs: dict[tuple[int, int], dict[int, int]] = defaultdict(dict)
        """Per (checkpoint, subtask): the log position of the checkpoint's barrier on each input
        channel it arrived on (acknowledged with the snapshot: the cut of every channel)."""
        self.truncated = {e.channel_log: -1 for e in self.inputs}  # each input log's last truncation

    def create(self) -> None:
        for table in self.channel_state.values():
            table.create()

    # resume points -----------------------------------------------------------------------------

    def point(self) -> dict[str, Any]:
        return {"cursors": dict(self.cursors), "seq": self.seq}

    def resume(self, point: dict[str, Any] | None) -> None:
        self.reset()
        if point:
            self.cursors.update({k: int(v) for k, v in point["cursors"].items() if k in self.cursors})
            self.seq = int(point["seq"])

    def busy(self) -> bool:
        """Whether it holds anything a clean stop would lose: a checkpoint under way, records held,
        delivered but not applied, or logged as channel state and not written."""
        return bool(self.pending or self.logged or self.snapshots or any(
            h.aligning is not None or h.logging_channel_state or h.held or h.tracked for h in self.handlers))

    # reading the logs ----------------------------------------------------------------------------

    def poll(self) -> bool:
        """Consume what the input logs hold past the cursors. False: nothing new happened."""
        switched = False
        if self.alignment_timeout is not None:  # aligned-with-timeout: switch even with no new event
            timed = {r: h.on_timer() for r, h in enumerate(self.handlers)}
            if any(timed.values()):
                switched = True
                self.execute(timed)
        effects: dict[int, list] = {r: [] for r in range(self.op.P)}
        arrived: list[tuple[int, int, ChannelEvent]] = []
        for i, edge in enumerate(self.inputs):
            name = edge.channel_log
            events = self.r.logs[name].index_past(self.r.epoch, self.cursors[name])
            if events:
                self.cursors[name] = max(e.seq for e in events)
                arrived += [(e.seq, i, e) for e in events]
        # position order across the logs (a step's segments share a position on every log its flow
        # sends on, and its barriers the next one); at one position, edge by edge, in sender order
        for _, i, e in sorted(arrived, key=lambda a: (a[0], a[1], a[2].sender, a[2].receiver)):
            h, channel = self.handlers[e.receiver], self.map.channel(i, e.sender)
            if e.kind == DATA:
                effects[e.receiver] += h.on_record(channel, (i, e))
            elif e.kind == BARRIER:
                self.r.adopt(int(e.checkpoint_id))
                self.barrier_seqs[(int(e.checkpoint_id), e.receiver)][channel] = e.seq
                effects[e.receiver] += h.on_barrier(channel, Barrier(int(e.checkpoint_id), float(e.barrier_ts or 0.0)))
            elif e.kind == END:
                effects[e.receiver] += h.on_end_of_channel(channel)
        if arrived:
            self.execute(effects)
        return bool(arrived) or switched

    def truncate(self) -> None:
        """Delete what each input log holds at or before the positions this gate consumed for good:
        read (the cursor) and pointed at by nothing in memory (deliveries not flushed, channel
        state not written, records an aligning handler holds). A restore never reads them again: a
        new epoch starts every log empty, and what a checkpoint needs of them is in its channel
        state. Only between polls (an effect not yet carried out may point at any position), and
        only this epoch's rows and older ones (a stalled older process never deletes a newer
        epoch's). One Delta commit per log that moved on."""
        lowest = {name: float("inf") for name in self.cursors}
        held = [e for records in (*self.pending.values(), *self.logged.values()) for e in records]
        held += [e for h in self.handlers for e in h.held_records]
        for i, e in held:
            name = self.inputs[i].channel_log
            lowest[name] = min(lowest[name], e.seq)
        for name, cursor in self.cursors.items():
            upto = int(min(cursor, lowest[name] - 1))
            if upto > self.truncated[name]:
                self.r.logs[name].truncate_upto(upto, self.r.epoch)
                self.truncated[name] = upto

    # carrying out the handlers' effects --------------------------------------------------------------

    def abort(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted: every subtask drops it."""
        self.snapshots = {k: v for k, v in self.snapshots.items() if k[0] != checkpoint_id}
        for key in [k for k in self.barrier_seqs if k[0] == checkpoint_id]:
            del self.barrier_seqs[key]
        self.execute({r: h.on_checkpoint_aborted(checkpoint_id) for r, h in enumerate(self.handlers)})

    def execute(self, effects: dict[int, list]) -> None:
        """Carry out the handlers' effects in order per subtask, batching Spark work: deliveries
        up to the next snapshot of every subtask are applied in one flush."""
        carry_out(effects, self._effect, self._flush, self._snapshot)
        self._write()

    def _effect(self, r: int, e: Any) -> None:
        if isinstance(e, Deliver):
            self.pending[r].append(e.record)
        elif isinstance(e, LogChannelState):
            self.logged[(e.checkpoint_id, r)].append(e.record)
        elif isinstance(e, ForwardBarrier):
            # onto every output edge, on the subtask's channels, after what it sent before its snapshot
            mark = (e.barrier.checkpoint_id, e.barrier.timestamp)
            for edge in self.outputs:
                name = edge.channel_log
                self.parts[name].append((BARRIER, self.seq, mark, [r], list(range(self.receivers[name]))))
            self.seq += 1
        elif isinstance(e, ChannelStateComplete):
            pass
        elif isinstance(e, CheckpointDone):
            self._ack(r, e.checkpoint_id)
        elif isinstance(e, DeclineCheckpoint):
            self.r.on_effects(self.r.coordinator.decline(e.checkpoint_id, self.op.ids[r], e.reason))

    def _write(self) -> None:
        """Append what waits for each output log (segments and barriers) in one commit per log."""
        if not any(self.parts.values()):
            return
        cycle = any(e.feedback for e in self.outputs if self.parts.get(e.channel_log))
        self.r.reached("feedback_write" if cycle else "channel_write")  # (a cycle's: onto its feedback edge)
        self.r.fence()
        for name, parts in self.parts.items():
            if parts:
                self.r.logs[name].write(parts, epoch=self.r.epoch)
        self.parts.clear()

    # applying records ----------------------------------------------------------------------------------

    def _flush(self) -> None:
        """Apply every pending delivery in one run of the operator."""
        if not self.pending:
            return
        by_edge: dict[int, list[ChannelEvent]] = defaultdict(list)
        for records in self.pending.values():
            for i, e in records:
                by_edge[i].append(e)
        subtasks = sorted(self.pending)
        self.pending.clear()
        frames = {i: self.r.logs[self.inputs[i].channel_log].read(events, self.r.epoch)
                  for i, events in by_edge.items()}
        self.apply(frames, subtasks)

    def apply(self, frames: dict[int, DataFrame], subtasks: list[int]) -> None:
        """Run the operator on ``frames`` (input edge index -> records with ``sender``, ``receiver``
        and the record's columns) of ``subtasks``: sinks staged, state MERGEd, what it sends on
        appended to its output logs (written by :meth:`_write`)."""
        r, op = self.r, self.op
        inputs: dict[int, DataFrame] = {}
        for i, edge in enumerate(self.inputs):
            payload = r.logs[edge.channel_log].payload
            if i in frames:
                df = frames[i].select(*[F.col(f"`{c}`") for c in payload.fieldNames()],
                                      F.col("receiver").cast("int").alias(SINK_SUBTASK))
            else:
                df = r.spark.createDataFrame([], T.StructType(
                    list(payload.fields) + [T.StructField(SINK_SUBTASK, T.IntegerType(), True)]))
            have = inputs.get(edge.input)
            inputs[edge.input] = df if have is None else have.unionByName(df, allowMissingColumns=True)
        try:
            state = None
            if op.state is not None:
                state = r.cached(op.read_state(inputs))
            deltas, outputs, newest = op.step(inputs, state, r.cached)
            outputs = {name: r.cached(df) if r.readers[(op.uid, name)] > 1 else df for name, df in outputs.items()}
            op.flushes += 1
            r.reached("flush_stage")
            r.fence()
            op.sinks.stage(outputs, op.flushes, f"operator {op.uid!r}", subtasks)
            if deltas is not None:
                r.fence()
                r.reached("flush_merge")  # past its epoch check, the state's run not yet committed
                op.update_state(deltas, r.fence, r.epoch, newest, current=state, reached=r.reached)
            for edge in self.outputs:
                name = edge.channel_log
                routed = segment(outputs[edge.output], edge, self.receivers[name], sender=SINK_SUBTASK,
                                 key=edge.edge.key, max_parallelism=r.graph.max_parallelism)
                self.parts[name].append((DATA, self.seq, routed))
            if self.outputs:
                self.seq += 1
                self._write()  # before the step's cache goes: the segments read the outputs
        finally:
            r.uncache()

    # snapshots, channel state and acknowledgements -------------------------------------------------------

    def _snapshot(self, r: int, e: TakeSnapshot) -> None:
        run, op = self.r, self.op
        run.reached("snapshot")
        cid = e.checkpoint_id
        pinned, share = None, 0
        if op.state is not None:
            pinned = PinnedState(op.state_version, range_for_subtask(r, op.P, op.max_parallelism))
            share = op.state_share(len(pinned.key_groups))
        acks = {op.ids[r]: SubtaskAck(state=KeyedAckState(-1, pinned).to_state(), state_size_bytes=share),
                **op.sinks.acks(cid, [r])}
        self.snapshots[(cid, r)] = _Snapshot(acks, e.unaligned, e.alignment_s * 1000, time.monotonic())

    def _ack(self, r: int, cid: int) -> None:
        run, op = self.r, self.op
        snap = self.snapshots.pop((cid, r), None)
        if snap is None:
            return  # the snapshot of an aborted checkpoint
        run.reached("ack")
        rows, size = self._write_channel_state(cid, r)
        if rows:
            run.reached("channel_state")  # channel state written, the ack not yet durable
        own = snap.acks[op.ids[r]]
        state = KeyedAckState.from_state(own.state)
        state = replace(state, barrier_seqs=self.barrier_seqs.pop((cid, r), {})).to_state()
        acks = dict(snap.acks)
        acks[op.ids[r]] = SubtaskAck(state=state, alignment_ms=snap.alignment_ms, unaligned=snap.unaligned,
                                     duration_ms=(time.monotonic() - snap.started) * 1000, channel_state_rows=rows,
                                     channel_state_bytes=size, state_size_bytes=own.state_size_bytes)
        run.acknowledge(cid, acks)  # durable first, then the coordinator has them

    def _write_channel_state(self, cid: int, r: int) -> tuple[int, int]:
        """Copy the in-flight segments subtask ``r`` logged for ``cid`` into their edges'
        channel-state tables (a Spark job per edge); returns (rows, bytes estimate)."""
        logged = self.logged.pop((cid, r), [])
        by_edge: dict[int, list[ChannelEvent]] = defaultdict(list)
        for i, e in logged:
            by_edge[i].append(e)
        rows = 0
        for i, events in sorted(by_edge.items()):
            name = self.inputs[i].channel_log
            self.channel_state[name].append(cid, self.r.logs[name].read_packed(events, self.r.epoch))
            rows += sum(e.rows for e in events)
        return rows, rows * CHANNEL_STATE_ROW_BYTES

    def replay_channel_state(self, plan: RecoveryPlan) -> None:
        """A restore's first records: what the checkpoint's subtasks of this vertex logged in flight,
        per input edge, routed again to the subtask owning each now (any parallelism), applied
        before anything is read from the logs."""
        old = sorted(s.index for s in plan.replay_channel_state if s.operator == self.op.uid)
        if not old:
            return
        frames = {}
        for i, edge in enumerate(self.inputs):
            name = edge.channel_log
            df = self.channel_state[name].records(plan.checkpoint_id, old)
            legacy = self.r.legacy_channel_state(edge, plan, old, df.schema)
            if legacy is not None:
                df = df.unionByName(legacy)
            frames[i] = segment(df.drop("receiver"), edge, self.op.P, sender="sender", key=edge.edge.key,
                                max_parallelism=self.r.graph.max_parallelism)
        self.apply(frames, list(range(self.op.P)))
        self.r.progress(f"operator {self.op.uid}: replayed the channel state of checkpoint {plan.checkpoint_id} "
                        f"logged by subtasks {old}")

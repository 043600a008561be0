"""The keyed stage of a process: barrier handlers, flushes, snapshots and acknowledgements.

One barrier handler per operator subtask (the core's :mod:`~checkpoint_lib.core.barriers`) takes
what the channel log holds past the cursor (segments, barriers and ends, from the log's index: its
metadata) and answers with effects, carried out here in Spark: deliveries are applied in flushes
(each sink's rows written into the subtask's open transaction, keyed state MERGEd), a snapshot
pins the state version and pre-commits the subtask's sink transactions, in-flight segments are
copied to the channel-state table, and the acknowledgement is made durable, then given to the
coordinator. A chained process applies the source's records directly (:meth:`apply`) and hands
every subtask the step's barrier on every channel at once (:meth:`barrier_on_every_channel`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..core import twophase
from ..core.acks import KeyedAckState, KeyedPosition, PinnedState, SinkAckState
from ..core.barriers import (
    ChannelStateComplete,
    CheckpointDone,
    DeclineCheckpoint,
    Deliver,
    ForwardBarrier,
    LogChannelState,
    TakeSnapshot,
    carry_out,
    create_handler,
)
from ..core.keygroups import range_for_subtask
from ..core.recovery import RecoveryPlan
from ..core.twophase import Transaction, TransactionIdPool, TwoPhaseCommitSink
from ..core.types import Barrier, BarrierMode, CheckpointStatus, SubtaskAck
from ..pipeline import FEEDBACK
from ..reserved import SINK_SUBTASK
from .channels import BARRIER, CHANNEL_STATE_ROW_BYTES, DATA, END, ChannelEvent
from .context import RunContext
from .partitioning import route
from .state import KEY_GROUP, apply_with_ttl, key_group_column, subtask_column



@dataclass
class _Snapshot:
    """A subtask's snapshot of a checkpoint, kept until it acknowledges: its own state and each
    sink subtask's, how it was taken, and when (for the ack's duration)."""

    state: KeyedAckState
    sinks: dict[str, SinkAckState]
    unaligned: bool
    alignment_ms: float
    started: float
    state_bytes: int


class KeyedStage:
    def __init__(self, ctx: RunContext, *, mode: BarrierMode, alignment_timeout: float | None,
                 state_compact_every: int, clock: Any, pool: Callable[[str, int], TransactionIdPool],
                 on_effects: Callable[[Any], None]):
        self.ctx = ctx
        self.mode = mode
        self.alignment_timeout = alignment_timeout
        self.state_compact_every = state_compact_every
        self.clock = clock
        self.pool = pool
        self.on_effects = on_effects  # the coordinator's effects of an ack or a decline: completion's
        self.executing = 0  # depth of the execute() calls under way (an abort inside one runs another)
        self.after_execute: Callable[[], None] = lambda: None  # completion's owed clean-up
        self.reset()

    def reset(self) -> None:
        """Fresh in-memory state of one process (handlers, buffers, counters)."""
        t = self.ctx.topology
        # input channels of a subtask: one per source subtask, then (a cycle) one per subtask of
        # the operator itself - channel S + i is the feedback from subtask i
        channels = t.S + (t.P if t.feedback_log is not None else 0)
        self.handlers = [
            create_handler(channels, self.mode, self.clock, alignment_timeout=self.alignment_timeout)
            for _ in range(t.P)
        ]
        self.fb_parts: list[tuple] = []  # forwarded barriers not written to the feedback log yet
        self.cursor, self.fseq, self.fcursor = -1, 0, -1
        self.pending: dict[int, list[ChannelEvent]] = defaultdict(list)
        self.channel_state: dict[tuple[int, int], list[ChannelEvent]] = defaultdict(list)
        self.flushes = 0
        self.state_version = -1
        self._table_bytes: tuple[int, int] | None = None
        self.snapshots: dict[tuple[int, int], _Snapshot] = {}
        self.sink_books: dict[str, list[TwoPhaseCommitSink]] = {}

    # resume points ------------------------------------------------------------------------------

    def point(self, parallelism: dict[str, int]) -> dict[str, Any]:
        return {
            "parallelism": parallelism,
            "cursor": self.cursor, "state_version": self.state_version, "flushes": self.flushes,
            "fseq": self.fseq, "fcursor": self.fcursor,
            "sinks": {name: [b.resume_state() for b in books] for name, books in self.sink_books.items()},
        }

    def resume(self, point: dict[str, Any]) -> None:
        self.cursor, self.state_version = int(point["cursor"]), int(point["state_version"])
        self.flushes = int(point["flushes"])
        self.fseq, self.fcursor = int(point.get("fseq", 0)), int(point.get("fcursor", -1))
        self.sink_books = {
            name: [TwoPhaseCommitSink.resumed(state, self.pool(name, i)) for i, state in enumerate(states)]
            for name, states in point["sinks"].items()
        }

    def restore(self, position: KeyedPosition) -> None:
        """Go on from where a recovery put this stage: the channel cursor, the state table's version,
        each sink subtask's transactions continuing from its snapshot in the new epoch (nothing
        pending: the recovery re-committed what the checkpoint owned; a subtask the checkpoint did
        not have starts afresh), and an empty feedback log (a cycle's: the recovery cleared it)."""
        epoch = self.ctx.epoch
        self.cursor, self.state_version = position.cursor, position.state_version
        self.fseq, self.fcursor = 0, -1
        self.sink_books = {
            name: [TwoPhaseCommitSink(self.pool(name, i), epoch) if snap is None
                   else TwoPhaseCommitSink.restored(snap, self.pool(name, i), epoch)
                   for i, snap in enumerate(snapshots)]
            for name, snapshots in position.sinks.items()
        }

    def commit_up_to(self, checkpoint_id: int, commit: Callable[[str, list[Transaction]], object],
                     after: Callable[[str, list[Transaction]], None]) -> None:
        """Checkpoint ``checkpoint_id`` completed: every sink's transactions up to it are committed
        through the core's one commit path (:func:`~checkpoint_lib.core.twophase.commit_up_to`:
        ``commit(sink, transactions)`` per sink, then ``after``), and the committed ones leave this
        stage's bookkeeping."""
        books = {name: self.sink_books[name] for name in self.ctx.topology.sinks}
        twophase.commit_up_to(books, checkpoint_id, commit, after=after)

    def busy(self) -> list[int]:
        """The subtasks inside a checkpoint (aligning, logging channel state, holding or tracking)."""
        return [r for r, h in enumerate(self.handlers)
                if h.aligning is not None or h.logging_channel_state or h.held or h.tracked]

    def aligning_with_timeout(self) -> bool:
        return self.alignment_timeout is not None and any(h.aligning is not None for h in self.handlers)

    # reading the channel log ----------------------------------------------------------------------

    def step(self) -> bool:
        """Consume everything the channel log holds beyond the cursor. False: nothing new."""
        t = self.ctx.topology
        switched = False
        if self.alignment_timeout is not None:  # aligned-with-timeout: switch even with no new event
            timed = {r: h.on_timer() for r, h in enumerate(self.handlers)}
            switched = any(timed.values())
            if switched:
                self.execute(timed)
        events = t.channel.index_past(self.ctx.epoch, self.cursor)
        fed = t.feedback_log.index_past(self.ctx.epoch, self.fcursor) if t.feedback_log is not None else []
        if not events and not fed:
            return switched
        effects: dict[int, list] = {r: [] for r in range(t.P)}
        # position order within a log; at one position, every channel in sender order. The
        # feedback log's channels are numbered after the source's (S + sending subtask).
        for e in [*events, *(replace(f, sender=t.S + f.sender) for f in fed)]:
            h = self.handlers[e.receiver]
            if e.kind == DATA:
                effects[e.receiver] += h.on_record(e.sender, e)
            elif e.kind == BARRIER:
                self._adopt(int(e.checkpoint_id))
                barrier = Barrier(int(e.checkpoint_id), float(e.barrier_ts or 0.0))
                effects[e.receiver] += h.on_barrier(e.sender, barrier)
            elif e.kind == END:
                effects[e.receiver] += h.on_end_of_channel(e.sender)
        if events:
            self.cursor = max(e.seq for e in events)
        if fed:
            self.fcursor = max(e.seq for e in fed)
        self.execute(effects)
        return True

    def _adopt(self, cid: int) -> None:
        """Make the coordinator know checkpoint ``cid`` (triggered by a source stage in another
        process) with the acks already recorded; one that is no longer pending is left alone (its
        barrier is still processed, and the keyed acks are then discarded)."""
        from .completion import adopt

        self.on_effects(adopt(self.ctx.store, self.ctx.coordinator, cid, self.ctx.epoch))

    # carrying out the handlers' effects ------------------------------------------------------------

    def barrier_on_every_channel(self, barrier: Barrier) -> None:
        """A chained step's barrier: on every channel of every subtask at once (nothing in flight)."""
        S = self.ctx.topology.S
        self.execute({r: [e for s in range(S) for e in h.on_barrier(s, barrier)] for r, h in enumerate(self.handlers)})

    def abort(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted: every subtask drops it."""
        self.execute({r: h.on_checkpoint_aborted(checkpoint_id) for r, h in enumerate(self.handlers)})

    def execute(self, effects: dict[int, list]) -> None:
        """Carry out the handlers' effects in order per subtask, batching Spark work: deliveries
        up to the next snapshot of every subtask are applied in one flush. A clean-up that a
        completion made due runs after the last flush, never in the middle."""
        self.executing += 1
        try:
            carry_out(effects, self._effect, self._flush, self._snapshot)
            self._write_feedback()
        finally:
            self.executing -= 1
        self.after_execute()

    def _effect(self, r: int, e: Any) -> None:
        ctx = self.ctx
        if isinstance(e, Deliver):
            self.pending[r].append(e.record)
        elif isinstance(e, LogChannelState):
            self.channel_state[(e.checkpoint_id, r)].append(e.record)
        elif isinstance(e, ForwardBarrier):
            if ctx.topology.feedback_log is not None:  # onto the feedback edge, after what r sent before
                cid = e.barrier.checkpoint_id
                self.fb_parts.append((BARRIER, self.fseq, (cid, e.barrier.timestamp), [r], list(range(ctx.topology.P))))
                if (cid, r) in self.snapshots:
                    snap = self.snapshots[(cid, r)]
                    snap.state = replace(snap.state, feedback_barrier_seq=self.fseq)
                self.fseq += 1
            # the sinks are fused: no other downstream channel to forward to
        elif isinstance(e, ChannelStateComplete):
            pass
        elif isinstance(e, CheckpointDone):
            self._ack(r, e.checkpoint_id)
        elif isinstance(e, DeclineCheckpoint):
            self.on_effects(ctx.coordinator.decline(e.checkpoint_id, ctx.topology.keyed[r], e.reason))

    def _flush(self) -> None:
        """Apply every pending delivery: sink rows into the open transactions, state MERGEd."""
        segments = [e for es in self.pending.values() for e in es]
        if not segments:
            return
        self.apply(self._read(segments), sorted(self.pending))
        self.pending.clear()

    def _read(self, segments: list[ChannelEvent], packed: bool = False) -> DataFrame:
        """The records of ``segments`` of either log (feedback channels are numbered from S):
        ``sender``, ``receiver`` and the record's columns, or (``packed``) ``sender``,
        ``receiver``, ``seq`` and the record in one struct (what channel state copies)."""
        t, epoch = self.ctx.topology, self.ctx.epoch
        read = (lambda log, es: log.read_packed(es, epoch)) if packed else (lambda log, es: log.read(es, epoch))
        src = [e for e in segments if e.sender < t.S]
        fed = [replace(e, sender=e.sender - t.S) for e in segments if e.sender >= t.S]
        df = read(t.channel, src) if src or not fed else None
        if fed:
            back = read(t.feedback_log, fed).withColumn("sender", F.col("sender") + F.lit(t.S))
            df = back if df is None else df.unionByName(back)
        return df

    def _write_feedback(self, data: DataFrame | None = None) -> None:
        """Append the forwarded barriers waiting in ``fb_parts``, then ``data`` (records the operator
        sent to itself), to the feedback log in one commit, each at the next position: a
        subtask's barrier lands after what it sent before its snapshot, before what it sent after."""
        if data is not None:
            self.fb_parts.append((DATA, self.fseq, data))
            self.fseq += 1
        if not self.fb_parts:
            return
        self.ctx.reached("feedback_write")
        self.ctx.fence()
        self.ctx.topology.feedback_log.write(self.fb_parts, epoch=self.ctx.epoch)
        self.fb_parts = []

    # applying records -------------------------------------------------------------------------------

    def apply(self, records: DataFrame, receivers: list[int]) -> None:
        """Run the keyed operator on ``records`` (of ``receivers``) against the current state."""
        ctx = self.ctx
        self.flushes += 1
        p = ctx.pipeline
        # Every sink's write and the state MERGE read the records and the state, both immutable
        # inputs (step files or a pinned channel segment, a pinned state version): the state is
        # cached for the flush; the records are read again by each write, a Parquet scan that costs
        # less than building a cache of them (measured on 1M-row steps, 2 cores).
        # what the operator sees: the record's columns, its offset and the subtask (nothing else of ours)
        records = records.select(*[F.col(f"`{c}`") for c in ctx.topology.payload.fieldNames() if c != KEY_GROUP],
                                 F.col("receiver").alias(SINK_SUBTASK))
        state = ctx.topology.state
        expire_before = None
        try:
            if state is None:
                deltas, outputs = None, self._per_subtask(records, receivers)
            elif p.state_ttl is None:
                state_before = ctx.cached(state.read(self.state_version)).drop(KEY_GROUP)
                deltas, outputs = p.operator.apply(records, state_before, p.key)
            else:
                deltas, outputs, expire_before = self._apply_with_ttl(records, state)
            self._apply_outputs(deltas, self._attributed(outputs), receivers, expire_before)
        finally:
            ctx.uncache()

    def _per_subtask(self, records: DataFrame, receivers: list[int]) -> dict[str, DataFrame]:
        """A stateless operator runs as one instance per subtask, as in Flink: ``apply`` once per
        receiving subtask on that subtask's records (lazily: one plan, unioned), and every row an
        instance returns is staged by its subtask's transaction, so the operator keeps no
        bookkeeping column of ours."""
        outputs: dict[str, DataFrame] = {}
        for r in receivers:
            returned = self.ctx.pipeline.operator.apply(records.where(F.col(SINK_SUBTASK) == r))
            for name, df in dict(returned or {}).items():
                df = df.withColumn(SINK_SUBTASK, F.lit(r))
                outputs[name] = df if name not in outputs else outputs[name].unionByName(df)
        return outputs

    def _apply_with_ttl(self, records: DataFrame, state) -> tuple[DataFrame, Any, Any]:
        """Run the operator on state that expires in event time (:func:`~.state.apply_with_ttl`)."""
        ctx, p = self.ctx, self.ctx.pipeline
        stored = ctx.cached(state.read(self.state_version)).drop(KEY_GROUP)
        return apply_with_ttl(lambda visible: p.operator.apply(records, visible, p.key), [records], stored, p.key,
                              p.state_ttl, ctx.cached)

    def _attributed(self, outputs: Any) -> dict[str, DataFrame]:
        """The operator's outputs, each row with the ``sink_subtask`` whose transaction stages it:
        the one the row keeps, else (keyed) the subtask owning the key it carries. Records sent back
        to the operator (:data:`FEEDBACK`) must keep theirs: it is the channel's sender."""
        p, P = self.ctx.pipeline, self.ctx.topology.P
        if not isinstance(outputs, dict):
            outputs = dict(outputs or {})
        out = {}
        for name, df in outputs.items():
            if SINK_SUBTASK not in df.columns:
                # a record sent back (a cycle) is sent by the subtask that produced it, not by its key's owner
                by_key = p.key is not None and name != FEEDBACK
                if not by_key or p.key not in df.columns:
                    keep = f"the key column {p.key!r} or {SINK_SUBTASK!r}" if by_key else repr(SINK_SUBTASK)
                    raise ValueError(f"operator {p.operator_uid!r}: the rows it returns for {name!r} must keep "
                                     f"{keep} (it says whose transaction stages each row)")
                df = df.withColumn(SINK_SUBTASK, subtask_column(
                    key_group_column(p.key, p.max_parallelism), P, p.max_parallelism))
            out[name] = df
        return out

    def _apply_outputs(self, deltas: DataFrame | None, outputs: dict[str, DataFrame], receivers: list[int],
                       expire_before: Any = None) -> None:
        ctx, t = self.ctx, self.ctx.topology
        p = ctx.pipeline
        missing = sorted(set(t.sinks) - set(outputs))
        if t.feedback_log is not None and FEEDBACK not in outputs:
            missing.append(FEEDBACK)
        if missing:
            raise ValueError(f"operator {p.operator_uid!r} returned no DataFrame for {missing}")
        ctx.reached("flush_stage")
        ctx.fence()
        for name, sink in t.sinks.items():
            handles = {r: self.sink_books[name][r].current for r in receivers}
            sink.stage(outputs[name], handles, self.flushes)
        if t.feedback_log is not None:  # sent by the subtask that produced it, routed by key
            back = route(outputs[FEEDBACK].withColumn("sender", F.col("sink_subtask").cast("int")), "hash",
                         t.P, key=p.key, max_parallelism=p.max_parallelism)
            self._write_feedback(back.select("sender", "receiver", *t.payload.fieldNames()))
        if t.state is None:
            return
        if KEY_GROUP not in deltas.columns:
            deltas = deltas.withColumn(KEY_GROUP, key_group_column(p.key, p.max_parallelism))
        ctx.fence()
        ctx.reached("flush_merge")  # past its epoch check, the MERGE not yet committed
        self.state_version = t.state.apply(
            deltas, replace=p.state_update == "replace", before_retry=ctx.fence, epoch=ctx.epoch,
            expire_before=expire_before,
            compact=bool(self.state_compact_every) and self.flushes % self.state_compact_every == 0)

    # channel state ----------------------------------------------------------------------------------

    def _write_channel_state(self, cid: int, r: int) -> tuple[int, int]:
        """Copy the in-flight segments logged for (checkpoint, subtask) into the channel-state
        table (a Spark job); returns (rows, bytes estimate)."""
        t = self.ctx.topology
        segments = self.channel_state.pop((cid, r), [])
        if not segments:
            return 0, 0
        rows = sum(e.rows for e in segments)
        t.channel_state.append(cid, self._read(segments, packed=True))
        return rows, rows * CHANNEL_STATE_ROW_BYTES

    def replay_channel_state(self, plan: RecoveryPlan) -> None:
        """Restore = state, then the logged channel state, then the channels (BRIEF.md). The
        records are routed again (by key group or offset), so a rescaled pipeline sends each to
        the subtask that owns it now."""
        ctx, t = self.ctx, self.ctx.topology
        p = ctx.pipeline
        old = sorted(s.index for s in plan.replay_channel_state if s.operator == p.operator_uid)
        if not old:
            return
        df = t.channel_state.records(plan.checkpoint_id, old)
        if p.partitioning in ("hash", "rebalance"):
            df = route(df.drop("receiver", KEY_GROUP), p.partitioning, t.P, key=p.key,
                       max_parallelism=p.max_parallelism)
        self.apply(df.select("sender", "receiver", *t.payload.fieldNames()), list(range(t.P)))
        ctx.progress(f"replayed the channel state of checkpoint {plan.checkpoint_id} logged by subtasks {old}")

    # snapshots and acknowledgements -----------------------------------------------------------------

    def _snapshot(self, r: int, e: TakeSnapshot) -> None:
        ctx = self.ctx
        ctx.reached("snapshot")
        cid = e.checkpoint_id
        if ctx.topology.state is not None:
            kg = range_for_subtask(r, ctx.topology.P, ctx.pipeline.max_parallelism)
            state = KeyedAckState(self.cursor, PinnedState(self.state_version, kg))
            state_bytes = self._state_bytes(kg)
        else:
            state, state_bytes = KeyedAckState(self.cursor), 0
        sinks = {name: SinkAckState(self.sink_books[name][r].pre_commit(cid).snapshot) for name in ctx.topology.sinks}
        self.snapshots[(cid, r)] = _Snapshot(state, sinks, e.unaligned, e.alignment_s * 1000, time.monotonic(),
                                             state_bytes)

    def _state_bytes(self, kg) -> int:
        """The snapshot's share of the state table (by key-group fraction): what restoring it reads.
        Taking it writes nothing: the snapshot pins a version."""
        from deltalake import DeltaTable

        if self._table_bytes is None or self._table_bytes[0] != self.state_version:
            actions = DeltaTable(self.ctx.topology.state.path, version=self.state_version).get_add_actions(flatten=True)
            self._table_bytes = (self.state_version, int(sum(actions.column("size_bytes").to_pylist())))
        return self._table_bytes[1] * len(kg) // self.ctx.pipeline.max_parallelism

    def _ack(self, r: int, cid: int) -> None:
        ctx, t = self.ctx, self.ctx.topology
        snap = self.snapshots.pop((cid, r), None)
        if snap is None:
            return  # snapshot of an aborted checkpoint
        ctx.reached("ack")
        cs_rows, cs_bytes = self._write_channel_state(cid, r)
        if cs_rows:
            ctx.reached("channel_state")  # channel state written, the ack not yet durable
        duration = (time.monotonic() - snap.started) * 1000
        ack = SubtaskAck(state=snap.state.to_state(), alignment_ms=snap.alignment_ms, unaligned=snap.unaligned,
                         duration_ms=duration, channel_state_rows=cs_rows, channel_state_bytes=cs_bytes,
                         state_size_bytes=snap.state_bytes)
        acks = {t.keyed[r]: ack}
        for name, sink in snap.sinks.items():
            acks[t.sink_ids[name][r]] = SubtaskAck(state=sink.to_state())
        if ctx.coordinator.status_of(cid) == CheckpointStatus.PENDING:
            ctx.store.acks.record(cid, acks, ctx.epoch)  # durable first: see SourceStage.write
        for sid, a in acks.items():
            self.on_effects(ctx.coordinator.acknowledge(cid, sid, a).effects)

    def lowest_unconsumed(self) -> tuple[float, float]:
        """The lowest position of (the source channel log, the feedback log) that a segment held in
        memory still has to read (infinity: none). Feedback channels are numbered from S."""
        S = self.ctx.topology.S
        segments = [e for es in self.pending.values() for e in es]
        segments += [e for es in self.channel_state.values() for e in es]
        segments += [e for h in self.handlers for e in h.held_records]
        lowest = [float("inf"), float("inf")]
        for e in segments:
            log = 0 if e.sender < S else 1
            lowest[log] = min(lowest[log], e.seq)
        return lowest[0], lowest[1]

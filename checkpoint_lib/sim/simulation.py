"""The simulator: one pipeline, a dataflow graph, run step by step by a seeded scheduler.

**The topology** is a :class:`~.topology.Graph`: source and keyed-stage vertices, each with its own
parallelism, and edges of all-to-all channels between them (a :class:`~.topology.Topology`, the
older line of layers, is lowered to one). A stage reads all its input channels, from every upstream
vertex, through one barrier handler (:func:`~..core.barriers.create_handler`); a vertex with several
outgoing edges routes each record to ONE of them by key; every stage without outgoing edges is a
two-phase-commit sink. See :mod:`.topology` for the rules.

**The pipeline moves tokens**: source subtask ``k`` (in :meth:`Graph.source_subtasks` order)
starts with ``initial[k]`` tokens and emits records ``(uid, key, amount)``, each taking ``amount``
from its balance. A stage keeps a fee of ``amount // 10`` of every record it processes and forwards
the rest to the vertex its key routes it to, to the subtask of that vertex its key partitions it
to; a sink keeps what it receives and writes every record to its open transaction. Money is only
moved, so every consistent snapshot conserves the total: sum of balances in the snapshots + sum of
amounts in the channel state = sum of ``initial``.

**A step** is one action chosen at random among those enabled: a source emits, a channel delivers
its head (record, barrier or end), an aligning handler's timer fires, the coordinator ticks, a
completion or abort notice arrives. :meth:`Simulation.run` steps to the end (a final checkpoint
commits everything, then the sources end), with an optional crash and recovery on the way.

**Volatile state** (subtasks, channels, handlers, the coordinator's pending checkpoints) dies in a
crash; durable state (the id counter, the completed-checkpoint store, the epoch, staged and
committed sink transactions) survives it, exactly like the Delta tables of the real runtime.

The coordinator's aborts reach every subtask at once by default; :class:`Aborts` makes each
subtask's notice a message of its own (late: after later barriers, in any order with barriers and
other aborts; lost) and lets the coordinator abort pending checkpoints on its own.

**What is checked**, into ``violations``, channel by channel whatever the graph:

- every snapshot when it is taken (:meth:`Simulation._check_snapshot`): none of a checkpoint the
  subtask heard was aborted; in the exactly-once modes, on each input channel no more records
  taken than the sender had sent before its barrier;
- every completed exactly-once checkpoint (:meth:`Simulation._check_cut`): for each channel
  ``p -> q``, n (sent by ``p`` at its snapshot) >= m (taken by ``q`` at its snapshot) and ``q``'s
  channel state of it is exactly records m+1..n; and the tokens are conserved;
- the finished pipeline (:meth:`Simulation._check_effects`): every record's effect is in each
  vertex on its path exactly once (at least once in at-least-once mode), nowhere else.

``SimulationResult.committed`` counts how often the sinks committed each record::

    graph = Graph(sources={"a": 2}, stages={"b": 2, "c": 1, "d": 2},
                  edges=[("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], mode=BarrierMode.UNALIGNED)
    inputs = [[Record(f"a{i}-{j}", j % 5, 10) for j in range(20)] for i in range(2)]
    result = Simulation(graph, inputs, random.Random(7)).run(crash_at=100)
    assert not result.violations and set(result.committed.values()) == {1}
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..core.acks import SinkAckState
from ..core.barriers import (
    ChannelStateComplete,
    CheckpointDone,
    DeclineCheckpoint,
    Deliver,
    ForwardBarrier,
    LogChannelState,
    TakeSnapshot,
    create_handler,
)
from ..core.checkpoints import CompletedCheckpoint
from ..core.clock import ManualClock
from ..core.coordinator import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointCoordinator,
    CheckpointTriggerError,
    FailJob,
    NotifyCheckpointComplete,
    TriggerCheckpoint,
)
from ..core.decider import CheckpointConfig
from ..core.errors import FailureReason
from ..core.recovery import RecoveryPlan, plan_recovery
from ..core.stores import InMemoryCheckpointIdCounter, InMemoryCompletedCheckpointStore
from ..core.twophase import Transaction, TransactionIdPool, TwoPhaseCommitSink, commit_all
from ..core.types import Barrier, CheckpointKind, CheckpointStatus, SubtaskAck, SubtaskId
from .topology import Graph, Topology, graph_of


class Record(NamedTuple):
    uid: str
    key: int
    amount: int


@dataclass(frozen=True)
class Aborts:
    """How the coordinator's aborts travel. The default: every subtask hears of one at once.

    ``Aborts(late=True, lost=True, injected=3)`` delivers each subtask's notice at a random later
    step, drops some, and lets the coordinator abort up to three pending checkpoints on its own
    (as a user or an expiry would) over the run.
    """

    late: bool = False
    """Each subtask's notice is a message of its own, delivered at a random later step: possibly
    after later barriers, in any order with the barriers and with other notices."""
    lost: bool = False
    """A notice may be dropped instead (that subtask never hears of the abort)."""
    injected: int = 0
    """Aborts of random pending checkpoints the coordinator makes at random steps, over the run."""

    def __post_init__(self) -> None:
        if self.injected < 0:
            raise ValueError(f"injected must be >= 0, got {self.injected}")
        if self.lost and not self.late:
            raise ValueError("only a late notice can be lost: lost=True needs late=True")


class _TaskFailed(Exception):
    """A subtask failed (as a real task would): the job fails over to the latest checkpoint."""


class _Channel:
    def __init__(self, cid: int, sender: SubtaskId, receiver: SubtaskId, receiver_input: int):
        self.cid = cid
        self.sender = sender
        self.receiver = receiver
        self.receiver_input = receiver_input
        self.queue: deque[tuple[str, Any]] = deque()
        self.sent: list[Record] = []  # history: every record ever put on it (this attempt)
        self.barriers: list[tuple[int, int]] = []  # (checkpoint id, records sent before it)


@dataclass
class _Subtask:
    sid: SubtaskId  # its operator is its vertex
    source: bool
    inputs: list[_Channel] = field(default_factory=list)  # numbered as the handler numbers them
    routes: dict[str, list[_Channel]] = field(default_factory=dict)  # downstream vertex -> by receiver index
    input: list[Record] = field(default_factory=list)  # sources: what they emit
    balance: int = 0
    offset: int = 0  # sources: records emitted
    processed: Counter = field(default_factory=Counter)  # uid -> times applied to state
    taken: list[int] = field(default_factory=list)  # per input: records delivered this attempt
    handler: Any = None
    sink: TwoPhaseCommitSink | None = None
    txn_records: dict[str, list[Record]] = field(default_factory=dict)
    snapshots: dict[int, dict[str, Any]] = field(default_factory=dict)
    channel_state: dict[int, dict[int, list[Record]]] = field(default_factory=dict)
    heard_aborts: set[int] = field(default_factory=set)  # aborts this attempt's handler was told of
    ended: bool = False

    @property
    def outputs(self) -> list[_Channel]:
        """Every output channel: edge by edge (downstream vertex), receiver by receiver (the order
        of a snapshot's ``sent`` counts)."""
        return [ch for channels in self.routes.values() for ch in channels]


@dataclass
class SimulationResult:
    committed: Counter
    """uid -> how many times the sink committed it."""
    balances: dict[SubtaskId, int]
    completed: list[CompletedCheckpoint]
    aborted: list[tuple[int, FailureReason]]
    recoveries: list[RecoveryPlan]
    violations: list[str]


class Simulation:
    """One pipeline over its attempts. ``run(crash_at=...)`` drives it to the end."""

    def __init__(
        self,
        topology: Topology | Graph,
        inputs: list[list[Record]],
        rng: random.Random,
        *,
        config: CheckpointConfig | None = None,
        initial: list[int] | None = None,
        aborts: Aborts | None = None,
    ):
        self.topology = topology
        """As given: a :class:`Graph`, or a :class:`Topology` that :attr:`graph` lowers."""
        self.graph = graph_of(topology)
        """What runs."""
        sources = self.graph.source_subtasks()
        if len(inputs) != len(sources):
            raise ValueError(
                f"one input list per source subtask ({', '.join(map(str, sources))}), got {len(inputs)}"
            )
        uids = Counter(r.uid for inp in inputs for r in inp)
        if uids and max(uids.values()) > 1:
            raise ValueError(f"record uids must be unique, repeated: {sorted(u for u, n in uids.items() if n > 1)}")
        self.inputs = inputs
        self.rng = rng
        self.config = config or CheckpointConfig(interval=1.0, max_concurrent=2, timeout=1e9, retained=100)
        self.aborts = aborts or Aborts()
        self.initial = initial or [sum(r.amount for r in inp) for inp in inputs]
        self.total = sum(self.initial)
        self.clock = ManualClock()
        # durable
        self.id_counter = InMemoryCheckpointIdCounter()
        self.store = InMemoryCompletedCheckpointStore(retained=self.config.retained)
        self.epoch = 0
        self.staged: dict[str, tuple[Transaction, list[Record]]] = {}
        self.committed_handles: set[str] = set()
        self.committed = Counter()
        # history
        self.aborted: list[tuple[int, FailureReason]] = []
        self.recoveries: list[RecoveryPlan] = []
        self.violations: list[str] = []
        self.abort_notices_seen: Counter = Counter()
        """How notices went: "heard", "heard_late" (after a newer barrier), "lost", "injected"."""
        self.failovers: list[str] = []
        """Why the job failed over by itself (each time: crash, then recovery)."""
        self.injections_left = self.aborts.injected
        self.steps = 0
        self._build(None)

    # construction / recovery -----------------------------------------------------------------

    def _build(self, plan: RecoveryPlan | None) -> None:
        """Every subtask and channel of the graph, fresh; then restore ``plan`` if there is one."""
        g = self.graph
        self.subtasks: dict[SubtaskId, _Subtask] = {
            sid: _Subtask(sid, v in g.sources) for v in g.vertices for sid in g.subtasks(v)
        }
        for k, sid in enumerate(g.source_subtasks()):
            self.subtasks[sid].input = self.inputs[k]
            self.subtasks[sid].balance = self.initial[k]
        # A receiver's input channels, numbered for its handler: edge by edge, sender by sender.
        self.channels: list[_Channel] = []
        for v in g.stages:
            for receiver in g.subtasks(v):
                inputs = self.subtasks[receiver].inputs
                for u in g.upstream(v):
                    for sender in g.subtasks(u):
                        ch = _Channel(len(self.channels), sender, receiver, len(inputs))
                        self.channels.append(ch)
                        self.subtasks[sender].routes.setdefault(v, []).append(ch)
                        inputs.append(ch)
        for st in self.subtasks.values():
            st.taken = [0] * len(st.inputs)
            if not st.source:
                st.handler = create_handler(len(st.inputs), g.mode, self.clock, alignment_timeout=g.alignment_timeout)
            if st.sid.operator in g.sinks:
                st.sink = TwoPhaseCommitSink(TransactionIdPool(st.sid.operator, st.sid.index, 8), self.epoch)
        self.coordinator = CheckpointCoordinator(
            self.config, list(self.subtasks), g.source_subtasks(), self.id_counter, self.store, self.clock
        )
        self.coordinator.all_running()
        self.final_requested: int | None = None
        self.notifications: list[tuple[SubtaskId, int]] = []
        self.abort_notices: list[tuple[SubtaskId, int]] = []
        if plan is None or plan.checkpoint is None:
            return
        for sid, state in plan.restore.items():
            st = self.subtasks[sid]
            st.balance = state["balance"]
            st.offset = state.get("offset", 0)
            st.processed = Counter(state["processed"])
            if st.sink is not None:
                snap = SinkAckState.from_state(state).snapshot
                st.sink = TwoPhaseCommitSink.restored(snap, st.sink.pool, self.epoch)
        # Replay channel state before anything else: it is the in-flight data of the cut.
        for sid in plan.replay_channel_state:
            st = self.subtasks[sid]
            for _channel, records in sorted(plan.restore[sid]["channel_state"].items()):
                for rec in records:
                    self._apply(st, Record(*rec))

    def crash(self) -> None:
        """kill -9: everything volatile is gone; the durable stores stay."""
        self.subtasks = {}
        self.channels = []
        self.notifications = []
        self.abort_notices = []

    def recover(self, checkpoint_id: int | None = None) -> RecoveryPlan:
        open_txns = [t for h, (t, _) in self.staged.items() if h not in self.committed_handles]
        plan = plan_recovery(
            self.store.all(), current_epoch=self.epoch, checkpoint_id=checkpoint_id,
            open_transactions=open_txns,
        )
        self.epoch = plan.new_epoch
        if plan.rollback_after is not None:
            for handle in sorted(self.committed_handles):
                txn, records = self.staged[handle]
                if txn.checkpoint_id is not None and txn.checkpoint_id > plan.rollback_after:
                    self.committed_handles.discard(handle)
                    del self.staged[handle]
                    self.committed.subtract(r.uid for r in records)
            self.committed = +self.committed
        commit_all(plan.recommit, self._commit)
        for txn in plan.abort:
            self.staged.pop(txn.handle, None)
        self.recoveries.append(plan)
        self._build(plan)
        return plan

    # the durable sink ------------------------------------------------------------------------

    def _commit(self, txn: Transaction) -> None:
        if txn.handle in self.committed_handles:
            return  # idempotent
        _, records = self.staged[txn.handle]
        for rec in records:
            self.committed[rec.uid] += 1
        self.committed_handles.add(txn.handle)

    # running ---------------------------------------------------------------------------------

    def run(self, crash_at: int | None = None, max_steps: int = 200_000) -> SimulationResult:
        """Run to the end; with ``crash_at``, crash after that many steps, recover to the latest
        completed checkpoint, and finish."""
        crashed = False
        while not self.done():
            if crash_at is not None and not crashed and self.steps >= crash_at:
                crashed = True
                self.crash()
                self.recover()
                continue
            self.step()
            if self.steps > max_steps:
                raise RuntimeError("simulation did not finish")
        return self.result()

    def run_for(self, steps: int) -> None:
        """Take up to ``steps`` steps (fewer if the pipeline finishes first)."""
        for _ in range(steps):
            if self.done():
                return
            self.step()

    def done(self) -> bool:
        return (
            bool(self.subtasks)
            and all(st.ended for st in self.subtasks.values())
            and not self.notifications
        )

    def result(self) -> SimulationResult:
        """What happened so far; once :meth:`done`, ``violations`` includes :meth:`_check_effects`."""
        return SimulationResult(
            committed=self.committed,
            balances={sid: st.balance for sid, st in self.subtasks.items()},
            completed=list(self.store.all()),
            aborted=self.aborted,
            recoveries=self.recoveries,
            violations=self.violations + (self._check_effects() if self.done() else []),
        )

    def step(self) -> None:
        self.steps += 1
        self.clock.advance(self.rng.choice((0.0, 0.1, 0.3, 1.0)))
        actions = self._enabled_actions()
        action = self.rng.choice(actions)
        try:
            action()
        except _TaskFailed as failure:
            self.failovers.append(str(failure))
            self.crash()
            self.recover()

    def _enabled_actions(self) -> list:
        actions: list = [self._tick]
        for st in self.subtasks.values():
            if st.source and not st.ended and st.offset < len(st.input):
                actions.append(lambda st=st: self._emit(st))
        for ch in self.channels:
            if ch.queue:
                actions.append(lambda ch=ch: self._deliver(ch))
        for st in self.subtasks.values():
            if st.handler is not None and st.handler.aligning is not None:
                actions.append(lambda st=st: self._on_handler(st, st.handler.on_timer()))
        for k, (sid, checkpoint_id) in enumerate(self.notifications):
            actions.append(lambda k=k: self._notify(k))
            if any(s == sid and c > checkpoint_id for s, c in self.notifications):
                # skipped: a newer notification for this sink is on its way and subsumes it
                actions.append(lambda k=k: self.notifications.pop(k))
        for k in range(len(self.abort_notices)):
            actions.append(lambda k=k: self._hear_abort(*self.abort_notices.pop(k)))
            if self.aborts.lost:
                actions.append(lambda k=k: self._lose_abort(k))
        if self.injections_left and self.coordinator.pending:
            actions.append(self._inject_abort)
        sources_exhausted = all(
            st.offset >= len(st.input) for st in self.subtasks.values() if st.source
        )
        if sources_exhausted and self._quiescent():
            actions.append(self._finish)
        return actions

    def _hear_abort(self, sid: SubtaskId, checkpoint_id: int) -> None:
        st = self.subtasks[sid]
        late = st.handler.latest_started > checkpoint_id
        self.abort_notices_seen["heard_late" if late else "heard"] += 1
        st.heard_aborts.add(checkpoint_id)
        self._on_handler(st, st.handler.on_checkpoint_aborted(checkpoint_id))

    def _lose_abort(self, k: int) -> None:
        self.abort_notices.pop(k)
        self.abort_notices_seen["lost"] += 1

    def _inject_abort(self) -> None:
        """The coordinator aborts a pending checkpoint of its own accord (a user, an expiry)."""
        self.injections_left -= 1
        self.abort_notices_seen["injected"] += 1
        checkpoint_id = self.rng.choice(sorted(self.coordinator.pending))
        self._on_coordinator(self.coordinator.abort(checkpoint_id, FailureReason.USER_ABORT, "injected"))

    def _notify(self, k: int) -> None:
        sid, checkpoint_id = self.notifications.pop(k)
        sink = self.subtasks[sid].sink
        assert sink is not None
        sink.commit_up_to(checkpoint_id, self._commit)

    def _quiescent(self) -> bool:
        """No record in flight or held: a checkpoint now has empty channel state, so the final
        checkpoint covers every record (as Flink drains before its final checkpoint)."""
        return not any(kind == "rec" for ch in self.channels for kind, _ in ch.queue) and not any(
            st.handler is not None and st.handler.held for st in self.subtasks.values()
        )

    def _tick(self) -> None:
        if self.final_requested is not None and self.coordinator.status_of(self.final_requested) == CheckpointStatus.ABORTED:
            # The final checkpoint failed while records were still held somewhere (an alignment
            # that only a newer barrier or an expiry ends): checkpoints go on until _finish asks again.
            self.final_requested = None
        if self.final_requested is None:
            self._on_coordinator(self.coordinator.tick())
        else:
            self._on_coordinator(self.coordinator.expire())  # the final one may time out too

    def _finish(self) -> None:
        """All input emitted: take a final checkpoint so the sink commits everything, then end."""
        if self.final_requested is None:
            try:
                trigger = self.coordinator.trigger(CheckpointKind.CHECKPOINT)
            except CheckpointTriggerError:
                return
            self.final_requested = trigger.checkpoint_id
            self._on_coordinator([trigger])
            return
        status = self.coordinator.status_of(self.final_requested)
        if status == CheckpointStatus.ABORTED:
            self.final_requested = None
        elif status == CheckpointStatus.COMPLETED:
            for st in self.subtasks.values():
                if st.source and not st.ended:
                    st.ended = True
                    for ch in st.outputs:
                        ch.queue.append(("end", None))

    # sources ---------------------------------------------------------------------------------

    def _emit(self, st: _Subtask) -> None:
        rec = st.input[st.offset]
        st.offset += 1
        st.balance -= rec.amount
        self._send(st, rec)

    def _send(self, st: _Subtask, rec: Record) -> None:
        """To the one downstream vertex the record's key routes it to, its key's subtask there."""
        vertex = self.graph.route(st.sid.operator, rec.key)
        ch = st.routes[vertex][self.graph.partition(vertex, rec.key)]
        ch.queue.append(("rec", rec))
        ch.sent.append(rec)

    # coordinator effects ---------------------------------------------------------------------

    def _on_coordinator(self, effects) -> None:
        for e in effects:
            if isinstance(e, TriggerCheckpoint):
                for sid in e.sources:
                    st = self.subtasks[sid]
                    self._snapshot(st, e.barrier, unaligned=False, alignment_s=0.0)
                    self._forward(st, e.barrier)
                    self._ack(st, e.checkpoint_id)
            elif isinstance(e, CheckpointCompleted):
                self._check_cut(e.checkpoint)
            elif isinstance(e, NotifyCheckpointComplete):
                # Notifications travel like any message: late, out of order, lost in a crash.
                self.notifications += [
                    (st.sid, e.checkpoint_id) for st in self.subtasks.values() if st.sink is not None
                ]
            elif isinstance(e, CheckpointAborted):
                self.aborted.append((e.checkpoint_id, e.reason))
                notices = [(st.sid, e.checkpoint_id) for st in self.subtasks.values() if st.handler is not None]
                if self.aborts.late:
                    self.abort_notices += notices  # each travels on its own
                else:
                    for notice in notices:
                        self._hear_abort(*notice)
            elif isinstance(e, FailJob):
                raise RuntimeError(f"job failed: {e}")

    # subtasks --------------------------------------------------------------------------------

    def _deliver(self, ch: _Channel) -> None:
        kind, payload = ch.queue.popleft()
        st = self.subtasks[ch.receiver]
        k = ch.receiver_input
        if kind == "rec":
            effects = st.handler.on_record(k, payload)
        elif kind == "bar":
            effects = st.handler.on_barrier(k, payload)
        else:
            effects = st.handler.on_end_of_channel(k)
        self._on_handler(st, effects)
        if st.handler.finished and not st.ended:
            st.ended = True
            for out in st.outputs:
                out.queue.append(("end", None))

    def _on_handler(self, st: _Subtask, effects) -> None:
        for e in effects:
            if isinstance(e, Deliver):
                st.taken[e.channel] += 1
                self._apply(st, e.record)
            elif isinstance(e, TakeSnapshot):
                self._check_snapshot(st, e.checkpoint_id)
                self._snapshot(st, e.barrier, e.unaligned, e.alignment_s)
            elif isinstance(e, ForwardBarrier):
                self._forward(st, e.barrier)
            elif isinstance(e, LogChannelState):
                st.channel_state.setdefault(e.checkpoint_id, {}).setdefault(e.channel, []).append(e.record)
            elif isinstance(e, ChannelStateComplete):
                pass  # in memory, nothing to flush
            elif isinstance(e, CheckpointDone):
                self._ack(st, e.checkpoint_id)
            elif isinstance(e, DeclineCheckpoint):
                self._on_coordinator(self.coordinator.decline(e.checkpoint_id, st.sid, e.reason))

    def _apply(self, st: _Subtask, rec: Record) -> None:
        st.processed[rec.uid] += 1
        if st.sink is not None:
            st.balance += rec.amount
            st.txn_records.setdefault(st.sink.current.handle, []).append(rec)
            return
        fee = rec.amount // 10
        st.balance += fee
        self._send(st, Record(rec.uid, rec.key, rec.amount - fee))

    def _snapshot(self, st: _Subtask, barrier: Barrier, unaligned: bool, alignment_s: float) -> None:
        state: dict[str, Any] = {
            "balance": st.balance,
            "offset": st.offset,
            "processed": dict(st.processed),
            "taken": list(st.taken),
            "unaligned": unaligned,
            "alignment_s": alignment_s,
        }
        if st.sink is not None:
            if len(st.sink.pending) + 2 > st.sink.pool.size:
                # Aborted checkpoints leave their transactions pending until one completes; after
                # too many the sink has no transaction id left for the next one and its task fails
                # (Flink's Kafka producer: "too many ongoing snapshots"), so the job fails over.
                raise _TaskFailed(f"{st.sid}: no transaction id left for checkpoint {barrier.checkpoint_id}")
            pre = st.sink.pre_commit(barrier.checkpoint_id)
            records = st.txn_records.pop(pre.transaction.handle, [])
            self.staged[pre.transaction.handle] = (pre.transaction, records)  # flush durably
            state.update(SinkAckState(pre.snapshot).to_state())
        st.snapshots[barrier.checkpoint_id] = state

    def _forward(self, st: _Subtask, barrier: Barrier) -> None:
        st.snapshots[barrier.checkpoint_id]["sent"] = [len(ch.sent) for ch in st.outputs]
        for ch in st.outputs:
            ch.queue.append(("bar", barrier))
            ch.barriers.append((barrier.checkpoint_id, len(ch.sent)))

    def _ack(self, st: _Subtask, checkpoint_id: int) -> None:
        state = dict(st.snapshots.pop(checkpoint_id))
        logged = st.channel_state.pop(checkpoint_id, {})
        state["channel_state"] = {k: [tuple(r) for r in v] for k, v in logged.items()}
        rows = sum(len(v) for v in logged.values())
        ack = SubtaskAck(
            state=state,
            channel_state_rows=rows,
            alignment_ms=state["alignment_s"] * 1000,
            unaligned=state["unaligned"],
        )
        outcome = self.coordinator.acknowledge(checkpoint_id, st.sid, ack)
        self._on_coordinator(outcome.effects)

    # consistency -----------------------------------------------------------------------------

    def _check_snapshot(self, st: _Subtask, checkpoint_id: int) -> None:
        """Check a snapshot when it is taken, completed or not: never one of a checkpoint the
        subtask was told was aborted; in the exactly-once modes, no record from after a channel's
        barrier of this checkpoint (or of a later one, when the sender skipped it) in the state."""
        if checkpoint_id in st.heard_aborts:
            self.violations.append(f"{st.sid} snapshotted checkpoint {checkpoint_id} after its abort")
        if not self.graph.mode.exactly_once:
            return
        for k, ch in enumerate(st.inputs):
            n = next((n for cid, n in ch.barriers if cid >= checkpoint_id), None)
            if n is not None and st.taken[k] > n:
                self.violations.append(
                    f"checkpoint {checkpoint_id} {ch.sender}->{ch.receiver}: took {st.taken[k]} records, "
                    f"only {n} came before the barrier"
                )

    def _check_cut(self, c: CompletedCheckpoint) -> None:
        """Check the Chandy-Lamport conditions and conservation on a completed checkpoint."""
        if not self.graph.mode.exactly_once:
            return
        total = 0
        for sid, ack in c.acks.items():
            total += ack.state["balance"]
            total += sum(r[2] for recs in ack.state["channel_state"].values() for r in recs)
        if total != self.total:
            self.violations.append(f"checkpoint {c.checkpoint_id}: conserved {total} != {self.total}")
        for ch in self.channels:
            n = c.acks[ch.sender].state["sent"][self.subtasks[ch.sender].outputs.index(ch)]
            m = c.acks[ch.receiver].state["taken"][ch.receiver_input]
            logged = [Record(*r) for r in c.acks[ch.receiver].state["channel_state"].get(ch.receiver_input, [])]
            if not n >= m:
                self.violations.append(f"checkpoint {c.checkpoint_id} {ch.sender}->{ch.receiver}: n={n} < m={m}")
            elif logged != ch.sent[m:n]:
                self.violations.append(
                    f"checkpoint {c.checkpoint_id} {ch.sender}->{ch.receiver}: channel state "
                    f"{[r.uid for r in logged]} != records m+1..n {[r.uid for r in ch.sent[m:n]]}"
                )

    def _check_effects(self) -> list[str]:
        """Check the finished pipeline: every record's effect is in the state of each vertex on its
        path (:meth:`Graph.path`) exactly once (at least once in at-least-once mode), and in no
        other vertex's state. The cuts it was restored from and the replay after them included."""
        applied: dict[str, Counter] = {v: Counter() for v in self.graph.stages}
        for st in self.subtasks.values():
            if not st.source:
                applied[st.sid.operator].update(st.processed)
        found = []
        for sid, records in zip(self.graph.source_subtasks(), self.inputs):
            for rec in records:
                path = self.graph.path(sid.operator, rec.key)
                for v, counts in applied.items():
                    n = counts[rec.uid]
                    if v not in path:
                        wrong = n != 0
                    else:
                        wrong = n != 1 if self.graph.mode.exactly_once else n < 1
                    if wrong:
                        found.append(f"record {rec.uid} applied {n} times at {v} (path {'->'.join(path)})")
        return found

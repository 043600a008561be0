"""Running a pipeline on Spark + Delta under the checkpoint core.

One :class:`PipelineRunner` drives one process of a pipeline: its ``source`` stage, its ``keyed``
stage, or both (``stage="all"``). Within an epoch (an attempt) each run of a stage is a session.

1. **open**: join the current epoch where the stage's last session ended cleanly, or recover:
   begin a new epoch (fencing every older process), plan recovery from the latest completed
   checkpoint (or a chosen one, rolling the sinks back if it is older) and carry it out: cut the
   channel log after the restored barrier, restore keyed state to the pinned versions, re-commit
   the sink transactions the checkpoint owns and abort every other open one, and publish every
   stage's starting point. A stage whose last process died therefore recovers by itself.
2. **source steps**: the source subtasks read the next versions of the landing table (whole
   versions, about ``rows_per_checkpoint`` rows: a million by default), send bad rows to the dead-letter table (a MERGE
   on the source offset: idempotent), apply the pipeline's ``map()`` steps and append the records
   to the Delta channel log, routed to the operator's subtasks by the pipeline's partitioner
   (hash by key group, rebalance, broadcast or forward: :mod:`.partitioning`). When the coordinator triggers a checkpoint, the barrier goes
   into the same Delta commit, after the data, and the sources acknowledge with their offsets.
3. **keyed steps**: the keyed stage reads the channel index (metadata), feeds every channel's
   segments, barriers and ends to one barrier handler per keyed subtask, then carries the effects
   out in Spark: deliveries are applied in flushes (ledger and balances staged into each subtask's
   open sink transaction, state MERGEd), a snapshot pins the state version and pre-commits the
   subtask's sink transactions, in-flight segments are copied to the channel-state table.
4. **completion**: acks are durable as they arrive; when every subtask acknowledged, the store
   makes the checkpoint durable and the sinks commit every pending transaction up to it
   (idempotent Delta commits), in whichever process wrote the last ack.
5. **close**: end the session(s) with their resume points.

Kill points: with ``CKPT_KILL_AT=phase:n`` the process SIGKILLs itself the n-th time it reaches
``phase`` (see :data:`checkpoint_lib.killpoints.KILL_PHASES`); the crash tests use it to hit every phase precisely. With
``CKPT_PHASE_TRACE=file`` every kill point reached is appended to ``file`` (``phase n`` per line,
flushed), so a kill from outside at a random instant can be attributed to the phase it interrupted
(tests/chaos). With ``CKPT_PAUSE_AT=phase:n`` the process SIGSTOPs itself there instead: a stalled
zombie that keeps everything in memory and goes on when it gets SIGCONT (tests/crash).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import threading
import time
from collections import defaultdict, deque
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..checkpoint_requests import CheckpointRequests
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
from ..core.clock import Clock, SystemClock
from ..core.coordinator import (
    CheckpointAborted,
    CheckpointCompleted,
    CheckpointCoordinator,
    DiscardCheckpoint,
    FailJob,
    NotifyCheckpointComplete,
    TriggerCheckpoint,
)
from ..core.decider import DEFAULT_ROWS_PER_STEP, CheckpointConfig
from ..core.errors import CheckpointError, FailureReason, SnapshotIncompatibleError, TooManyFailedCheckpointsError
from ..core.keygroups import range_for_subtask
from ..core.recovery import SINK_STATE_KEY, RecoveryPlan, check_fits
from ..core.twophase import SinkSnapshot, Transaction, TransactionIdPool, TwoPhaseCommitSink
from ..core.types import Barrier, BarrierMode, CheckpointKind, SubtaskAck
from ..delta import log as delta_log
from ..delta.store import END as SESSION_END
from ..delta.store import RESTORED, START, DeltaCheckpointStore
from ..killpoints import KillPoints
from ..pipeline import FEEDBACK, Pipeline
from . import tables
from .channels import BARRIER, DATA, END, ChannelEvent
from .sinks import app_prefix
from .partitioning import route
from .state import KEY_GROUP
from .topology import OFFSET_COLUMNS, Topology

TRUNCATE_EVERY = 5
STAGES = ("source", "keyed")
"""The stages of a pipeline: each may run as its own process (``stage="source"`` / ``"keyed"``),
joined by the persisted channel log; ``"all"`` runs both in one process."""
_ROW_BYTES = 64  # channel-state size estimate per row (the Delta files are compressed; rows are exact)


class SchemaMismatchError(ValueError):
    """The landing table's schema does not have the columns and types the pipeline needs."""


@dataclass
class RunSummary:
    epoch: int
    restored: int | None
    completed: list[int] = field(default_factory=list)
    aborted: list[tuple[int, str]] = field(default_factory=list)
    rows_in: int = 0
    final: int | None = None
    steps: int = 0
    seconds: float = 0.0


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
        self.pipeline = pipeline.validate()
        if stage not in ("all", *STAGES):
            raise ValueError(f"stage must be one of all, {', '.join(STAGES)}; got {stage!r}")
        self.stage = stage
        self.force_recover = recover
        self.poll_interval = poll_interval
        self.sessions: dict[str, int] = {}
        self._resumes_after: dict[str, int] = {}  # per stage: the session its resume point ended
        self._opened = False
        self._closed = False
        self.mode = BarrierMode(mode)
        if pipeline.feedback and self.mode in (BarrierMode.ALIGNED, BarrierMode.AT_LEAST_ONCE):
            raise ValueError(
                f"pipeline {pipeline.name!r} has a feedback edge (a cycle): {self.mode.value} checkpoints "
                "cannot wait for its barrier, which comes only after the snapshot. Use --mode unaligned "
                "(or aligned_with_timeout): the records in flight on the feedback edge are then logged "
                "as channel state, as Chandy-Lamport does."
            )
        if rows_per_checkpoint < 1:
            raise ValueError(f"rows_per_checkpoint must be >= 1, got {rows_per_checkpoint}")
        self.warehouse = os.path.abspath(warehouse)
        self.spark = spark
        self.rows_per_checkpoint = rows_per_checkpoint
        self.config = config or CheckpointConfig(interval=0, max_concurrent=1, timeout=3600, retained=5)
        self.clock = clock or SystemClock()
        self.progress = progress or (lambda _msg: None)
        self.restore_checkpoint = restore_checkpoint
        if self.mode is BarrierMode.ALIGNED_WITH_TIMEOUT and alignment_timeout is None:
            alignment_timeout = 1.0
        self.alignment_timeout = alignment_timeout if self.mode is BarrierMode.ALIGNED_WITH_TIMEOUT else None
        self.validate_checkpoints = pipeline.validate_checkpoints if validate_checkpoints is None else validate_checkpoints
        self.allow_non_restored_state = allow_non_restored_state
        if state_compact_every < 0:
            raise ValueError(f"state_compact_every must be >= 0 (0: never), got {state_compact_every}")
        # every N-th flush (counted across the epoch's processes) compacts the state table: the
        # MERGEs add small files and deletion vectors, which every later read of the state pays for
        self.state_compact_every = state_compact_every
        self.kills = KillPoints()
        self._ignored_columns: list[str] = []
        self._stop_requested = False

        p = pipeline
        self.topology = t = Topology(p, self.warehouse, spark, check_epoch=lambda epoch: self.store.check_epoch(epoch))
        self.root = t.root
        self.store = DeltaCheckpointStore.open(self.root, retained=self.config.retained)
        self.S, self.P = t.S, t.P
        if not 0 <= lagging_sources < self.S:
            raise ValueError(
                f"lagging_sources must be within 0..{self.S - 1} (at least one source subtask keeps pace), "
                f"got {lagging_sources}"
            )
        # The last ``lagging_sources`` source subtasks are slow: each step's records and barrier
        # reach the channel one step after the others' (see _write_source_step).
        self.lagging = list(range(self.S - lagging_sources, self.S))
        # Chained stages (Flink's operator chaining): with both stages in this process, no cycle
        # and no lagging source subtask, a step's records go from the landing read to the keyed
        # operator in one Spark plan, and its barrier reaches every channel at the same instant
        # with nothing in flight, so the channel log holds nothing worth writing (see _chained_step).
        self.chained = chaining and stage == "all" and not lagging_sources and not p.feedback
        self.sources, self.keyed, self.sink_ids, self.tasks = t.sources, t.keyed, t.sink_ids, t.tasks
        self.source_path, self.folder, self.payload = t.source_path, t.folder, t.payload
        self.channel, self.feedback_log, self.state = t.channel, t.feedback_log, t.state
        self.channel_state_path, self.dlq_path, self.sinks = t.channel_state_path, t.dlq_path, t.sinks

    # helpers ---------------------------------------------------------------------------------

    def _checkpoint(self, phase: str) -> None:
        """A kill point (:mod:`checkpoint_lib.killpoints`)."""
        self.kills.reached(phase)

    def _fence(self) -> None:
        """Refuse to write once a newer attempt began (FencedError): the early, cheap check before
        a data-plane write. It is not the fence: a process may stall between this check and its
        write. The fence is inside each write's commit (:meth:`_fence_data_plane`)."""
        self.store.check_epoch(self.epoch)

    def _fence_data_plane(self) -> None:
        """A recovery's first act on the data, before it reads or rolls back anything: raise this
        epoch's fence on every table an older attempt could still write with effect (each sink and
        the keyed state). From each fence commit on, Delta refuses a write of an older epoch inside
        its own commit (its idempotent-write version is below the fence), however long that writer
        stalled after its last check. The channel logs need none: their deletes are scoped to the
        writer's epoch and older, their readers read only their own epoch's rows. The first epoch
        has no older attempt to fence out (a racing first start is a newer epoch, and fences it)."""
        if self.epoch > 1:
            for sink in self.sinks.values():
                sink.fence(self.epoch)
            if self.state is not None:
                self.state.fence(self.epoch)
        self._checkpoint("fence")

    # opening: join the current epoch, or recover -------------------------------------------

    @property
    def runs_source(self) -> bool:
        return self.stage in ("all", "source")

    @property
    def runs_keyed(self) -> bool:
        return self.stage in ("all", "keyed")

    def _stages(self) -> tuple[str, ...]:
        return tuple(s for s in STAGES if self.stage in ("all", s))

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
        if not self.chained:  # a chained process reads the log only if an unchained one left it
            self.channel.create()
        if self.feedback_log is not None:
            self.feedback_log.create()
        if self.state is not None:
            self.state.create()
        for sink in self.sinks.values():
            sink.create()
        tables.create_if_missing(self.spark, self.dlq_path, self.topology.dlq_schema())
        tables.create_if_missing(self.spark, self.channel_state_path, self.topology.channel_state_schema())
        self._init_runtime()
        epoch = self.store.current_epoch()
        points = None if (self.force_recover or self.restore_checkpoint is not None) else self._resume_points(epoch)
        plan = None
        if points is None:
            plan = self._recover()
            points = self._resume_points(self.epoch)
            assert points is not None, "the epoch just restored must be joinable"
        else:
            self.epoch = epoch
            self.store.epoch = epoch
        for stage in self._stages():
            # on top of the very session whose end this process resumes from: a racing starter of
            # the stage, or one that started and ended meanwhile, makes this None (never a second
            # live session, never a stale resume point)
            number = self.store.begin_session(self.epoch, stage, after=self._resumes_after[stage])
            if number is None:
                raise CheckpointError(
                    f"another {stage} process of pipeline {self.pipeline.name!r} started at the same "
                    f"instant in epoch {self.epoch}: run one process per stage"
                )
            self.sessions[stage] = number
        for stage in self._stages():
            self._resume(stage, points[stage])
        self.coordinator = CheckpointCoordinator(
            self.config, self.tasks, self.sources, self.store, self.store, self.clock
        )
        self.coordinator.all_running()
        self.summary.epoch = self.epoch
        self._opened = True
        if self.chained and self.cursor < self.next_seq - 1 and delta_log.is_delta_table(self.channel.path):
            self.keyed_step()  # what a process of the unchained stages left in the channel log, first
        if plan is None:
            self.progress(
                f"{'+'.join(self._stages())} joined epoch {self.epoch} "
                f"(sessions {', '.join(f'{k} {v}' for k, v in self.sessions.items())})"
            )
        return plan

    def _resume_points(self, epoch: int) -> dict[str, dict[str, Any]] | None:
        """Where each of this runner's stages resumes in ``epoch``, or None if it must recover."""
        if epoch < 1:
            return None
        rows = self.store.sessions(epoch)
        restored = [r for r in rows if r["event"] == RESTORED]
        if not restored:
            return None  # the epoch's recovery never finished
        points: dict[str, dict[str, Any]] = {}
        base = json.loads(restored[0]["resume_json"])
        for stage in self._stages():
            mine = [r for r in rows if r["stage"] == stage]
            started = {r["session"] for r in mine if r["event"] == START}
            ended = {r["session"]: r for r in mine if r["event"] == SESSION_END}
            if started - set(ended):
                self.progress(f"the last {stage} process of epoch {epoch} did not stop cleanly: recovering")
                return None
            points[stage] = json.loads(ended[max(ended)]["resume_json"]) if ended else base[stage]
            self._resumes_after[stage] = max(ended, default=0)
        now = self._parallelism()
        for stage, point in points.items():
            was = point.get("parallelism", now)
            if was != now:
                self.progress(f"parallelism changed ({stage} stopped at {was}, now {now}): recovering to rescale")
                return None
        keyed = points.get("keyed")
        if keyed is not None and self.state is not None and keyed["state_version"] != self.state.version():
            self.progress(
                f"the state table moved past where the keyed stage stopped (version "
                f"{self.state.version()} != {keyed['state_version']}): recovering"
            )
            return None
        return points

    def _recover(self) -> RecoveryPlan:
        """Begin a new epoch and restore the latest (or the chosen) completed checkpoint."""
        self.store.check_readable()  # a damaged control table: refused before anything is written
        self.epoch = self.store.begin_epoch(f"{socket.gethostname()}:{os.getpid()}", f"recover ({self.stage})")
        self._fence_data_plane()
        self._abort_stale_pending()
        open_txns = [t for sink in self.sinks.values() for t in sink.open_transactions()]
        for cid in self.store.unreadable():  # completed, so maybe committed, but not restorable
            self.progress(f"checkpoint {cid} completed but its record is unreadable: it cannot be restored")
        # (an owed rollback is one an earlier recovery began and a crash interrupted)
        plan = self.store.recovery_plan(self.restore_checkpoint, current_epoch=self.epoch - 1, open_transactions=open_txns)
        plan = self._validated(plan, open_txns)
        if plan.checkpoint is not None:
            self._check_compatible(plan)
        if plan.rollback_after is not None:  # refused here, before anything is discarded or restored
            for sink in self.sinks.values():
                sink.rollback_version(plan.rollback_after)
        self._checkpoint("recover")
        if plan.rollback_after is not None:
            self._rollback(plan.rollback_after)
        self._restore(plan)
        resume = {"source": self._source_point(), "keyed": self._keyed_point()}
        self.store.record_restored(self.epoch, plan.checkpoint_id, resume)
        self.summary.restored = plan.checkpoint_id
        if plan.checkpoint:
            self.progress(f"restored checkpoint {plan.checkpoint_id} as epoch {self.epoch}")
        else:
            self.progress(f"no completed checkpoint: starting from scratch as epoch {self.epoch}")
        return plan

    def _validated(self, plan: RecoveryPlan, open_txns: list[Transaction]) -> RecoveryPlan:
        """A validating pipeline restores and re-commits only a validated checkpoint. One that
        completed but was never validated (its process died in between) is validated now, before
        anything is written; if it fails it is discarded and the previous one is planned instead,
        with a rollback of the sinks to what that one committed (a no-op unless a run without
        validation committed the failed one). A checkpoint the user chose must pass."""
        from ..quality import QualityCheckError, validate_before_commit

        fell_back = False
        while self.validate_checkpoints and plan.checkpoint is not None and not self.store.validated(plan.checkpoint_id):
            self.progress(f"checkpoint {plan.checkpoint_id} completed but was never validated: validating it first")
            try:
                validate_before_commit(self.spark, self.pipeline.name, self.warehouse, self.store,
                                       plan.checkpoint_id, self.progress)
            except QualityCheckError:
                if self.restore_checkpoint is not None:
                    raise
                plan = self.store.recovery_plan(None, current_epoch=self.epoch - 1, open_transactions=open_txns)
                fell_back = True
        if fell_back and plan.rollback_after is None:
            plan = dataclasses.replace(plan, rollback_after=plan.checkpoint_id or 0)
        return plan

    def _rollback(self, cid: int) -> None:
        """Restoring ``cid``, older than the latest completed checkpoint: what later checkpoints
        committed would be committed again by the replay, so (1) record the intent, (2) discard
        every later checkpoint (savepoints included: their commits are undone), (3) roll every
        sink back to what ``cid`` committed. A crash anywhere in between leaves the rollback owed
        (no restored row yet): the next recovery completes it, and (3) is idempotent until then."""
        self.store.record_rollback(self.epoch, cid)
        later = [c for c in self.store.all() if c.checkpoint_id > cid]
        why = f"rolled back to checkpoint {cid} by epoch {self.epoch}"
        if later:
            self.store.mark_discarded(later, why)
        unreadable = [i for i in self.store.unreadable() if i > cid]
        if unreadable:
            self.store.discard_unreadable(unreadable, f"{why} (its record was unreadable)")
        self._checkpoint("rollback")
        for name, sink in self.sinks.items():
            version = sink.rollback_to(cid)
            if version is not None:
                self.progress(f"sink {name}: rolled back to version {version} (what checkpoint {cid} committed)")
        self.progress(f"discarded checkpoints {sorted([c.checkpoint_id for c in later] + unreadable)} (after {cid})")

    def _abort_stale_pending(self) -> None:
        """Pending checkpoints of older epochs can never complete (their writers are fenced)."""
        for row in self.store.pending():
            if row["epoch"] < self.epoch:
                try:
                    self.store.record_aborted(
                        row["checkpoint_id"], FailureReason.TASK_FAILURE,
                        f"epoch {row['epoch']} ended before it completed", row["epoch"],
                    )
                except ValueError:
                    pass  # completed meanwhile by its (now fenced) epoch: the completed row wins

    # resume points -------------------------------------------------------------------------

    def _parallelism(self) -> dict[str, int]:
        return {"source": self.S, "operator": self.P}

    def _source_point(self) -> dict[str, Any]:
        return {"offset": self.offset, "next_seq": self.next_seq, "parallelism": self._parallelism()}

    def _keyed_point(self) -> dict[str, Any]:
        return {
            "parallelism": self._parallelism(),
            "cursor": self.cursor, "state_version": self.state_version, "flushes": self.flushes,
            "fseq": self.fseq, "fcursor": self.fcursor,
            "sinks": {name: [b.resume_state() for b in books] for name, books in self.sink_books.items()},
        }

    def _resume(self, stage: str, point: dict[str, Any]) -> None:
        if stage == "source":
            self.offset, self.next_seq = int(point["offset"]), int(point["next_seq"])
        else:
            self.cursor, self.state_version = int(point["cursor"]), int(point["state_version"])
            self.flushes = int(point["flushes"])
            self.fseq, self.fcursor = int(point.get("fseq", 0)), int(point.get("fcursor", -1))
            self.sink_books = {
                name: [TwoPhaseCommitSink.resumed(state, self._pool(name, i)) for i, state in enumerate(states)]
                for name, states in point["sinks"].items()
            }

    def _pool(self, sink: str, index: int) -> TransactionIdPool:
        return TransactionIdPool(f"{self.pipeline.name}.{sink}", index, size=max(4, self.config.max_concurrent + 3))

    def close(self) -> None:
        """Stop cleanly: finish pending clean-ups and end this process's session(s) with their
        resume points. The runner cannot be used afterwards; a new one resumes where it ended."""
        if not self._opened:
            return
        if self.runs_source and self._deferred is not None:
            self._write_source_step(None, [], None)  # a lagging subtask catches up before the end
        if self.runs_keyed:
            busy = [r for r, h in enumerate(self.handlers)
                    if h.aligning is not None or h.logging_channel_state or h.held or h.tracked]
            if busy or self.snapshots or self.channel_state:
                # Cannot describe a half-aligned subtask in a resume point: leave the session
                # open, so the next start recovers from the latest completed checkpoint.
                self.progress(f"keyed subtasks {busy} are inside a checkpoint: not ending the session cleanly")
                self.sessions.pop("keyed", None)
            else:
                self._cleanup()
        for stage, number in self.sessions.items():
            point = self._source_point() if stage == "source" else self._keyed_point()
            self.store.end_session(self.epoch, stage, number, point)
        self._opened = False
        self._closed = True

    def _check_compatible(self, plan: RecoveryPlan) -> None:
        """The snapshot must fit the pipeline (:func:`core.recovery.check_fits`)."""
        assert plan.checkpoint is not None
        p = self.pipeline
        try:
            changes = check_fits(plan.checkpoint, self.tasks, keyed_operator=p.operator_uid,
                                 max_parallelism=p.max_parallelism, partitioning=p.partitioning,
                                 allow_non_restored_state=self.allow_non_restored_state)
        except SnapshotIncompatibleError as exc:
            raise SnapshotIncompatibleError(str(exc).replace("the pipeline", f"pipeline {p.name!r}", 1)) from None
        rescaled = [c for c in changes if "new operator" not in c]
        if rescaled:
            self.progress(f"rescaling from checkpoint {plan.checkpoint_id}: {', '.join(rescaled)}")

    def _init_runtime(self) -> None:
        """Fresh in-memory state of one process (handlers, buffers, counters)."""
        # input channels of a subtask: one per source subtask, then (a cycle) one per subtask of
        # the operator itself - channel S + i is the feedback from subtask i
        channels = self.S + (self.P if self.feedback_log is not None else 0)
        self.handlers = [
            create_handler(channels, self.mode, self.clock, alignment_timeout=self.alignment_timeout)
            for _ in range(self.P)
        ]
        self.fb_parts: list[tuple] = []  # forwarded barriers not written to the feedback log yet
        self._cache: list[DataFrame] = []  # persisted for the current step or flush (_cached)
        self._indexed: dict[str, tuple[int | None, int, int]] = {}  # log path -> (version, epoch, cursor) last indexed
        self.fseq, self.fcursor = 0, -1
        self.pending: dict[int, list[ChannelEvent]] = defaultdict(list)
        self.channel_state: dict[tuple[int, int], list[ChannelEvent]] = defaultdict(list)
        self.flushes = 0
        self.completions = 0
        self.last_completed: int | None = None
        self.committed: dict[str, list[Transaction]] = defaultdict(list)
        self._table_bytes: tuple[int, int] | None = None
        self._truncated: tuple[int | None, int] | None = None  # (channel log version, position) after the last truncation
        self.snapshots: dict[tuple[int, int], dict[str, Any]] = {}
        self.schema_checked_at = -1
        self.summary = RunSummary(0, None)
        # a lagging source subtask's records and barrier of the last step, not in the channel yet
        self._deferred: tuple[DataFrame | None, tuple[int, float] | None] | None = None

    def _restore(self, plan: RecoveryPlan) -> None:
        """Carry out the recovery plan on the data (every stage), and set every stage's position."""
        acks = plan.checkpoint.acks if plan.checkpoint else {}
        source_state = acks[self.sources[0]].state if plan.checkpoint else {}
        self.offset = int(source_state.get("version", -1))
        self.next_seq = int(source_state.get("next_seq", 0))
        self.cursor = self.next_seq - 1
        # Everything the old attempt wrote after the cut is rewritten by this one.
        # (Deletes of the channel logs touch this epoch's and older rows only; readers read their
        # own epoch's: a stalled older attempt cannot delete or add anything this one reads.)
        self.channel.truncate_after(self.cursor, self.epoch)
        if self.feedback_log is not None:
            # What was in flight on the feedback edge at the checkpoint is in the receivers' state
            # or channel state; what came after it is sent again by the replay.
            self.feedback_log.clear(self.epoch)
            self.fseq, self.fcursor = 0, -1
        if self.state is None:
            pass  # a stateless operator: its position is the channel cursor, nothing else
        elif plan.checkpoint and any(s.operator == self.pipeline.operator_uid for s in acks):
            # the snapshot's own subtasks (any parallelism): together they cover every key group
            self.state.restore([a.state for s, a in acks.items() if s.operator == self.pipeline.operator_uid],
                               epoch=self.epoch)
        else:  # nothing to restore, or a new operator (uid not in the snapshot): it starts empty
            self.state.clear(epoch=self.epoch)
        self._checkpoint("restore")
        # Sinks: re-commit what the checkpoint owns (a no-op for what was committed), then
        # discard the staged rows of everything else and of what is now committed.
        for name, sink in self.sinks.items():
            owned = [t for sid, rec in sorted(plan.sinks.items()) if sid.operator == f"sink_{name}" for t in rec.recommit]
            if owned:
                sink.commit(owned, int(plan.checkpoint_id), self.epoch)
                self._checkpoint("restore")  # between two sinks' re-commits
            sink.discard(owned)
            sink.abort(plan.abort)
        # Bookkeeping resumes in the new epoch.
        self.sink_books: dict[str, list[TwoPhaseCommitSink]] = {}
        for name in self.sinks:
            books = []
            for i, sid in enumerate(self.sink_ids[name]):
                pool = self._pool(name, i)
                if plan.checkpoint and sid in acks:
                    snap = SinkSnapshot.from_dict(acks[sid].state[SINK_STATE_KEY])
                    books.append(TwoPhaseCommitSink.restored(snap, pool, self.epoch))
                else:
                    books.append(TwoPhaseCommitSink(pool, self.epoch))
            self.sink_books[name] = books
        self.state_version = self.state.version() if self.state is not None else -1
        if plan.checkpoint:
            self._replay_channel_state(plan)

    # the run loop ----------------------------------------------------------------------------

    def run(
        self,
        until_caught_up: bool = True,
        max_steps: int | None = None,
        final_checkpoint: bool = True,
        final_kind: CheckpointKind = CheckpointKind.CHECKPOINT,
        handle_signals: bool = False,
    ) -> RunSummary:
        """Open, process (until caught up, or ``max_steps`` steps), take a final checkpoint (of
        ``final_kind``) and close. A source-only run injects the final barrier and does not wait
        for it; a keyed-only run stops when the channel log holds nothing new. With
        ``handle_signals`` (the CLI), SIGTERM/SIGINT stop the loop cleanly (:meth:`request_stop`);
        otherwise the host's handlers stay (e.g. Airflow's task runner)."""
        started = time.monotonic()
        if not self._opened:
            self.open()
        steps = 0
        with _stop_on_signals(self.request_stop) if handle_signals else nullcontext():
            while (max_steps is None or steps < max_steps) and not self._stop_requested:
                steps += 1
                moved = self.source_step() if self.runs_source else False
                consumed = self.keyed_step() if self.runs_keyed and not self.chained else False
                if not (moved or consumed) and self.runs_keyed and self._aligning_with_timeout():
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
        self._sync_pending()
        trigger = self.coordinator.trigger(kind)
        self._send_step(None, [], trigger)
        if not self.runs_keyed:
            self.progress(f"{kind.value} {trigger.checkpoint_id} injected: it completes when the keyed stage runs")
            return trigger.checkpoint_id
        deadline = time.monotonic() + self.config.timeout
        while not self.chained and self.coordinator.status_of(trigger.checkpoint_id) == "pending":
            if self.keyed_step():
                continue  # a cycle: the feedback barriers come back in later steps
            if self._aligning_with_timeout() and time.monotonic() < deadline:
                time.sleep(0.05)  # the alignment times out, then the checkpoint goes unaligned
                continue
            break
        status = self.coordinator.status_of(trigger.checkpoint_id)
        if status != "completed":
            raise CheckpointError(f"final {kind.value} {trigger.checkpoint_id} did not complete: {status}")
        return trigger.checkpoint_id

    def _aligning_with_timeout(self) -> bool:
        return self.alignment_timeout is not None and any(h.aligning is not None for h in self.handlers)

    def _check_open(self) -> None:
        if not self._opened:
            raise RuntimeError("the runner is closed" if self._closed else "call open() first")

    def _sync_pending(self) -> None:
        """Forget pending checkpoints another process (the keyed stage) completed or aborted."""
        if self.runs_keyed or not self.coordinator.pending:
            return
        for row in self.store.history():
            cid = row["checkpoint_id"]
            if cid in self.coordinator.pending and row["status"] != "pending":
                status = "aborted" if row["status"] == "aborted" else "completed"
                self.coordinator.finished_elsewhere(cid, status, row["completion_time"] or row["recorded_at"])

    # sources ---------------------------------------------------------------------------------

    def source_step(self) -> bool:
        """Read the next versions of the landing table into the channel log. False: nothing new."""
        self._check_open()
        self._sync_pending()
        if self.folder is not None:
            self._fence()
            latest = self.folder.discover()  # registers new files: the manifest version is the offset
        else:
            latest = delta_log.latest_version(self.source_path)
            if latest is None:
                raise FileNotFoundError(
                    f"no landing table at {self.source_path}: generate data first (ckpt generate {self.pipeline.name})"
                )
        if latest is None or latest <= self.offset:
            self._on_coordinator(self.coordinator.expire())  # no barrier without a source step...
            requested = self._requested_trigger(None)  # ...unless someone asked for a checkpoint
            if requested is None and self._deferred is None:
                return False
            self._send_step(None, [], requested)
            return True
        if self.folder is not None:
            files = self.folder.added_files(self.offset, latest)
        else:
            if self.schema_checked_at != latest:
                self._check_schema(latest)
                self.schema_checked_at = latest
            files = delta_log.added_files(self.source_path, self.offset, latest)
        steps = delta_log.plan_steps(files, self.rows_per_checkpoint)
        step = steps[0] if steps else []
        end_version = max((f.version for f in step), default=latest) if step else latest
        effects = self.coordinator.tick()
        triggers = [e for e in effects if isinstance(e, TriggerCheckpoint)]  # at most one
        self._on_coordinator([e for e in effects if not isinstance(e, TriggerCheckpoint)])
        self._send_step(end_version, step, self._requested_trigger(triggers[0] if triggers else None))
        return True

    def _requested_trigger(self, trigger: TriggerCheckpoint | None) -> TriggerCheckpoint | None:
        """Honour "checkpoint now" requests (:mod:`checkpoint_lib.control`, e.g. from Airflow): the
        checkpoint this step triggers anyway answers them, else a forced one is triggered. The
        request records the checkpoint id before the barrier is written; a crash in between leaves
        an id that never completes, which the requester sees time out and aborts."""
        requests = CheckpointRequests(self.root)
        waiting = requests.open()
        if not waiting:
            return trigger
        self._fence()
        savepoint = any(r.kind == "savepoint" for r in waiting)
        if trigger is None:
            trigger = self.coordinator.trigger(CheckpointKind.SAVEPOINT if savepoint else CheckpointKind.CHECKPOINT)
        if trigger.barrier.kind is not CheckpointKind.SAVEPOINT:  # a savepoint request waits for the next step
            waiting = [r for r in waiting if r.kind != "savepoint"]
        honoured = requests.honour(waiting, trigger.checkpoint_id, self.epoch)
        if honoured:
            self.progress(f"checkpoint {trigger.checkpoint_id} answers requests {[r.request_id for r in honoured]}")
        return trigger

    def _check_schema(self, version: int) -> None:
        features = delta_log.table_features(self.source_path, version)
        if features & {"deletionVectors", "columnMapping"}:
            raise SchemaMismatchError(
                f"{self.source_path} uses {sorted(features & {'deletionVectors', 'columnMapping'})}: "
                "an incremental source needs plain append-only Parquet files"
            )
        have = delta_log.schema_at(self.source_path, version)
        want = self.pipeline.source_spec.schema
        problems = [
            f"column {c!r} is missing" if c not in have else f"column {c!r} is {have[c]}, expected {t}"
            for c, t in want.items()
            if have.get(c) != t
        ]
        if problems:
            raise SchemaMismatchError(
                f"{self.source_path} at version {version} does not fit pipeline {self.pipeline.name!r}: "
                + "; ".join(problems) + ". Nothing was read or written."
            )
        extra = sorted(set(have) - set(want))
        if extra and extra != self._ignored_columns:  # schema drift that loses nothing the pipeline reads
            self._ignored_columns = extra
            self.progress(
                f"{self.source_path} at version {version} has columns pipeline {self.pipeline.name!r} does not "
                f"declare: {extra} (ignored; declare them in the source schema to use them)"
            )

    def _send_step(self, end_version: int | None, step: list, trigger: TriggerCheckpoint | None) -> None:
        """Send one source step (the landing files ``step``, up to ``end_version``; then the barrier
        of ``trigger``) downstream: chained into the operator, or through the channel log."""
        if self.chained:
            self._chained_step(end_version, step, trigger)
        else:
            self._write_source_step(end_version, step, trigger)

    def _chained_step(self, end_version: int | None, step: list, trigger: TriggerCheckpoint | None) -> None:
        """One source step chained into the keyed operator, with no channel in between: the step's
        records go from the landing read to the operator in one Spark plan (state MERGEd, sink
        rows staged into the open transactions: one flush), then the barrier of ``trigger`` reaches
        every channel of every keyed subtask at once. A step boundary is thus an aligned barrier
        with nothing in flight, in every mode: no record is in the channel log to cut, replay or
        log as channel state, and the channel positions do not move (the sources' ack names the
        positions a later unchained process resumes from). The kill points are the source's
        (``source_read``, ``dlq``, ``source_ack``) and the keyed stage's (``flush_stage``,
        ``flush_merge``, ``snapshot``, ``ack``, ...); ``channel_write`` is never reached."""
        if trigger is not None:
            self.store.record_pending(trigger.checkpoint_id, trigger.barrier.kind, trigger.barrier.timestamp, self.epoch)
        if step:
            self._checkpoint("source_read")
            data = self._read_step(step, end_version)
            self.summary.rows_in += sum(max(f.rows, 0) for f in step)
            self._apply(data, list(range(self.P)))
        if end_version is not None:
            self.offset = end_version
        if trigger is None:
            return
        cid, last = trigger.checkpoint_id, self.next_seq - 1
        state = {"version": self.offset, "next_seq": self.next_seq, "barrier_seq": last,
                 "barrier_seqs": {str(s): last for s in range(self.S)}}
        acks = {sid: SubtaskAck(state=state) for sid in self.sources}
        self._checkpoint("source_ack")
        self.store.record_acks(cid, acks, self.epoch)
        for sid, ack in acks.items():
            self._on_coordinator(self.coordinator.acknowledge(cid, sid, ack).effects)
        if self.coordinator.status_of(cid) != "pending":
            return  # declined or aborted meanwhile
        barrier = trigger.barrier
        self._execute({r: [e for s in range(self.S) for e in h.on_barrier(s, barrier)]
                       for r, h in enumerate(self.handlers)})

    def _write_source_step(self, end_version: int | None, step: list, trigger: TriggerCheckpoint | None) -> None:
        """Write one source step into the channel log in ONE commit, at positions from
        ``next_seq``: the step's records, then the barrier of ``trigger`` on every channel.

        With lagging source subtasks (``lagging_sources``) the commit is laid out as
        ``seq``: this step's records of the subtasks that keep pace; ``seq+1``: the lagging
        subtasks' records of the previous step; ``seq+2``: their barrier of the previous step's
        checkpoint; ``seq+3``: this step's barrier on the channels that keep pace (and on the
        lagging ones when they read nothing in this step) - the lagging subtasks' records and
        barrier of this step go into the next commit. So a keyed subtask sees a checkpoint's
        barriers at different positions, with records in flight between them: post-barrier
        records of the fast channels, pre-barrier records of the slow ones (channel state in
        unaligned mode). The positions of the next commit are fixed now, so the sources' acks
        (durable before any barrier of the checkpoint) know where the last barrier will be."""
        seq = self.next_seq
        if trigger is not None:
            self.store.record_pending(trigger.checkpoint_id, trigger.barrier.kind, trigger.barrier.timestamp, self.epoch)
        data = None
        if step:
            self._checkpoint("source_read")
            data = self._read_step(step, end_version)
            rows = sum(max(f.rows, 0) for f in step)
            self.summary.rows_in += rows
        barrier = (trigger.checkpoint_id, trigger.barrier.timestamp) if trigger else None
        senders = list(range(self.S))
        parts: list[tuple] = []
        defer = False
        if not self.lagging:
            if data is not None:
                parts.append((DATA, seq, data))
            barrier_at = {s: seq + 1 for s in senders}
            next_seq = seq + 2
        else:
            lag = F.col("sender").isin(self.lagging)
            defer = bool({i % self.S for i in range(len(step))} & set(self.lagging))
            if data is not None:
                parts.append((DATA, seq, data.where(~lag) if defer else data))
            if self._deferred is not None:
                old_data, old_barrier = self._deferred
                if old_data is not None:
                    parts.append((DATA, seq + 1, old_data))
                if old_barrier is not None:
                    parts.append((BARRIER, seq + 2, old_barrier, self.lagging, list(range(self.P))))
            next_seq = seq + 4
            barrier_at = {s: (next_seq + 2 if defer and s in self.lagging else seq + 3) for s in senders}
        if barrier is not None:
            now = [s for s in senders if barrier_at[s] < next_seq]
            parts.append((BARRIER, barrier_at[now[0]], barrier, now, list(range(self.P))))
        acks = {}
        if trigger is not None:
            # Durable before the barrier is in the channel: a keyed stage in another process that
            # sees the barrier finds the sources' acks, and completes the checkpoint. ``next_seq``
            # is where a restore resumes: past every channel's barrier of this checkpoint.
            last = max(barrier_at.values())
            state = {"version": self.offset if end_version is None else end_version,
                     "next_seq": last + 1, "barrier_seq": last,
                     "barrier_seqs": {str(s): p for s, p in barrier_at.items()}}
            acks = {sid: SubtaskAck(state=state) for sid in self.sources}
            self._checkpoint("source_ack")
            self.store.record_acks(trigger.checkpoint_id, acks, self.epoch)
        if parts:
            self._checkpoint("channel_write")
            self._fence()
            self.channel.write(parts, epoch=self.epoch)
        self._uncache()
        if self.lagging:
            self._deferred = (data.where(lag), barrier) if defer else None
        if end_version is not None:
            self.offset = end_version
        self.next_seq = next_seq
        for sid, ack in acks.items():
            self._on_coordinator(self.coordinator.acknowledge(trigger.checkpoint_id, sid, ack).effects)

    def _read_step(self, step: list, end_version: int) -> DataFrame:
        """The step's good rows with sender, receiver and offsets; bad rows (unparsable, of the
        wrong type, or refused by the source's ``validate``) go to the dead-letter table."""
        p = self.pipeline
        if self.folder is not None:
            df = self.folder.read(step)  # parse errors are in _error already
            names = [(f.path, f.version, i % self.S) for i, f in enumerate(step)]
            files = self.spark.createDataFrame(names, "src_file string, src_version long, sender int")
            df = df.join(F.broadcast(files), ["src_file", "src_version"])
        else:
            df = self._read_delta_step(step).withColumn("_error", F.lit(None).cast("string"))
        validate = p.source_spec.validate
        if validate is not None:
            df = df.withColumn("_error", F.coalesce(F.col("_error"), validate(df)))
        if validate is not None or self.folder is not None:
            # read once, used twice (dead letters, then the channel): unpersisted after the
            # channel write. Only a cache: the landing files are immutable, a recompute is equal.
            df = self._cached(df)
            bad = df.where(F.col("_error").isNotNull())
            self._checkpoint("dlq")
            self._write_dlq(bad, end_version)
            df = df.where(F.col("_error").isNull())
        df = df.drop("_error")
        for fn, _schema in p.transforms:  # fused row-wise maps (forward: no channel between them)
            df = fn(df)
        if self.offset == -1 and p.bootstrap_spec is not None:  # starting from scratch
            records = [*p.record_schema, "sender", *[c for c, _ in OFFSET_COLUMNS]]
            df = self._read_bootstrap().select(*records).unionByName(df.select(*records))
        df = route(df, p.partitioning, self.P, key=p.key, max_parallelism=p.max_parallelism)
        return df.select("sender", "receiver", *self.payload.fieldNames())

    def _read_bootstrap(self) -> DataFrame:
        """The bootstrap table's records (its latest version), before the source's first records."""
        b = self.pipeline.bootstrap_spec
        path = self.topology.path(b.path)
        version = delta_log.latest_version(path)
        if version is None:
            raise FileNotFoundError(f"pipeline {self.pipeline.name!r} starts from {path}, which does not exist")
        cols = list(b.schema)
        df = (
            self.spark.read.format("delta").option("versionAsOf", version).load(path).select(*cols)
            .withColumn("src_version", F.lit(-1).cast("long"))
            .withColumn("src_file", F.lit(f"bootstrap:{b.path}@{version}"))
            .withColumn("src_row", F.xxhash64(*cols))
            .withColumn("sender", F.lit(0).cast("int"))
        )
        self.progress(f"bootstrap: reading {b.path} at version {version}")
        return b.to_records(df)

    def _read_delta_step(self, step: list) -> DataFrame:
        """The step's rows of the landing Delta table with sender and offsets. The step's files are
        known exactly from the Delta log, and the table is append-only without deletion vectors
        or column mapping (checked with the schema), so its Parquet files are read directly: that
        gives each row its offset (file, row index)."""
        from urllib.parse import unquote

        p = self.pipeline
        paths = [f"{self.source_path}/{unquote(f.path)}" for f in step]
        names = [(os.path.basename(unquote(f.path)), f.version, i % self.S) for i, f in enumerate(step)]
        files = self.spark.createDataFrame(names, "src_base string, src_version long, sender int")
        schema = tables.struct_type(p.source_spec.schema)
        return (
            self.spark.read.schema(schema).parquet(*paths)
            .select(
                *p.source_spec.schema.keys(),
                F.col("_metadata.file_path").alias("src_file"),
                F.col("_metadata.row_index").alias("src_row"),
            )
            .withColumn("src_base", F.element_at(F.split("src_file", "/"), -1))
            .join(F.broadcast(files), "src_base")
            .drop("src_base")
            .withColumn("src_file", F.element_at(F.split("src_file", "/"), -1))
        )

    def _write_dlq(self, bad: DataFrame, end_version: int) -> None:
        """Append the step's bad rows, idempotently: stamped ``(dlq app id, end_version)``, and
        only rows of versions above the stamp (a re-read after recovery adds nothing twice,
        whatever the step boundaries are now)."""
        from deltalake import DeltaTable

        app = f"{app_prefix(self.pipeline.name)}/dlq"
        stamp = DeltaTable(self.dlq_path).transaction_version(app)
        stamp = -1 if stamp is None else int(stamp)
        if end_version <= stamp:
            return
        cols = list(self.pipeline.source_spec.schema)
        rows = bad.where(F.col("src_version") > stamp).select(
            *[F.col(c).cast("string").alias(c) for c in cols],
            F.col("_error").alias("error"), "src_version", "src_file", "src_row",
            F.lit(self.epoch).cast("long").alias("epoch"),
        )
        (
            rows.write.format("delta").mode("append")
            .option("txnAppId", app).option("txnVersion", str(end_version))
            .save(self.dlq_path)
        )

    # the keyed stage -------------------------------------------------------------------------

    def keyed_step(self) -> bool:
        """Consume everything the channel log holds beyond the cursor. False: nothing new."""
        self._check_open()
        switched = False
        if self.alignment_timeout is not None:  # aligned-with-timeout: switch even with no new event
            timed = {r: h.on_timer() for r, h in enumerate(self.handlers)}
            switched = any(timed.values())
            if switched:
                self._execute(timed)
        events = self._index(self.channel, self.cursor)
        fed = self._index(self.feedback_log, self.fcursor) if self.feedback_log is not None else []
        if not events and not fed:
            return switched
        effects: dict[int, list] = {r: [] for r in range(self.P)}
        # position order within a log; at one position, every channel in sender order. The
        # feedback log's channels are numbered after the source's (S + sending subtask).
        for e in [*events, *(replace(f, sender=self.S + f.sender) for f in fed)]:
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
        self._execute(effects)
        return True

    def _index(self, log, after: int) -> list[ChannelEvent]:
        """``log.index`` past ``after``, skipping the Spark job when the log's Delta version did not
        move since the index that left the cursor at ``after`` (an idle poll: nothing new)."""
        version = delta_log.latest_version(log.path)
        if self._indexed.get(log.path) == (version, self.epoch, after):
            return []  # that version of the log holds nothing of this epoch past ``after``
        events = log.index(self.epoch, after=after)
        self._indexed[log.path] = (version, self.epoch, max((e.seq for e in events), default=after))
        return events

    def _adopt(self, cid: int) -> None:
        """Make the coordinator know checkpoint ``cid`` (triggered by a source stage in another
        process) with the acks already recorded; one that is no longer pending is left alone (its
        barrier is still processed, and the keyed acks are then discarded)."""
        if self.coordinator.status_of(cid) != "unknown":
            return
        row = self.store.status(cid)
        if row is None or row["status"] != "pending" or row["epoch"] != self.epoch:
            return
        acks = self.store.pending_acks(cid, self.epoch)
        self._on_coordinator(self.coordinator.adopt(cid, row["trigger_time"], CheckpointKind(row["kind"]), acks))

    # Depth of the _execute calls under way (an abort inside one runs another), and whether a
    # clean-up is owed: a checkpoint completes in the middle of _execute (at the last CheckpointDone),
    # while deliveries, channel state and held records of this very step still point into the
    # channel logs; the clean-up waits until the outermost _execute has flushed them.
    _executing = 0
    _cleanup_due = False

    def _execute(self, effects: dict[int, list]) -> None:
        """Carry out the handlers' effects in order per subtask, batching Spark work: deliveries
        up to the next snapshot of every subtask are applied in one flush. A clean-up that a
        completion made due runs after the last flush, never in the middle."""
        self._executing += 1
        try:
            queues = {r: deque(es) for r, es in effects.items()}
            while any(queues.values()):
                for r, q in queues.items():
                    while q and not isinstance(q[0], TakeSnapshot):
                        self._effect(r, q.popleft())
                snapping = [r for r, q in queues.items() if q and isinstance(q[0], TakeSnapshot)]
                if snapping:
                    self._flush()
                    for r in snapping:
                        self._snapshot(r, queues[r].popleft())
            self._flush()
            self._write_feedback()
        finally:
            self._executing -= 1
        self._cleanup_if_due()

    def _effect(self, r: int, e: Any) -> None:
        if isinstance(e, Deliver):
            self.pending[r].append(e.record)
        elif isinstance(e, LogChannelState):
            self.channel_state[(e.checkpoint_id, r)].append(e.record)
        elif isinstance(e, ForwardBarrier):
            if self.feedback_log is not None:  # onto the feedback edge, after what r sent before
                cid = e.barrier.checkpoint_id
                self.fb_parts.append((BARRIER, self.fseq, (cid, e.barrier.timestamp), [r], list(range(self.P))))
                if (cid, r) in self.snapshots:
                    self.snapshots[(cid, r)]["state"]["feedback_barrier_seq"] = self.fseq
                self.fseq += 1
            # the sinks are fused: no other downstream channel to forward to
        elif isinstance(e, ChannelStateComplete):
            pass
        elif isinstance(e, CheckpointDone):
            self._ack_keyed(r, e.checkpoint_id)
        elif isinstance(e, DeclineCheckpoint):
            self._on_coordinator(self.coordinator.decline(e.checkpoint_id, self.keyed[r], e.reason))

    def _flush(self) -> None:
        """Apply every pending delivery: stage sink rows into the open transactions, MERGE state."""
        segments = [e for es in self.pending.values() for e in es]
        if not segments:
            return
        self._apply(self._read(segments), sorted(self.pending))
        self.pending.clear()

    def _read(self, segments: list[ChannelEvent]) -> DataFrame:
        """The records of ``segments`` of either log (feedback channels are numbered from S)."""
        src = [e for e in segments if e.sender < self.S]
        fed = [replace(e, sender=e.sender - self.S) for e in segments if e.sender >= self.S]
        df = self.channel.read(src, self.epoch) if src or not fed else None
        if fed:
            back = self.feedback_log.read(fed, self.epoch).withColumn("sender", F.col("sender") + F.lit(self.S))
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
        self._checkpoint("feedback_write")
        self._fence()
        self.feedback_log.write(self.fb_parts, epoch=self.epoch)
        self.fb_parts = []

    def _apply(self, records: DataFrame, receivers: list[int]) -> None:
        """Run the keyed operator on ``records`` (of ``receivers``) against the current state."""
        self.flushes += 1
        p = self.pipeline
        # Every sink's stage and the state MERGE read the records and the state: cached once for
        # the flush (both immutable inputs, a pinned channel segment and a pinned state version).
        records = self._cached(records.withColumn("sink_subtask", F.col("receiver")))
        if self.state is None:
            deltas, outputs = None, p.operator.apply(records)
        else:
            state_before = self._cached(self.state.read(self.state_version))
            deltas, outputs = p.operator.apply(records, state_before, p.key)
        try:
            self._apply_outputs(deltas, outputs, receivers)
        finally:
            self._uncache()

    def _apply_outputs(self, deltas: DataFrame | None, outputs: dict[str, DataFrame], receivers: list[int]) -> None:
        p = self.pipeline
        missing = sorted(set(self.sinks) - set(outputs))
        if self.feedback_log is not None and FEEDBACK not in outputs:
            missing.append(FEEDBACK)
        if missing:
            raise ValueError(f"operator {p.operator_uid!r} returned no DataFrame for {missing}")
        self._checkpoint("flush_stage")
        self._fence()
        for name, sink in self.sinks.items():
            handles = {r: self.sink_books[name][r].current for r in receivers}
            sink.stage(outputs[name], handles, self.flushes)
        if self.feedback_log is not None:  # sent by the subtask that produced it, routed by key
            back = route(outputs[FEEDBACK].withColumn("sender", F.col("sink_subtask").cast("int")), "hash",
                         self.P, key=p.key, max_parallelism=p.max_parallelism)
            self._write_feedback(back.select("sender", "receiver", *self.payload.fieldNames()))
        if self.state is None:
            return
        self._fence()
        self._checkpoint("flush_merge")  # past its epoch check, the MERGE not yet committed
        self.state_version = self.state.add(deltas, before_retry=self._fence, epoch=self.epoch)
        if self.state_compact_every and self.flushes % self.state_compact_every == 0:
            self._fence()
            # same rows, fewer files: a snapshot of this flush may pin either version
            self.state_version = self.state.compact(before_retry=self._fence)

    def _cached(self, df: DataFrame) -> DataFrame:
        """``df`` persisted (memory, spilling to disk) until :meth:`_uncache`: for a DataFrame of
        immutable inputs that several writes read, so it is computed once. Only ever a cache."""
        from pyspark import StorageLevel

        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        self._cache.append(df)
        return df

    def _uncache(self) -> None:
        while self._cache:
            self._cache.pop().unpersist()

    def _write_channel_state(self, cid: int, r: int) -> tuple[int, int]:
        """Copy the in-flight segments logged for (checkpoint, subtask) into the channel-state
        table (a Spark job); returns (rows, bytes estimate)."""
        segments = self.channel_state.pop((cid, r), [])
        if not segments:
            return 0, 0
        rows = sum(e.rows for e in segments)
        df = self._read(segments).withColumn("checkpoint_id", F.lit(cid).cast("long"))
        schema = self.topology.channel_state_schema()
        df.select(*schema.fieldNames()).write.format("delta").mode("append").save(self.channel_state_path)
        return rows, rows * _ROW_BYTES

    def _replay_channel_state(self, plan: RecoveryPlan) -> None:
        """Restore = state, then the logged channel state, then the channels (BRIEF.md). The
        records are routed again (by key group or offset), so a rescaled pipeline sends each to
        the subtask that owns it now."""
        p = self.pipeline
        old = sorted(s.index for s in plan.replay_channel_state if s.operator == p.operator_uid)
        if not old:
            return
        df = (
            self.spark.read.format("delta").load(self.channel_state_path)
            .where((F.col("checkpoint_id") == plan.checkpoint_id) & F.col("receiver").isin(old))
            .drop("checkpoint_id")
        )
        if p.partitioning in ("hash", "rebalance"):
            df = route(df.drop("receiver", KEY_GROUP), p.partitioning, self.P, key=p.key,
                       max_parallelism=p.max_parallelism)
        self._apply(df.select(*self.topology.channel_state_schema().fieldNames()[1:]), list(range(self.P)))
        self.progress(f"replayed the channel state of checkpoint {plan.checkpoint_id} logged by subtasks {old}")

    def _snapshot(self, r: int, e: TakeSnapshot) -> None:
        self._checkpoint("snapshot")
        cid = e.checkpoint_id
        if self.state is not None:
            kg = range_for_subtask(r, self.P, self.pipeline.max_parallelism)
            state = {"table_version": self.state_version, "key_groups": kg.to_list(), "cursor": self.cursor}
            state_bytes = self._state_bytes(kg)
        else:
            state, state_bytes = {"cursor": self.cursor}, 0
        sinks = {name: self.sink_books[name][r].pre_commit(cid).snapshot.to_dict() for name in self.sinks}
        self.snapshots[(cid, r)] = {
            "state": state, "sinks": sinks, "unaligned": e.unaligned, "alignment_ms": e.alignment_s * 1000,
            "started": time.monotonic(), "state_bytes": state_bytes,
        }

    def _state_bytes(self, kg) -> int:
        """The snapshot's share of the state table (by key-group fraction): what restoring it reads.
        Taking it writes nothing: the snapshot pins a version."""
        from deltalake import DeltaTable

        if self._table_bytes is None or self._table_bytes[0] != self.state_version:
            actions = DeltaTable(self.state.path, version=self.state_version).get_add_actions(flatten=True)
            self._table_bytes = (self.state_version, int(sum(actions.column("size_bytes").to_pylist())))
        return self._table_bytes[1] * len(kg) // self.pipeline.max_parallelism

    def _ack_keyed(self, r: int, cid: int) -> None:
        snap = self.snapshots.pop((cid, r), None)
        if snap is None:
            return  # snapshot of an aborted checkpoint
        self._checkpoint("ack")
        cs_rows, cs_bytes = self._write_channel_state(cid, r)
        if cs_rows:
            self._checkpoint("channel_state")  # channel state written, the ack not yet durable
        duration = (time.monotonic() - snap["started"]) * 1000
        ack = SubtaskAck(state=snap["state"], alignment_ms=snap["alignment_ms"], unaligned=snap["unaligned"],
                         duration_ms=duration, channel_state_rows=cs_rows, channel_state_bytes=cs_bytes,
                         state_size_bytes=snap["state_bytes"])
        acks = {self.keyed[r]: ack}
        for name, snapshot in snap["sinks"].items():
            acks[self.sink_ids[name][r]] = SubtaskAck(state={SINK_STATE_KEY: snapshot})
        if self.coordinator.status_of(cid) == "pending":
            self.store.record_acks(cid, acks, self.epoch)  # durable first: see _write_source_step
        for sid, a in acks.items():
            self._on_coordinator(self.coordinator.acknowledge(cid, sid, a).effects)

    # coordinator effects ---------------------------------------------------------------------

    def _on_coordinator(self, effects) -> None:
        for e in effects:
            if isinstance(e, CheckpointCompleted):
                self._checkpoint("complete")
                c = e.checkpoint
                self.summary.completed.append(c.checkpoint_id)
                self.progress(
                    f"checkpoint {c.checkpoint_id} completed in {c.duration * 1000:.0f} ms "
                    f"(source version {c.acks[self.sources[0]].state['version']}, {self.summary.rows_in} rows read)"
                )
            elif isinstance(e, NotifyCheckpointComplete):
                if self.validate_checkpoints:
                    self._validate_before_commit(e.checkpoint_id)
                self._commit_up_to(e.checkpoint_id)
            elif isinstance(e, CheckpointAborted):
                try:
                    self.store.record_aborted(e.checkpoint_id, e.reason, e.message, self.epoch)
                except ValueError:  # the keyed stage (another process) completed it first: that wins
                    self.progress(f"checkpoint {e.checkpoint_id} completed elsewhere before it expired here")
                    continue
                self.summary.aborted.append((e.checkpoint_id, e.reason.value))
                if self.runs_keyed:
                    self._execute({r: h.on_checkpoint_aborted(e.checkpoint_id) for r, h in enumerate(self.handlers)})
                self.progress(f"checkpoint {e.checkpoint_id} aborted: {e.reason.value} {e.message}".rstrip())
            elif isinstance(e, DiscardCheckpoint):
                pass  # state versions stay until VACUUM; the store marks it discarded
            elif isinstance(e, FailJob):
                raise TooManyFailedCheckpointsError(
                    f"{e.consecutive_failures} consecutive checkpoints failed (last: {e.reason.value})"
                )

    def _validate_before_commit(self, cid: int) -> None:
        """The per-checkpoint GX suite on ``cid`` (durable, not committed yet), and its verdict
        recorded (:meth:`~checkpoint_lib.delta.store.DeltaCheckpointStore.record_validation`):
        nothing commits ``cid`` before it is validated - not this runner, the snapshot DAG's commit
        task or a recovery. A failure (or a validation that cannot run) discards ``cid`` and stops
        the run: its transactions never commit, the next start restores the last checkpoint that
        passed. A verdict that lost to another attempt's (it validated ``cid`` too) follows theirs."""
        from ..quality import validate_before_commit

        validate_before_commit(self.spark, self.pipeline.name, self.warehouse, self.store, cid, self.progress,
                               kill_point=self._checkpoint)

    def _commit_up_to(self, cid: int) -> None:
        """Checkpoint ``cid`` is complete: commit every sink's transactions up to it (one Delta
        commit per sink), then now and then clean up staged rows and consumed channel data."""
        self._checkpoint("commit")
        for name, sink in self.sinks.items():
            txns = [t for book in self.sink_books[name] for t in book.committable(cid)]
            if not txns:
                continue
            sink.commit(txns, cid, self.epoch)
            self._checkpoint("sink_commit")  # this sink committed, the next ones not yet
            for book in self.sink_books[name]:
                for t in book.committable(cid):
                    book.pending.pop(t.checkpoint_id, None)
            self.committed[name] += txns
        self.completions += 1
        self.last_completed = cid
        if self.completions % TRUNCATE_EVERY == 0:  # every DELETE is a Delta commit: batch them
            self._cleanup_due = True
        self._cleanup_if_due()

    def _cleanup_if_due(self) -> None:
        """Run the owed clean-up, unless an _execute is under way (it runs it when it ends)."""
        if self._cleanup_due and not self._executing:
            self._cleanup()

    def _cleanup(self) -> None:
        """Delete the staged rows of committed transactions and the channel data that is consumed
        for good: at or before the latest completed checkpoint's barriers, read by the keyed stage
        (the cursors), and not pointed at by anything still in memory - deliveries not flushed,
        channel state of a checkpoint still logging, records an aligning handler holds. Those are
        read from the log later (at the flush, at the ack, at the release), so what they need stays
        until a later clean-up. Idempotent. Never called inside _execute (see _cleanup_if_due)."""
        self._cleanup_due = False
        for name, sink in self.sinks.items():
            sink.discard(self.committed.pop(name, []))
        if self.last_completed is None:
            return
        source_in_use, feedback_in_use = self._lowest_unconsumed()
        upto = min(self.cursor, self._barrier_seq(self.last_completed), source_in_use - 1)
        truncation = (delta_log.latest_version(self.channel.path), upto)
        if truncation != self._truncated:  # the log moved, or more of it is consumed (chained: never)
            self.channel.truncate_upto(upto, self.epoch)
            self._truncated = (delta_log.latest_version(self.channel.path), upto)
        if self.feedback_log is not None:
            acks = self.store.get(self.last_completed).acks
            fb = [int(a.state["feedback_barrier_seq"]) for s, a in acks.items()
                  if s.operator == self.pipeline.operator_uid and "feedback_barrier_seq" in a.state]
            if len(fb) == self.P:
                self.feedback_log.truncate_upto(min(self.fcursor, *fb, feedback_in_use - 1), self.epoch)
        self.last_completed = None

    def _lowest_unconsumed(self) -> tuple[float, float]:
        """The lowest position of (the source channel log, the feedback log) that a segment held in
        memory still has to read (infinity: none). Feedback channels are numbered from S."""
        segments = [e for es in self.pending.values() for e in es]
        segments += [e for es in self.channel_state.values() for e in es]
        segments += [e for h in self.handlers for e in h.held_records]
        lowest = [float("inf"), float("inf")]
        for e in segments:
            log = 0 if e.sender < self.S else 1
            lowest[log] = min(lowest[log], e.seq)
        return lowest[0], lowest[1]

    def _barrier_seq(self, cid: int) -> int:
        return int(self.store.get(cid).acks[self.sources[0]].state["barrier_seq"])


@contextmanager
def _stop_on_signals(stop: Callable[[], None]):
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

"""Running a pipeline on Spark + Delta under the checkpoint core.

One :class:`PipelineRunner` drives one attempt (an epoch) of a pipeline:

1. **open**: begin a new epoch (fencing every older attempt), plan recovery from the latest
   completed checkpoint (or a chosen one) and carry it out: cut the channel log after the restored
   barrier, restore keyed state to the pinned versions, re-commit the sink transactions the
   checkpoint owns and abort every other open one, and resume the sources at their offsets. A run
   after a crash therefore recovers by itself; after a clean stop the same steps are no-ops.
2. **source steps**: the source subtasks read the next versions of the landing table (whole
   versions, about ``rows_per_checkpoint`` rows), send bad rows to the dead-letter table (a MERGE
   on the source offset: idempotent) and append good rows to the Delta channel log, hash-partitioned
   by key group to the keyed subtasks. When the coordinator triggers a checkpoint, the barrier goes
   into the same Delta commit, after the data, and the sources acknowledge with their offsets.
3. **keyed steps**: the keyed stage reads the channel index (metadata), feeds every channel's
   segments, barriers and ends to one barrier handler per keyed subtask, then carries the effects
   out in Spark: deliveries are applied in flushes (ledger and balances staged into each subtask's
   open sink transaction, state MERGEd), a snapshot pins the state version and pre-commits the
   subtask's sink transactions, in-flight segments are copied to the channel-state table.
4. **completion**: when every subtask acknowledged, the store makes the checkpoint durable and the
   sinks commit every pending transaction up to it (idempotent Delta commits).

Kill points: with ``CKPT_KILL_AT=phase:n`` the process SIGKILLs itself the n-th time it reaches
``phase`` (see :data:`KILL_PHASES`); the crash tests use it to hit every phase precisely.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

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
from ..core.decider import CheckpointConfig
from ..core.errors import CheckpointError, TooManyFailedCheckpointsError
from ..core.keygroups import range_for_subtask
from ..core.recovery import SINK_STATE_KEY, RecoveryPlan, plan_recovery
from ..core.twophase import SinkSnapshot, Transaction, TransactionIdPool, TwoPhaseCommitSink
from ..core.types import Barrier, BarrierMode, CheckpointKind, SubtaskAck, SubtaskId
from ..delta import log as delta_log
from ..delta.store import DeltaCheckpointStore
from ..pipeline import Pipeline
from . import tables
from .channels import BARRIER, DATA, END, ChannelEvent, DeltaChannelLog
from .sinks import DeltaTwoPhaseSink
from .state import KEY_GROUP, KeyedStateTable, key_group_column, subtask_column

KILL_PHASES = (
    "source_read", "dlq", "channel_write", "source_ack", "flush_stage", "flush_merge",
    "snapshot", "ack", "complete", "commit", "recover",
)
TRUNCATE_EVERY = 5
_ROW_BYTES = 64  # channel-state size estimate per row (the Delta files are compressed; rows are exact)
OFFSET_COLUMNS = (("src_version", "long"), ("src_file", "string"), ("src_row", "long"))


class SchemaMismatchError(ValueError):
    """The landing table's schema does not have the columns and types the pipeline needs."""


class SnapshotIncompatibleError(ValueError):
    """The checkpoint to restore does not fit the pipeline (operators or state changed)."""


@dataclass
class RunSummary:
    epoch: int
    restored: int | None
    completed: list[int] = field(default_factory=list)
    aborted: list[tuple[int, str]] = field(default_factory=list)
    rows_in: int = 0
    steps: int = 0
    seconds: float = 0.0


def _struct(columns) -> T.StructType:
    return T.StructType([T.StructField(n, T._parse_datatype_string(t), True) for n, t in columns])


class PipelineRunner:
    def __init__(
        self,
        pipeline: Pipeline,
        warehouse: str,
        spark: SparkSession,
        *,
        mode: BarrierMode | str = BarrierMode.ALIGNED,
        rows_per_checkpoint: int = 10_000,
        config: CheckpointConfig | None = None,
        clock: Clock | None = None,
        progress: Callable[[str], None] | None = None,
        restore_checkpoint: int | None = None,
        allow_non_restored_state: bool = False,
        alignment_timeout: float | None = None,
    ):
        self.pipeline = pipeline.validate()
        self.mode = BarrierMode(mode)
        if pipeline.feedback and self.mode is BarrierMode.ALIGNED:
            raise ValueError(
                f"pipeline {pipeline.name!r} has a feedback edge (a cycle): aligned checkpoints cannot "
                "align on it (its barrier comes only after the snapshot). Use --mode unaligned."
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
        self.allow_non_restored_state = allow_non_restored_state
        self._kill_at = _parse_kill(os.environ.get("CKPT_KILL_AT"))
        self._kill_counts: dict[str, int] = defaultdict(int)

        p = pipeline
        self.root = self._path(f"_checkpoints/{p.name}")
        self.store = DeltaCheckpointStore.open(self.root, retained=self.config.retained)
        self.S, self.P = p.source_parallelism, p.keyed_parallelism
        self.sources = [SubtaskId("source", i) for i in range(self.S)]
        self.keyed = [SubtaskId(p.operator_uid, i) for i in range(self.P)]
        self.sink_ids = {name: [SubtaskId(f"sink_{name}", i) for i in range(self.P)] for name in p.sinks}
        self.tasks = self.sources + self.keyed + [s for ids in self.sink_ids.values() for s in ids]

        src = p.source_spec
        self.source_path = self._path(src.path)
        self.payload = _struct(
            [(c, t) for c, t in src.schema.items()] + [(KEY_GROUP, "int"), *OFFSET_COLUMNS]
        )
        self.channel = DeltaChannelLog(spark, f"{self.root}/channels/source_{p.operator_uid}", self.payload)
        self.channel_state_path = f"{self.root}/channel_state"
        self.state = KeyedStateTable(spark, f"{self.root}/state/{p.operator_uid}", p.key, _struct(p.operator.state_schema))
        self.dlq_path = self._path(p.dlq_path)
        self.sinks = {
            name: DeltaTwoPhaseSink(
                spark, name, self._path(s.path), f"{self.root}/staging/{name}", _struct(s.schema),
                app_prefix=f"checkpoint_lib/{p.name}", mode=s.mode, keys=s.keys,
                check_epoch=self.store.check_epoch,
            )
            for name, s in p.sinks.items()
        }

    # helpers ---------------------------------------------------------------------------------

    def _path(self, relative: str) -> str:
        return f"{self.warehouse}/{relative}"

    def _checkpoint(self, phase: str) -> None:
        """A kill point: SIGKILL ourselves when CKPT_KILL_AT names this phase and hit count."""
        if self._kill_at is None:
            return
        self._kill_counts[phase] += 1
        if self._kill_at == (phase, self._kill_counts[phase]):
            os.kill(os.getpid(), signal.SIGKILL)

    def _fence(self) -> None:
        """Refuse to write once a newer attempt began (FencedError): checked before every
        data-plane write. What remains is the instant between this check and the write; a newer
        attempt's restore then wipes such a write (see docs/architecture.md)."""
        self.store.check_epoch(self.epoch)

    # opening and recovery --------------------------------------------------------------------

    def open(self) -> RecoveryPlan:
        """Begin a new epoch and restore the latest (or the chosen) completed checkpoint."""
        self.channel.create()
        self.state.create()
        for sink in self.sinks.values():
            sink.create()
        tables.create_if_missing(self.spark, self.dlq_path, _dlq_schema(self.pipeline))
        tables.create_if_missing(self.spark, self.channel_state_path, _channel_state_schema(self.payload))

        self.epoch = self.store.begin_epoch(f"{socket.gethostname()}:{os.getpid()}", "run")
        open_txns = [t for sink in self.sinks.values() for t in sink.open_transactions()]
        plan = plan_recovery(
            self.store.all(), current_epoch=self.epoch - 1, checkpoint_id=self.restore_checkpoint,
            open_transactions=open_txns,
        )
        if plan.rollback_after is not None:
            raise CheckpointError(
                f"checkpoint {plan.checkpoint_id} is older than the latest completed one: restoring it "
                "would need the sinks rolled back to what it committed, which this runtime does not do yet"
            )
        if plan.checkpoint is not None:
            self._check_compatible(plan)
        self._checkpoint("recover")
        self._restore(plan)
        self.coordinator = CheckpointCoordinator(
            self.config, self.tasks, self.sources, self.store, self.store, self.clock
        )
        self.coordinator.all_running()
        return plan

    def _check_compatible(self, plan: RecoveryPlan) -> None:
        """Operators and parallelism of the snapshot must match the pipeline (by stable uid)."""
        assert plan.checkpoint is not None
        have = Counter(s.operator for s in plan.checkpoint.acks)
        want = Counter(s.operator for s in self.tasks)
        problems = []
        for op, n in sorted(want.items()):
            if op not in have:
                problems.append(f"operator {op!r} is not in the snapshot (new operator: starts empty)")
            elif have[op] != n:
                problems.append(f"operator {op!r} has parallelism {have[op]} in the snapshot, {n} now")
        removed = sorted(set(have) - set(want))
        if removed and not self.allow_non_restored_state:
            problems.append(
                f"the snapshot holds state of removed operators {removed}: pass --allow-non-restored-state to drop it"
            )
        fatal = [p for p in problems if "new operator" not in p]
        if fatal:
            raise SnapshotIncompatibleError(
                f"checkpoint {plan.checkpoint_id} does not fit pipeline {self.pipeline.name!r}:\n  - "
                + "\n  - ".join(problems)
            )

    def _restore(self, plan: RecoveryPlan) -> None:
        acks = plan.checkpoint.acks if plan.checkpoint else {}
        source_state = acks[self.sources[0]].state if plan.checkpoint else {}
        self.offset = int(source_state.get("version", -1))
        self.next_seq = int(source_state.get("next_seq", 0))
        self.cursor = self.next_seq - 1
        # Everything the old attempt wrote after the cut is rewritten by this one.
        self.channel.truncate_after(self.cursor)
        if plan.checkpoint and all(s in acks for s in self.keyed):
            self.state.restore([acks[s].state for s in self.keyed])
        else:  # nothing to restore, or a new operator (uid not in the snapshot): it starts empty
            tables.delete_where(self.spark, self.state.path, F.lit(True))
        # Sinks: re-commit what the checkpoint owns (a no-op for what was committed), then
        # discard the staged rows of everything else and of what is now committed.
        for name, sink in self.sinks.items():
            owned = [t for sid in self.sink_ids[name] if sid in plan.sinks for t in plan.sinks[sid].recommit]
            if owned:
                sink.commit(owned, int(plan.checkpoint_id), self.epoch)
            sink.discard([*owned, *plan.abort])
        # Bookkeeping resumes in the new epoch.
        self.sink_books: dict[str, list[TwoPhaseCommitSink]] = {}
        for name in self.sinks:
            books = []
            for i, sid in enumerate(self.sink_ids[name]):
                pool = TransactionIdPool(f"{self.pipeline.name}.{name}", i, size=max(4, self.config.max_concurrent + 3))
                if plan.checkpoint and sid in acks:
                    snap = SinkSnapshot.from_dict(acks[sid].state[SINK_STATE_KEY])
                    books.append(TwoPhaseCommitSink.restored(snap, pool, self.epoch))
                else:
                    books.append(TwoPhaseCommitSink(pool, self.epoch))
            self.sink_books[name] = books
        self.handlers = [
            create_handler(self.S, self.mode, self.clock, alignment_timeout=self.alignment_timeout)
            for _ in range(self.P)
        ]
        self.pending: dict[int, list[ChannelEvent]] = defaultdict(list)
        self.channel_state: dict[tuple[int, int], list[ChannelEvent]] = defaultdict(list)
        self.flushes = 0
        self.completions = 0
        self.committed: dict[str, list[Transaction]] = defaultdict(list)
        self._table_bytes: tuple[int, int] | None = None
        self.state_version = self.state.version()
        self.snapshots: dict[tuple[int, int], dict[str, Any]] = {}
        self.schema_checked_at = -1
        self.summary = RunSummary(self.epoch, plan.checkpoint_id)
        if plan.checkpoint:
            self._replay_channel_state(plan)
            self.progress(f"restored checkpoint {plan.checkpoint_id} as epoch {self.epoch}")
        else:
            self.progress(f"no completed checkpoint: starting from scratch as epoch {self.epoch}")

    # the run loop ----------------------------------------------------------------------------

    def run(self, until_caught_up: bool = True, max_steps: int | None = None, final_checkpoint: bool = True) -> RunSummary:
        started = time.monotonic()
        self.open()
        steps = 0
        while max_steps is None or steps < max_steps:
            steps += 1
            moved = self.source_step()
            self.keyed_step()
            if not moved and until_caught_up:
                break
        if final_checkpoint:
            self.final_checkpoint()
        self.summary.steps = steps
        self.summary.seconds = time.monotonic() - started
        return self.summary

    def final_checkpoint(self, kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> int:
        """Take a checkpoint now (every record read so far is in it) and wait for it to commit."""
        trigger = self.coordinator.trigger(kind)
        self._write_source_step(None, [], trigger)
        self.keyed_step()
        status = self.coordinator.status_of(trigger.checkpoint_id)
        if status != "completed":
            raise CheckpointError(f"final {kind.value} {trigger.checkpoint_id} did not complete: {status}")
        return trigger.checkpoint_id

    # sources ---------------------------------------------------------------------------------

    def source_step(self) -> bool:
        """Read the next versions of the landing table into the channel log. False: nothing new."""
        latest = delta_log.latest_version(self.source_path)
        if latest is None:
            raise FileNotFoundError(
                f"no landing table at {self.source_path}: generate data first (ckpt generate {self.pipeline.name})"
            )
        if latest <= self.offset:
            self._on_coordinator(self.coordinator.expire())  # no barrier without a source step
            return False
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
        self._write_source_step(end_version, step, triggers[0] if triggers else None)
        return True

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

    def _write_source_step(self, end_version: int | None, step: list, trigger: TriggerCheckpoint | None) -> None:
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
        if data is not None or barrier is not None:
            self._checkpoint("channel_write")
            self._fence()
            self.channel.append(data, seq, list(range(self.S)), list(range(self.P)), barrier, epoch=self.epoch)
        if end_version is not None:
            self.offset = end_version
        self.next_seq = seq + 2
        if trigger is not None:
            self._checkpoint("source_ack")
            for sid in self.sources:
                ack = SubtaskAck(state={"version": self.offset, "next_seq": self.next_seq, "barrier_seq": seq + 1})
                self._on_coordinator(self.coordinator.acknowledge(trigger.checkpoint_id, sid, ack).effects)

    def _read_step(self, step: list, end_version: int) -> DataFrame:
        """The step's good rows with sender, receiver and offsets; bad rows go to the DLQ.

        The step's files are known exactly from the Delta log, and the landing table is
        append-only without deletion vectors or column mapping (checked with the schema), so its
        Parquet files are read directly: that gives each row its offset (file, row index)."""
        from urllib.parse import unquote

        p = self.pipeline
        paths = [f"{self.source_path}/{unquote(f.path)}" for f in step]
        names = [(os.path.basename(unquote(f.path)), f.version, i % self.S) for i, f in enumerate(step)]
        files = self.spark.createDataFrame(names, "src_base string, src_version long, sender int")
        schema = _struct(list(p.source_spec.schema.items()))
        df = (
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
        validate = p.source_spec.validate
        if validate is not None:
            df = df.withColumn("_error", validate(df))
            bad = df.where(F.col("_error").isNotNull())
            self._checkpoint("dlq")
            self._write_dlq(bad, end_version)
            df = df.where(F.col("_error").isNull()).drop("_error")
        return (
            df.withColumn(KEY_GROUP, key_group_column(p.key, p.max_parallelism))
            .withColumn("receiver", subtask_column(F.col(KEY_GROUP), self.P, p.max_parallelism))
            .select("sender", "receiver", *self.payload.fieldNames())
        )

    def _write_dlq(self, bad: DataFrame, end_version: int) -> None:
        """Append the step's bad rows, idempotently: stamped ``(dlq app id, end_version)``, and
        only rows of versions above the stamp (a re-read after recovery adds nothing twice,
        whatever the step boundaries are now)."""
        from deltalake import DeltaTable

        app = f"checkpoint_lib/{self.pipeline.name}/dlq"
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

    def keyed_step(self) -> None:
        """Consume everything the channel log holds beyond the cursor."""
        events = self.channel.index(self.epoch, after=self.cursor)
        if not events:
            return
        effects: dict[int, list] = {r: [] for r in range(self.P)}
        for e in events:  # position order; at one position, every channel in sender order
            h = self.handlers[e.receiver]
            if e.kind == DATA:
                effects[e.receiver] += h.on_record(e.sender, e)
            elif e.kind == BARRIER:
                barrier = Barrier(int(e.checkpoint_id), float(e.barrier_ts or 0.0))
                effects[e.receiver] += h.on_barrier(e.sender, barrier)
            elif e.kind == END:
                effects[e.receiver] += h.on_end_of_channel(e.sender)
        self.cursor = max(e.seq for e in events)
        self._execute(effects)

    def _execute(self, effects: dict[int, list]) -> None:
        """Carry out the handlers' effects in order per subtask, batching Spark work: deliveries
        up to the next snapshot of every subtask are applied in one flush."""
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

    def _effect(self, r: int, e: Any) -> None:
        if isinstance(e, Deliver):
            self.pending[r].append(e.record)
        elif isinstance(e, LogChannelState):
            self.channel_state[(e.checkpoint_id, r)].append(e.record)
        elif isinstance(e, (ForwardBarrier, ChannelStateComplete)):
            pass  # the keyed stage's sinks are fused: no downstream channel to forward to
        elif isinstance(e, CheckpointDone):
            self._ack_keyed(r, e.checkpoint_id)
        elif isinstance(e, DeclineCheckpoint):
            self._on_coordinator(self.coordinator.decline(e.checkpoint_id, self.keyed[r], e.reason))

    def _flush(self) -> None:
        """Apply every pending delivery: stage sink rows into the open transactions, MERGE state."""
        segments = [e for es in self.pending.values() for e in es]
        if not segments:
            return
        self._apply(self.channel.read(segments, self.epoch), sorted(self.pending))
        self.pending.clear()

    def _apply(self, records: DataFrame, receivers: list[int]) -> None:
        """Run the keyed operator on ``records`` (of ``receivers``) against the current state."""
        self.flushes += 1
        p = self.pipeline
        records = records.withColumn("sink_subtask", F.col("receiver"))
        state_before = self.state.read(self.state_version)
        deltas, outputs = p.operator.apply(records, state_before, p.key)
        self._checkpoint("flush_stage")
        self._fence()
        for name, sink in self.sinks.items():
            handles = {r: self.sink_books[name][r].current for r in receivers}
            sink.stage(outputs[name], handles, self.flushes)
        self._checkpoint("flush_merge")
        self._fence()
        self.state_version = self.state.add(deltas)

    def _write_channel_state(self, cid: int, r: int) -> tuple[int, int]:
        """Copy the in-flight segments logged for (checkpoint, subtask) into the channel-state
        table (a Spark job); returns (rows, bytes estimate)."""
        segments = self.channel_state.pop((cid, r), [])
        if not segments:
            return 0, 0
        rows = sum(e.rows for e in segments)
        df = self.channel.read(segments, self.epoch).withColumn("checkpoint_id", F.lit(cid).cast("long"))
        schema = _channel_state_schema(self.payload)
        df.select(*schema.fieldNames()).write.format("delta").mode("append").save(self.channel_state_path)
        return rows, rows * _ROW_BYTES

    def _replay_channel_state(self, plan: RecoveryPlan) -> None:
        """Restore = state, then the logged channel state, then the channels (BRIEF.md)."""
        receivers = [r for r, sid in enumerate(self.keyed) if sid in plan.replay_channel_state]
        if not receivers:
            return
        df = (
            self.spark.read.format("delta").load(self.channel_state_path)
            .where((F.col("checkpoint_id") == plan.checkpoint_id) & F.col("receiver").isin(receivers))
        )
        self._apply(df.drop("checkpoint_id"), receivers)
        self.progress(f"replayed the channel state of checkpoint {plan.checkpoint_id} for subtasks {receivers}")

    def _snapshot(self, r: int, e: TakeSnapshot) -> None:
        self._checkpoint("snapshot")
        cid = e.checkpoint_id
        kg = range_for_subtask(r, self.P, self.pipeline.max_parallelism)
        state = {"table_version": self.state_version, "key_groups": kg.to_list(), "cursor": self.cursor}
        sinks = {name: self.sink_books[name][r].pre_commit(cid).snapshot.to_dict() for name in self.sinks}
        self.snapshots[(cid, r)] = {
            "state": state, "sinks": sinks, "unaligned": e.unaligned, "alignment_ms": e.alignment_s * 1000,
            "started": time.monotonic(), "state_bytes": self._state_bytes(kg),
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
        duration = (time.monotonic() - snap["started"]) * 1000
        ack = SubtaskAck(state=snap["state"], alignment_ms=snap["alignment_ms"], unaligned=snap["unaligned"],
                         duration_ms=duration, channel_state_rows=cs_rows, channel_state_bytes=cs_bytes,
                         state_size_bytes=snap["state_bytes"])
        self._on_coordinator(self.coordinator.acknowledge(cid, self.keyed[r], ack).effects)
        for name, snapshot in snap["sinks"].items():
            sink_ack = SubtaskAck(state={SINK_STATE_KEY: snapshot})
            self._on_coordinator(self.coordinator.acknowledge(cid, self.sink_ids[name][r], sink_ack).effects)

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
                self._commit_up_to(e.checkpoint_id)
            elif isinstance(e, CheckpointAborted):
                self.store.record_aborted(e.checkpoint_id, e.reason, e.message, self.epoch)
                self.summary.aborted.append((e.checkpoint_id, e.reason.value))
                for r, h in enumerate(self.handlers):
                    self._execute({**{i: [] for i in range(self.P)}, r: h.on_checkpoint_aborted(e.checkpoint_id)})
                self.progress(f"checkpoint {e.checkpoint_id} aborted: {e.reason.value} {e.message}".rstrip())
            elif isinstance(e, DiscardCheckpoint):
                pass  # state versions stay until VACUUM; the store marks it discarded
            elif isinstance(e, FailJob):
                raise TooManyFailedCheckpointsError(
                    f"{e.consecutive_failures} consecutive checkpoints failed (last: {e.reason.value})"
                )

    def _commit_up_to(self, cid: int) -> None:
        """Checkpoint ``cid`` is complete: commit every sink's transactions up to it (one Delta
        commit per sink), then now and then clean up staged rows and consumed channel data."""
        self._checkpoint("commit")
        for name, sink in self.sinks.items():
            txns = [t for book in self.sink_books[name] for t in book.committable(cid)]
            if not txns:
                continue
            sink.commit(txns, cid, self.epoch)
            for book in self.sink_books[name]:
                for t in book.committable(cid):
                    book.pending.pop(t.checkpoint_id, None)
            self.committed[name] += txns
        self.completions += 1
        if self.completions % TRUNCATE_EVERY == 0:  # every DELETE is a Delta commit: batch them
            for name, sink in self.sinks.items():
                sink.discard(self.committed.pop(name, []))
            # Channel data at or before the latest completed barrier is never needed again.
            self.channel.truncate_upto(min(self.cursor, self._barrier_seq(cid)))

    def _barrier_seq(self, cid: int) -> int:
        return int(self.store.get(cid).acks[self.sources[0]].state["barrier_seq"])


def _dlq_schema(p: Pipeline) -> T.StructType:
    return T.StructType(
        [T.StructField(c, T.StringType(), True) for c in p.source_spec.schema]
        + [
            T.StructField("error", T.StringType(), False),
            T.StructField("src_version", T.LongType(), False),
            T.StructField("src_file", T.StringType(), False),
            T.StructField("src_row", T.LongType(), False),
            T.StructField("epoch", T.LongType(), False),
        ]
    )


def _channel_state_schema(payload: T.StructType) -> T.StructType:
    return T.StructType(
        [
            T.StructField("checkpoint_id", T.LongType(), False),
            T.StructField("receiver", T.IntegerType(), False),
            T.StructField("sender", T.IntegerType(), False),
            T.StructField("seq", T.LongType(), False),
        ]
        + list(payload.fields)
    )


def _parse_kill(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    phase, _, n = value.partition(":")
    if phase not in KILL_PHASES:
        raise ValueError(f"CKPT_KILL_AT phase must be one of {', '.join(KILL_PHASES)}, got {phase!r}")
    return phase, int(n or 1)

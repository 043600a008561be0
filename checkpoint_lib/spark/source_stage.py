"""The source stage of a process: the source, read step by step, to the keyed operator.

A step reads the next whole versions of the source (about ``rows_per_step`` rows, planned from its
log by its reader: :mod:`checkpoint_lib.spark.sources`, the one place that knows a kind of
source), sends the bad rows to the
dead-letter table (a stamped append: idempotent), applies the pipeline's ``map()`` steps and routes
the records to the operator's subtasks by its partitioner. Then, **chained** (both stages in this
process, nothing lagging, no cycle), the records go to the keyed operator in the same Spark plan
and the step's barrier reaches every subtask at once; otherwise they are appended to the Delta
channel log with the barrier after them in the same commit. When the coordinator triggers a
checkpoint, the sources acknowledge with their offsets before the barrier goes out.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..checkpoint_requests import CheckpointRequests, next_trigger
from ..core.acks import EVENT_TIME_REFERENCE, SourceAckState, SourcePosition
from ..core.coordinator import TriggerCheckpoint
from ..core.types import CheckpointStatus, SubtaskAck
from ..reserved import ERROR_COLUMN, OFFSET_COLUMNS
from .channels import BARRIER, DATA
from .context import RunContext
from .partitioning import route
from .sources import SourceFilesLostError, SourceSite, bootstrap_records, source_reader

class SourceStage:
    def __init__(self, ctx: RunContext, *, rows_per_step: int, lagging: list[int], runs_keyed: bool,
                 keyed: Any | None, on_effects: Callable[[Any], None]):
        self.ctx = ctx
        self.t = ctx.topology
        self.rows_per_checkpoint = rows_per_step
        # The last subtasks are slow: each step's records and barrier reach the channel one step
        # after the others' (see _write_source_step).
        self.lagging = lagging
        self.runs_keyed = runs_keyed  # the keyed stage runs in this process (it completes checkpoints)
        self.keyed = keyed  # chained: the keyed stage the records go to directly (None: the channel log)
        self.on_effects = on_effects
        self.reset()

    def reset(self) -> None:
        """A new process: positions unknown until restored or resumed, the source's log not parsed yet."""
        self.offset, self.next_seq = -1, 0
        self.time_reference: float | None = None  # StateTtl.max_ahead: the newest step median event time (s)
        ctx, spec = self.ctx, self.ctx.pipeline.source_spec
        self.source = source_reader(spec, SourceSite(ctx.spark, self.t.path(spec.path), self.t.root,
                                                     ctx.pipeline.name, ctx.progress))
        # a lagging source subtask's records and barrier of the last step, not in the channel yet
        self._deferred: tuple[DataFrame | None, tuple[int, float] | None] | None = None

    def point(self, parallelism: dict[str, int]) -> dict[str, Any]:
        return {"offset": self.offset, "next_seq": self.next_seq, "parallelism": parallelism,
                EVENT_TIME_REFERENCE: self.time_reference}

    def resume(self, point: dict[str, Any]) -> None:
        self.offset, self.next_seq = int(point["offset"]), int(point["next_seq"])
        self.time_reference = point.get(EVENT_TIME_REFERENCE)

    def restore(self, position: SourcePosition) -> None:
        """Go on from where a recovery put the source: a restored checkpoint's offset and channel
        position (:attr:`SourceAckState.position`), or the start (``SourcePosition()``)."""
        self.offset, self.next_seq, self.time_reference = position.offset, position.next_seq, position.time_reference

    def catch_up(self) -> None:
        """Before the process ends: a lagging subtask's last step reaches the channel."""
        if self._deferred is not None:
            self._write_source_step(None, [], None)

    def sync_pending(self) -> None:
        """Forget pending checkpoints another process (the keyed stage) completed or aborted."""
        if self.runs_keyed or not self.ctx.coordinator.pending:
            return
        for row in self.ctx.store.checkpoints.history():
            cid = row["checkpoint_id"]
            if cid in self.ctx.coordinator.pending and row["status"] != CheckpointStatus.PENDING:
                status = (CheckpointStatus.ABORTED if row["status"] == CheckpointStatus.ABORTED
                          else CheckpointStatus.COMPLETED)
                self.ctx.coordinator.finished_elsewhere(cid, status, row["completion_time"] or row["recorded_at"])

    def backlog_rows(self) -> int:
        """The rows landed (or registered, for a folder) beyond the offset: what is left to read.
        Control plane only: the log's (or manifest's) row counts, no data read."""
        latest = self.source.latest()
        return 0 if latest is None else self.source.pending_rows(self.offset, latest)

    def step(self) -> bool:
        """Read the next versions of the source and send them downstream (chained into the
        operator, or into the channel log). False: nothing new."""
        self.sync_pending()
        if self.source.writes_on_discover:
            self.ctx.fence()
        latest = self.source.discover()
        if latest is None or latest <= self.offset:
            # no barrier without a source step, unless someone asked for a checkpoint
            requested = self._trigger(moved=False)
            if requested is None and self._deferred is None:
                return False
            self.send(None, [], requested)
            return True
        step = self.source.next_step(self.offset, latest, self.rows_per_checkpoint)
        end_version = max((f.version for f in step), default=latest) if step else latest
        trigger = self._trigger(moved=True)
        try:
            self.send(end_version, step, trigger)
        except Exception as exc:
            gone = self.source.missing(step) if step else []
            if gone:
                raise self._lost(step, gone) from exc
            raise
        return True

    def _lost(self, step: list, gone: list[str]) -> SourceFilesLostError:
        versions = sorted({f.version for f in step})
        name = self.ctx.pipeline.name
        return SourceFilesLostError(
            f"pipeline {name!r}: source versions {versions[0]}..{versions[-1]} (read next, after version "
            f"{self.offset}) reference {len(gone)} files that are gone (e.g. {gone[0]}): the source was VACUUMed "
            "after an OPTIMIZE or a rewrite while the pipeline lagged behind it. Nothing of this step was committed. "
            f"Restore a checkpoint taken after version {versions[-1]} (ckpt checkpoints list {name}; ckpt recover "
            f"{name} --checkpoint N), or append those rows to the source again and restore one after them."
        )

    def _trigger(self, moved: bool) -> TriggerCheckpoint | None:
        """This step's barrier, if any (a periodic checkpoint, or one answering "checkpoint now"
        requests: :func:`~checkpoint_lib.checkpoint_requests.next_trigger`); the coordinator's
        other effects are carried out."""
        effects, trigger = next_trigger(CheckpointRequests(self.t.root), self.ctx.coordinator, moved=moved,
                                        epoch=self.ctx.epoch, fence=self.ctx.fence, progress=self.ctx.progress)
        self.on_effects(effects)
        return trigger

    def send(self, end_version: int | None, step: list, trigger: TriggerCheckpoint | None) -> None:
        """Send one source step (the landing files ``step``, up to ``end_version``; then the barrier
        of ``trigger``) downstream: chained into the operator, or through the channel log."""
        if self.keyed is not None:
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
            self.ctx.store.checkpoints.record_pending(trigger.checkpoint_id, trigger.barrier.kind, trigger.barrier.timestamp, self.ctx.epoch)
        if step:
            self.ctx.reached("source_read")
            data = self._read_step(step, end_version)
            self.ctx.summary.rows_in += sum(max(f.rows, 0) for f in step)
            self.keyed.apply(data, list(range(self.t.P)))
        if end_version is not None:
            self.offset = end_version
        if trigger is None:
            return
        cid, last = trigger.checkpoint_id, self.next_seq - 1
        state = SourceAckState(version=self.offset, next_seq=self.next_seq, barrier_seq=last,
                               barrier_seqs={s: last for s in range(self.t.S)}, event_time_reference=self.time_reference)
        acks = {sid: SubtaskAck(state=state.to_state()) for sid in self.t.sources}
        self.ctx.reached("source_ack")
        self.ctx.store.acks.record(cid, acks, self.ctx.epoch)
        for sid, ack in acks.items():
            self.on_effects(self.ctx.coordinator.acknowledge(cid, sid, ack).effects)
        if self.ctx.coordinator.status_of(cid) != CheckpointStatus.PENDING:
            return  # declined or aborted meanwhile
        self.keyed.barrier_on_every_channel(trigger.barrier)

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
            self.ctx.store.checkpoints.record_pending(trigger.checkpoint_id, trigger.barrier.kind, trigger.barrier.timestamp, self.ctx.epoch)
        data = None
        if step:
            self.ctx.reached("source_read")
            data = self._read_step(step, end_version)
            rows = sum(max(f.rows, 0) for f in step)
            self.ctx.summary.rows_in += rows
        barrier = (trigger.checkpoint_id, trigger.barrier.timestamp) if trigger else None
        senders = list(range(self.t.S))
        parts: list[tuple] = []
        defer = False
        if not self.lagging:
            if data is not None:
                parts.append((DATA, seq, data))
            barrier_at = {s: seq + 1 for s in senders}
            next_seq = seq + 2
        else:
            lag = F.col("sender").isin(self.lagging)
            defer = bool({i % self.t.S for i in range(len(step))} & set(self.lagging))
            if data is not None:
                parts.append((DATA, seq, data.where(~lag) if defer else data))
            if self._deferred is not None:
                old_data, old_barrier = self._deferred
                if old_data is not None:
                    parts.append((DATA, seq + 1, old_data))
                if old_barrier is not None:
                    parts.append((BARRIER, seq + 2, old_barrier, self.lagging, list(range(self.t.P))))
            next_seq = seq + 4
            barrier_at = {s: (next_seq + 2 if defer and s in self.lagging else seq + 3) for s in senders}
        if barrier is not None:
            now = [s for s in senders if barrier_at[s] < next_seq]
            parts.append((BARRIER, barrier_at[now[0]], barrier, now, list(range(self.t.P))))
        acks = {}
        if trigger is not None:
            # Durable before the barrier is in the channel: a keyed stage in another process that
            # sees the barrier finds the sources' acks, and completes the checkpoint. ``next_seq``
            # is where a restore resumes: past every channel's barrier of this checkpoint.
            last = max(barrier_at.values())
            state = SourceAckState(version=self.offset if end_version is None else end_version,
                                   next_seq=last + 1, barrier_seq=last, barrier_seqs=dict(barrier_at),
                                   event_time_reference=self.time_reference)
            acks = {sid: SubtaskAck(state=state.to_state()) for sid in self.t.sources}
            self.ctx.reached("source_ack")
            self.ctx.store.acks.record(trigger.checkpoint_id, acks, self.ctx.epoch)
        if parts:
            self.ctx.reached("channel_write")
            self.ctx.fence()
            self.t.channel.write(parts, epoch=self.ctx.epoch)
        self.ctx.uncache()
        if self.lagging:
            self._deferred = (data.where(lag), barrier) if defer else None
        if end_version is not None:
            self.offset = end_version
        self.next_seq = next_seq
        for sid, ack in acks.items():
            self.on_effects(self.ctx.coordinator.acknowledge(trigger.checkpoint_id, sid, ack).effects)

    def _read_step(self, step: list, end_version: int) -> DataFrame:
        """The step's good rows with sender, receiver and offsets; bad rows (unparsable, of the
        wrong type, without the key they are keyed by, or refused by the source's ``validate``) go
        to the dead-letter table."""
        p = self.ctx.pipeline
        df = self.source.read(step, self.t.S)  # parse errors are in ERROR_COLUMN already
        validate = getattr(p.source_spec, "validate", None)
        if validate is not None:
            df = df.withColumn(ERROR_COLUMN, F.coalesce(F.col(ERROR_COLUMN), validate(df)))
        # a record without its key has no key group, no subtask and no state row: a dead letter
        key_check = p.key is not None and p.key in p.source_spec.schema
        if key_check:
            df = df.withColumn(ERROR_COLUMN, F.coalesce(
                F.col(ERROR_COLUMN), F.when(F.col(p.key).isNull(), F.lit(f"null key {p.key}"))))
        df, bounded = self._bound_event_time(df)
        if validate is not None or key_check or bounded or self.source.caches_step:
            # Parsed text is read once, used twice (dead letters, then the channel), unpersisted
            # after the step. Parquet is read twice instead: a vectorized scan of the step's files
            # costs less than building the cache (a 1M-row step's dead letters: 2.1 s against 4.7 s).
            if self.source.caches_step:
                df = self.ctx.cached(df)
            bad = df.where(F.col(ERROR_COLUMN).isNotNull())
            self.ctx.reached("dlq")
            self._write_dlq(bad, end_version)
            df = df.where(F.col(ERROR_COLUMN).isNull())
        df = df.drop(ERROR_COLUMN)
        for fn, _schema in p.transforms:  # fused row-wise maps (forward: no channel between them)
            df = fn(df)
        if self.offset == -1 and p.bootstrap_spec is not None:  # starting from scratch
            records = [*p.record_schema, "sender", *OFFSET_COLUMNS]
            df = self._read_bootstrap().select(*records).unionByName(df.select(*records))
        df = route(df, p.partitioning, self.t.P, key=p.key, max_parallelism=p.max_parallelism)
        return df.select("sender", "receiver", *self.t.payload.fieldNames())

    def _bound_event_time(self, df: DataFrame) -> tuple[DataFrame, bool]:
        """With a ``StateTtl.max_ahead``: rows whose event time is more than that after the
        reference (the newest step median so far, this step's included: one Spark job) are bad, so
        one timestamp far in the future never reaches the TTL's clean-up. The reference is part of
        the sources' acks: a replay after a restore decides exactly as the first attempt did."""
        ttl = self.ctx.pipeline.state_ttl
        if ttl is None or ttl.max_ahead is None:
            return df, False
        seconds = F.col(ttl.time_column).cast("double")
        median = df.where(F.col(ERROR_COLUMN).isNull()).select(F.median(seconds)).first()[0]
        if median is None:
            return df, False
        reference = median if self.time_reference is None else max(self.time_reference, median)
        self.time_reference = reference
        limit = reference + ttl.max_ahead.total_seconds()
        why = (f" is more than {ttl.max_ahead} after the reference event time "
               f"{datetime.fromtimestamp(reference, timezone.utc):%Y-%m-%d %H:%M:%S} UTC (StateTtl.max_ahead)")
        reason = F.concat(F.lit(f"{ttl.time_column} "), F.col(ttl.time_column).cast("string"), F.lit(why))
        return df.withColumn(ERROR_COLUMN, F.coalesce(F.col(ERROR_COLUMN), F.when(seconds > limit, reason))), True

    def _read_bootstrap(self) -> DataFrame:
        """The bootstrap table's records (its latest version), before the source's first records."""
        return bootstrap_records(self.ctx.spark, self.t.path(self.ctx.pipeline.bootstrap_spec.path),
                                 self.ctx.pipeline.bootstrap_spec, f"pipeline {self.ctx.pipeline.name!r}",
                                 self.ctx.progress)

    def _write_dlq(self, bad: DataFrame, end_version: int) -> None:
        """Append the step's bad rows, idempotently (:meth:`DeadLetterTable.append`)."""
        self.t.dead_letters.append(bad, end_version, self.ctx.epoch)

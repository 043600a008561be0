"""The computed views the suites validate: Spark DataFrames joining a checkpoint's promises with
what the tables hold. The driver reads metadata (the checkpoint store's acks, Delta logs) and builds
plans; each view is computed by Spark once (:meth:`Context.materialize`). A view whose inputs are
small enough for the driver (:data:`DRIVER_ROWS`) is then collected as a pandas DataFrame, which GX
validates with its pandas engine (no Spark job per expectation); a larger one is kept on the
executors and validated by GX on Spark.

Every Delta table a command reads is loaded once per (table, version) and shared by every view and
suite of that command (:class:`Tables`): resolving a Delta snapshot in Spark costs seconds of jobs on
a cold JVM, more than a small table's data, so a table of at most :data:`DRIVER_ROWS` rows is read by
delta-rs (deletion vectors applied) and handed to Spark as Arrow; one that delta-rs refuses is read
by Spark.

Every view has *standard* column names, so the JSON suites in ``expectations/`` apply to any
pipeline with a :class:`~checkpoint_lib.quality.spec.QualitySpec`.

After a restore (suite ``after_restore``), at checkpoint *c* with source offset *v* (the landing
table version its sources acknowledged):

=================  ==============================================================================
``event_sink``     the event sink as *c* committed it (Delta time travel to the version before the
                   first commit stamped above *c*)
``events``         one row per event id in the records up to *v* (the valid source rows through the
                   pipeline's ``map()`` steps: what the operator saw) or in the event sink:
                   ``source_copies``, ``sink_copies``, ``values_match`` (exactly once: both 1)
``keys``           one row per key: ``in_source/in_sink/in_state`` and ``sink_matches_source`` /
                   ``state_matches_source`` (the key sink and the snapshot's state plus its channel
                   state agree with the aggregates recomputed from the source)
``totals``         one row: ``source_rows``, ``valid_rows``, ``bad_rows``, ``record_rows`` (the valid
                   rows through the maps), ``dead_letters``, ``repeats``, ``distinct_dead_letters``,
                   ``sink_rows`` (nothing lost: valid + dead = source, sink = records; the event
                   sink counts with what was in flight at the checkpoint)
``restored_state`` one row per key of the state table right after the latest restore, or of the
                   snapshot it restored (plus the channel state it replayed): ``in_restored``,
                   ``in_snapshot``, ``values_equal``
=================  ==============================================================================

Per completed checkpoint (suite ``per_checkpoint``):

=================  ==============================================================================
``subtasks``       one row per subtask the checkpoint's parallelism implies: ``acked``,
                   ``sizes_recorded``, ``key_groups_ok`` (keyed subtask i owns exactly its key-group
                   range), ``channel_state_rows_recorded`` vs ``channel_state_rows_found``
``channel_state``  one row per logged in-flight segment: ``seq`` and the checkpoint's ``barrier_seq``
                   (consistent cut: every logged record precedes the barrier on its channel, n >= m)
``conservation``   one row per additive aggregate: ``state_total + channel_state_total = source_total``
=================  ==============================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..core.acks import KeyedAckState, PinnedState, SourceAckState
from ..core.types import CheckpointStatus, sink_operator
from ..delta import log as delta_log
from ..delta.sessions import RESTORED
from ..delta.store import DeltaCheckpointStore
from ..files import files_at
from ..layout import checkpoint_root, control_table, state_table
from ..pipeline import DeltaSource, sink_target
from ..reserved import ERROR_COLUMN, KEY_GROUP, OFFSET_COLUMNS, OFFSET_FIELDS, SENDER
from ..delta.ttl_marks import marks_at
from ..spark.state import live, without_cleaned
from ..spark.tables import struct_type
from .context import Context
from .result import QualityCheckError

EVENT_SINK_VIEW = "event_sink"
"""The view of the pipeline's event sink (``QualitySpec.event_sink``) as the checkpoint committed it."""


@dataclass
class CheckpointFacts:
    """Driver-side metadata of one completed checkpoint (small: read from the store)."""

    checkpoint_id: int
    epoch: int
    acks: list[dict[str, Any]]
    source_version: int
    barrier_seq: int | None
    # each source subtask's barrier position (senders may differ: lagging source subtasks)
    barrier_seqs: dict[int, int] | None = None

    def keyed_acks(self, operator_uid: str) -> list[dict[str, Any]]:
        return [a for a in self.acks if a["operator"] == operator_uid]


@dataclass
class RestoreFacts:
    """The latest restore: the epoch that finished it, what it restored, when."""

    epoch: int
    checkpoint_id: int | None
    recorded_at: float


# --- metadata ---------------------------------------------------------------------------------


def open_store(warehouse: Path, pipeline_name: str) -> DeltaCheckpointStore:
    root = checkpoint_root(warehouse, pipeline_name)
    if not files_at(root).is_dir(control_table(root, "checkpoints")):
        raise QualityCheckError(f"pipeline {pipeline_name!r} has no checkpoint store in {warehouse} (run it first)")
    return DeltaCheckpointStore(root)  # a reader: no retention of its own, creates nothing


def _completed(ctx: Context, checkpoint_id: int | None) -> tuple[int, int, list[dict[str, Any]]]:
    """The chosen completed checkpoint (default: the latest retained one): its id, epoch and acks."""
    if checkpoint_id is None:
        latest = ctx.store.checkpoints.latest()
        if latest is None:
            raise QualityCheckError(f"pipeline {ctx.pipeline.name!r} has no completed checkpoint to validate")
        checkpoint_id = latest.checkpoint_id
    row = ctx.store.checkpoints.status(checkpoint_id)
    if row is None or row["status"] != CheckpointStatus.COMPLETED:
        state = "unknown" if row is None else row["status"]
        raise QualityCheckError(f"checkpoint {checkpoint_id} of {ctx.pipeline.name!r} is {state}, not completed")
    return checkpoint_id, int(row["epoch"]), ctx.store.checkpoints.acks(checkpoint_id)


def checkpoint_facts(ctx: Context, checkpoint_id: int | None) -> CheckpointFacts:
    """The chosen completed checkpoint (default: the latest retained one)."""
    checkpoint_id, epoch, acks = _completed(ctx, checkpoint_id)
    sources = [a for a in acks if a["operator"] == "source"]
    if not sources:
        raise QualityCheckError(f"checkpoint {checkpoint_id} has no source acknowledgement (no offsets)")
    try:
        source = SourceAckState.from_state(sources[0]["state"])
    except (KeyError, TypeError, ValueError) as e:
        raise QualityCheckError(f"checkpoint {checkpoint_id}'s source acknowledgement is malformed ({e!r})") from None
    return CheckpointFacts(checkpoint_id, epoch, acks, source.version, source.barrier_seq,
                           None if source.barrier_seqs is None else dict(source.barrier_seqs))


def latest_restore(ctx: Context) -> RestoreFacts | None:
    """The newest epoch that finished restoring (its ``restored`` session row), or None."""
    for e in ctx.store.epochs.all():
        rows = [r for r in ctx.store.sessions.of_epoch(e["epoch"]) if r["event"] == RESTORED]
        if rows:
            r = rows[0]
            cid = r["checkpoint_id"]
            return RestoreFacts(int(e["epoch"]), None if cid is None else int(cid), float(r["recorded_at"]))
    return None


# --- tables at a checkpoint -------------------------------------------------------------------


def _empty(spark: SparkSession, schema: T.StructType) -> DataFrame:
    return spark.createDataFrame([], schema)


def source_rows(ctx: Context, version: int) -> DataFrame:
    """The landing table as of ``version`` (the checkpoint's offset) with :data:`~checkpoint_lib.reserved.ERROR_COLUMN` (null: valid)."""
    src = ctx.pipeline.source_spec
    if not isinstance(src, DeltaSource):
        raise QualityCheckError(f"the quality suites read Delta sources only; {ctx.pipeline.name!r} has {type(src).__name__}")
    cols = list(src.schema)
    if version < 0:
        df = _empty(ctx.spark, struct_type(src.schema))
    else:
        df = ctx.table(ctx.path(src.path), version).select(*cols)
    error = src.validate(df) if src.validate is not None else F.lit(None).cast("string")
    return df.withColumn(ERROR_COLUMN, error)


def _sink_spec(pipeline: Any, sink: str) -> Any:
    """The declaration of sink ``sink`` of a linear pipeline (``sinks`` by name) or of a dataflow
    graph (its :class:`~checkpoint_lib.graph.VertexSink` s)."""
    sinks = pipeline.sinks
    if isinstance(sinks, dict):
        return sinks[sink]
    for declared in sinks:
        if declared.name == sink:
            return declared.spec
    raise QualityCheckError(f"{pipeline.name!r} has no sink {sink!r} (its sinks: {', '.join(s.name for s in sinks)})")


def sink_at(ctx: Context, sink: str, checkpoint_id: int) -> DataFrame:
    """The sink as checkpoint ``checkpoint_id`` left it: the version before the first commit
    stamped with a later checkpoint (every commit of ours carries its checkpoint id)."""
    spec = _sink_spec(ctx.pipeline, sink)
    if getattr(spec, "path", None) is None:
        raise QualityCheckError(f"sink {sink!r} writes {sink_target(spec)}: the quality checks read Delta sinks only")
    path = ctx.path(spec.path)
    if not delta_log.is_delta_table(path):
        raise QualityCheckError(f"sink {sink!r} has no table at {path}")
    from ..spark.sinks import stamp_prefix

    version = delta_log.version_before_txn_above(path, stamp_prefix(ctx.pipeline.name, sink), checkpoint_id)
    if version is not None and version < 0:
        return ctx.table(path).limit(0)
    return ctx.table(path, version)


def dead_letters(ctx: Context, version: int, source: str | None = None) -> DataFrame | None:
    """The dead letters of the pipeline's source (of a graph: of source vertex ``source``) up to
    offset ``version``; None when it has no dead-letter table."""
    if source is None:
        relative = ctx.pipeline.dlq_path
    else:
        declared = ctx.pipeline.dead_letters_of(source)
        relative = declared[0].path if declared else None
    path = ctx.path(relative) if relative else None
    if path is None or not delta_log.is_delta_table(path):
        return None
    return ctx.table(path).where(F.col("src_version") <= version)


def pinned_state(ctx: Context, acks: list[dict[str, Any]], uid: str, columns: list[str],
                 ttl: Any = None) -> DataFrame | None:
    """The keyed state of operator ``uid`` a checkpoint pinned (each subtask's key groups at its
    state table's version, as its flushes read it: ``ttl`` is its state TTL), its ``columns`` (the
    key first); None when nothing of it is pinned."""
    path = str(state_table(ctx.root, uid))
    ranges: dict[int, list[tuple[int, int]]] = {}  # table version -> the key groups pinned at it
    for a in sorted(acks, key=lambda a: a["index"]):
        if a["operator"] != uid:
            continue
        pinned = PinnedState.held_in(a["state"])
        if pinned is not None and pinned.table_version >= 0:  # -1: nothing written yet, empty
            ranges.setdefault(pinned.table_version, []).append((pinned.key_groups.start, pinned.key_groups.end))
    parts = []
    for version, groups in sorted(ranges.items()):  # one read per version (subtasks usually share one)
        pinned = F.lit(False)
        for lo, hi in groups:
            pinned = pinned | F.col(KEY_GROUP).between(lo, hi)
        state = live(ctx.table(path, version), columns[0], keep_run=True)
        parts.append(without_cleaned(state, ttl, marks_at(path, version)).where(pinned).select(*columns))
    if not parts:
        return None
    df = parts[0]
    for part in parts[1:]:
        df = df.unionByName(part)
    return df


def snapshot_state(ctx: Context, acks: list[dict[str, Any]]) -> DataFrame:
    """The keyed state a checkpoint pinned: each subtask's key groups at its table version."""
    p = ctx.pipeline
    values = [c for c, _ in p.state_columns]
    df = pinned_state(ctx, acks, p.operator_uid, [p.key, *values], getattr(p.operator, "state_ttl", None))
    if df is None:
        schema = T.StructType([T.StructField(p.key, T.StringType())] + [T.StructField(c, T.LongType()) for c in values])
        return _empty(ctx.spark, schema)
    return df


def channel_state_rows(ctx: Context, checkpoint_id: int, record: bool = True,
                       acks: list[dict[str, Any]] | None = None) -> DataFrame | None:
    """The records in flight checkpoint ``checkpoint_id`` logged, channels numbered as a linear
    pipeline's (:func:`~checkpoint_lib.spark.channels.read_pipeline_channel_state`); None: no table.
    ``acks``: the checkpoint's acks when the caller has them (else read from the store)."""
    from ..spark.channels import read_pipeline_channel_state, source_senders

    if acks is None:
        acks = ctx.store.checkpoints.acks(checkpoint_id)
    sources = source_senders((a["operator"] for a in acks), ctx.pipeline.source_parallelism)
    return read_pipeline_channel_state(ctx.spark, str(ctx.root), ctx.pipeline, checkpoint_id, sources, record,
                                       load=ctx.table)


def mapped(ctx: Context, valid: DataFrame) -> DataFrame:
    """The valid source rows as the operator receives them: through the pipeline's ``map()`` steps,
    in its record schema. A map is given the offset and ``sender`` columns it must keep, here as
    typed nulls (a map must not depend on them: a record's offset only says where it came from)."""
    p = ctx.pipeline
    if not p.transforms:
        return valid
    df = valid.drop(ERROR_COLUMN)
    for name, kind in (*OFFSET_FIELDS, (SENDER, "int")):
        if name not in df.columns:
            df = df.withColumn(name, F.lit(None).cast(kind))
    for fn, _schema in p.transforms:
        df = fn(df)
    return df.select(*p.record_schema)


def source_records(ctx: Context, records: DataFrame) -> DataFrame:
    """What the spec's aggregates recompute from: the records the operator received up to the
    checkpoint (:func:`mapped`), or the spec's mapping of them."""
    return records if ctx.spec.source_records is None else ctx.spec.source_records(ctx, records)


def channel_records(ctx: Context, channel: DataFrame, full: bool) -> DataFrame:
    """What logged in-flight records add to the state (see :class:`QualitySpec`)."""
    return channel if ctx.spec.channel_records is None else ctx.spec.channel_records(channel, full)


def plus_channel_state(ctx: Context, per_key: DataFrame, checkpoint_id: int, full: bool) -> DataFrame:
    """``per_key`` (key + the spec's aggregates) plus what the checkpoint's channel state adds."""
    key, aggs = ctx.pipeline.key, ctx.spec.aggregates
    per_key = per_key.select(key, *[F.col(c).cast("long").alias(c) for c in aggs])
    channel = channel_state_rows(ctx, checkpoint_id)
    if channel is not None:
        flying = channel_records(ctx, channel, full)
        per_key = per_key.unionByName(flying.groupBy(key).agg(*[agg().alias(c) for c, agg in aggs.items()]))
    return per_key.groupBy(key).agg(*[F.sum(c).cast("long").alias(c) for c in aggs])


def effective_state(ctx: Context, acks: list[dict[str, Any]], checkpoint_id: int, full: bool = True) -> DataFrame:
    """Snapshot state plus what its channel state adds, per key, over the spec's additive
    aggregates: ``full`` what the pipeline converges to, else what the restore holds at once."""
    return plus_channel_state(ctx, snapshot_state(ctx, acks), checkpoint_id, full)


# --- dataflow graphs: what a graph's own views read (GraphQualitySpec) --------------------------


@dataclass
class GraphFacts:
    """Driver-side metadata of one completed checkpoint of a dataflow graph."""

    checkpoint_id: int
    epoch: int
    acks: list[dict[str, Any]]
    offsets: dict[str, int]
    """Each source vertex's offset: the version it read up to (its subtask 0's ack; -1: nothing)."""


def graph_facts(ctx: Context, checkpoint_id: int | None) -> GraphFacts:
    """The chosen completed checkpoint of the graph ``ctx.pipeline`` (default: the latest)."""
    checkpoint_id, epoch, acks = _completed(ctx, checkpoint_id)
    offsets = {}
    for source in ctx.pipeline.sources:
        first = [a for a in acks if a["operator"] == source.name and int(a["index"]) == 0]
        if not first:
            raise QualityCheckError(f"checkpoint {checkpoint_id} has no acknowledgement of source {source.name!r} "
                                    "(no offset)")
        try:
            offsets[source.name] = SourceAckState.from_state(first[0]["state"]).version
        except (KeyError, TypeError, ValueError) as e:
            raise QualityCheckError(f"checkpoint {checkpoint_id}'s acknowledgement of source {source.name!r} is "
                                    f"malformed ({e!r})") from None
    return GraphFacts(checkpoint_id, epoch, acks, offsets)


def operator_state(ctx: Context, facts: GraphFacts, uid: str) -> DataFrame:
    """Keyed operator ``uid``'s state as checkpoint ``facts`` pinned it: its key column and its
    ``state_schema`` columns (empty when nothing of it is pinned)."""
    from ..schema import columns as schema_columns

    graph = ctx.pipeline
    vertex = graph.vertex(uid)
    key = graph.inputs_of(uid)[0].key
    wanted = [key, *(name for name, _ in schema_columns(getattr(vertex.operator, "state_schema", None) or ()))]
    df = pinned_state(ctx, facts.acks, uid, wanted, getattr(vertex.operator, "state_ttl", None))
    if df is None:
        df = ctx.table(str(state_table(ctx.root, uid))).select(*wanted).limit(0)
    return df


def _source_spec(ctx: Context, source: str, kind: type) -> Any:
    spec = ctx.pipeline.vertex(source).spec
    if not isinstance(spec, kind):
        raise QualityCheckError(f"source {source!r} of {ctx.pipeline.name!r} is a {type(spec).__name__}; this view "
                                f"reads a {kind.__name__}")
    return spec


def landed(ctx: Context, source: str, version: int) -> DataFrame:
    """Every row source vertex ``source`` (a Delta table) landed up to offset ``version``, read as
    the source reads it: its declared columns, its offset (``src_version``, ``src_file``,
    ``src_row``: what its dead letters carry) and :data:`~checkpoint_lib.reserved.ERROR_COLUMN`
    (the source's ``validate``; null: a valid row)."""
    from ..spark.sources import SourceSite, source_reader

    spec = _source_spec(ctx, source, DeltaSource)
    path = ctx.path(spec.path)
    files = delta_log.added_files(path, -1, version) if version >= 0 else []
    if files:
        reader = source_reader(spec, SourceSite(ctx.spark, path, str(ctx.root), ctx.pipeline.name, lambda _m: None))
        df = reader.read(files, 1).select(*spec.schema, *OFFSET_COLUMNS)
        ctx.note_read(path, version)
    else:
        df = _empty(ctx.spark, struct_type({**spec.schema, "src_version": "long", "src_file": "string",
                                            "src_row": "long"}))
    error = spec.validate(df) if spec.validate is not None else F.lit(None).cast("string")
    return df.withColumn(ERROR_COLUMN, error)


def change_feed(ctx: Context, source: str, version: int) -> DataFrame:
    """Every change source vertex ``source`` (a change-data-feed source) read up to offset
    ``version``, read by Spark's ``readChangeFeed`` from version 0: its declared columns,
    :data:`~checkpoint_lib.pipeline.CHANGE_COLUMN` (``insert``, ``update``: the row after it,
    ``delete``: the row deleted) and ``commit_version``."""
    from ..pipeline import CHANGE_COLUMN, ChangeFeedSource

    spec = _source_spec(ctx, source, ChangeFeedSource)
    path = ctx.path(spec.path)
    declared = spec.declared
    if version < 0:
        return _empty(ctx.spark, struct_type({**declared, CHANGE_COLUMN: "string", "commit_version": "long"}))
    ctx.note_read(path, version)
    kind = F.col("_change_type")
    change = (F.when(kind == "insert", F.lit("insert")).when(kind == "update_postimage", F.lit("update"))
              .when(kind == "delete", F.lit("delete")))
    return (ctx.spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0)
            .option("endingVersion", version).load(path)
            .where(kind.isin("insert", "update_postimage", "delete"))
            .select(*[F.col(c).cast(t).alias(c) for c, t in declared.items()], change.alias(CHANGE_COLUMN),
                    F.col("_commit_version").cast("long").alias("commit_version")))


# --- after-restore views ----------------------------------------------------------------------


def _all_true(columns: list[Any]) -> Any:
    out = F.lit(True)
    for c in columns:
        out = out & c
    return out


def sink_view(sink: str) -> str:
    """The view a pipeline's own expectations on ``sink`` check: its table at the checkpoint. It is
    named like the sink's subtasks (:func:`~checkpoint_lib.core.types.sink_operator`)."""
    return sink_operator(sink)


def restore_views(ctx: Context, facts: CheckpointFacts, restore: RestoreFacts | None) -> dict[str, Any]:
    spec, key = ctx.spec, ctx.pipeline.key
    src = source_rows(ctx, facts.source_version)
    records = mapped(ctx, src.where(F.col(ERROR_COLUMN).isNull()))  # what the operator saw
    views: dict[str, Any] = {}

    if spec.event_sink is not None and spec.event_id is not None:
        event_rows = sink_at(ctx, spec.event_sink, facts.checkpoint_id)
        if spec.event_id != "event_id":
            event_rows = event_rows.withColumnRenamed(spec.event_id, "event_id")
        views[EVENT_SINK_VIEW] = ctx.materialize(event_rows, EVENT_SINK_VIEW)
        cols = list(spec.event_columns)
        copies = F.lit(1) if spec.distinct_events else F.count(F.lit(1))  # repeats of an id are one event
        s = records.groupBy(F.col(spec.event_id).alias("event_id")).agg(
            copies.alias("source_copies"), *[F.first(c).alias(f"source_{c}") for c in cols])
        # records in flight at the checkpoint reach the event sink after it: they count as there
        # (with distinct events, an id in flight that the sink already holds is a repeat, not a copy)
        channel = channel_state_rows(ctx, facts.checkpoint_id, acks=facts.acks)
        landed = event_rows.select("event_id", *cols, F.lit(True).alias("in_sink"))
        if channel is not None:
            landed = landed.unionByName(channel.select(F.col(spec.event_id).alias("event_id"), *cols,
                                                       F.lit(False).alias("in_sink")))
        in_sink = F.sum(F.col("in_sink").cast("long"))
        sink_copies = (F.when(in_sink > 0, in_sink).otherwise(F.lit(1)) if spec.distinct_events
                       else F.count(F.lit(1)))
        k = landed.groupBy("event_id").agg(
            sink_copies.alias("sink_copies"), *[F.first(c).alias(f"sink_{c}") for c in cols])
        views["events"] = ctx.materialize(
            s.join(k, "event_id", "full_outer").select(
                "event_id",
                F.coalesce("source_copies", F.lit(0)).alias("source_copies"),
                F.coalesce("sink_copies", F.lit(0)).alias("sink_copies"),
                _all_true([F.col(f"source_{c}").eqNullSafe(F.col(f"sink_{c}")) for c in cols]).alias("values_match"),
            ),
            "events",
        )
    else:
        event_rows = None

    aggs = spec.aggregates
    if aggs:
        parts = {
            "source": source_records(ctx, records).groupBy(key).agg(*[agg().alias(c) for c, agg in aggs.items()]),
            "state": effective_state(ctx, facts.acks, facts.checkpoint_id),
        }
        if spec.key_sink is not None:  # what the sink holds at c, plus what was still in flight
            sink = sink_at(ctx, spec.key_sink, facts.checkpoint_id).select(key, *aggs)
            parts["sink"] = plus_channel_state(ctx, sink, facts.checkpoint_id, full=True)
        joined = None
        for side, df in parts.items():
            df = df.select(F.col(key).alias("key"), F.lit(True).alias(f"in_{side}"),
                           *[F.col(c).alias(f"{side}_{c}") for c in aggs])
            joined = df if joined is None else joined.join(df, "key", "full_outer")
        assert joined is not None
        flags = [F.coalesce(F.col(f"in_{side}"), F.lit(False)).alias(f"in_{side}") for side in parts]
        if "sink" not in parts:
            flags.append(F.lit(True).alias("in_sink"))
        matches = [
            _all_true([F.col(f"source_{c}").eqNullSafe(F.col(f"{side}_{c}")) for c in aggs]).alias(f"{side}_matches_source")
            for side in ("sink", "state") if side in parts
        ]
        if "sink" not in parts:
            matches.append(F.lit(True).alias("sink_matches_source"))
        views["keys"] = ctx.materialize(joined.select("key", *flags, *matches, *[c for c in joined.columns if "_" in c and not c.startswith("in_")]), "keys")

    totals = src.agg(
        F.count(F.lit(1)).alias("source_rows"),
        F.count(F.when(F.col(ERROR_COLUMN).isNull(), 1)).alias("valid_rows"),
        F.count(F.when(F.col(ERROR_COLUMN).isNotNull(), 1)).alias("bad_rows"),
    )
    if ctx.pipeline.transforms:  # a map may filter or explode: the operator's record count
        totals = totals.crossJoin(records.agg(F.count(F.lit(1)).alias("record_rows")))
    else:
        totals = totals.withColumn("record_rows", F.col("valid_rows"))
    dlq = dead_letters(ctx, facts.source_version)
    if dlq is None:
        totals = totals.withColumn("dead_letters", F.lit(0).cast("long")).withColumn("distinct_dead_letters", F.lit(0).cast("long"))
    else:
        offset = list(spec.dead_letter_offset)
        totals = totals.crossJoin(dlq.agg(F.count(F.lit(1)).alias("dead_letters"),
                                          F.countDistinct(*offset).alias("distinct_dead_letters")))
    if event_rows is not None:  # + in flight
        sink_rows = k.agg(F.sum("sink_copies")) if spec.distinct_events else landed.agg(F.count(F.lit(1)))
        totals = totals.crossJoin(sink_rows.toDF("sink_rows"))
    else:
        totals = totals.withColumn("sink_rows", F.col("valid_rows"))
    if event_rows is not None and spec.distinct_events:  # valid rows that repeat an id: not sink rows
        totals = totals.crossJoin(records.agg((F.count(F.lit(1)) - F.countDistinct(spec.event_id)).alias("repeats")))
    else:
        totals = totals.withColumn("repeats", F.lit(0).cast("long"))
    views["totals"] = ctx.materialize(totals.select(*[F.col(c).cast("long").alias(c) for c in totals.columns]), "totals")
    for name in spec.sink_expectations():  # the pipeline's own invariants, on its sinks at c
        if name not in ctx.pipeline.sinks:
            raise ValueError(f"the quality spec of {ctx.pipeline.name!r} has expectations for sink {name!r}, "
                             f"which the pipeline does not declare ({sorted(ctx.pipeline.sinks)})")
        views[sink_view(name)] = sink_at(ctx, name, facts.checkpoint_id)

    if restore is not None:
        views["restored_state"] = ctx.materialize(restored_state_view(ctx, restore), "restored_state")
    return views


def state_version_at(path: str, when: float) -> int | None:
    """The newest version of the Delta table at ``path`` committed at or before ``when`` (seconds)."""
    from deltalake import DeltaTable

    versions = [h["version"] for h in DeltaTable(path).history() if h["timestamp"] <= when * 1000.0]
    return max(versions) if versions else None


def restored_state_view(ctx: Context, restore: RestoreFacts) -> DataFrame:
    """The state table as the restore left it vs the snapshot it restored (+ the replayed channel
    state). A restore from scratch must leave the state empty."""
    key, aggs = ctx.pipeline.key, list(ctx.spec.aggregates)
    path = str(state_table(ctx.root, ctx.pipeline.operator_uid))
    version = state_version_at(path, restore.recorded_at)
    if version is None:
        raise QualityCheckError(f"the state table has no version from before the restore of epoch {restore.epoch}")
    restored = without_cleaned(live(ctx.table(path, version), key, keep_run=True),
                               getattr(ctx.pipeline.operator, "state_ttl", None), marks_at(path, version))
    if not aggs:
        return _restored_state_any(ctx, restore, restored)
    if restore.checkpoint_id is None:
        expected = restored.select(key, *[F.col(c).cast("long").alias(c) for c in aggs]).limit(0)
    else:
        expected = effective_state(ctx, ctx.store.checkpoints.acks(restore.checkpoint_id), restore.checkpoint_id, full=False)
    r = restored.select(F.col(key).alias("key"), F.lit(True).alias("in_restored"),
                        *[F.col(c).cast("long").alias(f"restored_{c}") for c in aggs])
    s = expected.select(F.col(key).alias("key"), F.lit(True).alias("in_snapshot"),
                        *[F.col(c).alias(f"snapshot_{c}") for c in aggs])
    return r.join(s, "key", "full_outer").select(
        "key",
        F.coalesce("in_restored", F.lit(False)).alias("in_restored"),
        F.coalesce("in_snapshot", F.lit(False)).alias("in_snapshot"),
        _all_true([F.col(f"restored_{c}").eqNullSafe(F.col(f"snapshot_{c}")) for c in aggs]).alias("values_equal"),
        *[f"restored_{c}" for c in aggs], *[f"snapshot_{c}" for c in aggs],
    )


def _restored_state_any(ctx: Context, restore: RestoreFacts, restored: DataFrame) -> DataFrame:
    """:func:`restored_state_view` for any state (no additive aggregates declared): every state
    column of every key equals the snapshot's. The keys the replayed channel state touched are
    not comparable without running the operator: they count as equal."""
    key, columns = ctx.pipeline.key, ctx.pipeline.state_columns

    def values(df: DataFrame, side: str) -> list:
        # maps have no equality in Spark: compare their entries, sorted
        return [(F.array_sort(F.map_entries(c)) if t.startswith("map") else F.col(c)).alias(f"{side}_{c}")
                for c, t in columns]

    if restore.checkpoint_id is None:
        expected, replayed = restored.limit(0), None
    else:
        expected = snapshot_state(ctx, ctx.store.checkpoints.acks(restore.checkpoint_id))
        channel = channel_state_rows(ctx, restore.checkpoint_id)
        replayed = None if channel is None else channel.select(F.col(key).alias("key")).distinct()
    r = restored.select(F.col(key).alias("key"), F.lit(True).alias("in_restored"), *values(restored, "restored"))
    s = expected.select(F.col(key).alias("key"), F.lit(True).alias("in_snapshot"), *values(expected, "snapshot"))
    joined = r.join(s, "key", "full_outer")
    if replayed is not None:
        joined = joined.join(replayed.withColumn("replayed", F.lit(True)), "key", "left")
    else:
        joined = joined.withColumn("replayed", F.lit(False))
    replay = F.coalesce("replayed", F.lit(False))
    return joined.select(
        "key",
        (F.coalesce("in_restored", F.lit(False)) | replay).alias("in_restored"),
        (F.coalesce("in_snapshot", F.lit(False)) | replay).alias("in_snapshot"),
        (_all_true([F.col(f"restored_{c}").eqNullSafe(F.col(f"snapshot_{c}")) for c, _ in columns]) | replay)
        .alias("values_equal"),
    )


# --- per-checkpoint views ---------------------------------------------------------------------


def checkpoint_views(ctx: Context, facts: CheckpointFacts) -> dict[str, Any]:
    from ..core.keygroups import range_for_subtask

    p = ctx.pipeline
    acked = {a["subtask"]: a for a in facts.acks}
    # Parallelism as the checkpoint was taken (a rescaled run differs from the declaration): the
    # keyed operator and its fused sinks share one parallelism, so one subtask missing from all of
    # them still shows (and the key-group check below catches the last one missing everywhere).
    keyed_side = [p.operator_uid, *(sink_operator(name) for name in p.sinks)]
    P = 1 + max((a["index"] for a in facts.acks if a["operator"] in keyed_side), default=p.keyed_parallelism - 1)
    S = 1 + max((a["index"] for a in facts.acks if a["operator"] == "source"), default=p.source_parallelism - 1)
    expected = {"source": S, **{op: P for op in keyed_side}}
    rows = []
    for operator, n in expected.items():
        for i in range(n):
            a = acked.get(f"{operator}[{i}]")
            sizes = a is not None and a.get("ack_time") is not None and all(
                isinstance(a.get(k), (int, float)) and not isinstance(a.get(k), bool) and a[k] >= 0
                for k in ("state_size_bytes", "channel_state_rows", "channel_state_bytes", "alignment_ms", "duration_ms")
            )
            groups_ok = True
            if a is not None and operator == p.operator_uid:  # keyed state: a pinned version and its key groups
                try:
                    pinned = PinnedState.held_in(a["state"])
                except (KeyError, TypeError, ValueError):
                    pinned = None
                sizes = sizes and pinned is not None
                groups_ok = pinned is not None and pinned.key_groups == range_for_subtask(i, P, p.max_parallelism)
            rows.append((f"{operator}[{i}]", operator, i, a is not None, bool(sizes), groups_ok,
                         int(a["channel_state_rows"]) if a is not None and operator == p.operator_uid else 0))
    meta = ctx.spark.createDataFrame(
        rows, "subtask string, operator string, subtask_index int, acked boolean, sizes_recorded boolean, key_groups_ok boolean, "
              "channel_state_rows_recorded long")
    channel = channel_state_rows(ctx, facts.checkpoint_id, record=False, acks=facts.acks)  # where each record was: ours only
    views: dict[str, Any] = {}
    if channel is None:
        found = ctx.spark.createDataFrame([], "receiver int, channel_state_rows_found long")
        segments = ctx.spark.createDataFrame([], "receiver int, sender int, seq long, records long")
    else:
        found = channel.groupBy("receiver").agg(F.count(F.lit(1)).cast("long").alias("channel_state_rows_found"))
        segments = channel.groupBy("receiver", "sender", "seq").agg(F.count(F.lit(1)).cast("long").alias("records"))
    found = found.withColumn("operator", F.lit(p.operator_uid)).withColumnRenamed("receiver", "subtask_index")
    views["subtasks"] = ctx.materialize(
        meta.join(found, ["operator", "subtask_index"], "left")
        .withColumn("channel_state_rows_found", F.coalesce("channel_state_rows_found", F.lit(0)).cast("long"))
        .orderBy("operator", "subtask_index"), "subtasks"
    )
    barrier = F.lit(facts.barrier_seq if facts.barrier_seq is not None else -1).cast("long")
    barriers = dict(facts.barrier_seqs or {})
    received: dict[str, int] = {}  # "receiver:channel" -> where the receiver got the barrier on it
    for a in facts.keyed_acks(p.operator_uid):
        keyed = KeyedAckState.from_state(a["state"])
        if keyed.feedback_barrier_seq is not None:  # a cycle: feedback channel S + i, i's forwarded barrier
            barriers[S + int(a["index"])] = keyed.feedback_barrier_seq
        received.update({f"{int(a['index'])}:{c}": at for c, at in (keyed.barrier_seqs or {}).items()})
    if received:  # the graph runtime's acks: each receiver's cut of each of its channels
        positions = F.create_map(*[F.lit(x) for kv in sorted(received.items()) for x in kv])
        at = positions[F.concat_ws(":", F.col("receiver").cast("string"), F.col("sender").cast("string"))]
        barrier = F.coalesce(at.cast("long"), F.lit(-1).cast("long"))
    elif barriers:  # n >= m per channel: a segment must precede ITS sender's barrier
        positions = F.create_map(*[F.lit(x) for kv in sorted(barriers.items()) for x in kv])
        barrier = F.coalesce(positions[F.col("sender")].cast("long"), F.lit(-1).cast("long"))
    views["channel_state"] = ctx.materialize(
        segments.withColumn("checkpoint_id", F.lit(facts.checkpoint_id).cast("long"))
        .withColumn("barrier_seq", barrier), "channel_state"
    )

    aggs = ctx.spec.aggregates
    if aggs:
        src = source_records(ctx, mapped(ctx, source_rows(ctx, facts.source_version).where(F.col(ERROR_COLUMN).isNull())))
        source = src.agg(*[agg().alias(f"source_{c}") for c, agg in aggs.items()])
        state = snapshot_state(ctx, facts.acks).agg(*[F.sum(c).cast("long").alias(f"state_{c}") for c in aggs])
        if channel is None:
            chan = ctx.spark.range(1).select(*[F.lit(0).cast("long").alias(f"channel_{c}") for c in aggs])
        else:
            chan = channel_records(ctx, channel_state_rows(ctx, facts.checkpoint_id, acks=facts.acks), True).agg(*[agg().alias(f"channel_{c}") for c, agg in aggs.items()])
        one = source.crossJoin(state).crossJoin(chan)
        per_quantity = [
            one.select(
                F.lit(c).alias("quantity"),
                F.coalesce(F.col(f"source_{c}"), F.lit(0)).cast("long").alias("source_total"),
                F.coalesce(F.col(f"state_{c}"), F.lit(0)).cast("long").alias("state_total"),
                F.coalesce(F.col(f"channel_{c}"), F.lit(0)).cast("long").alias("channel_state_total"),
            )
            for c in aggs
        ]
        df = per_quantity[0]
        for part in per_quantity[1:]:
            df = df.unionByName(part)
        views["conservation"] = ctx.materialize(df, "conservation")
    return views

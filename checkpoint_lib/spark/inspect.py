"""Reading checkpoints back (like Flink's State Processor API / Spark's state data source) as Spark
DataFrames; ``ckpt state`` reads the same with delta-rs and no JVM (:mod:`checkpoint_lib.delta.inspect`).

Every function returns Spark DataFrames (nothing is collected) or small metadata dicts:

- :func:`operator_state`: the keyed state a checkpoint pinned, with the owning subtask;
- :func:`channel_state`: the in-flight records a checkpoint logged, per receiving subtask;
- :func:`source_offsets` / :func:`sink_transactions`: the small per-subtask handles.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..core.acks import KeyedAckState
from ..core.errors import NoCheckpointError
from ..delta.inspect import checkpoint  # noqa: F401 - the named or latest completed checkpoint, re-exported
from ..delta.inspect import sink_snapshots
from ..layout import checkpoint_root, state_table
from ..pipeline import Pipeline
from ..reserved import OFFSET_FIELDS
from . import tables
from .channels import ChannelStateTable, read_pipeline_channel_state, source_senders
from .state import KEY_GROUP, live


def _root(warehouse: str, pipeline: Pipeline) -> str:
    return str(checkpoint_root(warehouse, pipeline.name))


def operator_state(spark: SparkSession, warehouse: str, pipeline: Pipeline, checkpoint_id: int | None = None) -> DataFrame:
    """Keyed state of ``pipeline``'s operator at the checkpoint, with a ``subtask`` column."""
    if not pipeline.keyed:
        raise ValueError(
            f"operator {pipeline.operator_uid!r} of pipeline {pipeline.name!r} is stateless "
            f"({pipeline.partitioning} partitioning): it has no keyed state to show"
        )
    c = checkpoint(warehouse, pipeline, checkpoint_id)
    path = str(state_table(_root(warehouse, pipeline), pipeline.operator_uid))
    parts = []
    for sid, ack in sorted(c.acks.items()):
        if sid.operator != pipeline.operator_uid:
            continue
        pinned = KeyedAckState.from_state(ack.state).pinned
        parts.append(
            live(spark.read.format("delta").option("versionAsOf", pinned.table_version).load(path), pipeline.key)
            .where(F.col(KEY_GROUP).between(pinned.key_groups.start, pinned.key_groups.end))
            .withColumn("subtask", F.lit(sid.index))
        )
    if not parts:
        raise NoCheckpointError(f"checkpoint {c.checkpoint_id} holds no state of operator {pipeline.operator_uid!r}")
    df = parts[0]
    for p in parts[1:]:
        df = df.unionByName(p)
    return df


def channel_state(spark: SparkSession, warehouse: str, pipeline: Pipeline, checkpoint_id: int | None = None) -> DataFrame:
    """The records in flight at the checkpoint (logged by unaligned snapshots), per receiver:
    the record's columns with ``checkpoint_id``, ``receiver``, ``sender`` and ``seq``
    (:func:`~checkpoint_lib.spark.channels.read_pipeline_channel_state`)."""
    c = checkpoint(warehouse, pipeline, checkpoint_id)
    sources = source_senders((s.operator for s in c.acks), pipeline.source_parallelism)
    found = read_pipeline_channel_state(spark, str(_root(warehouse, pipeline)), pipeline, c.checkpoint_id, sources)
    if found is None:
        record = tables.struct_type([*pipeline.record_schema.items(), (KEY_GROUP, "int"), *OFFSET_FIELDS])
        return spark.createDataFrame([], T.StructType([*ChannelStateTable.OURS, *record.fields]))  # none logged, ever
    return found


def source_offsets(warehouse: str, pipeline: Pipeline, checkpoint_id: int | None = None) -> dict[str, Any]:
    c = checkpoint(warehouse, pipeline, checkpoint_id)
    return {str(s): dict(a.state) for s, a in sorted(c.acks.items()) if s.operator == "source"}


def sink_transactions(warehouse: str, pipeline: Pipeline, checkpoint_id: int | None = None) -> dict[str, Any]:
    return sink_snapshots(checkpoint(warehouse, pipeline, checkpoint_id))

"""A pipeline wired to its tables: the one construction of what a :class:`~checkpoint_lib.pipeline.Pipeline`
becomes in a warehouse, for the runner and for every reader that needs the same pieces.

:class:`Topology` holds, for one pipeline at one parallelism: the subtasks (source, operator and
sink subtasks, as the coordinator and the snapshots name them), the channel
logs (the source edge, and the feedback edge of a cycle), the keyed state table, the sinks, the
dead-letter table and the channel-state table, at the paths :mod:`checkpoint_lib.layout` defines
(the source's reader is the source stage's: :mod:`checkpoint_lib.spark.sources`). Building it
reads and writes nothing.
"""

from __future__ import annotations

from typing import Callable

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from ..core.types import SubtaskId, sink_operator
from ..layout import channel_log, channel_state_table, checkpoint_root, state_table, warehouse_location
from ..pipeline import Pipeline
from . import tables
from .channels import ChannelStateTable, DeltaChannelLog
from .dead_letters import DeadLetterTable
from .sinks import SinkWriter, app_prefix, pipeline_sinks
from ..reserved import KEY_GROUP, OFFSET_COLUMNS
from .state import KeyedStateTable

OFFSET_FIELDS = tuple(zip(OFFSET_COLUMNS, ("long", "string", "long")))
"""Every record's source offset (:data:`~checkpoint_lib.reserved.OFFSET_COLUMNS`) with its type."""
SOURCE = "source"
"""The operator name of the source subtasks."""


class Topology:
    def __init__(self, pipeline: Pipeline, warehouse: str, spark: SparkSession, *,
                 check_epoch: Callable[[int], None] | None = None):
        p = pipeline
        self.pipeline = p
        self.warehouse = warehouse_location(warehouse)
        self.root = str(checkpoint_root(self.warehouse, p.name))
        self.S, self.P = p.source_parallelism, p.keyed_parallelism
        self.sources = [SubtaskId(SOURCE, i) for i in range(self.S)]
        self.keyed = [SubtaskId(p.operator_uid, i) for i in range(self.P)]
        self.sink_ids = {name: [SubtaskId(sink_operator(name), i) for i in range(self.P)] for name in p.sinks}
        self.tasks = self.sources + self.keyed + [s for ids in self.sink_ids.values() for s in ids]

        self.payload = tables.struct_type([*p.record_schema.items(), (KEY_GROUP, "int"), *OFFSET_FIELDS])
        self.channel = DeltaChannelLog(spark, str(channel_log(self.root, SOURCE, p.operator_uid)), self.payload)
        # a cycle: what the operator sends to itself, a log per (sending subtask, receiving subtask)
        self.feedback_log: DeltaChannelLog | None = None
        if p.feedback:
            self.feedback_log = DeltaChannelLog(
                spark, str(channel_log(self.root, p.operator_uid, p.operator_uid)), self.payload
            )
        self.channel_state_path = str(channel_state_table(self.root))
        self.channel_state = ChannelStateTable(spark, self.channel_state_path, self.payload)
        self.state: KeyedStateTable | None = None  # a stateless operator (not key_by) has none
        if p.keyed:
            self.state = KeyedStateTable(
                spark, str(state_table(self.root, p.operator_uid)), p.key, tables.struct_type(p.stored_state_columns),
                app_id=f"{app_prefix(p.name)}/state/{p.operator_uid}",
                key_type=T._parse_datatype_string(p.record_schema[p.key]), ttl=p.state_ttl,
            )
        self.dlq_path = self.path(p.dlq_path)
        self.dead_letters = DeadLetterTable(spark, self.dlq_path, p.source_spec.schema, f"{app_prefix(p.name)}/dlq")
        self.sinks: dict[str, SinkWriter] = pipeline_sinks(spark, p, self.warehouse, self.root,
                                                           check_epoch=check_epoch)

    def path(self, relative: str) -> str:
        """A path of the pipeline's declaration (landing, sinks, dead letters) in the warehouse."""
        return f"{self.warehouse}/{relative}"

    @property
    def dlq_nested(self) -> bool:
        return self.dead_letters.nested

    @property
    def dlq_record(self) -> T.StructType:
        return self.dead_letters.record

    def dlq_schema(self) -> T.StructType:
        return self.dead_letters.table_schema()

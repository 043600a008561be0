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
from .channels import ChannelStateTable, DeltaChannelLog, nests_records
from .sinks import SinkWriter, app_prefix, pipeline_sinks
from ..reserved import KEY_GROUP, OFFSET_COLUMNS, RECORD
from .state import KeyedStateTable

OFFSET_FIELDS = tuple(zip(OFFSET_COLUMNS, ("long", "string", "long")))
"""Every record's source offset (:data:`~checkpoint_lib.reserved.OFFSET_COLUMNS`) with its type."""
SOURCE = "source"
"""The operator name of the source subtasks."""
DLQ_COLUMNS = (("error", T.StringType()), *zip(OFFSET_COLUMNS, (T.LongType(), T.StringType(), T.LongType())),
               ("epoch", T.LongType()))
"""The dead-letter table's own columns, beside the bad row (the source's columns, in its types) in
:data:`~checkpoint_lib.reserved.RECORD`: the reason, the source offset, the epoch that wrote it."""


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
        self._dlq_nested: bool | None = None
        self._dlq_record: T.StructType | None = None
        self.state: KeyedStateTable | None = None  # a stateless operator (not key_by) has none
        if p.keyed:
            self.state = KeyedStateTable(
                spark, str(state_table(self.root, p.operator_uid)), p.key, tables.struct_type(p.stored_state_columns),
                app_id=f"{app_prefix(p.name)}/state/{p.operator_uid}",
                key_type=T._parse_datatype_string(p.record_schema[p.key]), ttl=p.state_ttl,
            )
        self.dlq_path = self.path(p.dlq_path)
        self.sinks: dict[str, SinkWriter] = pipeline_sinks(spark, p, self.warehouse, self.root,
                                                           check_epoch=check_epoch)

    def path(self, relative: str) -> str:
        """A path of the pipeline's declaration (landing, sinks, dead letters) in the warehouse."""
        return f"{self.warehouse}/{relative}"

    @property
    def dlq_nested(self) -> bool:
        """Whether the dead-letter table keeps the bad row in :data:`RECORD` (else an earlier
        version's flat table, whose layout is kept; :func:`~checkpoint_lib.spark.channels.nests_records`)."""
        if self._dlq_nested is None:
            self._dlq_nested = nests_records(
                self.dlq_path, [c for c, _ in DLQ_COLUMNS], list(self.pipeline.source_spec.schema), "the dead-letter table",
                "Start a new dead-letter table: declare another path with dead_letters(...) (the old one keeps "
                "what it holds).")
        return self._dlq_nested

    @property
    def dlq_record(self) -> T.StructType:
        """The bad row's columns as the dead-letter table keeps them: in the source's declared types
        (a timestamp keeps its instant, a number stays a number; a value of a landing file that did
        not convert is null there, and the reason quotes it), or all as text in a table an earlier
        version wrote so."""
        if self._dlq_record is None:
            declared = tables.struct_type(self.pipeline.source_spec.schema)
            have = tables.columns_of(self.dlq_path, nested=RECORD if self.dlq_nested else None)
            as_text = have is not None and all(have.get(f.name) == "string" for f in declared.fields)
            self._dlq_record = (T.StructType([T.StructField(f.name, T.StringType(), True) for f in declared.fields])
                                if as_text else declared)
        return self._dlq_record

    def dlq_schema(self) -> T.StructType:
        """The dead-letter table: the bad row (:attr:`dlq_record`) in :data:`RECORD`, the reason,
        the source offset, the epoch (flat, an earlier version's table: the row's columns beside
        those)."""
        ours = [T.StructField(c, t, False) for c, t in DLQ_COLUMNS]
        if self.dlq_nested:
            return T.StructType([T.StructField(RECORD, self.dlq_record, True), *ours])
        return T.StructType(list(self.dlq_record.fields) + ours)

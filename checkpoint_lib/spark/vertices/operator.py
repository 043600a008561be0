"""An operator vertex of a running graph: keyed, two-input keyed or stateless, with its sinks.

Each step the graph runner hands it its inputs (one DataFrame per input, routed to its subtasks:
:data:`~checkpoint_lib.reserved.SINK_SUBTASK` is the receiving subtask) and takes its outputs (one
DataFrame per output name, each row with the subtask whose transaction stages it). Applying a step
(:meth:`OperatorVertexRun.apply`) runs the operator against its keyed state as of the last step,
MERGEs the state it returns into its state table (one per uid: ``state/<uid>``) and stages its
sinks' rows into each subtask's open transaction; at a checkpoint every subtask snapshots
(:meth:`OperatorVertexRun.acks`): it pins the state table's version for its key groups and
pre-commits its sinks' transactions.

The operator contracts are the linear pipeline's (:class:`~checkpoint_lib.pipeline.KeyedOperator`,
:class:`~checkpoint_lib.pipeline.Operator`), and a two-input keyed operator (Flink's
``KeyedCoProcessFunction``) is ``apply(first, second, state, key) -> (state, outputs)``: both
inputs' records of the step (either may be empty), keyed by the same column, and one keyed state.
"""

from __future__ import annotations

from functools import reduce
from typing import Any, Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ...core.acks import KeyedAckState, PinnedState
from ...core.keygroups import range_for_subtask
from ...core.types import SubtaskAck, SubtaskId
from ...graph.model import OperatorKind, OperatorVertex
from ...layout import app_prefix, state_table
from ...pipeline import (DELETE, STATE_UPDATES, StateTtl, check_state_ttl, check_ttl_time_column,
                         stored_state_columns)
from ...reserved import KEY_GROUP, SINK_SUBTASK
from ...schema import columns
from .. import tables
from ..state import KeyedStateTable, apply_with_ttl, key_group_column, subtask_column
from .sinks import VertexSinks


class OperatorVertexRun:
    """One operator vertex of a graph, running (see the module)."""

    def __init__(self, vertex: OperatorVertex, graph: Any, *, spark, root: str, sinks: VertexSinks,
                 key: str | None, compact_every: int = 0) -> None:
        self.vertex, self.spark, self.graph = vertex, spark, graph
        self.uid, self.P, self.operator = vertex.uid, vertex.parallelism, vertex.operator
        self.kind = vertex.kind
        self.max_parallelism = graph.max_parallelism
        self.key = key  # every input's key column (keyed kinds)
        self.ids = [SubtaskId(self.uid, i) for i in range(self.P)]
        self.sinks = sinks  # the sinks at this vertex, and their transactions
        self.root = root
        self.state: KeyedStateTable | None = None
        self.state_columns: tuple[tuple[str, str], ...] = ()
        self.ttl: StateTtl | None = None  # its keyed state expires in event time (StateTtl)
        if self.kind is not OperatorKind.STATELESS:
            self.state_columns = columns(getattr(self.operator, "state_schema", None) or (),
                                         f"operator {self.uid!r} state_schema")
            if any(name in (key, DELETE, KEY_GROUP) for name, _ in self.state_columns):
                raise ValueError(f"operator {self.uid!r} state_schema must not list the key {key!r}, {DELETE!r} "
                                 f"or {KEY_GROUP!r}")
            if self.state_update not in STATE_UPDATES:
                raise ValueError(f"operator {self.uid!r} state_update must be one of {STATE_UPDATES}, "
                                 f"got {self.state_update!r}")
            self.ttl = check_state_ttl(getattr(self.operator, "state_ttl", None), self.uid, self.state_columns)
            if self.ttl is not None and self.ttl.max_ahead is not None and not any(
                    source.ahead is not None for source in graph.sources):
                raise ValueError(f"operator {self.uid!r}: StateTtl.max_ahead makes a source's far-ahead rows dead "
                                 "letters, and an operator of a graph may read several sources: declare the bound "
                                 "on its sources instead, source(..., ahead=AheadBound(time_column, max_ahead))")
        self.compact_every = compact_every  # its state table is compacted every that many flushes (0: never)
        self.state_version = -1
        self._sized: tuple[int, int] | None = None  # (state version, its table's bytes)
        self.flushes = 0

    @property
    def state_update(self) -> str:
        return getattr(self.operator, "state_update", "add")

    def wire_state(self, key_type: T.DataType, inputs: dict[int, DataFrame]) -> None:
        """Its state table, once the key's type is known (from its ``inputs``' schemas, which hold
        a state TTL's time column: each input's records must carry it, as a timestamp)."""
        if self.kind is OperatorKind.STATELESS:
            return
        if self.ttl is not None:
            for n, df in sorted(inputs.items()):
                kind = next((f.dataType.simpleString() for f in df.schema.fields if f.name == self.ttl.time_column),
                            None)
                check_ttl_time_column(self.ttl, self.uid, kind, f"the records of its input {n}")
        self.state = KeyedStateTable(
            self.spark, str(state_table(self.root, self.uid)), self.key,
            tables.struct_type(stored_state_columns(self.state_columns, self.ttl)),
            app_id=f"{app_prefix(self.graph.name)}/state/{self.uid}", key_type=key_type, ttl=self.ttl)

    def empty_state(self, key_type: T.DataType) -> DataFrame:
        """The state as the operator sees it, holding nothing (what the schemas are inferred with)."""
        fields = [T.StructField(self.key, key_type, False)] + list(tables.struct_type(self.state_columns).fields)
        return self.spark.createDataFrame([], T.StructType(fields))

    # a step ------------------------------------------------------------------------------------

    def run(self, inputs: dict[int, DataFrame], state: DataFrame | None) -> tuple[DataFrame | None, dict[str, DataFrame]]:
        """The operator on this step's ``inputs`` (input number -> records) against ``state`` (the
        key and the state columns; None: stateless): the state rows it returns and its outputs,
        each row attributed to the subtask whose transaction stages it. Lazy: nothing runs."""
        if self.kind is OperatorKind.STATELESS:
            return None, self._per_subtask(inputs[1])
        if self.kind is OperatorKind.TWO_INPUT_KEYED:
            deltas, outputs = self.operator.apply(inputs[1], inputs[2], state, self.key)
        else:
            deltas, outputs = self.operator.apply(inputs[1], state, self.key)
        return deltas, self._attributed(outputs)

    def step(self, inputs: dict[int, DataFrame], stored: DataFrame,
             cached: Callable[[DataFrame], DataFrame]) -> tuple[DataFrame | None, dict[str, DataFrame], Any]:
        """:meth:`run` on the state as stored (``stored``: the key, the state columns and, with a
        TTL, :data:`~checkpoint_lib.pipeline.TTL_COLUMN`), and the operator's newest write after
        the step (None: no TTL), from which the state's cleanup follows. With a TTL the operator
        sees only the state that has not expired (:func:`~checkpoint_lib.spark.state.apply_with_ttl`:
        one Spark job)."""
        if self.ttl is None or stored is None:
            return (*self.run(inputs, stored), None)
        before = self.state.marks(self.state_version).newest
        return apply_with_ttl(lambda visible: self.run(inputs, visible), [inputs[n] for n in sorted(inputs)], stored,
                              self.key, self.ttl, cached, before)

    def _per_subtask(self, records: DataFrame) -> dict[str, DataFrame]:
        """A stateless operator runs as one instance per subtask (as in Flink): ``apply`` once per
        subtask on its records (one plan, unioned); what an instance returns is its subtask's."""
        outputs: dict[str, DataFrame] = {}
        for r in range(self.P):
            returned = self.operator.apply(records.where(F.col(SINK_SUBTASK) == r))
            for name, df in dict(returned or {}).items():
                df = df.withColumn(SINK_SUBTASK, F.lit(r))
                outputs[name] = df if name not in outputs else outputs[name].unionByName(df)
        return outputs

    def _attributed(self, outputs: Any) -> dict[str, DataFrame]:
        """Each output row with the ``sink_subtask`` whose transaction stages it: the one it keeps,
        else the subtask owning the key it carries."""
        out = {}
        for name, df in dict(outputs or {}).items():
            if SINK_SUBTASK not in df.columns:
                if self.key not in df.columns:
                    raise ValueError(f"operator {self.uid!r}: the rows it returns for {name!r} must keep the key "
                                     f"column {self.key!r} or {SINK_SUBTASK!r} (it says whose transaction stages "
                                     "each row)")
                df = df.withColumn(SINK_SUBTASK, subtask_column(
                    key_group_column(self.key, self.max_parallelism), self.P, self.max_parallelism))
            out[name] = df
        return out

    def read_state(self, inputs: dict[int, DataFrame]) -> DataFrame:
        """The state a step of ``inputs`` reads (the key, the state columns and, with a TTL, its
        write time; lazily): the state of the keys in its records (a keyed function sees its keys'
        state, as in Flink), as of the operator's last flush."""
        version = self.state_version if self.state_version >= 0 else None
        keys = reduce(DataFrame.unionByName, [df.select(self.key) for _, df in sorted(inputs.items())])
        return self.state.read_keys(keys, version).drop(KEY_GROUP)

    def update_state(self, deltas: DataFrame, fence: Callable[[], None], epoch: int, newest: Any = None,
                     current: DataFrame | None = None, reached: Callable[[str], None] | None = None) -> None:
        """Write the state rows the operator returned (its ``state_update``: add to ``current``,
        the state the step read, or replace): one run appended (with a TTL, ``newest``: the
        operator's newest write after this step, from which its cleanup follows). The table is
        compacted every ``compact_every`` flushes and whenever its runs have grown as large as it
        was (:meth:`~checkpoint_lib.spark.state.KeyedStateTable.due`)."""
        if KEY_GROUP not in deltas.columns:
            deltas = deltas.withColumn(KEY_GROUP, key_group_column(self.key, self.max_parallelism))
        self.state_version = self.state.apply(
            deltas, replace=self.state_update == "replace", before_retry=fence, epoch=epoch, newest=newest,
            compact=bool(self.compact_every) and self.flushes % self.compact_every == 0, current=current,
            reached=reached, read_at=self.state_version)

    # snapshots -----------------------------------------------------------------------------------

    def acks(self, checkpoint_id: int) -> dict[SubtaskId, SubtaskAck]:
        """Every subtask's snapshot of ``checkpoint_id`` at the end of this step: its key groups of
        the state table's current version pinned (nothing copied), its sinks' transactions
        pre-committed."""
        acks: dict[SubtaskId, SubtaskAck] = {}
        for r, sid in enumerate(self.ids):
            pinned, share = None, 0
            if self.state is not None:
                pinned = PinnedState(self.state_version, range_for_subtask(r, self.P, self.max_parallelism))
                share = self.state_share(len(pinned.key_groups))
            acks[sid] = SubtaskAck(state=KeyedAckState(-1, pinned).to_state(), state_size_bytes=share)
        return {**acks, **self.sinks.acks(checkpoint_id)}

    def state_share(self, key_groups: int) -> int:
        """The bytes of the state table's current version that ``key_groups`` key groups hold (by
        their fraction): what restoring a subtask's share reads."""
        return self._table_bytes() * key_groups // self.max_parallelism

    def _table_bytes(self) -> int:
        """The state table's size at its current version (its files' bytes, from the Delta log: no
        job): each subtask acks its key groups' share, what restoring them reads, as the linear
        runner's keyed stage does. 0 before the first write."""
        if self.state is None or self.state_version < 0:
            return 0
        if self._sized is None or self._sized[0] != self.state_version:
            from deltalake import DeltaTable

            actions = DeltaTable(self.state.path, version=self.state_version).get_add_actions(flatten=True)
            self._sized = (self.state_version, int(sum(actions.column("size_bytes").to_pylist())))
        return self._sized[1]

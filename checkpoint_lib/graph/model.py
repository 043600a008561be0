"""The dataflow graph as declared (Flink's ``StreamGraph``): vertices, the edges between them, and
the sinks and dead letters attached to vertices. Pure, immutable data: building it is
:mod:`.builder`'s, checking it :mod:`.validation`'s, drawing it :mod:`.render`'s.

- A **source vertex** reads one source (a :class:`~checkpoint_lib.pipeline.DeltaSource`, a
  :class:`~checkpoint_lib.pipeline.FolderSource`...) with a parallelism; its ``map()`` steps are
  row-wise and fused into it (no edge), as the runtime fuses them today.
- An **operator vertex** has a stable ``uid`` (its state is found by it in a snapshot), a
  :class:`OperatorKind` and a parallelism. A two-input keyed operator has inputs 1 and 2 (Flink's
  ``KeyedCoProcessFunction``: ``processElement1/2``, one keyed state); every other operator has
  input 1.
- An **edge** carries one output of its sender into one input of its receiver with a
  :class:`Partitioning` (and, for ``hash``, the key column). A union is several edges into one
  input. A **feedback** edge (``iterate()``) is the only way to close a cycle.
- A **sink** writes one output of a vertex (a source's records, or an operator's output of the
  sink's name: the operator contract, one DataFrame per sink); **dead letters** are a vertex's bad
  rows.

Nothing here runs: :class:`checkpoint_lib.spark.graph_runner.GraphRunner` runs a graph, and a
linear :class:`~checkpoint_lib.pipeline.Pipeline` as the graph of two vertices it lowers to
(:func:`checkpoint_lib.graph.from_pipeline`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any, Callable

from ..core.keygroups import DEFAULT_MAX_PARALLELISM
from ..core.types import sink_operator


class Partitioning(StrEnum):
    """How an edge routes records to the receiver's subtasks (the words of
    :data:`checkpoint_lib.pipeline.PARTITIONINGS`)."""

    HASH = "hash"
    """By the key's key group (``key_by``): a keyed receiver."""
    REBALANCE = "rebalance"
    """Evenly, by a hash of the record's source offset (a replay routes it alike)."""
    BROADCAST = "broadcast"
    """Every record to every subtask."""
    FORWARD = "forward"
    """Subtask i to subtask i (both sides have one parallelism)."""


class OperatorKind(StrEnum):
    STATELESS = "stateless"
    """One instance per subtask, no state; inputs by rebalance, broadcast or forward."""
    KEYED = "keyed"
    """Keyed state; every input edge is ``hash`` by one key column."""
    TWO_INPUT_KEYED = "two_input_keyed"
    """Inputs 1 and 2, both keyed by the same column, one keyed state (``KeyedCoProcessFunction``)."""


RECORDS = "records"
"""The output of a source vertex: its records, after its ``map()`` steps."""
MAIN = "main"
"""The output of an operator an edge carries unless the stream chose another (``output(name)``)."""


def _callable_name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


@dataclass(frozen=True)
class MapStep:
    """A row-wise ``map()`` fused into its source vertex; ``schema`` is its output's columns
    (``(name, type)`` pairs) when it changes them, else None."""

    fn: Callable[[Any], Any]
    schema: tuple[tuple[str, str], ...] | None = None

    @property
    def name(self) -> str:
        return _callable_name(self.fn)


@dataclass(frozen=True)
class AheadBound:
    """How far ahead of its stream a source row's event time may be (a keyed state TTL's guard,
    ``StateTtl.max_ahead``): a row whose ``time_column`` is more than ``max_ahead`` after the
    reference (the newest step median of the source's good rows so far) is a dead letter, so one
    timestamp far in the future never makes a TTL clean-up expire every other key. The reference
    is in the source's acks: a replay after a restore decides as the first attempt did."""

    time_column: str
    max_ahead: timedelta


@dataclass(frozen=True)
class SourceVertex:
    """A source: ``name`` (its vertex id; the linear pipeline's is ``"source"``), what it reads
    (``spec``), its subtasks, its fused ``maps``, an optional
    :class:`~checkpoint_lib.pipeline.Bootstrap` read once when the pipeline starts from scratch,
    and an optional :class:`AheadBound` on its rows' event time (checked before the maps)."""

    name: str
    spec: Any
    parallelism: int = 1
    maps: tuple[MapStep, ...] = ()
    bootstrap: Any = None
    ahead: AheadBound | None = None

    @property
    def id(self) -> str:
        return self.name

    @property
    def inputs(self) -> int:
        return 0

    @property
    def record_schema(self) -> dict[str, str] | None:
        """The records' columns after the maps (a map without a schema keeps its input's; None
        when the source does not say)."""
        for step in reversed(self.maps):
            if step.schema is not None:
                return dict(step.schema)
        schema = getattr(self.spec, "schema", None)
        return dict(schema) if schema is not None else None


@dataclass(frozen=True)
class OperatorVertex:
    """An operator: its stable ``uid`` (its vertex id), the operator object (``apply``...), its kind
    and its subtasks."""

    uid: str
    operator: Any
    kind: OperatorKind
    parallelism: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", OperatorKind(self.kind))

    @property
    def id(self) -> str:
        return self.uid

    @property
    def inputs(self) -> int:
        """How many inputs it has: 2 for a two-input keyed operator, else 1."""
        return 2 if self.kind is OperatorKind.TWO_INPUT_KEYED else 1

    @property
    def operator_name(self) -> str:
        return type(self.operator).__name__


Vertex = SourceVertex | OperatorVertex


@dataclass(frozen=True)
class Edge:
    """Records of ``sender``'s ``output`` into ``receiver``'s ``input`` (1, or 2 of a two-input
    operator), routed by ``partitioning`` (``key``: the column of a ``hash`` edge). ``feedback``:
    declared with ``iterate()``, the edge that may close a cycle."""

    sender: str
    receiver: str
    partitioning: Partitioning
    key: str | None = None
    input: int = 1
    output: str = RECORDS
    feedback: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "partitioning", Partitioning(self.partitioning))
        except ValueError:
            raise ValueError(f"edge {self.sender} -> {self.receiver}: partitioning must be one of "
                             f"{', '.join(Partitioning)}, got {self.partitioning!r}") from None

    def describe(self) -> str:
        """``hash(account)``, ``rebalance``...: how the edge routes."""
        return f"{self.partitioning}({self.key})" if self.partitioning is Partitioning.HASH else str(self.partitioning)


@dataclass(frozen=True)
class VertexSink:
    """Sink ``name`` (a :class:`~checkpoint_lib.pipeline.DeltaSink`...) writing ``output`` of
    ``vertex``."""

    name: str
    vertex: str
    spec: Any
    output: str


@dataclass(frozen=True)
class DeadLetters:
    """The table ``vertex``'s bad rows go to (a warehouse-relative path); ``stamp``: what its appends
    are stamped as under the graph's app prefix (None: ``dlq/<vertex>``; a lowered linear
    pipeline's source keeps ``dlq``, the stamp its tables already carry)."""

    vertex: str
    path: str
    stamp: str | None = None


@dataclass(frozen=True)
class StreamGraph:
    """A declared dataflow graph. Build it with :class:`~checkpoint_lib.graph.Graph` (validated),
    or directly and then :func:`~checkpoint_lib.graph.validate` it."""

    name: str
    vertices: tuple[Vertex, ...]
    edges: tuple[Edge, ...] = ()
    sinks: tuple[VertexSink, ...] = ()
    dead_letters: tuple[DeadLetters, ...] = ()
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    generator_fn: Callable[..., int] | None = field(default=None, compare=False)
    """What ``ckpt generate`` runs (:meth:`~checkpoint_lib.graph.Graph.generator`): not part of
    what the graph is (left out of equality)."""
    quality: Any = field(default=None, compare=False)
    """Its after-restore quality suite (:meth:`~checkpoint_lib.graph.Graph.quality`, a
    :class:`checkpoint_lib.quality.spec.GraphQualitySpec`), run by ``ckpt validate`` and ``ckpt
    recover``: not part of what the graph is (left out of equality)."""

    def __post_init__(self) -> None:
        for name in ("vertices", "edges", "sinks", "dead_letters"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def vertex(self, vertex_id: str) -> Vertex:
        for v in self.vertices:
            if v.id == vertex_id:
                return v
        raise KeyError(f"graph {self.name!r} has no vertex {vertex_id!r}")

    @property
    def sources(self) -> tuple[SourceVertex, ...]:
        return tuple(v for v in self.vertices if isinstance(v, SourceVertex))

    @property
    def operators(self) -> tuple[OperatorVertex, ...]:
        return tuple(v for v in self.vertices if isinstance(v, OperatorVertex))

    def inputs_of(self, vertex_id: str) -> tuple[Edge, ...]:
        return tuple(e for e in self.edges if e.receiver == vertex_id)

    def outputs_of(self, vertex_id: str) -> tuple[Edge, ...]:
        return tuple(e for e in self.edges if e.sender == vertex_id)

    def sinks_of(self, vertex_id: str) -> tuple[VertexSink, ...]:
        return tuple(s for s in self.sinks if s.vertex == vertex_id)

    def dead_letters_of(self, vertex_id: str) -> tuple[DeadLetters, ...]:
        return tuple(d for d in self.dead_letters if d.vertex == vertex_id)

    def topological_order(self) -> tuple[Vertex, ...]:
        """The vertices, each after every sender of its non-feedback inputs (declaration order
        among equals); vertices on a cycle that is not a feedback edge's come last, as declared."""
        ids = [v.id for v in self.vertices]
        waiting = {i: {e.sender for e in self.inputs_of(i) if not e.feedback and e.sender != i} for i in ids}
        placed: list[str] = []
        while True:
            ready = [i for i in ids if i not in placed and not (waiting[i] - set(placed))]
            if not ready:
                break
            placed.append(ready[0])
        placed += [i for i in ids if i not in placed]
        by_id = {v.id: v for v in reversed(self.vertices)}  # the first of a duplicated id
        return tuple(by_id[i] for i in dict.fromkeys(placed))

    def operator_ids(self) -> dict[str, int]:
        """Every operator id with its parallelism: the vertices' ids and each sink's operator
        (``sink_<name>``, at its vertex's parallelism), what a snapshot is matched against."""
        ids = {v.id: v.parallelism for v in self.vertices}
        for sink in self.sinks:
            ids[sink_operator(sink.name)] = ids.get(sink.vertex, 1)
        return ids

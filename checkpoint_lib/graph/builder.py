"""Declaring a dataflow graph, in Flink's style: each call returns a stream, nothing is checked
beyond the call's own arguments until :meth:`Graph.build` validates the whole graph.

::

    g = Graph("enrich")
    payments = g.source("payments", DeltaSource("landing/payments", PAYMENTS), parallelism=2)
    payments.dead_letters("dlq/payments")
    accounts = g.source("accounts", DeltaSource("landing/accounts", ACCOUNTS))
    enriched = (payments.key_by("account", parallelism=3)
                .connect(accounts.key_by("account"))
                .process(Enrich(), uid="enrich"))
    enriched.sink("enriched", DeltaSink("gold/enriched", ENRICHED))
    enriched.output("large").rebalance(2).process(Alert(), uid="alert").sink("alerts", DeltaSink(...))
    graph = g.build()  # a StreamGraph, or a GraphError listing every problem

- ``g.source(name, spec, parallelism)`` is a stream of a source's records; ``map(fn, schema)``
  fuses a row-wise step into that source (before anything reads its records);
- ``key_by(key)``, ``rebalance()``, ``broadcast()``, ``forward()`` partition a stream toward the
  next operator (``parallelism``: that operator's subtasks; ``forward`` keeps the sender's);
- ``process(op, uid)`` is that operator (keyed after ``key_by``, stateless otherwise), and returns
  the stream of its output :data:`~.model.MAIN`; ``output(name)`` picks another of its outputs;
- ``keyed.connect(other_keyed).process(op, uid)`` is a two-input keyed operator: inputs 1 and 2,
  both keyed by the same column, one keyed state (its ``apply`` contract comes with the runtime
  that runs graphs; today's runs linear pipelines only);
- ``a.union(b)`` is one stream of both (several edges into one input);
- ``stream.sink(name, spec)`` writes it (an operator's stream writes the output named like the
  sink unless ``output()`` chose one), ``stream.dead_letters(path)`` takes its vertex's bad rows;
- ``feedback.key_by(key).iterate(into=op_stream)`` closes a cycle through a feedback edge (the
  only edge allowed to);
- ``g.generator(fn)``: what ``ckpt generate`` runs to land sample input (as ``Pipeline.generator()``);
- ``g.quality(spec)``: the after-restore quality suite ``ckpt validate`` and ``ckpt recover`` run
  (as ``Pipeline.quality()``; a :class:`~checkpoint_lib.quality.spec.GraphQualitySpec`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..core.keygroups import DEFAULT_MAX_PARALLELISM
from ..schema import columns
from .model import (MAIN, RECORDS, AheadBound, DeadLetters, Edge, MapStep, OperatorKind, OperatorVertex, Partitioning,
                    SourceVertex, StreamGraph, Vertex, VertexSink)
from .validation import validate


@dataclass(frozen=True)
class _Outlet:
    """One output of one vertex of the builder (``output`` None: an operator's, not chosen yet)."""

    vertex: int
    output: str | None


class Graph:
    """The builder of a :class:`~.model.StreamGraph` named ``name`` (see the module for the verbs).
    ``build()`` validates and returns it; until then nothing is checked but each call's arguments."""

    def __init__(self, name: str, max_parallelism: int = DEFAULT_MAX_PARALLELISM):
        self.name, self.max_parallelism = name, max_parallelism
        self._vertices: list[Vertex] = []
        self._edges: list[Edge] = []
        self._sinks: list[VertexSink] = []
        self._dead_letters: list[DeadLetters] = []
        self._generator_fn: Callable[..., int] | None = None
        self._quality: Any = None

    def source(self, name: str, spec: Any, parallelism: int = 1, bootstrap: Any = None,
               ahead: AheadBound | None = None) -> "Stream":
        """A source vertex ``name`` reading ``spec`` with ``parallelism`` subtasks; ``bootstrap``
        (a :class:`~checkpoint_lib.pipeline.Bootstrap`) is read once when the pipeline starts from
        scratch; ``ahead`` (an :class:`~.model.AheadBound`) makes rows stamped too far in the
        future dead letters. Returns the stream of its records."""
        self._vertices.append(SourceVertex(name, spec, parallelism, bootstrap=bootstrap, ahead=ahead))
        return Stream(self, (_Outlet(len(self._vertices) - 1, RECORDS),))

    def generator(self, fn: Callable[..., int]) -> "Graph":
        """How ``ckpt generate`` appends sample input to the graph's sources, as
        :meth:`checkpoint_lib.pipeline.Pipeline.generator`: ``fn(spark, warehouse, rows, *,
        bad_fraction, seed, **options)`` lands ``rows`` new rows and returns a version of the table
        it appended to (its choice: the graph has several). Returns this builder."""
        if not callable(fn):
            raise TypeError(f"generator() needs a function, got {fn!r}")
        self._generator_fn = fn
        return self

    def quality(self, spec: Any) -> "Graph":
        """The graph's after-restore quality suite, as :meth:`checkpoint_lib.pipeline.Pipeline.quality`:
        a :class:`checkpoint_lib.quality.spec.GraphQualitySpec` (its suite file and the function
        that builds the views it checks), run by ``ckpt validate`` and after ``ckpt recover``.
        Returns this builder."""
        if not callable(getattr(spec, "views", None)) or not isinstance(getattr(spec, "suite", None), str):
            raise TypeError(f"quality() needs a GraphQualitySpec (a suite name and a views function), got {spec!r}")
        self._quality = spec
        return self

    def build(self) -> StreamGraph:
        """The declared graph, validated (:class:`~.validation.GraphError` lists every problem)."""
        return validate(StreamGraph(self.name, tuple(self._vertices), tuple(self._edges), tuple(self._sinks),
                                    tuple(self._dead_letters), self.max_parallelism, generator_fn=self._generator_fn,
                                    quality=self._quality))

    def _used(self, index: int) -> bool:
        vertex_id = self._vertices[index].id
        return (any(e.sender == vertex_id for e in self._edges) or any(s.vertex == vertex_id for s in self._sinks))

    def _operator(self, operator: Any, uid: str, kind: OperatorKind, parallelism: int) -> int:
        if not callable(getattr(operator, "apply", None)):
            raise TypeError(f"operator {uid!r} needs an apply() method (see KeyedOperator and Operator)")
        self._vertices.append(OperatorVertex(uid, operator, kind, parallelism))
        return len(self._vertices) - 1

    def _connect(self, parts: "PartitionedStream", receiver: int, input: int, feedback: bool = False) -> None:
        for outlet in parts.outlets:
            self._edges.append(Edge(self._vertices[outlet.vertex].id, self._vertices[receiver].id, parts.partitioning,
                                    parts.key, input, outlet.output or MAIN, feedback))


class Stream:
    """Records flowing out of one vertex's output, or several (a union). Returned by
    ``Graph.source()`` and ``process()``; every method returns a new stream or the next step."""

    def __init__(self, graph: Graph, outlets: tuple[_Outlet, ...]):
        self.graph, self.outlets = graph, outlets

    def _single(self, verb: str) -> _Outlet:
        if len(self.outlets) != 1:
            raise ValueError(f"{verb}() on a union: apply it to each stream before union(), or process the union first")
        return self.outlets[0]

    def map(self, fn: Callable[[Any], Any], schema: Mapping[str, str] | None = None) -> "Stream":
        """A row-wise step fused into the source (as ``Pipeline.map()``); ``schema``: its output's
        columns when they differ from its input's. Only on a source's records, before anything
        reads them (a map changes them for every reader); a stateless step after an operator is
        ``forward().process(op, uid)``."""
        outlet = self._single("map")
        vertex = self.graph._vertices[outlet.vertex]
        if not isinstance(vertex, SourceVertex):
            raise ValueError(f"map() is fused into a source: after operator {vertex.id!r} use "
                             "forward().process(op, uid) (or rebalance())")
        if self.graph._used(outlet.vertex):
            raise ValueError(f"map() on source {vertex.id!r} after its records were already read (by an edge or a "
                             "sink): declare its maps first")
        if not callable(fn):
            raise TypeError(f"map() needs a function DataFrame -> DataFrame, got {fn!r}")
        step = MapStep(fn, columns(schema, "map() schema") if schema is not None else None)
        self.graph._vertices[outlet.vertex] = dataclasses.replace(vertex, maps=vertex.maps + (step,))
        return self

    def output(self, name: str) -> "Stream":
        """The stream of the operator's output ``name`` (a key of what its ``apply`` returns), e.g.
        :data:`~checkpoint_lib.pipeline.FEEDBACK`::

            enriched.output("large").rebalance(2).process(Alert(), uid="alert")
        """
        outlet = self._single("output")
        vertex = self.graph._vertices[outlet.vertex]
        if isinstance(vertex, SourceVertex):
            raise ValueError(f"output() picks an operator's output; source {vertex.id!r} has one, its records")
        return Stream(self.graph, (_Outlet(outlet.vertex, name),))

    def union(self, *others: "Stream") -> "Stream":
        """One stream of this one's records and ``others``' (several edges into the next input)."""
        for other in others:
            if other.graph is not self.graph:
                raise ValueError("union() of streams of two graphs")
        outlets = self.outlets + tuple(o for other in others for o in other.outlets)
        return Stream(self.graph, tuple(dict.fromkeys(outlets)))

    def key_by(self, key: str, parallelism: int | None = None) -> "KeyedStream":
        """Hash-partition by column ``key`` (its key group) to a keyed operator of ``parallelism``
        subtasks (default: ``process()``'s, else 1). After any operator too: a new key, a new
        parallelism."""
        if not isinstance(key, str) or not key:
            raise TypeError(f"key_by() needs a column name, got {key!r}")
        return KeyedStream(self, Partitioning.HASH, parallelism, key)

    def rebalance(self, parallelism: int | None = None) -> "PartitionedStream":
        """Spread evenly over ``parallelism`` subtasks of a stateless operator."""
        return PartitionedStream(self, Partitioning.REBALANCE, parallelism)

    def broadcast(self, parallelism: int | None = None) -> "PartitionedStream":
        """Every record to each of ``parallelism`` subtasks of a stateless operator."""
        return PartitionedStream(self, Partitioning.BROADCAST, parallelism)

    def forward(self) -> "PartitionedStream":
        """Subtask i to subtask i of a stateless operator of the sender's parallelism."""
        return PartitionedStream(self, Partitioning.FORWARD, None)

    def sink(self, name: str, spec: Any) -> "Stream":
        """Write this stream with sink ``name`` (a :class:`~checkpoint_lib.pipeline.DeltaSink`...):
        a source's records, or the operator's output named ``name`` (unless ``output()`` chose
        one). Returns this stream, for more sinks."""
        outlet = self._single("sink")
        vertex = self.graph._vertices[outlet.vertex]
        self.graph._sinks.append(VertexSink(name, vertex.id, spec, outlet.output or name))
        return self

    def dead_letters(self, path: str) -> "Stream":
        """The table (warehouse-relative) this stream's vertex sends its bad rows to. Returns this
        stream."""
        outlet = self._single("dead_letters")
        self.graph._dead_letters.append(DeadLetters(self.graph._vertices[outlet.vertex].id, path))
        return self


class PartitionedStream:
    """A stream partitioned toward the next operator: ``process()`` it (or ``iterate()`` it back)."""

    def __init__(self, stream: Stream, partitioning: Partitioning, parallelism: int | None, key: str | None = None):
        self.graph, self.outlets = stream.graph, stream.outlets
        self.partitioning, self.parallelism, self.key = partitioning, parallelism, key

    def _resolved(self, parallelism: int | None) -> int:
        """The next operator's parallelism: ``process()``'s, else the partitioner's, else the
        sender's for ``forward``, else 1."""
        if parallelism is not None:
            return parallelism
        if self.parallelism is not None:
            return self.parallelism
        if self.partitioning is Partitioning.FORWARD:
            return self.graph._vertices[self.outlets[0].vertex].parallelism
        return 1

    def process(self, operator: Any, uid: str, parallelism: int | None = None) -> Stream:
        """The operator these records go to: a keyed operator (a
        :class:`~checkpoint_lib.pipeline.KeyedOperator`) after ``key_by()``, a stateless one (an
        :class:`~checkpoint_lib.pipeline.Operator`) otherwise, with its stable ``uid``. Returns the
        stream of its output :data:`~.model.MAIN` (``output(name)`` for another)."""
        kind = OperatorKind.KEYED if self.partitioning is Partitioning.HASH else OperatorKind.STATELESS
        at = self.graph._operator(operator, uid, kind, self._resolved(parallelism))
        self.graph._connect(self, at, 1)
        return Stream(self.graph, (_Outlet(at, None),))

    def iterate(self, into: Stream, input: int = 1) -> None:
        """Close a cycle: these records go back into ``into``'s operator (its ``input``) over a
        feedback edge, the only edge that may lead back. Its parallelism is the operator's::

            bank = debits.key_by("account", parallelism=3).process(Bank(), uid="bank")
            bank.output(FEEDBACK).key_by("account").iterate(into=bank)   # credits to the payee's owner
        """
        target = into._single("iterate")
        vertex = self.graph._vertices[target.vertex]
        if into.graph is not self.graph or not isinstance(vertex, OperatorVertex):
            raise ValueError("iterate(into=...) needs the stream of an operator of this graph")
        if self.parallelism is not None and self.parallelism != vertex.parallelism:
            raise ValueError(f"iterate(): the feedback edge goes into {vertex.id!r} (parallelism "
                             f"{vertex.parallelism}); leave the partitioner's parallelism out")
        self.graph._connect(self, target.vertex, input, feedback=True)


class KeyedStream(PartitionedStream):
    """A stream partitioned by key: ``process()`` a keyed operator, or ``connect()`` another keyed
    stream for a two-input keyed operator."""

    def connect(self, other: "KeyedStream") -> "ConnectedStreams":
        """This stream as input 1 and ``other`` as input 2 of one keyed operator (both keyed by the
        same column; ``build()`` checks it)::

            orders.key_by("order_id").connect(shipments.key_by("order_id")).process(Join(), uid="join")
        """
        if not isinstance(other, KeyedStream):
            raise TypeError(f"connect() needs a keyed stream (key_by()), got {type(other).__name__}")
        if other.graph is not self.graph:
            raise ValueError("connect() of streams of two graphs")
        return ConnectedStreams(self, other)


class ConnectedStreams:
    """Two keyed streams that go into one two-input keyed operator (Flink's ``KeyedCoProcessFunction``)."""

    def __init__(self, first: KeyedStream, second: KeyedStream):
        self.first, self.second = first, second

    def process(self, operator: Any, uid: str, parallelism: int | None = None) -> Stream:
        """The two-input keyed operator, with its stable ``uid`` and ``parallelism`` (default: the
        inputs' ``key_by(parallelism=)``, which must then agree, else 1)."""
        if parallelism is None:
            asked = {p for p in (self.first.parallelism, self.second.parallelism) if p is not None}
            if len(asked) > 1:
                raise ValueError(f"operator {uid!r}: its inputs ask for parallelism {self.first.parallelism} and "
                                 f"{self.second.parallelism}; give process(..., parallelism=N)")
            parallelism = asked.pop() if asked else 1
        graph = self.first.graph
        at = graph._operator(operator, uid, OperatorKind.TWO_INPUT_KEYED, parallelism)
        graph._connect(self.first, at, 1)
        graph._connect(self.second, at, 2)
        return Stream(graph, (_Outlet(at, None),))

"""What the simulator runs: a dataflow graph (a DAG of vertices joined by edges).

A :class:`Graph` has two kinds of vertices, each with its own parallelism (its number of subtasks,
``SubtaskId(vertex, 0 .. p-1)``):

- a **source** emits records from its input lists (one list per source subtask) and takes their
  amounts from its balance;
- a **stage** is a keyed operator: it reads every input channel through ONE barrier handler, keeps a
  fee of each record and forwards the rest. A stage without outgoing edges is a **2PC sink**: it
  keeps what it receives and writes every record to a two-phase-commit transaction. A graph may
  have several sinks.

An **edge** ``(u, v)`` is all-to-all channels ``u[i] -> v[j]``, one per pair of subtasks. A record
that ``u`` sends to ``v`` goes to subtask :meth:`~Graph.partition` of ``v``, a function of its key
and of ``v`` only: every sender, whatever its vertex, sends a key to the same subtask of ``v``, as
Flink's key groups do, so a stage with several inputs (a join) sees all of a key's records in one
subtask.

- **Fan-in**: a stage with edges from several vertices has, in each subtask, one input channel per
  upstream subtask of every upstream vertex, numbered in edge order, then by sender index. Its
  handler aligns (or logs channel state, or counts barriers) over all of them alike, like Flink's
  ``CheckpointedInputGate`` over the channels of every input.
- **Fan-out**: a vertex with several outgoing edges sends each record to exactly ONE downstream
  vertex, :meth:`~Graph.route`, chosen from the record's key. Tokens are only moved, never copied,
  so every consistent snapshot still conserves the total (a broadcast would create money).
  Barriers go to every output channel of every edge.
- **Diamonds** (``a -> b``, ``a -> c``, ``b -> d``, ``c -> d``) follow: ``d`` aligns barriers that
  travelled paths of different lengths.

A record's whole path is a function of its source vertex and its key: :meth:`~Graph.path`, so the
simulator can check at the end that its effect is in every vertex on that path and nowhere else.

The graph is validated up front, with a :class:`ValueError` that names the culprit: at least one
source, names that are identifiers, parallelism >= 1, edges between declared vertices, none into a
source, every source with an outgoing edge, every stage with an input edge and reachable from a
source, and no cycle.

:class:`Topology` is the first simulator's shorthand, a line of layers; it lowers to a graph
(:meth:`Topology.graph`) and the simulator only ever runs graphs::

    Topology(2, (3, 2))  # is
    Graph(sources={"source": 2}, stages={"stage1": 3, "stage2": 2},
          edges=[("source", "stage1"), ("stage1", "stage2")])

A two-input join that feeds two sinks::

    Graph(sources={"orders": 2, "payments": 1}, stages={"join": 3, "audit": 1, "ledger": 2},
          edges=[("orders", "join"), ("payments", "join"), ("join", "audit"), ("join", "ledger")],
          mode=BarrierMode.UNALIGNED)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping

from ..core.types import BarrierMode, SubtaskId


@dataclass(frozen=True)
class Graph:
    """Sources and stages (name -> parallelism) and the edges ``(sender, receiver)`` between them
    (any iterable of pairs; kept as a tuple). ``mode``, ``alignment_timeout`` and ``keys`` mean what
    they mean for :class:`Topology`.

    Vertices are ordered sources first, then stages, each in declaration order; the simulator's
    input lists follow :meth:`source_subtasks`.
    """

    sources: Mapping[str, int]
    stages: Mapping[str, int]
    edges: tuple[tuple[str, str], ...]
    mode: BarrierMode = BarrierMode.ALIGNED
    alignment_timeout: float | None = None
    keys: int = 5
    _up: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)
    _down: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Copies: a graph does not change under the simulator when the caller's dict does.
        object.__setattr__(self, "sources", dict(self.sources))
        object.__setattr__(self, "stages", dict(self.stages))
        object.__setattr__(self, "edges", tuple(tuple(e) for e in self.edges))
        self._check_vertices()
        up: dict[str, list[str]] = {v: [] for v in self.vertices}
        down: dict[str, list[str]] = {v: [] for v in self.vertices}
        for edge in self.edges:
            if len(edge) != 2 or any(v not in up for v in edge):
                raise ValueError(f"edge {edge!r} must join two declared vertices; known: {', '.join(self.vertices)}")
            sender, receiver = edge
            if receiver in down[sender]:
                raise ValueError(f"edge {sender}->{receiver} is declared twice")
            if receiver in self.sources:
                raise ValueError(f"edge {sender}->{receiver} goes into a source: a source has no inputs")
            up[receiver].append(sender)
            down[sender].append(receiver)
        object.__setattr__(self, "_up", {v: tuple(us) for v, us in up.items()})
        object.__setattr__(self, "_down", {v: tuple(ds) for v, ds in down.items()})
        self._check_edges()

    def _check_vertices(self) -> None:
        if not self.sources:
            raise ValueError("a graph needs at least one source")
        for name, p in [*self.sources.items(), *self.stages.items()]:
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"vertex names must be identifiers, got {name!r}")
            if not isinstance(p, int) or p < 1:
                raise ValueError(f"vertex {name}: parallelism must be an int >= 1, got {p!r}")
        both = sorted(set(self.sources) & set(self.stages))
        if both:
            raise ValueError(f"{', '.join(both)}: declared both as a source and as a stage")
        if not isinstance(self.keys, int) or self.keys < 1:
            raise ValueError(f"keys must be >= 1, got {self.keys}")

    def _check_edges(self) -> None:
        for s in self.sources:
            if not self._down[s]:
                raise ValueError(f"source {s} has no outgoing edge: its records would go nowhere")
        for v in self.stages:
            if not self._up[v]:
                raise ValueError(f"stage {v} has no input edge: only sources may have none")
        reached = set(self.sources)
        todo = deque(self.sources)
        while todo:
            for w in self._down[todo.popleft()]:
                if w not in reached:
                    reached.add(w)
                    todo.append(w)
        unreachable = [v for v in self.vertices if v not in reached]
        if unreachable:
            raise ValueError(f"{', '.join(unreachable)} unreachable from any source")
        ordered = self.topological_order()
        if len(ordered) < len(self.vertices):
            left = [v for v in self.vertices if v not in ordered]  # on a cycle, or after one
            while after := [v for v in left if not set(self._down[v]) & set(left)]:
                left = [v for v in left if v not in after]
            raise ValueError(f"the graph has a cycle through {', '.join(left)}: only DAGs are supported")

    # shape -----------------------------------------------------------------------------------

    @property
    def vertices(self) -> tuple[str, ...]:
        """Every vertex: the sources, then the stages, each in declaration order."""
        return (*self.sources, *self.stages)

    @property
    def sinks(self) -> tuple[str, ...]:
        """The stages without outgoing edges: each is a 2PC sink."""
        return tuple(v for v in self.stages if not self._down[v])

    def parallelism(self, vertex: str) -> int:
        return self.sources[vertex] if vertex in self.sources else self.stages[vertex]

    def upstream(self, vertex: str) -> tuple[str, ...]:
        """The vertices with an edge into ``vertex``, in edge order (the order of its input channels)."""
        return self._up[vertex]

    def downstream(self, vertex: str) -> tuple[str, ...]:
        """The vertices ``vertex`` has an edge to, in edge order."""
        return self._down[vertex]

    def subtasks(self, vertex: str) -> list[SubtaskId]:
        return [SubtaskId(vertex, i) for i in range(self.parallelism(vertex))]

    def source_subtasks(self) -> list[SubtaskId]:
        """Every source subtask, in the order of the simulator's input lists."""
        return [sid for s in self.sources for sid in self.subtasks(s)]

    def topological_order(self) -> list[str]:
        """The vertices, every one after all its upstream vertices (Kahn); those on a cycle are left out."""
        waiting = {v: len(self._up[v]) for v in self.vertices}
        order = [v for v in self.vertices if not waiting[v]]
        for v in order:  # grows while iterated
            for w in self._down[v]:
                waiting[w] -= 1
                if not waiting[w]:
                    order.append(w)
        return order

    # where records go ------------------------------------------------------------------------
    # Python's hash of a tuple of ints is the same in every process (only str and bytes hashes are
    # salted), so routes are reproducible from a seed.

    def route(self, vertex: str, key: int) -> str:
        """The one downstream vertex a record with ``key`` leaving ``vertex`` goes to (fan-out
        splits a vertex's records by key, never copies them)."""
        outs = self._down[vertex]
        if len(outs) == 1:
            return outs[0]
        return outs[hash((key, self.vertices.index(vertex), len(outs))) % len(outs)]

    def partition(self, vertex: str, key: int) -> int:
        """The subtask of stage ``vertex`` that receives a record with ``key``, from any sender."""
        return hash((key, list(self.stages).index(vertex))) % self.stages[vertex]

    def path(self, source: str, key: int) -> list[str]:
        """Every vertex a record with ``key`` emitted by ``source`` visits, ending at its sink."""
        out = [source]
        while self._down[out[-1]]:
            out.append(self.route(out[-1], key))
        return out

    def describe(self) -> str:
        """One line: ``a[2] b[1] | a->j b->j j->x | sinks x[1]``."""
        vertices = " ".join(f"{v}[{self.parallelism(v)}]" for v in self.vertices)
        edges = " ".join(f"{u}->{v}" for u, v in self.edges)
        return f"{vertices} | {edges} | sinks {' '.join(self.sinks)} | {self.mode.value}"


@dataclass(frozen=True)
class Topology:
    """``sources`` source subtasks, then one keyed stage per entry of ``stages`` (its parallelism),
    channels all-to-all between consecutive stages; the last stage is the 2PC sink.

    The shorthand for a line of layers: :meth:`graph` lowers it to the :class:`Graph` the
    simulator runs (vertices ``source``, ``stage1``, ``stage2``, ...)."""

    sources: int
    stages: tuple[int, ...]
    mode: BarrierMode = BarrierMode.ALIGNED
    alignment_timeout: float | None = None
    keys: int = 5

    def __post_init__(self) -> None:
        if self.sources < 1 or not self.stages or min(self.stages) < 1:
            raise ValueError("need >= 1 source and >= 1 stage, each with parallelism >= 1")

    def graph(self) -> Graph:
        names = [f"stage{s + 1}" for s in range(len(self.stages))]
        return Graph(
            sources={"source": self.sources},
            stages=dict(zip(names, self.stages)),
            edges=tuple(zip(["source", *names], names)),
            mode=self.mode,
            alignment_timeout=self.alignment_timeout,
            keys=self.keys,
        )

    def subtasks(self) -> list[list[SubtaskId]]:
        """The subtasks layer by layer: the sources, then each stage."""
        graph = self.graph()
        return [graph.subtasks(v) for v in graph.vertices]


def graph_of(topology: Topology | Graph) -> Graph:
    """The graph a simulator runs: ``topology`` itself, or the line a :class:`Topology` stands for."""
    return topology.graph() if isinstance(topology, Topology) else topology


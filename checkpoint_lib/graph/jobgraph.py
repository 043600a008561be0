"""What the runtime executes of a declared :class:`~.model.StreamGraph` (Flink's ``JobGraph``): which
edges are **chained** (records flow in-process, one Spark plan per step; Spark does the shuffles),
which are **cut** by a persisted channel log, and which vertices run together in a **process
group** (what an Airflow DAG runs as one task). Pure: :func:`plan` turns the declared graph and a
layout into an immutable :class:`JobGraph`; nothing is read, written or run. ::

    graph = from_pipeline(pipelines.get("transfers"))
    job = plan(graph)                        # Layout.CHAINED: one process group, "all"
    [(e.sender, e.receiver, e.reasons, e.channel_log) for e in job.edges]
    # [('source', 'bank', (CutReason.INPUTS,), 'source_bank'), ('bank', 'bank', (CutReason.CYCLE,), 'bank_bank')]
    job = plan(graph, Layout.PER_VERTEX)     # the Airflow layout: groups "source" and "bank"
    job.group("source").writes[0].channel_log            # 'source_bank', today's channel log
    plan(graph, {"source": "ingest", "bank": "ingest"}, lagging=[("bank", 1)])

**Chained or cut.** An edge is cut, for every reason that holds (:class:`CutReason`, in this
order): ``processes`` (sender and receiver in two process groups), ``cycle`` (a feedback edge: its
records come back after the barrier went out, so they are read from a log and an unaligned
checkpoint logs them as channel state), ``lagging`` (the receiver's input lags, as
``--lagging-sources`` makes it: its records reach it a step late), ``inputs`` (another input of
the receiver is cut: an operator reads all its inputs in-process or all from logs, so its barrier
handlers align over every channel alike) and ``sender`` (the sender reads its inputs from logs:
its subtasks snapshot one by one, so what each sends leaves it per subtask, with its barrier
between what it sent before and after its snapshot). Every other edge is chained. The vertices
that read their inputs from logs are :attr:`JobGraph.gated`: each runs a gate of barrier handlers
(:mod:`checkpoint_lib.spark.vertices.gate`); the others run in one Spark plan per step from the
sources.
A cut edge's channel log is named by :func:`checkpoint_lib.layout.channel_names` over every edge of
the graph, so an edge's name never depends on the layout: ``<sender>_<receiver>``, qualified as
``<sender>.<output>-<receiver>.<input>`` where two edges would spell it alike.

**Process groups** (:class:`ProcessGroup`), ordered by their first vertex in the graph's
topological order (feedback edges ignored): each lists its vertices in that order, the cut edges it
reads and writes (a feedback or lagging edge inside a group: both), its sources (a group with one
plans the steps) and its sinks, and its **chains** (:class:`Chain`): the connected components of
its chained edges, each one Spark plan per step. Every vertex's subtasks align barriers over all
their input channels, chained or read from a log, whatever vertex they come from.

**Layouts** (:class:`Layout`):

- ``chained`` (the default): every vertex in one group, :data:`ALL` (today's ``--stage all``);
- ``stages``: the sources in group :data:`SOURCE_STAGE`, the operators in :data:`KEYED_STAGE`:
  today's two stage processes (``checkpoint_lib.spark.runner.STAGES``), so a lowered linear
  pipeline keeps its stage names (its sessions and DAG task ids);
- ``per_vertex``: each operator its own group, named by its id, and the sources one group (named by
  the source's id, or ``sources`` when there are several: a step is planned across all of them):
  the Airflow layout of a graph. For a lowered linear pipeline it cuts what ``stages`` cuts; the
  source stage is the group ``source`` (the source vertex's id) and the keyed stage the group named
  by the operator's uid (``bank``).

A lowered linear pipeline under ``chained`` has its source edge chained (cut ``lagging`` when its
operator's input lags: ``lagging=[(uid, 1)]`` is ``lagging_sources > 0``), and ``transfers``'
feedback edge cut (``cycle``) and so its source edge too (``inputs``), as the linear runner does
(``PipelineRunner.chained``); under ``stages`` or ``per_vertex`` both are cut, their logs named
exactly as today's (``source_<uid>``, ``<uid>_<uid>``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..layout import channel_log, channel_name, channel_names, check_name
from ..objectstore import ObjectUri
from .model import Edge, SourceVertex, StreamGraph
from .validation import Problems, validate

ALL = "all"
"""The one process group of :attr:`Layout.CHAINED` (the runner's ``stage="all"``)."""
SOURCE_STAGE = "source"
"""The process group of the sources under :attr:`Layout.STAGES` (the runner's source stage)."""
KEYED_STAGE = "keyed"
"""The process group of the operators under :attr:`Layout.STAGES` (the runner's keyed stage)."""
SOURCES = "sources"
"""The process group of a graph's sources under :attr:`Layout.PER_VERTEX` when it has several."""


class Layout(StrEnum):
    """A named assignment of vertices to process groups (see the module)."""

    CHAINED = "chained"
    """Every vertex in group :data:`ALL`: one process, every edge but the feedback ones chained."""
    STAGES = "stages"
    """Sources in :data:`SOURCE_STAGE`, operators in :data:`KEYED_STAGE`: today's two stages."""
    PER_VERTEX = "per_vertex"
    """Each operator its own group, named by its id, and the sources one group (named by the source's
    id, or :data:`SOURCES` when there are several: a step is planned across all sources, at one
    commit time, and every checkpoint's barrier enters at all of them): the Airflow layout."""

    def processes(self, graph: StreamGraph) -> dict[str, str]:
        """Vertex id -> process group, for every vertex of ``graph`` (in declaration order)."""
        if self is Layout.CHAINED:
            return {v.id: ALL for v in graph.vertices}
        if self is Layout.STAGES:
            return {v.id: SOURCE_STAGE if isinstance(v, SourceVertex) else KEYED_STAGE for v in graph.vertices}
        sources = [v.id for v in graph.vertices if isinstance(v, SourceVertex)]
        together = sources[0] if len(sources) == 1 else SOURCES
        return {v.id: together if isinstance(v, SourceVertex) else v.id for v in graph.vertices}

    @classmethod
    def of_stage(cls, stage: str) -> "Layout":
        """The layout a process runs a graph's group ``stage`` of (``ckpt run --stage``, an Airflow
        task): :data:`ALL` is the chained layout's one group, any other name a group of the
        per-vertex layout."""
        return cls.CHAINED if stage == ALL else cls.PER_VERTEX


class CutReason(StrEnum):
    """Why an edge is cut by a channel log (every reason that holds, in this order)."""

    PROCESSES = "processes"
    """Sender and receiver run in separate process groups."""
    UNCHAINED = "unchained"
    """Chaining is off (Flink's ``disableOperatorChaining``, ``ckpt run --no-chaining``): every edge
    goes through a channel log, in one process as across processes (the Airflow layout's data path)."""
    CYCLE = "cycle"
    """A feedback edge (``iterate()``): its records come back after the barrier."""
    LAGGING = "lagging"
    """The receiver's input lags: its records reach it a step after the others'."""
    INPUTS = "inputs"
    """Another input of the receiver is cut: an operator reads all its inputs in-process, or all
    from channel logs (its barrier handlers then align over every channel alike)."""
    SENDER = "sender"
    """The sender reads its inputs from channel logs: its subtasks snapshot one by one, so what each
    sends leaves it per subtask, its barrier between what it sent before and after its snapshot."""


@dataclass(frozen=True, order=True)
class Input:
    """Input ``input`` (1, or 2 of a two-input operator) of vertex ``vertex``."""

    vertex: str
    input: int = 1


@dataclass(frozen=True)
class JobEdge:
    """A declared :class:`~.model.Edge` as it runs: chained (``reasons`` empty, no channel log) or
    cut for ``reasons`` through the channel log named ``channel_log``."""

    edge: Edge
    reasons: tuple[CutReason, ...] = ()
    channel_log: str | None = None

    @property
    def sender(self) -> str:
        return self.edge.sender

    @property
    def receiver(self) -> str:
        return self.edge.receiver

    @property
    def output(self) -> str:
        return self.edge.output

    @property
    def input(self) -> int:
        return self.edge.input

    @property
    def feedback(self) -> bool:
        return self.edge.feedback

    @property
    def chained(self) -> bool:
        return not self.reasons

    @property
    def cut(self) -> bool:
        return bool(self.reasons)

    def log(self, root: str | os.PathLike[str]) -> Path | ObjectUri:
        """Where this cut edge's channel log lives under the checkpoint root ``root``
        (:func:`checkpoint_lib.layout.channel_log`); ValueError for a chained edge, which has none."""
        if self.channel_log is None:
            raise ValueError(f"edge {self.sender} -> {self.receiver} is chained: it has no channel log")
        qualified = self.channel_log != channel_name(self.sender, self.receiver)
        return channel_log(root, self.sender, self.receiver, *((self.output, self.input) if qualified else ()))


@dataclass(frozen=True)
class Chain:
    """Vertices of one process group joined by chained edges: one Spark plan per step.
    ``vertices`` in topological order, ``edges`` its chained edges, ``reads`` / ``writes`` the cut
    edges into and out of it (declaration order)."""

    vertices: tuple[str, ...]
    edges: tuple[JobEdge, ...] = ()
    reads: tuple[JobEdge, ...] = ()
    writes: tuple[JobEdge, ...] = ()


@dataclass(frozen=True)
class ProcessGroup:
    """The vertices one process runs (see the module): ``vertices`` in topological order, its
    ``chains``, the cut edges it ``reads`` and ``writes``, its ``sources`` and ``sinks`` (names)."""

    name: str
    vertices: tuple[str, ...]
    chains: tuple[Chain, ...]
    reads: tuple[JobEdge, ...] = ()
    writes: tuple[JobEdge, ...] = ()
    sources: tuple[str, ...] = ()
    sinks: tuple[str, ...] = ()

    @property
    def plans_steps(self) -> bool:
        """Whether it holds a source: it plans the steps (and the coordinator injects barriers there)."""
        return bool(self.sources)


@dataclass(frozen=True)
class ChannelMap:
    """How a gated vertex numbers its input channels across its input edges (one barrier handler
    per subtask aligns over all of them): edge ``i`` (its position in ``edges``, declaration
    order) from a sender of ``senders[i]`` subtasks; sender ``s`` of edge ``i`` is channel
    ``offset(i) + s``. Pure."""

    edges: tuple[str, ...]
    senders: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.edges) != len(self.senders) or any(n < 1 for n in self.senders):
            raise ValueError(f"a channel map needs one sender parallelism >= 1 per edge, got {self.edges} "
                             f"and {self.senders}")

    @property
    def channels(self) -> int:
        """How many input channels each subtask has."""
        return sum(self.senders)

    def offset(self, edge: int) -> int:
        return sum(self.senders[:edge])

    def channel(self, edge: int, sender: int) -> int:
        """The channel of sender ``sender`` of edge ``edge``."""
        if not 0 <= sender < self.senders[edge]:
            raise ValueError(f"edge {self.edges[edge]} has senders 0..{self.senders[edge] - 1}, not {sender}")
        return self.offset(edge) + sender

    def edge_of(self, channel: int) -> tuple[int, int]:
        """``(edge, sender)`` of channel ``channel``."""
        for edge, n in enumerate(self.senders):
            if channel < n:
                return edge, channel
            channel -= n
        raise ValueError(f"channel out of range: the edges {', '.join(self.edges)} have {self.channels} channels")


class PlanError(Problems):
    """A layout that does not fit its graph; ``problems`` lists every one, one sentence each."""

    one = "cannot be planned"
    many = "cannot be planned, {n} problems"


@dataclass(frozen=True)
class JobGraph:
    """A :class:`~.model.StreamGraph` planned (:func:`plan`): ``processes`` (vertex id -> group, in
    declaration order), the ``lagging`` inputs, every edge as a :class:`JobEdge` (declaration
    order) and the process ``groups`` (ordered by their first vertex, topologically); ``chaining``
    off cuts every edge."""

    graph: StreamGraph
    processes: Mapping[str, str]
    lagging: tuple[Input, ...]
    edges: tuple[JobEdge, ...]
    groups: tuple[ProcessGroup, ...]
    chaining: bool = True

    def group(self, name: str) -> ProcessGroup:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"the plan of graph {self.graph.name!r} has no process group {name!r} "
                       f"({', '.join(g.name for g in self.groups)})")

    def group_of(self, vertex_id: str) -> ProcessGroup:
        """The process group vertex ``vertex_id`` runs in."""
        if vertex_id not in self.processes:
            raise KeyError(f"graph {self.graph.name!r} has no vertex {vertex_id!r}")
        return self.group(self.processes[vertex_id])

    @property
    def gated(self) -> tuple[str, ...]:
        """The vertices that read their inputs from channel logs (every input cut: a gate of barrier
        handlers over all their channels), in the graph's topological order; every other operator
        reads all its inputs in-process."""
        readers = {e.receiver for e in self.edges if e.cut}
        return tuple(v.id for v in self.graph.topological_order() if v.id in readers)

    def channel_map(self, vertex_id: str) -> ChannelMap:
        """How gated vertex ``vertex_id`` numbers its input channels (:class:`ChannelMap`)."""
        if vertex_id not in self.gated:
            raise ValueError(f"vertex {vertex_id!r} of graph {self.graph.name!r} reads its inputs in-process: it "
                             "has no channels of logs to number")
        into = self.inputs_of(vertex_id)
        return ChannelMap(tuple(e.channel_log for e in into),
                          tuple(self.graph.vertex(e.sender).parallelism for e in into))

    def inputs_of(self, vertex_id: str) -> tuple[JobEdge, ...]:
        """The edges into ``vertex_id`` (declaration order)."""
        return tuple(e for e in self.edges if e.receiver == vertex_id)

    def outputs_of(self, vertex_id: str) -> tuple[JobEdge, ...]:
        """The edges out of ``vertex_id`` (declaration order)."""
        return tuple(e for e in self.edges if e.sender == vertex_id)

    @property
    def chained(self) -> tuple[JobEdge, ...]:
        return tuple(e for e in self.edges if e.chained)

    @property
    def cut(self) -> tuple[JobEdge, ...]:
        return tuple(e for e in self.edges if e.cut)

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON (stable: keys are only ever added)::

            {"graph": "transfers",
             "processes": {"source": "source", "bank": "bank"},      # vertex -> group
             "lagging": [{"vertex": "bank", "input": 1}],
             "chaining": true,                                      # false: every edge cut
             "edges": [   # in declaration order
               {"from": "source", "output": "records", "to": "bank", "input": 1, "feedback": false,
                "chained": false, "reasons": ["processes", "lagging"], "channel_log": "source_bank"}, ...],
                          # reasons: processes | unchained | cycle | lagging | inputs | sender;
                          # channel_log: null when chained
             "groups": [  # ordered by their first vertex
               {"name": "source", "vertices": ["source"], "sources": ["source"], "sinks": [],
                "chains": [["source"]], "reads": [], "writes": ["source_bank"]}, ...]}
                          # reads, writes: channel-log names
        """
        return {
            "graph": self.graph.name,
            "processes": dict(self.processes),
            "lagging": [{"vertex": i.vertex, "input": i.input} for i in self.lagging],
            "chaining": self.chaining,
            "edges": [{"from": e.sender, "output": e.output, "to": e.receiver, "input": e.input,
                       "feedback": e.feedback, "chained": e.chained, "reasons": [str(r) for r in e.reasons],
                       "channel_log": e.channel_log} for e in self.edges],
            "groups": [{"name": g.name, "vertices": list(g.vertices), "sources": list(g.sources),
                        "sinks": list(g.sinks), "chains": [list(c.vertices) for c in g.chains],
                        "reads": [e.channel_log for e in g.reads], "writes": [e.channel_log for e in g.writes]}
                       for g in self.groups],
        }

    @classmethod
    def from_dict(cls, graph: StreamGraph, doc: Mapping[str, Any]) -> "JobGraph":
        """The plan ``doc`` (:meth:`to_dict`) describes, planned again from ``graph`` with its
        processes and lagging inputs; ValueError if ``doc`` is not exactly that plan (another
        graph, or a graph changed since the document was written)."""
        if doc.get("graph") != graph.name:
            raise ValueError(f"the plan document is of graph {doc.get('graph')!r}, not {graph.name!r}")
        try:
            processes = dict(doc["processes"])
            lagging = [(i["vertex"], i["input"]) for i in doc["lagging"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"the plan document of graph {graph.name!r} is malformed: {exc!r}") from None
        doc = {**doc, "chaining": doc.get("chaining", True)}  # a document from before the key: chained
        job = plan(graph, processes, lagging=lagging, chaining=bool(doc["chaining"]))
        if job.to_dict() != doc:
            differ = [k for k, v in job.to_dict().items() if doc.get(k) != v]
            raise ValueError(f"the plan document does not match graph {graph.name!r} planned with its processes: "
                             f"its {', '.join(differ) or 'keys'} differ (was the graph changed since?)")
        return job


def plan(graph: StreamGraph, processes: Mapping[str, str] | Layout | str | None = None, *,
         lagging: Iterable[Input | tuple[str, int] | str] = (), chaining: bool = True) -> JobGraph:
    """``graph`` (validated first: :class:`~.validation.GraphError`) as the runtime executes it.

    ``processes``: vertex id -> process-group name (a :func:`~checkpoint_lib.layout.check_name`
    name) for every vertex, or a :class:`Layout` (or its name); None is :attr:`Layout.CHAINED`.
    ``lagging``: the inputs that lag, each an :class:`Input`, a ``(vertex, input)`` pair, or a
    vertex id (all its inputs). ``chaining`` False cuts every edge (:attr:`CutReason.UNCHAINED`).
    A map naming an unknown vertex or leaving one out, a bad group
    name, a lagging input the graph does not have: one :class:`PlanError` (a ``ValueError``)
    listing every problem."""
    validate(graph)
    assignment, found = _assignment(graph, processes)
    lags, more = _lagging(graph, lagging)
    found += more
    if found:
        raise PlanError(graph.name, found)
    lagging_inputs = set(lags)
    names = dict(zip(graph.edges, channel_names((e.sender, e.output, e.receiver, e.input) for e in graph.edges)))
    order = [v.id for v in graph.topological_order()]
    reasons_of: dict[Edge, tuple[CutReason, ...]] = {}
    logged: set[str] = set()  # the vertices that read their inputs from channel logs
    for vertex_id in order:  # a sender is decided before its receivers (a feedback edge is cut anyway)
        into = [e for e in graph.edges if e.receiver == vertex_id]
        holds = {e: {CutReason.PROCESSES: assignment[e.sender] != assignment[e.receiver],
                     CutReason.UNCHAINED: not chaining,
                     CutReason.CYCLE: e.feedback,
                     CutReason.LAGGING: Input(e.receiver, e.input) in lagging_inputs,
                     CutReason.SENDER: e.sender in logged} for e in into}
        if any(any(h.values()) for h in holds.values()):
            logged.add(vertex_id)
            for h in holds.values():
                h[CutReason.INPUTS] = not any(h.values())
        for e, h in holds.items():
            reasons_of[e] = tuple(r for r in CutReason if h.get(r))
    edges = [JobEdge(e, reasons_of[e], names[e] if reasons_of[e] else None) for e in graph.edges]
    groups = tuple(_group(graph, name, [v for v in order if assignment[v] == name], edges)
                   for name in dict.fromkeys(assignment[v] for v in order))
    return JobGraph(graph, assignment, lags, tuple(edges), groups, chaining)


def _assignment(graph: StreamGraph, processes: Any) -> tuple[dict[str, str], list[str]]:
    """Vertex id -> group (declaration order) and the problems of the map."""
    if processes is None:
        processes = Layout.CHAINED
    if isinstance(processes, str):
        try:
            processes = Layout(processes)
        except ValueError:
            raise ValueError(f"processes {processes!r} is not a layout ({', '.join(Layout)}): give a Layout or "
                             "a mapping vertex id -> process group") from None
        return processes.processes(graph), []
    if not isinstance(processes, Mapping):
        raise TypeError(f"processes must be a Layout or a mapping vertex id -> process group, got "
                        f"{type(processes).__name__}")
    ids = [v.id for v in graph.vertices]
    found = []
    unknown = [k for k in processes if k not in ids]
    if unknown:
        found.append(f"the process map names {_listing(unknown, 'vertex', 'vertices')} that graph {graph.name!r} "
                     f"does not have (its vertices: {', '.join(ids)})")
    missing = [i for i in ids if i not in processes]
    if missing:
        found.append(f"the process map leaves out {_listing(missing, 'vertex', 'vertices')}: every vertex runs in "
                     "one process group")
    bad: dict[str, str] = {}
    for i in ids:
        if i in processes:
            try:
                check_name("process group name", processes[i])
            except ValueError as exc:
                bad.setdefault(str(exc), i)
    found += [f"vertex {vertex!r}: {message}" for message, vertex in bad.items()]
    return {i: processes[i] for i in ids if i in processes}, found


def _listing(names: list[Any], word: str, words: str) -> str:
    return f"{word if len(names) == 1 else words} {', '.join(repr(n) for n in names)}"


def _lagging(graph: StreamGraph, items: Iterable[Any]) -> tuple[tuple[Input, ...], list[str]]:
    """The lagging inputs, in the vertices' declaration order, and the problems of ``items``."""
    if isinstance(items, (str, Input)) or (isinstance(items, tuple) and len(items) == 2
                                           and isinstance(items[0], str) and isinstance(items[1], int)):
        items = [items]  # one input given alone: "bank", Input("bank"), ("bank", 1)
    position = {v.id: n for n, v in enumerate(graph.vertices)}
    found: set[Input] = set()
    problems = []
    for item in items:
        if isinstance(item, Input):
            vertex, number = item.vertex, item.input
        elif isinstance(item, str):
            vertex, number = item, None
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            vertex, number = item
        else:
            problems.append(f"lagging input {item!r}: give a vertex id or a (vertex, input) pair")
            continue
        shown = f"lagging input {vertex!r}" if number is None else f"lagging input ({vertex!r}, {number!r})"
        if not isinstance(vertex, str) or vertex not in position:
            problems.append(f"{shown}: graph {graph.name!r} has no vertex {vertex!r}")
            continue
        receiver = graph.vertex(vertex)
        if isinstance(receiver, SourceVertex):
            problems.append(f"{shown}: {vertex!r} is a source, and a source has no inputs (name the input of the "
                            "operator its records reach late)")
            continue
        inputs = range(1, receiver.inputs + 1)
        if number is not None and (isinstance(number, bool) or not isinstance(number, int) or number not in inputs):
            has = "inputs 1 and 2" if receiver.inputs == 2 else "one input (1)"
            problems.append(f"{shown}: operator {vertex!r} has {has}")
            continue
        found.update(Input(vertex, n) for n in (inputs if number is None else [number]))
    return tuple(sorted(found, key=lambda i: (position[i.vertex], i.input))), problems


def _group(graph: StreamGraph, name: str, members: list[str], edges: list[JobEdge]) -> ProcessGroup:
    """Process group ``name`` of ``members`` (in topological order)."""
    inside = set(members)
    chains = _chains(members, [e for e in edges if e.chained and e.sender in inside], edges)
    return ProcessGroup(
        name, tuple(members), chains,
        reads=tuple(e for e in edges if e.cut and e.receiver in inside),
        writes=tuple(e for e in edges if e.cut and e.sender in inside),
        sources=tuple(v for v in members if isinstance(graph.vertex(v), SourceVertex)),
        sinks=tuple(s.name for s in graph.sinks if s.vertex in inside))


def _chains(members: list[str], chained: list[JobEdge], edges: list[JobEdge]) -> tuple[Chain, ...]:
    """The connected components of ``chained`` over ``members`` (each in topological order), ordered
    by their first vertex."""
    root = {v: v for v in members}

    def find(v: str) -> str:
        while root[v] != v:
            root[v] = root[root[v]]
            v = root[v]
        return v

    for e in chained:
        root[find(e.sender)] = find(e.receiver)
    components: dict[str, list[str]] = {}
    for v in members:
        components.setdefault(find(v), []).append(v)
    chains = []
    for vertices in components.values():
        part = set(vertices)
        chains.append(Chain(tuple(vertices), tuple(e for e in chained if e.sender in part),
                            tuple(e for e in edges if e.cut and e.receiver in part),
                            tuple(e for e in edges if e.cut and e.sender in part)))
    return tuple(chains)

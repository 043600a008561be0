"""Whether a :class:`~.model.StreamGraph` is well formed: every rule checked, every problem reported
at once in one :class:`GraphError` (a ``ValueError``), one line each.

- **names**: the graph, source names, operator uids, sink names and output names follow the name
  rule of :func:`checkpoint_lib.layout.check_name` (each becomes a path segment);
- **unique ids**: no uid (or source name) twice, no vertex named like another of the other kind,
  no sink name twice (a snapshot finds state and transactions by them);
- **parallelism** within ``1..max_parallelism`` (:func:`~checkpoint_lib.core.keygroups.check_parallelism`),
  the same on both sides of a ``forward`` edge;
- **a source's ahead bound** (:class:`~.model.AheadBound`) on one of its timestamp columns, positive;
- **edges** between declared vertices, each once (one channel log an edge), none into a source, into an input the receiver has, a key
  exactly on ``hash`` edges, a key that is a column of a source's records (when they are known);
- **operators**: every input fed by a non-feedback edge; a keyed operator's inputs all ``hash`` by
  the same column (of the same type when known: both inputs of a two-input operator included);
  a stateless one without ``hash`` inputs or keyed state;
- **cycles** only through a feedback edge (``iterate()``), and every feedback edge closes one; no
  sink writing a table a source of the graph reads;
- **sinks**: at least one, every vertex with a path to one (dead letters do not count), each table
  the target of one sink or dead-letter output, at most one dead-letter table per vertex.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Iterable

from ..core.keygroups import check_parallelism
from ..layout import check_name
from ..pipeline import check_relative_path, is_timestamp, same_table
from ..reserved import SINK_COLUMNS, check_columns
from ..schema import columns
from .model import RECORDS, AheadBound, Edge, OperatorKind, OperatorVertex, Partitioning, SourceVertex, StreamGraph, Vertex

_TYPE_ALIASES = {"bigint": "long", "integer": "int", "smallint": "short", "tinyint": "byte", "real": "float",
                 "dec": "decimal", "numeric": "decimal"}


class Problems(ValueError):
    """Every problem found with graph ``graph`` (``problems``, one sentence each), in one message:
    one problem on one line, several as a list. Subclasses say what was found (:attr:`one`,
    :attr:`many`, the latter formatted with the count ``n``)."""

    one = "is invalid"
    many = "has {n} problems"

    def __init__(self, graph: str, problems: Iterable[str]):
        self.graph, self.problems = graph, tuple(problems)
        if len(self.problems) == 1:
            message = f"graph {graph!r} {self.one}: {self.problems[0]}"
        else:
            message = f"graph {graph!r} {self.many.format(n=len(self.problems))}:\n" + "\n".join(
                f"  - {p}" for p in self.problems)
        super().__init__(message)


class GraphError(Problems):
    """A graph that is not well formed; ``problems`` lists every rule it breaks, one sentence each."""


def validate(graph: StreamGraph) -> StreamGraph:
    """``graph`` if it is well formed, else a :class:`GraphError` listing every problem."""
    found = problems(graph)
    if found:
        raise GraphError(graph.name, found)
    return graph


def problems(graph: StreamGraph) -> list[str]:
    """Every rule ``graph`` breaks (see the module), in a stable order; empty when it is well formed."""
    by_id: dict[str, Vertex] = {}
    for v in graph.vertices:
        by_id.setdefault(v.id, v)
    edges = [e for e in graph.edges if e.sender in by_id and e.receiver in by_id]
    return [*_names(graph), *_parallelism(graph), *_ahead(graph), *_edges(graph, by_id),
            *_operators(graph, by_id, edges), *_cycles(graph, by_id, edges), *_outputs(graph, by_id, edges)]


def _ahead(graph: StreamGraph) -> list[str]:
    """A source's :class:`~.model.AheadBound`: a positive bound on a timestamp column it reads."""
    found = []
    for v in graph.sources:
        if v.ahead is None:
            continue
        if not isinstance(v.ahead, AheadBound):
            found.append(f"{_what(v)}: ahead must be an AheadBound, got {v.ahead!r}")
            continue
        kind = dict(getattr(v.spec, "schema", None) or {}).get(v.ahead.time_column)
        if not is_timestamp(kind):
            found.append(f"{_what(v)}: ahead's time_column {v.ahead.time_column!r} must be a timestamp column of "
                         f"the source, got {kind!r}")
        if not isinstance(v.ahead.max_ahead, timedelta) or v.ahead.max_ahead <= timedelta(0):
            found.append(f"{_what(v)}: ahead's max_ahead must be a positive timedelta, got {v.ahead.max_ahead!r}")
    return found


def _what(v: Vertex) -> str:
    return f"source {v.id!r}" if isinstance(v, SourceVertex) else f"operator {v.id!r}"


def _name_problem(kind: str, value: object) -> list[str]:
    try:
        check_name(kind, value)
    except ValueError as exc:
        return [str(exc)]
    return []


def _names(graph: StreamGraph) -> list[str]:
    found = _name_problem("graph name", graph.name)
    if not graph.sources:
        found.append("the graph has no source: declare one with source()")
    for v in graph.vertices:
        found += _name_problem("source name" if isinstance(v, SourceVertex) else "operator uid", v.id)
    for vertex_id, n in Counter(v.id for v in graph.vertices).items():
        if n == 1:
            continue
        kinds = {type(v) for v in graph.vertices if v.id == vertex_id}
        if kinds == {OperatorVertex}:
            found.append(f"operator uid {vertex_id!r} is declared {n} times: each operator needs its own uid "
                         "(a snapshot finds an operator's state by it)")
        elif kinds == {SourceVertex}:
            found.append(f"source name {vertex_id!r} is declared {n} times: each source needs its own name")
        else:
            found.append(f"{vertex_id!r} names a source and an operator: every vertex needs its own name")
    for sink in graph.sinks:
        found += _name_problem("sink name", sink.name)
    for name, n in Counter(s.name for s in graph.sinks).items():
        if n > 1:
            found.append(f"sink name {name!r} is declared {n} times: a sink's name is its operator id "
                         "(sink_<name>) and names its transactions")
    return found


def _parallelism(graph: StreamGraph) -> list[str]:
    top = graph.max_parallelism
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        return [f"max parallelism must be a whole number >= 1, got {top!r}"]
    found = []
    for v in graph.vertices:
        if isinstance(v.parallelism, bool) or not isinstance(v.parallelism, int):
            found.append(f"{_what(v)}: parallelism must be a whole number, got {v.parallelism!r}")
            continue
        try:
            check_parallelism(v.parallelism, top)
        except ValueError as exc:
            found.append(f"{_what(v)}: {exc}")
    return found


def _key_type(edge: Edge, by_id: dict[str, Vertex]) -> str | None:
    """The type of a hash edge's key column, when its sender is a source that declares it."""
    sender = by_id.get(edge.sender)
    schema = sender.record_schema if isinstance(sender, SourceVertex) else None
    if not schema or edge.key not in schema:
        return None
    kind = schema[edge.key].strip().lower()
    return _TYPE_ALIASES.get(kind, kind)


def _edges(graph: StreamGraph, by_id: dict[str, Vertex]) -> list[str]:
    found, seen = [], set()
    for e in graph.edges:
        where = f"edge {e.sender} -> {e.receiver}"
        ends = (e.sender, e.output, e.receiver, e.input)
        if ends in seen:  # one channel log per edge: two edges with the same ends would share it
            found.append(f"{where}: declared twice (output {e.output!r} into input {e.input})")
        seen.add(ends)
        missing = [x for x in (e.sender, e.receiver) if x not in by_id]
        if missing:
            found.append(f"{where}: no vertex {missing[0]!r}")
            continue
        sender, receiver = by_id[e.sender], by_id[e.receiver]
        if isinstance(receiver, SourceVertex):
            found.append(f"{where}: {e.receiver!r} is a source, and a source has no inputs")
            continue
        if e.input not in range(1, receiver.inputs + 1):
            has = "inputs 1 and 2" if receiver.inputs == 2 else "one input (1)"
            found.append(f"{where}: into input {e.input!r}, but operator {e.receiver!r} has {has}")
        if isinstance(sender, SourceVertex) and e.output != RECORDS:
            found.append(f"{where}: a source has one output, {RECORDS!r}, not {e.output!r}")
        elif isinstance(sender, OperatorVertex):
            found += [f"{where}: {p}" for p in _name_problem("output name", e.output)]
        if e.partitioning is Partitioning.HASH:
            if not e.key:
                found.append(f"{where}: a hash edge (key_by) needs its key column")
            else:
                try:
                    check_columns([e.key], f"{where}: key_by()", fix="key by a record column of another name")
                except ValueError as exc:
                    found.append(str(exc))
                schema = sender.record_schema if isinstance(sender, SourceVertex) else None
                if schema is not None and e.key not in schema:
                    found.append(f"{where}: key {e.key!r} is not a column of the records of source {e.sender!r} "
                                 f"({', '.join(sorted(schema))})")
        elif e.key is not None:
            found.append(f"{where}: only a hash edge (key_by) has a key; this one is {e.partitioning}")
        if e.partitioning is Partitioning.FORWARD and sender.parallelism != receiver.parallelism:
            found.append(f"{where}: forward() needs the same parallelism on both sides: {e.sender!r} has "
                         f"{sender.parallelism}, {e.receiver!r} has {receiver.parallelism}")
    return found


def _operators(graph: StreamGraph, by_id: dict[str, Vertex], edges: list[Edge]) -> list[str]:
    found = []
    for op in graph.operators:
        if by_id[op.id] is not op:
            continue  # a duplicated uid: reported by _names
        inputs = [e for e in edges if e.receiver == op.id]
        two = op.kind is OperatorKind.TWO_INPUT_KEYED
        for n in range(1, op.inputs + 1):
            if not any(e.input == n and not e.feedback for e in inputs):
                found.append(f"two-input operator {op.uid!r} has nothing on input {n}" if two else
                             f"operator {op.uid!r} has no input: a stream must lead to it (a feedback edge "
                             "alone cannot start it)")
        if not callable(getattr(op.operator, "apply", None)):
            found.append(f"operator {op.uid!r} needs an apply() method (see KeyedOperator and Operator)")
        if op.kind is OperatorKind.STATELESS:
            for e in inputs:
                if e.partitioning is Partitioning.HASH:
                    found.append(f"stateless operator {op.uid!r} has a key_by({e.key}) input from {e.sender!r}: "
                                 "after key_by() an operator is keyed")
            if getattr(op.operator, "state_schema", None):
                found.append(f"operator {op.uid!r} has keyed state ({op.operator.state_schema}) but no keyed input: "
                             "keyed state is partitioned by key, so use key_by()")
            continue
        for e in inputs:
            if e.partitioning is not Partitioning.HASH:
                found.append(f"keyed operator {op.uid!r} has a {e.partitioning}() input from {e.sender!r}: every "
                             "input of a keyed operator is key_by() (its state is partitioned by key)")
        keyed = [e for e in inputs if e.partitioning is Partitioning.HASH and e.key]
        found += _keys_alike(op, keyed, by_id)
    return found


def _keys_alike(op: OperatorVertex, keyed: list[Edge], by_id: dict[str, Vertex]) -> list[str]:
    """Every input of a keyed operator keyed by one column, of one type where it is known."""
    two = op.kind is OperatorKind.TWO_INPUT_KEYED
    prefix = "two-input operator" if two else "keyed operator"
    rule = ("both inputs of a two-input keyed operator must be keyed by the same column of the same type (one "
            "keyed state, as Flink's KeyedCoProcessFunction)" if two else
            "every input of a keyed operator must be keyed by the same column of the same type (one keyed state)")

    def origin(e: Edge) -> str:
        return f"from {e.sender}" + (f", input {e.input}" if two else "") + (", feedback" if e.feedback else "")

    if len({e.key for e in keyed}) > 1:
        listing = ", ".join(f"{e.key!r} ({origin(e)})" for e in keyed)
        return [f"{prefix} {op.uid!r} has inputs keyed differently: {listing}: {rule}"]
    typed = [(e, _key_type(e, by_id)) for e in keyed]
    if len({t for _, t in typed if t is not None}) > 1:
        listing = ", ".join(f"{t} ({origin(e)})" for e, t in typed if t is not None)
        return [f"{prefix} {op.uid!r} has inputs keyed by {keyed[0].key!r} of different types: {listing}: {rule}"]
    return []


def _reaches(start: str, goal: str, edges: list[Edge]) -> bool:
    """Whether ``goal`` is reachable from ``start`` over ``edges``."""
    seen, todo = {start}, [start]
    while todo:
        at = todo.pop()
        if at == goal:
            return True
        for e in edges:
            if e.sender == at and e.receiver not in seen:
                seen.add(e.receiver)
                todo.append(e.receiver)
    return False


def _cycle_from(start: str, edges: list[Edge]) -> list[str] | None:
    """The shortest cycle through ``start`` over ``edges``, as ``[start, ..., start]``, or None."""
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for e in edges:
            if e.sender != path[-1]:
                continue
            if e.receiver == start:
                return path + [start]
            if e.receiver not in seen:
                seen.add(e.receiver)
                paths.append(path + [e.receiver])
    return None


def _cycles(graph: StreamGraph, by_id: dict[str, Vertex], edges: list[Edge]) -> list[str]:
    found = []
    forward = [e for e in edges if not e.feedback]
    on_a_cycle: set[str] = set()
    for vertex_id in by_id:
        if vertex_id in on_a_cycle:
            continue
        cycle = _cycle_from(vertex_id, forward)
        if cycle:
            on_a_cycle.update(cycle)
            found.append(f"cycle {' -> '.join(cycle)} is not closed by iterate(): only a feedback edge may lead "
                         "back (checkpoints log the records in flight on it as channel state)")
    for e in edges:
        if e.feedback and e.sender != e.receiver and not _reaches(e.receiver, e.sender, forward):
            found.append(f"edge {e.sender} -> {e.receiver} is declared with iterate() but closes no cycle: "
                         f"{e.receiver!r} does not lead to {e.sender!r} (use process() for an edge forward)")
    for sink in graph.sinks:
        for source in graph.sources:
            path = getattr(source.spec, "path", None)
            target = getattr(sink.spec, "path", None)
            if isinstance(path, str) and isinstance(target, str) and same_table(path, target):
                found.append(f"sink {sink.name!r} writes {target}, which source {source.name!r} reads: a graph that "
                             "reads its own output is a cycle; use iterate() for a feedback edge")
    return found


def _outputs(graph: StreamGraph, by_id: dict[str, Vertex], edges: list[Edge]) -> list[str]:
    found = []
    for sink in graph.sinks:
        vertex = by_id.get(sink.vertex)
        if vertex is None:
            found.append(f"sink {sink.name!r}: no vertex {sink.vertex!r}")
        elif isinstance(vertex, SourceVertex) and sink.output != RECORDS:
            found.append(f"sink {sink.name!r}: a source has one output, {RECORDS!r}, not {sink.output!r}")
        elif isinstance(vertex, OperatorVertex):
            found += [f"sink {sink.name!r}: {p}" for p in _name_problem("output name", sink.output)]
        schema = getattr(sink.spec, "schema", None)
        if schema is not None:
            try:
                check_columns([c for c, _ in columns(schema)], f"sink {sink.name!r}", SINK_COLUMNS,
                              fix="name the sink's column otherwise")
            except ValueError as exc:
                found.append(str(exc))
    if not graph.sinks:
        found.append("the graph has no sink: declare one with sink()")
    else:
        reached = {s.vertex for s in graph.sinks}
        for vertex_id in by_id:
            if vertex_id not in reached and not any(_reaches(vertex_id, r, edges) for r in reached):
                found.append(f"{_what(by_id[vertex_id])} has no path to a sink: what it emits is never written "
                             "(give it a sink(), or an edge toward one)")
    found += _tables(graph, by_id)
    return found


def _tables(graph: StreamGraph, by_id: dict[str, Vertex]) -> list[str]:
    """Each table the target of one sink or one vertex's dead letters."""
    found = []
    targets: list[tuple[str, str]] = []  # (who, path)
    for sink in graph.sinks:
        path = getattr(sink.spec, "path", None)
        if isinstance(path, str):
            targets.append((f"sink {sink.name!r}", path))
    for vertex_id, n in Counter(d.vertex for d in graph.dead_letters).items():
        if vertex_id not in by_id:
            found.append(f"dead letters: no vertex {vertex_id!r}")
        elif n > 1:
            found.append(f"{_what(by_id[vertex_id])} has {n} dead-letter tables: a vertex has one")
    for d in graph.dead_letters:
        try:
            check_relative_path(d.path)
        except ValueError as exc:
            found.append(f"the dead letters of {d.vertex!r}: {exc}")
        targets.append((f"the dead letters of {d.vertex!r}", d.path))
    for i, (who, path) in enumerate(targets):
        for other, other_path in targets[:i]:
            if same_table(path, other_path):
                found.append(f"{other} and {who} both write {path}: a table is the target of one sink (each "
                             "rolls its table back on its own)")
    return found

"""Drawing a :class:`~.model.StreamGraph`: :func:`to_text` for people, :func:`to_dot` for Graphviz
(``ckpt graph P -o dot | dot -Tsvg > p.svg``), :func:`to_dict` for machines (``-o json``).

The JSON document (stable: keys are only ever added)::

    {"name": "transfers", "max_parallelism": 128,
     "vertices": [   # in declaration order
       {"id": "source", "kind": "source", "parallelism": 2,
        "reads": {"type": "DeltaSource", "path": "landing/transfers"},
        "bootstrap": "landing/accounts", "maps": ["_debits"]},         # bootstrap: null when none
       {"id": "bank", "kind": "keyed", "parallelism": 3, "operator": "Bank", "inputs": 1}],
                     # kind: source | stateless | keyed | two_input_keyed
     "edges": [
       {"from": "source", "output": "records", "to": "bank", "input": 1,
        "partitioning": "hash", "key": "account", "feedback": false},
       {"from": "bank", "output": "feedback", "to": "bank", "input": 1,
        "partitioning": "hash", "key": "account", "feedback": true}],
                     # partitioning: hash | rebalance | broadcast | forward; key: null unless hash
     "sinks": [{"name": "account_balances", "vertex": "bank", "output": "account_balances",
                "type": "DeltaSink", "path": "gold/account_balances", "mode": "upsert", "keys": ["account"]}],
     "dead_letters": [{"vertex": "source", "path": "dlq/transfers"}]}

A spec of another kind than Delta's gives its ``type`` and, when it has them, ``path``, ``mode``
and ``keys``.
"""

from __future__ import annotations

from typing import Any

from .model import MAIN, RECORDS, Edge, OperatorVertex, SourceVertex, StreamGraph, Vertex, VertexSink


NL = "\n"


def _count(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {words or word + 's'}"


def _spec(spec: Any) -> dict[str, Any]:
    """What a source or sink declaration reads or writes: its type, path, mode and keys when it has them."""
    out: dict[str, Any] = {"type": type(spec).__name__}
    for name in ("path", "mode"):
        if isinstance(getattr(spec, name, None), str):
            out[name] = getattr(spec, name)
    if getattr(spec, "keys", None) is not None and not callable(spec.keys):
        out["keys"] = list(spec.keys)
    return out


def _kind(v: Vertex) -> str:
    return "source" if isinstance(v, SourceVertex) else str(v.kind)


def _kind_words(v: OperatorVertex) -> str:
    """``keyed``, ``two-input keyed``...: an operator's kind for people."""
    return str(v.kind).replace("two_input_", "two-input ")


def to_dict(graph: StreamGraph) -> dict[str, Any]:
    """The graph as the JSON document the module describes."""
    vertices = []
    for v in graph.vertices:
        row: dict[str, Any] = {"id": v.id, "kind": _kind(v), "parallelism": v.parallelism}
        if isinstance(v, SourceVertex):
            row["reads"] = _spec(v.spec)
            row["bootstrap"] = getattr(v.bootstrap, "path", None) if v.bootstrap is not None else None
            row["maps"] = [m.name for m in v.maps]
        else:
            row["operator"], row["inputs"] = v.operator_name, v.inputs
        vertices.append(row)
    return {
        "name": graph.name,
        "max_parallelism": graph.max_parallelism,
        "vertices": vertices,
        "edges": [{"from": e.sender, "output": e.output, "to": e.receiver, "input": e.input,
                   "partitioning": str(e.partitioning), "key": e.key, "feedback": e.feedback} for e in graph.edges],
        "sinks": [{"name": s.name, "vertex": s.vertex, "output": s.output, **_spec(s.spec)} for s in graph.sinks],
        "dead_letters": [{"vertex": d.vertex, "path": d.path} for d in graph.dead_letters],
    }


def shape(graph: StreamGraph) -> str:
    """One line: ``2 vertices, 2 edges (1 feedback), 1 sink``."""
    feedback = sum(e.feedback for e in graph.edges)
    return (f"{_count(len(graph.vertices), 'vertex', 'vertices')}, "
            f"{_count(len(graph.edges), 'edge')}{f' ({feedback} feedback)' if feedback else ''}, "
            f"{_count(len(graph.sinks), 'sink')}")


def _target(spec: Any) -> str:
    """``gold/balances (upsert by account)``: where a sink writes."""
    d = _spec(spec)
    how = d.get("mode")
    if how == "upsert" and d.get("keys"):
        how = f"upsert by {', '.join(d['keys'])}"
    where = d.get("path", d["type"])
    return f"{where} ({how})" if how else where


def _edge_text(graph: StreamGraph, e: Edge) -> str:
    receiver = next((v for v in graph.vertices if v.id == e.receiver), None)
    into = f" input {e.input}" if receiver is not None and receiver.inputs == 2 else ""
    notes = [e.describe()]
    if e.output not in (RECORDS, MAIN):
        notes.append(f"output {e.output}")
    if e.feedback:
        notes.append("feedback (iterate)")
    return f"-> {e.receiver}{into}: {', '.join(notes)}"


def _sink_text(s: VertexSink) -> str:
    output = f", output {s.output}" if s.output not in (s.name, RECORDS) else ""
    return f"sink {s.name}: {_target(s.spec)}{output}"


def to_text(graph: StreamGraph) -> str:
    """A layered list a person reads: the vertices in topological order, each with what it reads,
    its edges out (partitioning, key), its sinks and dead letters."""
    lines = [f"{graph.name}: {shape(graph)}", ""]
    for v in graph.topological_order():
        if isinstance(v, SourceVertex):
            lines.append(f"{v.id} (source, parallelism {v.parallelism})")
            reads = _spec(v.spec)
            line = f"  reads {reads.get('path', reads['type'])} ({reads['type']})" if "path" in reads else \
                f"  reads {reads['type']}"
            if v.bootstrap is not None:
                line += f", bootstrap {getattr(v.bootstrap, 'path', type(v.bootstrap).__name__)}"
            lines.append(line)
            if v.maps:
                lines.append(f"  maps: {', '.join(m.name for m in v.maps)}")
        else:
            lines.append(f"{v.id} ({_kind_words(v)} {v.operator_name}, parallelism {v.parallelism})")
        lines += [f"  {_edge_text(graph, e)}" for e in graph.outputs_of(v.id)]
        lines += [f"  {_sink_text(s)}" for s in graph.sinks_of(v.id)]
        lines += [f"  dead letters: {d.path}" for d in graph.dead_letters_of(v.id)]
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    """A DOT string literal (its own quotes and backslashes escaped; ``\\n`` breaks a label)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def sink_node(sink: VertexSink) -> str:
    """The DOT node id of a sink."""
    return f"sink:{sink.name}"


def dead_letters_node(vertex_id: str) -> str:
    """The DOT node id of a vertex's dead letters."""
    return f"dead_letters:{vertex_id}"


def to_dot(graph: StreamGraph) -> str:
    """The graph in Graphviz's DOT language: a box per operator, a house per source, a cylinder per
    sink and dead-letter table; an edge labelled with its partitioning (dashed: feedback)."""
    lines = [f"digraph {_quote(graph.name)} {{", "  rankdir=LR;", '  node [shape=box, fontname="Helvetica"];',
             '  edge [fontname="Helvetica", fontsize=10];']
    for v in graph.vertices:
        if isinstance(v, SourceVertex):
            reads = _spec(v.spec)
            label = [v.id, f"source x{v.parallelism}", reads.get("path", reads["type"])]
            label += [f"map {m.name}" for m in v.maps]
            lines.append(f"  {_quote(v.id)} [label={_quote(NL.join(label))}, shape=invhouse];")
        else:
            label = [v.id, f"{_kind_words(v)} x{v.parallelism}", v.operator_name]
            lines.append(f"  {_quote(v.id)} [label={_quote(NL.join(label))}];")
    for s in graph.sinks:
        lines.append(f"  {_quote(sink_node(s))} [label={_quote(s.name + NL + _target(s.spec))}, shape=cylinder];")
    for d in graph.dead_letters:
        lines.append(f"  {_quote(dead_letters_node(d.vertex))} [label={_quote('dead letters' + NL + d.path)}, "
                     "shape=cylinder, style=dashed];")
    for e in graph.edges:
        receiver = next((v for v in graph.vertices if v.id == e.receiver), None)
        label = [e.describe()]
        if receiver is not None and receiver.inputs == 2:
            label.append(f"input {e.input}")
        if e.output not in (RECORDS, MAIN):
            label.append(f"output {e.output}")
        style = ", style=dashed, constraint=false" if e.feedback else ""
        if e.feedback:
            label.append("feedback")
        lines.append(f"  {_quote(e.sender)} -> {_quote(e.receiver)} [label={_quote(NL.join(label))}{style}];")
    for s in graph.sinks:
        label = f" [label={_quote(s.output)}]" if s.output not in (s.name, RECORDS) else ""
        lines.append(f"  {_quote(s.vertex)} -> {_quote(sink_node(s))}{label};")
    for d in graph.dead_letters:
        lines.append(f"  {_quote(d.vertex)} -> {_quote(dead_letters_node(d.vertex))} [style=dotted];")
    lines.append("}")
    return "\n".join(lines) + "\n"

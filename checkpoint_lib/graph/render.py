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

Given a ``plan`` (a :class:`~.jobgraph.JobGraph` of the graph), :func:`to_text` and :func:`to_dot`
also show how it runs: the process groups (their chains, sources, sinks, the channel logs they read
and write; clusters in dot) and each edge chained or cut (why, and its channel log). Without one
they draw the declared graph alone, exactly as before. The plan's JSON is
:meth:`~.jobgraph.JobGraph.to_dict`.
"""

from __future__ import annotations

from typing import Any

from .jobgraph import JobEdge, JobGraph, ProcessGroup
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


def shape(graph: StreamGraph, sinks: bool = True) -> str:
    """One line: ``2 vertices, 2 edges (1 feedback), 1 sink`` (without the sinks: ``sinks=False``)."""
    feedback = sum(e.feedback for e in graph.edges)
    return (f"{_count(len(graph.vertices), 'vertex', 'vertices')}, "
            f"{_count(len(graph.edges), 'edge')}{f' ({feedback} feedback)' if feedback else ''}"
            + (f", {_count(len(graph.sinks), 'sink')}" if sinks else ""))


def _target(spec: Any) -> str:
    """``gold/balances (upsert by account)``: where a sink writes."""
    d = _spec(spec)
    how = d.get("mode")
    if how == "upsert" and d.get("keys"):
        how = f"upsert by {', '.join(d['keys'])}"
    where = d.get("path", d["type"])
    return f"{where} ({how})" if how else where


def _edge_text(graph: StreamGraph, e: Edge, run: JobEdge | None = None) -> str:
    receiver = next((v for v in graph.vertices if v.id == e.receiver), None)
    into = f" input {e.input}" if receiver is not None and receiver.inputs == 2 else ""
    notes = [e.describe()]
    if e.output not in (RECORDS, MAIN):
        notes.append(f"output {e.output}")
    if e.feedback:
        notes.append("feedback (iterate)")
    how = "" if run is None else f"; {_run_words(run)}"
    return f"-> {e.receiver}{into}: {', '.join(notes)}{how}"


def _run_words(run: JobEdge) -> str:
    """``chained``, or ``cut (processes, lagging), log source_bank``."""
    if run.chained:
        return "chained"
    return f"cut ({', '.join(run.reasons)}), log {run.channel_log}"


def _runs(graph: StreamGraph, plan: JobGraph | None) -> dict[Edge, JobEdge]:
    """Each edge of ``graph`` as ``plan`` runs it (empty without a plan)."""
    if plan is None:
        return {}
    same = (plan.graph.name == graph.name and [v.id for v in plan.graph.vertices] == [v.id for v in graph.vertices]
            and plan.graph.edges == graph.edges)
    if not same:  # the same vertices and edges: the operators' instances may differ
        raise ValueError(f"the plan is of graph {plan.graph.name!r}, not of the graph drawn ({graph.name!r})")
    return {run.edge: run for run in plan.edges}


def _group_text(group: ProcessGroup) -> str:
    """``process bank: chain [bank]; sinks balances; reads source_bank, bank_bank; writes bank_bank``."""
    chains = ", ".join(f"[{', '.join(c.vertices)}]" for c in group.chains)
    parts = [f"process {group.name}: {'chain' if len(group.chains) == 1 else 'chains'} {chains}"]
    if group.plans_steps:
        parts.append("plans steps")
    if group.sinks:
        parts.append(f"sinks {', '.join(group.sinks)}")
    for verb, edges in (("reads", group.reads), ("writes", group.writes)):
        if edges:
            parts.append(f"{verb} {', '.join(str(e.channel_log) for e in edges)}")
    return "; ".join(parts)


def _sink_text(s: VertexSink) -> str:
    output = f", output {s.output}" if s.output not in (s.name, RECORDS) else ""
    return f"sink {s.name}: {_target(s.spec)}{output}"


def to_text(graph: StreamGraph, plan: JobGraph | None = None) -> str:
    """A layered list a person reads: the vertices in topological order, each with what it reads,
    its edges out (partitioning, key), its sinks and dead letters. With ``plan``: a line per
    process group after the title, each vertex's group, each edge chained or cut."""
    runs = _runs(graph, plan)
    lines = [f"{graph.name}: {shape(graph)}"]
    lines += [_group_text(g) for g in plan.groups] if plan is not None else []
    lines.append("")
    for v in graph.topological_order():
        where = f", process {plan.processes[v.id]}" if plan is not None else ""
        if isinstance(v, SourceVertex):
            lines.append(f"{v.id} (source, parallelism {v.parallelism}{where})")
            reads = _spec(v.spec)
            line = f"  reads {reads.get('path', reads['type'])} ({reads['type']})" if "path" in reads else \
                f"  reads {reads['type']}"
            if v.bootstrap is not None:
                line += f", bootstrap {getattr(v.bootstrap, 'path', type(v.bootstrap).__name__)}"
            lines.append(line)
            if v.maps:
                lines.append(f"  maps: {', '.join(m.name for m in v.maps)}")
        else:
            lines.append(f"{v.id} ({_kind_words(v)} {v.operator_name}, parallelism {v.parallelism}{where})")
        lines += [f"  {_edge_text(graph, e, runs.get(e))}" for e in graph.outputs_of(v.id)]
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


def group_cluster(group: ProcessGroup) -> str:
    """The DOT subgraph id of a process group (a cluster: Graphviz boxes it)."""
    return f"cluster_{group.name}"


def to_dot(graph: StreamGraph, plan: JobGraph | None = None) -> str:
    """The graph in Graphviz's DOT language: a box per operator, a house per source, a cylinder per
    sink and dead-letter table; an edge labelled with its partitioning (dashed: feedback). With
    ``plan``: a cluster per process group, each edge labelled chained (bold) or cut (why, its log)."""
    runs = _runs(graph, plan)
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
    for g in plan.groups if plan is not None else ():
        members = " ".join(f"{_quote(v)};" for v in g.vertices)
        lines.append(f"  subgraph {_quote(group_cluster(g))} {{ label={_quote('process ' + g.name)}; {members} }}")
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
        run = runs.get(e)
        if run is not None and run.chained:
            label.append("chained")
            style += ", style=bold"
        elif run is not None:
            label += [f"cut: {', '.join(run.reasons)}", f"log {run.channel_log}"]
        lines.append(f"  {_quote(e.sender)} -> {_quote(e.receiver)} [label={_quote(NL.join(label))}{style}];")
    for s in graph.sinks:
        label = f" [label={_quote(s.output)}]" if s.output not in (s.name, RECORDS) else ""
        lines.append(f"  {_quote(s.vertex)} -> {_quote(sink_node(s))}{label};")
    for d in graph.dead_letters:
        lines.append(f"  {_quote(d.vertex)} -> {_quote(dead_letters_node(d.vertex))} [style=dotted];")
    lines.append("}")
    return "\n".join(lines) + "\n"

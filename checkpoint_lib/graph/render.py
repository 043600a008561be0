"""Drawing a :class:`~.model.StreamGraph`: :func:`to_text` for people, :func:`to_dot` for Graphviz
(``ckpt graph P -o dot | dot -Tsvg > p.svg``), :func:`to_dict` for machines (``-o json``), and
:func:`to_svg`: boxes and arrows as one inline SVG, laid out here (no Graphviz, no script), for the
Checkpoints page.

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


# --- SVG: boxes and arrows, drawn server-side (the Checkpoints page) -------------------------------

_CHAR_W, _LABEL_W, _LINE_H, _PAD, _COL_GAP, _ROW_GAP = 7.0, 6.0, 15.0, 8.0, 60.0, 24.0


def _edge_label(graph: StreamGraph, e: Edge) -> str:
    """``hash(account)``, ``hash(account), input 2``: an edge's label in the SVG."""
    return e.describe() + (f", input {e.input}" if graph.vertex(e.receiver).inputs == 2 else "")


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _ranks(graph: StreamGraph) -> dict[str, int]:
    """Each vertex's column: sources 0, every other vertex one right of its furthest sender
    (feedback edges left out, so a cycle does not push its head right)."""
    rank: dict[str, int] = {}
    for v in graph.topological_order():
        senders = [rank[e.sender] for e in graph.inputs_of(v.id) if not e.feedback and e.sender in rank]
        rank[v.id] = 0 if isinstance(v, SourceVertex) or not senders else max(senders) + 1
    return rank


def to_svg(graph: StreamGraph, notes: dict[str, str] | None = None) -> str:
    """The graph as one self-contained ``<svg class="jobgraph">``: a box per vertex (its id, kind
    and parallelism, and ``notes[vertex id]`` when given: e.g. a checkpoint's figures) in columns
    from the sources rightwards, a box per sink right of its vertex, an arrow per edge labelled with
    its partitioning (dashed and curved below: feedback). Styled through classes (``vertex``,
    ``source``, ``sink``, ``edge``, ``feedback``, ``label``) with plain defaults, so a page can theme it."""
    notes = notes or {}
    rank = _ranks(graph)
    boxes: dict[str, tuple[int, list[str], str]] = {}  # node -> (column, lines, class)
    for v in graph.topological_order():
        if isinstance(v, SourceVertex):
            lines = [v.id, f"source x{v.parallelism}", _spec(v.spec).get("path", _spec(v.spec)["type"])]
            cls = "vertex source"
        else:
            lines = [v.id, f"{_kind_words(v)} x{v.parallelism}", v.operator_name]
            cls = "vertex"
        if notes.get(v.id):
            lines.append(notes[v.id])
        boxes[v.id] = (rank[v.id], lines, cls)
    for s in graph.sinks:
        lines = [f"sink {s.name}", _target(s.spec)] + ([notes[sink_node(s)]] if notes.get(sink_node(s)) else [])
        boxes[sink_node(s)] = (rank.get(s.vertex, 0) + 1, lines, "sink")
    columns = max((c for c, _, _ in boxes.values()), default=0) + 1
    size = {n: (max(len(t) for t in lines) * _CHAR_W + 2 * _PAD, len(lines) * _LINE_H + 2 * _PAD - 4)
            for n, (_, lines, _) in boxes.items()}
    col_w = [max([size[n][0] for n, (c, _, _) in boxes.items() if c == col] or [0]) for col in range(columns)]
    labels = {e: _edge_label(graph, e) for e in graph.edges}
    gap = max([_COL_GAP, *(len(t) * _LABEL_W + 30 for t in labels.values())])  # a label fits between columns
    x0 = [sum(col_w[:col]) + col * gap + 10 for col in range(columns)]
    at: dict[str, tuple[float, float, float, float]] = {}  # node -> x, y, w, h
    heights = []
    for col in range(columns):
        y = 10.0
        for n, (c, _, _) in boxes.items():
            if c == col:
                w, h = size[n]
                at[n] = (x0[col], y, w, h)
                y += h + _ROW_GAP
        heights.append(y)
    loops = any(e.feedback for e in graph.edges)  # drawn below the boxes
    width, height = x0[-1] + col_w[-1] + 10, max(heights) + (36 if loops else 0)
    out = [f'<svg class="jobgraph" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="12" role="img" '
           f'aria-label="{_esc("job graph of " + graph.name)}">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="currentColor"/></marker></defs>']

    def arrow(a: str, b: str, label: str, cls: str) -> None:
        ax, ay, aw, ah = at[a]
        bx, by, bw, bh = at[b]
        if bx > ax:  # rightwards; the label by the sender, where edges have not met yet
            x1, y1, x2, y2 = ax + aw, ay + ah / 2, bx, by + bh / 2
            path = f"M{x1:.1f},{y1:.1f} C{x1 + 30:.1f},{y1:.1f} {x2 - 30:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"
            lx, ly, anchor = x1 + 6, y1 - 5, "start"
        else:  # back (feedback): out of the bottom, around and into the bottom
            x1, y1, x2, y2 = ax + aw * 0.7, ay + ah, bx + bw * 0.3, by + bh
            low = max(y1, y2) + 24
            path = f"M{x1:.1f},{y1:.1f} C{x1:.1f},{low:.1f} {x2:.1f},{low:.1f} {x2:.1f},{y2:.1f}"
            lx, ly, anchor = (x1 + x2) / 2, low + 8, "middle"
        dash = ' stroke-dasharray="5,4"' if "feedback" in cls else ""
        out.append(f'<path class="{cls}" d="{path}" fill="none" stroke="currentColor"{dash} marker-end="url(#arrow)"/>')
        if label:
            out.append(f'<text class="label" x="{lx:.1f}" y="{ly:.1f}" text-anchor="{anchor}" font-size="10">'
                       f'{_esc(label)}</text>')

    for e in graph.edges:
        arrow(e.sender, e.receiver, labels[e] + (", feedback" if e.feedback else ""),
              "edge feedback" if e.feedback else "edge")
    for s in graph.sinks:
        arrow(s.vertex, sink_node(s), s.output if s.output not in (s.name, RECORDS, MAIN) else "", "edge")
    for n, (_, lines, cls) in boxes.items():
        x, y, w, h = at[n]
        rx = 12 if cls == "sink" else 4
        out.append(f'<g class="{cls}" data-node="{_esc(n)}"><rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" '
                   f'height="{h:.1f}" rx="{rx}" fill="none" stroke="currentColor"/>')
        for i, text in enumerate(lines):
            weight = ' font-weight="bold"' if i == 0 else ""
            out.append(f'<text x="{x + _PAD:.1f}" y="{y + _PAD + 10 + i * _LINE_H:.1f}"{weight}>{_esc(text)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)

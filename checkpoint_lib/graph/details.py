"""A checkpoint broken down per vertex of its pipeline's graph, as Flink's checkpoint details show
it: for each vertex (topological order: sources, then operators), how many of its subtasks
acknowledged, the state size (sum), the alignment (max), whether any subtask snapshotted unaligned,
the channel state (rows and bytes, sums), the slowest subtask (the largest ``duration_ms``, the
first of equals) and, for a source, its offset; for a keyed operator, the state table versions and
key groups its subtasks pinned. Each vertex's sinks are grouped under it, with the same figures and
the transactions the checkpoint owns.

:func:`checkpoint_details` is the one definition, used by ``ckpt checkpoints show`` and the
Checkpoints page; :func:`to_text` is the table a person reads and :func:`display_rows` its cells
(the page draws them as HTML). Pure: it reads the ack rows the store gives
(:meth:`~checkpoint_lib.delta.completed.DeltaCompletedCheckpointStore.acks`,
:meth:`~checkpoint_lib.control.PipelineControl.acks`: ``operator``, ``index``, ``state`` and the
figures of a :class:`~checkpoint_lib.core.types.SubtaskAck`) and the graph
(:func:`checkpoint_lib.pipelines.graph_of`: a linear pipeline's two vertices too).

Nothing is hidden: acks of an operator the graph does not have (it changed since the checkpoint),
or every ack when no graph is given (the pipeline cannot be loaded), are listed after the graph's
vertices, ``in_graph`` false, their kind guessed from their state (``source``, ``keyed``,
``operator``, ``sink``).

The JSON of a vertex (:meth:`VertexDetails.to_dict`; keys are only ever added)::

    {"id": "tag", "kind": "two_input_keyed", "in_graph": true, "parallelism": 2, "subtasks": 2,
     "state_size_bytes": 1024, "alignment_ms": 3.5, "unaligned": false, "channel_state_rows": 0,
     "channel_state_bytes": 0, "duration_ms": 41.0,
     "slowest": {"subtask": "tag[1]", "index": 1, "duration_ms": 41.0},     # null: no ack
     "offset": null,                                                        # a source's version
     "state_table_versions": [4], "key_groups": [0, 127],                   # [] / null: none pinned
     "sinks": [{"name": "rejected", "operator": "sink_rejected", "parallelism": 2, "subtasks": 2, ...,
                "transactions": 2}]}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ..core.acks import PinnedState, SinkAckState, SourceAckState
from ..core.types import SubtaskId, sink_operator
from ..history import human_bytes
from .model import OperatorKind, SourceVertex, StreamGraph

SOURCE, SINK, KEYED, OPERATOR = "source", "sink", str(OperatorKind.KEYED), "operator"
"""The kinds guessed for acks of no vertex of the graph (a graph's vertices say their own)."""


@dataclass(frozen=True)
class Slowest:
    """The subtask that took longest to snapshot (the first of equals)."""

    subtask: str
    index: int
    duration_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"subtask": self.subtask, "index": self.index, "duration_ms": self.duration_ms}


@dataclass(frozen=True)
class Figures:
    """What a group of subtasks' acks add up to."""

    subtasks: int = 0
    state_size_bytes: int = 0
    alignment_ms: float = 0.0
    unaligned: bool = False
    channel_state_rows: int = 0
    channel_state_bytes: int = 0
    duration_ms: float = 0.0
    slowest: Slowest | None = None

    @classmethod
    def of(cls, acks: Sequence[Mapping[str, Any]]) -> Figures:
        if not acks:
            return cls()
        slow = max(acks, key=lambda a: (_num(a, "duration_ms"), -int(a.get("index") or 0)))
        return cls(
            subtasks=len(acks),
            state_size_bytes=int(sum(_num(a, "state_size_bytes") for a in acks)),
            alignment_ms=max(_num(a, "alignment_ms") for a in acks),
            unaligned=any(bool(a.get("unaligned")) for a in acks),
            channel_state_rows=int(sum(_num(a, "channel_state_rows") for a in acks)),
            channel_state_bytes=int(sum(_num(a, "channel_state_bytes") for a in acks)),
            duration_ms=_num(slow, "duration_ms"),
            slowest=Slowest(_subtask(slow), int(slow.get("index") or 0), _num(slow, "duration_ms")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"subtasks": self.subtasks, "state_size_bytes": self.state_size_bytes,
                "alignment_ms": self.alignment_ms, "unaligned": self.unaligned,
                "channel_state_rows": self.channel_state_rows, "channel_state_bytes": self.channel_state_bytes,
                "duration_ms": self.duration_ms, "slowest": self.slowest.to_dict() if self.slowest else None}


def _num(ack: Mapping[str, Any], key: str) -> float:
    value = ack.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _subtask(ack: Mapping[str, Any]) -> str:
    return str(ack.get("subtask") or SubtaskId(str(ack["operator"]), int(ack.get("index") or 0)))


@dataclass(frozen=True)
class SinkDetails:
    """A sink's subtasks at the checkpoint: their figures and the transactions the checkpoint owns
    (what its commit, or a recovery to it, commits)."""

    name: str
    operator: str
    parallelism: int | None
    figures: Figures
    transactions: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "operator": self.operator, "parallelism": self.parallelism,
                **self.figures.to_dict(), "transactions": self.transactions}


@dataclass(frozen=True)
class VertexDetails:
    """One vertex at the checkpoint (see the module)."""

    id: str
    kind: str
    """``source``, ``keyed``, ``two_input_keyed``, ``stateless``; for acks of no vertex of the
    graph, the kind their state says (``source``, ``keyed``, ``operator``, ``sink``)."""
    in_graph: bool
    parallelism: int | None
    """As the graph declares it now (None: not in the graph); a checkpoint taken at another
    parallelism acknowledged another number of subtasks."""
    figures: Figures
    offset: int | None = None
    """A source's offset: the source table version its subtasks read up to (the smallest, should
    they differ)."""
    state_table_versions: tuple[int, ...] = ()
    key_groups: tuple[int, int] | None = None
    sinks: tuple[SinkDetails, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "in_graph": self.in_graph, "parallelism": self.parallelism,
                **self.figures.to_dict(), "offset": self.offset,
                "state_table_versions": list(self.state_table_versions),
                "key_groups": list(self.key_groups) if self.key_groups else None,
                "sinks": [s.to_dict() for s in self.sinks]}


def _offset(acks: Sequence[Mapping[str, Any]]) -> int | None:
    offsets = [o for a in acks if (o := SourceAckState.offset_in(a.get("state") or {})) is not None]
    return min(offsets) if offsets else None


def _pins(acks: Sequence[Mapping[str, Any]]) -> list[PinnedState]:
    return [p for a in acks if (p := PinnedState.held_in(a.get("state") or {})) is not None]


def _transactions(acks: Sequence[Mapping[str, Any]]) -> int:
    owned = 0
    for a in acks:
        sink = SinkAckState.held_in(a.get("state") or {})
        owned += len(sink.snapshot.owned) if sink is not None else 0
    return owned


def _vertex(vertex_id: str, kind: str, in_graph: bool, parallelism: int | None,
            acks: Sequence[Mapping[str, Any]], sinks: Iterable[SinkDetails] = ()) -> VertexDetails:
    pins = _pins(acks)
    return VertexDetails(
        vertex_id, kind, in_graph, parallelism, Figures.of(acks),
        offset=_offset(acks) if kind == SOURCE else None,
        state_table_versions=tuple(sorted({p.table_version for p in pins})),
        key_groups=(min(p.key_groups.start for p in pins), max(p.key_groups.end for p in pins)) if pins else None,
        sinks=tuple(sinks))


def _sink(name: str, operator: str, parallelism: int | None, acks: Sequence[Mapping[str, Any]]) -> SinkDetails:
    return SinkDetails(name, operator, parallelism, Figures.of(acks), _transactions(acks))


def _guessed_kind(operator: str, acks: Sequence[Mapping[str, Any]]) -> str:
    """The kind an operator id's acks say they are of (no graph to ask)."""
    if SubtaskId(operator, 0).sink is not None:
        return SINK
    if _pins(acks):
        return KEYED
    if any(SourceAckState.offset_in(a.get("state") or {}) is not None for a in acks):
        return SOURCE
    return OPERATOR


def checkpoint_details(graph: StreamGraph | None, acks: Sequence[Mapping[str, Any]]) -> list[VertexDetails]:
    """The checkpoint whose per-subtask ``acks`` are given, per vertex of ``graph`` (see the
    module); without a graph, per operator id of the acks (sources first, then operators, then
    sinks, each as the acks name them)."""
    by_operator: dict[str, list[Mapping[str, Any]]] = {}
    for a in sorted(acks, key=lambda a: (str(a["operator"]), int(a.get("index") or 0))):
        by_operator.setdefault(str(a["operator"]), []).append(a)
    out: list[VertexDetails] = []
    if graph is not None:
        for v in graph.topological_order():
            sinks = [_sink(s.name, sink_operator(s.name), v.parallelism, by_operator.pop(sink_operator(s.name), []))
                     for s in graph.sinks_of(v.id)]
            kind = SOURCE if isinstance(v, SourceVertex) else str(v.kind)
            out.append(_vertex(v.id, kind, True, v.parallelism, by_operator.pop(v.id, []), sinks))
    rest = [(op, _guessed_kind(op, group), group) for op, group in by_operator.items()]
    order = {SOURCE: 0, KEYED: 1, OPERATOR: 1, SINK: 2}
    for op, kind, group in sorted(rest, key=lambda r: order[r[1]]):
        if kind == SINK:
            name = SubtaskId(op, 0).sink or op
            out.append(_vertex(op, SINK, False, None, group, [_sink(name, op, None, group)]))
        else:
            out.append(_vertex(op, kind, False, None, group))
    return out


# --- for people ---------------------------------------------------------------------------------

COLUMNS = ("vertex", "kind", "subtasks", "state size", "alignment", "unaligned", "channel state", "slowest",
           "offset / pinned")
"""The columns of :func:`display_rows` and :func:`to_text`."""
LEFT = ("vertex", "kind", "slowest", "offset / pinned")
"""The columns read left to right (the others are numbers, right-aligned)."""


def _kind_words(kind: str) -> str:
    return kind.replace("two_input_", "two-input ")


def _cells(name: str, kind: str, parallelism: int | None, f: Figures, note: str) -> dict[str, str]:
    acked = str(f.subtasks) if parallelism in (None, f.subtasks) else f"{f.subtasks} of {parallelism}"
    # no subtask said how long it took (a sink's, a chained graph's): none was slowest
    slowest = f"{f.slowest.subtask} {f.slowest.duration_ms:,.1f} ms" if f.slowest and f.duration_ms > 0 else "-"
    return {"vertex": name, "kind": _kind_words(kind), "subtasks": acked, "state size": human_bytes(f.state_size_bytes),
            "alignment": f"{f.alignment_ms:,.1f} ms", "unaligned": "yes" if f.unaligned else "no",
            "channel state": f"{f.channel_state_rows:,} rows, {human_bytes(f.channel_state_bytes)}",
            "slowest": slowest, "offset / pinned": note}


def _note(v: VertexDetails) -> str:
    if v.offset is not None:
        return f"offset: version {v.offset}"
    if v.state_table_versions:
        versions = ", ".join(str(n) for n in v.state_table_versions)
        lo, hi = v.key_groups or (0, 0)
        return f"state table {'version' if len(v.state_table_versions) == 1 else 'versions'} {versions}, " \
               f"key groups {lo}..{hi}"
    return ""


def _owns(s: SinkDetails) -> str:
    return f"owns {s.transactions} {'transaction' if s.transactions == 1 else 'transactions'}"


def display_rows(details: Sequence[VertexDetails]) -> list[dict[str, str]]:
    """One row of display text per vertex (:data:`COLUMNS`), each followed by a row per sink of it
    (its ``vertex`` cell ``sink <name>``, its ``kind`` ``sink``); a row's ``level`` is 0 for a
    vertex, 1 for a sink under it. Beside a graph's vertices, an operator the graph does not have
    says so."""
    rows = []
    graph = any(v.in_graph for v in details)
    for v in details:
        if v.kind == SINK and not v.in_graph:  # a sink of no vertex the graph has: one row
            (s,) = v.sinks
            rows.append({**_cells(f"sink {s.name}", SINK, None, s.figures, _owns(s)), "level": "0"})
            continue
        name = v.id if v.in_graph or not graph else f"{v.id} (not in the graph)"
        rows.append({**_cells(name, v.kind, v.parallelism, v.figures, _note(v)), "level": "0"})
        rows += [{**_cells(f"sink {s.name}", SINK, s.parallelism, s.figures, _owns(s)), "level": "1"} for s in v.sinks]
    return rows


def to_text(details: Sequence[VertexDetails]) -> str:
    """The per-vertex table a person reads (sinks indented under their vertex), no final newline."""
    rows = [{**r, "vertex": "  " * int(r["level"]) + r["vertex"]} for r in display_rows(details)]
    widths = {c: max([len(c), *(len(r[c]) for r in rows)]) for c in COLUMNS}

    def line(cells: Mapping[str, str]) -> str:
        return "  ".join(cells[c].ljust(widths[c]) if c in LEFT else cells[c].rjust(widths[c]) for c in COLUMNS).rstrip()

    return "\n".join([line({c: c for c in COLUMNS}), line({c: "-" * widths[c] for c in COLUMNS}), *map(line, rows)])

"""A checkpoint per vertex of its graph (checkpoint_lib/graph/details.py): what each vertex's
subtasks add up to, sinks under their vertex, the offsets and pins, acks of no vertex of the graph
and no graph at all. Pure: ack rows as the store gives them."""

from __future__ import annotations

from checkpoint_lib.core.acks import KeyedAckState, PinnedState, SinkAckState, SourceAckState
from checkpoint_lib.core.keygroups import KeyGroupRange
from checkpoint_lib.core.twophase import SinkSnapshot, Transaction
from checkpoint_lib.graph import Graph
from checkpoint_lib.graph.details import checkpoint_details, display_rows, to_text
from checkpoint_lib.pipeline import DeltaSink, DeltaSource


class Keyed:
    state_schema = "n long"

    def apply(self, records, state, key):
        return state, {}


class Stateless:
    def apply(self, records):
        return {}


def graph():
    g = Graph("g")
    a = g.source("a", DeltaSource("in/a", "k string"), parallelism=2)
    b = g.source("b", DeltaSource("in/b", "k string"))
    counted = a.union(b).key_by("k", parallelism=2).process(Keyed(), uid="count")
    counted.sink("counts", DeltaSink("out/counts", "k string"))
    counted.rebalance(3).process(Stateless(), uid="fan").sink("fanned", DeltaSink("out/fanned", "k string"))
    return g.build()


def ack(operator, index, state, **figures):
    return {"subtask": f"{operator}[{index}]", "operator": operator, "index": index, "state": state,
            "state_size_bytes": 0, "channel_state_rows": 0, "channel_state_bytes": 0, "alignment_ms": 0.0,
            "unaligned": False, "duration_ms": 0.0, "ack_time": 1.0, **figures}


def sink_state(owned: int) -> dict:
    txns = tuple(Transaction(i, f"t{i}", 1, 2) for i in range(owned))
    return SinkAckState(SinkSnapshot(Transaction(owned, "open", 1, None), txns, owned + 1)).to_state()


def acks():
    rows = [ack("a", i, SourceAckState(7 + i, 0, -1).to_state(), duration_ms=1.0) for i in range(2)]
    rows.append(ack("b", 0, SourceAckState(3, 0, -1).to_state()))
    for i, (lo, hi) in enumerate(((0, 63), (64, 127))):
        rows.append(ack("count", i, KeyedAckState(-1, PinnedState(4 + i, KeyGroupRange(lo, hi))).to_state(),
                        state_size_bytes=100 + i, alignment_ms=2.0 * (i + 1), duration_ms=[9.0, 3.0][i],
                        unaligned=i == 1, channel_state_rows=5 * i, channel_state_bytes=64 * i))
        rows.append(ack("sink_counts", i, sink_state(i + 1)))
    rows += [ack("fan", i, KeyedAckState(-1).to_state(), duration_ms=2.0) for i in range(3)]
    rows += [ack("sink_fanned", i, sink_state(1)) for i in range(3)]
    return rows


def test_each_vertex_adds_up_its_subtasks_in_topological_order_with_its_sinks_under_it():
    details = {v.id: v for v in checkpoint_details(graph(), list(reversed(acks())))}  # any order in
    assert list(details) == ["a", "b", "count", "fan"]
    a, b, count, fan = details.values()
    assert (a.kind, a.parallelism, a.figures.subtasks, a.offset) == ("source", 2, 2, 7)  # the smallest offset
    assert a.figures.slowest.subtask == "a[0]"  # the first of equals
    assert (b.offset, b.figures.subtasks) == (3, 1)
    assert (count.kind, count.figures.state_size_bytes, count.figures.alignment_ms) == ("keyed", 201, 4.0)
    assert count.figures.unaligned and (count.figures.channel_state_rows, count.figures.channel_state_bytes) == (5, 64)
    assert (count.figures.slowest.subtask, count.figures.duration_ms) == ("count[0]", 9.0)
    assert count.state_table_versions == (4, 5) and count.key_groups == (0, 127) and count.offset is None
    assert [(s.name, s.operator, s.figures.subtasks, s.transactions) for s in count.sinks] == [
        ("counts", "sink_counts", 2, 3)]
    assert (fan.kind, fan.parallelism, fan.figures.subtasks, fan.state_table_versions, fan.key_groups) == \
        ("stateless", 3, 3, (), None)
    assert [(s.name, s.transactions) for s in fan.sinks] == [("fanned", 3)]
    doc = count.to_dict()
    assert doc["slowest"] == {"subtask": "count[0]", "index": 0, "duration_ms": 9.0}
    assert doc["sinks"][0]["transactions"] == 3 and doc["state_table_versions"] == [4, 5]


def test_a_pending_checkpoint_shows_what_acknowledged_so_far():
    details = checkpoint_details(graph(), acks()[:1])
    assert [(v.id, v.figures.subtasks) for v in details] == [("a", 1), ("b", 0), ("count", 0), ("fan", 0)]
    assert details[1].figures.slowest is None and details[1].offset is None
    rows = {r["vertex"]: r for r in display_rows(details)}
    assert rows["a"]["subtasks"] == "1 of 2" and rows["b"]["slowest"] == "-"


def test_acks_of_no_vertex_are_listed_after_the_graphs_and_without_a_graph_by_operator_id():
    extra = [ack("gone", 0, KeyedAckState(-1, PinnedState(1, KeyGroupRange(0, 127))).to_state()),
             ack("sink_old", 0, sink_state(2))]
    details = checkpoint_details(graph(), acks() + extra)
    assert [(v.id, v.kind, v.in_graph) for v in details[4:]] == [("gone", "keyed", False),
                                                                  ("sink_old", "sink", False)]
    assert details[5].sinks[0].transactions == 2
    text = to_text(details)
    assert "gone (not in the graph)" in text and "sink old" in text

    alone = checkpoint_details(None, acks())
    assert [(v.id, v.kind) for v in alone] == [("a", "source"), ("b", "source"), ("count", "keyed"),
                                               ("fan", "operator"), ("sink_counts", "sink"), ("sink_fanned", "sink")]
    assert not any(v.in_graph for v in alone) and "not in the graph" not in to_text(alone)


def test_the_text_has_a_line_per_vertex_and_sink():
    lines = to_text(checkpoint_details(graph(), acks())).splitlines()
    assert lines[0].split()[:3] == ["vertex", "kind", "subtasks"] and set(lines[1]) <= {"-", " "}
    assert [line.split()[0] for line in lines[2:]] == ["a", "b", "count", "sink", "fan", "sink"]
    count = lines[4]
    assert "201 B" in count and "4.0 ms" in count and " yes " in count and "5 rows, 64 B" in count
    assert "count[0] 9.0 ms" in count and count.endswith("state table versions 4, 5, key groups 0..127")
    assert lines[5].startswith("  sink counts") and lines[5].endswith("owns 3 transactions")
    assert lines[2].endswith("offset: version 7")

"""Dataflow graphs (checkpoint_lib/graph/): the builder, every validation rule's message, the
lowering of the registered linear pipelines, and the three drawings. Pure: no engine."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest

from checkpoint_lib import pipelines
from checkpoint_lib.graph import (MAIN, RECORDS, AheadBound, DeadLetters, Edge, Graph, GraphError, OperatorKind, OperatorVertex,
                                  Partitioning, SourceVertex, StreamGraph, VertexSink, from_pipeline, problems, shape,
                                  to_dict, to_dot, to_svg, to_text, validate)
from checkpoint_lib.pipeline import FEEDBACK, PARTITIONINGS, DeltaSink, DeltaSource, Pipeline, StateTtl

MOVES = {"account": "string", "cents": "long", "region": "string"}


class Keyed:
    state_schema = "n long"
    order_by = ("src_version", "src_file", "src_row")

    def apply(self, records, state, key):
        return state, {}


class Enrich(Keyed):
    state_schema = "tier string"


class Stateless:
    def apply(self, records):
        return {}


def table(path: str, schema: str = "account string, n long") -> DeltaSink:
    return DeltaSink(path, schema)


def shop() -> Graph:
    """Three sources, a union, a two-input keyed enrichment, a new key after it, a stateless
    operator after that; sinks and dead letters at several vertices."""
    g = Graph("shop")
    payments = g.source("payments", DeltaSource("landing/payments", MOVES), parallelism=2).dead_letters("dlq/payments")
    refunds = g.source("refunds", DeltaSource("landing/refunds", MOVES))
    accounts = g.source("accounts", DeltaSource("landing/accounts", {"account": "string", "tier": "string"}))
    enriched = (payments.union(refunds).key_by("account", parallelism=4)
                .connect(accounts.key_by("account")).process(Enrich(), uid="enrich"))
    enriched.sink("enriched", table("gold/enriched"))
    fraud = enriched.output("moves").key_by("region", parallelism=2).process(Keyed(), uid="fraud")
    fraud.sink("alerts", table("gold/alerts")).dead_letters("dlq/fraud")
    fraud.output("audit").rebalance(3).process(Stateless(), uid="audit").sink("audit", table("gold/audit"))
    accounts.sink("accounts_copy", table("silver/accounts", "account string, tier string"))
    return g


def two_sources(g: Graph, b_schema: dict[str, str] | None = None):
    a = g.source("a", DeltaSource("landing/a", {"account": "string", "n": "long"}))
    b = g.source("b", DeltaSource("landing/b", b_schema or {"account": "string", "n": "long"}))
    return a, b


def error_of(build) -> str:
    with pytest.raises(GraphError) as raised:
        build()
    return str(raised.value)


# --- the builder ---------------------------------------------------------------------------------------------------

def test_the_builder_declares_sources_unions_two_input_keyed_operators_new_keys_and_sinks_anywhere():
    graph = shop().build()
    assert [(v.id, getattr(v, "kind", "source"), v.parallelism) for v in graph.vertices] == [
        ("payments", "source", 2), ("refunds", "source", 1), ("accounts", "source", 1),
        ("enrich", OperatorKind.TWO_INPUT_KEYED, 4), ("fraud", OperatorKind.KEYED, 2),
        ("audit", OperatorKind.STATELESS, 3)]
    assert [(e.sender, e.output, e.receiver, e.input, e.partitioning, e.key) for e in graph.edges] == [
        ("payments", RECORDS, "enrich", 1, "hash", "account"), ("refunds", RECORDS, "enrich", 1, "hash", "account"),
        ("accounts", RECORDS, "enrich", 2, "hash", "account"), ("enrich", "moves", "fraud", 1, "hash", "region"),
        ("fraud", "audit", "audit", 1, "rebalance", None)]
    assert [(s.name, s.vertex, s.output) for s in graph.sinks] == [
        ("enriched", "enrich", "enriched"), ("alerts", "fraud", "alerts"), ("audit", "audit", "audit"),
        ("accounts_copy", "accounts", RECORDS)]
    assert graph.dead_letters == (DeadLetters("payments", "dlq/payments"), DeadLetters("fraud", "dlq/fraud"))
    assert graph.vertex("enrich").inputs == 2 and graph.vertex("fraud").inputs == 1
    assert graph.operator_ids() == {"payments": 2, "refunds": 1, "accounts": 1, "enrich": 4, "fraud": 2, "audit": 3,
                                    "sink_enriched": 4, "sink_alerts": 2, "sink_audit": 3, "sink_accounts_copy": 1}
    assert validate(graph) is graph and problems(graph) == []


def test_parallelism_comes_from_process_then_the_partitioner_then_the_sender_for_forward():
    g = Graph("p")
    s = g.source("s", DeltaSource("landing/s", MOVES), parallelism=3)
    a = s.rebalance(2).process(Stateless(), uid="a", parallelism=5)
    b = s.forward().process(Stateless(), uid="b")
    c = a.key_by("account").process(Keyed(), uid="c")
    for name, op in (("a", a), ("b", b), ("c", c)):
        op.sink(name, table(f"gold/{name}"))
    graph = g.build()
    assert {v.id: v.parallelism for v in graph.operators} == {"a": 5, "b": 3, "c": 1}
    assert [e.output for e in graph.edges] == [RECORDS, RECORDS, MAIN]


def test_a_map_fuses_into_its_source_and_its_schema_is_what_a_key_must_be_a_column_of():
    g = Graph("m")
    s = g.source("s", DeltaSource("landing/s", MOVES))
    s.map(str.upper).map(lambda df: df, schema={"customer": "string", "cents": "long"})
    s.key_by("customer").process(Keyed(), uid="k").sink("out", table("gold/out"))
    graph = g.build()
    (source,) = graph.sources
    assert [m.name for m in source.maps] == ["upper", "<lambda>"] and graph.edges[0].output == RECORDS
    assert source.record_schema == {"customer": "string", "cents": "long"}
    g = Graph("m")
    s = g.source("s", DeltaSource("landing/s", MOVES)).map(str.upper, schema={"customer": "string"})
    s.key_by("account").process(Keyed(), uid="k").sink("out", table("gold/out"))
    assert "edge s -> k: key 'account' is not a column of the records of source 's' (customer)" in error_of(g.build)


def test_what_the_builder_refuses_at_the_call():
    g = Graph("b")
    a, b = two_sources(g)
    op = a.key_by("account").process(Keyed(), uid="k")
    with pytest.raises(ValueError, match=r"map\(\) on a union"):
        a.union(b).map(str.upper)
    with pytest.raises(ValueError, match=r"sink\(\) on a union"):
        a.union(b).sink("x", table("gold/x"))
    with pytest.raises(ValueError, match=r"map\(\) on source 'a' after its records were already read"):
        a.map(str.upper)
    with pytest.raises(ValueError, match=r"map\(\) is fused into a source: after operator 'k' use forward"):
        op.map(str.upper)
    with pytest.raises(ValueError, match=r"output\(\) picks an operator's output; source 'b' has one"):
        b.output("x")
    with pytest.raises(TypeError, match=r"operator 'x' needs an apply\(\) method"):
        b.rebalance().process(object(), uid="x")
    with pytest.raises(TypeError, match=r"connect\(\) needs a keyed stream"):
        a.key_by("account").connect(b.rebalance())
    with pytest.raises(ValueError, match=r"iterate\(into=...\) needs the stream of an operator"):
        op.output("back").key_by("account").iterate(into=a)
    with pytest.raises(ValueError, match=r"the feedback edge goes into 'k' \(parallelism 1\); leave the partitioner"):
        op.output("back").key_by("account", parallelism=4).iterate(into=op)
    with pytest.raises(ValueError, match=r"operator 'j': its inputs ask for parallelism 2 and 3"):
        a.key_by("account", parallelism=2).connect(b.key_by("account", parallelism=3)).process(Keyed(), uid="j")
    with pytest.raises(ValueError, match="union.. of streams of two graphs"):
        a.union(Graph("other").source("c", DeltaSource("landing/c", MOVES)))


def test_the_partitionings_are_the_pipelines_words_and_an_edge_refuses_others():
    assert tuple(Partitioning) == PARTITIONINGS
    with pytest.raises(ValueError, match="edge a -> b: partitioning must be one of hash, rebalance, broadcast, forw"):
        Edge("a", "b", "shuffle")


# --- validation: each rule, a clear message ----------------------------------------------------------------------

def direct(vertices, edges, sinks=None) -> StreamGraph:
    """A graph built without the builder (what a cycle needs)."""
    src = DeltaSource("landing/s", MOVES)
    vs = tuple(SourceVertex(v, src) if v.startswith("s") else OperatorVertex(v, Keyed(), OperatorKind.KEYED)
               for v in vertices)
    es = tuple(Edge(a, b, "hash", "account", feedback=fb, output=RECORDS if a.startswith("s") else MAIN)
               for a, b, fb in edges)
    sinks = sinks or (VertexSink("out", vertices[-1], table("gold/out"), "out"),)
    return StreamGraph("direct", vs, es, sinks)


def test_a_cycle_is_refused_unless_a_feedback_edge_closes_it():
    cyclic = direct(["s", "a", "b"], [("s", "a", False), ("a", "b", False), ("b", "a", False)])
    message = error_of(lambda: validate(cyclic))
    assert message == ("graph 'direct' is invalid: cycle a -> b -> a is not closed by iterate(): only a feedback "
                       "edge may lead back (checkpoints log the records in flight on it as channel state)")
    assert problems(direct(["s", "a", "b"], [("s", "a", False), ("a", "b", False), ("b", "a", True)])) == []
    assert problems(direct(["s", "a"], [("s", "a", False), ("a", "a", True)])) == []
    self_loop = direct(["s", "a"], [("s", "a", False), ("a", "a", False)])
    assert "cycle a -> a is not closed by iterate()" in error_of(lambda: validate(self_loop))


def test_a_feedback_edge_must_close_a_cycle():
    forward_only = direct(["s", "a", "b"], [("s", "a", False), ("a", "b", True)])
    message = error_of(lambda: validate(forward_only))
    assert "edge a -> b is declared with iterate() but closes no cycle: 'b' does not lead to 'a'" in message
    assert "operator 'b' has no input: a stream must lead to it" in message


def test_the_builders_iterate_closes_a_cycle_that_validates():
    g = Graph("loop")
    s = g.source("s", DeltaSource("landing/s", MOVES))
    a = s.key_by("account").process(Keyed(), uid="a")
    b = a.output("onward").key_by("account").process(Keyed(), uid="b").sink("out", table("gold/out"))
    b.output("back").key_by("account").iterate(into=a)
    graph = g.build()
    assert [(e.sender, e.receiver, e.feedback) for e in graph.edges] == [("s", "a", False), ("a", "b", False),
                                                                         ("b", "a", True)]
    assert [v.id for v in graph.topological_order()] == ["s", "a", "b"]


def test_a_vertex_with_no_path_to_a_sink_is_refused():
    g = Graph("dangling")
    a, b = two_sources(g)
    a.key_by("account").process(Keyed(), uid="kept").sink("out", table("gold/out"))
    b.rebalance().process(Stateless(), uid="lost").dead_letters("dlq/lost")
    message = error_of(g.build)
    assert message == ("graph 'dangling' has 2 problems:\n"
                       "  - source 'b' has no path to a sink: what it emits is never written (give it a sink(), or "
                       "an edge toward one)\n"
                       "  - operator 'lost' has no path to a sink: what it emits is never written (give it a sink(), "
                       "or an edge toward one)")
    g = Graph("nothing")
    two_sources(g)[0].key_by("account").process(Keyed(), uid="k")
    assert error_of(g.build) == "graph 'nothing' is invalid: the graph has no sink: declare one with sink()"


def test_a_two_input_operator_with_inputs_keyed_by_different_columns_is_refused():
    g = Graph("join")
    a, b = two_sources(g, {"acct": "string", "n": "long"})
    a.key_by("account").connect(b.key_by("acct")).process(Keyed(), uid="j").sink("out", table("gold/out"))
    assert error_of(g.build) == (
        "graph 'join' is invalid: two-input operator 'j' has inputs keyed differently: 'account' (from a, input 1), "
        "'acct' (from b, input 2): both inputs of a two-input keyed operator must be keyed by the same column of the "
        "same type (one keyed state, as Flink's KeyedCoProcessFunction)")


def test_a_two_input_operator_with_inputs_keyed_by_columns_of_different_types_is_refused():
    g = Graph("join")
    a, b = two_sources(g, {"account": "long", "n": "long"})
    a.key_by("account").connect(b.key_by("account")).process(Keyed(), uid="j").sink("out", table("gold/out"))
    assert "two-input operator 'j' has inputs keyed by 'account' of different types: string (from a, input 1), " \
           "long (from b, input 2): both inputs" in error_of(g.build)
    g = Graph("join")  # a type's other name is the same type; an operator's output has no known type
    a, b = two_sources(g, {"account": "STRING", "n": "bigint"})
    j = a.key_by("account").connect(b.key_by("account")).process(Keyed(), uid="j")
    j.sink("out", table("gold/out"))
    j.output("x").key_by("account").connect(b.key_by("account")).process(Keyed(), uid="j2").sink("o2", table("gold/2"))
    assert g.build().vertex("j2").kind is OperatorKind.TWO_INPUT_KEYED


def test_a_keyed_operator_fed_by_streams_keyed_differently_is_refused():
    """With the builder, only a feedback edge can feed a single-input operator a second time."""
    g = Graph("u")
    k = g.source("a", DeltaSource("landing/a", MOVES)).key_by("account").process(Keyed(), uid="k")
    k.sink("out", table("gold/out")).output("back").key_by("region").iterate(into=k)
    assert error_of(g.build) == (
        "graph 'u' is invalid: keyed operator 'k' has inputs keyed differently: 'account' (from a), 'region' (from k, "
        "feedback): every input of a keyed operator must be keyed by the same column of the same type (one keyed "
        "state)")


def test_an_edge_declared_twice_is_refused():
    """Each edge has a channel log of its own: a hand-built graph with the same edge twice is refused
    by validation (a GraphError naming it), not by the channel-log naming later."""
    g = Graph("twice")
    a = g.source("a", DeltaSource("landing/a", {"account": "string", "n": "long"}))
    a.key_by("account").process(Keyed(), uid="k").sink("out", table("gold/out"))
    built = g.build()
    twice = StreamGraph(built.name, built.vertices, built.edges + built.edges[:1], built.sinks)
    assert "edge a -> k: declared twice (output 'records' into input 1)" in error_of(lambda: validate(twice))


def test_duplicate_uids_and_names_are_refused():
    g = Graph("dup")
    a, b = two_sources(g)
    a.key_by("account").process(Keyed(), uid="count").sink("one", table("gold/one"))
    b.key_by("account").process(Keyed(), uid="count").sink("two", table("gold/two"))
    assert error_of(g.build) == ("graph 'dup' is invalid: operator uid 'count' is declared 2 times: each operator "
                                 "needs its own uid (a snapshot finds an operator's state by it)")
    g = Graph("dup")
    a, b = two_sources(g)
    a.key_by("account").process(Keyed(), uid="b").sink("out", table("gold/one"))
    b.sink("out", table("gold/two"))
    message = error_of(g.build)
    assert "'b' names a source and an operator: every vertex needs its own name" in message
    assert "sink name 'out' is declared 2 times: a sink's name is its operator id (sink_<name>)" in message
    g = Graph("dup")
    g.source("a", DeltaSource("landing/a", MOVES)).sink("x", table("gold/x"))
    g.source("a", DeltaSource("landing/b", MOVES)).sink("y", table("gold/y"))
    assert "source name 'a' is declared 2 times" in error_of(g.build)


def test_names_must_follow_the_name_rule():
    g = Graph("Bad Graph")
    s = g.source("Payments", DeltaSource("landing/p", MOVES))
    s.key_by("account").process(Keyed(), uid="running-balance").sink("Ledger", table("gold/l"))
    message = error_of(g.build)
    for kind, value in (("graph name", "Bad Graph"), ("source name", "Payments"), ("operator uid", "running-balance"),
                        ("sink name", "Ledger")):
        assert f"{kind} {value!r} must be lower-case letters, digits and _, starting with a letter" in message


def test_parallelism_must_be_in_range_and_equal_across_a_forward_edge():
    g = Graph("par", max_parallelism=8)
    s = g.source("s", DeltaSource("landing/s", MOVES), parallelism=0)
    s.key_by("account", parallelism=9).process(Keyed(), uid="k").sink("out", table("gold/out"))
    message = error_of(g.build)
    assert "source 's': parallelism must be in 1..8, got 0" in message
    assert "operator 'k': parallelism must be in 1..8, got 9" in message
    g = Graph("fwd")
    s = g.source("s", DeltaSource("landing/s", MOVES), parallelism=2)
    s.forward().process(Stateless(), uid="f", parallelism=3).sink("out", table("gold/out"))
    assert error_of(g.build) == ("graph 'fwd' is invalid: edge s -> f: forward() needs the same parallelism on both "
                                 "sides: 's' has 2, 'f' has 3")


def test_an_operators_kind_fits_its_inputs():
    g = Graph("kinds")
    s = g.source("s", DeltaSource("landing/s", MOVES))
    s.rebalance().process(Keyed(), uid="k").sink("out", table("gold/out"))
    assert ("operator 'k' has keyed state (n long) but no keyed input: keyed state is partitioned by key, so use "
            "key_by()") in error_of(g.build)
    src = DeltaSource("landing/s", MOVES)
    mixed = StreamGraph("mixed", (SourceVertex("s", src), OperatorVertex("k", Keyed(), "keyed"),
                                  OperatorVertex("f", Stateless(), "stateless")),
                        (Edge("s", "k", "rebalance"), Edge("s", "f", "hash", "account"), Edge("s", "k", "hash")),
                        (VertexSink("a", "k", table("gold/a"), "a"), VertexSink("b", "f", table("gold/b"), "b")))
    message = error_of(lambda: validate(mixed))
    assert "keyed operator 'k' has a rebalance() input from 's': every input of a keyed operator is key_by()" in message
    assert "stateless operator 'f' has a key_by(account) input from 's': after key_by() an operator is keyed" in message
    assert "edge s -> k: a hash edge (key_by) needs its key column" in message


def test_edges_join_declared_vertices_into_inputs_they_have():
    src = DeltaSource("landing/s", MOVES)
    graph = StreamGraph("e", (SourceVertex("s", src), SourceVertex("t", src),
                              OperatorVertex("j", Keyed(), "two_input_keyed"), OperatorVertex("k", Keyed(), "keyed")),
                        (Edge("s", "ghost", "rebalance"), Edge("s", "t", "forward"), Edge("s", "j", "hash", "account"),
                         Edge("s", "k", "hash", "account", input=2), Edge("k", "j", "hash", "account", input=3),
                         Edge("s", "k", "rebalance", key="account", output="x")),
                        (VertexSink("out", "j", table("gold/out"), "out"),))
    message = error_of(lambda: validate(graph))
    for expected in ("edge s -> ghost: no vertex 'ghost'", "edge s -> t: 't' is a source, and a source has no inputs",
                     "edge s -> k: into input 2, but operator 'k' has one input (1)",
                     "edge k -> j: into input 3, but operator 'j' has inputs 1 and 2",
                     "edge s -> k: a source has one output, 'records', not 'x'",
                     "edge s -> k: only a hash edge (key_by) has a key; this one is rebalance",
                     "two-input operator 'j' has nothing on input 2"):
        assert expected in message, expected


def test_each_table_is_written_once_and_never_a_source_of_the_graph():
    g = Graph("tables")
    s = g.source("s", DeltaSource("landing/s", MOVES)).dead_letters("gold/./a").dead_letters("dlq/s")
    k = s.key_by("account").process(Keyed(), uid="k")
    k.sink("a", table("gold/a")).sink("b", table("gold/a")).sink("c", table("landing/s"))
    message = error_of(g.build)
    assert "sink 'a' and sink 'b' both write gold/a: a table is the target of one sink" in message
    assert "sink 'a' and the dead letters of 's' both write gold/./a" in message
    assert "source 's' has 2 dead-letter tables: a vertex has one" in message
    assert ("sink 'c' writes landing/s, which source 's' reads: a graph that reads its own output is a cycle; use "
            "iterate() for a feedback edge") in message


def test_every_problem_is_reported_at_once():
    g = Graph("many")
    s = g.source("s", DeltaSource("landing/s", MOVES), parallelism=0)
    s.key_by("nope").process(Keyed(), uid="Bad")
    err = pytest.raises(GraphError, g.build).value
    assert isinstance(err, ValueError) and err.graph == "many" and len(err.problems) == 4
    assert str(err).splitlines()[0] == "graph 'many' has 4 problems:"
    assert all(line.startswith("  - ") for line in str(err).splitlines()[1:])


# --- the lowering of today's linear pipelines ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["payments", "transfers", "orders"])
def test_the_registered_pipelines_lower_to_two_vertices_with_their_ids(name):
    pipeline = pipelines.get(name)
    graph = from_pipeline(pipeline)
    source, operator = graph.vertices
    assert (source.id, source.parallelism, source.spec) == ("source", 2, pipeline.source_spec)
    assert (operator.id, operator.kind, operator.parallelism, operator.operator) == (
        pipeline.operator_uid, OperatorKind.KEYED, 3, pipeline.operator)
    assert graph.edges[0] == Edge("source", operator.id, "hash", pipeline.key)
    assert [(s.name, s.vertex, s.output, s.spec) for s in graph.sinks] == [
        (n, operator.id, n, spec) for n, spec in pipeline.sinks.items()]
    # stamped as the linear runtime always stamped them: a replay after an upgrade filters on it
    assert graph.dead_letters == (DeadLetters("source", pipeline.dlq_path, stamp="dlq"),)
    assert graph.operator_ids() == pipeline.operator_ids()  # what snapshots already match by


def test_transfers_lowers_with_its_map_its_bootstrap_and_the_feedback_edge():
    pipeline = pipelines.get("transfers")
    graph = from_pipeline(pipeline)
    assert [m.name for m in graph.sources[0].maps] == ["_debits"]
    assert graph.sources[0].bootstrap is pipeline.bootstrap_spec
    assert graph.sources[0].record_schema == pipeline.record_schema
    assert graph.edges[1] == Edge("bank", "bank", "hash", "account", output=FEEDBACK, feedback=True)
    assert shape(graph) == "2 vertices, 2 edges (1 feedback), 1 sink"


@pytest.mark.parametrize("how", ["rebalance", "broadcast", "forward"])
def test_a_stateless_pipeline_lowers_with_its_partitioning_and_parallelism(how):
    p = Pipeline("flat").source(DeltaSource("landing/in", MOVES), parallelism=2)
    p = getattr(p, how)(*([] if how == "forward" else [4])).process(Stateless(), uid="copy")
    p = p.sink("out", table("gold/out")).dead_letters("dlq/flat")
    graph = from_pipeline(p.with_parallelism(operator=5 if how != "forward" else None))
    assert graph.vertices[1].kind is OperatorKind.STATELESS
    assert graph.vertices[1].parallelism == (2 if how == "forward" else 5)
    assert graph.edges == (Edge("source", "copy", how),)


def test_a_state_ttls_max_ahead_lowers_to_its_sources_ahead_bound_which_is_checked():
    class Sessions(Keyed):
        state_schema = "n long, last timestamp"
        state_ttl = StateTtl(timedelta(minutes=30), "ts", max_ahead=timedelta(hours=6))

    clicks = {"user": "string", "ts": "timestamp"}
    p = Pipeline("clicks").source(DeltaSource("landing/clicks", clicks)).key_by("user").process(Sessions(), uid="s")
    graph = from_pipeline(p.sink("out", table("gold/out")).dead_letters("dlq/clicks"))
    assert graph.sources[0].ahead == AheadBound("ts", timedelta(hours=6))

    def bounded(ahead):
        g = Graph("g")
        g.source("a", DeltaSource("landing/a", {**clicks, "n": "long"}), ahead=ahead).key_by("user").process(
            Keyed(), uid="k").sink("out", table("gold/out"))
        return g.build()

    assert bounded(AheadBound("ts", timedelta(days=1))).sources[0].ahead.time_column == "ts"
    assert "source 'a': ahead's time_column 'n' must be a timestamp column of the source, got 'long'" in error_of(
        lambda: bounded(AheadBound("n", timedelta(days=1))))
    assert "ahead's max_ahead must be a positive timedelta, got datetime.timedelta(0)" in error_of(
        lambda: bounded(AheadBound("ts", timedelta(0))))
    assert "ahead must be an AheadBound, got 3600" in error_of(lambda: bounded(3600))


def test_an_incomplete_pipeline_says_what_it_misses():
    with pytest.raises(ValueError, match="pipeline 'half' is incomplete: missing key_by"):
        from_pipeline(Pipeline("half").source(DeltaSource("landing/in", MOVES)))


# --- drawings ------------------------------------------------------------------------------------------------------

def test_the_text_drawing_of_transfers():
    assert to_text(from_pipeline(pipelines.get("transfers"))) == (
        "transfers: 2 vertices, 2 edges (1 feedback), 1 sink\n"
        "\n"
        "source (source, parallelism 2)\n"
        "  reads landing/transfers (DeltaSource), bootstrap landing/accounts\n"
        "  maps: _debits\n"
        "  -> bank: hash(account)\n"
        "  dead letters: dlq/transfers\n"
        "bank (keyed Bank, parallelism 3)\n"
        "  -> bank: hash(account), output feedback, feedback (iterate)\n"
        "  sink account_balances: gold/account_balances (upsert by account)\n")


def test_the_text_drawing_lists_vertices_in_topological_order_with_inputs_and_outputs():
    text = to_text(shop().build())
    assert text.splitlines()[0] == "shop: 6 vertices, 5 edges, 4 sinks"
    heads = [line.split(" (")[0] for line in text.splitlines()[2:] if not line.startswith(" ")]
    assert heads == ["payments", "refunds", "accounts", "enrich", "fraud", "audit"]
    for line in ("enrich (two-input keyed Enrich, parallelism 4)", "  -> enrich input 2: hash(account)",
                 "  -> fraud: hash(region), output moves", "  -> audit: rebalance, output audit",
                 "audit (stateless Stateless, parallelism 3)", "  sink accounts_copy: silver/accounts (append)",
                 "  dead letters: dlq/fraud"):
        assert line in text.splitlines(), line


_STRING = r'"(?:[^"\\]|\\.)*"'


def dot_parts(text: str) -> tuple[set[str], list[tuple[str, str]]]:
    """A small check of DOT's grammar for what we write (one statement a line), and the node ids
    and edges it declares."""
    lines = text.strip().splitlines()
    assert re.fullmatch(rf"digraph {_STRING} \{{", lines[0]) and lines[-1] == "}"
    bare = re.sub(_STRING, '""', text)
    assert bare.count("{") == bare.count("}") == 1 and bare.count("[") == bare.count("]")
    nodes, edges = set(), []
    attrs = r"(?: \[[^\[\]]*\])?"
    for line in lines[1:-1]:
        if m := re.fullmatch(rf"  ({_STRING}) -> ({_STRING}){attrs};", line):
            edges.append((json.loads(m[1]), json.loads(m[2])))
        elif m := re.fullmatch(rf"  ({_STRING}){attrs};", line):
            nodes.add(json.loads(m[1]))
        else:
            assert re.fullmatch(rf"  (\w+=\w+|(node|edge){attrs});", line), line
    assert {n for e in edges for n in e} <= nodes
    return nodes, edges


@pytest.mark.parametrize("build", [lambda: shop().build()] + [
    (lambda n=n: from_pipeline(pipelines.get(n))) for n in ("payments", "transfers", "orders")])
def test_the_dot_drawing_parses_and_has_every_vertex_edge_sink_and_dead_letter_table(build):
    graph = build()
    nodes, edges = dot_parts(to_dot(graph))
    assert nodes == ({v.id for v in graph.vertices} | {f"sink:{s.name}" for s in graph.sinks}
                     | {f"dead_letters:{d.vertex}" for d in graph.dead_letters})
    assert edges == ([(e.sender, e.receiver) for e in graph.edges] + [(s.vertex, f"sink:{s.name}") for s in graph.sinks]
                     + [(d.vertex, f"dead_letters:{d.vertex}") for d in graph.dead_letters])


def test_the_dot_drawing_escapes_labels_and_dashes_feedback():
    dot = to_dot(from_pipeline(pipelines.get("transfers")))
    feedback = '"bank" -> "bank" [label="hash(account)\\noutput feedback\\nfeedback", style=dashed, constraint=false];'
    assert feedback in dot
    g = Graph("q")
    g.source("s", DeltaSource('landing/s', MOVES)).map(lambda df: df).sink("out", table("gold/out"))
    graph = g.build()
    quoted = StreamGraph(graph.name, graph.vertices, graph.edges,
                         (VertexSink("out", "s", type("Odd\"Sink", (), {})(), RECORDS),))
    nodes, _ = dot_parts(to_dot(quoted))
    assert 'Odd\\"Sink' in to_dot(quoted) and "sink:out" in nodes


SVG = "{http://www.w3.org/2000/svg}"


def svg_parts(svg: str):
    """The boxes (node -> (x, its text lines)) and the edges' paths of a :func:`to_svg` drawing,
    parsed as XML (so it is well formed)."""
    from xml.etree import ElementTree

    root = ElementTree.fromstring(svg)
    assert root.tag == f"{SVG}svg" and root.get("class") == "jobgraph"
    boxes = {g.get("data-node"): (float(g.find(f"{SVG}rect").get("x")), [t.text for t in g.iter(f"{SVG}text")])
             for g in root.iter(f"{SVG}g")}
    paths = [p for p in root.iter(f"{SVG}path") if "edge" in (p.get("class") or "")]
    return boxes, paths


@pytest.mark.parametrize("build", [lambda: shop().build()] + [
    (lambda n=n: from_pipeline(pipelines.get(n))) for n in ("payments", "transfers")])
def test_the_svg_drawing_has_a_box_per_vertex_and_sink_and_an_arrow_per_edge(build):
    graph = build()
    boxes, paths = svg_parts(to_svg(graph))
    assert set(boxes) == {v.id for v in graph.vertices} | {f"sink:{s.name}" for s in graph.sinks}
    assert len(paths) == len(graph.edges) + len(graph.sinks)
    assert len([p for p in paths if p.get("stroke-dasharray")]) == sum(e.feedback for e in graph.edges)
    for e in graph.edges:  # left to right, but for a feedback edge
        assert e.feedback or boxes[e.sender][0] < boxes[e.receiver][0], e
    for s in graph.sinks:
        assert boxes[s.vertex][0] < boxes[f"sink:{s.name}"][0] and boxes[f"sink:{s.name}"][1][0] == f"sink {s.name}"


def test_the_svg_drawing_says_each_vertexs_kind_takes_notes_and_escapes_text():
    boxes, _ = svg_parts(to_svg(shop().build(), {"enrich": "4/4 acked, 1.2 KiB", "sink:audit": "owns <3> txn"}))
    assert boxes["enrich"][1] == ["enrich", "two-input keyed x4", "Enrich", "4/4 acked, 1.2 KiB"]
    assert boxes["payments"][1] == ["payments", "source x2", "landing/payments"]
    assert boxes["sink:audit"][1] == ["sink audit", "gold/audit (append)", "owns <3> txn"]
    assert boxes["payments"][0] == boxes["refunds"][0] < boxes["enrich"][0] < boxes["fraud"][0] < boxes["audit"][0]
    assert "owns &lt;3&gt; txn" in to_svg(shop().build(), {"sink:audit": "owns <3> txn"})


def test_the_json_document_of_transfers():
    doc = json.loads(json.dumps(to_dict(from_pipeline(pipelines.get("transfers")))))
    assert doc == {
        "name": "transfers", "max_parallelism": 128,
        "vertices": [
            {"id": "source", "kind": "source", "parallelism": 2,
             "reads": {"type": "DeltaSource", "path": "landing/transfers"},
             "bootstrap": "landing/accounts", "maps": ["_debits"]},
            {"id": "bank", "kind": "keyed", "parallelism": 3, "operator": "Bank", "inputs": 1}],
        "edges": [
            {"from": "source", "output": "records", "to": "bank", "input": 1, "partitioning": "hash",
             "key": "account", "feedback": False},
            {"from": "bank", "output": "feedback", "to": "bank", "input": 1, "partitioning": "hash",
             "key": "account", "feedback": True}],
        "sinks": [{"name": "account_balances", "vertex": "bank", "output": "account_balances", "type": "DeltaSink",
                   "path": "gold/account_balances", "mode": "upsert", "keys": ["account"]}],
        "dead_letters": [{"vertex": "source", "path": "dlq/transfers"}]}


def test_the_json_document_of_a_graph_has_every_vertex_edge_and_sink():
    graph = shop().build()
    doc = json.loads(json.dumps(to_dict(graph)))
    assert [(v["id"], v["kind"]) for v in doc["vertices"]] == [
        ("payments", "source"), ("refunds", "source"), ("accounts", "source"), ("enrich", "two_input_keyed"),
        ("fraud", "keyed"), ("audit", "stateless")]
    assert doc["vertices"][3]["inputs"] == 2 and doc["vertices"][2]["bootstrap"] is None
    assert [(e["from"], e["to"], e["input"]) for e in doc["edges"]] == [(e.sender, e.receiver, e.input)
                                                                        for e in graph.edges]
    assert [s["name"] for s in doc["sinks"]] == ["enriched", "alerts", "audit", "accounts_copy"]
    assert doc["sinks"][-1]["output"] == "records" and doc["sinks"][0]["keys"] == []

"""The plan of how a graph runs (checkpoint_lib/graph/jobgraph.py): chained and cut edges with their
reasons, channel-log names (today's kept), process groups and their chains, every refusal, the
JSON form and the drawings of a plan. Pure: no engine."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from checkpoint_lib import layout, pipelines
from checkpoint_lib.graph import (ALL, Chain, CutReason, Graph, GraphError, Input, JobEdge, JobGraph, Layout,
                                  PlanError, ProcessGroup, StreamGraph, from_pipeline, plan, to_dot, to_text)
from checkpoint_lib.pipeline import DeltaSink, DeltaSource

MOVES = {"account": "string", "cents": "long"}
PROCESSES, CYCLE, LAGGING = CutReason.PROCESSES, CutReason.CYCLE, CutReason.LAGGING
INPUTS, SENDER = CutReason.INPUTS, CutReason.SENDER
ROOT = Path("/w/_checkpoints/p")


class Keyed:
    state_schema = "n long"

    def apply(self, records, state, key):
        return state, {}


class Stateless:
    def apply(self, records):
        return {}


def table(path: str) -> DeltaSink:
    return DeltaSink(path, "account string, n long")


def diamond() -> StreamGraph:
    """s -> a, s -> b (stateless), a and b unioned into the keyed c: a diamond."""
    g = Graph("diamond")
    s = g.source("s", DeltaSource("landing/s", MOVES), parallelism=2)
    a = s.rebalance(2).process(Stateless(), uid="a")
    b = s.rebalance(3).process(Stateless(), uid="b")
    a.union(b).key_by("account", parallelism=4).process(Keyed(), uid="c").sink("out", table("gold/out"))
    return g.build()


def join(same_source: bool = False) -> StreamGraph:
    """orders (input 1) and shipments (input 2) into the two-input keyed ``join``; with
    ``same_source``, one source feeds both inputs (a self-join)."""
    g = Graph("join")
    orders = g.source("orders", DeltaSource("landing/orders", MOVES))
    shipments = orders if same_source else g.source("shipments", DeltaSource("landing/shipments", MOVES))
    joined = orders.key_by("account", parallelism=2).connect(shipments.key_by("account")).process(Keyed(), uid="join")
    joined.sink("joined", table("gold/joined"))
    return g.build()


def edges_of(job: JobGraph) -> list[tuple]:
    return [(e.sender, e.output, e.receiver, e.input, e.reasons, e.channel_log) for e in job.edges]


def groups_of(job: JobGraph) -> list[tuple]:
    """Each group with its vertices, chains (vertices), reads and writes (log names), sources, sinks."""
    return [(g.name, g.vertices, [c.vertices for c in g.chains], [e.channel_log for e in g.reads],
             [e.channel_log for e in g.writes], g.sources, g.sinks) for g in job.groups]


def error_of(call) -> str:
    with pytest.raises(PlanError) as raised:
        call()
    assert isinstance(raised.value, ValueError)
    return str(raised.value)


# --- today's linear pipelines, lowered -----------------------------------------------------------------------------

TODAYS_LOGS = {"payments": ["source_balance"], "orders": ["source_customer_orders"],
               "transfers": ["source_bank", "bank_bank"]}


def test_payments_chained_is_one_process_one_chain_and_no_channel_log():
    graph = from_pipeline(pipelines.get("payments"))
    job = plan(graph)
    assert job == plan(graph, Layout.CHAINED) == plan(graph, "chained")
    assert edges_of(job) == [("source", "records", "balance", 1, (), None)]
    assert job.chained == job.edges and job.cut == ()
    assert groups_of(job) == [(ALL, ("source", "balance"), [("source", "balance")], [], [], ("source",),
                               ("ledger", "balances"))]
    (group,) = job.groups
    assert group.plans_steps and group.chains[0].edges == job.edges
    assert job.processes == {"source": "all", "balance": "all"} and job.lagging == ()


def test_transfers_chained_cuts_its_feedback_edge_and_so_its_source_edge():
    graph = from_pipeline(pipelines.get("transfers"))
    job = plan(graph)
    # the operator reads its feedback from a log, so it reads its other input from one too (as the
    # linear runner always did): its barrier handlers align over every channel alike
    assert edges_of(job) == [("source", "records", "bank", 1, (INPUTS,), "source_bank"),
                             ("bank", "feedback", "bank", 1, (CYCLE,), "bank_bank")]
    feedback = job.edges[1]
    assert feedback.cut and not feedback.chained and feedback.feedback
    assert job.gated == ("bank",)
    # both logs are read and written by the one process; each vertex is its own chain
    assert groups_of(job) == [(ALL, ("source", "bank"), [("source",), ("bank",)], ["source_bank", "bank_bank"],
                               ["source_bank", "bank_bank"], ("source",), ("account_balances",))]
    assert job.groups[0].chains[1] == Chain(("bank",), (), job.edges, (feedback,))


@pytest.mark.parametrize("name", ["payments", "transfers", "orders"])
@pytest.mark.parametrize("how", [Layout.PER_VERTEX, Layout.STAGES])
def test_apart_every_edge_is_cut_into_the_channel_log_a_warehouse_already_holds(name, how):
    pipeline = pipelines.get(name)
    job = plan(from_pipeline(pipeline), how)
    uid = pipeline.operator_uid
    assert [e.channel_log for e in job.edges] == TODAYS_LOGS[name]
    assert [e.reasons for e in job.edges] == [(PROCESSES,), (CYCLE,)][:len(job.edges)]
    # the one definition of the path, as the runtime spells it
    assert job.edges[0].log(ROOT) == layout.channel_log(ROOT, "source", uid) == ROOT / "channels" / f"source_{uid}"
    if pipeline.feedback:
        assert job.edges[1].log(ROOT) == layout.channel_log(ROOT, uid, uid) == ROOT / "channels" / f"{uid}_{uid}"
    keyed = "keyed" if how is Layout.STAGES else uid
    assert groups_of(job) == [
        ("source", ("source",), [("source",)], [], [f"source_{uid}"], ("source",), ()),
        (keyed, (uid,), [(uid,)], TODAYS_LOGS[name], TODAYS_LOGS[name][1:], (), tuple(pipeline.sinks))]
    assert not job.group(keyed).plans_steps and job.group_of(uid).name == keyed


def test_the_stages_layout_names_todays_stages_and_per_vertex_names_each_vertex():
    graph = from_pipeline(pipelines.get("transfers"))
    assert Layout.STAGES.processes(graph) == {"source": "source", "bank": "keyed"}
    assert Layout.PER_VERTEX.processes(graph) == {"source": "source", "bank": "bank"}
    assert Layout.CHAINED.processes(graph) == {"source": "all", "bank": "all"}
    assert [str(x) for x in Layout] == ["chained", "stages", "per_vertex"]
    assert [str(r) for r in CutReason] == ["processes", "unchained", "cycle", "lagging", "inputs", "sender"]


def test_chaining_off_cuts_every_edge_in_one_process_as_the_airflow_layout_does():
    """``ckpt run --no-chaining``: every operator a gate reading channel logs, in one process, the
    logs named as the per-vertex layout names them; the JSON document says so and round-trips."""
    for name in ("payments", "transfers"):
        graph = from_pipeline(pipelines.get(name))
        off = plan(graph, chaining=False)
        assert [g.name for g in off.groups] == [ALL] and not off.chained
        assert all(CutReason.UNCHAINED in e.reasons for e in off.edges)
        apart = plan(graph, Layout.PER_VERTEX)
        assert [e.channel_log for e in off.edges] == [e.channel_log for e in apart.edges]
        assert off.gated == apart.gated and off.chaining is False and plan(graph).chaining is True
        doc = json.loads(json.dumps(off.to_dict()))
        assert doc["chaining"] is False and JobGraph.from_dict(graph, doc) == off
    older = plan(from_pipeline(pipelines.get("payments"))).to_dict()
    del older["chaining"]  # a document written before the key: chained
    assert JobGraph.from_dict(from_pipeline(pipelines.get("payments")), older).chaining is True


def test_a_lagging_input_is_cut_in_one_process_and_every_reason_is_named():
    graph = from_pipeline(pipelines.get("payments"))
    job = plan(graph, lagging=[("balance", 1)])
    assert edges_of(job) == [("source", "records", "balance", 1, (LAGGING,), "source_balance")]
    assert groups_of(job) == [(ALL, ("source", "balance"), [("source",), ("balance",)], ["source_balance"],
                               ["source_balance"], ("source",), ("ledger", "balances"))]
    assert job.lagging == (Input("balance", 1),)
    for same in ("balance", Input("balance"), ("balance", 1), ["balance"], [Input("balance", 1)]):
        assert plan(graph, lagging=same) == job
    apart = plan(graph, Layout.PER_VERTEX, lagging=["balance"])
    assert apart.edges[0].reasons == (PROCESSES, LAGGING)
    transfers = plan(from_pipeline(pipelines.get("transfers")), Layout.PER_VERTEX, lagging=["bank"])
    assert [e.reasons for e in transfers.edges] == [(PROCESSES, LAGGING), (CYCLE, LAGGING)]


# --- a diamond and a two-input join, in several layouts ------------------------------------------------------------

def test_a_diamond_chained_is_one_plan_per_step():
    job = plan(diamond())
    assert edges_of(job) == [("s", "records", "a", 1, (), None), ("s", "records", "b", 1, (), None),
                             ("a", "main", "c", 1, (), None), ("b", "main", "c", 1, (), None)]
    assert groups_of(job) == [(ALL, ("s", "a", "b", "c"), [("s", "a", "b", "c")], [], [], ("s",), ("out",))]
    assert job.groups[0].chains[0].edges == job.edges


def test_a_diamond_per_vertex_cuts_every_edge_and_orders_the_groups_topologically():
    job = plan(diamond(), Layout.PER_VERTEX)
    assert edges_of(job) == [("s", "records", "a", 1, (PROCESSES,), "s_a"),
                             ("s", "records", "b", 1, (PROCESSES,), "s_b"),
                             ("a", "main", "c", 1, (PROCESSES, SENDER), "a_c"),
                             ("b", "main", "c", 1, (PROCESSES, SENDER), "b_c")]
    assert job.gated == ("a", "b", "c")
    assert groups_of(job) == [("s", ("s",), [("s",)], [], ["s_a", "s_b"], ("s",), ()),
                              ("a", ("a",), [("a",)], ["s_a"], ["a_c"], (), ()),
                              ("b", ("b",), [("b",)], ["s_b"], ["b_c"], (), ()),
                              ("c", ("c",), [("c",)], ["a_c", "b_c"], [], (), ("out",))]


def test_a_diamond_split_in_two_chains_what_shares_a_group():
    job = plan(diamond(), {"c": "left", "b": "right", "a": "left", "s": "left"})
    assert [(e.sender, e.receiver, e.reasons) for e in job.edges] == [
        ("s", "a", ()), ("s", "b", (PROCESSES,)), ("a", "c", (INPUTS,)), ("b", "c", (PROCESSES, SENDER))]
    # c reads b's records from a log, so it reads a's from one too
    assert groups_of(job) == [("left", ("s", "a", "c"), [("s", "a"), ("c",)], ["a_c", "b_c"], ["s_b", "a_c"], ("s",),
                               ("out",)),
                              ("right", ("b",), [("b",)], ["s_b"], ["b_c"], (), ())]
    left_chain = job.group("left").chains[0]
    assert [(e.sender, e.receiver) for e in left_chain.edges] == [("s", "a")]
    assert job.gated == ("b", "c")
    assert job.processes == {"s": "left", "a": "left", "b": "right", "c": "left"}  # declaration order


def test_a_group_whose_vertices_are_not_joined_by_chained_edges_has_a_chain_each():
    # the source and the last vertex in one process, the middle in another: nothing chains
    job = plan(diamond(), {"s": "ends", "a": "middle", "b": "middle", "c": "ends"})
    assert [e.reasons for e in job.edges] == [(PROCESSES,), (PROCESSES,), (PROCESSES, SENDER), (PROCESSES, SENDER)]
    assert groups_of(job) == [("ends", ("s", "c"), [("s",), ("c",)], ["a_c", "b_c"], ["s_a", "s_b"], ("s",), ("out",)),
                              ("middle", ("a", "b"), [("a",), ("b",)], ["s_a", "s_b"], ["a_c", "b_c"], (), ())]
    ends = job.group("ends")
    assert [(c.vertices, [e.channel_log for e in c.reads], [e.channel_log for e in c.writes]) for c in ends.chains] == [
        (("s",), [], ["s_a", "s_b"]), (("c",), ["a_c", "b_c"], [])]


def test_groups_are_ordered_by_their_first_vertex_not_by_the_map_or_their_names():
    job = plan(diamond(), {"c": "aaa", "b": "bbb", "a": "zzz", "s": "zzz"})
    assert [g.name for g in job.groups] == ["zzz", "bbb", "aaa"]
    assert [g.vertices for g in job.groups] == [("s", "a"), ("b",), ("c",)]


def test_groups_and_their_vertices_follow_the_topological_order_not_the_declaration_order():
    built = diamond()
    backwards = StreamGraph(built.name, tuple(reversed(built.vertices)), built.edges, built.sinks)
    job = plan(backwards, Layout.PER_VERTEX)
    assert list(job.processes) == ["c", "b", "a", "s"]  # declaration order
    assert [g.name for g in job.groups] == ["s", "b", "a", "c"]  # b is declared before a
    job = plan(backwards, {"c": "one", "b": "two", "a": "one", "s": "two"})
    assert [(g.name, g.vertices, [c.vertices for c in g.chains]) for g in job.groups] == [
        ("two", ("s", "b"), [("s", "b")]), ("one", ("a", "c"), [("a",), ("c",)])]


def test_a_two_input_join_in_several_layouts():
    graph = join()
    assert edges_of(plan(graph)) == [("orders", "records", "join", 1, (), None),
                                     ("shipments", "records", "join", 2, (), None)]
    assert groups_of(plan(graph)) == [(ALL, ("orders", "shipments", "join"), [("orders", "shipments", "join")], [], [],
                                       ("orders", "shipments"), ("joined",))]
    apart = plan(graph, {"orders": "ingest", "shipments": "ingest", "join": "join"})
    assert edges_of(apart) == [("orders", "records", "join", 1, (PROCESSES,), "orders_join"),
                               ("shipments", "records", "join", 2, (PROCESSES,), "shipments_join")]
    assert groups_of(apart) == [
        ("ingest", ("orders", "shipments"), [("orders",), ("shipments",)], [], ["orders_join", "shipments_join"],
         ("orders", "shipments"), ()),
        ("join", ("join",), [("join",)], ["orders_join", "shipments_join"], [], (), ("joined",))]
    # one input of the join lags: the join then reads both inputs from logs
    lag = plan(graph, lagging=[("join", 2)])
    assert [e.reasons for e in lag.edges] == [(INPUTS,), (LAGGING,)]
    assert groups_of(lag) == [(ALL, ("orders", "shipments", "join"), [("orders",), ("shipments",), ("join",)],
                               ["orders_join", "shipments_join"], ["orders_join", "shipments_join"],
                               ("orders", "shipments"), ("joined",))]
    assert [e.reasons for e in plan(graph, lagging=["join"]).edges] == [(LAGGING,), (LAGGING,)]
    assert plan(graph, lagging=["join"]).lagging == (Input("join", 1), Input("join", 2))
    # a source in the join's process: its edge is cut too, as the other source's is
    mixed = plan(graph, {"orders": "join", "shipments": "ingest", "join": "join"})
    assert [e.reasons for e in mixed.edges] == [(INPUTS,), (PROCESSES,)]
    assert [g.name for g in mixed.groups] == ["join", "ingest"]
    assert groups_of(mixed)[0][2] == [("orders",), ("join",)]


# --- channel-log names ---------------------------------------------------------------------------------------------

def test_a_self_join_qualifies_its_two_channels():
    job = plan(join(same_source=True), Layout.PER_VERTEX)
    assert [e.channel_log for e in job.edges] == ["orders.records-join.1", "orders.records-join.2"]
    assert job.edges[1].log(ROOT) == ROOT / "channels" / "orders.records-join.2"
    assert job.edges[1].log(ROOT) == layout.channel_log(ROOT, "orders", "join", "records", 2)


def test_two_outputs_into_one_receiver_are_two_qualified_channels():
    g = Graph("outs")
    k = g.source("s", DeltaSource("landing/s", MOVES)).key_by("account").process(Keyed(), uid="k")
    k.union(k.output("large")).rebalance().process(Stateless(), uid="r").sink("out", table("gold/out"))
    job = plan(g.build(), Layout.PER_VERTEX)
    assert [e.channel_log for e in job.edges] == ["s_k", "k.main-r.1", "k.large-r.1"]


def test_names_that_meet_at_an_underscore_are_both_qualified():
    g = Graph("meet")
    g.source("a_b", DeltaSource("landing/ab", MOVES)).key_by("account").process(Keyed(), uid="c").sink(
        "c", table("gold/c"))
    g.source("a", DeltaSource("landing/a", MOVES)).key_by("account").process(Keyed(), uid="b_c").sink(
        "bc", table("gold/bc"))
    job = plan(g.build(), Layout.PER_VERTEX)
    assert [e.channel_log for e in job.edges] == ["a_b.records-c.1", "a.records-b_c.1"]
    assert len({e.log(ROOT) for e in job.edges}) == 2


def test_an_edges_name_does_not_depend_on_the_layout_or_on_lagging():
    graph = join(same_source=True)
    names = [e.channel_log for e in plan(graph, Layout.PER_VERTEX).edges]
    assert [e.channel_log for e in plan(graph, lagging=["join"]).edges] == names
    assert [e.channel_log for e in plan(graph, {"orders": "x", "join": "y"}).edges] == names


def test_a_chained_edge_has_no_channel_log():
    job = plan(from_pipeline(pipelines.get("payments")))
    with pytest.raises(ValueError, match=r"^edge source -> balance is chained: it has no channel log$"):
        job.edges[0].log(ROOT)


# --- refusals ------------------------------------------------------------------------------------------------------

def test_a_process_map_naming_an_unknown_vertex_is_refused():
    assert error_of(lambda: plan(diamond(), {"s": "x", "a": "x", "b": "x", "c": "x", "d": "x", "e": "x"})) == (
        "graph 'diamond' cannot be planned: the process map names vertices 'd', 'e' that graph 'diamond' does not "
        "have (its vertices: s, a, b, c)")


def test_a_process_map_missing_a_vertex_is_refused():
    assert error_of(lambda: plan(diamond(), {"s": "x", "a": "x", "b": "x"})) == (
        "graph 'diamond' cannot be planned: the process map leaves out vertex 'c': every vertex runs in one process "
        "group")


@pytest.mark.parametrize("name", ["Ingest", "a-b", "", "_x", "a" * 64, None, 3])
def test_a_group_name_that_is_not_a_name_is_refused(name):
    message = error_of(lambda: plan(diamond(), {"s": name, "a": "x", "b": "x", "c": name}))
    assert re.fullmatch(r"graph 'diamond' cannot be planned: vertex 's': process group name .* must be lower-case "
                        r"letters, digits and _, starting with a letter \(at most 63\)", message), message


@pytest.mark.parametrize("lag, problem", [
    (["nope"], "lagging input 'nope': graph 'join' has no vertex 'nope'"),
    ([("nope", 1)], "lagging input ('nope', 1): graph 'join' has no vertex 'nope'"),
    ([("orders", 1)], "lagging input ('orders', 1): 'orders' is a source, and a source has no inputs (name the input "
                      "of the operator its records reach late)"),
    ([("join", 3)], "lagging input ('join', 3): operator 'join' has inputs 1 and 2"),
    ([("join", True)], "lagging input ('join', True): operator 'join' has inputs 1 and 2"),
    ([("join", 1.0)], "lagging input ('join', 1.0): operator 'join' has inputs 1 and 2"),
    ([7], "lagging input 7: give a vertex id or a (vertex, input) pair"),
])
def test_a_lagging_input_the_graph_does_not_have_is_refused(lag, problem):
    assert error_of(lambda: plan(join(), lagging=lag)) == f"graph 'join' cannot be planned: {problem}"


def test_a_one_input_operator_has_input_1_only():
    graph = from_pipeline(pipelines.get("payments"))
    assert error_of(lambda: plan(graph, lagging=[Input("balance", 2)])) == (
        "graph 'payments' cannot be planned: lagging input ('balance', 2): operator 'balance' has one input (1)")


def test_every_problem_is_reported_at_once():
    err = pytest.raises(PlanError, plan, diamond(), {"s": "Bad", "a": "x", "z": "x"}, lagging=["s", "q"]).value
    assert err.graph == "diamond" and err.problems == (
        "the process map names vertex 'z' that graph 'diamond' does not have (its vertices: s, a, b, c)",
        "the process map leaves out vertices 'b', 'c': every vertex runs in one process group",
        "vertex 's': process group name 'Bad' must be lower-case letters, digits and _, starting with a letter "
        "(at most 63)",
        "lagging input 's': 's' is a source, and a source has no inputs (name the input of the operator its records "
        "reach late)",
        "lagging input 'q': graph 'diamond' has no vertex 'q'")
    assert str(err).splitlines()[0] == "graph 'diamond' cannot be planned, 5 problems:"
    assert all(line.startswith("  - ") for line in str(err).splitlines()[1:])


def test_a_layout_that_is_not_one_and_a_graph_that_is_invalid_are_refused():
    with pytest.raises(ValueError, match=r"^processes 'airflow' is not a layout \(chained, stages, per_vertex\): give"):
        plan(diamond(), "airflow")
    with pytest.raises(TypeError, match=r"^processes must be a Layout or a mapping vertex id -> process group, "
                                        r"got list$"):
        plan(diamond(), ["s"])
    valid = diamond()
    broken = StreamGraph(valid.name, valid.vertices, valid.edges[:1], valid.sinks)
    with pytest.raises(GraphError, match="has no path to a sink"):
        plan(broken)


def test_lookups_name_what_is_missing():
    job = plan(diamond(), Layout.PER_VERTEX)
    with pytest.raises(KeyError, match="has no process group 'x' \\(s, a, b, c\\)"):
        job.group("x")
    with pytest.raises(KeyError, match="graph 'diamond' has no vertex 'x'"):
        job.group_of("x")


# --- JSON ----------------------------------------------------------------------------------------------------------

def test_the_json_document_of_transfers_apart():
    graph = from_pipeline(pipelines.get("transfers"))
    doc = json.loads(json.dumps(plan(graph, Layout.PER_VERTEX, lagging=["bank"]).to_dict()))
    assert doc == {
        "graph": "transfers",
        "processes": {"source": "source", "bank": "bank"},
        "lagging": [{"vertex": "bank", "input": 1}],
        "chaining": True,
        "edges": [
            {"from": "source", "output": "records", "to": "bank", "input": 1, "feedback": False, "chained": False,
             "reasons": ["processes", "lagging"], "channel_log": "source_bank"},
            {"from": "bank", "output": "feedback", "to": "bank", "input": 1, "feedback": True, "chained": False,
             "reasons": ["cycle", "lagging"], "channel_log": "bank_bank"}],
        "groups": [
            {"name": "source", "vertices": ["source"], "sources": ["source"], "sinks": [], "chains": [["source"]],
             "reads": [], "writes": ["source_bank"]},
            {"name": "bank", "vertices": ["bank"], "sources": [], "sinks": ["account_balances"], "chains": [["bank"]],
             "reads": ["source_bank", "bank_bank"], "writes": ["bank_bank"]}]}


@pytest.mark.parametrize("build, processes, lagging", [
    (diamond, None, ()), (diamond, {"s": "ends", "a": "middle", "b": "middle", "c": "ends"}, ["c"]),
    (join, Layout.PER_VERTEX, [("join", 2)]), (lambda: join(same_source=True), Layout.STAGES, ()),
    (lambda: from_pipeline(pipelines.get("transfers")), Layout.CHAINED, ()),
])
def test_the_json_document_round_trips(build, processes, lagging):
    graph = build()
    job = plan(graph, processes, lagging=lagging)
    doc = json.loads(json.dumps(job.to_dict()))
    assert doc == job.to_dict()
    again = JobGraph.from_dict(graph, doc)
    assert again == job and again.to_dict() == doc


def test_a_document_of_another_graph_or_an_older_one_is_refused():
    doc = plan(diamond(), Layout.PER_VERTEX).to_dict()
    with pytest.raises(ValueError, match=r"^the plan document is of graph 'diamond', not 'join'$"):
        JobGraph.from_dict(join(), doc)
    stale = json.loads(json.dumps(doc))
    stale["edges"][0]["channel_log"] = "old_name"
    with pytest.raises(ValueError, match=r"^the plan document does not match graph 'diamond' planned with its "
                                         r"processes: its edges differ \(was the graph changed since\?\)$"):
        JobGraph.from_dict(diamond(), stale)
    with pytest.raises(ValueError, match=r"^the plan document of graph 'diamond' is malformed"):
        JobGraph.from_dict(diamond(), {"graph": "diamond", "processes": {}})
    with pytest.raises(PlanError, match="leaves out vertex 'c'"):
        JobGraph.from_dict(diamond(), {**doc, "processes": {"s": "s", "a": "a", "b": "b"}})


# --- drawings of a plan --------------------------------------------------------------------------------------------

def test_the_text_drawing_of_a_plan():
    graph = from_pipeline(pipelines.get("transfers"))
    assert to_text(graph, plan(graph, Layout.PER_VERTEX)) == (
        "transfers: 2 vertices, 2 edges (1 feedback), 1 sink\n"
        "process source: chain [source]; plans steps; writes source_bank\n"
        "process bank: chain [bank]; sinks account_balances; reads source_bank, bank_bank; writes bank_bank\n"
        "\n"
        "source (source, parallelism 2, process source)\n"
        "  reads landing/transfers (DeltaSource), bootstrap landing/accounts\n"
        "  maps: _debits\n"
        "  -> bank: hash(account); cut (processes), log source_bank\n"
        "  dead letters: dlq/transfers\n"
        "bank (keyed Bank, parallelism 3, process bank)\n"
        "  -> bank: hash(account), output feedback, feedback (iterate); cut (cycle), log bank_bank\n"
        "  sink account_balances: gold/account_balances (upsert by account)\n")
    text = to_text(diamond(), plan(diamond(), {"s": "ends", "a": "middle", "b": "middle", "c": "ends"}))
    assert text.splitlines()[1:3] == [
        "process ends: chains [s], [c]; plans steps; sinks out; reads a_c, b_c; writes s_a, s_b",
        "process middle: chains [a], [b]; reads s_a, s_b; writes a_c, b_c"]
    assert "  -> c: hash(account); cut (processes, sender), log a_c" in text.splitlines()
    assert "  -> a: rebalance; chained" in to_text(diamond(), plan(diamond())).splitlines()


def test_the_dot_drawing_of_a_plan_boxes_each_group_and_marks_each_edge():
    graph = diamond()
    dot = to_dot(graph, plan(graph, {"s": "left", "a": "left", "b": "right", "c": "left"}))
    lines = dot.splitlines()
    assert '  subgraph "cluster_left" { label="process left"; "s"; "a"; "c"; }' in lines
    assert '  subgraph "cluster_right" { label="process right"; "b"; }' in lines
    assert '  "s" -> "a" [label="rebalance\\nchained", style=bold];' in lines
    assert '  "s" -> "b" [label="rebalance\\ncut: processes\\nlog s_b"];' in lines
    # without a plan the drawing is the declared graph's, as before
    assert to_dot(graph) == "\n".join(line for line in lines if "subgraph" not in line).replace(
        "\\nchained", "").replace(", style=bold", "").replace("\\ncut: processes\\nlog s_b", "").replace(
        "\\ncut: processes, sender\\nlog b_c", "").replace(", style=bold", "").replace(
        "\\ncut: inputs\\nlog a_c", "") + "\n"


def test_a_plan_of_another_graph_is_not_drawn():
    with pytest.raises(ValueError, match=r"^the plan is of graph 'join', not of the graph drawn \('diamond'\)$"):
        to_text(diamond(), plan(join()))


def test_the_parts_are_frozen_values():
    job = plan(diamond())
    for part in (job, job.edges[0], job.groups[0], job.groups[0].chains[0], Input("c")):
        with pytest.raises(AttributeError):
            part.name = "x"
    assert isinstance(job.edges[0], JobEdge) and isinstance(job.groups[0], ProcessGroup)


# --- a gated vertex's channels -------------------------------------------------------------------------------------

def test_a_gated_vertex_numbers_its_channels_across_its_input_edges():
    from checkpoint_lib.graph import ChannelMap

    job = plan(join(), lagging=[("join", 2)])
    assert job.gated == ("join",)
    channels = job.channel_map("join")
    assert channels.edges == ("orders_join", "shipments_join")
    senders = tuple(job.graph.vertex(v).parallelism for v in ("orders", "shipments"))
    assert channels.senders == senders and channels.channels == sum(senders)
    every = [(edge, sender) for edge in range(2) for sender in range(senders[edge])]
    assert [channels.channel(*es) for es in every] == list(range(channels.channels))
    assert [channels.edge_of(c) for c in range(channels.channels)] == every
    with pytest.raises(ValueError, match="channel out of range"):
        channels.edge_of(channels.channels)
    with pytest.raises(ValueError, match="senders 0.."):
        channels.channel(0, senders[0])
    with pytest.raises(ValueError, match="one sender parallelism >= 1 per edge"):
        ChannelMap(("a",), (0,))
    with pytest.raises(ValueError, match="reads its inputs in-process"):
        plan(join()).channel_map("join")

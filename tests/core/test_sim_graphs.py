"""The simulator on dataflow graphs: random DAGs (fan-in from different vertices, fan-out,
diamonds, several sinks, varied parallelism) and a few named shapes, in every barrier mode, with
and without a crash, against the Chandy-Lamport checks, token conservation and exactly-once.

Every random case comes from a seeded rng (its seed, graph and crash step are in the failure
message); no hypothesis here, so a failing seed replays as it is. What the simulator checks by
itself lands in ``result.violations`` (see checkpoint_lib/sim/simulation.py); these tests add the
outputs: every record committed exactly once (at least once in at-least-once mode), every
subtask's state what the graph's routing says it must be.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections import Counter

import pytest

from checkpoint_lib.core.barriers import LogChannelState
from checkpoint_lib.core.decider import CheckpointConfig
from checkpoint_lib.core.types import BarrierMode, SubtaskId
from checkpoint_lib.sim import Aborts, Graph, Record, Simulation, Topology
from checkpoint_lib.sim import simulation

MODES = list(BarrierMode)
SEEDS = range(100)


# --- building cases ------------------------------------------------------------------------------


def random_graph(rng: random.Random, mode: BarrierMode) -> Graph:
    """1-3 sources, 2-6 stages. Each stage takes 1-3 inputs among the vertices declared before it
    (so the graph is acyclic): sources and stages alike, so fan-in joins paths of different
    lengths; a vertex picked by several stages fans out; two picks of a common ancestor's
    descendants make a diamond; every stage no one picks is a sink."""
    sources = {f"s{i}": rng.randint(1, 2) for i in range(rng.randint(1, 3))}
    stages = {f"v{i}": rng.randint(1, 3) for i in range(rng.randint(2, 6))}
    declared = list(sources)
    edges = []
    for v in stages:
        for u in rng.sample(declared, min(len(declared), rng.choice([1, 1, 2, 2, 3]))):
            edges.append((u, v))
        declared.append(v)
    for s in sources:
        if not any(u == s for u, _ in edges):
            edges.append((s, rng.choice(list(stages))))
    timeout = rng.choice([0.0, 0.5, 2.0]) if mode is BarrierMode.ALIGNED_WITH_TIMEOUT else None
    return Graph(sources, stages, edges, mode, timeout, keys=rng.randint(1, 6))


def random_inputs(rng: random.Random, graph: Graph, most: int = 16) -> list[list[Record]]:
    return [
        [Record(f"{sid.operator}.{sid.index}-{j}", rng.randrange(graph.keys), rng.randint(1, 1000))
         for j in range(rng.randint(0, most))]
        for sid in graph.source_subtasks()
    ]


def overlapping() -> CheckpointConfig:
    """Up to three checkpoints in flight, one per tick (as test_properties.py's). They expire after
    300 s (about 850 steps): a deep graph's barriers need longer than a line's to reach every sink,
    and with 60 s most checkpoints of the deepest ones expired, hundreds per run."""
    return CheckpointConfig(interval=0.0, max_concurrent=3, timeout=300.0,
                            tolerable_failed_checkpoints=10**6, retained=100)


def expected_uids(inputs) -> Counter:
    return Counter(r.uid for inp in inputs for r in inp)


def expected_balances(graph: Graph, inputs) -> dict[SubtaskId, int]:
    """Every subtask's balance when each record was applied exactly once along its path: an oracle
    of the fee rule written apart from the simulator (sources end at 0, each stage before the sink
    keeps amount // 10 of what reaches it, the sink keeps the rest)."""
    out = {sid: 0 for v in graph.vertices for sid in graph.subtasks(v)}
    for sid, records in zip(graph.source_subtasks(), inputs):
        for rec in records:
            amount = rec.amount
            *stages, sink = graph.path(sid.operator, rec.key)[1:]
            for v in stages:
                fee = amount // 10
                out[SubtaskId(v, graph.partition(v, rec.key))] += fee
                amount -= fee
            out[SubtaskId(sink, graph.partition(sink, rec.key))] += amount
    return out


def check_outputs(sim: Simulation, result, context: str) -> None:
    assert result.violations == [], context
    assert result.completed, f"the final checkpoint always completes; {context}"
    expected = expected_uids(sim.inputs)
    if sim.graph.mode.exactly_once:
        assert result.committed == expected, context
        assert result.balances == expected_balances(sim.graph, sim.inputs), context
    else:
        assert set(result.committed) == set(expected), context
        assert all(result.committed[uid] >= 1 for uid in expected), context


def run_random(seed: int, mode: BarrierMode, crash: bool) -> tuple[Simulation, object, str]:
    rng = random.Random(f"{mode.value}-{seed}")
    graph = random_graph(rng, mode)
    inputs = random_inputs(rng, graph)
    storm = rng.random() < 0.3
    kwargs = dict(config=overlapping(), aborts=Aborts(late=True, lost=True, injected=3)) if storm else {}
    records = sum(map(len, inputs))
    crash_at = rng.randint(0, 15 * records + 30) if crash else None
    sim = Simulation(graph, inputs, rng, **kwargs)
    context = f"seed {seed}: {graph.describe()}; crash_at={crash_at}, storm={storm}"
    return sim, sim.run(crash_at=crash_at), context


# --- random DAGs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("crash", [False, True], ids=["no_crash", "crash"])
@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize("seed", SEEDS)
def test_random_dags_give_consistent_cuts_and_the_failure_free_output(seed, mode, crash):
    """Every completed checkpoint is a consistent cut channel by channel (n >= m, channel state =
    records m+1..n) that conserves the tokens; every snapshot holds nothing from after its
    barriers; the sinks commit every record exactly once (at least once in at-least-once mode);
    every subtask's state is the failure-free one. Also with a crash and recovery, and in a
    third of the cases with several checkpoints in flight and late, lost and injected aborts."""
    sim, result, context = run_random(seed, mode, crash)
    check_outputs(sim, result, context)


def shapes(graph: Graph) -> set[str]:
    ancestors: dict[str, set[str]] = {}
    for v in graph.topological_order():
        ancestors[v] = {a for u in graph.upstream(v) for a in ancestors[u] | {u}}
    found = set()
    for v in graph.stages:
        ups = graph.upstream(v)
        if len(ups) > 1:
            found.add("fan-in")
            if graph.parallelism(v) > 1:
                found.add("parallel fan-in")
            if any((ancestors[a] | {a}) & (ancestors[b] | {b}) for a in ups for b in ups if a < b):
                found.add("diamond")  # two inputs with a common ancestor: paths that reconverge
            if any(u in graph.sources for u in ups) and any(u in graph.stages for u in ups):
                found.add("paths of different lengths")
            if sum(u in graph.sources for u in ups) > 1:
                found.add("two sources into one stage")
    if any(len(graph.downstream(v)) > 1 for v in graph.vertices):
        found.add("fan-out")
    if len(graph.sinks) > 1:
        found.add("several sinks")
    return found


def test_the_random_dags_have_every_shape():
    """The generator is not vacuous: each shape is in at least a quarter of the graphs."""
    seen: Counter = Counter()
    for mode in MODES:
        for seed in SEEDS:
            seen.update(shapes(random_graph(random.Random(f"{mode.value}-{seed}"), mode)))
    wanted = ["fan-in", "parallel fan-in", "diamond", "paths of different lengths",
              "two sources into one stage", "fan-out", "several sinks"]
    assert all(seen[s] >= len(MODES) * len(SEEDS) // 4 for s in wanted), seen


def test_unaligned_recoveries_replay_channel_state_at_a_fan_in():
    """The crash runs do restore in-flight data where inputs from different vertices meet."""
    replayed = 0
    for seed in SEEDS:
        sim, result, context = run_random(seed, BarrierMode.UNALIGNED, crash=True)
        fan_in = {sid for sid in sim.subtasks if len(sim.graph.upstream(sid.operator)) > 1}
        replayed += sum(1 for plan in result.recoveries for sid in plan.replay_channel_state if sid in fan_in)
    assert replayed >= 10


def test_at_least_once_on_a_dag_does_repeat_effects_after_a_crash():
    """The tracker's weakness is real on graphs too (so the exactly-once checks are not vacuous)."""
    repeats = 0
    for seed in SEEDS:
        _, result, _ = run_random(seed, BarrierMode.AT_LEAST_ONCE, crash=True)
        repeats += sum(n - 1 for n in result.committed.values())
    assert repeats > 0


# --- named shapes --------------------------------------------------------------------------------

NAMED = {
    "diamond": Graph(
        sources={"a": 2}, stages={"b": 2, "c": 1, "d": 2},
        edges=[("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")],
    ),
    "join_to_two_sinks": Graph(
        sources={"orders": 2, "payments": 1}, stages={"join": 3, "audit": 1, "ledger": 2},
        edges=[("orders", "join"), ("payments", "join"), ("join", "audit"), ("join", "ledger")],
    ),
    "shortcut": Graph(  # a -> c directly and through b: one input's barriers come much later
        sources={"a": 1}, stages={"b": 2, "c": 2}, edges=[("a", "b"), ("b", "c"), ("a", "c")],
    ),
    "two_pipelines": Graph(  # one coordinator, two unconnected flows
        sources={"a": 1, "b": 2}, stages={"x": 2, "y": 1}, edges=[("a", "x"), ("b", "y")],
    ),
}


@pytest.mark.parametrize("mode", MODES, ids=[m.value for m in MODES])
@pytest.mark.parametrize("name", list(NAMED))
def test_named_graphs(name, mode):
    graph = dataclasses.replace(
        NAMED[name], mode=mode, alignment_timeout=0.5 if mode is BarrierMode.ALIGNED_WITH_TIMEOUT else None
    )
    for seed in range(8):
        rng = random.Random(f"{name}-{seed}")
        inputs = [[Record(f"{sid}-{j}", j % graph.keys, rng.randint(1, 1000)) for j in range(15)]
                  for sid in graph.source_subtasks()]
        # Every sink and every branch of a fan-out gets records (the inputs exercise the shape).
        reached = {v for sid, inp in zip(graph.source_subtasks(), inputs) for r in inp
                   for v in graph.path(sid.operator, r.key)}
        assert reached == set(graph.vertices)
        crash_at = None if seed % 2 == 0 else rng.randint(0, 400)
        sim = Simulation(graph, inputs, rng)
        check_outputs(sim, sim.run(crash_at=crash_at), f"{name} seed {seed}, crash_at={crash_at}")


def test_a_join_reads_both_inputs_through_one_handler():
    """Each join subtask's input channels come from every subtask of both upstream vertices,
    numbered edge by edge, then sender by sender; one handler aligns over all of them."""
    sim = Simulation(NAMED["join_to_two_sinks"], [[], [], []], random.Random(0))
    for i in range(3):
        join = sim.subtasks[SubtaskId("join", i)]
        assert [(ch.sender, ch.receiver_input) for ch in join.inputs] == [
            (SubtaskId("orders", 0), 0), (SubtaskId("orders", 1), 1), (SubtaskId("payments", 0), 2)
        ]
        assert join.handler.num_channels == 3
    assert {sid for sid, st in sim.subtasks.items() if st.sink} == {
        SubtaskId("audit", 0), SubtaskId("ledger", 0), SubtaskId("ledger", 1)
    }


# --- the checks can fail -------------------------------------------------------------------------


def join_inputs(n: int = 30) -> list[list[Record]]:
    return [[Record(f"{src}{i}-{j}", j % 5, 10) for j in range(n)]
            for src, i in (("o", 0), ("o", 1), ("p", 0))]


def test_the_checker_catches_a_join_that_forgets_channel_state(monkeypatch):
    """Drop the logged channel state: cuts at the join (and after it) lose in-flight tokens."""
    original = simulation.Simulation._on_handler

    def forgetful(self, st, effects):
        original(self, st, [e for e in effects if not isinstance(e, LogChannelState)])

    monkeypatch.setattr(simulation.Simulation, "_on_handler", forgetful)
    graph = dataclasses.replace(NAMED["join_to_two_sinks"], mode=BarrierMode.UNALIGNED)
    violations = [v for seed in range(5) for v in Simulation(graph, join_inputs(), random.Random(seed)).run().violations]
    assert any("conserved" in v for v in violations)
    assert any("channel state" in v and "->join[" in v for v in violations)


def test_the_checker_catches_a_join_that_aligns_only_one_of_its_inputs(monkeypatch):
    """A join whose second input's records bypass the alignment (the classic mistake with several
    inputs: blocking only the channels of one of them) takes records from after that input's
    barrier into its snapshot."""
    original = simulation.Simulation._deliver

    def leaky(self, ch):
        if ch.sender.operator == "payments" and ch.queue[0][0] == "rec":
            _, record = ch.queue.popleft()
            st = self.subtasks[ch.receiver]
            st.taken[ch.receiver_input] += 1
            self._apply(st, record)
            return
        original(self, ch)

    monkeypatch.setattr(simulation.Simulation, "_deliver", leaky)
    graph = NAMED["join_to_two_sinks"]  # aligned
    violations = [v for seed in range(5) for v in Simulation(graph, join_inputs(), random.Random(seed)).run().violations]
    assert any("payments[0]->join[" in v and "came before the barrier" in v for v in violations)
    assert any("conserved" in v for v in violations)


def test_the_checker_catches_a_recovery_that_skips_the_channel_state(monkeypatch):
    """Restore operator state but not the in-flight records: every cut was consistent, but those
    records never reach the sink; the end-of-run check finds them."""
    original = simulation.plan_recovery
    monkeypatch.setattr(simulation, "plan_recovery",
                        lambda *a, **kw: dataclasses.replace(original(*a, **kw), replay_channel_state=()))
    graph = dataclasses.replace(NAMED["diamond"], mode=BarrierMode.UNALIGNED)
    inputs = [[Record(f"a{i}-{j}", j % 5, 10) for j in range(30)] for i in range(2)]
    lost = []
    for seed in range(20):
        result = Simulation(graph, inputs, random.Random(seed)).run(crash_at=150)
        lost += [v for v in result.violations if "applied 0 times" in v]
    assert lost


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sources, stages, edges, message",
    [
        ({"a": 1}, {"b": 1, "c": 1, "d": 1}, [("a", "b"), ("b", "c"), ("c", "b"), ("c", "d")],
         "the graph has a cycle through b, c: only DAGs are supported"),
        ({"a": 1}, {"b": 1}, [("a", "b"), ("b", "b")], "cycle through b"),
        ({"a": 1}, {"b": 1}, [("a", "b"), ("b", "a")], "edge b->a goes into a source"),
        ({"a": 1}, {"b": 1, "c": 1, "d": 1}, [("a", "b"), ("c", "d"), ("d", "c")], "c, d unreachable from any source"),
        ({"a": 1}, {"b": 1, "c": 1}, [("a", "b")], "stage c has no input edge"),
        ({"a": 1, "z": 1}, {"b": 1}, [("a", "b")], "source z has no outgoing edge"),
        ({"a": 1}, {}, [], "source a has no outgoing edge"),
        ({"a": 1}, {"b": 1}, [("a", "q")], "edge ('a', 'q') must join two declared vertices; known: a, b"),
        ({"a": 1}, {"b": 1}, [("a", "b"), ("a", "b")], "edge a->b is declared twice"),
        ({}, {"b": 1}, [], "at least one source"),
        ({"a": 1}, {"a": 1}, [], "a: declared both as a source and as a stage"),
        ({"a": 1}, {"b": 0}, [("a", "b")], "vertex b: parallelism must be an int >= 1, got 0"),
        ({"a b": 1}, {"c": 1}, [], "vertex names must be identifiers, got 'a b'"),
    ],
)
def test_invalid_graphs_are_refused_with_the_culprit_named(sources, stages, edges, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Graph(sources, stages, edges)


def test_keys_must_be_positive():
    with pytest.raises(ValueError, match="keys must be >= 1, got 0"):
        Graph({"a": 1}, {"b": 1}, [("a", "b")], keys=0)


def test_the_simulation_wants_one_input_list_per_source_subtask_and_unique_uids():
    graph = NAMED["join_to_two_sinks"]
    with pytest.raises(ValueError, match=r"one input list per source subtask \(orders\[0\], orders\[1\], payments\[0\]\), got 2"):
        Simulation(graph, [[], []], random.Random(0))
    twice = Record("x", 0, 1)
    with pytest.raises(ValueError, match=r"record uids must be unique, repeated: \['x'\]"):
        Simulation(graph, [[twice], [], [twice]], random.Random(0))


def test_a_topology_lowers_to_a_line_graph():
    topology = Topology(2, (3, 2), BarrierMode.UNALIGNED, 0.5, 7)
    assert topology.graph() == Graph(
        sources={"source": 2}, stages={"stage1": 3, "stage2": 2},
        edges=[("source", "stage1"), ("stage1", "stage2")],
        mode=BarrierMode.UNALIGNED, alignment_timeout=0.5, keys=7,
    )
    assert topology.subtasks() == [
        [SubtaskId("source", 0), SubtaskId("source", 1)],
        [SubtaskId("stage1", i) for i in range(3)],
        [SubtaskId("stage2", i) for i in range(2)],
    ]
    assert topology.graph().sinks == ("stage2",)


def test_routing_is_by_key_and_the_same_from_every_sender():
    """A key goes to one subtask of a stage whichever vertex sends it, and a fan-out sends it
    down one branch only: the paths are functions of the source vertex and the key."""
    graph = NAMED["join_to_two_sinks"]
    for key in range(graph.keys):
        assert graph.path("orders", key)[1:] == graph.path("payments", key)[1:]
        assert graph.path("orders", key)[-1] in graph.sinks
        assert 0 <= graph.partition("join", key) < 3
    assert {graph.route("join", key) for key in range(graph.keys)} == {"audit", "ledger"}

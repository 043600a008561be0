"""A dataflow graph as a registered pipeline: the registry (:func:`pipelines.declared`, the refusal
of the commands that take linear pipelines only), ``ckpt pipelines``, ``ckpt graph``, ``ckpt
generate``, ``ckpt checkpoints``, and ``ckpt run``/``recover`` handing a graph to the graph runner
with the options it takes and refusing the others before Spark starts. No Spark: the runner is a
stand-in that records what it was given."""

from __future__ import annotations

import json
import sys
import textwrap
import types
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from typing import Any

import pytest

from checkpoint_lib import cli, pipeline as pipeline_module, pipelines
from checkpoint_lib.cli import context
from checkpoint_lib.graph import Graph, Layout, StreamGraph, to_dict, to_text

MODULE = '''
from checkpoint_lib.graph import Graph
from checkpoint_lib.pipeline import DeltaSink, DeltaSource

CALLS = []


class Tag:
    state_schema = {"region": "string"}

    def apply(self, payments, accounts, state, key):
        return state, {"tagged": payments}


def generate(spark, warehouse, rows, *, bad_fraction=0.0, seed=None, rounds=1):
    CALLS.append((spark, warehouse, rows, bad_fraction, seed, rounds))
    return 7


def declared():
    g = Graph("joined").generator(generate)
    pay = g.source("payments", DeltaSource("landing/payments", {"account": "string", "cents": "long"}), parallelism=2)
    pay.dead_letters("dlq/payments")
    acc = g.source("accounts", DeltaSource("landing/accounts", {"account": "string", "region": "string"}))
    tagged = pay.key_by("account", parallelism=3).connect(acc.key_by("account")).process(Tag(), uid="tag")
    tagged.sink("tagged", DeltaSink("gold/tagged", {"account": "string", "cents": "long"}))
    return g
'''


@dataclass(frozen=True)
class _ChangeFeed:
    """A stand-in for checkpoint_lib.pipeline.ChangeFeedSource while it is not on this branch (the
    enrichment graph declares its accounts with it; nothing here reads it)."""

    path: str
    schema: Any


@pytest.fixture
def registered(tmp_path, monkeypatch):
    """``joined`` (a graph of a user's module, with a generator) and ``enrichment`` registered as
    entry points beside the installed pipelines; the registry's memory restored afterwards."""
    (tmp_path / "graphmods_joined.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(pipelines, "_loaded", {})
    if not hasattr(pipeline_module, "ChangeFeedSource"):
        monkeypatch.setattr(pipeline_module, "ChangeFeedSource", _ChangeFeed, raising=False)
    installed = pipelines._registered()
    monkeypatch.setattr(pipelines, "_registered", lambda: {
        **installed,
        "joined": EntryPoint("joined", "graphmods_joined:declared", pipelines.GROUP),
        "enrichment": EntryPoint("enrichment", "checkpoint_lib.pipelines.enrichment:build", pipelines.GROUP),
    })
    yield tmp_path
    sys.modules.pop("graphmods_joined", None)


@pytest.fixture
def no_spark(monkeypatch):
    """Every command here must decide before Spark starts."""
    def refuse(args, short_lived=False):
        raise AssertionError("this command must not start Spark")

    monkeypatch.setattr(context, "spark_session", refuse)


# --- the model and the registry --------------------------------------------------------------------


def test_a_graph_carries_its_generator_which_is_not_part_of_what_the_graph_is():
    def gen(spark, warehouse, rows, *, bad_fraction, seed):
        return 1

    def declared(with_generator: bool) -> StreamGraph:
        g = Graph("g")
        if with_generator:
            g.generator(gen)
        g.source("s", pipeline_module.DeltaSource("in", "k string")).sink("out", pipeline_module.DeltaSink("out", "k string"))
        return g.build()

    built = declared(True)
    assert built.generator_fn is gen and declared(False).generator_fn is None
    assert built == declared(False)
    with pytest.raises(TypeError, match="generator\\(\\) needs a function"):
        Graph("g").generator(42)
    from checkpoint_lib.graph import from_pipeline

    assert from_pipeline(pipelines.get("payments")).generator_fn is pipelines.get("payments").generator_fn


def test_a_graph_carries_its_quality_suite_which_is_not_part_of_what_the_graph_is():
    from checkpoint_lib.quality.spec import GraphQualitySpec

    spec = GraphQualitySpec(suite="mine", views=lambda ctx, facts: {})

    def declared(with_suite: bool) -> StreamGraph:
        g = Graph("g")
        if with_suite:
            g.quality(spec)
        g.source("s", pipeline_module.DeltaSource("in", "k string")).sink("out", pipeline_module.DeltaSink("out", "k string"))
        return g.build()

    assert declared(True).quality is spec and declared(False).quality is None and declared(True) == declared(False)
    with pytest.raises(TypeError, match="quality\\(\\) needs a GraphQualitySpec"):
        Graph("g").quality("after_restore")


def test_the_registry_finds_a_graph_by_name_and_the_linear_only_callers_refuse_it(registered):
    from checkpoint_lib.pipelines import enrichment, enrichment_data

    assert {"joined", "enrichment", "payments"} <= set(pipelines.names())
    graph = pipelines.declared("enrichment")
    assert isinstance(graph, StreamGraph) and pipelines.is_graph(graph)
    assert to_dict(graph) == to_dict(enrichment.graph()) and graph.generator_fn is enrichment_data.generate
    assert to_dict(pipelines.graph_of("enrichment")) == to_dict(graph)
    assert pipelines.declared("joined").name == "joined" and pipelines.name_of("joined") == "joined"
    for call in (pipelines.get, pipelines.load):
        with pytest.raises(pipelines.UnknownPipeline) as refused:
            call("enrichment")
        assert str(refused.value) == (
            "enrichment is a dataflow graph: ckpt run, ckpt recover, ckpt savepoint, ckpt validate, ckpt generate, ckpt graph, "
            "ckpt pipelines, ckpt checkpoints, ckpt state, ckpt report, ckpt maintain take it; this command takes a "
            "linear pipeline "
            "(checkpoint_lib.pipeline.Pipeline: one source, one operator, its sinks) only so far")
    # a linear pipeline reads as before, through both doors
    assert not pipelines.is_graph(pipelines.declared("payments"))
    assert pipelines.declared("payments").name == pipelines.get("payments").name == "payments"


def test_a_graph_by_reference_is_named_for_the_process_and_its_name_is_guarded(registered):
    assert pipelines.name_of("graphmods_joined:declared") == "joined"
    assert pipelines.ref_of("joined") == "graphmods_joined:declared"
    (registered / "graphmods_other.py").write_text(textwrap.dedent('''
        from checkpoint_lib.graph import Graph
        from checkpoint_lib.pipeline import DeltaSink, DeltaSource

        def enrichment():
            g = Graph("enrichment")
            g.source("s", DeltaSource("in", "k string")).sink("out", DeltaSink("out", "k string"))
            return g.build()
    '''))
    try:
        with pytest.raises(pipelines.UnknownPipeline, match="registered as checkpoint_lib.pipelines.enrichment:build"):
            pipelines.declared("graphmods_other:enrichment")
    finally:
        sys.modules.pop("graphmods_other", None)


def test_an_entry_point_must_name_its_graph(registered, monkeypatch):
    installed = pipelines._registered()
    monkeypatch.setattr(pipelines, "_registered", lambda: {
        **installed, "other": EntryPoint("other", "graphmods_joined:declared", pipelines.GROUP)})
    with pytest.raises(pipelines.UnknownPipeline, match="is pipeline 'joined': the names must match"):
        pipelines.declared("other")


# --- the inspecting commands ----------------------------------------------------------------------


def test_pipelines_lists_a_registered_graph_with_its_shape(registered, capsys):
    assert cli.main(["pipelines", "-o", "json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    enrichment = rows["enrichment"]
    assert enrichment["kind"] == "graph" and rows["payments"]["kind"] == "pipeline"
    assert enrichment["sources"] == {"payments": "landing/enrichment/payments",
                                     "accounts": "landing/enrichment/accounts"}
    assert enrichment["sinks"] == {"rejected": "dlq/enrichment/rejected", "tagged": "gold/enrichment/tagged",
                                   "region_totals": "gold/enrichment/region_totals"}
    assert enrichment["operators"] == ["tag", "dedup", "totals"] and enrichment["keyed"]
    assert enrichment["graph"] == {"vertices": 5, "edges": 4, "feedback_edges": 0}
    assert enrichment["generator"] and enrichment["quality"] and not rows["joined"]["quality"]
    assert rows["joined"]["found_by"] == "entry point"
    assert rows["payments"]["graph"] == {"vertices": 2, "edges": 1, "feedback_edges": 0}  # linear rows as before
    assert cli.main(["pipelines"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["enrichment"].split()[1:3] == ["landing/enrichment/payments,", "landing/enrichment/accounts"]
    assert "-> tag, dedup, totals -> dlq/enrichment/rejected, gold/enrichment/tagged, gold/enrichment/region_totals" \
        in lines["enrichment"]
    assert lines["enrichment"].endswith("(entry point; graph, 5 vertices, 4 edges; generator, quality)")
    assert lines["payments"].endswith("(entry point; 2 vertices, 1 edge; generator, quality)")


def test_graph_draws_a_registered_graph(registered, capsys):
    assert cli.main(["graph", "enrichment"]) == 0
    assert capsys.readouterr().out == to_text(pipelines.declared("enrichment"))
    assert cli.main(["graph", "joined", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "joined"


def test_checkpoints_reads_a_graphs_control_tables(registered, capsys):
    from checkpoint_lib.core.checkpoints import CompletedCheckpoint
    from checkpoint_lib.core.types import CheckpointKind, SubtaskAck, SubtaskId
    from checkpoint_lib.delta.store import DeltaCheckpointStore
    from checkpoint_lib.layout import checkpoint_root

    w = registered / "w"
    store = DeltaCheckpointStore.open(checkpoint_root(w, "joined"))
    store.epochs.begin()
    cid = store.ids.get_and_increment()
    store.checkpoints.record_pending(cid, trigger_time=1.0, epoch=1)
    acks = {SubtaskId("payments", 0): SubtaskAck(state={"version": 3}), SubtaskId("tag", 0): SubtaskAck(state={})}
    store.checkpoints.add(CompletedCheckpoint(cid, CheckpointKind.CHECKPOINT, 1.0, 1.5, acks, {s: 1.5 for s in acks}),
                          epoch=1)
    assert cli.main(["checkpoints", "list", "joined", "--warehouse", str(w), "-o", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["checkpoint_id"], row["status"]) == (cid, "completed")
    assert cli.main(["checkpoints", "show", "joined", str(cid), "--warehouse", str(w), "-o", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {a["subtask"] for a in shown["acks"]} == {"payments[0]", "tag[0]"}
    assert [(v["id"], v["subtasks"], v["offset"]) for v in shown["vertices"]] == [
        ("payments", 1, 3), ("accounts", 0, None), ("tag", 1, None)]  # per vertex of its graph


# --- generate ------------------------------------------------------------------------------------


def test_generate_runs_a_graphs_generator_and_names_its_sources(registered, monkeypatch, capsys):
    monkeypatch.setattr(context, "spark_session", lambda args, short_lived=False: "spark")
    w = str(registered / "w")
    assert cli.main(["generate", "joined", "--warehouse", w, "--rows", "10", "--seed", "3", "--option", "rounds=2"]) == 0
    assert sys.modules["graphmods_joined"].CALLS == [("spark", w, 10, 0.0, 3, 2)]
    assert capsys.readouterr().out == (f"appended 10 rows to the sources of graph joined under {w} (payments "
                                       "landing/payments, accounts landing/accounts); the generator returned version 7\n")


def test_generate_checks_a_graphs_generator_options_before_spark(registered, no_spark, capsys):
    from checkpoint_lib.pipelines import enrichment_data

    assert cli.main(["generate", "enrichment", "--rows", "10", "--option", "nope=1"]) == cli.EXIT_USER_ERROR
    takes = [n for n in ("rounds", "accounts", "duplicate_fraction", "late_changes", "commits_per_round")]
    assert f"the generator takes no option nope; it takes: {', '.join(takes)}" in capsys.readouterr().err
    assert enrichment_data.generate is pipelines.declared("enrichment").generator_fn


# --- run and recover -----------------------------------------------------------------------------


@pytest.mark.parametrize("options, refused", [
    (["--stage", "source"], "--stage source (a graph runs every vertex in one process, --stage all, or each operator "
                            "as its own process and the sources as one, --stage <process group>: one of sources, tag, "
                            "dedup, totals)"),
    (["--parallelism", "3"], "--parallelism (a graph declares each vertex's parallelism"),
    (["--source-parallelism", "2", "--parallelism", "3"], "--parallelism and --source-parallelism (a graph declares"),
    (["--lagging-sources", "1"], "--lagging-sources (a graph's lagging inputs are declared by its plan"),
])
@pytest.mark.parametrize("command", ["run", "recover"])
def test_run_and_recover_refuse_what_a_graph_does_not_take_before_spark_starts(registered, no_spark, capsys, command,
                                                                              options, refused):
    w = registered / "w"
    assert cli.main([command, "enrichment", "--warehouse", str(w), *options]) == cli.EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.startswith("ckpt: error: enrichment is a dataflow graph, which does not take ") and refused in err
    assert not w.exists()


def test_every_refused_option_is_listed_at_once(registered, no_spark, capsys):
    assert cli.main(["run", "joined", "--stage", "keyed", "--lagging-sources", "1", "--parallelism", "2"]) == cli.EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert "joined is a dataflow graph, which does not take these options:\n  - --stage keyed" in err
    assert "\n  - --parallelism" in err and "\n  - --lagging-sources" in err


def test_the_options_a_graph_does_not_take_refuse_it_before_anything_is_opened(registered, no_spark, capsys):
    w = registered / "w"
    assert cli.main(["savepoint", "enrichment", "--stage", "tag", "--warehouse", str(w)]) == cli.EXIT_USER_ERROR
    assert ("enrichment is a dataflow graph, which does not take --stage tag (a savepoint of a graph is taken with "
            "every vertex in one process: --stage all)") in capsys.readouterr().err
    assert not w.exists()


class _Runner:
    """Stands in for the graph runner: records its arguments, runs nothing."""

    made: list["_Runner"] = []

    def __init__(self, graph, warehouse, spark, **kw):
        self.graph, self.warehouse, self.spark, self.kw = graph, warehouse, spark, kw
        self.run_kw: dict[str, Any] = {}
        _Runner.made.append(self)

    def run(self, **kw):
        from checkpoint_lib.spark.context import RunSummary

        self.run_kw = kw
        return RunSummary(epoch=2, restored=4 if self.kw.get("recover") else None, completed=[5, 6], rows_in=30,
                          final=6, steps=3, seconds=1.5)


@pytest.fixture
def runner(monkeypatch):
    """The graph runner module replaced by :class:`_Runner` (importing the real one needs pyspark)."""
    _Runner.made = []
    monkeypatch.setitem(sys.modules, "checkpoint_lib.spark.graph_runner",
                        types.SimpleNamespace(GraphRunner=_Runner))
    monkeypatch.setattr(context, "spark_session", lambda args, short_lived=False: "spark")
    return _Runner.made


def test_run_gives_a_graph_to_the_graph_runner_with_the_options_it_takes(registered, runner, capsys):
    w = str(registered / "w")
    argv = ["run", "joined", "--warehouse", w, "--rows-per-checkpoint", "7", "--interval", "2", "--min-pause", "1",
            "--timeout", "60", "--retained", "3", "--checkpoint", "4", "--allow-non-restored-state", "--max-steps", "9",
            "--follow", "--poll", "0.5", "--state-compact-every", "5", "-o", "json"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    (made,) = runner
    assert isinstance(made.graph, StreamGraph) and made.graph.name == "joined"
    assert (made.warehouse, made.spark) == (w, "spark")
    config = made.kw.pop("config")
    assert (config.interval, config.min_pause, config.timeout, config.retained, config.max_concurrent) == (2, 1, 60, 3, 1)
    assert made.kw.pop("progress") is not None
    assert made.kw == {"mode": "aligned", "rows_per_checkpoint": 7, "poll_interval": 0.5, "restore_checkpoint": 4,
                       "recover": False, "allow_non_restored_state": True, "processes": Layout.CHAINED, "group": "all",
                       "chaining": True, "alignment_timeout": None, "state_compact_every": 5}
    assert made.run_kw == {"until_caught_up": False, "max_steps": 9, "handle_signals": True}
    assert json.loads(out) == {"pipeline": "joined", "epoch": 2, "restored": None, "rows_in": 30, "seconds": 1.5,
                               "rows_per_s": 20.0, "steps": 3, "completed": [5, 6], "aborted": [], "final": 6}


def test_run_of_one_vertex_runs_its_process_group_of_the_per_vertex_layout(registered, runner, capsys):
    w = str(registered / "w")
    assert cli.main(["run", "joined", "--warehouse", w, "--stage", "tag", "--mode", "unaligned",
                     "--alignment-timeout", "2"]) == 0
    (made,) = runner
    assert (made.kw["processes"], made.kw["group"]) == (Layout.PER_VERTEX, "tag")
    assert (made.kw["mode"], made.kw["alignment_timeout"]) == ("unaligned", 2.0)
    assert "changes nothing" not in capsys.readouterr().err  # its inputs come through channel logs


def test_run_without_chaining_cuts_every_edge_in_one_process(registered, runner, capsys):
    """``--no-chaining``: every operator reads its inputs from channel logs, as in the Airflow layout,
    so unaligned checkpoints can hold records in flight (the mode changes something)."""
    assert cli.main(["run", "joined", "--warehouse", str(registered / "w"), "--no-chaining", "--mode", "unaligned"]) == 0
    (made,) = runner
    assert (made.kw["chaining"], made.kw["processes"], made.kw["group"]) == (False, Layout.CHAINED, "all")
    assert "changes nothing" not in capsys.readouterr().out


def test_run_says_the_same_summary_line_and_the_mode_changes_nothing(registered, runner, capsys):
    assert cli.main(["run", "joined", "--warehouse", str(registered / "w"), "--mode", "unaligned"]) == 0
    out = capsys.readouterr().out
    assert runner[0].kw["mode"] == "unaligned"
    assert "every checkpoint is aligned at a step's end with nothing in flight (--mode unaligned changes nothing)" in out
    assert out.splitlines()[-1] == "epoch 2: read 30 rows in 1.5 s (20 rows/s), 2 checkpoints completed, 0 aborted"


def test_recover_runs_a_graph_and_says_the_after_restore_suites_are_skipped(registered, runner, monkeypatch, capsys):
    """... when the graph declares no quality suite (``joined``)."""
    from checkpoint_lib.cli import running

    def no_suites(*_a, **_kw):
        raise AssertionError("joined declares no quality suite")

    monkeypatch.setattr(running, "validate_suites", no_suites)
    assert cli.main(["recover", "joined", "--warehouse", str(registered / "w"), "--checkpoint", "4", "-o", "json"]) == 0
    captured = capsys.readouterr()
    (made,) = runner
    assert made.kw["recover"] is True and made.kw["restore_checkpoint"] == 4
    doc = json.loads(captured.out)
    assert doc["restored"] == 4 and doc["validations"] == []
    skipped = "after-restore validation skipped: joined is a dataflow graph that declares no quality suite (Graph.quality)"
    assert doc["validation"] == skipped and skipped in captured.err
    assert cli.main(["recover", "joined", "--warehouse", str(registered / "w"), "--no-validate"]) == 0
    out = capsys.readouterr().out
    assert "skipped" not in out and out.startswith("epoch 2: read 30 rows")


def test_recover_runs_the_after_restore_suite_a_graph_declares(registered, runner, monkeypatch, capsys):
    from checkpoint_lib.cli import running

    asked = []

    def suites(args, kinds):
        asked.append((args.pipeline, tuple(kinds)))
        return 0, [{"suite": "restore", "success": True}]

    monkeypatch.setattr(running, "validate_suites", suites)
    assert cli.main(["recover", "enrichment", "--warehouse", str(registered / "w"), "-o", "json"]) == 0
    captured = capsys.readouterr()
    assert asked == [("enrichment", ("restore",))] and "skipped" not in captured.err
    doc = json.loads(captured.out)
    assert doc["validations"] == [{"suite": "restore", "success": True}] and "validation" not in doc
    assert cli.main(["recover", "enrichment", "--warehouse", str(registered / "w"), "--no-validate"]) == 0
    assert asked == [("enrichment", ("restore",))]


def test_validate_takes_a_graph_with_its_suite_and_refuses_the_rest_before_spark(registered, no_spark, monkeypatch,
                                                                                 capsys):
    from checkpoint_lib.cli import validating

    w = registered / "w"
    w.mkdir()
    assert cli.main(["validate", "joined", "--warehouse", str(w)]) == cli.EXIT_USER_ERROR
    assert ("joined is a dataflow graph that declares no quality suite: declare one with "
            "Graph.quality(GraphQualitySpec(suite, views))") in capsys.readouterr().err
    assert cli.main(["validate", "enrichment", "--warehouse", str(w), "--suite", "checkpoint"]) == cli.EXIT_USER_ERROR
    assert "a dataflow graph has an after-restore suite only so far, not a checkpoint suite" in capsys.readouterr().err
    assert not any(w.iterdir())  # nothing opened
    asked = []
    monkeypatch.setattr(validating, "validate_suites", lambda args, kinds: (asked.append(tuple(kinds)) or (0, [])))
    assert cli.main(["validate", "enrichment", "--warehouse", str(w)]) == 0
    assert asked == [("restore",)]  # --suite all: a graph's one suite


def test_a_linear_pipeline_still_runs_with_the_pipeline_runner(registered, monkeypatch):
    """The linear path is untouched: the pipeline runner, its options, ``--state-compact-every`` 32 by default."""
    import checkpoint_lib.spark.runner as linear

    made = []

    class Linear(_Runner):
        def __init__(self, pipeline, warehouse, spark, **kw):
            made.append((pipeline.name, kw))
            super().__init__(pipeline, warehouse, spark, **kw)

    monkeypatch.setattr(linear, "PipelineRunner", Linear)
    monkeypatch.setattr(context, "spark_session", lambda args, short_lived=False: "spark")
    assert cli.main(["run", "payments", "--warehouse", str(registered / "w"), "--stage", "source", "-o", "json"]) == 0
    ((name, kw),) = made
    assert name == "payments" and kw["stage"] == "source" and kw["state_compact_every"] == 32 and kw["chaining"]
    assert cli.main(["run", "payments", "--warehouse", str(registered / "w"), "--state-compact-every", "0"]) == 0
    assert made[1][1]["state_compact_every"] == 0

"""``ckpt graph P``: a pipeline's dataflow graph as text, Graphviz dot and JSON, for a registered
name and a ``module:attr`` reference, in a process where pyspark cannot be imported; and the shape
``ckpt pipelines`` adds. No Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from checkpoint_lib import cli, pipelines
from checkpoint_lib.graph import from_pipeline, to_dict, to_dot, to_text

REPO = Path(__file__).resolve().parents[2]
USERPKG = REPO / "tests" / "fixtures" / "userpkg"
REGISTERED = ("payments", "transfers", "orders")


@pytest.mark.parametrize("name", REGISTERED)
def test_each_output_is_the_drawing_of_the_pipelines_graph(name, capsys):
    graph = from_pipeline(pipelines.get(name))
    assert cli.main(["graph", name]) == 0
    assert capsys.readouterr().out == to_text(graph)
    assert cli.main(["graph", name, "-o", "dot"]) == 0
    out = capsys.readouterr().out
    assert out == to_dot(graph) and out.startswith(f'digraph "{name}" {{') and out.rstrip().endswith("}")
    assert cli.main(["graph", name, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(to_dict(graph)))


def test_a_layout_draws_the_process_groups_the_stages_name_and_each_cut(capsys):
    from checkpoint_lib.graph import Layout, plan

    graph = pipelines.declared("enrichment")
    job = plan(graph, Layout.PER_VERTEX)
    assert cli.main(["graph", "enrichment", "--layout", "per_vertex"]) == 0
    text = capsys.readouterr().out
    assert text == to_text(graph, job) and "process tag: chain [tag]; sinks rejected; reads payments_tag, " \
        "accounts_tag; writes tag_dedup" in text.splitlines()
    assert cli.main(["graph", "enrichment", "--layout", "per_vertex", "-o", "dot"]) == 0
    assert capsys.readouterr().out == to_dot(graph, job)
    assert cli.main(["graph", "enrichment", "--layout", "chained", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"] == json.loads(json.dumps(plan(graph).to_dict())) and doc["name"] == "enrichment"
    assert cli.main(["graph", "enrichment", "-o", "json"]) == 0 and "plan" not in json.loads(capsys.readouterr().out)


def test_text_is_the_default_and_the_other_commands_words_are_accepted(capsys):
    assert cli.main(["graph", "transfers"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == "transfers: 2 vertices, 2 edges (1 feedback), 1 sink"
    assert "  -> bank: hash(account), output feedback, feedback (iterate)" in text.splitlines()
    assert cli.main(["graph", "transfers", "-o", "table"]) == 0 and capsys.readouterr().out == text
    assert cli.main(["graph", "transfers", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "transfers"


def test_an_unknown_pipeline_or_output_is_a_clear_error(capsys):
    assert cli.main(["graph", "nope"]) == cli.EXIT_USER_ERROR
    assert "unknown pipeline 'nope'; registered: " in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:
        cli.main(["graph", "payments", "-o", "svg"])
    assert bad.value.code == cli.EXIT_USAGE and "invalid choice: 'svg'" in capsys.readouterr().err


def test_a_pipeline_given_by_reference_is_drawn(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(USERPKG))
    monkeypatch.setattr(pipelines, "_loaded", {})
    try:
        assert cli.main(["graph", "userpkg.flows:visits", "-o", "json"]) == 0
    finally:
        for name in [m for m in sys.modules if m.startswith("userpkg")]:
            del sys.modules[name]
    doc = json.loads(capsys.readouterr().out)
    assert doc["name"] == "visits" and [v["kind"] for v in doc["vertices"]] == ["source", "keyed"]
    assert [(s["name"], s["vertex"]) for s in doc["sinks"]] == [("visit_log", "last_page"), ("visitors", "last_page")]


def test_pipelines_lists_each_graphs_shape(capsys):
    assert cli.main(["pipelines", "-o", "json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["transfers"]["graph"] == {"vertices": 2, "edges": 2, "feedback_edges": 1}
    assert rows["payments"]["graph"] == {"vertices": 2, "edges": 1, "feedback_edges": 0}
    assert {"name", "found_by", "source", "sinks", "operator", "keyed", "generator", "quality"} <= set(rows["payments"])
    assert cli.main(["pipelines"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "(entry point; 2 vertices, 2 edges (1 feedback); generator, quality)" in lines["transfers"]
    assert "(entry point; 2 vertices, 1 edge; generator, quality)" in lines["payments"]


_NO_JVM = textwrap.dedent("""
    import contextlib, io, json, sys
    sys.modules["pyspark"] = None  # any import of pyspark or py4j fails: no JVM can start
    sys.modules["py4j"] = None
    from checkpoint_lib import cli
    out = {}
    for argv in json.loads(sys.argv[1]):
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = cli.main(argv)
        out[" ".join(argv)] = {"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}
    print(json.dumps(out))
""")


def test_graph_starts_no_jvm_and_leaves_nothing_in_the_current_folder(tmp_path):
    commands = [["graph", name, "-o", how] for name in REGISTERED for how in ("text", "dot", "json")]
    commands.append(["pipelines", "-o", "json"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _NO_JVM, json.dumps(commands)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    for argv, result in json.loads(done.stdout).items():
        assert result["code"] == 0 and result["stderr"] == "", (argv, result["stderr"])
        if argv.endswith("json"):
            json.loads(result["stdout"])  # one document, nothing else on stdout
    assert list(tmp_path.iterdir()) == []


GRAPH_MODULE = '''
from checkpoint_lib.graph import Graph
from checkpoint_lib.pipeline import DeltaSink, DeltaSource


class Enrich:
    state_schema = {"region": "string"}

    def apply(self, records, state, key):
        return records, {}


def declared():
    g = Graph("joined")
    pay = g.source("payments", DeltaSource("landing/payments", {"account": "string", "cents": "long"}), parallelism=2)
    acc = g.source("accounts", DeltaSource("landing/accounts", {"account": "string", "region": "string"}))
    tagged = pay.key_by("account", parallelism=3).connect(acc.key_by("account")).process(Enrich(), uid="tag")
    tagged.sink("tagged", DeltaSink("gold/tagged", {"account": "string", "region": "string", "cents": "long"}))
    return g


graph = declared()
built = declared().build()
'''


def test_a_declared_graph_is_drawn_by_reference_and_refused_by_the_commands_that_take_linear_pipelines_only(
        tmp_path, monkeypatch, capsys):
    """``ckpt graph mod:attr`` draws a :class:`Graph` (or its built ``StreamGraph``, or a function
    returning one); a command that takes linear pipelines only (``ckpt savepoint``) refuses it,
    naming the commands that take a graph."""
    (tmp_path / "joinflows.py").write_text(GRAPH_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(pipelines, "_loaded", {})
    drawings = []
    for attr in ("graph", "built", "declared"):
        assert cli.main(["graph", f"joinflows:{attr}"]) == 0
        drawings.append(capsys.readouterr().out)
    assert drawings[0] == drawings[1] == drawings[2]
    assert drawings[0].splitlines()[0].startswith("joined: 3 vertices, 2 edges")
    assert "tag (two-input keyed Enrich, parallelism 3)" in drawings[0]
    argv = ["savepoint", "joinflows:graph", "--stage", "keyed", "--warehouse", str(tmp_path / "w")]
    assert cli.main(argv) == cli.EXIT_USER_ERROR
    assert "joined is a dataflow graph, which does not take --stage keyed" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()

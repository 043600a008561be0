"""The inspecting commands on a warehouse with checkpoints: they read with delta-rs and start no
JVM (run in a process where pyspark and py4j cannot be imported), each ``-o json`` is one JSON
document with nested objects, ``state operator`` says which checkpoint and table version it
shows, and ``recover --dry-run`` is a plan a person reads.

Two warehouses of one shape (payments, 2 landing versions of 200 rows, 12 accounts, checkpoints
1, 2 and the final 3): one written with delta-rs alone (``synthetic_warehouse.py``, seconds: the
CI tier) and one left by a real run (``ckpt generate`` twice and ``ckpt run -o json`` in this
process's Spark session: Spark's own files, deletion vectors in the state table; minutes on a
busy machine, so slow)."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import textwrap
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from checkpoint_lib import cli
from checkpoint_lib.verify import read_delta
from synthetic_warehouse import GRAPH_KEYS, synthetic_graph_warehouse, synthetic_warehouse

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spark_run(spark, tmp_path_factory) -> tuple[Path, dict]:
    """The warehouse of a real run, and what its ``ckpt run -o json`` printed."""
    w = tmp_path_factory.mktemp("inspect") / "w"
    for seed in (1, 2):
        assert cli.main(["generate", "payments", "--warehouse", str(w), "--rows", "200", "--accounts", "12",
                         "--bad-fraction", "0.05", "--seed", str(seed)]) == 0
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["run", "payments", "--warehouse", str(w), "--rows-per-checkpoint", "200", "-o", "json"]) == 0
    return w, json.loads(out.getvalue())


SPARK = pytest.param("spark", marks=[pytest.mark.spark, pytest.mark.slow])  # CI tier: the delta-rs warehouse


@pytest.fixture(scope="module", params=["delta-rs", SPARK])
def warehouse(request, tmp_path_factory) -> Path:
    if request.param == "spark":
        return request.getfixturevalue("spark_run")[0]
    return synthetic_warehouse(tmp_path_factory.mktemp("synthetic") / "w")


READ_ONLY = {  # every read-only command, as a user types it
    "checkpoints list": ["checkpoints", "list", "payments"],
    "checkpoints show": ["checkpoints", "show", "payments", "2"],
    "state operator": ["state", "operator", "payments"],
    "state operator --key": ["state", "operator", "payments", "--key", "acct-000003", "--checkpoint", "2"],
    "state channel": ["state", "channel", "payments"],
    "state handles": ["state", "handles", "payments"],
    "recover --dry-run": ["recover", "payments", "--dry-run"],
    "recover --checkpoint 1 --dry-run": ["recover", "payments", "--checkpoint", "1", "--dry-run"],
    "report": ["report", "payments"],
    "pipelines": ["pipelines"],
}

_NO_JVM = textwrap.dedent("""
    import json, sys, time
    sys.modules["pyspark"] = None  # any import of pyspark or py4j in the command fails
    sys.modules["py4j"] = None
    from checkpoint_lib import cli
    out = {}
    for name, argv in json.loads(sys.argv[1]).items():
        import io, contextlib
        stdout, stderr = io.StringIO(), io.StringIO()
        started = time.monotonic()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = cli.main(argv)
            except SystemExit as exit:  # bad arguments
                code = exit.code
        out[name] = {"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue(),
                     "seconds": time.monotonic() - started}
    print(json.dumps(out))
""")


def _no_jvm(commands: dict[str, list[str]], cwd: Path) -> dict[str, dict]:
    """Run ``commands`` in one Python process where pyspark and py4j cannot be imported (so no
    JVM can start), from an empty folder ``cwd``; each one's code, stdout, stderr and time."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _NO_JVM, json.dumps(commands)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _strings(doc):
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for v in doc.values():
            yield from _strings(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from _strings(v)


def _json_in_a_string(doc) -> list[str]:
    found = []
    for s in _strings(doc):
        if s.strip()[:1] in ("{", "["):
            try:
                json.loads(s)
            except ValueError:
                continue
            found.append(s[:80])
    return found


@pytest.mark.spark
@pytest.mark.slow  # CI tier: tests/cli/test_cli.py's JSON of pipelines; every command writes through cli.output.emit
def test_run_prints_one_json_document(spark_run):
    _, summary = spark_run
    assert summary["pipeline"] == "payments" and summary["completed"] == [1, 2, 3]


def test_read_only_commands_start_no_jvm_create_nothing_and_print_one_json_document(warehouse, tmp_path):
    commands = {name: argv + ([] if name == "pipelines" else ["--warehouse", str(warehouse)]) + ["-o", "json"]
                for name, argv in READ_ONLY.items()}
    before = sorted(p.relative_to(warehouse) for p in warehouse.rglob("*"))
    results = _no_jvm(commands, tmp_path)
    for name, r in results.items():
        assert r["code"] == 0, (name, r["stderr"])
        doc = json.loads(r["stdout"])  # one document, nothing else on stdout
        assert _json_in_a_string(doc) == [], (name, _json_in_a_string(doc))
    assert list(tmp_path.iterdir()) == []  # no spark-warehouse/, nothing at all in the current folder
    after = sorted(p.relative_to(warehouse) for p in warehouse.rglob("*") if "_quality" not in p.parts)
    assert after == before
    listed = json.loads(results["checkpoints list"]["stdout"])
    assert [r["checkpoint_id"] for r in listed] == [3, 2, 1]
    assert isinstance(listed[0]["acks"], dict) and "acks_json" not in listed[0]
    assert json.loads(results["report"]["stdout"])["report"].endswith("report.html")


def test_state_operator_names_its_checkpoint_and_version_and_takes_key_and_limit(warehouse, capsys):
    base = ["state", "operator", "payments", "--warehouse", str(warehouse)]
    assert cli.main(base + ["--checkpoint", "2", "--key", "acct-000003", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["checkpoint_id"], doc["key"], doc["keys"], doc["shown"]) == (2, "acct-000003", 1, 1)
    (row,) = doc["rows"]
    assert row["account"] == "acct-000003" and {"balance_cents", "event_count", "subtask"} <= set(row)
    versions = {s["table_version"] for s in doc["subtasks"]}
    assert cli.main(base + ["--limit", "4"]) == 0
    out = capsys.readouterr().out
    assert "only showing" not in out
    head, *table = out.strip().splitlines()
    assert "checkpoint 3" in head and "state table version" in head
    assert "12 keys; showing the first 4" in out
    assert len([line for line in table if line.lstrip().startswith("acct-")]) == 4
    assert versions and all(v >= 0 for v in versions)
    assert cli.main(["state", "channel", "payments", "--warehouse", str(warehouse), "--key", "x"]) == cli.EXIT_USER_ERROR
    assert "--key picks a key of the operator's state" in capsys.readouterr().err


def test_recover_dry_run_is_a_plan_a_person_reads(warehouse, capsys):
    argv = ["recover", "payments", "--warehouse", str(warehouse), "--checkpoint", "1", "--dry-run"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "{'" not in text and len(text.splitlines()) <= 12, text
    assert cli.main(argv + ["-o", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    ledger = next(s for s in plan["sinks"] if s["name"] == "ledger")
    now = len(read_delta(warehouse / "gold" / "ledger"))
    assert ledger["rows_now"] == now and 0 < ledger["rows_after"] < now
    assert ledger["version_after"] < ledger["version_now"]
    assert ledger["rows_discarded"] == now - ledger["rows_after"]
    assert (f"ledger    gold/ledger version {ledger['version_now']} -> version {ledger['version_after']}: "
            f"{now:,} rows -> {ledger['rows_after']:,} ({ledger['rows_discarded']:,} discarded)") in text
    (source,) = plan["sources"]
    assert (source["offset"], source["version_now"], source["rows_to_replay"]) == (0, 1, 200)
    assert "landing/payments  after version 0 up to version 1: 200 rows to replay" in text
    (operator,) = plan["operators"]
    assert operator["keys"] > 0 and "balance  restores state table version" in text


def _reporting_commands() -> set[str]:
    """The sub-commands that take ``-o json``."""
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {name for name, p in sub.choices.items() if any("--output" in a.option_strings for a in p._actions)}


def _document(capsys) -> object:
    out = capsys.readouterr().out
    doc = json.loads(out)  # one document, nothing else on stdout
    assert _json_in_a_string(doc) == [], _json_in_a_string(doc)
    return doc


def test_every_command_that_reports_prints_one_json_document(warehouse, capsys):
    """The read-only ones above, ``run`` in the fixture, ``doctor`` here; the Spark ones below (slow)."""
    assert _reporting_commands() == {"doctor", "pipelines", "graph", "run", "recover", "savepoint", "checkpoints",
                                     "state", "validate", "report", "maintain"}
    w = ["--warehouse", str(warehouse), "-o", "json"]
    assert cli.main(["doctor", "--no-spark", *w]) in (0, 1)  # a check may fail on this machine: still JSON
    assert isinstance(_document(capsys), (list, dict))


@pytest.mark.spark
@pytest.mark.slow  # CI tier: the reporting commands above; these write their JSON through the same cli.output.emit
def test_the_spark_commands_print_one_json_document(spark_run, capsys):
    w = ["--warehouse", str(spark_run[0]), "-o", "json"]
    assert cli.main(["maintain", "payments", "--dry-run", *w]) == 0
    assert isinstance(_document(capsys), dict)
    assert cli.main(["savepoint", "payments", "--request-timeout", "0", *w]) == 0
    assert _document(capsys)["status"] == "completed"
    assert cli.main(["validate", "payments", "--suite", "restore", *w]) in (0, cli.EXIT_QUALITY)
    assert [v["suite"] for v in _document(capsys)] == ["restore"]
    assert cli.main(["recover", "payments", "--no-validate", *w]) == 0  # last: it begins a new epoch
    assert _document(capsys)["restored"] is not None


def test_a_state_version_that_cannot_be_read_is_said_not_shown_as_empty(tmp_path, capsys):
    w = synthetic_warehouse(tmp_path / "w")
    (w / "_checkpoints" / "payments" / "state" / "balance" / "_delta_log" / f"{1:020d}.json").unlink()
    assert cli.main(["state", "operator", "payments", "--warehouse", str(w), "--checkpoint", "1"]) == cli.EXIT_USER_ERROR
    assert "version 1, which checkpoint 1 pinned, cannot be read" in capsys.readouterr().err


# --- a dataflow graph's checkpoints: per vertex, and any keyed operator's state ---------------------

GRAPH_READ_ONLY = {
    "checkpoints show": ["checkpoints", "show", "enrichment", "2"],
    "state operator --uid": ["state", "operator", "enrichment", "--uid", "dedup", "--checkpoint", "1"],
    "state handles": ["state", "handles", "enrichment"],
    "checkpoints show (linear)": ["checkpoints", "show", "payments", "2"],
    "recover --dry-run": ["recover", "enrichment", "--checkpoint", "1", "--dry-run"],
}


@pytest.fixture(scope="module")
def graph_warehouse(tmp_path_factory) -> Path:
    """The ``enrichment`` graph's checkpoints 1 and 2 (``synthetic_graph_warehouse``) beside
    ``payments``' (``synthetic_warehouse``), in one warehouse."""
    w = tmp_path_factory.mktemp("graph") / "w"
    synthetic_warehouse(w)
    return synthetic_graph_warehouse(w)


def _json_of(argv: list[str], capsys) -> dict:
    assert cli.main([*argv, "-o", "json"]) == 0, capsys.readouterr().err
    return _document(capsys)


def test_a_graphs_inspecting_commands_start_no_jvm_and_print_one_json_document(graph_warehouse, tmp_path):
    results = _no_jvm({n: [*argv, "--warehouse", str(graph_warehouse), "-o", "json"]
                       for n, argv in GRAPH_READ_ONLY.items()}, tmp_path)
    for name, r in results.items():
        assert r["code"] == 0, (name, r["stderr"])
        doc = json.loads(r["stdout"])
        assert _json_in_a_string(doc) == [], name
    assert [v["id"] for v in json.loads(results["checkpoints show"]["stdout"])["vertices"]] == \
        ["payments", "accounts", "tag", "dedup", "totals"]
    assert json.loads(results["state operator --uid"]["stdout"])["keys"] == 10
    assert list(tmp_path.iterdir()) == []


def test_checkpoints_show_breaks_a_graphs_checkpoint_down_per_vertex(graph_warehouse, capsys):
    doc = _json_of(["checkpoints", "show", "enrichment", "2", "--warehouse", str(graph_warehouse)], capsys)
    assert (doc["pipeline"], doc["checkpoint_id"], doc["kind"], doc["status"], doc["graph_problem"]) == \
        ("enrichment", 2, "checkpoint", "completed", None)
    assert doc["duration_ms"] == 2000.0
    vertices = {v["id"]: v for v in doc["vertices"]}
    assert list(vertices) == ["payments", "accounts", "tag", "dedup", "totals"]  # topological: sources first
    assert [(v["kind"], v["parallelism"], v["subtasks"]) for v in vertices.values()] == [
        ("source", 2, 2), ("source", 1, 1), ("two_input_keyed", 2, 2), ("keyed", 2, 2), ("keyed", 1, 1)]
    assert (vertices["payments"]["offset"], vertices["accounts"]["offset"]) == (2, 12)
    assert vertices["payments"]["slowest"] == {"subtask": "payments[1]", "index": 1, "duration_ms": 2.0}
    tag, dedup, totals = vertices["tag"], vertices["dedup"], vertices["totals"]
    assert tag["state_size_bytes"] == 200 + 210 and totals["state_size_bytes"] == 200  # sums
    assert tag["alignment_ms"] == 3.5 and dedup["alignment_ms"] == 0.5  # maxima
    assert tag["slowest"] == {"subtask": "tag[1]", "index": 1, "duration_ms": 41.0} and tag["duration_ms"] == 41.0
    assert (dedup["unaligned"], dedup["channel_state_rows"], dedup["channel_state_bytes"]) == (True, 4, 256)
    assert (tag["unaligned"], tag["channel_state_rows"]) == (False, 0)
    assert tag["state_table_versions"] == [2] and tag["key_groups"] == [0, 127] and tag["offset"] is None
    assert vertices["payments"]["state_table_versions"] == [] and vertices["payments"]["key_groups"] is None
    sinks = {v["id"]: [(s["name"], s["operator"], s["subtasks"], s["transactions"]) for s in v["sinks"]]
             for v in doc["vertices"]}
    assert sinks == {"payments": [], "accounts": [], "tag": [("rejected", "sink_rejected", 2, 2)],
                     "dedup": [("tagged", "sink_tagged", 2, 2)], "totals": [("region_totals", "sink_region_totals", 1, 1)]}
    assert all(v["in_graph"] for v in doc["vertices"])
    # the per-subtask acks, every key as before the breakdown (they were the whole document)
    assert len(doc["acks"]) == 13
    assert {"subtask", "operator", "index", "state", "state_size_bytes", "channel_state_rows", "channel_state_bytes",
            "alignment_ms", "unaligned", "duration_ms", "ack_time"} == set(doc["acks"][0])
    assert sum(v["subtasks"] + sum(s["subtasks"] for s in v["sinks"]) for v in doc["vertices"]) == len(doc["acks"])

    assert cli.main(["checkpoints", "show", "enrichment", "2", "--warehouse", str(graph_warehouse)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "checkpoint 2 of enrichment: completed, epoch 1; 13 subtasks acknowledged"
    assert lines[1].split()[:3] == ["vertex", "kind", "subtasks"]
    rows = {line.split()[0] if not line.startswith("  ") else "sink " + line.split()[1]: line for line in lines[3:11]}
    assert list(rows) == ["payments", "accounts", "tag", "sink rejected", "dedup", "sink tagged", "totals",
                          "sink region_totals"]
    assert rows["tag"].split()[1:4] == ["two-input", "keyed", "2"] and "410 B" in rows["tag"]
    assert "3.5 ms" in rows["tag"] and "tag[1] 41.0 ms" in rows["tag"]
    assert rows["tag"].endswith("state table version 2, key groups 0..127")
    assert rows["payments"].endswith("offset: version 2") and rows["accounts"].endswith("offset: version 12")
    assert " yes " in rows["dedup"] and "4 rows, 256 B" in rows["dedup"]
    assert rows["sink region_totals"].startswith("  sink region_totals") and rows["sink region_totals"].endswith(
        "owns 1 transaction")
    assert any(line.startswith("tag[1]: {") for line in lines)  # then per subtask, as before


def test_recover_dry_run_of_a_graph_previews_every_sink_operator_and_source(graph_warehouse, capsys):
    doc = _json_of(["recover", "enrichment", "--checkpoint", "1", "--dry-run", "--warehouse", str(graph_warehouse)],
                   capsys)
    assert (doc["pipeline"], doc["checkpoint_id"], doc["new_epoch"], doc["rollback_after"]) == ("enrichment", 1, 2, 1)
    assert [s["name"] for s in doc["sinks"]] == ["rejected", "tagged", "region_totals"]
    assert [(o["operator"], o["versions_restored"], o["subtasks"], o["keys"]) for o in doc["operators"]] == [
        ("tag", [1], 2, len(GRAPH_KEYS["tag"][0])), ("dedup", [1], 2, len(GRAPH_KEYS["dedup"][0])),
        ("totals", [1], 1, len(GRAPH_KEYS["totals"][0]))]
    assert [(s["table"], s["offset"]) for s in doc["sources"]] == [("landing/enrichment/payments", 1),
                                                                  ("landing/enrichment/accounts", 11)]
    assert doc["channel_state"] == {}
    assert cli.main(["recover", "enrichment", "--checkpoint", "1", "--dry-run", "--warehouse", str(graph_warehouse)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("recovery of enrichment: restore checkpoint 1") and "  dedup  restores state table version 1" in text
    assert "  landing/enrichment/accounts  after version 11" in text


def test_checkpoints_show_gives_a_linear_pipeline_its_two_vertices(graph_warehouse, capsys):
    doc = _json_of(["checkpoints", "show", "payments", "2", "--warehouse", str(graph_warehouse)], capsys)
    source, balance = doc["vertices"]
    assert (source["id"], source["kind"], source["subtasks"], source["offset"]) == ("source", "source", 2, 1)
    assert (balance["id"], balance["kind"], balance["subtasks"], balance["state_size_bytes"]) == \
        ("balance", "keyed", 3, 500 + 501 + 502)
    assert balance["state_table_versions"] == [2] and balance["key_groups"] == [0, 127]
    assert [(s["name"], s["subtasks"], s["transactions"]) for s in balance["sinks"]] == [("ledger", 3, 3),
                                                                                         ("balances", 3, 3)]
    assert len(doc["acks"]) == 11


def test_checkpoints_show_of_a_pipeline_no_longer_registered_goes_per_operator_id(graph_warehouse, capsys):
    """The store of a pipeline nobody registers any more still reads: by operator id, saying why."""
    import shutil

    shutil.copytree(graph_warehouse / "_checkpoints" / "enrichment", graph_warehouse / "_checkpoints" / "retired")
    try:
        doc = _json_of(["checkpoints", "show", "retired", "2", "--warehouse", str(graph_warehouse)], capsys)
        assert "unknown pipeline 'retired'" in doc["graph_problem"]
        kinds = [(v["id"], v["kind"], v["in_graph"]) for v in doc["vertices"]]
        assert kinds[:2] == [("accounts", "source", False), ("payments", "source", False)]
        assert {k for _, k, _ in kinds[2:5]} == {"keyed"} and {k for _, k, _ in kinds[5:]} == {"sink"}
        assert cli.main(["checkpoints", "show", "retired", "2", "--warehouse", str(graph_warehouse)]) == 0
        out = capsys.readouterr().out
        assert "(per operator id: the graph of retired cannot be loaded: unknown pipeline 'retired'" in out
        assert "not in the graph" not in out
    finally:
        shutil.rmtree(graph_warehouse / "_checkpoints" / "retired")


def test_state_operator_reads_any_keyed_operator_of_a_graph_at_its_pins(graph_warehouse, capsys):
    w = ["--warehouse", str(graph_warehouse)]
    dedup = _json_of(["state", "operator", "enrichment", "--uid", "dedup", "--checkpoint", "1", *w], capsys)
    assert (dedup["operator"], dedup["key_column"], dedup["checkpoint_id"], dedup["keys"]) == ("dedup", "event_id", 1, 10)
    assert [(s["subtask"], s["key_groups"], s["table_version"]) for s in dedup["subtasks"]] == [
        (0, [0, 63], 1), (1, [64, 127], 1)]
    assert sum(s["keys"] for s in dedup["subtasks"]) == 10 and dedup["table"].endswith("state/dedup")
    assert {r["event_id"] for r in dedup["rows"]} == {f"e{i}" for i in range(10)}
    latest = _json_of(["state", "operator", "enrichment", "--uid", "dedup", *w], capsys)
    assert (latest["checkpoint_id"], latest["keys"]) == (2, 20)  # the latest completed, at its pins
    for r in latest["rows"]:  # each row is the subtask's whose key groups hold it
        assert r["subtask"] == (0 if r["key_group"] <= 63 else 1), r
    tag = _json_of(["state", "operator", "enrichment", "--uid", "tag", "--key", "acct-5", *w], capsys)
    assert (tag["key_column"], tag["keys"], [r["region"] for r in tag["rows"]]) == ("account", 1, ["north"])
    totals = _json_of(["state", "operator", "enrichment", "--uid", "totals", "--checkpoint", "1", *w], capsys)
    assert sorted(r["region"] for r in totals["rows"]) == ["north", "south"]

    assert cli.main(["state", "operator", "enrichment", "--uid", "tag", "--limit", "2", *w]) == 0
    out = capsys.readouterr().out
    assert out.startswith("operator tag of enrichment at checkpoint 2 (completed ")
    assert "state table version 2, key groups 0..127 over 2 subtasks" in out and "6 keys; showing the first 2" in out

    handles = _json_of(["state", "handles", "enrichment", *w], capsys)
    assert handles["sources"] == {f"payments[{i}]": {"version": 2, "next_seq": 0, "barrier_seq": -1} for i in (0, 1)} | {
        "accounts[0]": {"version": 12, "next_seq": 0, "barrier_seq": -1}}
    assert set(handles["sinks"]) == {"sink_rejected[0]", "sink_rejected[1]", "sink_tagged[0]", "sink_tagged[1]",
                                     "sink_region_totals[0]"}


def test_state_operator_takes_a_linear_pipelines_uid_and_refuses_what_is_no_keyed_operator(graph_warehouse, tmp_path,
                                                                                            monkeypatch, capsys):
    w = ["--warehouse", str(graph_warehouse)]
    by_default = _json_of(["state", "operator", "payments", *w], capsys)
    assert _json_of(["state", "operator", "payments", "--uid", "balance", *w], capsys) == by_default

    def refused(argv: list[str]) -> str:
        assert cli.main([*argv, *w]) == cli.EXIT_USER_ERROR
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        return err.strip().removeprefix("ckpt: error: ")

    assert refused(["state", "operator", "enrichment"]) == (
        "pipeline 'enrichment' has 3 keyed operators: name one with --uid; its keyed operators: tag, dedup, totals")
    assert refused(["state", "operator", "enrichment", "--uid", "nope"]) == (
        "pipeline 'enrichment' has no operator 'nope'; its keyed operators: tag, dedup, totals")
    assert refused(["state", "operator", "enrichment", "--uid", "accounts"]) == (
        "'accounts' is a source of pipeline 'enrichment', not an operator; its keyed operators: tag, dedup, totals")
    assert refused(["state", "operator", "payments", "--uid", "ledger"]) == (
        "pipeline 'payments' has no operator 'ledger'; its keyed operators: balance")
    assert refused(["state", "channel", "enrichment", "--uid", "tag"]) == (
        "--uid picks the operator's state: ckpt state operator enrichment --uid ...")

    (tmp_path / "statelessflows.py").write_text(textwrap.dedent('''
        from checkpoint_lib.graph import Graph
        from checkpoint_lib.pipeline import DeltaSink, DeltaSource

        class Count:
            state_schema = "n long"
            def apply(self, records, state, key):
                return state, {}

        class Pass:
            def apply(self, records):
                return {"out": records}

        def graph():
            g = Graph("mixed")
            s = g.source("events", DeltaSource("in", "k string"))
            passed = s.rebalance(2).process(Pass(), uid="pass")
            passed.output("out").sink("out", DeltaSink("out", "k string"))
            passed.output("out").key_by("k").process(Count(), uid="count").sink("counts", DeltaSink("counts", "k string"))
            return g
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    from checkpoint_lib import pipelines

    monkeypatch.setattr(pipelines, "_loaded", {})
    try:
        assert refused(["state", "operator", "statelessflows:graph", "--uid", "pass"]) == (
            "operator 'pass' of pipeline 'mixed' is stateless: it has no keyed state to show; its keyed operators: count")
    finally:
        sys.modules.pop("statelessflows", None)
    assert not (graph_warehouse / "_checkpoints" / "mixed").exists()

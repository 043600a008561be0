"""A dataflow graph through the command line, end to end: ``ckpt generate`` lands its input,
``ckpt run`` runs it with the graph runner, ``ckpt checkpoints``, ``report`` and ``maintain`` read
what it left, ``ckpt recover`` restores its last checkpoint and replays what landed since (the
after-restore suites skipped, saying so); the outputs are exactly once (computed from the landing
tables alone). The graph is ``test_graph_runner``'s (two sources into a two-input keyed operator,
keyed operators under other keys, sinks at several vertices), given by reference to this module."""

from __future__ import annotations

import dataclasses
import json

import pytest

from checkpoint_lib import cli, pipelines
from test_graph_runner import check, graph, land

pytestmark = pytest.mark.spark

REF = f"{__name__}:build"


def generate(spark, warehouse, rows, *, bad_fraction=0.0, seed=None, first=0, rounds=2):
    """Rounds ``first..first+rounds-1`` of ``test_graph_runner.land`` (``rows`` is not used: a round
    has its fixed rows); returns the payments table's version."""
    from deltalake import DeltaTable

    land(spark, warehouse, range(first, first + rounds))
    return DeltaTable(f"{warehouse}/landing/payments").version()


def build():
    return dataclasses.replace(graph(name="cligraph"), generator_fn=generate)


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_generate_run_inspect_and_recover_a_graph_through_the_cli(spark, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pipelines, "_loaded", {})
    w = str(tmp_path)
    assert cli.main(["generate", REF, "--warehouse", w, "--rows", "1"]) == 0
    assert capsys.readouterr().out.startswith(
        f"appended 1 rows to the sources of graph cligraph under {w} (payments landing/payments, accounts "
        "landing/accounts); the generator returned version ")

    assert cli.main(["run", REF, "--warehouse", w, "--rows-per-checkpoint", "12", "-o", "json"]) == 0
    first = _json(capsys)
    assert first["pipeline"] == "cligraph" and first["restored"] is None and first["rows_in"] > 0
    assert len(first["completed"]) >= 2 and first["final"] == first["completed"][-1] and first["aborted"] == []
    check(spark, w, rounds=2)

    assert cli.main(["checkpoints", "list", "cligraph", "--warehouse", w, "-o", "json"]) == 0
    listed = {r["checkpoint_id"]: r for r in _json(capsys)}
    assert all(listed[c]["status"] == "completed" for c in first["completed"])
    assert cli.main(["checkpoints", "show", "cligraph", str(first["final"]), "--warehouse", w, "-o", "json"]) == 0
    shown = _json(capsys)
    operators = {a["operator"] for a in shown["acks"]}
    assert {"payments", "accounts", "tag", "dedup", "totals", "large", "sink_tagged", "sink_totals"} <= operators
    vertices = {v["id"]: v for v in shown["vertices"]}  # per vertex, as Flink's checkpoint details
    assert list(vertices) == ["payments", "accounts", "tag", "dedup", "totals", "large"]
    assert all(v["in_graph"] and v["subtasks"] == v["parallelism"] for v in vertices.values())
    assert vertices["payments"]["offset"] is not None and vertices["tag"]["state_table_versions"]
    assert all(vertices[uid]["state_size_bytes"] > 0 for uid in ("tag", "dedup", "totals"))  # its state's share
    assert (vertices["large"]["kind"], vertices["large"]["state_size_bytes"]) == ("stateless", 0)
    assert [s["name"] for s in vertices["large"]["sinks"]] == ["large"]
    assert cli.main(["state", "operator", "cligraph", "--uid", "totals", "--warehouse", w, "-o", "json"]) == 0
    totals = _json(capsys)  # Spark's state table (deletion vectors) at the pinned version, read by delta-rs
    assert (totals["checkpoint_id"], totals["key_column"]) == (first["final"], "region") and totals["keys"] > 0
    assert cli.main(["state", "operator", "cligraph", "--uid", "large", "--warehouse", w]) == cli.EXIT_USER_ERROR
    assert "operator 'large' of pipeline 'cligraph' is stateless" in capsys.readouterr().err
    assert cli.main(["report", "cligraph", "--warehouse", w, "-o", "json"]) == 0
    assert _json(capsys)["report"].endswith("report.html")
    assert cli.main(["maintain", "cligraph", "--warehouse", w, "--no-spark", "--dry-run", "-o", "json"]) == 0
    assert _json(capsys)["pipeline"] == "cligraph"

    assert cli.main(["generate", REF, "--warehouse", w, "--rows", "1", "--option", "first=2"]) == 0
    capsys.readouterr()
    assert cli.main(["recover", "cligraph", "--warehouse", w, "--rows-per-checkpoint", "25", "-o", "json"]) == 0
    captured = capsys.readouterr()
    second = json.loads(captured.out)
    assert second["restored"] == first["final"] and second["epoch"] > first["epoch"] and second["validations"] == []
    assert "after-restore validation skipped: cligraph is a dataflow graph" in captured.err
    check(spark, w, rounds=4)

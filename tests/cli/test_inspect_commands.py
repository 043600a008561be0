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
from synthetic_warehouse import synthetic_warehouse

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
    assert operator["keys"] > 0 and f"balance  restores state table version" in text


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

"""README's "Your first pipeline" runs as written: its Python blocks are saved under the names their
first line gives (``# file: myflows.py``) in an empty folder, its shell block runs there line by
line (``python`` lines with this environment's ``python``, ``ckpt`` lines through the ``ckpt``
entry point), and the outputs are what the text promises."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoint_lib.verify import read_delta

pytestmark = [pytest.mark.spark]
README = Path(__file__).resolve().parents[2] / "README.md"
TIMEOUT = float(os.environ.get("CKPT_TEST_RUN_TIMEOUT", "900"))


def tutorial(title: str = "## Your first pipeline") -> tuple[dict[str, str], list[str]]:
    text = README.read_text()
    section = text[text.index(title):]
    section = section[: section.index("\n## ", 3)]
    files, commands = {}, []
    for lang, body in re.findall(r"```(\w+)\n(.*?)```", section, re.S):
        first = body.splitlines()[0]
        if lang == "python" and first.startswith("# file: "):
            files[first.removeprefix("# file: ").strip()] = body
        elif lang == "bash":
            commands += [line for line in body.splitlines() if line.strip()]
    return files, commands


def run_commands(commands: list[str], folder: Path, env: dict[str, str], capsys):
    """Run a section's shell lines in ``folder``: ``ckpt`` lines through the CLI's entry point in
    this process, the others as processes with ``env``; yields (line, its output), each passed."""
    from checkpoint_lib import cli

    for command in commands:
        argv = shlex.split(command, comments=True)
        if argv[0] == "ckpt":
            code = cli.main(argv[1:])
            captured = capsys.readouterr()
            assert code == 0, f"{command}\n{captured.out[-3000:]}\n{captured.err[-3000:]}"
            yield command, captured.out
        else:
            done = subprocess.run(command, shell=True, cwd=folder, env=env, capture_output=True, text=True,
                                  timeout=TIMEOUT)
            assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            yield command, done.stdout


def test_the_tutorial_blocks_are_found():
    files, commands = tutorial()
    assert set(files) == {"myflows.py", "land.py"}
    assert [c.split()[:2] for c in commands] == [["python", "land.py"], ["ckpt", "run"], ["ckpt", "validate"],
                                                 ["ckpt", "checkpoints"]]


def test_your_first_pipeline_runs_as_written(spark, tmp_path, monkeypatch, capsys):
    """The ``ckpt`` lines go through the CLI's entry point (what the ``ckpt`` console script calls)
    in this process, as from the folder: its Spark session is this run's, warm, instead of a JVM
    started per line (tests/crash/test_object_store.py runs ``ckpt run`` as a process of its own).
    Nothing of this checkout's folder is on the path the ``python`` lines get."""
    from checkpoint_lib import pipelines

    files, commands = tutorial()
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "CKPT_SPARK_MASTER": "local[2]", "CKPT_SPARK_UI": "0"}
    env.pop("PYTHONPATH", None)  # the user's folder, nothing of this checkout's
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI adds the folder to import myflows from
    monkeypatch.setattr(pipelines, "_loaded", {})  # "visits" is known by its reference for this test only
    assert "myflows" not in sys.modules
    try:
        for command, out in run_commands(commands, tmp_path, env, capsys):
            if command.startswith("ckpt validate"):
                assert "passed" in out.lower(), out
    finally:
        sys.modules.pop("myflows", None)
    visitors = read_delta(tmp_path / "wh" / "gold" / "visitors").sort_values("visitor")
    assert list(visitors["visitor"]) == [f"u{i}" for i in range(7)]
    assert list(visitors["visits"]) == [len(range(i, 100, 7)) for i in range(7)]
    # the last page of visitor u<i> is its last visit's: visit j = the largest j < 100 with j % 7 == i
    assert list(visitors["last_page"]) == [f"/p/{max(range(i, 100, 7)) % 5}" for i in range(7)]
    log = read_delta(tmp_path / "wh" / "gold" / "visit_log")
    assert len(log) == 100
    # the map's output is what the operator got and what `ckpt validate` compared the sinks with
    assert read_delta(tmp_path / "wh" / "landing" / "visits")["page"].str.startswith("/P/").sum() == 34
    assert log["page"].str.startswith("/p/").all()


def test_every_dag_file_the_readme_shows_imports_what_it_calls():
    """A DAG file copied from the README runs: each code block that calls ``build_dags`` or
    ``dags_for_every_pipeline`` imports it, and no call is shown outside a code block."""
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    for name in ("build_dags", "dags_for_every_pipeline"):
        calling = [b for b in blocks if f"{name}(" in b]
        assert calling, name
        for block in calling:
            assert f"from ckpt_airflow.dag_factory import {name}" in block, block
    assert "globals().update(" not in re.sub(r"```.*?```", "", text, flags=re.S)  # a DAG file's line, alone


def test_a_pipeline_with_two_inputs_runs_as_written(spark, tmp_path, monkeypatch, capsys):
    """README's "A pipeline with two inputs": a graph declared in the user's module (a two-input
    keyed operator over orders and a customers table's change data feed), run by reference through
    the CLI as written; every order once, with its customer's tier after the change."""
    from checkpoint_lib import pipelines

    files, commands = tutorial("## A pipeline with two inputs")
    assert set(files) == {"shop.py", "land_shop.py"}
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(pipelines, "_loaded", {})
    try:
        list(run_commands(commands, tmp_path, env, capsys))
    finally:
        sys.modules.pop("shop", None)
    tagged = read_delta(tmp_path / "wh" / "gold" / "tagged_orders")
    assert sorted(tagged["order_id"]) == sorted(f"o{i}" for i in range(30))
    tiers = dict(zip(tagged["customer"], tagged["tier"]))
    assert tiers == {"c1": "gold", "c2": "gold", "c3": "silver", "c4": "none"}

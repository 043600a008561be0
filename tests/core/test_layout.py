"""One definition of the warehouse layout and of the name rule (checkpoint_lib/layout.py)."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from checkpoint_lib import control, layout
from checkpoint_lib.pipeline import Pipeline
from checkpoint_lib.quality import paths

ROOT = Path(__file__).resolve().parents[2]
# bench/peer.py is plain Spark Structured Streaming: "_checkpoints/peer" is its own checkpointLocation.
ALLOWED = {"checkpoint_lib/layout.py", "bench/peer.py"}
SEGMENT = re.compile(r"(?:^|/)_checkpoints(?:/|$)")  # as a path segment; prose and other names do not count


@pytest.mark.parametrize("name", ["payments", "a", "a" * 63, "gold_v2", "x1"])
def test_well_formed_names_pass(name):
    assert layout.check_pipeline_name(name) == name


@pytest.mark.parametrize("name", ["", "Payments", "1st", "_x", "a-b", "a/b", "../etc", "a b", "a" * 64, "é", None, 3])
def test_a_name_that_cannot_be_a_path_segment_is_refused_naming_its_kind(name):
    with pytest.raises(ValueError, match="^pipeline name .* must be lower-case letters, digits and _"):
        layout.check_pipeline_name(name)
    with pytest.raises(ValueError, match="^sink name "):
        layout.check_name("sink name", name)


def test_a_long_bad_name_is_shortened_in_the_message():
    with pytest.raises(ValueError) as err:
        layout.check_pipeline_name("A" * 10_000)
    assert len(str(err.value)) < 200


def test_the_checkpoint_root_is_absolute_and_refuses_a_bad_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert layout.checkpoint_root("w", "payments") == tmp_path / "w" / "_checkpoints" / "payments"
    assert layout.checkpoint_root("~/w", "p") == Path(os.path.expanduser("~")) / "w" / "_checkpoints" / "p"
    with pytest.raises(ValueError, match="pipeline name"):
        layout.checkpoint_root(tmp_path, "../../etc")


def test_every_layer_uses_the_one_definition():
    assert control.checkpoint_root is paths.checkpoint_root is layout.checkpoint_root
    assert control.validate_pipeline_name is paths.check_pipeline_name is layout.check_pipeline_name
    with pytest.raises(ValueError, match="^pipeline name 'Bad' must be lower-case"):
        Pipeline("Bad")


def _spelled_out(path: Path) -> list[int]:
    """Lines of ``path`` whose code (not a docstring) spells the ``_checkpoints`` folder."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    return sorted(node.lineno for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                  and SEGMENT.search(node.value))


def test_no_module_spells_the_checkpoint_folder_itself():
    found = {}
    for folder in ("checkpoint_lib", "plugins", "dags", "jobs", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in ALLOWED and (lines := _spelled_out(path)):
                found[rel] = lines
    assert not found, f"use checkpoint_lib.layout.checkpoint_root instead: {found}"


def test_below_is_the_part_of_a_path_under_a_folder_local_or_on_an_object_store():
    from pathlib import Path

    from checkpoint_lib.layout import below

    assert below("s3://b/w/gold/ledger/part-0.parquet", "s3://b/w") == "gold/ledger/part-0.parquet"
    assert below(Path("/w/t/_delta_log/0.json"), Path("/w/t/")) == "_delta_log/0.json"
    with pytest.raises(ValueError, match="not under"):
        below("s3://b/wx/t", "s3://b/w")


def test_the_channel_name_rule_keeps_todays_names_and_qualifies_edges_that_would_spell_alike():
    assert layout.channel_name("source", "balance") == "source_balance"
    assert layout.channel_name("bank", "bank", "feedback", 1) == "bank.feedback-bank.1"
    assert layout.channel_names([("source", "records", "bank", 1), ("bank", "feedback", "bank", 1)]) == (
        "source_bank", "bank_bank")
    assert layout.channel_names([("s", "records", "j", 1), ("s", "records", "j", 2), ("t", "records", "j", 2)]) == (
        "s.records-j.1", "s.records-j.2", "t_j")
    assert layout.channel_names([("s", "records", "j", 2), ("s", "records", "j", 1)]) == (
        "s.records-j.2", "s.records-j.1")  # the order does not matter
    # today's logs, as the runtime asks for them: source -> operator, and a cycle's operator -> itself
    assert layout.channel_log("/w/_checkpoints/p", "source", "balance") == Path("/w/_checkpoints/p/channels/"
                                                                               "source_balance")
    assert layout.channel_log("/w/_checkpoints/p", "bank", "bank") == Path("/w/_checkpoints/p/channels/bank_bank")
    assert layout.channel_log("/w", "s", "j", "records", 2) == Path("/w/channels/s.records-j.2")
    assert layout.channel_log("s3://b/w/_checkpoints/p", "source", "balance") == layout.location(
        "s3://b/w/_checkpoints/p/channels/source_balance")
    with pytest.raises(ValueError, match=r"^2 edges are the channel s.records -> j.1: one edge per output and input$"):
        layout.channel_names([("s", "records", "j", 1), ("s", "records", "j", 1)])
    with pytest.raises(ValueError, match=r"^channel s -> j: give both the output and the input, or neither$"):
        layout.channel_name("s", "j", "records")
    with pytest.raises(ValueError, match=r"^channel s -> j: input must be a whole number >= 1, got 0$"):
        layout.channel_name("s", "j", "records", 0)
    with pytest.raises(ValueError, match=r"^channel sender '\.\./x' must be lower-case letters"):
        layout.channel_log("/w", "../x", "j")
    with pytest.raises(ValueError, match=r"^channel output 'a-b' must be lower-case letters"):
        layout.channel_name("s", "j", "a-b", 1)

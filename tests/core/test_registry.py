"""Finding pipelines without editing checkpoint_lib: entry points and ``module:attr`` references."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from checkpoint_lib import pipelines
from checkpoint_lib.pipeline import DeltaSink, DeltaSource, Pipeline
from checkpoint_lib.pipelines import UnknownPipeline
from checkpoint_lib.submit import ckpt_run_argv, stage_args

USERPKG = Path(__file__).resolve().parents[1] / "fixtures" / "userpkg"


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    """A folder on sys.path for throw-away user modules, and the fixture package; the registry's
    memory of references is restored afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(USERPKG))
    monkeypatch.setattr(pipelines, "_loaded", {})
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith(("mods_", "userpkg"))]:
        del sys.modules[name]


def _module(folder: Path, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(body))


def test_the_built_in_pipelines_are_registered_like_a_users():
    assert {"payments", "transfers"} <= set(pipelines.names())
    p = pipelines.get("payments")
    assert p.name == "payments" and p.generator_fn is not None and p.quality_spec.pipeline == "payments"
    assert pipelines.ref_of("payments") == "payments"  # children find it by name


def test_a_reference_loads_and_names_the_pipeline_for_the_rest_of_the_process(user_modules):
    assert "visits" not in pipelines.names()
    p = pipelines.load("userpkg.flows:visits")
    assert (p.name, p.state_update, p.state_columns) == ("visits", "replace", (("visits", "long"), ("last_page", "string")))
    assert "visits" in pipelines.names() and pipelines.get("visits").name == "visits"
    assert pipelines.name_of("userpkg.flows:visits") == "visits"
    # another process is handed the reference, not the name it cannot find
    assert pipelines.ref_of("visits") == "userpkg.flows:visits"
    assert stage_args("visits", "W", stage="source")[0] == "userpkg.flows:visits"
    assert "userpkg.flows:visits" in ckpt_run_argv("visits", "W")
    assert pipelines.get("visits") is not pipelines.get("visits")  # each caller gets its own copy


def test_a_reference_may_name_a_function_that_builds_the_pipeline(user_modules):
    _module(user_modules, "mods_factory", """
        from checkpoint_lib.pipeline import DeltaSink, DeltaSource, Pipeline

        class Count:
            state_schema = "n long"
            order_by = ("src_row",)
            def apply(self, records, state, key):
                return state, {}

        def build():
            return (Pipeline("counted").source(DeltaSource("in", "k string")).key_by("k")
                    .process(Count(), uid="count").sink("out", DeltaSink("out", "k string, n long"))
                    .dead_letters("dlq"))
        """)
    assert pipelines.load("mods_factory:build").name == "counted"


@pytest.mark.parametrize("ref, message", [
    ("no_such_module_xyz:p", "cannot import 'no_such_module_xyz'"),
    ("mods_bad:missing", "has no attribute 'missing'"),
    ("mods_bad:not_a_pipeline", "is int, not a Pipeline or a dataflow graph"),
    ("mods_bad:incomplete", "is incomplete: missing process()"),
    ("mods_bad:", "not a pipeline reference"),
    ("1bad:x", "not a pipeline reference"),
    ("nope", "unknown pipeline 'nope'; registered: (enrichment, )?orders, payments, transfers"),
    ("Bad Name", "pipeline name"),
])
def test_a_bad_reference_says_what_is_wrong(user_modules, ref, message):
    _module(user_modules, "mods_bad", """
        from checkpoint_lib.pipeline import DeltaSource, Pipeline
        not_a_pipeline = 42
        incomplete = Pipeline("half").source(DeltaSource("in", "k string")).key_by("k")
        """)
    with pytest.raises(ValueError, match=message):
        pipelines.load(ref)


def test_two_pipelines_cannot_share_a_name(user_modules):
    _module(user_modules, "mods_twins", """
        from checkpoint_lib.pipeline import DeltaSink, DeltaSource, Pipeline

        class Pass:
            def apply(self, records):
                return {"out": records}

        def _p(name):
            return (Pipeline(name).source(DeltaSource("in", "k string")).rebalance(1).process(Pass(), uid="op")
                    .sink("out", DeltaSink("out", "k string")).dead_letters("dlq"))

        one, two = _p("twin"), _p("twin")
        payments = _p("payments")
        """)
    pipelines.load("mods_twins:one")
    with pytest.raises(UnknownPipeline, match="both pipeline 'twin'"):
        pipelines.load("mods_twins:two")
    with pytest.raises(UnknownPipeline, match="registered as checkpoint_lib.pipelines.payments:build"):
        pipelines.load("mods_twins:payments")


def test_an_entry_point_must_be_the_pipeline_of_its_name(monkeypatch):
    from importlib.metadata import EntryPoint

    ep = EntryPoint("ledger", "checkpoint_lib.pipelines.payments:build", pipelines.GROUP)
    monkeypatch.setattr(pipelines, "_registered", lambda: {"ledger": ep})
    with pytest.raises(UnknownPipeline, match="is pipeline 'payments': the names must match"):
        pipelines.get("ledger")


def test_one_schema_notation_everywhere():
    from checkpoint_lib.schema import columns

    ddl = Pipeline("p").source(DeltaSource("in", "id string, amount decimal(18,2)"))
    pairs = Pipeline("p").source(DeltaSource("in", {"id": "string", "amount": "decimal(18,2)"}))
    assert ddl.record_schema == pairs.record_schema == {"id": "string", "amount": "decimal(18,2)"}
    assert DeltaSink("out", "id string, tags map<string,long>").schema == (("id", "string"), ("tags", "map<string,long>"))
    assert columns("s struct<a:int,b:string>, n: long") == (("s", "struct<a:int,b:string>"), ("n", "long"))
    for bad, message in (("id", "needs a name and a type"), ("a long, A string", "declared twice"),
                         ("", "lists no column"), ("a map<string,long", "unbalanced"), (7, "is not a schema")):
        with pytest.raises(ValueError, match=message):
            columns(bad)


def test_a_keyed_operator_declares_how_its_state_is_updated():
    class Op:
        state_schema = "n long"
        order_by = ()
        state_update = "merge"

        def apply(self, records, state, key):
            return state, {}

    p = Pipeline("p").source(DeltaSource("in", "k string")).key_by("k")
    with pytest.raises(ValueError, match="state_update must be one of"):
        p.process(Op(), uid="op")
    Op.state_update, Op.state_schema = "replace", "k string, n long"
    with pytest.raises(ValueError, match="must not list the key"):
        p.process(Op(), uid="op")
    Op.state_schema = "n long, _delete boolean"
    with pytest.raises(ValueError, match="must not list the key 'k' or '_delete'"):
        p.process(Op(), uid="op")

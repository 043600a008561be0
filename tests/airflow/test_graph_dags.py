"""The DAGs of a dataflow graph (the registered ``enrichment``): their structure as the DagBag loads
them (no Spark: a task per process group of the graph's job plan, the recover DAG's form, what it
leaves out and its ``validate_restore`` task, which skips a graph that declares no suite, the hook's
``spark-submit`` argv), and real runs on a tiny generated warehouse (SQLite, its own AIRFLOW_HOME,
Spark local[2]) checked by the independent verifier: ``airflow dags test enrichment_run``, then
(slow) the recover DAG (a dry run, a restore of an older checkpoint validated by the graph's own
suite), the recover DAG of a graph without a suite (its validation skipped) and the maintenance DAG."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from helpers import AIRFLOW, airflow_env, migrate

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "plugins"))

SINKS = {"x-checkpoint-lib://enrichment/gold/enrichment/tagged",
         "x-checkpoint-lib://enrichment/gold/enrichment/region_totals",
         "x-checkpoint-lib://enrichment/dlq/enrichment/rejected"}


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def test_a_registered_graph_gets_a_run_a_snapshot_a_recover_and_a_maintenance_dag(dagbag):
    from ckpt_airflow.dag_factory import GRAPH_DAG_KINDS, dag_kinds, dag_pipelines

    assert dagbag.import_errors == {}
    assert "enrichment" in dag_pipelines() and dag_kinds("enrichment") == GRAPH_DAG_KINDS
    assert {d for d in dagbag.dags if d.startswith("enrichment_")} == \
        {"enrichment_run", "enrichment_snapshot", "enrichment_recover", "enrichment_maintenance"}
    snap = dagbag.dags["enrichment_snapshot"]
    assert [t.task_id for t in snap.topological_sort()][:2] == ["trigger", "wait_for_acks"]
    for p in dag_pipelines():
        assert {f"{p}_{kind}" for kind in dag_kinds(p)} <= set(dagbag.dags)


def test_the_graph_run_dag_runs_its_one_process_group_as_one_task_on_the_run_schedule(dagbag):
    from ckpt_airflow.operators import RunStageOperator

    run, linear = dagbag.dags["enrichment_run"], dagbag.dags["payments_run"]
    assert [t.task_id for t in run.topological_sort()] == ["run_all"]
    (task,) = run.tasks
    assert isinstance(task, RunStageOperator) and (task.pipeline, task.stage, task.mode) == ("enrichment", "all", "aligned")
    assert run.schedule == linear.schedule == timedelta(seconds=600)
    assert run.max_active_runs == 1 and not run.catchup and "enrichment" in run.tags
    assert {o.uri for o in task.outlets} == SINKS  # the group commits every sink of the graph
    assert "`all`" in run.doc_md


def test_the_per_vertex_layout_runs_each_process_group_as_a_task_then_commits(monkeypatch):
    """``CKPT_DAG_SETTINGS={"enrichment": {"layout": "per_vertex"}}``: the sources' group, then a task
    per operator after the groups its edges come from, then ``commit`` (the groups that ran before
    the last acknowledgement left their sinks' transactions pre-committed)."""
    from ckpt_airflow.dag_factory import build_dags, settings_for
    from ckpt_airflow.operators import CommitCheckpointOperator, RunStageOperator

    monkeypatch.setenv("CKPT_DAG_SETTINGS", json.dumps({"enrichment": {"layout": "per_vertex"}}))
    run = build_dags("enrichment")["enrichment_run"]
    assert [t.task_id for t in run.topological_sort()] == ["run_sources", "run_tag", "run_dedup", "run_totals",
                                                          "commit"]
    assert run.get_task("run_tag").upstream_task_ids == {"run_sources"}
    assert run.get_task("run_totals").upstream_task_ids == {"run_dedup"}
    assert run.get_task("commit").upstream_task_ids == {"run_sources", "run_tag", "run_dedup", "run_totals"}
    stages = {t.task_id: t.stage for t in run.tasks if isinstance(t, RunStageOperator)}
    assert stages == {"run_sources": "sources", "run_tag": "tag", "run_dedup": "dedup", "run_totals": "totals"}
    commit = run.get_task("commit")
    assert isinstance(commit, CommitCheckpointOperator) and "run_sources" in commit.checkpoint_id
    assert {o.uri for o in commit.outlets} == SINKS
    monkeypatch.setenv("CKPT_DAG_SETTINGS", json.dumps({"enrichment": {"layout": "apart"}}))
    with pytest.raises(ValueError, match="layout must be chained or per_vertex, got 'apart'"):
        settings_for("enrichment")


def test_the_hook_runs_a_process_group_of_the_layout_its_name_says():
    from checkpoint_lib import pipelines
    from ckpt_airflow.hooks import graph_group

    graph = pipelines.declared("enrichment")
    assert [graph_group(graph, g) for g in ("all", "sources", "tag")] == ["all", "sources", "tag"]
    with pytest.raises(ValueError, match="no process group 'source' .*groups: all, or each of sources, tag, dedup, "
                                         "totals as its own process"):
        graph_group(graph, "source")


def test_the_graph_recover_dag_has_its_form_and_dry_run_and_validates_the_restore_as_the_linear_one(dagbag):
    from airflow.sdk import TriggerRule
    from airflow.sdk.definitions.param import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError
    from ckpt_airflow.operators import ValidateRestoreOperator

    rec = dagbag.dags["enrichment_recover"]
    assert rec.schedule is None and rec.max_active_runs == 1
    assert [t.task_id for t in rec.topological_sort()] == ["validate_params", "unless_dry_run", "pause", "recover",
                                                           "validate_restore", "unpause"]
    assert rec.get_task("unpause").is_teardown
    assert rec.get_task("pause").dag_ids == ["enrichment_run", "enrichment_snapshot"]
    assert {o.uri for o in rec.get_task("recover").outlets} == SINKS
    assert rec.get_task("validate_params").mode == "aligned"
    assert set(rec.params) == {"checkpoint_id", "allow_non_restored_state", "dry_run"}
    check = rec.get_task("validate_restore")
    assert isinstance(check, ValidateRestoreOperator) and (check.pipeline, check.checkpoint_id) == ("enrichment", None)
    # wired as the linear recover DAG's: after recover, before the unpause teardown
    linear = dagbag.dags["payments_recover"]
    assert {t.task_id: t.upstream_task_ids for t in rec.tasks} == {t.task_id: t.upstream_task_ids for t in linear.tasks}
    assert check.upstream_task_ids == {"recover"} and "validate_restore" in rec.get_task("unpause").upstream_task_ids
    # a dry run stops at unless_dry_run: it skips its downstream (pause), and every task from there
    # to validate_restore runs only when all before it succeeded, so the skip reaches validate_restore
    gate = rec.get_task("unless_dry_run")
    assert gate.ignore_downstream_trigger_rules is False and gate.downstream_task_ids == {"pause"}
    assert [rec.get_task(t).trigger_rule for t in ("pause", "recover", "validate_restore")] == [TriggerRule.ALL_SUCCESS] * 3
    assert "validate_restore" in {t.task_id for t in gate.get_flat_relatives(upstream=False)}
    assert "-> validate_restore (the graph's own after-restore suite" in rec.doc_md and "no `mode`" in rec.doc_md
    assert "Not for a graph yet:** the `validate_restore` task" not in rec.doc_md
    params = ParamsDict(rec.params)
    params["checkpoint_id"], params["allow_non_restored_state"] = "7", True
    params.validate()
    for bad in ("../x", "0", "abc"):
        with pytest.raises(ParamValidationError):
            params["checkpoint_id"] = bad
            params.validate()
    with pytest.raises(ParamValidationError):
        params["allow_non_restored_state"] = "sometimes"


def test_the_graph_maintenance_dag_is_the_linear_one(dagbag):
    from ckpt_airflow.operators import MaintainPipelineOperator

    dag = dagbag.dags["enrichment_maintenance"]
    (task,) = dag.tasks
    assert isinstance(task, MaintainPipelineOperator) and (task.task_id, task.pipeline) == ("maintain", "enrichment")
    assert dag.schedule == timedelta(days=1)


def test_a_plan_of_several_process_groups_gives_each_task_its_own_sinks_as_outlets():
    from checkpoint_lib.pipelines import declared
    from ckpt_airflow import dag_factory

    settings = {**dag_factory.settings_for("enrichment"), "layout": "per_vertex"}
    dag = dag_factory.build_graph_run_dag(declared("enrichment"), settings)
    outlets = {t.task_id: {o.uri.rsplit("/", 1)[1] for o in t.outlets} for t in dag.tasks}
    assert outlets == {"run_sources": set(), "run_tag": {"rejected"}, "run_dedup": {"tagged"},
                       "run_totals": {"region_totals"}, "commit": {"rejected", "tagged", "region_totals"}}


def test_a_feedback_edge_between_process_groups_orders_nothing():
    from checkpoint_lib.graph import Graph, Layout, plan
    from checkpoint_lib.pipeline import DeltaSink, DeltaSource
    from ckpt_airflow.dag_factory import group_order

    class Keyed:
        state_schema = "n long"

        def apply(self, records, state, key):
            return state, {}

    g = Graph("loop")
    a = g.source("s", DeltaSource("landing/s", {"account": "string"})).key_by("account").process(Keyed(), uid="a")
    b = a.output("onward").key_by("account").process(Keyed(), uid="b").sink("out", DeltaSink("gold/out", "account string"))
    b.output("back").key_by("account").iterate(into=a)
    assert group_order(plan(g.build(), Layout.PER_VERTEX)) == [("s", []), ("a", ["s"]), ("b", ["a"])]
    assert group_order(plan(g.build())) == [("all", [])]


def test_a_graph_runs_and_recovers_through_spark_submit_with_the_arguments_ckpt_takes(tmp_path):
    """The hook's spark-submit launcher hands a graph's group to ``jobs/run_stage.py`` (``ckpt
    run``) as ``--stage all``, and its recovery to ``jobs/recover.py``; ``ckpt`` takes every one of
    those options for a graph (:func:`graph_option_problems` finds none)."""
    from checkpoint_lib.cli.parser import build_parser
    from checkpoint_lib.cli.running import graph_option_problems
    from ckpt_airflow.hooks import CheckpointHook

    hook = CheckpointHook("enrichment", warehouse=str(tmp_path), launcher="spark-submit")
    submitted = []
    hook._submit = lambda job, args: submitted.append((job, list(args)))
    assert hook.run_stage("all", rows_per_checkpoint=40) == {"stage": "all", "launcher": "spark-submit"}
    hook.recover(3, rows_per_checkpoint=40, allow_non_restored_state=True)
    w = str(tmp_path)
    assert submitted == [
        ("run_stage.py", ["enrichment", "--warehouse", w, "--stage", "all", "--mode", "aligned",
                          "--rows-per-checkpoint", "40", "--until-caught-up"]),
        ("recover.py", ["enrichment", "--warehouse", w, "--stage", "all", "--mode", "aligned",
                        "--rows-per-checkpoint", "40", "--checkpoint", "3", "--allow-non-restored-state"]),
    ]
    parser = build_parser()
    for (job, args), command in zip(submitted, ("run", "recover")):
        assert graph_option_problems(parser.parse_args([command, *args])) == []
    with pytest.raises(ValueError, match="graph enrichment has no process group 'keyed' in its job plan "
                                         r"\(groups: all, or each of sources, tag, dedup, totals as its own process\)"):
        hook.run_stage("keyed")
    assert len(submitted) == 2 and not (tmp_path / "_checkpoints").exists()


def test_a_graphs_recovery_prints_its_plan_and_a_dry_run_touches_nothing(tmp_path):
    from airflow.sdk.exceptions import AirflowFailException
    from ckpt_airflow.operators import ValidateRecoveryParamsOperator

    from synthetic_warehouse import synthetic_graph_warehouse

    w = synthetic_graph_warehouse(tmp_path / "w")
    before = sorted(p.relative_to(w) for p in w.rglob("*"))

    def validate(**kw):
        return ValidateRecoveryParamsOperator(task_id="v", pipeline="enrichment", warehouse=str(w), **kw).execute({})

    with pytest.raises(AirflowFailException, match="invalid allow_non_restored_state"):
        validate(allow_non_restored_state="maybe")
    params = validate(checkpoint_id="1", dry_run="true", allow_non_restored_state="true")
    assert {k: v for k, v in params.items() if k != "plan"} == {
        "checkpoint_id": 1, "mode": "aligned", "dry_run": True, "allow_non_restored_state": True}
    assert params["plan"].startswith("recovery of enrichment: restore checkpoint 1")
    assert "  tag  restores state table version 1" in params["plan"] and "landing/enrichment/accounts" in params["plan"]
    assert sorted(p.relative_to(w) for p in w.rglob("*")) == before  # read only


PLAIN = """
from checkpoint_lib.pipelines.enrichment import graph


def declared():
    \"\"\"enrichment's vertices as graph `plain`, which declares no quality suite.\"\"\"
    return graph("plain")
"""


@pytest.fixture
def plain_graph(tmp_path, monkeypatch):
    """``plain_graph:declared``: a graph (``plain``) that declares no after-restore suite, importable
    by reference; the registry's memory restored afterwards."""
    from checkpoint_lib import pipelines

    (tmp_path / "plain_graph.py").write_text(PLAIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(pipelines, "_loaded", {})
    yield "plain_graph:declared"
    sys.modules.pop("plain_graph", None)


def test_the_restore_validation_task_runs_a_graphs_own_suite_and_skips_a_graph_without_one(plain_graph, tmp_path,
                                                                                          monkeypatch):
    """The task takes either kind of pipeline from the registry: the registered ``enrichment`` runs
    its suite (a failure fails the task), a linear pipeline still runs its own, and a graph that
    declares none (``plain``, by reference as its DAG file declares it) skips, saying why, before
    Spark starts."""
    import types

    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    import checkpoint_lib.quality as quality
    from ckpt_airflow.dag_factory import build_dags
    from ckpt_airflow.hooks import CheckpointHook
    from ckpt_airflow.operators import ValidateRestoreOperator

    rec = build_dags(plain_graph)["plain_recover"]  # what its DAG file does: the name is known to the process
    assert [t.task_id for t in rec.topological_sort()][-2:] == ["validate_restore", "unpause"]
    asked, verdict = [], {"success": True}

    def suite(spark, pipeline, warehouse, checkpoint_id, **kw):
        asked.append((spark, pipeline, warehouse, checkpoint_id, kw))
        return types.SimpleNamespace(**verdict)

    monkeypatch.setattr(quality, "validate_restore", suite)
    monkeypatch.setattr(CheckpointHook, "spark", lambda self: f"spark of {self.pipeline}")
    w = str(tmp_path / "w")

    def run(pipeline: str) -> None:
        ValidateRestoreOperator(task_id="validate_restore", pipeline=pipeline, warehouse=w).execute({})

    with pytest.raises(AirflowSkipException, match="restore validation of plain skipped: plain is a dataflow graph "
                                                   r"that declares no quality suite: declare one with Graph\.quality"):
        run("plain")
    assert asked == []  # nothing validated, no Spark
    run("enrichment")
    run("payments")
    assert asked == [("spark of enrichment", "enrichment", w, None, {"raise_on_failure": False}),
                     ("spark of payments", "payments", w, None, {"raise_on_failure": False})]
    verdict["success"] = False
    with pytest.raises(AirflowFailException, match="restore validation of enrichment failed"):
        run("enrichment")


# --- real runs --------------------------------------------------------------------------------------


def _dags_test(env: dict[str, str], dag_id: str, *extra: str, check: bool = True) -> str:
    started = time.monotonic()
    r = subprocess.run([AIRFLOW, "dags", "test", dag_id, *extra], env=env, capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    (Path(env["AIRFLOW_HOME"]) / f"{dag_id}.{time.time():.0f}.log").write_text(out)
    print(f"{dag_id}: rc {r.returncode} in {time.monotonic() - started:.1f} s")
    if check:
        assert r.returncode == 0 and "state=success" in out, out[-6000:]
    return out


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """A tiny enrichment warehouse (two rounds landed with delta-rs) after ``airflow dags test
    enrichment_run`` (one step, then the final checkpoint)."""
    from checkpoint_lib.pipelines.enrichment_data import generate

    root = tmp_path_factory.mktemp("graph-e2e")
    warehouse, home = root / "warehouse", root / "home"
    settings = {"enrichment": {"rows_per_checkpoint": 10_000, "retries": 0}}
    env = airflow_env(home, warehouse, CKPT_DAG_SETTINGS=json.dumps(settings))
    migrate(home, env)
    generate(None, str(warehouse), 160, rounds=2, accounts=12, seed=11)
    _dags_test(env, "enrichment_run")
    return {"warehouse": warehouse, "home": home, "env": env}


def checked(warehouse: Path) -> None:
    from checkpoint_lib.pipelines.enrichment_data import check_enrichment

    check = check_enrichment(str(warehouse))
    assert check.ok, check.summary()
    assert check.duplicates and check.rejected_rows and check.dead_letters


@pytest.mark.slow  # CI tier: CI's real DAG run is payments' (test_dags_e2e.py); the graph's DAGs load and are
# checked above, and its runs go through the same hook and `ckpt run` path CI runs (tests/spark/test_graph_cli.py)
def test_the_graph_run_dag_runs_enrichment_end_to_end_exactly_once(ran):
    """``airflow dags test enrichment_run`` (real Airflow on SQLite, Spark local[2], Delta): its
    ``run_all`` task runs the graph until caught up through the hook, completes checkpoints and
    commits every sink, emitting them as assets; the verifier recomputes the outputs from the
    landing tables alone."""
    from checkpoint_lib.control import PipelineControl

    history = PipelineControl(ran["warehouse"], "enrichment").history()
    completed = [h["checkpoint_id"] for h in history if h["status"] == "completed"]
    assert len(completed) >= 2 and len(completed) == len(history), history
    checked(ran["warehouse"])
    events = _asset_events(ran["home"], "enrichment_run")
    assert {uri for uri, _, _ in events} == SINKS and {task for _, task, _ in events} == {"run_all"}
    assert all(max(completed) in extra["completed"] for *_, extra in events)


@pytest.mark.slow  # CI tier: the per-vertex DAG's form above; a gate's kill in tests/spark/test_graph_cut_edges.py
def test_the_per_vertex_run_dag_runs_each_process_group_as_a_task_and_commits_exactly_once(tmp_path):
    """``airflow dags test enrichment_run`` with the per-vertex layout: the sources' task injects the
    checkpoints, each operator's task reads its channel logs and acknowledges, the last completes
    them, and ``commit`` commits the sinks the earlier tasks left pre-committed; the verifier finds
    every output exactly once."""
    from checkpoint_lib.control import PipelineControl
    from checkpoint_lib.pipelines.enrichment_data import generate

    warehouse, home = tmp_path / "warehouse", tmp_path / "home"
    settings = {"enrichment": {"rows_per_checkpoint": 10_000, "retries": 0, "layout": "per_vertex"}}
    env = airflow_env(home, warehouse, CKPT_DAG_SETTINGS=json.dumps(settings))
    migrate(home, env)
    generate(None, str(warehouse), 160, rounds=2, accounts=12, seed=11)
    _dags_test(env, "enrichment_run")
    history = PipelineControl(warehouse, "enrichment").history()
    assert [h["status"] for h in history] and all(h["status"] == "completed" for h in history), history
    checked(warehouse)
    events = _asset_events(home, "enrichment_run")
    assert {task for _, task, _ in events} >= {"run_tag", "run_dedup", "run_totals", "commit"}


@pytest.mark.slow  # CI tier: CI runs the graph's run DAG above and its recovery through `ckpt recover`
# (tests/spark/test_graph_cli.py); the dry run's task is checked without Spark above
def test_the_graph_recover_dag_dry_runs_then_restores_an_older_checkpoint_exactly_once_and_validates_it(ran):
    """A dry run prints the plan and skips the rest, the restore validation too; a real recovery
    restores an older checkpoint, replays, and its ``validate_restore`` task runs the graph's own
    after-restore suite (``enrichment_quality``) on the latest checkpoint, which passes."""
    from checkpoint_lib.control import PipelineControl
    from checkpoint_lib.pipelines.enrichment_data import generate
    from checkpoint_lib.quality.records import ValidationLog

    control = PipelineControl(ran["warehouse"], "enrichment")
    validations = ValidationLog(ran["warehouse"] / "_checkpoints" / "enrichment")
    before = len(validations.rows())
    epoch = control.store.epochs.current()
    out = _dags_test(ran["env"], "enrichment_recover", "-c", json.dumps({"checkpoint_id": "latest", "dry_run": True}),
                     check=False)
    assert "recovery of enrichment: restore checkpoint" in out and "dry run: nothing was changed" in out, out[-6000:]
    assert control.store.epochs.current() == epoch and control.paused() is None
    assert _task_states(ran["home"], "enrichment_recover") == {
        "validate_params": "success", "unless_dry_run": "success", "pause": "skipped", "recover": "skipped",
        "validate_restore": "skipped", "unpause": "skipped"}
    assert len(validations.rows()) == before  # nothing validated
    generate(None, str(ran["warehouse"]), 60, rounds=1, accounts=12, seed=12)  # more lands before the recovery
    oldest = min(c.checkpoint_id for c in control.store.checkpoints.all())
    out = _dags_test(ran["env"], "enrichment_recover", "-c", json.dumps({"checkpoint_id": str(oldest)}))
    assert control.store.epochs.current() > epoch and control.paused() is None
    assert _task_states(ran["home"], "enrichment_recover") == {
        "validate_params": "success", "unless_dry_run": "success", "pause": "success", "recover": "success",
        "validate_restore": "success", "unpause": "success"}
    checked(ran["warehouse"])
    events = _asset_events(ran["home"], "enrichment_recover")
    assert {uri for uri, _, _ in events} == SINKS and {e["restored"] for *_, e in events} == {oldest}
    # the task ran the graph's own suite on the latest checkpoint, after the restore: recorded, passed
    rows = validations.rows()
    assert len(rows) == before + 1, rows
    latest = max(c.checkpoint_id for c in control.store.checkpoints.all())
    assert (rows[0]["kind"], rows[0]["success"], rows[0]["failed"]) == ("restore", True, 0), rows[0]["summary"]
    assert (rows[0]["checkpoint_id"], rows[0]["epoch"]) == (latest, control.store.epochs.current())
    assert rows[0]["evaluated"] > 0 and rows[0]["run_name"].startswith(f"enrichment-restore-c{latest}-")
    assert "restore validation of enrichment passed" in out


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A deployment of ``plain`` (enrichment's vertices, no quality suite), declared by reference in
    a DAG file of its own (``build_dags("plain_graph:declared")``), on a tiny warehouse of its own,
    after ``airflow dags test plain_run``."""
    from checkpoint_lib.pipelines.enrichment_data import generate

    root = tmp_path_factory.mktemp("graph-plain")
    warehouse, home, dags, mods = root / "warehouse", root / "home", root / "dags", root / "mods"
    dags.mkdir()
    mods.mkdir()
    (mods / "plain_graph.py").write_text(PLAIN)
    (dags / "plain_dags.py").write_text('from ckpt_airflow.dag_factory import build_dags\n\n'
                                        'globals().update(build_dags("plain_graph:declared"))\n')
    settings = {"plain": {"rows_per_checkpoint": 10_000, "retries": 0}}
    path = [str(mods), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = airflow_env(home, warehouse, CKPT_DAG_SETTINGS=json.dumps(settings), AIRFLOW__CORE__DAGS_FOLDER=str(dags),
                      PYTHONPATH=os.pathsep.join(path))
    migrate(home, env)
    generate(None, str(warehouse), 60, rounds=1, accounts=12, seed=13)
    _dags_test(env, "plain_run")
    return {"warehouse": warehouse, "home": home, "env": env}


@pytest.mark.slow  # CI tier: the task's skip is checked without Spark above (the same operator, the same registry)
def test_the_recover_dag_of_a_graph_that_declares_no_suite_skips_the_restore_validation_saying_why(plain):
    """Its ``validate_restore`` task is Airflow's skip, with the reason in the log, not a failure:
    the recovery stands, the pipeline is unpaused, the run succeeds, nothing is recorded as validated."""
    from checkpoint_lib.control import PipelineControl
    from checkpoint_lib.quality.records import ValidationLog

    control = PipelineControl(plain["warehouse"], "plain")
    epoch = control.store.epochs.current()
    out = _dags_test(plain["env"], "plain_recover", "-c", json.dumps({"checkpoint_id": "latest"}))
    assert control.store.epochs.current() > epoch and control.paused() is None
    assert _task_states(plain["home"], "plain_recover") == {
        "validate_params": "success", "unless_dry_run": "success", "pause": "success", "recover": "success",
        "validate_restore": "skipped", "unpause": "success"}
    assert ("restore validation of plain skipped: plain is a dataflow graph that declares no quality suite" in out), \
        out[-6000:]
    assert ValidationLog(plain["warehouse"] / "_checkpoints" / "plain").rows() == []


@pytest.mark.slow  # CI tier: CI runs the maintain task in tests/airflow/test_provider.py (control tables alone)
def test_the_graph_maintenance_dag_vacuums_its_state_tables_and_changes_no_output(ran):
    out = _dags_test(ran["env"], "enrichment_maintenance")
    for uid in ("tag", "dedup", "totals"):
        assert f"_checkpoints/enrichment/state/{uid}" in out
    checked(ran["warehouse"])


def _task_states(home: Path, dag_id: str) -> dict[str, str]:
    """The state of every task of ``dag_id``'s latest run, from the deployment's DB."""
    import sqlite3

    db = sqlite3.connect(home / "airflow.db")
    try:
        rows = db.execute("SELECT task_id, state FROM task_instance WHERE dag_id = ? AND run_id = "
                          "(SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1)",
                          (dag_id, dag_id)).fetchall()
    finally:
        db.close()
    return dict(rows)


def _asset_events(home: Path, dag_id: str) -> list:
    """(asset URI, source task, extra) of every asset event ``dag_id`` emitted, from the deployment's DB."""
    import sqlite3

    db = sqlite3.connect(home / "airflow.db")
    try:
        rows = db.execute("SELECT a.uri, e.source_task_id, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                          "WHERE e.source_dag_id = ?", (dag_id,)).fetchall()
    finally:
        db.close()
    return [(uri, task, json.loads(extra) if isinstance(extra, str) else extra) for uri, task, extra in rows]

"""Fast tests of the provider pieces against real Airflow (no Spark): DagBag, the trigger's
serialize() round trip and its events, the recovery form's validation, the spark-submit argv."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "plugins"))

from checkpoint_lib.control import PipelineControl, honour_requests  # noqa: E402
from checkpoint_lib.core.errors import FailureReason  # noqa: E402


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def test_dagbag_imports_every_pipeline_dag(dagbag):
    from ckpt_airflow.dag_factory import DAG_KINDS, dag_kinds, dag_pipelines
    from ckpt_airflow.ui import pipeline_dag_ids

    assert dagbag.import_errors == {}
    linear = [p for p in dag_pipelines() if dag_kinds(p) == DAG_KINDS]
    want = {f"{p}_{kind}" for p in linear for kind in ("run", "snapshot", "recover")}
    assert want <= set(dagbag.dags)
    assert {d for p in linear for d in pipeline_dag_ids(p)} == want  # what the Checkpoints page authorizes on
    assert {f"{p}_{kind}" for p in dag_pipelines() for kind in dag_kinds(p)} == set(dagbag.dags)  # graphs' too
    run = dagbag.dags["payments_run"]
    assert [t.task_id for t in run.topological_sort()] == ["source", "keyed"]
    snap = dagbag.dags["payments_snapshot"]
    assert snap.max_active_runs == 1
    assert snap.get_task("abort").trigger_rule == "one_failed"
    assert set(snap.get_task("wait_for_acks").downstream_task_ids) == {"commit", "abort"}
    rec = dagbag.dags["payments_recover"]
    assert rec.schedule is None and rec.get_task("unpause").is_teardown


def test_every_pipeline_has_a_daily_maintenance_dag_with_one_task(dagbag):
    from datetime import timedelta

    from ckpt_airflow.dag_factory import dag_pipelines
    from ckpt_airflow.operators import MaintainPipelineOperator

    for p in dag_pipelines():
        dag = dagbag.dags[f"{p}_maintenance"]
        assert dag.max_active_runs == 1 and not dag.catchup
        assert dag.schedule == timedelta(days=1)
        (task,) = dag.tasks
        assert task.task_id == "maintain" and isinstance(task, MaintainPipelineOperator) and task.pipeline == p
        assert task.dry_run is False and task.with_spark


GRAPH_MODULE = """
from checkpoint_lib.graph import Graph
from checkpoint_lib.pipeline import DeltaSink, DeltaSource


def declared():
    g = Graph("extragraph")
    g.source("s", DeltaSource("in", "k string")).sink("out", DeltaSink("out", "k string"))
    return g
"""


def test_a_registered_graph_gets_its_dags_beside_the_linear_pipelines(tmp_path, monkeypatch):
    """A dataflow graph among the registered pipelines gets its four DAGs (run: a task per process
    group of its plan; snapshot; recover; maintenance), every linear pipeline keeps its four, and
    asked for by name it gets the same four."""
    from importlib.metadata import EntryPoint

    from checkpoint_lib import pipelines
    from ckpt_airflow import dag_factory

    (tmp_path / "extra_graphs.py").write_text(GRAPH_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    installed = pipelines._registered()
    monkeypatch.setattr(pipelines, "_registered", lambda: {
        **installed, "extragraph": EntryPoint("extragraph", "extra_graphs:declared", pipelines.GROUP)})
    try:
        dags = dag_factory.dags_for_every_pipeline()
        assert "extragraph" in pipelines.names() and "extragraph" in dag_factory.dag_pipelines()
        assert {f"{p}_{kind}" for p in installed for kind in dag_factory.dag_kinds(p)} | \
            {"extragraph_run", "extragraph_snapshot", "extragraph_recover", "extragraph_maintenance"} == set(dags)
        assert [t.task_id for t in dags["extragraph_run"].tasks] == ["run_all"]
        assert set(dag_factory.build_dags("extragraph")) == \
            {"extragraph_run", "extragraph_snapshot", "extragraph_recover", "extragraph_maintenance"}
    finally:
        sys.modules.pop("extra_graphs", None)


def test_maintain_task_reports_what_it_deleted_and_skips_while_a_recovery_holds_the_pipeline(tmp_path):
    from airflow.sdk.exceptions import AirflowSkipException
    from ckpt_airflow.operators import MaintainPipelineOperator

    from checkpoint_lib.core.types import CheckpointKind, SubtaskAck, SubtaskId
    from checkpoint_lib.core.checkpoints import CompletedCheckpoint

    from checkpoint_lib.delta.store import DeltaCheckpointStore
    from checkpoint_lib.layout import checkpoint_root

    store = DeltaCheckpointStore.open(checkpoint_root(tmp_path, "payments"), retained=2)  # the runner's retention
    control = PipelineControl(tmp_path, "payments", store=store)
    store.epochs.begin()
    for _ in range(5):
        cid = store.ids.get_and_increment()
        store.checkpoints.record_pending(cid, trigger_time=float(cid), epoch=1)
        src = SubtaskId("source", 0)
        store.checkpoints.add(CompletedCheckpoint(cid, CheckpointKind.CHECKPOINT, float(cid), cid + 0.5,
                                      {src: SubtaskAck(state={"version": cid})}, {src: cid + 0.5}), epoch=1)
    op = MaintainPipelineOperator(task_id="maintain", pipeline="payments", warehouse=str(tmp_path), with_spark=False,
                                  dry_run="true")
    report = op.execute({})
    assert report["dry_run"] and report["needs"]["retained"] == [4, 5]
    rows = {r["rule"]: r for r in report["rules"] if r["target"].endswith("checkpoints")}
    assert rows["checkpoints rows"]["deleted"] > 0 and len(store.checkpoints.history()) == 5  # a dry run deletes nothing
    report = MaintainPipelineOperator(task_id="m2", pipeline="payments", warehouse=str(tmp_path),
                                      with_spark=False).execute({})
    assert not report["dry_run"] and [h["checkpoint_id"] for h in store.checkpoints.history()] == [5, 4]
    assert any(r["skipped"] and "Spark" in r["skipped"] for r in report["rules"])  # said, not silently passed
    control.pause("recover-run", "recovery")
    with pytest.raises(AirflowSkipException, match="paused"):
        op.execute({})


def test_trigger_serialize_round_trip():
    from ckpt_airflow.triggers import CheckpointAcksTrigger

    trigger = CheckpointAcksTrigger(warehouse="/w", pipeline="payments", deadline=123.5, request_id="r-1",
                                    poll_interval=2.0)
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    cls = getattr(__import__(module, fromlist=[name]), name)
    again = cls(**kwargs)
    assert again.serialize() == (classpath, kwargs) and cls is CheckpointAcksTrigger
    with pytest.raises(ValueError):
        CheckpointAcksTrigger(warehouse="/w", pipeline="payments", deadline=1.0)


def _first_event(trigger):
    async def first():
        async for event in trigger.run():
            return event.payload
    return asyncio.run(first())


def test_trigger_fires_done_when_the_checkpoint_is_decided_and_timeout_otherwise(tmp_path):
    from ckpt_airflow.triggers import CheckpointAcksTrigger

    control = PipelineControl(tmp_path, "payments")
    control.request_checkpoint("r1")
    started = time.monotonic()
    timeout = _first_event(CheckpointAcksTrigger(str(tmp_path), "payments", deadline=time.time() + 0.5,
                                                 request_id="r1", poll_interval=0.1))
    assert timeout["event"] == "timeout" and timeout["status"] == "requested"
    assert time.monotonic() - started < 5
    store = control.store
    store.epochs.begin()
    cid = store.ids.get_and_increment()
    honour_requests(control.root, cid, 1)
    store.checkpoints.record_pending(cid, trigger_time=1.0, epoch=1)
    control.abort(checkpoint_id=cid, reason=FailureReason.DECLINED, message="snapshot failed")
    done = _first_event(CheckpointAcksTrigger(str(tmp_path), "payments", deadline=time.time() + 30,
                                              request_id="r1", poll_interval=0.1))
    assert (done["event"], done["status"], done["checkpoint_id"], done["failure_reason"]) == (
        "done", "aborted", cid, "declined")


def test_sensor_turns_events_into_clear_outcomes():
    from airflow.sdk.exceptions import AirflowFailException
    from ckpt_airflow.sensors import CheckpointAcksSensor

    sensor = CheckpointAcksSensor(task_id="w", pipeline="payments", request_id="r", ack_timeout=60)
    assert sensor.execute_complete({}, {"event": "done", "status": "completed", "checkpoint_id": 4}) == 4
    with pytest.raises(AirflowFailException, match="did not complete within 60 s"):
        sensor.execute_complete({}, {"event": "timeout", "status": "requested", "checkpoint_id": None})
    with pytest.raises(AirflowFailException, match="was aborted"):
        sensor.execute_complete({}, {"event": "done", "status": "aborted", "checkpoint_id": 4,
                                     "failure_reason": "expired"})


@pytest.mark.parametrize("value", ["latest", "7", "123456789012345678"])
def test_recover_form_accepts(dagbag, value):
    from airflow.sdk.definitions.param import ParamsDict

    params = ParamsDict(dagbag.dags["payments_recover"].params)
    params["checkpoint_id"] = value
    params.validate()


@pytest.mark.parametrize("value", ["../../etc/passwd", "abc", "-1", "0", "1" * 19, "x" * 5000, "7; rm -rf /", ""])
def test_recover_form_refuses_bad_checkpoint_ids(dagbag, value):
    from airflow.sdk.definitions.param import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    params = ParamsDict(dagbag.dags["payments_recover"].params)
    with pytest.raises(ParamValidationError):
        params["checkpoint_id"] = value
        params.validate()


def test_validate_params_task_fails_fast_and_touches_nothing(tmp_path):
    from airflow.sdk.exceptions import AirflowFailException
    from ckpt_airflow.operators import ValidateRecoveryParamsOperator

    for bad, message in [("../x", "looks like a path"), ("abc", "not a number"), ("42", "not a retained"),
                         ("9" * 40, "too long")]:
        op = ValidateRecoveryParamsOperator(task_id=f"v{len(bad)}", pipeline="payments", warehouse=str(tmp_path),
                                            checkpoint_id=bad)
        with pytest.raises(AirflowFailException, match=message):
            op.execute({})
    op = ValidateRecoveryParamsOperator(task_id="m", pipeline="payments", warehouse=str(tmp_path), mode="fast")
    with pytest.raises(AirflowFailException, match="invalid mode"):
        op.execute({})
    assert not (tmp_path / "_checkpoints" / "payments" / "control").exists()
    assert not (tmp_path / "_checkpoints" / "payments" / "epochs" / "_delta_log" / "00000000000000000001.json").exists()


def test_spark_submit_argv_is_exact():
    from checkpoint_lib.submit import JOBS_DIR, build_submit_argv, stage_args

    args = stage_args("payments", "/w", stage="source", rows_per_checkpoint=500)
    argv = build_submit_argv("run_stage.py", args, master="spark://127.0.0.1:7077", jars=["/j/a.jar", "/j/b.jar"],
                             conf={"spark.executor.memory": "1g"})
    assert argv == [
        "spark-submit", "--master", "spark://127.0.0.1:7077", "--name", "ckpt-run_stage",
        "--jars", "/j/a.jar,/j/b.jar", "--conf", "spark.executor.memory=1g", str(JOBS_DIR / "run_stage.py"),
        "payments", "--warehouse", "/w", "--stage", "source", "--mode", "aligned", "--rows-per-checkpoint", "500",
        "--until-caught-up",
    ]
    for job in ("run_stage.py", "recover.py", "generate.py", "maintain.py"):
        assert (JOBS_DIR / job).is_file()
    with pytest.raises(ValueError, match="stage"):
        stage_args("payments", "/w", stage="sink")
    sized = build_submit_argv("run_stage.py", args, master="local[2]", name="ckpt-bench", driver_memory="2g",
                              executor_memory="1g")
    assert sized[:9] == ["spark-submit", "--master", "local[2]", "--name", "ckpt-bench", "--driver-memory", "2g",
                         "--executor-memory", "1g"]
    # the argv the jobs hand to the CLI parses
    from checkpoint_lib.cli import build_parser

    build_parser().parse_args(["run", *args])
    build_parser().parse_args(["maintain", "payments", "--warehouse", "/w", "--dry-run"])


def test_warehouse_resolution_order(monkeypatch, tmp_path):
    from ckpt_airflow.hooks import WarehouseNotConfigured, resolve_warehouse

    monkeypatch.delenv("CKPT_WAREHOUSE", raising=False)
    with pytest.raises(WarehouseNotConfigured, match="CKPT_WAREHOUSE"):
        resolve_warehouse()
    monkeypatch.setenv("CKPT_WAREHOUSE", str(tmp_path / "env"))
    assert resolve_warehouse() == str(tmp_path / "env")
    assert resolve_warehouse(conn_extra={"warehouse": "/c"}) == "/c"
    assert resolve_warehouse("/x", {"warehouse": "/c"}) == "/x"


def test_failure_callback_says_what_failed_and_what_happens_next():
    from ckpt_airflow.callbacks import failure_summary

    line = failure_summary("payments_run", "keyed", 1, 2, RuntimeError("executor lost"))
    assert line.startswith("checkpoint_lib: payments_run.keyed try 1 (will be retried): RuntimeError: executor lost.")
    assert "recovers the whole pipeline" in line
    last = failure_summary("payments_snapshot", "commit", 3, 2, None)
    assert "(no retries left): failed" in last and "idempotent" in last


def test_every_dag_task_reports_failures_through_the_notifier(dagbag):
    from ckpt_airflow.callbacks import FailureNotifier

    tasks = [t for d in dagbag.dags.values() for t in d.tasks if t.task_id != "unless_dry_run"]
    assert tasks and all(any(isinstance(n, FailureNotifier) for n in (t.on_failure_callback or []))
                         and any(isinstance(n, FailureNotifier) for n in (t.on_retry_callback or []))
                         for t in tasks)


told: list = []


def on_call(context):
    """A notifier a user names in the settings (``tests.airflow.test_provider:on_call`` style)."""
    told.append(context["checkpoint_lib_summary"])


def test_the_failure_notifier_logs_then_tells_the_notifiers_a_user_named(caplog):
    from types import SimpleNamespace

    from ckpt_airflow.callbacks import FailureNotifier, resolve_notifier

    told.clear()
    notifier = FailureNotifier(then=[resolve_notifier(f"{__name__}:on_call")])
    ti = SimpleNamespace(dag_id="payments_snapshot", task_id="commit", try_number=3, max_tries=2)
    with caplog.at_level("ERROR", logger="checkpoint_lib.airflow"):
        notifier({"ti": ti, "exception": RuntimeError("metastore gone")})
    assert len(told) == 1 and told[0].startswith("checkpoint_lib: payments_snapshot.commit try 3 (no retries left)")
    assert told[0] in caplog.text
    with pytest.raises(ValueError, match="module:attr"):
        resolve_notifier("no_colon")


def test_the_installed_provider_registers_its_connection_type_and_form():
    """The package's ``apache_airflow_provider`` entry point, as Airflow's ProvidersManager reads
    it: valid against Airflow's own provider schema, the ``checkpoint_lib`` connection type with
    its form fields and labels."""
    import jsonschema
    from airflow.providers_manager import ProvidersManager

    from ckpt_airflow.provider import get_provider_info

    schema = json.loads((Path(__import__("airflow").__file__).parent / "provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)
    pm = ProvidersManager()
    assert "checkpoint-lib" in pm.providers, "pip install -e . registers the entry point (make setup does)"
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime  # where a task finds its hook

    assert ProvidersManagerTaskRuntime().hooks["checkpoint_lib"].hook_class_name == "ckpt_airflow.hooks.CheckpointHook"
    widgets = pm.connection_form_widgets
    assert {"extra__checkpoint_lib__warehouse", "extra__checkpoint_lib__launcher"} <= set(widgets)
    behaviour = pm.field_behaviours["checkpoint_lib"]
    assert behaviour["relabeling"] == {"host": "Spark master"} and "password" in behaviour["hidden_fields"]


def test_every_hook_reads_the_default_connection_when_there_is_one(tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowNotFoundException

    from ckpt_airflow.hooks import CheckpointHook
    from ckpt_airflow.sensors import CheckpointAcksSensor

    monkeypatch.setenv("CKPT_WAREHOUSE", str(tmp_path / "from-env"))
    monkeypatch.delenv("CKPT_SPARK_MASTER", raising=False)
    assert CheckpointHook("payments").warehouse == str(tmp_path / "from-env")  # no default connection: fine
    monkeypatch.setenv("AIRFLOW_CONN_CHECKPOINT_LIB_DEFAULT", json.dumps({
        "conn_type": "checkpoint_lib", "host": "spark://spark-master:7077",
        "extra": {"extra__checkpoint_lib__warehouse": str(tmp_path / "from-conn"), "launcher": "spark-submit"}}))
    hook = CheckpointHook("payments")
    assert (hook.warehouse, hook.spark_master, hook.launcher) == \
        (str(tmp_path / "from-conn"), "spark://spark-master:7077", "spark-submit")
    sensor = CheckpointAcksSensor(task_id="acks", pipeline="payments", request_id="r1")
    assert sensor._hook().warehouse == str(tmp_path / "from-conn")  # the sensor honours it too
    assert CheckpointHook("payments", warehouse="/explicit").warehouse == "/explicit"  # an argument still wins
    with pytest.raises(AirflowNotFoundException):
        _ = CheckpointHook("payments", ckpt_conn_id="named_but_missing").warehouse


def test_the_dags_come_from_the_installed_factory_and_belong_to_the_dag_file(dagbag):
    """``dags/checkpoint_lib_dags.py`` is two lines over ``ckpt_airflow.dag_factory``; Airflow
    attributes every DAG to that file (it re-parses it to run a task)."""
    text = (REPO / "dags" / "checkpoint_lib_dags.py").read_text()
    assert "dags_for_every_pipeline()" in text and "DAG(" not in text
    assert {d.fileloc for d in dagbag.dags.values()} == {str(REPO / "dags" / "checkpoint_lib_dags.py")}


def test_the_tasks_that_commit_have_the_sinks_as_assets_and_a_downstream_dag_can_wait_for_them(dagbag):
    from airflow.sdk import DAG

    from ckpt_airflow.assets import sink_assets

    assets = sink_assets("payments")
    assert {a.uri for a in assets} == {"x-checkpoint-lib://payments/gold/ledger",
                                        "x-checkpoint-lib://payments/gold/balances"}
    for dag_id, task_id in (("payments_run", "keyed"), ("payments_snapshot", "commit"), ("payments_recover", "recover")):
        task = dagbag.dags[dag_id].get_task(task_id)
        assert {o.uri for o in task.outlets} == {a.uri for a in assets}, (dag_id, task_id)
    assert not dagbag.dags["payments_run"].get_task("source").outlets
    downstream = DAG("reports", schedule=assets[1])  # runs when a checkpoint's commit lands
    assert downstream.timetable.asset_condition is not None


def test_a_sink_outside_the_warehouse_is_an_asset_named_by_its_target_and_its_pipelines_dags_build():
    """A pipeline with a PostgreSQL sink (known to the process by reference, as ``ckpt run`` and the
    Checkpoints page load it) has its DAGs: the sink's asset is its target, and its events say so
    instead of a path in the warehouse. Before, the DAG file failed on every pipeline."""
    from types import SimpleNamespace

    from ckpt_airflow.assets import annotate, sink_assets
    from ckpt_airflow.dag_factory import build_recover_dag, build_run_dag, build_snapshot_dag, settings_for

    from checkpoint_lib.pipelines import declared

    name = declared("checkpoint_lib.pipelines.payments_postgres:pipeline").name
    assets = {a.name: a for a in sink_assets(name)}
    assert {n: a.uri for n, a in assets.items()} == {
        "payments_pg.ledger": "x-checkpoint-lib://payments_pg/gold/ledger",
        "payments_pg.balances": "x-checkpoint-lib://payments_pg/gold/balances",
        "payments_pg.balances_pg": "x-checkpoint-lib://payments_pg/postgresql%3Ackpt_postgres/balances"}
    class Events(dict):
        def __missing__(self, key):
            return self.setdefault(key, SimpleNamespace(extra=None))

    events = Events()
    annotate({"outlet_events": events}, list(assets.values()), "/w", checkpoint_id=3)
    assert events[assets["payments_pg.ledger"]].extra == {"checkpoint_id": 3, "table": "/w/gold/ledger"}
    assert events[assets["payments_pg.balances_pg"]].extra == {"checkpoint_id": 3,
                                                               "table": "postgresql:ckpt_postgres/balances"}
    s = settings_for(name)
    for build in (build_run_dag, build_snapshot_dag, build_recover_dag):
        assert build(name, s).dag_id.startswith(f"{name}_")


def test_the_recover_dags_dry_run_logs_the_plan_ckpt_recover_dry_run_prints(tmp_path, capsys):
    from synthetic_warehouse import synthetic_warehouse

    from checkpoint_lib import cli
    from ckpt_airflow.operators import ValidateRecoveryParamsOperator

    w = synthetic_warehouse(tmp_path / "w")  # a payments warehouse with state and sink tables, by delta-rs
    op = ValidateRecoveryParamsOperator(task_id="dry", pipeline="payments", warehouse=str(w), checkpoint_id="1",
                                        dry_run=True)
    params = op.execute({})
    logged = capsys.readouterr().out  # Airflow's task log
    assert params["plan"] in logged
    assert cli.main(["recover", "payments", "--warehouse", str(w), "--checkpoint", "1", "--dry-run"]) == 0
    assert params["plan"] == capsys.readouterr().out.rstrip("\n")
    assert "sinks: rolled back to what checkpoint 1 committed" in params["plan"]
    assert "ledger    gold/ledger version 2 -> version 0: 400 rows -> 200 (200 discarded)" in params["plan"]
    assert "balance  restores state table version 1 (now at 2)" in params["plan"]
    assert "landing/payments  after version 0 up to version 1: 200 rows to replay" in params["plan"]

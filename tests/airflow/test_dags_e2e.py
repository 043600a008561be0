"""``airflow dags test`` of every payments DAG, end to end, on tiny data (real Airflow on SQLite,
real Spark local[2], real Delta), asserting exactly-once outputs with the independent checker.

Order (one module, one warehouse): the snapshot DAG's request is honoured by a run of the run
DAG (two `dags test` processes with separate SQLite homes sharing the warehouse, as two
deployments would), then the recover DAG: a dry run and a refused parameter change nothing, and
(slow) a real recovery to an older checkpoint (sinks rolled back, replayed) - outputs still exactly
once.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from checkpoint_lib.control import PipelineControl
from checkpoint_lib.verify import check_payments
from helpers import AIRFLOW, airflow_env, append_payments, clone_home, migrate

SETTINGS = json.dumps({"payments": {"min_pause_s": 0, "ack_timeout_s": 900, "poll_s": 2, "retries": 0}})


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    warehouse = root / "warehouse"
    env_a = airflow_env(root / "home_a", warehouse, CKPT_DAG_SETTINGS=SETTINGS)
    env_b = airflow_env(root / "home_b", warehouse, CKPT_DAG_SETTINGS=SETTINGS)
    migrate(root / "home_a", env_a)
    clone_home(root / "home_a", root / "home_b")
    append_payments(warehouse, 300, batch=0)
    return {"root": root, "warehouse": warehouse, "a": env_a, "b": env_b}


@pytest.fixture
def checkpointed(world):
    """The world with completed checkpoints, as the CI-tier test above leaves it; where that test did
    not run first (the slow tier alone, ``-m slow``, deselects it), one run of the run DAG makes them."""
    if not PipelineControl(world["warehouse"], "payments").store.checkpoints.all():
        _dags_test(world["a"], "payments_run")
    return world


def _dags_test(env, dag_id, *extra, check=True, timeout=900):
    started = time.monotonic()
    r = subprocess.run([AIRFLOW, "dags", "test", dag_id, *extra], env=env, capture_output=True, text=True,
                       timeout=timeout)
    out = r.stdout + r.stderr
    (Path(env["AIRFLOW_HOME"]) / f"{dag_id}.{time.time():.0f}.log").write_text(out)
    print(f"{dag_id}: rc {r.returncode} in {time.monotonic() - started:.1f} s")
    if check and (r.returncode != 0 or "state=success" not in out):
        pytest.fail(f"airflow dags test {dag_id} failed (rc {r.returncode}):\n{out[-6000:]}")
    return out


def test_snapshot_dag_is_honoured_by_the_run_dag_and_commits(world):
    control = PipelineControl(world["warehouse"], "payments")
    log = open(world["root"] / "snapshot.log", "w")
    snapshot = subprocess.Popen([AIRFLOW, "dags", "test", "payments_snapshot"], env=world["b"], stdout=log,
                                stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not control.requests.all():
            assert snapshot.poll() is None, (world["root"] / "snapshot.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "the snapshot DAG made no request"
            time.sleep(1)
        _dags_test(world["a"], "payments_run")
        assert snapshot.wait(timeout=600) == 0
    finally:
        if snapshot.poll() is None:
            snapshot.kill()
        log.close()
    out = (world["root"] / "snapshot.log").read_text()
    assert "state=success" in out and "Marking run" in out
    (request,) = control.requests.all()
    assert request.state == "honoured"
    assert control.progress(request_id=request.request_id).status == "completed"
    assert "already committed" in out or "committed transactions" in out
    check = check_payments(str(world["warehouse"]))
    assert check.ok, check.summary()
    assert check.ledger_rows == check.valid_rows > 0
    # the tasks that committed emitted the sinks as Assets: the run DAG's keyed stage (it completed
    # the checkpoint) in one deployment, the snapshot DAG's commit in the other
    cid = control.progress(request_id=request.request_id).checkpoint_id
    sinks = {"x-checkpoint-lib://payments/gold/ledger", "x-checkpoint-lib://payments/gold/balances"}
    keyed = _asset_events(world["a"], "payments_run")
    assert {uri for uri, _, _ in keyed} == sinks and {task for _, task, _ in keyed} == {"keyed"}
    assert all(cid in extra["completed"] and extra["table"].startswith(str(world["warehouse"])) for *_, extra in keyed)
    committed = _asset_events(world["b"], "payments_snapshot")
    assert {uri for uri, _, _ in committed} == sinks and {task for _, task, _ in committed} == {"commit"}
    assert {extra["checkpoint_id"] for *_, extra in committed} == {cid}


def _asset_events(env, dag_id):
    """(asset URI, source task, extra) of every asset event ``dag_id`` emitted, from the deployment's DB."""
    import sqlite3

    db = sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db")
    try:
        rows = db.execute("SELECT a.uri, e.source_task_id, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                          "WHERE e.source_dag_id = ?", (dag_id,)).fetchall()
    finally:
        db.close()
    return [(uri, task, json.loads(extra) if isinstance(extra, str) else extra) for uri, task, extra in rows]


@pytest.mark.slow  # CI tier: the params check (test_provider.py: validate_params); the wheel's recover DAG dry
# run (test_wheel.py) is slow too; this is the same from a checkout
def test_recover_dag_dry_run_and_bad_params_change_nothing(checkpointed):
    world = checkpointed
    control = PipelineControl(world["warehouse"], "payments")
    epoch = control.store.epochs.current()
    out = _dags_test(world["a"], "payments_recover", "-c", json.dumps({"checkpoint_id": "latest", "dry_run": True}))
    assert "restore checkpoint" in out and control.store.epochs.current() == epoch  # only printed the plan
    bad = _dags_test(world["a"], "payments_recover", "-c", json.dumps({"checkpoint_id": "../../etc"}), check=False)
    assert "checkpoint_id" in bad and "state=success" not in bad
    assert control.store.epochs.current() == epoch and control.paused() is None


@pytest.mark.slow  # CI tier: CI's real DAG run is the snapshot DAG above; the real recovery is tests/chaos
def test_recover_dag_restores_an_older_checkpoint_exactly_once(checkpointed):
    world = checkpointed
    control = PipelineControl(world["warehouse"], "payments")
    epoch = control.store.epochs.current()
    append_payments(world["warehouse"], 150, batch=1)
    oldest = min(c.checkpoint_id for c in control.store.checkpoints.all())
    out = _dags_test(world["a"], "payments_recover", "-c", json.dumps({"checkpoint_id": str(oldest), "mode": "aligned"}))
    assert control.store.epochs.current() > epoch and control.paused() is None, out[-6000:]
    check = check_payments(str(world["warehouse"]))
    assert check.ok, check.summary()
    assert check.valid_rows > 290


@pytest.mark.slow  # CI tier: CI runs the maintain task in tests/airflow/test_provider.py
def test_maintenance_dag_drops_what_no_retained_checkpoint_needs_and_changes_no_output(checkpointed):
    world = checkpointed
    from checkpoint_lib.delta.store import DeltaCheckpointStore
    from checkpoint_lib.maintenance import read_needs

    control = PipelineControl(world["warehouse"], "payments")
    retained = [c.checkpoint_id for c in control.store.checkpoints.all()]
    needs = read_needs(DeltaCheckpointStore(control.root))
    _dags_test(world["a"], "payments_maintenance")
    store = DeltaCheckpointStore(control.root)
    assert [c.checkpoint_id for c in store.checkpoints.all()] == retained
    assert {h["checkpoint_id"] for h in store.checkpoints.history()} <= needs.protected | set(range(needs.floor, needs.max_id + 1))
    check = check_payments(str(world["warehouse"]))
    assert check.ok, check.summary()

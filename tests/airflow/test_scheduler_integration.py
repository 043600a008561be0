"""A real Airflow deployment (scheduler, dag-processor, triggerer on SQLite, LocalExecutor): the
``payments_snapshot`` DAG runs on its schedule at least twice (its deferrable sensor waits in the
triggerer) while ``payments_run`` processes data landing meanwhile; then ``payments_recover`` is
triggered with parameters. The outputs must be exactly once and every snapshot committed.

Slow (minutes of scheduling and Spark in task processes): ``make test PYTEST_ARGS="-m slow -k scheduler"``.
"""

from __future__ import annotations

import json
import secrets
import signal
import socket
import subprocess
import time

import pytest

from checkpoint_lib.control import PipelineControl
from checkpoint_lib.verify import check_payments
from helpers import AIRFLOW, airflow_env, append_payments, migrate

pytestmark = pytest.mark.slow

SETTINGS = json.dumps({"payments": {
    "run_every_s": 40, "snapshot_every_s": 60, "min_pause_s": 0, "ack_timeout_s": 900, "poll_s": 3, "retries": 1,
}})
COMPONENTS = ("api-server", "dag-processor", "scheduler", "triggerer")  # tasks report through the api-server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def runs(env, dag_id: str) -> list[dict]:
    out = subprocess.run([AIRFLOW, "dags", "list-runs", dag_id, "-o", "json"], env=env, capture_output=True,
                         text=True, timeout=120)
    if out.returncode != 0:
        return []
    for line in out.stdout.splitlines():  # warnings may come first on stdout
        if line.startswith("[{") or line.strip() == "[]":
            return json.loads(line)
    return []


def wait_for(what: str, predicate, timeout: float, procs) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for name, p in procs.items():
            assert p.poll() is None, f"airflow {name} exited with {p.returncode} while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(5)


def test_scheduled_snapshots_while_running_then_manual_recover(tmp_path):
    warehouse = tmp_path / "warehouse"
    port = free_port()
    env = airflow_env(tmp_path / "home", warehouse, CKPT_DAG_SETTINGS=SETTINGS,
                      AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
                      AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL="10",
                      AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="10",
                      AIRFLOW__API__HOST="127.0.0.1", AIRFLOW__API__PORT=str(port), AIRFLOW__API__WORKERS="1",
                      AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_hex(16),  # shared by every component
                      AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{port}/execution/")
    migrate(tmp_path / "home", env)
    append_payments(warehouse, 300, batch=0)
    control = PipelineControl(warehouse, "payments")
    procs = {}
    try:
        for name in COMPONENTS:
            log = open(tmp_path / f"{name}.log", "w")
            procs[name] = subprocess.Popen([AIRFLOW, name], env=env, stdout=log, stderr=subprocess.STDOUT)

        def succeeded(dag_id: str, n: int) -> bool:
            return sum(r.get("state") == "success" for r in runs(env, dag_id)) >= n

        wait_for("the first payments_snapshot run", lambda: succeeded("payments_snapshot", 1), 1800, procs)
        append_payments(warehouse, 200, batch=1)  # data lands while the pipeline runs
        wait_for("a second payments_snapshot run", lambda: succeeded("payments_snapshot", 2), 1800, procs)
        wait_for("payments_run to catch up", lambda: succeeded("payments_run", 2), 1800, procs)
        failed = [r for d in ("payments_snapshot", "payments_run") for r in runs(env, d) if r.get("state") == "failed"]
        assert not failed, failed

        latest = max(c.checkpoint_id for c in control.store.checkpoints.all())
        conf = json.dumps({"checkpoint_id": str(latest), "mode": "aligned", "dry_run": False})
        subprocess.run([AIRFLOW, "dags", "trigger", "payments_recover", "-c", conf], env=env, check=True,
                       capture_output=True, timeout=120)
        wait_for("payments_recover", lambda: any(r.get("state") in ("success", "failed")
                                                 for r in runs(env, "payments_recover")), 1800, procs)
        (recover,) = runs(env, "payments_recover")
        assert recover["state"] == "success", recover
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    honoured = [control.progress(request_id=r.request_id) for r in control.requests.all() if r.state == "honoured"]
    # The scheduled snapshots completed. One in flight when the recovery fenced epoch 1 is aborted
    # (its DAG run fails on purpose and its abort task records why); one still in flight when this
    # test stops the deployment stays pending (the next run's recovery aborts it).
    # A snapshot that completed may be discarded since (retention keeps the latest few; the manual
    # recover discards what completed after the checkpoint it restores): its row keeps its
    # completion time, a checkpoint that never completed has none.
    completed = [p for p in honoured if p.status in ("completed", "discarded")
                 and control.store.checkpoints.status(p.checkpoint_id)["completion_time"] is not None]
    assert len(completed) >= 2, honoured
    assert all(p.status in ("completed", "aborted", "discarded", "pending") for p in honoured), honoured
    assert control.paused() is None  # the recover DAG unpaused the pipeline
    check = check_payments(str(warehouse))
    assert check.ok, check.summary()
    assert check.ledger_rows == check.valid_rows and check.valid_rows > 480

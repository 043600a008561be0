"""The recover DAG's pause/unpause through Airflow's REST API, against a real api-server
(SimpleAuthManager with a user from a password file, a token from /auth/token)."""

from __future__ import annotations

import json
import secrets
import subprocess

import pytest

from ckpt_airflow.hooks import API_CONN_ID, CheckpointHook
from helpers import AIRFLOW, airflow_env, free_port, migrate, wait_healthy

pytestmark = pytest.mark.slow


def _paused(env, dag_id: str) -> bool:
    out = subprocess.run([AIRFLOW, "dags", "details", dag_id, "-o", "json"], env=env, capture_output=True,
                         text=True, timeout=120).stdout
    line = next(l for l in out.splitlines() if l.startswith("[{") or l.startswith("{"))
    data = json.loads(line)
    return str((data[0] if isinstance(data, list) else data)["is_paused"]).lower() == "true"  # the CLI prints "False"


def test_hook_pauses_and_unpauses_dags_through_the_rest_api(tmp_path, monkeypatch):
    port, password = free_port(), secrets.token_hex(8)
    (tmp_path / "passwords.json").write_text(json.dumps({"ckpt": password}))
    env = airflow_env(tmp_path / "home", tmp_path / "warehouse",
                      AIRFLOW__API__HOST="127.0.0.1", AIRFLOW__API__PORT=str(port), AIRFLOW__API__WORKERS="1",
                      AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_hex(16),
                      AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="ckpt:admin",
                      AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(tmp_path / "passwords.json"),
                      AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False")
    migrate(tmp_path / "home", env)
    subprocess.run([AIRFLOW, "dags", "reserialize"], env=env, check=True, capture_output=True, timeout=300)
    for dag_id in ("payments_run", "payments_snapshot"):  # a running deployment: both active
        subprocess.run([AIRFLOW, "dags", "unpause", dag_id], env=env, check=True, capture_output=True, timeout=120)
    assert not _paused(env, "payments_run")
    server = subprocess.Popen([AIRFLOW, "api-server"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", server, 180)
        monkeypatch.setenv(f"AIRFLOW_CONN_{API_CONN_ID.upper()}", f"http://ckpt:{password}@127.0.0.1:{port}")
        hook = CheckpointHook("payments", warehouse=str(tmp_path / "warehouse"))
        assert hook.set_dags_paused(["payments_run", "payments_snapshot", "no_such_dag"], True) == [
            "payments_run", "payments_snapshot"]
        assert _paused(env, "payments_run") and _paused(env, "payments_snapshot")
        assert hook.set_dags_paused(["payments_run"], True) == []  # already paused: nothing changes
        assert hook.set_dags_paused(["payments_run", "payments_snapshot"], False) == ["payments_run", "payments_snapshot"]
        assert not _paused(env, "payments_run")
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()

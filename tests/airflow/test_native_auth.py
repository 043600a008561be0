"""The documented native start, ``make airflow`` (``airflow standalone``): authentication is on,
the only credential is the password Airflow generates into AIRFLOW_HOME, and the Checkpoints API
needs a user."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time

import httpx
import pytest

from helpers import REPO, airflow_env, free_port, wait_healthy

pytestmark = pytest.mark.airflow  # four Airflow components, ~2 GB, about a minute


@pytest.mark.slow  # CI tier: four native Airflow components (~40 s); test_compose checks the compose deployment's auth
def test_make_airflow_requires_a_login_with_the_generated_password(tmp_path):
    port = free_port()
    home = tmp_path / "home"
    env = airflow_env(home, tmp_path / "warehouse", AIRFLOW__API__PORT=str(port), AIRFLOW__API__HOST="127.0.0.1",
                      AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_hex(16))
    for own in ("AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER", "AIRFLOW__CORE__LOAD_EXAMPLES",
                "AIRFLOW__CORE__PARALLELISM", "CKPT_WAREHOUSE"):
        env.pop(own)  # what the Makefile sets itself
    cmd = ["make", "-C", str(REPO), "airflow", f"AIRFLOW_HOME={home}", f"CKPT_WAREHOUSE={tmp_path / 'warehouse'}"]
    log = open(tmp_path / "standalone.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, 600, tmp_path / "standalone.log")  # make setup first (a no-op when current)
        for path in ("/api/v2/dags", "/checkpoints/api/pipelines", "/checkpoints/api/payments/checkpoints", "/checkpoints/"):
            r = httpx.get(base + path, timeout=30)
            assert r.status_code in (401, 403), f"{path} without a login: {r.status_code} {r.text[:200]}"
        generated = home / "simple_auth_manager_passwords.json.generated"
        deadline = time.monotonic() + 60
        while not generated.exists():
            assert time.monotonic() < deadline, "no generated password file"
            time.sleep(1)
        users = json.loads(generated.read_text())
        assert list(users) == ["admin"] and len(users["admin"]) >= 12 and users["admin"] != "admin"
        bad = httpx.post(f"{base}/auth/token", json={"username": "admin", "password": "admin"}, timeout=30)
        assert bad.status_code in (401, 403), bad.text[:200]
        good = httpx.post(f"{base}/auth/token", json={"username": "admin", "password": users["admin"]}, timeout=30)
        assert good.status_code in (200, 201), good.text[:200]
        token = good.json()["access_token"]
        r = httpx.get(f"{base}/api/v2/dags", headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert r.status_code == 200, r.text[:200]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()

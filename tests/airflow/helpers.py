"""Shared helpers of the Airflow tests: tiny payments input written with delta-rs (no JVM), and an
isolated Airflow environment (AIRFLOW_HOME in a temporary directory, SQLite, this repo's dags/ and
plugins/, parallelism 4)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
AIRFLOW = str(VENV_BIN / "airflow")
_counter = [0]


def append_payments(warehouse: Path, rows: int, *, batch: int, accounts: int = 20, bad_every: int = 50) -> None:
    """Append ``rows`` payments (one new landing-table version), every ``bad_every``-th with a null
    account (a dead letter). Event ids are unique per ``batch``."""
    base = datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(days=batch)
    table = pa.table({
        "event_id": [f"b{batch}-e{i}" for i in range(rows)],
        "account": [None if bad_every and i % bad_every == 7 else f"acct-{(i * 7 + batch) % accounts}" for i in range(rows)],
        "amount_cents": pa.array([((i * 7919 + batch) % 20001) - 10000 for i in range(rows)], pa.int64()),
        "ts": pa.array([base + timedelta(seconds=i) for i in range(rows)], pa.timestamp("us", tz="UTC")),
    })
    write_deltalake(str(warehouse / "landing" / "payments"), table, mode="append")


def airflow_env(home: Path, warehouse: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "CKPT_WAREHOUSE": str(warehouse),
        "CKPT_SPARK_MASTER": "local[2]",
        "CKPT_SPARK_UI": "0",
        "CKPT_SHUFFLE_PARTITIONS": "2",
        "CKPT_DRIVER_MEMORY": "1g",
        "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}",
        **extra,
    })
    return env


def migrate(home: Path, env: dict[str, str]) -> None:
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run([AIRFLOW, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)


def clone_home(src: Path, dst: Path) -> None:
    """A second Airflow home with a copy of an already migrated SQLite database (saves ~5 s)."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "airflow.db", dst / "airflow.db")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base: str, proc: subprocess.Popen, timeout: float, log: Path | None = None) -> None:
    """Until ``base``/api/v2/monitor/health answers 200; fails if ``proc`` exits or time runs out."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{base}/api/v2/monitor/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, f"{proc.args} exited:\n" + (log.read_text()[-3000:] if log else "")
        assert time.monotonic() < deadline, f"{base} did not become healthy in {timeout:.0f} s"
        time.sleep(2)

"""Regenerate the README's picture of the Checkpoints page: a real ``airflow api-server`` (this repo's
plugins, a throw-away SQLite home, SimpleAuthManager with everyone admin so no login is needed) over
a warehouse, and Airflow's UI at ``/plugin/checkpoints`` in headless Chromium.

    .venv/bin/ckpt demo                                   # the warehouse the README shows
    .venv/bin/python docs/screenshot.py --warehouse warehouse/demo --out docs/img/checkpoints-page.png
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "airflow")]

from browser import screenshot  # noqa: E402
from helpers import AIRFLOW, airflow_env, free_port, migrate, wait_healthy  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warehouse", required=True)
    ap.add_argument("--out", default=str(REPO / "docs" / "img" / "checkpoints-page.png"))
    ap.add_argument("--path", default="/plugin/checkpoints",
                    help="the UI page: /plugin/checkpoints (Browse), /dags/payments_run/plugin/checkpoints-of-dag (a DAG's tab)")
    ap.add_argument("--theme", choices=("light", "dark"), default="light")
    ap.add_argument("--size", default="1400,1000", help="width,height")
    args = ap.parse_args()
    width, height = (int(x) for x in args.size.split(","))
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        env = airflow_env(home, Path(args.warehouse).resolve(), AIRFLOW__API__HOST="127.0.0.1",
                          AIRFLOW__API__PORT=str(port), AIRFLOW__API__WORKERS="1",
                          AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_hex(16),
                          AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True")
        migrate(home, env)
        subprocess.run([AIRFLOW, "dags", "reserialize"], env=env, check=True, capture_output=True, timeout=300)
        log = Path(tmp) / "api-server.log"
        with open(log, "w") as out:
            server = subprocess.Popen([AIRFLOW, "api-server"], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_healthy(f"http://127.0.0.1:{port}", server, 180, log)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            flags = ["--virtual-time-budget=15000", "--hide-scrollbars"]
            if args.theme == "dark":
                flags.append("--force-dark-mode")
            screenshot(f"http://127.0.0.1:{port}{args.path}", Path(args.out), width, height, *flags)
        finally:
            server.terminate()
            server.wait(timeout=60)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    raise SystemExit(main())

"""``payments_pg`` (payments, its balances also upserted into PostgreSQL by two-phase commit) killed
-9 between a checkpoint's prepare and its commit, then run again: the PostgreSQL table holds every
account's balance exactly once (the independent pandas computation's), the warehouse's outputs pass
the payments verifier, and no prepared transaction is left on the server. Against a real server
(tests/pg_server.py)."""

from __future__ import annotations

import os
import signal
import subprocess

import pandas as pd
import psycopg2
import pytest

from checkpoint_lib.submit import ckpt_run_argv, ckpt_run_env
from checkpoint_lib.verify import check_payments, expected_payments, landing_in_offset_order

pytestmark = [pytest.mark.crash, pytest.mark.spark]
REF = "checkpoint_lib.pipelines.payments_postgres:pipeline"
ROWS, VERSIONS = 200, 3
TIMEOUT = float(os.environ.get("CKPT_TEST_RUN_TIMEOUT", "900"))


def _run(warehouse: str, server, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**ckpt_run_env("local[2]", kill_at=kill_at), **server.env()}
    return subprocess.run(ckpt_run_argv(REF, warehouse, "--rows-per-checkpoint", str(ROWS)), env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)


def _prepared(server) -> list[str]:
    return [g for g in server.psql("SELECT gid FROM pg_prepared_xacts").split() if "payments_pg." in g]


def _balances(server) -> pd.DataFrame:
    with psycopg2.connect(server.uri) as conn, conn.cursor() as cur:
        cur.execute("SELECT account, balance_cents, event_count FROM balances ORDER BY account")
        rows = cur.fetchall()
    conn.close()
    return pd.DataFrame(rows, columns=["account", "balance_cents", "event_count"])


def test_killed_between_prepare_and_commit_the_database_holds_every_balance_once(spark, tmp_path, postgres_server):
    from checkpoint_lib.pipelines.payments_postgres import pipeline

    w = str(tmp_path / "warehouse")
    for v in range(VERSIONS):
        pipeline.generator_fn(spark, w, ROWS, bad_fraction=0.05, seed=70 + v)
    postgres_server.psql("DROP TABLE IF EXISTS balances")

    crashed = _run(w, postgres_server, kill_at="commit:2")  # checkpoint 2 complete, its prepares not committed
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr[-3000:]
    assert _prepared(postgres_server), "checkpoint 2's transactions should be prepared on the server"

    done = _run(w, postgres_server)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "restored checkpoint" in done.stdout, done.stdout
    assert _prepared(postgres_server) == []

    check = check_payments(w)
    assert check.ok, check.problems
    _, balances, _ = expected_payments(landing_in_offset_order(w))
    expected = balances.sort_values("account").reset_index(drop=True)[["account", "balance_cents", "event_count"]]
    got = _balances(postgres_server)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)

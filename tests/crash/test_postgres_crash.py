"""``payments_pg`` (payments, its balances also upserted into PostgreSQL by two-phase commit, here its ledger
also appended there) killed
-9 between a checkpoint's prepare and its commit, then run again: the PostgreSQL table holds every
account's balance exactly once (the independent pandas computation's), the warehouse's outputs pass
the payments verifier, and no prepared transaction is left on the server. Against a real server
(tests/pg_server.py)."""

from __future__ import annotations

import os
import signal
import subprocess

from pathlib import Path

import pandas as pd
import psycopg2
import pytest

from checkpoint_lib.submit import ckpt_run_argv, ckpt_run_env
from checkpoint_lib.verify import check_payments, expected_payments, landing_in_offset_order

pytestmark = [pytest.mark.crash, pytest.mark.spark]
REF = "pg_payments:pipeline"  # (tests/crash/pg_payments.py: payments_pg with its ledger appended to PostgreSQL too)
HERE = Path(__file__).resolve().parent
ROWS, VERSIONS = 200, 3
TIMEOUT = float(os.environ.get("CKPT_TEST_RUN_TIMEOUT", "900"))


def _run(warehouse: str, server, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**ckpt_run_env("local[2]", kill_at=kill_at), **server.env()}
    return subprocess.run(ckpt_run_argv(REF, warehouse, "--rows-per-checkpoint", str(ROWS)), env=env, cwd=HERE,
                          capture_output=True, text=True, timeout=TIMEOUT)


def _prepared(server) -> list[str]:
    return [g for g in server.psql("SELECT gid FROM pg_prepared_xacts").split() if "payments_pg." in g]


def _table(server, query: str, columns: list[str]) -> pd.DataFrame:
    with psycopg2.connect(server.uri) as conn, conn.cursor() as cur:
        cur.execute(query)
        rows = cur.fetchall()
    conn.close()
    return pd.DataFrame(rows, columns=columns)


@pytest.mark.parametrize("then", [None, pytest.param("sink_commit:2", marks=pytest.mark.slow)],
                         ids=["recovered", "killed-again-in-the-recovery"])
def test_killed_between_prepare_and_commit_the_database_holds_every_row_once(spark, tmp_path, postgres_server, then):
    from checkpoint_lib.pipelines.payments_postgres import build

    pipeline = build(ledger_table="ledger")

    w = str(tmp_path / "warehouse")
    for v in range(VERSIONS):
        pipeline.generator_fn(spark, w, ROWS, bad_fraction=0.05, seed=70 + v)
    # the server is shared: start from a database this pipeline never wrote (a new warehouse's epochs start at 1)
    for g in _prepared(postgres_server):
        postgres_server.psql(f"ROLLBACK PREPARED '{g}'")
    postgres_server.psql("DROP TABLE IF EXISTS balances, balances__ckpt_staged, ledger, _checkpoint_lib_fences, "
                         "_checkpoint_lib_commits, _checkpoint_lib_txns")

    crashed = _run(w, postgres_server, kill_at="commit:2")  # checkpoint 2 complete, its prepares not committed
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr[-3000:]
    assert _prepared(postgres_server), "checkpoint 2's transactions should be prepared on the server"

    if then is not None:  # the recovery killed between two sinks' re-commits of checkpoint 2
        again = _run(w, postgres_server, kill_at=then)
        assert again.returncode == -signal.SIGKILL, again.stdout + again.stderr[-3000:]
    done = _run(w, postgres_server)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "restored checkpoint" in done.stdout, done.stdout
    assert _prepared(postgres_server) == []

    check = check_payments(w)
    assert check.ok, check.problems
    ledger, balances, _ = expected_payments(landing_in_offset_order(w))
    columns = ["account", "balance_cents", "event_count"]
    got = _table(postgres_server, "SELECT account, balance_cents, event_count FROM balances ORDER BY account", columns)
    pd.testing.assert_frame_equal(got, balances.sort_values("account").reset_index(drop=True)[columns], check_dtype=False)
    columns = ["event_id", "account", "amount_cents", "balance_after_cents"]
    got = _table(postgres_server, f"SELECT {', '.join(columns)} FROM ledger ORDER BY event_id", columns)
    assert not got["event_id"].duplicated().any()  # exactly once: an append committed twice would repeat rows
    pd.testing.assert_frame_equal(got, ledger.sort_values("event_id").reset_index(drop=True)[columns], check_dtype=False)

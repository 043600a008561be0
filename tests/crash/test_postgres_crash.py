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
import time
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


def _fresh(spark, tmp_path, server) -> str:
    """A landing of VERSIONS x ROWS payments; the shared server cleared of what this pipeline wrote
    before (a new warehouse's epochs start at 1)."""
    from checkpoint_lib.pipelines.payments_postgres import build

    w = str(tmp_path / "warehouse")
    for v in range(VERSIONS):
        build(ledger_table="ledger").generator_fn(spark, w, ROWS, bad_fraction=0.05, seed=70 + v)
    for g in _prepared(server):
        server.psql(f"ROLLBACK PREPARED '{g}'")
    server.psql("DROP TABLE IF EXISTS balances, balances__ckpt_staged, ledger, ledger__ckpt_staged, "
                "_checkpoint_lib_fences, _checkpoint_lib_commits, _checkpoint_lib_flushes")
    return w


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
    w = _fresh(spark, tmp_path, postgres_server)
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
    _exactly_once(w, postgres_server)


@pytest.mark.slow  # ~3 min: two real runs
def test_the_server_restarted_between_prepare_and_commit_the_next_run_commits_every_row_once(spark, tmp_path,
                                                                                              postgres_server):
    """Checkpoint 2 completed, its transactions prepared and not committed (the process killed
    -9), then the PostgreSQL server killed and started again on its data folder: the prepared
    transactions survive it, and the next run's recovery commits them, every row once."""
    w = _fresh(spark, tmp_path, postgres_server)
    crashed = _run(w, postgres_server, kill_at="commit:2")
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr[-3000:]
    held = sorted(_prepared(postgres_server))
    assert held, "checkpoint 2's transactions should be prepared on the server"
    postgres_server.restart(fast=False)  # the postmaster killed -9: a crash of the server
    assert sorted(_prepared(postgres_server)) == held
    done = _run(w, postgres_server)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "restored checkpoint 2" in done.stdout, done.stdout
    assert _prepared(postgres_server) == []
    _exactly_once(w, postgres_server)


def _exactly_once(w: str, postgres_server) -> None:
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


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _stopped(pids: list[int]) -> list[int]:
    out = []
    for p in pids:
        try:
            if Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
                out.append(p)
        except OSError:
            pass
    return out


@pytest.mark.slow  # ~6 min: three real runs, one of them stalled throughout the second
def test_a_stalled_zombies_prepare_landing_after_a_newer_attempt_never_commits(spark, tmp_path, postgres_server):
    """Attempt 1's Spark tasks stop (SIGSTOP) inside their write of checkpoint 2, past their fence
    check and before their PREPARE TRANSACTION. Attempt 2 starts (a newer epoch), restores and runs
    to the end. Then attempt 1 wakes up: its prepares land after attempt 2's epoch, never commit
    (attempt 1 stops fenced), and the next start rolls them back: every row once, nothing prepared."""
    w = _fresh(spark, tmp_path, postgres_server)
    env = {**ckpt_run_env("local[2]", pause_at="prepare:3"), **postgres_server.env()}  # checkpoint 2's first flush
    zombie = subprocess.Popen(ckpt_run_argv(REF, w, "--rows-per-checkpoint", str(ROWS)), env=env, cwd=HERE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (stalled := _stopped(_descendants(zombie.pid))):
            assert zombie.poll() is None, "attempt 1 ended before its pause point:\n" + zombie.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "attempt 1 never reached its pause point"
            time.sleep(0.5)
        time.sleep(2)  # both subtasks' tasks
        stalled = _stopped(_descendants(zombie.pid))
        newer = _run(w, postgres_server)
        assert newer.returncode == 0, newer.stdout + newer.stderr[-3000:]
        _exactly_once(w, postgres_server)
        for p in stalled:
            os.kill(p, signal.SIGCONT)
        out, err = zombie.communicate(timeout=TIMEOUT)
        assert zombie.returncode != 0 and "fenced" in (out + err).lower(), out + err[-3000:]
        _exactly_once(w, postgres_server)  # its prepares, if they landed, are invisible
    finally:
        if zombie.poll() is None:
            os.killpg(zombie.pid, signal.SIGKILL)
    again = _run(w, postgres_server)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    assert _prepared(postgres_server) == []
    _exactly_once(w, postgres_server)


def test_a_fresh_warehouse_on_a_database_another_warehouse_fenced_is_refused_at_its_start(spark, tmp_path,
                                                                                          postgres_server):
    """Another warehouse of ``payments_pg`` (or an earlier one, since deleted) recovered at epoch 5
    into this database. A fresh warehouse (epoch 1) is refused by its recovery's fence, before it
    reads or writes anything: one line naming both epochs and what to do, exit 3, nothing committed
    or prepared. (Before, its first flush failed inside a Spark task, "epoch 1 is fenced by epoch 5".)"""
    from checkpoint_lib.pipeline import PostgresSink
    from checkpoint_lib.pipelines.payments_postgres import build
    from checkpoint_lib.spark.postgres_sink import PostgresTwoPhaseSink

    w = _fresh(spark, tmp_path, postgres_server)
    declared = build(ledger_table="ledger")
    for name, sink in declared.sinks.items():
        if isinstance(sink, PostgresSink):
            PostgresTwoPhaseSink(None, name, sink, declared.name, uri=postgres_server.uri).fence(5)
    run = _run(w, postgres_server)
    errors = [line for line in run.stderr.splitlines() if line.startswith("ckpt: error:")]
    assert run.returncode == 3 and len(errors) == 1, run.stdout + run.stderr[-3000:]
    assert "by epoch 5" in errors[0] and "epoch 1" in errors[0] and "another" in errors[0], errors[0]
    assert "DELETE FROM _checkpoint_lib_fences" in errors[0] and "Traceback" not in run.stderr
    assert postgres_server.password not in run.stdout + run.stderr
    assert "completed" not in run.stdout and _prepared(postgres_server) == []
    assert postgres_server.psql("SELECT count(*) FROM ledger").strip() == "0"


@pytest.mark.parametrize("what", ["wrong-password", "unreachable"])
def test_a_wrong_password_or_an_unreachable_server_stops_ckpt_run_with_one_clear_line(spark, tmp_path, postgres_server,
                                                                                    what):
    """Before anything is read or written: one line naming host, port and database (never the
    password), the exit code of a user's error (3), no traceback, no checkpoint."""
    w = _fresh(spark, tmp_path, postgres_server)
    if what == "wrong-password":
        uri, shown = postgres_server.uri.replace(postgres_server.password, "not-the-password"), "not-the-password"
    else:
        uri, shown = f"postgresql://ckpt:{postgres_server.password}@127.0.0.1:9/sinks", postgres_server.password
    env = {**ckpt_run_env("local[2]"), "AIRFLOW_CONN_CKPT_POSTGRES": uri}
    run = subprocess.run(ckpt_run_argv(REF, w, "--rows-per-checkpoint", str(ROWS)), env=env, cwd=HERE,
                         capture_output=True, text=True, timeout=TIMEOUT)
    errors = [line for line in run.stderr.splitlines() if line.startswith("ckpt: error:")]
    assert run.returncode == 3 and len(errors) == 1, run.stdout + run.stderr[-3000:]
    assert "127.0.0.1:" in errors[0] and "/sinks" in errors[0] and "Traceback" not in run.stderr
    assert shown not in run.stdout + run.stderr  # the password is never shown
    assert "completed" not in run.stdout, run.stdout

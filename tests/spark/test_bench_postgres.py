"""The PostgreSQL section's check (bench/postgres.py, ``problems``) against a real server
(tests/pg_server.py): three contenders' equal tables pass, and a missing row, a row written twice,
a wrong balance, a prepared transaction or a staged row left behind each fail it. No Spark: the
section itself runs in ``make bench-quick``."""

from __future__ import annotations

import psycopg2
import pytest
from psycopg2 import sql

from bench import postgres as pg_bench

LEDGER = [(f"b0-{i}", f"acct-{i % 3}", 100 + i, 0) for i in range(9)]
BALANCES = [(f"acct-{a}", sum(r[2] for r in LEDGER if r[1] == f"acct-{a}"), 3) for a in range(3)]
EXPECTED = {"ledger": len(LEDGER), "balances": len(BALANCES)}


@pytest.fixture(scope="module")
def server():
    from pg_server import PostgresServer  # its own server: the check counts every prepared transaction on it

    s = PostgresServer().start()
    yield s
    s.close()


def _execute(server, statement, params=()) -> None:
    conn = psycopg2.connect(server.uri)
    conn.autocommit = True  # (ROLLBACK PREPARED runs outside a transaction)
    try:
        with conn.cursor() as cur:
            cur.execute(statement, params)
    finally:
        conn.close()


@pytest.fixture
def tables(server):
    """Every contender's schema holding the same ledger and balances, ours with its empty staging tables."""
    conn = psycopg2.connect(server.uri)
    try:
        with conn, conn.cursor() as cur:
            for who in pg_bench.ORDER:
                schema = pg_bench.SCHEMA[who]
                cur.execute(sql.SQL("DROP SCHEMA IF EXISTS {s} CASCADE; CREATE SCHEMA {s}").format(
                    s=sql.Identifier(schema)))
                pg_bench.create_tables(cur, schema)
                for table, rows in (("ledger", LEDGER), ("balances", BALANCES)):
                    cur.executemany(sql.SQL("INSERT INTO {} VALUES ({})").format(
                        sql.Identifier(schema, table), sql.SQL(", ").join(sql.Placeholder() * len(rows[0]))), rows)
            cur.execute('CREATE TABLE ours.balances__ckpt_staged (account text, _ckpt_handle text)')
            cur.execute('CREATE TABLE ours.ledger__ckpt_staged (event_id text, _ckpt_handle text)')
    finally:
        conn.close()
    return server


def test_equal_tables_pass(tables):
    assert pg_bench.problems(tables, EXPECTED) == []


def test_a_missing_row_a_repeated_row_and_a_wrong_balance_each_fail(tables):
    _execute(tables, "DELETE FROM spark_jdbc.ledger WHERE event_id = 'b0-4'")
    _execute(tables, "INSERT INTO ours.ledger SELECT * FROM ours.ledger WHERE event_id = 'b0-7'")  # an append twice
    _execute(tables, "UPDATE driver_copy.balances SET balance_cents = balance_cents + 1 WHERE account = 'acct-2'")
    found = pg_bench.problems(tables, EXPECTED)
    assert f"{pg_bench.JDBC}: ledger holds 8 rows, the landing table gives 9" in found
    assert f"{pg_bench.OURS}: ledger holds 10 rows, the landing table gives 9" in found
    assert f"ledger: {pg_bench.JDBC} lacks 2 rows of {pg_bench.OURS}'s and has 0 rows {pg_bench.OURS}'s lacks" in found
    assert (f"balances: {pg_bench.COPY} lacks 1 rows of {pg_bench.OURS}'s and has 1 rows {pg_bench.OURS}'s lacks"
            in found)
    assert len(found) == 7  # ledger: two counts, three pairs; balances: two pairs


def test_what_ours_leaves_behind_fails(tables):
    _execute(tables, "INSERT INTO ours.balances__ckpt_staged VALUES ('acct-0', 'ckpt:x')")
    conn = psycopg2.connect(tables.uri)
    try:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO driver_copy.ledger VALUES ('never', 'committed', 1, 1)")
            cur.execute("PREPARE TRANSACTION 'ckpt:payments_pg.ledger_pg-0-0.e1.s0:f1'")
    finally:
        conn.close()
    try:
        assert pg_bench.problems(tables, EXPECTED) == [
            "ours: 1 prepared transactions left on the server", "ours: 1 staged balances rows left behind"]
    finally:
        _execute(tables, "ROLLBACK PREPARED 'ckpt:payments_pg.ledger_pg-0-0.e1.s0:f1'")

"""The PostgreSQL sink's write through Spark (tests/postgres/test_postgres_sink.py has the rest of
its protocol): one prepared transaction per subtask of a flush, a subtask without rows included, and
every value the COPY text format must escape arriving as it left."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from checkpoint_lib.core.twophase import Transaction, TransactionIdPool
from checkpoint_lib.pipeline import PostgresSink
from checkpoint_lib.reserved import SINK_SUBTASK
from checkpoint_lib.spark import postgres_sink as pg

pytestmark = pytest.mark.spark

SCHEMA = "id long, note string, amount decimal(18,2), at timestamp, day date, ok boolean, score double"


def test_a_flush_prepares_one_transaction_per_subtask_and_the_commit_shows_every_value_as_written(spark, postgres_server):
    table = "stage_values"
    sink = pg.PostgresTwoPhaseSink(spark, "out", PostgresSink(table, SCHEMA), "stagepipe", uri=postgres_server.uri)
    sink.create()
    notes = ["plain", "tab\there", "new\nline", "back\\slash", "\\N", "", None, "ünïcödé ✓", "quote ' \" ,"]
    data = [(i % 2, i, notes[i], Decimal("12.34") * i, dt.datetime(2026, 1, 2, 3, 4, 5, 6000 * i), dt.date(2026, 1, 1 + i),
             i % 2 == 0, float(i) / 3) for i in range(len(notes))]
    rows = spark.createDataFrame(data, f"{SINK_SUBTASK} int, {SCHEMA}")
    handles = {s: Transaction(0, TransactionIdPool(sink.pool_prefix, s).acquire(0, ()), 1) for s in range(3)}
    sink.stage(rows, handles, 1)
    ids = {p.gid for p in sink.prepared()}
    assert ids == {pg.gid(t, 1) for t in handles.values()}  # subtask 2 had no rows: its marker alone
    assert postgres_server.psql(f"SELECT count(*) FROM {table}") == "0"
    owned = [Transaction(t.seq, t.txn_id, t.epoch, 1) for t in handles.values()]
    assert sorted(sink.commit(owned, 1, 1)) == sorted(owned)
    assert sink.prepared() == [] and sink.uncommitted(owned) == []
    import psycopg2

    with psycopg2.connect(postgres_server.uri) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT id, note, amount, at, day, ok, score FROM {table} ORDER BY id")
        got = cur.fetchall()
    conn.close()
    assert got == [row[1:] for row in data]

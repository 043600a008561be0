"""The PostgreSQL sink's write through Spark (tests/postgres/test_postgres_sink.py has the rest of
its protocol): a flush staged, the last one before the barrier prepared with it as one transaction
per subtask, a subtask without rows included, every value the COPY text format must escape
arriving as it left; and a run with many flushes per checkpoint on a server with few prepared
transactions."""

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


def test_a_flush_is_staged_the_last_one_prepares_a_transaction_per_subtask_and_every_value_arrives_as_written(spark, postgres_server):
    table = "stage_values"
    sink = pg.PostgresTwoPhaseSink(spark, "out", PostgresSink(table, SCHEMA), "stagepipe", uri=postgres_server.uri)
    sink.create()
    notes = ["plain", "tab\there", "new\nline", "back\\slash", "\\N", "", None, "ünïcödé ✓", "quote ' \" ,"]
    data = [(i % 2, i, notes[i], Decimal("12.34") * i, dt.datetime(2026, 1, 2, 3, 4, 5, 6000 * i), dt.date(2026, 1, 1 + i),
             i % 2 == 0, float(i) / 3) for i in range(len(notes))]
    frame = f"{SINK_SUBTASK} int, {SCHEMA}"
    handles = {s: Transaction(0, TransactionIdPool(sink.pool_prefix, s).acquire(0, ()), 1) for s in range(3)}
    sink.stage(spark.createDataFrame(data[:5], frame), handles, 1)  # staged: nothing prepared
    assert sink.prepared() == [] and postgres_server.psql(f"SELECT count(*) FROM {table}{pg.STAGED_SUFFIX}") == "5"
    sink.stage(spark.createDataFrame(data[5:], frame), handles, 2, barrier=1)  # the last flush before the barrier
    sink.pre_commit(handles, 1)  # (done by that flush)
    ids = {p.gid for p in sink.prepared()}
    assert ids == {sink._gid(t) for t in handles.values()}  # subtask 2 had no rows: its marker alone
    assert postgres_server.psql(f"SELECT count(*) FROM {table}") == "0"
    owned = [Transaction(t.seq, t.txn_id, t.epoch, 1) for t in handles.values()]
    assert sorted(sink.commit(owned, 1, 1)) == sorted(owned)
    sink.discard(owned)
    assert sink.prepared() == [] and sink.uncommitted(owned) == [] and sink.open_transactions() == []
    import psycopg2

    with psycopg2.connect(postgres_server.uri) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT id, note, amount, at, day, ok, score FROM {table} ORDER BY id")
        got = cur.fetchall()
    conn.close()
    assert got == [row[1:] for row in data]


@pytest.mark.slow  # 1.5-3 min (five steps, two sinks); CI tier: the staged flushes of one transaction per subtask in
# tests/postgres/test_postgres_sink.py, and the test above through Spark
def test_many_flushes_in_one_checkpoint_hold_one_prepared_transaction_per_subtask(spark, tmp_path, monkeypatch):
    """Checkpointing effectively off (a huge interval): after the first checkpoint, every flush of
    the run belongs to one transaction per subtask until the final checkpoint. ``payments_pg``
    with its ledger in PostgreSQL too (two sinks of 3 subtasks) on a server with just the slots the
    start-up check asks for runs to the end: every row exactly once, nothing left prepared."""
    import pandas as pd
    import psycopg2
    from pg_server import PostgresServer

    from checkpoint_lib.core.decider import CheckpointConfig
    from checkpoint_lib.pipelines.payments_postgres import build
    from checkpoint_lib.spark.runner import PipelineRunner
    from checkpoint_lib.verify import expected_payments, landing_in_offset_order

    server = PostgresServer(max_prepared=12).start()  # 2 sinks x 3 subtasks x (1 pending checkpoint + 1)
    try:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        w = str(tmp_path / "warehouse")
        p = build(ledger_table="ledger")
        for v in range(5):
            p.generator_fn(spark, w, 200, bad_fraction=0.0, accounts=50, seed=90 + v)
        config = CheckpointConfig(interval=1e9, max_concurrent=1, timeout=3600, retained=5)
        summary = PipelineRunner(p, w, spark, config=config, rows_per_checkpoint=200).run()
        assert summary.steps >= 5 and len(summary.completed) == 2  # the first step's checkpoint and the final one

        assert server.psql("SELECT count(*) FROM pg_prepared_xacts", database="postgres") == "0"
        ledger, balances, _ = expected_payments(landing_in_offset_order(w))
        with psycopg2.connect(server.uri) as conn, conn.cursor() as cur:
            cur.execute("SELECT account, balance_cents, event_count FROM balances ORDER BY account")
            got_balances = pd.DataFrame(cur.fetchall(), columns=["account", "balance_cents", "event_count"])
            cur.execute("SELECT event_id, account, amount_cents FROM ledger ORDER BY event_id")
            got_ledger = pd.DataFrame(cur.fetchall(), columns=["event_id", "account", "amount_cents"])
        conn.close()
        want = balances.sort_values("account").reset_index(drop=True)[list(got_balances.columns)]
        pd.testing.assert_frame_equal(got_balances, want, check_dtype=False)
        assert not got_ledger["event_id"].duplicated().any()
        want = ledger.sort_values("event_id").reset_index(drop=True)[list(got_ledger.columns)]
        pd.testing.assert_frame_equal(got_ledger, want, check_dtype=False)
    finally:
        server.close()

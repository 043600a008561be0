"""The PostgreSQL sink's two-phase commit against a real server (tests/pg_server.py): prepare,
commit, recovery, the fence and a zombie, a server restart between prepare and commit, a killed
writer, refusals. No Spark: the tasks' write (:func:`prepare`) is called directly, as a Spark task
calls it; tests/spark/test_postgres_stage.py runs the same through a DataFrame."""

from __future__ import annotations

import multiprocessing
import os
import signal

import psycopg2
import pytest

from checkpoint_lib.core.errors import FencedError
from checkpoint_lib.core.twophase import Transaction, TransactionIdPool
from checkpoint_lib.pipeline import PostgresSink
from checkpoint_lib.spark import postgres_sink as pg
from checkpoint_lib.spark.sinks import RollbackUnavailableError

SCHEMA = "account string, amount long"


@pytest.fixture
def table(request) -> str:
    return f"t_{request.node.name.split('[')[0][-40:]}".lower()


def writer(server, table: str, mode: str = "append", *, name: str = "out") -> pg.PostgresTwoPhaseSink:
    """The sink ``name`` of a pipeline named like the test's table (the server is shared)."""
    decl = PostgresSink(table, SCHEMA, mode=mode, keys=("account",) if mode == "upsert" else ())
    sink = pg.PostgresTwoPhaseSink(None, name, decl, table.removesuffix("_u"), uri=server.uri)
    sink.create()
    return sink


def txn(sink: pg.PostgresTwoPhaseSink, subtask: int, seq: int, epoch: int, checkpoint: int | None = None) -> Transaction:
    pool = TransactionIdPool(sink.pool_prefix, subtask)
    return Transaction(seq, pool.acquire(seq, ()), epoch, checkpoint)


def write(sink, t: Transaction, flush: int, rows) -> str:
    """What the Spark task of a flush its barrier follows does for one subtask (checkpoint
    ``flush``): the rows written and the transaction prepared."""
    pg.prepare(sink._spec(), t, flush, iter(rows), flush)
    return sink._gid(t)


def stage(sink, t: Transaction, flush: int, rows) -> int:
    """What the Spark task of a flush before the barrier does for one subtask: the rows staged."""
    return pg.stage_rows(sink._spec(), t, flush, iter(rows))


def rows(server, table: str) -> list[tuple]:
    out = server.psql(f"SELECT account, amount FROM {table} ORDER BY account, amount")
    return [tuple(line.split("|")) for line in out.splitlines() if line]


def staged(server, table: str) -> int:
    return int(server.psql(f"SELECT count(*) FROM {table}{pg.STAGED_SUFFIX}"))


def prepared(server, table: str) -> list[str]:
    """The prepared ids of the test's pipeline (``pay``-like: named after its table) in the database."""
    return [g for g in server.psql("SELECT gid FROM pg_prepared_xacts WHERE database = 'sinks' ORDER BY gid").split()
            if (p := pg.parse_gid(g)) is not None and p.txn.txn_id.startswith(f"{table}.")]


def test_prepared_rows_are_invisible_until_the_commit_which_is_idempotent(postgres_server, table):
    sink = writer(postgres_server, table)
    t = txn(sink, 0, 0, epoch=1)
    g = write(sink, t, 1, [("a", 1), ("b", 2)])
    assert g in prepared(postgres_server, table) and rows(postgres_server, table) == []
    done = replace(t, 1)
    assert sink.uncommitted([done]) == [done]
    assert sink.commit([done], 1, 1) == [done]
    assert rows(postgres_server, table) == [("a", "1"), ("b", "2")]
    assert sink.uncommitted([done]) == [] and sink.is_committed(done)
    assert sink.commit([done], 1, 1) == []  # a repeated commit (a retry, a recovery) is a no-op
    sink.discard([done])
    assert sink.commit([done], 1, 1) == [] and sink.is_committed(done)  # forgotten: its marker proves it
    assert rows(postgres_server, table) == [("a", "1"), ("b", "2")] and g not in prepared(postgres_server, table)


def replace(t: Transaction, checkpoint: int) -> Transaction:
    return Transaction(t.seq, t.txn_id, t.epoch, checkpoint)


def _prepare_then_die(uri: str, table: str, handle: tuple, flush: int) -> None:
    decl = PostgresSink(table, SCHEMA)
    sink = pg.PostgresTwoPhaseSink(None, "out", decl, table, uri=uri)
    t = Transaction(*handle)
    stage(sink, t, flush - 1, [("j", 6)])
    pg.prepare(sink._spec(), t, flush, iter([("k", 7)]), flush)
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_writer_killed_between_prepare_and_commit_is_committed_by_the_recovery_once(postgres_server, table):
    sink = writer(postgres_server, table)
    t = txn(sink, 0, 3, epoch=1)
    p = multiprocessing.get_context("spawn").Process(
        target=_prepare_then_die, args=(postgres_server.uri, table, (t.seq, t.txn_id, t.epoch), 4))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    assert rows(postgres_server, table) == [] and len(prepared(postgres_server, table)) == 1
    # the recovery (epoch 2) restores a checkpoint that owns t: fence, then re-commit it
    recovery = writer(postgres_server, table)
    recovery.fence(2)
    assert [o.handle for o in recovery.open_transactions()] == [t.handle]
    recovery.commit([replace(t, 4)], 4, 2)
    recovery.commit([replace(t, 4)], 4, 2)
    recovery.discard([replace(t, 4)])
    assert rows(postgres_server, table) == [("j", "6"), ("k", "7")] and prepared(postgres_server, table) == []
    assert staged(postgres_server, table) == 0 and recovery.open_transactions() == []


def _commit_or_abort_then_die(uri: str, table: str, handles: list[tuple], action: str, kill_at: str) -> None:
    """A process that commits (or aborts) ``handles`` as checkpoint 1 of epoch 2, SIGKILLed by its
    kill point ``kill_at`` part-way (between two of its prepared transactions)."""
    from checkpoint_lib.killpoints import KillPoints

    decl = PostgresSink(table, SCHEMA)
    points = KillPoints({"CKPT_KILL_AT": kill_at})
    sink = pg.PostgresTwoPhaseSink(None, "out", decl, table, uri=uri, kill_points=points)
    txns = [Transaction(*h) for h in handles]
    if action == "commit":
        sink.commit(txns, 1, 2)
    else:
        sink.abort(txns)
    raise SystemExit("the kill point was never reached")


def _killed(uri: str, table: str, txns: list[Transaction], action: str, kill_at: str) -> None:
    p = multiprocessing.get_context("spawn").Process(target=_commit_or_abort_then_die, args=(
        uri, table, [(t.seq, t.txn_id, t.epoch, t.checkpoint_id) for t in txns], action, kill_at))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL


def test_killed_between_two_subtasks_commits_the_recovery_commits_the_rest_once(postgres_server, table):
    sink = writer(postgres_server, table)
    txns = [replace(txn(sink, s, 0, epoch=1), 1) for s in range(3)]
    for s, t in enumerate(txns):
        write(sink, t, 1, [(f"k{s}", s)])
    sink.fence(2)
    _killed(postgres_server.uri, table, txns, "commit", "prepared_commit:1")
    assert len(rows(postgres_server, table)) == 1 and len(prepared(postgres_server, table)) == 2  # one of three
    recovery = writer(postgres_server, table)  # epoch 3 restores checkpoint 1, which owns all three
    recovery.fence(3)
    assert {t.handle for t in recovery.open_transactions()} == {t.handle for t in txns[1:]}  # still prepared
    assert len(recovery.commit(txns, 1, 3)) == 2  # the one committed before the kill is proved by its marker
    assert rows(postgres_server, table) == [("k0", "0"), ("k1", "1"), ("k2", "2")]
    assert prepared(postgres_server, table) == []


def test_killed_during_the_recoverys_rollbacks_the_next_recovery_finishes_them(postgres_server, table):
    sink = writer(postgres_server, table)
    owned = replace(txn(sink, 0, 0, epoch=1), 1)
    write(sink, owned, 1, [("a", 1)])
    later = [txn(sink, s, 1, epoch=1) for s in range(3)]  # checkpoint 2's, never completed
    for s, t in enumerate(later):
        write(sink, t, 2, [(f"late{s}", s)])
    sink.fence(2)
    _killed(postgres_server.uri, table, later, "abort", "prepared_rollback:1")
    assert len(prepared(postgres_server, table)) == 3  # owned, and two of the three not rolled back yet
    recovery = writer(postgres_server, table)
    recovery.fence(3)
    assert len({t.handle for t in recovery.open_transactions()} & {t.handle for t in later}) == 2
    assert owned.handle in {t.handle for t in recovery.open_transactions()}
    recovery.commit([owned], 1, 3)
    recovery.abort(later)
    assert rows(postgres_server, table) == [("a", "1")] and prepared(postgres_server, table) == []


@pytest.mark.parametrize("how", ["fast", "crash"])
@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_prepared_transactions_survive_a_server_restart_between_prepare_and_commit(how, mode, table):
    from pg_server import PostgresServer

    server = PostgresServer().start()
    try:
        sink = writer(server, table, mode)
        t, current = txn(sink, 0, 0, epoch=1), txn(sink, 0, 1, epoch=1)
        stage(sink, t, 1, [("a", 1)])
        write(sink, t, 2, [("b", 2)])  # checkpoint 2's barrier: prepared with its staged flush
        stage(sink, current, 3, [("c", 3)])  # the next checkpoint's, never pre-committed
        server.restart(fast=how == "fast")
        assert prepared(server, table) == [sink._gid(t)] and rows(server, table) == []
        recovery = writer(server, table, mode)  # a new process, epoch 2, restores checkpoint 2
        recovery.fence(2)
        assert {o.handle for o in recovery.open_transactions()} == {t.handle, current.handle}
        recovery.commit([replace(t, 2)], 2, 2)
        recovery.discard([replace(t, 2)])
        recovery.abort([current])
        assert rows(server, table) == [("a", "1"), ("b", "2")] and prepared(server, table) == []
        assert staged(server, table) == 0 and recovery.open_transactions() == []
    finally:
        server.close()


def test_a_fenced_epoch_writes_nothing_and_a_zombie_prepare_after_the_fence_never_commits(postgres_server, table):
    sink = writer(postgres_server, table)
    owned = txn(sink, 0, 0, epoch=1)
    write(sink, owned, 1, [("a", 1)])
    sink.fence(2)
    with pytest.raises(FencedError):
        pg.prepare(sink._spec(), txn(sink, 0, 1, epoch=1), 2, iter([("z", 1)]), 2)
    with pytest.raises(FencedError):
        stage(sink, txn(sink, 0, 1, epoch=1), 2, [("z", 1)])
    # a zombie that read the fence before it moved prepares after it (simulated: its transaction as it lands)
    zombie = txn(sink, 1, 1, epoch=1)
    with psycopg2.connect(postgres_server.uri) as conn, conn.cursor() as cur:
        cur.execute(f"INSERT INTO {table} VALUES ('zombie', 99)")
        cur.execute("PREPARE TRANSACTION %s", (sink._gid(zombie),))
    conn.close()
    with pytest.raises(FencedError):
        sink.fence(1)
    # epoch 2 re-commits what its restored checkpoint owns; the zombie's prepare is rolled back
    sink.commit([replace(owned, 1)], 1, 2)
    assert rows(postgres_server, table) == [("a", "1")] and prepared(postgres_server, table) == []
    with pytest.raises(FencedError):  # the zombie's own commit of a later checkpoint is refused
        sink.commit([replace(zombie, 2)], 2, 1)


def test_a_lower_epoch_than_another_warehouses_fence_is_refused_naming_both_and_what_to_do(postgres_server, table):
    """Another warehouse of the pipeline (or an earlier one, since deleted) fenced the database at
    epoch 5; a fresh warehouse's first epoch is refused at its fence, before it writes, with both
    epochs, the database (never the password) and the statement that frees the fence."""
    writer(postgres_server, table).fence(5)
    fresh = writer(postgres_server, table)
    with pytest.raises(FencedError) as refused:
        fresh.fence(1)
    message = str(refused.value)
    assert "by epoch 5" in message and "epoch 1" in message and "another" in message and "/sinks" in message
    assert postgres_server.password not in message
    statement = message.rsplit(": ", 1)[1]
    assert statement.startswith("DELETE FROM _checkpoint_lib_fences WHERE")
    postgres_server.psql(statement)  # the other warehouse gone for good: its fence deleted as told
    fresh.fence(1)
    fresh.fence(1)  # idempotent


def test_recovery_aborts_what_the_restored_checkpoint_does_not_own(postgres_server, table):
    sink = writer(postgres_server, table)
    owned, later = txn(sink, 0, 0, epoch=1), txn(sink, 0, 1, epoch=1)
    stage(sink, owned, 1, [("a", 1)])
    sink.pre_commit({0: owned}, 1)
    stage(sink, later, 2, [("b", 2)])
    write(sink, later, 3, [("c", 3)])
    recovery = writer(postgres_server, table)
    recovery.fence(2)
    assert {t.handle for t in recovery.open_transactions()} == {owned.handle, later.handle}
    recovery.commit([replace(owned, 1)], 1, 2)
    recovery.abort([later])
    recovery.abort([later])
    assert rows(postgres_server, table) == [("a", "1")] and prepared(postgres_server, table) == []
    assert {t.handle for t in recovery.open_transactions()} == {owned.handle}
    recovery.discard([owned])
    assert recovery.open_transactions() == []


def test_upsert_the_latest_row_of_a_key_wins_and_an_interrupted_apply_finishes(postgres_server, table):
    sink = writer(postgres_server, table, "upsert")
    first, second = txn(sink, 0, 0, epoch=1), txn(sink, 0, 1, epoch=1)
    stage(sink, first, 1, [("a", 1), ("b", 1)])
    write(sink, first, 2, [("a", 2)])  # the flush its barrier follows: its rows win
    write(sink, second, 3, [("b", 3)])  # prepared while the first is not committed: no lock waited on
    sink.commit([replace(first, 1)], 1, 1)
    assert rows(postgres_server, table) == [("a", "2"), ("b", "1")]
    sink._commit_prepared([replace(second, 2)])  # killed between the COMMIT PREPARED and the apply
    assert rows(postgres_server, table) == [("a", "2"), ("b", "1")] and sink.uncommitted([replace(second, 2)])
    sink.commit([replace(second, 2)], 2, 1)
    sink.commit([replace(second, 2)], 2, 1)
    assert rows(postgres_server, table) == [("a", "2"), ("b", "3")]
    assert staged(postgres_server, table) == 0
    third = txn(sink, 0, 2, epoch=1)
    stage(sink, third, 4, [("c", 4)])
    sink.pre_commit({0: third}, 3)
    sink._commit_prepared([replace(third, 3)])
    sink.discard([replace(third, 3)])  # forgotten before its rows were applied: its marker still says so
    assert sink.uncommitted([replace(third, 3)])
    sink.abort([replace(third, 3)])  # (a committed transaction's staged rows are never deleted)
    sink.commit([replace(third, 3)], 3, 1)
    assert rows(postgres_server, table) == [("a", "2"), ("b", "3"), ("c", "4")]


def test_a_prepared_transaction_rolled_back_by_hand_fails_the_commit_clearly(postgres_server, table):
    sink = writer(postgres_server, table)
    t = txn(sink, 0, 0, epoch=1)
    g = write(sink, t, 1, [("a", 1)])
    postgres_server.psql(f"ROLLBACK PREPARED '{g}'")
    assert "gone before their commit" in sink.lost([replace(t, 1)])
    with pytest.raises(pg.PreparedTransactionLostError, match="neither prepared nor committed"):
        sink.commit([replace(t, 1)], 1, 1)


def test_a_row_the_table_rejects_fails_the_write_with_the_database_message_and_prepares_nothing(postgres_server, table):
    sink = writer(postgres_server, table)
    postgres_server.psql(f"ALTER TABLE {table} ADD CONSTRAINT positive CHECK (amount > 0)")
    with pytest.raises(psycopg2.errors.CheckViolation, match="positive"):
        pg.prepare(sink._spec(), txn(sink, 0, 0, epoch=1), 1, iter([("a", 1), ("b", -5)]), 1)
    assert prepared(postgres_server, table) == [] and rows(postgres_server, table) == []
    t = txn(sink, 0, 1, epoch=1)  # a row staged by an earlier flush: refused when the barrier's prepare copies it
    stage(sink, t, 1, [("c", -1)])
    with pytest.raises(psycopg2.errors.CheckViolation, match="positive"):
        sink.pre_commit({0: t}, 1)
    assert prepared(postgres_server, table) == [] and rows(postgres_server, table) == []


def test_rolling_back_below_a_committed_checkpoint_is_refused(postgres_server, table):
    sink = writer(postgres_server, table)
    t = txn(sink, 0, 0, epoch=1)
    write(sink, t, 1, [("a", 1)])
    assert sink.rollback_version(0) is None  # nothing committed yet
    sink.commit([replace(t, 3)], 3, 1)
    assert sink.rollback_version(3) is None
    with pytest.raises(RollbackUnavailableError, match="checkpoint 3 committed to it since"):
        sink.rollback_to(2)


def test_configuration_refusals_are_one_clear_line(postgres_server, table, monkeypatch):
    wrong = postgres_server.uri.replace(postgres_server.password, "not-the-password")
    with pytest.raises(pg.PostgresConfigurationError) as exc:
        pg.PostgresTwoPhaseSink(None, "out", PostgresSink(table, SCHEMA), table, uri=wrong).create()
    assert "password authentication failed" in str(exc.value) and "not-the-password" not in str(exc.value)
    assert "\n" not in str(exc.value)
    monkeypatch.delenv("AIRFLOW_CONN_NOWHERE", raising=False)
    with pytest.raises(pg.PostgresConfigurationError, match="AIRFLOW_CONN_NOWHERE"):
        pg.connection_uri("nowhere", "out")
    monkeypatch.setenv("AIRFLOW_CONN_SOMEWHERE", postgres_server.uri.replace("postgresql://", "postgres://"))
    assert pg.connection_uri("somewhere", "out") == postgres_server.uri
    postgres_server.psql(f"CREATE TABLE {table} (account text, amount text)")
    with pytest.raises(pg.PostgresConfigurationError, match="'amount' is text, the sink's is bigint"):
        writer(postgres_server, table)
    postgres_server.psql(f"CREATE TABLE {table}_u (account text, amount bigint)")
    with pytest.raises(pg.PostgresConfigurationError, match="no primary key or unique index"):
        writer(postgres_server, f"{table}_u", "upsert")


def test_a_server_with_too_few_prepared_transactions_for_the_parallelism_is_refused_naming_the_setting(table):
    from pg_server import PostgresServer

    server = PostgresServer(max_prepared=4).start()
    try:
        decl = PostgresSink(table, SCHEMA)
        pg.PostgresTwoPhaseSink(None, "out", decl, table, uri=server.uri, parallelism=2).create()  # 2 x (1 + 1)
        with pytest.raises(pg.PostgresConfigurationError, match=r"max_prepared_transactions = 4, and the pipeline's "
                                                                r"PostgreSQL sinks on it \(out: 3 subtasks\) need at "
                                                                "least 6"):
            pg.PostgresTwoPhaseSink(None, "out", decl, table, uri=server.uri, parallelism=3).create()
        with pytest.raises(pg.PostgresConfigurationError, match="need at least 6"):  # 2 x (2 pending + 1)
            pg.PostgresTwoPhaseSink(None, "out", decl, table, uri=server.uri, parallelism=2, pending=2).create()
    finally:
        server.close()


def test_the_pipelines_postgres_sinks_on_one_server_share_its_prepared_transactions(tmp_path, monkeypatch):
    """payments_pg with its ledger in PostgreSQL too: two sinks of 3 subtasks on one server need
    2 x 3 x (1 + 1) = 12 slots together; 8 are refused at start, naming the setting and the sinks."""
    from pg_server import PostgresServer

    from checkpoint_lib.pipelines.payments_postgres import build
    from checkpoint_lib.spark.sinks import pipeline_sinks

    server = PostgresServer(max_prepared=8).start()
    try:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        writers = pipeline_sinks(None, build(ledger_table="ledger"), str(tmp_path), str(tmp_path / "root"))
        with pytest.raises(pg.PostgresConfigurationError) as refused:
            writers["balances_pg"].create()
        message = str(refused.value)
        assert "max_prepared_transactions = 8" in message and "need at least 12" in message, message
        assert "balances_pg: 3 subtasks, ledger_pg: 3 subtasks" in message and "the server's" in message
        assert server.password not in message
        assert writers["ledger"].name == "ledger"  # (the Delta sinks share nothing with them)
    finally:
        server.close()


def test_flushes_before_the_barrier_are_staged_and_one_transaction_per_subtask_is_prepared(postgres_server, table):
    """Many flushes of one checkpoint: each staged (committed, invisible in the target, a retried
    task writes it once), then ONE prepared transaction per subtask at the barrier, which claims
    them: every row once after the commit, nothing prepared or staged left."""
    sink = writer(postgres_server, table)
    txns = {s: txn(sink, s, 0, epoch=1) for s in range(3)}
    for flush in range(1, 6):
        for s, t in txns.items():
            assert stage(sink, t, flush, [(f"k{s}-{flush}", flush)]) == 1
            assert stage(sink, t, flush, [(f"k{s}-{flush}", flush)]) == -1  # a retried task
    assert stage(sink, txns[0], 6, []) == 0
    assert prepared(postgres_server, table) == [] and rows(postgres_server, table) == []
    assert staged(postgres_server, table) == 15
    assert {t.handle for t in sink.open_transactions()} == {t.handle for t in txns.values()}
    sink.pre_commit(txns, 1)
    sink.pre_commit(txns, 1)  # repeated (an ack retried): prepared already
    assert sorted(prepared(postgres_server, table)) == sorted(sink._gid(t) for t in txns.values())
    assert rows(postgres_server, table) == []
    owned = [replace(t, 1) for t in txns.values()]
    assert sorted(sink.commit(owned, 1, 1)) == sorted(owned)
    sink.discard(owned)
    assert len(rows(postgres_server, table)) == 15 and len(set(rows(postgres_server, table))) == 15
    assert prepared(postgres_server, table) == [] and staged(postgres_server, table) == 0
    assert sink.open_transactions() == [] and sink.uncommitted(owned) == []


def test_staged_flushes_no_checkpoint_owns_are_deleted_by_the_recovery_and_a_zombies_by_the_next_commit(
        postgres_server, table):
    sink = writer(postgres_server, table, "upsert")
    owned, current = txn(sink, 0, 0, epoch=1), txn(sink, 0, 1, epoch=1)
    stage(sink, owned, 1, [("a", 1)])
    sink.pre_commit({0: owned}, 1)
    stage(sink, current, 2, [("b", 2)])  # the next checkpoint's, never pre-committed
    recovery = writer(postgres_server, table, "upsert")
    recovery.fence(2)
    zombie = txn(sink, 0, 2, epoch=1)
    with psycopg2.connect(postgres_server.uri) as conn, conn.cursor() as cur:  # staged past its fence check
        cur.execute(f"INSERT INTO {table}{pg.STAGED_SUFFIX} VALUES ('z', 9, %s, 2, 3)", (zombie.handle,))
        cur.execute(f"INSERT INTO {pg.FLUSHES} VALUES (%s, 'out', %s, 3, 1)", (table, zombie.handle))
    conn.close()
    assert {t.handle for t in recovery.open_transactions()} == {owned.handle, current.handle, zombie.handle}
    recovery.commit([replace(owned, 1)], 1, 2)  # (the zombie's, of an older epoch, is aborted here)
    recovery.discard([replace(owned, 1)])
    recovery.abort([current])
    assert rows(postgres_server, table) == [("a", "1")] and staged(postgres_server, table) == 0
    assert recovery.open_transactions() == [] and prepared(postgres_server, table) == []
    with pytest.raises(RuntimeError, match="already prepared at their barrier"):  # no flush after the barrier's
        recovery._prepared.add(current.handle)
        recovery.stage(None, {0: current}, 3)


def test_ids_round_trip_and_belong_to_one_sink():
    t = Transaction(12, TransactionIdPool("pay.out", 3).acquire(12, ()), 7)
    tag = pg.deployment("sinks", "public")
    parsed = pg.parse_gid(pg.gid(t, tag))
    assert parsed.txn == t and parsed.tag == tag and len(tag) == 8
    assert tag not in (pg.deployment("sinks_staging", "public"), pg.deployment("sinks", "staging"))
    assert pg.of_pool(parsed, "pay.out") and not pg.of_pool(parsed, "pay.ou") and not pg.of_pool(parsed, "ay.out")
    assert pg.parse_gid("something else") is None


def test_a_transaction_with_no_rows_prepares_its_marker_alone_and_commits_as_nothing(postgres_server, table):
    sink = writer(postgres_server, table)
    empty = txn(sink, 0, 5, epoch=1)  # no flush before its barrier
    sink.pre_commit({0: empty}, 4)
    assert prepared(postgres_server, table) == [sink._gid(empty)]
    assert sink.uncommitted([replace(empty, 4)]) == [replace(empty, 4)]
    assert sink.commit([replace(empty, 4)], 4, 1) == [replace(empty, 4)]
    assert sink.uncommitted([replace(empty, 4)]) == [] and sink.commit([replace(empty, 4)], 4, 1) == []
    assert rows(postgres_server, table) == [] and prepared(postgres_server, table) == []


def test_doctor_reports_a_sinks_prepared_transaction_left_for_long(postgres_server, table):
    from checkpoint_lib import doctor

    assert doctor.postgres({}) is None  # no PostgreSQL connection configured: no line
    sink = writer(postgres_server, table)
    g = write(sink, txn(sink, 0, 0, epoch=1), 1, [("a", 1)])
    env = postgres_server.env()
    assert doctor.postgres(env).ok  # prepared just now: a checkpoint in progress
    later = doctor.postgres(env, now=__import__("time").time() + pg.STALE_PREPARED_S + 60)
    assert not later.ok and g in later.detail and table in later.fix
    wrong = doctor.postgres({"AIRFLOW_CONN_X": postgres_server.uri.replace(postgres_server.password, "nope")})
    assert not wrong.ok and "password authentication failed" in wrong.detail and "nope" not in wrong.detail
    sink.abort([txn(sink, 0, 0, epoch=1)])


def test_two_deployments_of_one_pipeline_in_two_databases_of_one_server_never_collide(postgres_server, table):
    """Staging and production of the same pipeline on one server, each in its own database: the
    same pipeline, sink, subtask, epoch and sequence, yet each prepares, commits and recovers its
    own transactions only (a prepared transaction's id is the server's, not a database's)."""
    other = f"{table[:40]}_db"
    postgres_server.psql(f'DROP DATABASE IF EXISTS "{other}"', database="postgres")
    postgres_server.psql(f'CREATE DATABASE "{other}"', database="postgres")
    try:
        decl = PostgresSink(table, SCHEMA)
        prod = pg.PostgresTwoPhaseSink(None, "out", decl, table, uri=postgres_server.uri)
        staging = pg.PostgresTwoPhaseSink(None, "out", decl, table, uri=postgres_server.uri.rsplit("/", 1)[0] + f"/{other}")
        prod.create()
        staging.create()
        t = txn(prod, 0, 0, epoch=1)
        for sink, value in ((prod, 1), (staging, 2)):
            stage(sink, t, 1, [("early", value)])
            sink.pre_commit({0: t}, 1)
        assert [p.txn.handle for p in prod.prepared()] == [t.handle] == [p.txn.handle for p in staging.prepared()]
        held = postgres_server.psql("SELECT database || '|' || gid FROM pg_prepared_xacts", database="postgres")
        assert sorted(line.split("|")[0] for line in held.split() if table in line) == sorted([other, "sinks"])
        assert prod.commit([replace(t, 1)], 1, 1) == [replace(t, 1)]
        assert staging.uncommitted([replace(t, 1)]) == [replace(t, 1)]  # production's commit is not staging's
        assert staging.commit([replace(t, 1)], 1, 1) == [replace(t, 1)]
        assert rows(postgres_server, table) == [("early", "1")]
        assert postgres_server.psql(f"SELECT account, amount FROM {table}", database=other) == "early|2"
        assert prod.prepared() == [] and staging.prepared() == []
        later = txn(prod, 0, 1, epoch=1)
        for sink in (prod, staging):
            sink.pre_commit({0: later}, 2)
        staging.fence(2)  # staging's recovery rolls back its own, never production's
        staging.abort([t for t in staging.open_transactions() if t.handle == later.handle])
        assert [p.txn.handle for p in prod.prepared()] == [later.handle] and staging.prepared() == []
        prod.abort([later])
    finally:
        for database in (other, "sinks"):
            for line in postgres_server.psql(f"SELECT gid FROM pg_prepared_xacts WHERE database = '{database}'",
                                             database=database).split():
                if table in line:
                    postgres_server.psql(f"ROLLBACK PREPARED '{line}'", database=database)
        postgres_server.psql(f'DROP DATABASE IF EXISTS "{other}" WITH (FORCE)', database="postgres")


def markers(server, table: str) -> int:
    return int(server.psql(f"SELECT count(*) FROM {pg.COMMITS} WHERE pipeline = '{table}'"))


def test_markers_no_checkpoint_can_need_are_pruned_at_the_commit_and_committed_stays_provable(postgres_server, table):
    """Every commit of checkpoint c settles the sink up to c (everything any completed checkpoint
    up to c owns is committed: a rollback below the commit bound is refused, so no recovery can
    ask about one of them otherwise) and deletes the markers that proved it, in one transaction:
    the markers and the flushes stay bounded, and "already committed" is still proved, by the
    marker or, once pruned, by the settled checkpoint that replaced it."""
    sink = writer(postgres_server, table, "upsert")
    done = []
    for c in range(1, 6):
        t = replace(txn(sink, c % 2, c, epoch=1), c)
        stage(sink, t, c, [("a", c)])
        sink.pre_commit({c % 2: t}, c)
        assert sink.commit([t], c, 1) == [t]
        sink.discard([t])
        done.append(t)
    assert markers(postgres_server, table) == 0 and postgres_server.psql(
        f"SELECT count(*) FROM {pg.FLUSHES} WHERE pipeline = '{table}'") == "0"
    assert rows(postgres_server, table) == [("a", "5")]
    assert sink.uncommitted(done) == [] and all(sink.is_committed(t) for t in done)
    assert sink.commit(done[:2], 2, 1) == []  # a retained checkpoint's commit again (ckpt commit 2): a no-op
    assert sink.lost(done) is None
    recovery = writer(postgres_server, table, "upsert")  # epoch 2 restores checkpoint 5: its re-commit is a no-op
    recovery.fence(2)
    assert recovery.commit([done[-1]], 5, 2) == [] and rows(postgres_server, table) == [("a", "5")]
    # one above the settled checkpoint is proved by its marker until its own commit settles it
    pending = replace(txn(sink, 0, 6, epoch=2), 6)
    recovery.pre_commit({0: pending}, 6)
    recovery._commit_prepared([pending])  # (killed before the apply and the settling)
    assert markers(postgres_server, table) == 1 and recovery.uncommitted([pending]) == [pending]
    recovery.commit([pending], 6, 2)
    assert markers(postgres_server, table) == 0 and rows(postgres_server, table) == [("a", "5")]
    # and one above it that was lost is still an error, never taken for committed
    lost = replace(txn(sink, 0, 7, epoch=2), 7)
    recovery.pre_commit({0: lost}, 7)
    postgres_server.psql(f"ROLLBACK PREPARED '{recovery._gid(lost)}'")
    assert "gone before their commit" in recovery.lost([lost])
    with pytest.raises(pg.PreparedTransactionLostError):
        recovery.commit([lost], 7, 2)
    indexes = postgres_server.psql(f"SELECT indexdef FROM pg_indexes WHERE tablename = '{pg.COMMITS}'")
    assert "(pipeline, sink, checkpoint_id)" in indexes, indexes


def test_the_index_and_columns_an_earlier_version_lacks_are_added_and_never_waited_for(postgres_server, table):
    sink = writer(postgres_server, table)
    index = postgres_server.psql(f"SELECT indexname FROM pg_indexes WHERE tablename = '{pg.COMMITS}' "
                                 "AND indexdef LIKE '%checkpoint_id%'")
    postgres_server.psql(f"SET lock_timeout = '5s'; DROP INDEX \"{index}\"; "
                         f"ALTER TABLE {pg.FENCES} DROP COLUMN settled")
    writer(postgres_server, table)  # an earlier version's tables, nothing prepared: upgraded
    assert index in postgres_server.psql(f"SELECT indexname FROM pg_indexes WHERE tablename = '{pg.COMMITS}'")
    assert sink.committed_checkpoint() == -1 and sink._settled() == -1
    postgres_server.psql(f"SET lock_timeout = '5s'; DROP INDEX \"{index}\"")
    t = txn(sink, 0, 0, epoch=1)
    write(sink, t, 1, [("a", 1)])  # a prepared transaction holds the tables
    try:
        with pytest.raises(pg.PostgresConfigurationError, match="ROLLBACK PREPARED"):
            writer(postgres_server, table)  # refused at once, not waiting for a commit only it would run
    finally:
        sink.abort([t])
    writer(postgres_server, table)
    assert index in postgres_server.psql(f"SELECT indexname FROM pg_indexes WHERE tablename = '{pg.COMMITS}'")


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_another_writer_of_the_table_between_prepare_and_commit_neither_waits_nor_is_lost(postgres_server, table,
                                                                                          mode):
    """Another tool writes the sink's table while a checkpoint's transaction is prepared: an append
    sink's prepared rows lock no row of theirs, an upsert sink's wait in staging (applied at the
    commit, where its row of a key wins, as the later write); what they write after the commit is
    never undone by a recovery's re-commit."""
    tbl = f"{table}_{mode[0]}"
    sink = writer(postgres_server, tbl, mode)
    t = txn(sink, 0, 0, epoch=1)
    write(sink, t, 1, [("a", 1), ("b", 2)])
    assert len(prepared(postgres_server, tbl.removesuffix("_u"))) == 1
    other = "SET lock_timeout = '5s'; "  # a wait on our prepared transaction fails the test, not hangs it
    postgres_server.psql(other + f"INSERT INTO {tbl} (account, amount) VALUES ('a', 10), ('z', 26)")
    if mode == "upsert":
        postgres_server.psql(other + f"UPDATE {tbl} SET amount = 11 WHERE account = 'a'")
    sink.commit([replace(t, 1)], 1, 1)
    ours_and_theirs = {"append": [("a", "1"), ("a", "10"), ("b", "2"), ("z", "26")],
                       "upsert": [("a", "1"), ("b", "2"), ("z", "26")]}[mode]
    assert rows(postgres_server, tbl) == ours_and_theirs and staged(postgres_server, tbl) == 0
    postgres_server.psql(other + f"UPDATE {tbl} SET amount = 99 WHERE account = 'b'")
    recovery = writer(postgres_server, tbl, mode)
    recovery.fence(2)
    assert recovery.commit([replace(t, 1)], 1, 2) == []  # committed (and applied) already: nothing redone
    assert rows(postgres_server, tbl) == [r if r[0] != "b" else ("b", "99") for r in ours_and_theirs]
    assert prepared(postgres_server, tbl.removesuffix("_u")) == []

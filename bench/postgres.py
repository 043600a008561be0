"""The ``postgres`` section: payments into PostgreSQL exactly once through our sink, beside a plain
Spark JDBC write of the same rows (no guarantees) and psycopg2's ``COPY`` from the driver alone.

One PostgreSQL 16 server is started on 127.0.0.1 for the section (``tests/pg_server.py``, the
tests' server, here with fsync and full-page writes on, as PostgreSQL's defaults) and closed at
its end. One landing table of ``--postgres-size`` payments (versions of
``--postgres-rows-per-checkpoint`` events, ``--accounts`` accounts) is generated once. Every
contender writes the same two tables, the ledger (every valid event with its account's running
balance, about ``--postgres-size`` rows) and the balances (one row per account), each into a
schema of its own in the server's database, created fresh before its run:

- **ours** (``ours``): ``payments_pg`` with its ledger appended to PostgreSQL too
  (``payments_postgres.build(ledger_table="ledger")``: sinks ``ledger_pg``, an append, and
  ``balances_pg``, an upsert), run by ``PipelineRunner``, aligned, a checkpoint every
  ``--postgres-rows-per-checkpoint`` events: each flush COPYs each subtask's rows in one
  transaction and PREPAREs it, the completed checkpoint COMMITs PREPARED (the upsert stages and
  applies). The pipeline also writes its warehouse outputs (``gold/ledger``, ``gold/balances``,
  dead letters): they are part of ``payments_pg`` and counted in its time;
- **Spark JDBC** (``jdbc``): one plain batch job computing the same rows as the floor does
  (``bench/floor.py``) and writing them with ``DataFrame.write.jdbc`` (append into tables created
  as ours are, PostgreSQL's JDBC driver with ``reWriteBatchedInserts=true``, batches of
  :data:`JDBC_BATCH`): no guarantees (a retried task writes its rows again);
- **COPY** (``copy``): the same rows, gathered into the driver beforehand (untimed), written by
  psycopg2's ``COPY ... FROM STDIN`` (CSV) on one connection in one transaction: the floor of the
  database side, with no computation in its time.

The ledger is in PostgreSQL too because the issue's row is payments into PostgreSQL: with the
balances alone the database receives one row per account and checkpoint (10,000 accounts against
1M events) and the row would measure the warehouse side only; with the ledger every event reaches
the database through each contender, and an append committed twice would show as extra rows.

**Outputs checked** after every sitting, before any of its times count: each table of every
contender equals every other contender's (``EXCEPT ALL`` both ways, on the server: only counts
leave it), holds the number of rows the landing table gives (valid events; accounts with one),
and ours left no prepared transaction and no staged row behind. ``--postgres-repeat`` sittings run
the three contenders one after the other; a contender's time is its median over the sittings and
the ratios are of medians of the same run. Also counted: the WAL each contender made the server
write (``pg_current_wal_lsn``), and for ours the time inside its two PostgreSQL sinks (their
``stage`` and ``commit``, timed by wrapping them; nothing else changes). Rows go to the results log
as section ``postgres``.
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
OURS = "ours, aligned (payments_pg: two-phase commit into PostgreSQL)"
JDBC = "Spark JDBC write (plain batch job, no guarantees)"
COPY = "COPY from the driver (psycopg2, rows computed beforehand)"
ORDER = (OURS, JDBC, COPY)
SCHEMA = {OURS: "ours", JDBC: "spark_jdbc", COPY: "driver_copy"}
"""The PostgreSQL schema each contender writes into (one database, so tables compare on the server)."""
TABLES = ("ledger", "balances")
JDBC_BATCH = 10_000
"""Rows per JDBC batch (``batchsize``): with ``reWriteBatchedInserts`` one multi-row INSERT each."""
CONNECTION = "ckpt_postgres"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("PostgreSQL (bench/postgres.py)")
    g.add_argument("--skip-postgres", action="store_true", help="skip the PostgreSQL table (ours, Spark JDBC, COPY)")
    g.add_argument("--postgres-size", type=int, default=1_000_000, help="payment events (default 1,000,000)")
    g.add_argument("--postgres-rows-per-checkpoint", type=int, default=100_000,
                   help="events per landed version and per checkpoint of ours (default 100,000)")
    g.add_argument("--postgres-repeat", type=int, default=3, help="sittings of the three contenders, one after the "
                   "other; each contender's time is its median (default 3)")


QUICK = {"postgres_size": 100_000, "postgres_rows_per_checkpoint": 25_000, "postgres_repeat": 1}


def check_sizes(args: argparse.Namespace) -> None:
    if min(args.postgres_size, args.postgres_rows_per_checkpoint, args.postgres_repeat) < 1:
        raise ValueError("--postgres-size, --postgres-rows-per-checkpoint and --postgres-repeat must be at least 1")


def runs(args: argparse.Namespace) -> bool:
    """Whether this run measures the section (it compares ours with the others: not without ours)."""
    return "ours" in args.contenders and not args.skip_postgres


def spark_conf(args: argparse.Namespace, log) -> dict[str, str]:
    """What the bench's Spark session needs for this section (before it starts): PostgreSQL's JDBC
    driver, downloaded once into the jar folder (pinned, like the Delta jars), on ``spark.jars``."""
    if not runs(args):
        return {}
    from checkpoint_lib.spark.jars import POSTGRES_JDBC_ARTIFACTS, fetch_jars, jar_dir

    fetch_jars(artifacts=POSTGRES_JDBC_ARTIFACTS, progress=log)
    return {"spark.jars": ",".join(str(jar_dir() / a.file_name) for a in POSTGRES_JDBC_ARTIFACTS)}


# --- the server ------------------------------------------------------------------------------------

def start_server():
    sys.path.insert(0, str(ROOT / "tests"))
    from pg_server import PostgresServer

    return PostgresServer(durable=True).start()


def schema_uri(server, schema: str) -> str:
    """The server's URI with ``schema`` first on the search path: unqualified tables (the sink's
    ``balances``, its bookkeeping) are created and found there."""
    return f"{server.uri}?options={quote(f'-csearch_path={schema}')}"


def _query(server, statement: str, params: tuple = ()) -> list[tuple]:
    import psycopg2

    conn = psycopg2.connect(server.uri)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def fresh_schema(server, schema: str) -> None:
    from psycopg2 import sql

    _query(server, sql.SQL("DROP SCHEMA IF EXISTS {s} CASCADE; CREATE SCHEMA {s}").format(s=sql.Identifier(schema)))


def wal_lsn(server) -> str:
    return _query(server, "SELECT pg_current_wal_lsn()::text")[0][0]


def wal_since(server, lsn: str) -> int:
    return int(_query(server, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", (lsn,))[0][0])


def create_tables(cur, schema: str) -> None:
    """The ledger and the balances in ``schema`` as our sinks create them (the same column types;
    the balances keyed by account, the ledger without a key)."""
    from psycopg2 import sql

    from checkpoint_lib.pipelines.payments import BALANCES_SCHEMA, LEDGER_SCHEMA
    from checkpoint_lib.spark.postgres_sink import pg_type

    for table, columns, key in (("ledger", LEDGER_SCHEMA, ()), ("balances", BALANCES_SCHEMA, ("account",))):
        cols = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(pg_type(t))) for c, t in columns)
        pk = sql.SQL(", PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, key))) if key else sql.SQL("")
        cur.execute(sql.SQL("CREATE TABLE {} ({}{})").format(sql.Identifier(schema, table), cols, pk))


def columns(table: str) -> list[str]:
    from checkpoint_lib.pipelines.payments import BALANCES_SCHEMA, LEDGER_SCHEMA

    return [c for c, _ in (LEDGER_SCHEMA if table == "ledger" else BALANCES_SCHEMA)]


# --- the contenders ----------------------------------------------------------------------------

def run_ours(spark: Any, warehouse: str, server, *, rows_per_checkpoint: int) -> dict:
    """``payments_pg`` (its ledger in PostgreSQL too) in ``warehouse`` (its landing table there),
    aligned, a checkpoint every ``rows_per_checkpoint`` events, into schema ``ours``."""
    from checkpoint_lib.core.decider import CheckpointConfig
    from checkpoint_lib.delta.store import DeltaCheckpointStore
    from checkpoint_lib.layout import checkpoint_root
    from checkpoint_lib.pipelines.payments_postgres import build
    from checkpoint_lib.spark.postgres_sink import PostgresTwoPhaseSink
    from checkpoint_lib.spark.runner import PipelineRunner

    pipeline = build(ledger_table="ledger")
    config = CheckpointConfig(interval=0.0, max_concurrent=1, timeout=3600, retained=5)
    in_sinks = {"stage": 0.0, "commit": 0.0}
    originals = {name: getattr(PostgresTwoPhaseSink, name) for name in in_sinks}

    def timed(name: str):
        @functools.wraps(originals[name])
        def wrapper(*a, **kw):
            t0 = time.monotonic()
            try:
                return originals[name](*a, **kw)
            finally:
                in_sinks[name] += time.monotonic() - t0
        return wrapper

    variable = f"AIRFLOW_CONN_{CONNECTION.upper()}"
    saved = os.environ.get(variable)
    os.environ[variable] = schema_uri(server, SCHEMA[OURS])
    for name in in_sinks:
        setattr(PostgresTwoPhaseSink, name, timed(name))
    try:
        started = time.monotonic()
        summary = PipelineRunner(pipeline, warehouse, spark, mode="aligned", config=config,
                                 rows_per_checkpoint=rows_per_checkpoint).run()
        seconds = time.monotonic() - started
    finally:
        for name, original in originals.items():
            setattr(PostgresTwoPhaseSink, name, original)
        if saved is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = saved
    history = DeltaCheckpointStore.open(checkpoint_root(warehouse, pipeline.name)).checkpoints.history()
    done = [r for r in history if r["completion_time"] and r["checkpoint_id"] != summary.final]
    durations = [(r["completion_time"] - r["trigger_time"]) * 1000 for r in done]
    return {
        "seconds": seconds,
        "steps": summary.steps,
        "checkpoints": len(summary.completed),
        "median_checkpoint_ms": statistics.median(durations) if durations else 0.0,
        "sink_stage_seconds": in_sinks["stage"],
        "sink_commit_seconds": in_sinks["commit"],
    }


def jdbc_properties(server) -> dict[str, str]:
    return {"user": "ckpt", "password": server.password, "driver": "org.postgresql.Driver",
            "batchsize": str(JDBC_BATCH), "reWriteBatchedInserts": "true"}


def run_jdbc(spark: Any, landing: str, server, schema: str) -> dict:
    """The floor's ledger and balances of ``landing`` written by Spark's JDBC writer into ``schema``
    (its tables created first, as ours are)."""
    import psycopg2

    from bench.floor import landing_rows, payments_outputs

    started = time.monotonic()
    conn = psycopg2.connect(server.uri)
    try:
        with conn.cursor() as cur:
            create_tables(cur, schema)
        conn.commit()
    finally:
        conn.close()
    rows = landing_rows(spark, landing)
    try:
        ledger, balances, _ = payments_outputs(rows)
        url = f"jdbc:postgresql://127.0.0.1:{server.port}/sinks"
        for df, table in ((ledger, "ledger"), (balances, "balances")):
            df.write.jdbc(url, f"{schema}.{table}", mode="append", properties=jdbc_properties(server))
    finally:
        rows.unpersist()
    return {"seconds": time.monotonic() - started, "steps": 1}


def gather(spark: Any, landing: str) -> dict[str, Any]:
    """The floor's ledger and balances of ``landing`` in the driver, as pandas (Arrow): what the
    COPY contender writes, gathered before its time starts."""
    from bench.floor import landing_rows, payments_outputs

    key = "spark.sql.execution.arrow.pyspark.enabled"
    before = spark.conf.get(key, "false")
    spark.conf.set(key, "true")
    rows = landing_rows(spark, landing)
    try:
        ledger, balances, _ = payments_outputs(rows)
        return {"ledger": ledger.toPandas(), "balances": balances.toPandas()}
    finally:
        rows.unpersist()
        spark.conf.set(key, before)


def run_copy(frames: dict[str, Any], server, schema: str) -> dict:
    """``frames`` (pandas) into ``schema`` by ``COPY ... FROM STDIN`` (CSV): one connection, one
    transaction, the tables created in it."""
    import psycopg2
    from psycopg2 import sql

    started = time.monotonic()
    conn = psycopg2.connect(server.uri)
    try:
        with conn.cursor() as cur:
            create_tables(cur, schema)
            for table in TABLES:
                text = io.StringIO()
                frames[table][columns(table)].to_csv(text, header=False, index=False)
                text.seek(0)
                cur.copy_expert(sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv)").format(
                    sql.Identifier(schema, table), sql.SQL(", ").join(map(sql.Identifier, columns(table)))), text)
        conn.commit()
    finally:
        conn.close()
    return {"seconds": time.monotonic() - started}


# --- checking ------------------------------------------------------------------------------------

class WrongOutputs(AssertionError):
    pass


def expected_counts(spark: Any, landing: str) -> dict[str, int]:
    """Rows each table must hold: the valid events (ledger) and the accounts with one (balances)."""
    from pyspark.sql import functions as F

    from bench.floor import landing_rows

    rows = landing_rows(spark, landing)
    try:
        good = rows.where(F.col("error").isNull())
        r = good.agg(F.count(F.lit(1)).alias("events"), F.countDistinct("account").alias("accounts")).first()
        return {"ledger": int(r["events"]), "balances": int(r["accounts"])}
    finally:
        rows.unpersist()


def problems(server, expected: dict[str, int]) -> list[str]:
    """How the contenders' tables differ from each other and from the expected counts, and what
    ours left behind (empty: all right). On the server: only counts come back."""
    from itertools import combinations

    from psycopg2 import sql

    found = []
    for table in TABLES:
        cols = sql.SQL(", ").join(map(sql.Identifier, columns(table)))
        for who in ORDER:
            n = _query(server, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(SCHEMA[who], table)))[0][0]
            if n != expected[table]:
                found.append(f"{who}: {table} holds {n:,} rows, the landing table gives {expected[table]:,}")
        for a, b in combinations(ORDER, 2):
            ta, tb = sql.Identifier(SCHEMA[a], table), sql.Identifier(SCHEMA[b], table)
            missing, extra = _query(server, sql.SQL(
                "SELECT (SELECT count(*) FROM (SELECT {c} FROM {a} EXCEPT ALL SELECT {c} FROM {b}) x), "
                "(SELECT count(*) FROM (SELECT {c} FROM {b} EXCEPT ALL SELECT {c} FROM {a}) y)").format(
                c=cols, a=ta, b=tb))[0]
            if missing or extra:
                found.append(f"{table}: {b} lacks {missing:,} rows of {a}'s and has {extra:,} rows {a}'s lacks")
    prepared = _query(server, "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE 'ckpt:%%'")[0][0]
    if prepared:
        found.append(f"ours: {prepared} prepared transactions left on the server")
    for table in TABLES:  # (a flush before its checkpoint's barrier waits there; the commit or an abort empties it)
        if _query(server, "SELECT to_regclass(%s) IS NOT NULL", (f'"ours"."{table}__ckpt_staged"',))[0][0]:
            staged = _query(server, sql.SQL("SELECT count(*) FROM {}").format(
                sql.Identifier("ours", f"{table}__ckpt_staged")))[0][0]
            if staged:
                found.append(f"ours: {staged:,} staged {table} rows left behind")
    return found


# --- the section ---------------------------------------------------------------------------------

def postgres(spark: Any, base: str, args: argparse.Namespace, log) -> list[dict]:
    """One row per contender (its median over ``--postgres-repeat`` sittings), each sitting's
    outputs checked before its times count."""
    from bench.ours import copy_landing
    from bench.outputs import generate_landing
    from bench.work import Work

    size, k, accounts = args.postgres_size, args.postgres_rows_per_checkpoint, args.accounts
    config = {"events": size, "rows_per_checkpoint": k, "accounts": accounts}
    data = f"{base}/pg-n{size}"
    shutil.rmtree(data, ignore_errors=True)  # a stopped run's leftovers: the generator is seeded, regenerate
    t0 = time.monotonic()
    versions = generate_landing(spark, data, size, k, accounts)
    log(f"postgres: {size:,} events in {versions} versions of {k:,} generated in {time.monotonic() - t0:.0f} s")
    landing = f"{data}/landing/payments"
    expected = expected_counts(spark, landing)
    server = start_server()
    sittings: dict[str, list[dict]] = {c: [] for c in ORDER}
    try:
        if args.warm_up:  # the JDBC driver's classes, Delta's read, the JIT: nobody pays them
            fresh_schema(server, "warm_up")
            run_jdbc(spark, landing, server, "warm_up")
            _query(server, "DROP SCHEMA warm_up CASCADE")
        t0 = time.monotonic()
        frames = gather(spark, landing)
        log(f"  postgres: {sum(len(f) for f in frames.values()):,} rows gathered into the driver for COPY in "
            f"{time.monotonic() - t0:.1f} s (not timed)")
        for sitting in range(1, args.postgres_repeat + 1):
            measured: dict[str, dict] = {}
            for contender in ORDER:
                fresh_schema(server, SCHEMA[contender])
                lsn = wal_lsn(server)
                if contender == OURS:
                    w = f"{data}/ours-{sitting}"
                    copy_landing(data, w)
                    with Work(spark, w) as work:
                        figures = run_ours(spark, w, server, rows_per_checkpoint=k)
                    figures.update(work.figures(steps=figures["steps"]))
                    if not args.keep:
                        shutil.rmtree(w, ignore_errors=True)
                elif contender == JDBC:
                    with Work(spark, data) as work:
                        figures = run_jdbc(spark, landing, server, SCHEMA[JDBC])
                    figures.update(work.figures(steps=1))
                else:
                    figures = run_copy(frames, server, SCHEMA[COPY])
                measured[contender] = {**figures, "wal_bytes": wal_since(server, lsn)}
            found = problems(server, expected)
            if found:
                raise WrongOutputs(f"postgres, sitting {sitting}: the PostgreSQL tables are wrong, no time counts:\n  - "
                                   + "\n  - ".join(found))
            for contender, figures in measured.items():
                sittings[contender].append(figures)
            ours, jdbc, copy = (measured[c]["seconds"] for c in ORDER)
            log(f"  postgres, sitting {sitting}: ours {ours:.1f} s (in its PostgreSQL sinks: staging "
                f"{measured[OURS]['sink_stage_seconds']:.1f} s, committing {measured[OURS]['sink_commit_seconds']:.1f} s), "
                f"Spark JDBC {jdbc:.1f} s, COPY {copy:.1f} s; tables equal; ours / JDBC {ours / jdbc:.2f}, "
                f"ours / COPY {ours / copy:.2f}")
    finally:
        server.close()
    rows = []
    for contender in ORDER:
        times = [f["seconds"] for f in sittings[contender]]
        median = statistics.median(times)
        middle = min(sittings[contender], key=lambda f: abs(f["seconds"] - median))  # its other figures
        rows.append({**config, "contender": contender, **middle, "seconds": median, "sittings": times,
                     "rows_written": expected["ledger"] + expected["balances"]})
    ratios = with_ratios(rows)
    log(f"  postgres: medians over {args.postgres_repeat} sitting(s): ours / Spark JDBC {ratios[0]['vs_jdbc']:.2f}, "
        f"ours / COPY {ratios[0]['vs_copy']:.2f}")
    return rows


def with_ratios(rows: list[dict]) -> list[dict]:
    """``rows`` in contender order with ``events_per_s``, ``vs_jdbc`` and ``vs_copy`` (time / that
    contender's, of the same configuration; None without it)."""
    from bench.results import ranked_with_ratios

    return ranked_with_ratios(rows, ORDER, {"vs_jdbc": JDBC, "vs_copy": COPY})


def render_postgres(rows: list[dict]) -> str:
    from bench.markdown import table

    def ratio(value: float | None) -> str:
        return "" if value is None else f"{value:.2f}"

    def in_sinks(r: dict) -> str:
        return f"{r['sink_stage_seconds'] + r['sink_commit_seconds']:.1f}" if "sink_stage_seconds" in r else ""

    return table(
        ["contender", "events", "rows into PostgreSQL", "sittings (s)", "time (s, median)", "events/s",
         "time / Spark JDBC", "time / COPY", "checkpoints", "in the PostgreSQL sinks (s)", "WAL written (MiB)",
         "Spark jobs", "outputs exact"],
        [[r["contender"], f"{r['events']:,}", f"{r['rows_written']:,}", ", ".join(f"{s:.1f}" for s in r["sittings"]),
          f"{r['seconds']:.1f}", f"{r['events_per_s']:,.0f}", ratio(r["vs_jdbc"]), ratio(r["vs_copy"]),
          str(r.get("checkpoints", "")), in_sinks(r), f"{r['wal_bytes'] / 2**20:.0f}",
          str(r.get("spark_jobs", "")), "yes"] for r in with_ratios(rows)],
    )


def describe(args: argparse.Namespace) -> str:
    return (f"{args.postgres_size:,} payments, a checkpoint every {args.postgres_rows_per_checkpoint:,} events (ours), "
            f"{args.accounts:,} accounts, the ledger and the balances into PostgreSQL 16 on 127.0.0.1 (fsync on), "
            f"{args.postgres_repeat} sitting(s), medians; every contender's tables equal the others'")

"""Two-phase commit into PostgreSQL (:class:`~checkpoint_lib.pipeline.PostgresSink`): the seed's
``TwoPhaseCommitSinkFunction`` with PostgreSQL's ``PREPARE TRANSACTION`` as the external system's
transaction that survives a process's death.

- **write** (at a flush, in Spark tasks): each subtask's rows go to the server in ONE database
  transaction (``COPY``), which also reads the sink's fence and records a marker row, and is
  ``PREPARE``-d under a global id :func:`gid` (the transaction's handle: pool slot, pipeline,
  sink, subtask, epoch, sequence; and the flush). An ``append`` sink copies into the target; an
  ``upsert`` sink into its staging table (rows of a prepared transaction hold no lock on the
  target, so the next checkpoint's writes never wait for an uncommitted one). The driver then
  records which ids the flush prepared (``_checkpoint_lib_txns``, one committed insert). A task
  Spark retries finds its id already prepared and keeps it.
- **pre-commit** (at the barrier): nothing left to write; the snapshot records the transaction.
- **commit** (checkpoint ``c`` completed): the sink's commit bound is raised to ``c`` (what a
  rollback checks), then ``COMMIT PREPARED`` of every id the transactions recorded, checkpoint by
  checkpoint; an ``upsert`` sink then applies the committed staging rows to the target (latest row
  of a key wins), deletes them and marks its ids applied, in one transaction. An id that is no
  longer prepared is done when its marker is visible (it committed: the marker committed with the
  rows), and an error otherwise (:class:`PreparedTransactionLostError`): nothing is committed twice.
- **abort**: ``ROLLBACK PREPARED``.

**Fencing.** A recovery of epoch ``F`` raises the sink's fence to ``F`` (:meth:`fence`, before it
restores anything); every write transaction reads the fence and refuses an older epoch. A zombie's
write that read the fence before it moved may still prepare afterwards: such a transaction belongs
to a checkpoint that can no longer complete (the checkpoint store is fenced first), so nobody ever
commits it, and the next commit or recovery of a newer epoch rolls back every prepared id of an
older epoch it does not own (:meth:`commit`, :meth:`abort`). A zombie's ``COMMIT PREPARED`` of a
completed checkpoint commits what the newest completed checkpoint owns anyway.

**Bookkeeping tables** (in the target's schema, created if missing): ``_checkpoint_lib_fences``
(the fence and the commit bound of each sink), ``_checkpoint_lib_commits`` (one marker per prepared
id, visible once it committed), ``_checkpoint_lib_txns`` (the ids each flush of a transaction
prepared). A rollback to an older checkpoint is refused once a later one committed: committed rows
cannot be taken back (:meth:`rollback_version`).

The connection string comes from the environment (``AIRFLOW_CONN_<ID>``, as Airflow reads a
connection) and is never logged: errors name the host, the port and the connection id only.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator
from urllib.parse import urlsplit

from ..core.errors import FencedError
from ..core.twophase import Transaction
from ..killpoints import KillPoints, act
from ..pipeline import PostgresSink
from ..reserved import SINK_SUBTASK
from .sinks import RollbackUnavailableError, SinkConfigurationError, SinkSite, pipeline_of, register_sink

FENCES, COMMITS, TXNS = "_checkpoint_lib_fences", "_checkpoint_lib_commits", "_checkpoint_lib_txns"
STAGED_SUFFIX = "__ckpt_staged"
GID_PREFIX = "ckpt:"
_GID = re.compile(r"^ckpt:(?P<txn_id>.+-\d+-\d+)\.e(?P<epoch>\d+)\.s(?P<seq>\d+):f(?P<flush>\d+)$")
_MAX_GID = 200  # PostgreSQL's GIDSIZE, terminator included
COPY_CHUNK = 20_000  # rows per COPY statement (one transaction holds them all)
LOCK_TIMEOUT = "30s"
"""How long a write waits for a row lock (an append sink's unique index, a row another writer
holds): a wait on a prepared transaction would otherwise last until it commits."""

_PG_TYPES = {
    "string": "text", "long": "bigint", "bigint": "bigint", "int": "integer", "integer": "integer",
    "short": "smallint", "smallint": "smallint", "byte": "smallint", "tinyint": "smallint",
    "double": "double precision", "float": "real", "boolean": "boolean", "timestamp": "timestamp",
    "timestamp_ntz": "timestamp", "date": "date", "binary": "bytea",
}


class PostgresConfigurationError(SinkConfigurationError):
    """The sink cannot run against this server or table (no connection, a setting, columns)."""


class PreparedTransactionLostError(RuntimeError):
    """A transaction a completed checkpoint owns is neither prepared nor committed any more (a
    ``ROLLBACK PREPARED`` by hand, or the server's data lost): its rows cannot be committed."""


def pg_type(spark_type: str) -> str:
    """The PostgreSQL column type of a sink column's Spark SQL type."""
    t = spark_type.strip().lower()
    if t.startswith("decimal"):
        return t.replace("decimal", "numeric")
    if t in _PG_TYPES:
        return _PG_TYPES[t]
    raise PostgresConfigurationError(f"a PostgreSQL sink cannot store a column of type {spark_type!r} (types: "
                                     f"{', '.join(sorted(_PG_TYPES))}, decimal(p,s))")


# ids ---------------------------------------------------------------------------------------------


def gid(txn: Transaction, flush: int) -> str:
    """The global id of what flush ``flush`` wrote for transaction ``txn`` (one subtask's)."""
    return f"{GID_PREFIX}{txn.handle}:f{flush}"


@dataclass(frozen=True)
class PreparedId:
    gid: str
    txn: Transaction  # checkpoint_id None: the id does not say it
    flush: int


def parse_gid(value: str) -> PreparedId | None:
    """What :func:`gid` encoded, or None for an id that is not ours."""
    m = _GID.match(value)
    if not m:
        return None
    txn = Transaction(int(m["seq"]), m["txn_id"], int(m["epoch"]))
    return PreparedId(value, txn, int(m["flush"]))


def of_pool(prepared: PreparedId, pool_prefix: str) -> bool:
    """Whether ``prepared`` belongs to the transaction-id pool ``pool_prefix`` (one sink's)."""
    return prepared.txn.txn_id.rsplit("-", 2)[0] == pool_prefix


# connections -------------------------------------------------------------------------------------


def connection_uri(connection: str, sink: str) -> str:
    """The connection string of Airflow connection id ``connection``: the environment variable
    ``AIRFLOW_CONN_<ID>`` (a URI, or Airflow's JSON form). Never logged."""
    variable = f"AIRFLOW_CONN_{connection.upper()}"
    value = os.environ.get(variable, "").strip()
    if not value:
        raise PostgresConfigurationError(
            f"sink {sink}: no PostgreSQL connection {connection!r}: set {variable} to a postgresql:// URI "
            f"(user, password, host, port, database), or define the Airflow connection {connection!r}")
    if value.startswith("{"):
        doc = json.loads(value)
        auth = doc.get("login") or ""
        if doc.get("password"):
            auth += f":{doc['password']}"
        host = f"{doc.get('host') or 'localhost'}:{doc.get('port') or 5432}"
        value = f"postgresql://{auth + '@' if auth else ''}{host}/{doc.get('schema') or ''}"
    if not value.startswith(("postgres://", "postgresql://")):
        raise PostgresConfigurationError(f"sink {sink}: connection {connection!r} ({variable}) is not a "
                                         "postgresql:// URI")
    return "postgresql://" + value.split("://", 1)[1]


def where(uri: str, connection: str) -> str:
    """``uri`` as an error may show it: host, port and database, never the user's password."""
    parts = urlsplit(uri)
    return f"{parts.hostname or 'localhost'}:{parts.port or 5432}/{parts.path.lstrip('/')} (connection {connection!r})"


@contextmanager
def session(uri: str, shown: str, *, autocommit: bool = False):
    """A cursor on a new connection: committed when the block ends, rolled back if it raises,
    closed either way."""
    conn = connect(uri, shown, autocommit=autocommit)
    try:
        with conn.cursor() as cur:
            yield cur
        if not autocommit:
            conn.commit()
    except BaseException:
        if not conn.closed and not autocommit:
            conn.rollback()
        raise
    finally:
        conn.close()


def connect(uri: str, shown: str, *, autocommit: bool = False):
    """A psycopg2 connection; a refusal is one line naming ``shown`` (not the URI)."""
    import psycopg2

    try:
        conn = psycopg2.connect(uri, connect_timeout=10, application_name="checkpoint_lib")
    except psycopg2.OperationalError as exc:
        first = " ".join(str(exc).split())
        raise PostgresConfigurationError(f"cannot connect to PostgreSQL at {shown}: {first}") from None
    conn.autocommit = autocommit
    return conn


STALE_PREPARED_S = 600
"""A sink's prepared transaction older than this is reported (``ckpt doctor``, the Checkpoints
page): it holds its rows' locks until a run of its pipeline commits or rolls it back."""


@dataclass(frozen=True)
class HeldPrepare:
    gid: str
    pipeline: str
    age_s: float
    database: str
    shown: str  # the server, as :func:`where` shows it


def held_prepares(uri: str, shown: str, *, older_than_s: float | None = None, now: float | None = None,
                  pipelines: Iterable[str] | None = None) -> list[HeldPrepare]:
    """The sinks' prepared transactions on the server of ``uri`` (of any database) prepared more
    than ``older_than_s`` (default :data:`STALE_PREPARED_S`) ago, oldest first; of ``pipelines`` only, when given. A refused
    connection raises :class:`PostgresConfigurationError` (one line)."""
    import time

    with session(uri, shown, autocommit=True) as cur:
        cur.execute("SELECT gid, extract(epoch from prepared), database FROM pg_prepared_xacts "
                    "WHERE gid LIKE %s ORDER BY prepared", (GID_PREFIX + "%",))
        rows = cur.fetchall()
    now = time.time() if now is None else now
    older_than_s = STALE_PREPARED_S if older_than_s is None else older_than_s
    wanted = None if pipelines is None else set(pipelines)
    held = [HeldPrepare(g, g.removeprefix(GID_PREFIX).split(".")[0], now - float(at), db, shown) for g, at, db in rows]
    return [h for h in held if h.age_s > older_than_s and (wanted is None or h.pipeline in wanted)]


def held_message(held: list[HeldPrepare]) -> str:
    """What a report says of ``held`` (not empty): how many, the oldest."""
    oldest = held[0]
    return (f"{len(held)} prepared transaction(s) of PostgreSQL sinks hold their locks for more than "
            f"{STALE_PREPARED_S // 60} min (oldest: {oldest.gid} in {oldest.database} at {oldest.shown}, "
            f"{oldest.age_s:.0f} s)")


# the write (runs in Spark tasks) ---------------------------------------------------------------


@dataclass(frozen=True)
class WriteSpec:
    """What a task needs to write one subtask's rows of a flush (picklable; the URI is sent to the
    executors inside Spark's task closure and never logged)."""

    uri: str
    shown: str
    pipeline: str
    sink: str
    table: tuple[str, ...]  # the COPY target: the table, or an upsert sink's staging table
    columns: tuple[str, ...]
    extra: tuple[str, ...]  # staging columns after them (upsert: the id, the sequence, the flush)
    fault: int | None = None  # a kill point's signal for the task, after it read the fence (tests, chaos)


def _encode(value: Any) -> str:
    """One value in COPY's text format."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\\\\x" + bytes(value).hex()
    text = value.isoformat(sep=" ") if hasattr(value, "isoformat") and hasattr(value, "hour") else str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _copy_rows(cur, spec: WriteSpec, rows: Iterable[tuple]) -> int:
    from psycopg2 import sql

    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(*spec.table), sql.SQL(", ").join(map(sql.Identifier, spec.columns + spec.extra)))
    count, buffer = 0, io.StringIO()
    for row in rows:
        buffer.write("\t".join(_encode(v) for v in row))
        buffer.write("\n")
        count += 1
        if count % COPY_CHUNK == 0:
            buffer.seek(0)
            cur.copy_expert(statement, buffer)
            buffer = io.StringIO()
    if buffer.tell():
        buffer.seek(0)
        cur.copy_expert(statement, buffer)
    return count


def prepare(spec: WriteSpec, txn: Transaction, flush: int, rows: Iterable[tuple]) -> tuple[str, int]:
    """Write ``rows`` (the spec's columns, in order) as transaction ``txn``'s flush ``flush`` and
    prepare it: ``(its id, rows written)``; ``-1`` rows when an earlier attempt of the same task
    prepared it already. Refused (:class:`FencedError`, nothing written) when the sink's fence is
    above ``txn``'s epoch."""
    import psycopg2
    from psycopg2 import sql

    g = gid(txn, flush)
    conn = connect(spec.uri, spec.shown)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", (g,))
            if cur.fetchone() is not None:  # a retried task: an earlier attempt prepared it
                conn.rollback()
                return g, -1
            cur.execute("SET LOCAL lock_timeout = %s", (LOCK_TIMEOUT,))
            cur.execute(sql.SQL("SELECT epoch FROM {} WHERE pipeline = %s AND sink = %s").format(
                _bookkeeping(spec.table, FENCES)), (spec.pipeline, spec.sink))
            fence = cur.fetchone()
            if fence is not None and fence[0] > txn.epoch:
                raise FencedError(f"sink {spec.sink}: epoch {txn.epoch} is fenced by epoch {fence[0]}: "
                                  f"{g} not written")
            act(spec.fault)  # (CKPT_PAUSE_AT=prepare:n: a zombie past its fence check)
            if spec.extra:
                rows = (row + (g, txn.seq, flush) for row in rows)
            count = _copy_rows(cur, spec, rows)
            cur.execute(sql.SQL("INSERT INTO {} (gid, pipeline, sink, handle, flush, rows) "
                                "VALUES (%s, %s, %s, %s, %s, %s)").format(_bookkeeping(spec.table, COMMITS)),
                        (g, spec.pipeline, spec.sink, txn.handle, flush, count))
            try:
                cur.execute("PREPARE TRANSACTION %s", (g,))
            except psycopg2.errors.DuplicateObject:  # an attempt racing this one prepared it first
                conn.rollback()
                return g, -1
        return g, count
    except BaseException:
        if not conn.closed:
            conn.rollback()
        raise
    finally:
        conn.close()


def _write_partition(spec: WriteSpec, txns: dict[int, Transaction], flush: int):
    """The task of one subtask's partition (partition index = subtask): its rows prepared as one
    transaction. A subtask with no rows prepares its marker alone, so that every transaction a
    checkpoint owns has an id to commit and a marker that proves it committed."""

    def write(index: int, rows: Iterator[tuple]) -> Iterator[tuple[int, str, int]]:
        rows = (row for _, row in rows)
        if index not in txns:
            if next(rows, None) is not None:
                raise RuntimeError(f"sink {spec.sink}: rows of subtask {index}, which has no open transaction")
            return iter(())
        g, count = prepare(spec, txns[index], flush, rows)
        return iter([(index, g, count)])

    return write


def _bookkeeping(table: tuple[str, ...], name: str):
    from psycopg2 import sql

    return sql.Identifier(*table[:-1], name)


# the writer (driver side) ----------------------------------------------------------------------


class PostgresTwoPhaseSink:
    """One logical PostgreSQL sink of a pipeline (every subtask of it shares it): the
    :class:`~checkpoint_lib.spark.sinks.SinkWriter` of a :class:`~checkpoint_lib.pipeline.PostgresSink`."""

    def __init__(self, spark: Any, name: str, declaration: PostgresSink, pipeline: str, *, uri: str | None = None,
                 check_epoch=None, parallelism: int = 1,
                 kill_points: KillPoints | None = None):
        self.spark = spark
        self.name = name
        self.declaration = declaration
        self.pipeline = pipeline
        self.mode = declaration.mode
        self.keys = list(declaration.keys)
        self.columns = tuple(c for c, _ in declaration.schema)
        self.table = tuple(declaration.table.split("."))
        self.staged = (*self.table[:-1], self.table[-1] + STAGED_SUFFIX)
        self.pool_prefix = f"{pipeline}.{name}"
        self._uri = uri
        self.check_epoch = check_epoch
        self.parallelism = parallelism
        self.kills = kill_points or KillPoints({})
        if len(GID_PREFIX) + len(self.pool_prefix) + 64 >= _MAX_GID:
            raise PostgresConfigurationError(f"sink {name}: pipeline and sink names too long for PostgreSQL's "
                                             f"transaction ids ({_MAX_GID} bytes)")

    # plumbing ---------------------------------------------------------------------------------

    @property
    def uri(self) -> str:
        """The connection string, read from the environment when first needed (a command that
        reads only the control plane never needs it)."""
        if self._uri is None:
            self._uri = connection_uri(self.declaration.connection, self.name)
        return self._uri

    @property
    def shown(self) -> str:
        return where(self.uri, self.declaration.connection)

    def _session(self, autocommit: bool = False):
        return session(self.uri, self.shown, autocommit=autocommit)

    def _id(self, name: str):
        return _bookkeeping(self.table, name)

    def _spec(self) -> WriteSpec:
        if self.mode == "append":
            return WriteSpec(self.uri, self.shown, self.pipeline, self.name, self.table, self.columns, ())
        return WriteSpec(self.uri, self.shown, self.pipeline, self.name, self.staged, self.columns,
                         ("_ckpt_gid", "_ckpt_seq", "_ckpt_flush"))

    def prepared(self) -> list[PreparedId]:
        """This sink's prepared transactions on the server, of every epoch (any database's)."""
        with self._session(autocommit=True) as cur:
            cur.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s",
                        (GID_PREFIX + self.pool_prefix.replace("_", "\\_").replace("%", "\\%") + "-%",))
            found = [parse_gid(g) for (g,) in cur.fetchall()]
        return [p for p in found if p is not None and of_pool(p, self.pool_prefix)]

    # creating ---------------------------------------------------------------------------------

    def create(self) -> None:
        """The target (with a primary key on ``keys`` for an upsert sink), an upsert sink's staging
        table and the bookkeeping tables, if missing (idempotent; racing creators are fine); then
        refuse a server or table the protocol cannot use (:meth:`check_configuration`)."""
        from psycopg2 import errors, sql

        columns = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(pg_type(t)))
                                     for c, t in self.declaration.schema)
        key = (sql.SQL(", PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, self.keys)))
               if self.mode == "upsert" else sql.SQL(""))
        statements = []
        if len(self.table) == 2:
            statements.append(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.table[0])))
        statements += [
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}{})").format(sql.Identifier(*self.table), columns, key),
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (pipeline text, sink text, epoch bigint NOT NULL, "
                    "committed_checkpoint bigint NOT NULL DEFAULT -1, PRIMARY KEY (pipeline, sink))").format(
                self._id(FENCES)),
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (gid text PRIMARY KEY, pipeline text NOT NULL, sink text NOT NULL, "
                    "handle text NOT NULL, flush bigint NOT NULL, rows bigint NOT NULL, "
                    "applied boolean NOT NULL DEFAULT false)").format(self._id(COMMITS)),
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (pipeline text, sink text, handle text, flush bigint, "
                    "gids text[] NOT NULL, PRIMARY KEY (pipeline, sink, handle, flush))").format(self._id(TXNS)),
        ]
        if self.mode == "upsert":
            statements.append(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, _ckpt_gid text NOT NULL, "
                                      "_ckpt_seq bigint NOT NULL, _ckpt_flush bigint NOT NULL)").format(
                sql.Identifier(*self.staged), columns))
        with self._session(autocommit=True) as cur:
            for statement in statements:
                try:
                    cur.execute(statement)
                except (errors.UniqueViolation, errors.DuplicateTable, errors.DuplicateObject):
                    pass  # a racing creator made it first (CREATE ... IF NOT EXISTS is not atomic)
        self.check_configuration()

    def check_configuration(self) -> None:
        """Refused before any write, each naming what to change: a server with
        ``max_prepared_transactions = 0`` (no two-phase commit); a target lacking a declared column
        or typing it otherwise; an upsert target without a primary key or unique index on exactly
        ``keys``."""
        needed = 2 * self.parallelism  # each subtask: a checkpoint's transaction pending, the next one's written
        with self._session(autocommit=True) as cur:
            cur.execute("SHOW max_prepared_transactions")
            have = int(cur.fetchone()[0])
            if have < needed:
                raise PostgresConfigurationError(
                    f"sink {self.name}: the PostgreSQL server at {self.shown} has max_prepared_transactions = {have}, "
                    f"and the sink's {self.parallelism} subtasks need at least {needed} (each: a checkpoint's "
                    "transaction prepared while the next one's is written). Set max_prepared_transactions "
                    "(postgresql.conf, or `postgres -c max_prepared_transactions=N`) and restart the server")
            schema = self.table[0] if len(self.table) == 2 else None
            cur.execute("SELECT column_name, data_type, numeric_precision, numeric_scale FROM information_schema.columns "
                        "WHERE table_name = %s AND table_schema = COALESCE(%s, current_schema())",
                        (self.table[-1], schema))
            have = {c: (t, p, s) for c, t, p, s in cur.fetchall()}
            want = {c: pg_type(t) for c, t in self.declaration.schema}
            problems = [f"it lacks {c!r}" for c in want if c not in have]
            problems += [f"its {c!r} is {have[c][0]}, the sink's is {t}" for c, t in want.items()
                         if c in have and not _same_type(have[c], t)]
            if problems:
                raise PostgresConfigurationError(
                    f"sink {self.name}: table {'.'.join(self.table)} at {self.shown} does not fit the sink: "
                    f"{'; '.join(problems)}. Nothing was written.")
            if self.mode == "upsert":
                cur.execute("SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_index i "
                            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                            "WHERE i.indrelid = %s::regclass AND i.indisunique GROUP BY i.indexrelid",
                            (".".join(f'"{p}"' for p in self.table),))
                if sorted(self.keys) not in [list(r[0]) for r in cur.fetchall()]:
                    raise PostgresConfigurationError(
                        f"sink {self.name}: table {'.'.join(self.table)} has no primary key or unique index on "
                        f"{self.keys}, which an upsert sink needs (INSERT ... ON CONFLICT). Nothing was written.")

    # writing ----------------------------------------------------------------------------------

    def stage(self, rows: Any, handles: dict[int, Transaction], flush: int) -> None:
        """Write ``rows`` (the sink's columns plus ``sink_subtask``) as each subtask's transaction
        ``handles[subtask]``, one prepared database transaction per subtask (one Spark job: a
        task per subtask), then record the ids (one insert)."""
        if not handles:
            return
        missing = [c for c in self.columns if c not in rows.columns]
        if missing:
            raise ValueError(f"sink {self.name}: the operator's rows lack columns {missing}")
        width = max(handles) + 1
        spec = dataclasses.replace(self._spec(), fault=self.kills.due("prepare"))
        keyed = rows.select(SINK_SUBTASK, *self.columns).rdd.map(lambda r: (int(r[0]), tuple(r[1:])))
        written = (keyed.partitionBy(width, lambda subtask: subtask)
                   .mapPartitionsWithIndex(_write_partition(spec, dict(handles), flush)).collect())
        self._record(handles, flush, {subtask: g for subtask, g, _ in written})

    def _record(self, handles: dict[int, Transaction], flush: int, gids: dict[int, str]) -> None:
        from psycopg2 import sql

        lacking = sorted(set(handles) - set(gids))
        if lacking:
            raise RuntimeError(f"sink {self.name}: flush {flush} prepared nothing for subtasks {lacking}")
        with self._session() as cur:
            for subtask, txn in handles.items():
                cur.execute(sql.SQL("INSERT INTO {} (pipeline, sink, handle, flush, gids) VALUES (%s, %s, %s, %s, %s) "
                                    "ON CONFLICT DO NOTHING").format(self._id(TXNS)),
                            (self.pipeline, self.name, txn.handle, flush, [gids[subtask]]))

    # reading the bookkeeping ---------------------------------------------------------------------

    def _recorded(self, txns: Iterable[Transaction]) -> dict[str, list[str]]:
        """Handle -> the ids its flushes prepared (recorded at each flush)."""
        from psycopg2 import sql

        handles = [t.handle for t in txns]
        out: dict[str, list[str]] = {h: [] for h in handles}
        if not handles:
            return out
        with self._session(autocommit=True) as cur:
            cur.execute(sql.SQL("SELECT handle, gids FROM {} WHERE pipeline = %s AND sink = %s AND handle = ANY(%s)")
                        .format(self._id(TXNS)), (self.pipeline, self.name, handles))
            for handle, gids in cur.fetchall():
                out[handle].extend(gids)
        return out

    def _markers(self, handles: Iterable[str]) -> dict[str, dict[str, bool]]:
        """Handle -> {committed id: applied} (a marker is visible once its transaction committed)."""
        from psycopg2 import sql

        handles = list(handles)
        out: dict[str, dict[str, bool]] = {h: {} for h in handles}
        if not handles:
            return out
        with self._session(autocommit=True) as cur:
            cur.execute(sql.SQL("SELECT handle, gid, applied FROM {} WHERE handle = ANY(%s)").format(self._id(COMMITS)),
                        (handles,))
            for handle, g, applied in cur.fetchall():
                out[handle][g] = applied
        return out

    def _done(self, txn: Transaction, marked: dict[str, bool], gids: list[str], bound: int) -> bool:
        """Whether every id of ``gids`` is committed (and, for an upsert sink, applied). A
        transaction forgotten after its commit has no ids recorded, only its markers; one that
        was never written to (no flush before its barrier) has neither, and is committed once the
        sink's commit bound reached its checkpoint."""
        if not gids and not marked:
            return txn.checkpoint_id is not None and txn.checkpoint_id <= bound
        if not gids:
            return self.mode == "append" or all(marked.values())
        return all(g in marked and (self.mode == "append" or marked[g]) for g in gids)

    def uncommitted(self, txns: Iterable[Transaction]) -> list[Transaction]:
        txns = list(txns)
        if not txns:
            return []
        recorded, markers, bound = self._recorded(txns), self._markers(t.handle for t in txns), self.committed_checkpoint()
        return [t for t in txns if not self._done(t, markers[t.handle], recorded[t.handle], bound)]

    def is_committed(self, txn: Transaction) -> bool:
        return txn.checkpoint_id is not None and not self.uncommitted([txn])

    def lost(self, txns: Iterable[Transaction]) -> str | None:
        """Why the uncommitted ones of ``txns`` can never commit (an id neither prepared nor
        committed), or None."""
        todo = self.uncommitted(txns)
        if not todo:
            return None
        recorded, markers = self._recorded(todo), self._markers(t.handle for t in todo)
        prepared = {p.gid for p in self.prepared()}
        gone = [g for t in todo for g in recorded[t.handle] if g not in prepared and g not in markers[t.handle]]
        if not gone:
            return None
        return (f"sink {self.name}: {len(gone)} prepared transactions of {'.'.join(self.table)} are gone before their "
                f"commit (e.g. {gone[0]}: rolled back by hand?)")

    # fencing and committing ----------------------------------------------------------------------

    def fence(self, epoch: int) -> None:
        """From now on every write of an older epoch is refused (:class:`FencedError` if a newer
        epoch fenced the sink first). Idempotent."""
        from psycopg2 import sql

        self.create()
        with self._session() as cur:
            cur.execute(sql.SQL("INSERT INTO {} AS f (pipeline, sink, epoch) VALUES (%s, %s, %s) "
                                "ON CONFLICT (pipeline, sink) DO UPDATE SET epoch = EXCLUDED.epoch "
                                "WHERE f.epoch <= EXCLUDED.epoch RETURNING epoch").format(self._id(FENCES)),
                        (self.pipeline, self.name, epoch))
            if cur.fetchone() is None:
                raise FencedError(f"sink {self.name}: a newer epoch than {epoch} fenced it")

    def _raise_bound(self, checkpoint_id: int, writer_epoch: int) -> None:
        """Before any id of ``checkpoint_id`` commits: the sink's commit bound (what a rollback
        checks) is raised to it, refused for a fenced epoch."""
        from psycopg2 import sql

        with self._session() as cur:
            cur.execute(sql.SQL("INSERT INTO {} AS f (pipeline, sink, epoch, committed_checkpoint) "
                                "VALUES (%s, %s, %s, %s) ON CONFLICT (pipeline, sink) DO UPDATE SET "
                                "committed_checkpoint = GREATEST(f.committed_checkpoint, EXCLUDED.committed_checkpoint) "
                                "WHERE f.epoch <= %s RETURNING epoch").format(self._id(FENCES)),
                        (self.pipeline, self.name, writer_epoch, checkpoint_id, writer_epoch))
            if cur.fetchone() is None:
                raise FencedError(f"sink {self.name}: epoch {writer_epoch} is fenced; checkpoint {checkpoint_id} "
                                  "not committed")

    def commit(self, txns: list[Transaction], checkpoint_id: int, writer_epoch: int) -> list[Transaction]:
        """Commit ``txns`` (every subtask's, pre-committed at checkpoints <= ``checkpoint_id``),
        checkpoint by checkpoint: ``COMMIT PREPARED`` of every id they recorded (an upsert sink
        then applies them); ids already committed are skipped, so a repeated commit is a no-op.
        Then rolls back every prepared id of an older epoch than ``writer_epoch`` (a zombie's).
        Returns what this call committed."""
        if self.check_epoch is not None:
            self.check_epoch(writer_epoch)
        todo = self.uncommitted(txns)
        by_checkpoint: dict[int, list[Transaction]] = defaultdict(list)
        for t in todo:
            by_checkpoint[checkpoint_id if t.checkpoint_id is None else t.checkpoint_id].append(t)
        for cid in sorted(by_checkpoint):
            self._raise_bound(cid, writer_epoch)
            self._commit_prepared(by_checkpoint[cid])
            if self.mode == "upsert":
                self._apply(by_checkpoint[cid], writer_epoch)
        self._roll_back_older(writer_epoch, keep={t.handle for t in txns})
        return todo

    def _commit_prepared(self, txns: list[Transaction]) -> None:
        import psycopg2

        recorded, markers = self._recorded(txns), self._markers(t.handle for t in txns)
        with self._session(autocommit=True) as cur:
            for t in txns:  # (one never written to recorded no id: nothing to commit)
                for g in recorded[t.handle]:
                    if g in markers[t.handle]:
                        continue
                    try:
                        cur.execute("COMMIT PREPARED %s", (g,))
                        self.kills.reached("prepared_commit")  # this one committed, the next ones not yet
                    except psycopg2.errors.UndefinedObject:  # not prepared (any more): committed, or lost
                        if g not in self._markers([t.handle])[t.handle]:
                            raise PreparedTransactionLostError(
                                f"sink {self.name}: {g} (checkpoint {t.checkpoint_id}) is neither prepared nor "
                                f"committed on {self.shown}: its rows are lost (rolled back by hand?)") from None

    def _apply(self, txns: list[Transaction], writer_epoch: int) -> None:
        """An upsert sink: the committed staging rows of ``txns`` into the target (the latest row of
        a key, by transaction and flush, wins), deleted from staging, their markers applied: one
        transaction, refused for a fenced epoch."""
        from psycopg2 import sql

        markers = self._markers(t.handle for t in txns)  # (a transaction forgotten early has its markers only)
        gids = sorted({g for recorded in self._recorded(txns).values() for g in recorded}
                      | {g for marked in markers.values() for g, applied in marked.items() if not applied})
        if not gids:
            return
        cols = sql.SQL(", ").join(map(sql.Identifier, self.columns))
        keys = sql.SQL(", ").join(map(sql.Identifier, self.keys))
        updates = sql.SQL(", ").join(sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
                                     for c in self.columns if c not in self.keys)
        conflict = (sql.SQL("DO UPDATE SET {}").format(updates) if [c for c in self.columns if c not in self.keys]
                    else sql.SQL("DO NOTHING"))
        with self._session() as cur:
            cur.execute(sql.SQL("SELECT epoch FROM {} WHERE pipeline = %s AND sink = %s FOR SHARE").format(
                self._id(FENCES)), (self.pipeline, self.name))
            fence = cur.fetchone()
            if fence is not None and fence[0] > writer_epoch:
                raise FencedError(f"sink {self.name}: epoch {writer_epoch} is fenced by epoch {fence[0]}")
            cur.execute(sql.SQL("INSERT INTO {t} ({cols}) SELECT DISTINCT ON ({keys}) {cols} FROM {s} "
                                "WHERE _ckpt_gid = ANY(%s) ORDER BY {keys}, _ckpt_seq DESC, _ckpt_flush DESC "
                                "ON CONFLICT ({keys}) {conflict}").format(
                t=sql.Identifier(*self.table), s=sql.Identifier(*self.staged), cols=cols, keys=keys,
                conflict=conflict), (gids,))
            cur.execute(sql.SQL("DELETE FROM {} WHERE _ckpt_gid = ANY(%s)").format(sql.Identifier(*self.staged)), (gids,))
            cur.execute(sql.SQL("UPDATE {} SET applied = true WHERE gid = ANY(%s)").format(self._id(COMMITS)), (gids,))

    def _roll_back_older(self, epoch: int, keep: set[str]) -> None:
        """Roll back every prepared id of this sink of an epoch older than ``epoch`` whose
        transaction is not among ``keep``: a zombie's write that prepared after the fence."""
        stale = [p.gid for p in self.prepared() if p.txn.epoch < epoch and p.txn.handle not in keep]
        self._roll_back(stale)

    def _roll_back(self, gids: Iterable[str]) -> None:
        import psycopg2

        gids = list(gids)
        if not gids:
            return
        with self._session(autocommit=True) as cur:
            for g in gids:
                try:
                    cur.execute("ROLLBACK PREPARED %s", (g,))
                except psycopg2.errors.UndefinedObject:
                    continue  # rolled back (or committed) already
                self.kills.reached("prepared_rollback")  # this one rolled back, the next ones not yet

    # aborting, forgetting, recovery ------------------------------------------------------------

    def abort(self, txns: Iterable[Transaction]) -> None:
        """Roll back what ``txns`` prepared (every id of theirs on the server, recorded or not),
        delete an upsert sink's committed staging rows of theirs that were never applied, and
        forget them. Committed rows are never touched. Idempotent."""
        from psycopg2 import sql

        handles = {t.handle for t in txns}
        if not handles:
            return
        self._roll_back(p.gid for p in self.prepared() if p.txn.handle in handles)
        with self._session() as cur:
            if self.mode == "upsert":
                cur.execute(sql.SQL("DELETE FROM {} s USING {} c WHERE s._ckpt_gid = c.gid AND c.handle = ANY(%s) "
                                    "AND NOT c.applied").format(sql.Identifier(*self.staged), self._id(COMMITS)),
                            (list(handles),))
            cur.execute(sql.SQL("DELETE FROM {} WHERE pipeline = %s AND sink = %s AND handle = ANY(%s)").format(
                self._id(TXNS)), (self.pipeline, self.name, list(handles)))

    def discard(self, txns: Iterable[Transaction]) -> None:
        """After ``txns`` committed: forget their recorded ids (their markers stay: they prove the
        commit to a recovery that re-commits them). Idempotent."""
        from psycopg2 import sql

        handles = [t.handle for t in txns]
        if not handles:
            return
        with self._session() as cur:
            cur.execute(sql.SQL("DELETE FROM {} WHERE pipeline = %s AND sink = %s AND handle = ANY(%s)").format(
                self._id(TXNS)), (self.pipeline, self.name, handles))

    def open_transactions(self) -> list[Transaction]:
        """Every transaction with ids recorded or prepared on the server, of every epoch: recovery
        re-commits those the restored checkpoint owns and aborts the rest (a zombie's included)."""
        from psycopg2 import sql

        found: dict[str, Transaction] = {p.txn.handle: p.txn for p in self.prepared()}
        with self._session(autocommit=True) as cur:
            cur.execute(sql.SQL("SELECT DISTINCT handle FROM {} WHERE pipeline = %s AND sink = %s").format(
                self._id(TXNS)), (self.pipeline, self.name))
            for (handle,) in cur.fetchall():
                parsed = parse_gid(gid(_handle_txn(handle), 0))
                if parsed is not None:
                    found.setdefault(handle, parsed.txn)
        return sorted(found.values())

    # rollback to an older checkpoint -------------------------------------------------------------

    def committed_checkpoint(self) -> int:
        from psycopg2 import sql

        with self._session(autocommit=True) as cur:
            cur.execute(sql.SQL("SELECT committed_checkpoint FROM {} WHERE pipeline = %s AND sink = %s").format(
                self._id(FENCES)), (self.pipeline, self.name))
            row = cur.fetchone()
        return -1 if row is None else int(row[0])

    def rollback_version(self, checkpoint_id: int) -> int | None:
        """None when nothing after ``checkpoint_id`` may have committed; else refused
        (:class:`~checkpoint_lib.spark.sinks.RollbackUnavailableError`): rows committed to a
        database cannot be taken back."""
        bound = self.committed_checkpoint()
        if bound <= checkpoint_id:
            return None
        raise RollbackUnavailableError(
            f"sink {self.name}: {'.'.join(self.table)} (PostgreSQL) cannot be rolled back to what checkpoint "
            f"{checkpoint_id} committed: checkpoint {bound} committed to it since, and committed rows are not taken "
            f"back. Nothing was written. Restore checkpoint {bound} or a newer one (ckpt recover "
            f"{self.pipeline} --checkpoint N)")

    def rollback_to(self, checkpoint_id: int) -> int | None:
        return self.rollback_version(checkpoint_id)


def _handle_txn(handle: str) -> Transaction:
    m = re.match(r"^(?P<txn_id>.+)\.e(?P<epoch>\d+)\.s(?P<seq>\d+)$", handle)
    if not m:
        raise ValueError(f"not a transaction handle: {handle!r}")
    return Transaction(int(m["seq"]), m["txn_id"], int(m["epoch"]))


def _same_type(have: tuple[str, Any, Any], want: str) -> bool:
    data_type, precision, scale = have
    if want.startswith("numeric"):
        m = re.match(r"numeric\((\d+)\s*,\s*(\d+)\)", want)
        return data_type == "numeric" and (m is None or (int(m[1]), int(m[2])) == (precision, scale))
    aliases = {"timestamp": "timestamp without time zone"}
    return data_type == aliases.get(want, want)


def _postgres_sink(declaration: PostgresSink, site: SinkSite) -> PostgresTwoPhaseSink:
    return PostgresTwoPhaseSink(site.spark, site.name, declaration, pipeline_of(site.app_prefix),
                                check_epoch=site.check_epoch, parallelism=site.parallelism or 1,
                                kill_points=site.kill_points)


register_sink(PostgresSink, _postgres_sink)

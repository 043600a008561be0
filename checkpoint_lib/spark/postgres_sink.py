"""Two-phase commit into PostgreSQL (:class:`~checkpoint_lib.pipeline.PostgresSink`): the seed's
``TwoPhaseCommitSinkFunction`` with PostgreSQL's ``PREPARE TRANSACTION`` as the external system's
transaction that survives a process's death.

One prepared transaction per subtask and checkpoint, however many flushes the checkpoint has: the
server's ``max_prepared_transactions`` bounds how many exist at once, so what the sink holds must
not grow with the flushes (a run with checkpointing off flushes many times per checkpoint).

- **write** (at a flush, in Spark tasks, one task per subtask): a flush that is not the last
  before its transaction's barrier commits the subtask's rows (``COPY``) into the staging table
  ``<table>__ckpt_staged``, tagged with the transaction's handle, its sequence and the flush, and
  records the flush (``_checkpoint_lib_flushes``), in one transaction that also reads the sink's
  fence and refuses an older epoch. Staged rows are invisible to the target's readers; a task Spark
  retries finds its flush recorded and writes nothing. A subtask without rows writes nothing.
- **pre-commit** (at the barrier): each subtask's transaction becomes ONE database transaction,
  prepared under the global id :func:`gid` (the deployment's tag, then the transaction's handle:
  pool slot, pipeline, sink, subtask, epoch, sequence): it reads the fence, writes the last flush's rows, claims the staged
  ones, inserts a marker (``_checkpoint_lib_commits``, visible once committed) and is
  ``PREPARE``-d. When the runner knows the barrier follows a flush (a chained step that ends with
  it: ``stage(..., barrier=c)``) the flush's tasks do this with their rows; otherwise the driver
  does it at the barrier (:meth:`pre_commit`) for rows staged before. An ``append`` sink writes
  the last flush's rows into the target and copies the staged ones there (``INSERT ... SELECT``):
  rows of a checkpoint's last flush are written once, rows of earlier flushes twice, because a
  flush before the barrier can be neither prepared (one more prepared transaction per flush) nor
  committed into the target (readers would see it): the staging table is the only place they can
  be durable meanwhile. An ``upsert`` sink writes every flush into staging (the last one inside the
  prepared transaction), where rows of a prepared transaction hold no lock on the target, so the
  next checkpoint's writes never wait for an uncommitted one. A retried task or a repeated
  pre-commit finds its id prepared (or its marker committed) and keeps it.
- **commit** (checkpoint ``c`` completed): the sink's commit bound is raised to ``c`` (what a
  rollback checks), then ``COMMIT PREPARED`` of every transaction's id, checkpoint by checkpoint;
  an ``upsert`` sink then applies the committed staging rows to the target (latest row of a key
  wins), deletes them and marks the markers applied, in one transaction. An id that is no longer
  prepared is done when its marker is visible (it committed: the marker committed with the rows),
  and an error otherwise (:class:`PreparedTransactionLostError`): nothing is committed twice.
  Once forgotten (:meth:`discard`), the transaction's flushes and an append sink's staged copies
  are deleted.
- **abort**: ``ROLLBACK PREPARED``, and the transaction's staged rows and flushes deleted.

**Fencing.** A recovery of epoch ``F`` raises the sink's fence to ``F`` (:meth:`fence`, before it
restores anything); every write transaction reads the fence and refuses an older epoch. A zombie's
write that read the fence before it moved may still stage or prepare afterwards: such a
transaction belongs to a checkpoint that can no longer complete (the checkpoint store is fenced
first), so nobody ever commits it, and the next commit or recovery of a newer epoch rolls back
every prepared id and deletes every staged flush of an older epoch it does not own
(:meth:`commit`, :meth:`abort`). A zombie's ``COMMIT PREPARED`` of a completed checkpoint commits
what the newest completed checkpoint owns anyway.

**Prepared transactions held at once.** Each subtask holds one per pending checkpoint (an
aborted checkpoint's stays prepared until the next completed one commits it), and one more an
older attempt may still prepare past its fence check before a newer attempt's next commit rolls it
back. ``max_prepared_transactions`` is the server's, shared by every database and pipeline on it:
:meth:`check_configuration` refuses to start below what the pipeline's PostgreSQL sinks on the
server need together (their subtasks x (pending checkpoints + 1)).

**Deployments.** A prepared transaction's id is unique on the whole server, while the
bookkeeping is per database and schema: the id carries the deployment's tag (:func:`deployment`,
a hash of the database and the bookkeeping schema), and every read of ``pg_prepared_xacts`` is of
the current database, so staging and production of one pipeline on one server never take each
other's transactions.

**Bookkeeping tables** (in the target's schema, created if missing; what an earlier version's
lack is added at start, never waiting for a prepared transaction's lock): ``_checkpoint_lib_fences``
(the fence, the commit bound and the settled checkpoint of each sink), ``_checkpoint_lib_commits``
(one marker per prepared id, visible once it committed), ``_checkpoint_lib_flushes`` (the staged
flushes of each open transaction). They stay small: a transaction's flushes go when it is forgotten
or aborted, and each commit of checkpoint ``c`` settles the sink up to ``c`` and deletes the
markers of the checkpoints up to it in one transaction (:meth:`_settle`, which says why no
recovery can need them): "already committed" is then proved by the settled checkpoint that
replaced them. A rollback to an older checkpoint is refused once a later one committed: committed
rows cannot be taken back (:meth:`rollback_version`).

The connection string comes from the environment (``AIRFLOW_CONN_<ID>``, as Airflow reads a
connection) and is never logged: errors name the host, the port and the connection id only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
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
from ..layout import pipeline_of
from .sink_kinds import RollbackUnavailableError, SinkConfigurationError, SinkSite, register_sink

FENCES, COMMITS, FLUSHES = "_checkpoint_lib_fences", "_checkpoint_lib_commits", "_checkpoint_lib_flushes"
STAGED_SUFFIX = "__ckpt_staged"
STAGED_COLUMNS = ("_ckpt_handle", "_ckpt_seq", "_ckpt_flush")
"""A staged row's transaction (its handle), that transaction's sequence and the flush: an upsert
sink's latest row of a key wins by them."""
GID_PREFIX = "ckpt:"
_GID = re.compile(r"^ckpt:(?P<tag>[0-9a-f]{8}):(?P<handle>.+-\d+-\d+\.e\d+\.s\d+)$")  # a pool's handle
_MAX_GID = 200  # PostgreSQL's GIDSIZE, terminator included
_MAX_NAME = 63  # PostgreSQL's identifiers (NAMEDATALEN - 1): a longer one is cut silently
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


def deployment(database: str, schema: str) -> str:
    """The tag of the deployment whose bookkeeping lives in ``schema`` of ``database`` (8 hex
    digits): a prepared transaction's id is unique on the whole server, so two deployments of one
    pipeline there (staging and production, in two databases or schemas) must not share ids."""
    return hashlib.sha256(f"{database}/{schema}".encode()).hexdigest()[:8]


def gid(txn: Transaction, tag: str) -> str:
    """The global id of transaction ``txn``'s prepared database transaction (one subtask's, one
    per checkpoint: every flush of it ends in this one) in deployment ``tag``."""
    return f"{GID_PREFIX}{tag}:{txn.handle}"


@dataclass(frozen=True)
class PreparedId:
    gid: str
    tag: str
    txn: Transaction  # checkpoint_id None: the id does not say it


def parse_gid(value: str) -> PreparedId | None:
    """What :func:`gid` encoded, or None for an id that is not ours."""
    m = _GID.match(value)
    if not m:
        return None
    return PreparedId(value, m["tag"], Transaction.from_handle(m["handle"]))


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
    host, port = _server(uri)
    return f"{host}:{port}/{urlsplit(uri).path.lstrip('/')} (connection {connection!r})"


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
    held = [HeldPrepare(g, _pipeline_of(g), now - float(at), db, shown) for g, at, db in rows]
    return [h for h in held if h.age_s > older_than_s and (wanted is None or h.pipeline in wanted)]


def _pipeline_of(value: str) -> str:
    parsed = parse_gid(value)
    return (parsed.txn.txn_id if parsed else value.removeprefix(GID_PREFIX)).split(".")[0]


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
    mode: str  # append | upsert
    table: tuple[str, ...]  # the target
    staged: tuple[str, ...]  # its staging table
    columns: tuple[str, ...]
    tag: str  # the deployment's (:func:`deployment`): what the prepared transactions' ids carry
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


def _copy_rows(cur, table: tuple[str, ...], columns: tuple[str, ...], rows: Iterable[tuple]) -> int:
    from psycopg2 import sql

    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(*table), sql.SQL(", ").join(map(sql.Identifier, columns)))
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


def _tagged(rows: Iterable[tuple], txn: Transaction, flush: int) -> Iterator[tuple]:
    return (row + (txn.handle, txn.seq, flush) for row in rows)


def _check_fence(cur, spec: WriteSpec, txn: Transaction, what: str) -> None:
    """Refuse (:class:`FencedError`) a write of an epoch older than the sink's fence. A plain read,
    no lock: a prepared transaction holding one would keep the recovery's fence waiting until it
    commits, which only that recovery would do."""
    from psycopg2 import sql

    cur.execute(sql.SQL("SELECT epoch FROM {} WHERE pipeline = %s AND sink = %s").format(
        _bookkeeping(spec.table, FENCES)), (spec.pipeline, spec.sink))
    fence = cur.fetchone()
    if fence is not None and fence[0] > txn.epoch:
        raise FencedError(f"sink {spec.sink}: epoch {txn.epoch} is fenced by epoch {fence[0]}: {what} not written")


@contextmanager
def _writing(spec: WriteSpec):
    """A connection for one write transaction of a task: rolled back if the block raises (unless
    already closed), closed either way; the block commits or prepares it."""
    conn = connect(spec.uri, spec.shown)
    try:
        yield conn
    except BaseException:
        if not conn.closed:
            conn.rollback()
        raise
    finally:
        conn.close()


def stage_rows(spec: WriteSpec, txn: Transaction, flush: int, rows: Iterable[tuple]) -> int:
    """Flush ``flush`` of transaction ``txn`` (one subtask's), not the last before its barrier:
    ``rows`` (the spec's columns, in order) committed into the staging table, tagged with the
    transaction, and the flush recorded, in one database transaction. Returns the rows written, or
    ``-1`` when an earlier attempt of the same task committed this flush already. Refused
    (:class:`FencedError`, nothing written) when the sink's fence is above ``txn``'s epoch."""
    from psycopg2 import sql

    with _writing(spec) as conn:
        with conn.cursor() as cur:
            recorded = sql.SQL("SELECT 1 FROM {} WHERE pipeline = %s AND sink = %s AND handle = %s AND flush = %s").format(
                _bookkeeping(spec.table, FLUSHES))
            cur.execute(recorded, (spec.pipeline, spec.sink, txn.handle, flush))
            if cur.fetchone() is not None:  # a retried task: an earlier attempt committed it
                conn.rollback()
                return -1
            cur.execute("SET LOCAL lock_timeout = %s", (LOCK_TIMEOUT,))
            _check_fence(cur, spec, txn, f"flush {flush} of {txn.handle}")
            act(spec.fault)  # (CKPT_PAUSE_AT=prepare:n: a zombie past its fence check)
            count = _copy_rows(cur, spec.staged, spec.columns + STAGED_COLUMNS, _tagged(rows, txn, flush))
            cur.execute(sql.SQL("INSERT INTO {} (pipeline, sink, handle, flush, rows) VALUES (%s, %s, %s, %s, %s) "
                                "ON CONFLICT DO NOTHING RETURNING 1").format(_bookkeeping(spec.table, FLUSHES)),
                        (spec.pipeline, spec.sink, txn.handle, flush, count))
            if cur.fetchone() is None:  # an attempt racing this one committed it first
                conn.rollback()
                return -1
        conn.commit()
        return count


def prepare(spec: WriteSpec, txn: Transaction, checkpoint_id: int, rows: Iterable[tuple] = (),
            flush: int = -1) -> int:
    """Pre-commit transaction ``txn`` (one subtask's) at the barrier of ``checkpoint_id``: ONE
    database transaction writes ``rows``, its last flush ``flush`` (none: ``-1``, the driver at the
    barrier), claims its staged flushes (an append sink copies them into the target; an upsert
    sink's stay staged, applied at the commit), inserts its marker and is prepared as
    :func:`gid` (of the spec's deployment). Returns the rows written, or ``-1`` when it is prepared (or committed) already: a
    retried task, a repeated pre-commit. Refused (:class:`FencedError`, nothing written) when the
    sink's fence is above ``txn``'s epoch."""
    import psycopg2
    from psycopg2 import sql

    g = gid(txn, spec.tag)
    with _writing(spec) as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s AND database = current_database()", (g,))
            done = cur.fetchone() is not None
            if not done:
                cur.execute(sql.SQL("SELECT 1 FROM {} WHERE gid = %s").format(_bookkeeping(spec.table, COMMITS)), (g,))
                done = cur.fetchone() is not None
            if done:  # an earlier attempt prepared it (or it committed since)
                conn.rollback()
                return -1
            cur.execute("SET LOCAL lock_timeout = %s", (LOCK_TIMEOUT,))
            _check_fence(cur, spec, txn, g)
            act(spec.fault)  # (CKPT_PAUSE_AT=prepare:n: a zombie past its fence check)
            if spec.mode == "append":
                count = _copy_rows(cur, spec.table, spec.columns, rows)
                cols = sql.SQL(", ").join(map(sql.Identifier, spec.columns))
                cur.execute(sql.SQL("INSERT INTO {} ({cols}) SELECT {cols} FROM {} WHERE _ckpt_handle = %s").format(
                    sql.Identifier(*spec.table), sql.Identifier(*spec.staged), cols=cols), (txn.handle,))
                count += max(cur.rowcount, 0)
            else:
                count = _copy_rows(cur, spec.staged, spec.columns + STAGED_COLUMNS, _tagged(rows, txn, flush))
            cur.execute(sql.SQL("INSERT INTO {} (gid, pipeline, sink, handle, flush, rows, checkpoint_id) "
                                "VALUES (%s, %s, %s, %s, %s, %s, %s)").format(_bookkeeping(spec.table, COMMITS)),
                        (g, spec.pipeline, spec.sink, txn.handle, flush, count, checkpoint_id))
            try:
                cur.execute("PREPARE TRANSACTION %s", (g,))
            except psycopg2.errors.DuplicateObject:  # an attempt racing this one prepared it first
                conn.rollback()
                return -1
        return count


def _write_partition(spec: WriteSpec, txns: dict[int, Transaction], flush: int, barrier: int | None):
    """The task of one subtask's partition (partition index = subtask): its rows staged, or, when
    ``barrier`` follows this flush, written and prepared with the transaction's staged ones (a
    subtask with no rows then prepares its staged rows and its marker, so that every transaction a
    checkpoint owns has an id to commit and a marker that proves it committed)."""

    def write(index: int, rows: Iterator[tuple]) -> Iterator[tuple[int, int]]:
        rows = (row for _, row in rows)
        first = next(rows, None)
        if index not in txns:
            if first is not None:
                raise RuntimeError(f"sink {spec.sink}: rows of subtask {index}, which has no open transaction")
            return iter(())
        rows = itertools.chain(() if first is None else (first,), rows)
        if barrier is not None:
            return iter([(index, prepare(spec, txns[index], barrier, rows, flush))])
        if first is None:
            return iter([(index, 0)])  # nothing to stage
        return iter([(index, stage_rows(spec, txns[index], flush, rows))])

    return write


def _bookkeeping(table: tuple[str, ...], name: str):
    from psycopg2 import sql

    return sql.Identifier(*table[:-1], name)


# the writer (driver side) ----------------------------------------------------------------------


class PostgresTwoPhaseSink:
    """One logical PostgreSQL sink of a pipeline (every subtask of it shares it): the
    :class:`~checkpoint_lib.spark.sinks.SinkWriter` of a :class:`~checkpoint_lib.pipeline.PostgresSink`.
    ``pending``: how many checkpoints may be pending at once; ``server_sinks``: the pipeline's
    PostgreSQL sinks, this one included, as (name, declaration, parallelism): those on this sink's
    server share its prepared transactions (:meth:`check_configuration`)."""

    def __init__(self, spark: Any, name: str, declaration: PostgresSink, pipeline: str, *, uri: str | None = None,
                 check_epoch=None, parallelism: int = 1,
                 kill_points: KillPoints | None = None, pending: int = 1,
                 server_sinks: Iterable[tuple[str, PostgresSink, int]] = ()):
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
        self._tag: str | None = None
        self.check_epoch = check_epoch
        self.parallelism = parallelism
        self.pending = pending
        self.server_sinks = [s for s in server_sinks if s[0] != name] + [(name, declaration, parallelism)]
        self.kills = kill_points or KillPoints({})
        self._prepared: set[str] = set()
        """Handles whose flush with their barrier prepared them in this process: nothing to do at
        their pre-commit, and no flush may follow."""
        if len(GID_PREFIX) + 9 + len(self.pool_prefix.encode()) + 64 >= _MAX_GID:
            raise PostgresConfigurationError(f"sink {name}: pipeline and sink names too long for PostgreSQL's "
                                             f"transaction ids ({_MAX_GID} bytes)")
        if len(self.staged[-1].encode()) > _MAX_NAME:
            raise PostgresConfigurationError(f"sink {name}: table name {self.table[-1]!r} too long for its staging "
                                             f"table {self.staged[-1]!r} (PostgreSQL names: {_MAX_NAME} bytes)")

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

    @property
    def tag(self) -> str:
        """This deployment's tag (:func:`deployment`: the database and the schema the bookkeeping
        tables are in), read from the server when first needed."""
        if self._tag is None:
            with self._session(autocommit=True) as cur:
                cur.execute("SELECT current_database(), COALESCE(%s, current_schema())",
                            (self.table[0] if len(self.table) == 2 else None,))
                self._tag = deployment(*cur.fetchone())
        return self._tag

    def _gid(self, txn: Transaction) -> str:
        return gid(txn, self.tag)

    def _session(self, autocommit: bool = False):
        return session(self.uri, self.shown, autocommit=autocommit)

    def _id(self, name: str):
        return _bookkeeping(self.table, name)

    def _spec(self) -> WriteSpec:
        return WriteSpec(self.uri, self.shown, self.pipeline, self.name, self.mode, self.table, self.staged,
                         self.columns, self.tag)

    def prepared(self) -> list[PreparedId]:
        """This sink's prepared transactions, of every epoch: this deployment's (its database's, its
        tag's; another database's are not even visible to ``COMMIT PREPARED`` from here)."""
        prefix = f"{GID_PREFIX}{self.tag}:{self.pool_prefix}-"
        with self._session(autocommit=True) as cur:
            cur.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s AND database = current_database()",
                        (prefix.replace("_", "\\_").replace("%", "\\%") + "%",))
            found = [parse_gid(g) for (g,) in cur.fetchall()]
        return [p for p in found if p is not None and p.tag == self.tag and of_pool(p, self.pool_prefix)]

    # creating ---------------------------------------------------------------------------------

    def create(self) -> None:
        """The target (with a primary key on ``keys`` for an upsert sink), its staging table and
        the bookkeeping tables, if missing (idempotent; racing creators are fine); then refuse a
        server or table the protocol cannot use (:meth:`check_configuration`)."""
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
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, _ckpt_handle text NOT NULL, _ckpt_seq bigint NOT NULL, "
                    "_ckpt_flush bigint NOT NULL)").format(sql.Identifier(*self.staged), columns),
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (pipeline text, sink text, epoch bigint NOT NULL, "
                    "committed_checkpoint bigint NOT NULL DEFAULT -1, settled bigint NOT NULL DEFAULT -1, "
                    "PRIMARY KEY (pipeline, sink))").format(self._id(FENCES)),
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (gid text PRIMARY KEY, pipeline text NOT NULL, sink text NOT NULL, "
                    "handle text NOT NULL, flush bigint NOT NULL, rows bigint NOT NULL, "
                    "applied boolean NOT NULL DEFAULT false, checkpoint_id bigint)").format(self._id(COMMITS)),
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (pipeline text, sink text, handle text, flush bigint, "
                    "rows bigint NOT NULL, PRIMARY KEY (pipeline, sink, handle, flush))").format(self._id(FLUSHES)),
        ]
        # what tables of an earlier version lack, added only when missing: an ALTER TABLE or CREATE
        # INDEX waits for every transaction holding the table, a prepared one included (until a
        # commit that only this process would run)
        settled_by = _index_name(COMMITS, "settled")
        upgrades = [
            (self._qualified(COMMITS), "checkpoint_id", sql.SQL("ALTER TABLE {} ADD COLUMN checkpoint_id bigint").format(
                self._id(COMMITS))),
            (self._qualified(FENCES), "settled", sql.SQL(
                "ALTER TABLE {} ADD COLUMN settled bigint NOT NULL DEFAULT -1").format(self._id(FENCES))),
            (self._qualified(COMMITS), settled_by, sql.SQL("CREATE INDEX {} ON {} (pipeline, sink, checkpoint_id)").format(
                sql.Identifier(settled_by), self._id(COMMITS))),
            (self._qualified(self.staged[-1]), _index_name(self.staged[-1], "handle"),
             sql.SQL("CREATE INDEX {} ON {} (_ckpt_handle)").format(
                 sql.Identifier(_index_name(self.staged[-1], "handle")), sql.Identifier(*self.staged))),
        ]
        with self._session(autocommit=True) as cur:
            for statement in statements:
                try:
                    cur.execute(statement)
                except (errors.UniqueViolation, errors.DuplicateTable, errors.DuplicateObject):
                    pass  # a racing creator made it first (CREATE ... IF NOT EXISTS is not atomic)
            for table, name, statement in upgrades:
                _add_missing(cur, table, name, statement, f"sink {self.name}")
        self.check_configuration()

    def _qualified(self, name: str) -> str:
        """Bookkeeping table ``name`` (or the staging table) as ``to_regclass`` reads it."""
        return ".".join(f'"{p}"' for p in (*self.table[:-1], name))

    def prepared_needed(self) -> tuple[int, list[tuple[str, int]]]:
        """How many prepared transactions the pipeline's PostgreSQL sinks on this sink's server may
        hold at once, and those sinks (name, subtasks): each subtask one per pending checkpoint and
        one an older attempt may still prepare (past its fence check) before a newer attempt's next
        commit rolls it back, whatever the flushes per checkpoint."""
        mine = _server(self.uri)
        sharing = []
        for name, declaration, parallelism in self.server_sinks:
            if name == self.name:
                sharing.append((name, parallelism))
                continue
            try:
                theirs = _server(connection_uri(declaration.connection, name))
            except PostgresConfigurationError:
                continue  # (its own start refuses it, naming its connection)
            if theirs == mine:
                sharing.append((name, parallelism))
        return sum(p for _, p in sharing) * (self.pending + 1), sorted(sharing)

    def check_configuration(self) -> None:
        """Refused before any write, each naming what to change: a server with fewer
        ``max_prepared_transactions`` than the pipeline's PostgreSQL sinks on it need
        (:meth:`prepared_needed`; 0, PostgreSQL's default: no two-phase commit at all); a target
        lacking a declared column or typing it otherwise; an upsert target without a primary key or
        unique index on exactly ``keys``."""
        needed, sharing = self.prepared_needed()
        with self._session(autocommit=True) as cur:
            cur.execute("SHOW max_prepared_transactions")
            have = int(cur.fetchone()[0])
            if have < needed:
                sinks = ", ".join(f"{n}: {p} subtask{'s' if p != 1 else ''}" for n, p in sharing)
                raise PostgresConfigurationError(
                    f"sink {self.name}: the PostgreSQL server at {self.shown} has max_prepared_transactions = {have}, "
                    f"and the pipeline's PostgreSQL sinks on it ({sinks}) need at least {needed}: each subtask holds "
                    f"one prepared transaction per pending checkpoint ({self.pending}) and one more an older attempt "
                    "may still prepare. The limit is the server's, shared by every database and pipeline on it: "
                    "add what other pipelines' sinks there need. Set max_prepared_transactions (postgresql.conf, "
                    "or `postgres -c max_prepared_transactions=N`) and restart the server")
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

    def stage(self, rows: Any, handles: dict[int, Transaction], flush: int, *, barrier: int | None = None) -> None:
        """Write ``rows`` (the sink's columns plus ``sink_subtask``) into each subtask's transaction
        ``handles[subtask]`` as flush ``flush`` (one Spark job: a task per subtask, each one database
        transaction): staged, or, when the barrier of checkpoint ``barrier`` follows this flush
        before any other flush of them, written and prepared with what they staged before
        (:func:`prepare`: nothing left for :meth:`pre_commit`)."""
        if not handles:
            return
        closed = sorted(t.handle for t in handles.values() if t.handle in self._prepared)
        if closed:
            raise RuntimeError(f"sink {self.name}: flush {flush} into transactions already prepared at their barrier "
                               f"({', '.join(closed)})")
        missing = [c for c in self.columns if c not in rows.columns]
        if missing:
            raise ValueError(f"sink {self.name}: the operator's rows lack columns {missing}")
        width = max(handles) + 1
        spec = dataclasses.replace(self._spec(), fault=self.kills.due("prepare"))
        keyed = rows.select(SINK_SUBTASK, *self.columns).rdd.map(lambda r: (int(r[0]), tuple(r[1:])))
        written = (keyed.partitionBy(width, lambda subtask: subtask)
                   .mapPartitionsWithIndex(_write_partition(spec, dict(handles), flush, barrier)).collect())
        lacking = sorted(set(handles) - {subtask for subtask, _ in written})
        if lacking:
            raise RuntimeError(f"sink {self.name}: flush {flush} wrote nothing for subtasks {lacking}")
        if barrier is not None:
            self._prepared.update(t.handle for t in handles.values())

    def pre_commit(self, handles: dict[int, Transaction], checkpoint_id: int) -> None:
        """At the barrier of ``checkpoint_id``: each subtask's transaction of ``handles`` prepared
        (:func:`prepare`, from the driver: its staged rows claimed, its marker), unless its last
        flush did it (:meth:`stage` with ``barrier``). Idempotent."""
        spec = self._spec()
        for _, txn in sorted(handles.items()):
            if txn.handle in self._prepared:
                self._prepared.discard(txn.handle)
                continue
            prepare(dataclasses.replace(spec, fault=self.kills.due("prepare")), txn, checkpoint_id)

    # reading the bookkeeping ---------------------------------------------------------------------

    def _markers(self, gids: Iterable[str]) -> dict[str, bool]:
        """Committed id -> applied, of ``gids`` (a marker is visible once its transaction committed)."""
        from psycopg2 import sql

        gids = list(gids)
        if not gids:
            return {}
        with self._session(autocommit=True) as cur:
            cur.execute(sql.SQL("SELECT gid, applied FROM {} WHERE gid = ANY(%s)").format(self._id(COMMITS)), (gids,))
            return dict(cur.fetchall())

    def _settled(self) -> int:
        """The checkpoint the sink is settled up to (:meth:`_settle`; -1: none)."""
        from psycopg2 import sql

        with self._session(autocommit=True) as cur:
            cur.execute(sql.SQL("SELECT settled FROM {} WHERE pipeline = %s AND sink = %s").format(self._id(FENCES)),
                        (self.pipeline, self.name))
            row = cur.fetchone()
        return -1 if row is None else int(row[0])

    def uncommitted(self, txns: Iterable[Transaction]) -> list[Transaction]:
        """Those of ``txns`` not committed (an upsert sink's: or not applied yet). Committed is what
        its marker says; once the markers are pruned, a transaction of a checkpoint the sink is
        settled up to that is not prepared (:meth:`_settle`)."""
        txns = list(txns)
        if not txns:
            return []
        markers = self._markers(self._gid(t) for t in txns)
        todo = [t for t in txns if not (self._gid(t) in markers and (self.mode == "append" or markers[self._gid(t)]))]
        unmarked = [t for t in todo if self._gid(t) not in markers and t.checkpoint_id is not None]
        if unmarked:
            settled = self._settled()
            if any(t.checkpoint_id <= settled for t in unmarked):
                prepared = {p.gid for p in self.prepared()}
                proved = {t.handle for t in unmarked if t.checkpoint_id <= settled and self._gid(t) not in prepared}
                todo = [t for t in todo if t.handle not in proved]
        return todo

    def is_committed(self, txn: Transaction) -> bool:
        return txn.checkpoint_id is not None and not self.uncommitted([txn])

    def lost(self, txns: Iterable[Transaction]) -> str | None:
        """Why the uncommitted ones of ``txns`` can never commit (an id neither prepared nor
        committed), or None."""
        todo = self.uncommitted(txns)
        if not todo:
            return None
        markers = self._markers(self._gid(t) for t in todo)
        prepared = {p.gid for p in self.prepared()}
        gone = [self._gid(t) for t in todo if self._gid(t) not in prepared and self._gid(t) not in markers]
        if not gone:
            return None
        return (f"sink {self.name}: {len(gone)} prepared transactions of {'.'.join(self.table)} are gone before their "
                f"commit (e.g. {gone[0]}: rolled back by hand?)")

    # fencing and committing ----------------------------------------------------------------------

    fences_first_epoch = True
    """Fenced by a warehouse's first epoch too (:class:`SinkWriter`): the bookkeeping lives in the
    database, which another warehouse of the pipeline (or an earlier one, since deleted) may have
    fenced higher; the run is then refused at its start, naming what to do, not at its first write."""

    def fence(self, epoch: int) -> None:
        """From now on every write of an older epoch is refused (:class:`FencedError` if a newer
        epoch fenced the sink first: another attempt of this warehouse, or another warehouse of the
        same pipeline writing into this database). Idempotent."""
        from psycopg2 import sql

        self.create()
        with self._session() as cur:
            cur.execute(sql.SQL("INSERT INTO {} AS f (pipeline, sink, epoch) VALUES (%s, %s, %s) "
                                "ON CONFLICT (pipeline, sink) DO UPDATE SET epoch = EXCLUDED.epoch "
                                "WHERE f.epoch <= EXCLUDED.epoch RETURNING epoch").format(self._id(FENCES)),
                        (self.pipeline, self.name, epoch))
            if cur.fetchone() is not None:
                return
            cur.execute(sql.SQL("SELECT epoch FROM {} WHERE pipeline = %s AND sink = %s").format(self._id(FENCES)),
                        (self.pipeline, self.name))
            have = cur.fetchone()[0]
        fences = ".".join((*self.table[:-1], FENCES))
        raise FencedError(
            f"sink {self.name}: the database at {self.shown} is fenced for pipeline {self.pipeline!r} by epoch {have}, "
            f"newer than this run's epoch {epoch}: a newer attempt of this pipeline took over, or another "
            f"warehouse of it (or an earlier one, since deleted) writes into this database. Nothing was written. "
            f"Give each warehouse its own database or schema; if the other warehouse is gone for good, delete its "
            f"fence: DELETE FROM {fences} WHERE pipeline = '{self.pipeline}' AND sink = '{self.name}'")

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
        checkpoint by checkpoint: ``COMMIT PREPARED`` of each one's id (an upsert sink then applies
        them); ones already committed are skipped, so a repeated commit is a no-op. Then rolls back
        what every older epoch than ``writer_epoch`` left that it does not own (a zombie's prepare
        or staged flush that landed after the fence). Returns what this call committed."""
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
        self._abort_older(writer_epoch, keep={t.handle for t in txns})
        self._settle(checkpoint_id, writer_epoch)
        return todo

    def _settle(self, checkpoint_id: int, writer_epoch: int) -> None:
        """After every transaction checkpoint ``checkpoint_id`` owns committed (and was applied):
        the sink is settled up to it, and the markers of the checkpoints up to it are deleted, in
        one transaction (a fenced epoch changes nothing).

        Safe: everything any completed checkpoint up to ``checkpoint_id`` owns has committed (a
        transaction pre-committed at checkpoint ``c' <= c`` and still pending at a later barrier was
        pending at ``c``'s, so ``c`` owns it too), and a recovery never restores a checkpoint below
        the commit bound, which is at least ``checkpoint_id`` (:meth:`rollback_version`): a later
        checkpoint owns only transactions of its own epoch pre-committed above it, or ones ``c``
        owns. So every question about a transaction of a checkpoint up to it (a re-commit, ``ckpt
        commit`` of a retained checkpoint, a recovery) is answered "committed" (:meth:`uncommitted`)
        as its marker would have answered, and one that was lost is found before the sink settles
        past it (the commit raises :class:`PreparedTransactionLostError` first). A rollback that
        took committed rows back would have to lower the settled checkpoint with the bound."""
        from psycopg2 import sql

        with self._session() as cur:
            cur.execute(sql.SQL("UPDATE {} SET settled = %s WHERE pipeline = %s AND sink = %s AND epoch <= %s "
                                "AND settled < %s RETURNING 1").format(self._id(FENCES)),
                        (checkpoint_id, self.pipeline, self.name, writer_epoch, checkpoint_id))
            if cur.fetchone() is None:
                return  # settled there already, or fenced
            cur.execute(sql.SQL("DELETE FROM {} WHERE pipeline = %s AND sink = %s AND checkpoint_id <= %s "
                                "AND (applied OR %s)").format(self._id(COMMITS)),
                        (self.pipeline, self.name, checkpoint_id, self.mode == "append"))

    def _commit_prepared(self, txns: list[Transaction]) -> None:
        import psycopg2

        markers = self._markers(self._gid(t) for t in txns)
        with self._session(autocommit=True) as cur:
            for t in txns:
                g = self._gid(t)
                if g in markers:
                    continue
                try:
                    cur.execute("COMMIT PREPARED %s", (g,))
                    self.kills.reached("prepared_commit")  # this one committed, the next ones not yet
                except psycopg2.errors.UndefinedObject:  # not prepared (any more): committed, or lost
                    if g not in self._markers([g]):
                        raise PreparedTransactionLostError(
                            f"sink {self.name}: {g} (checkpoint {t.checkpoint_id}) is neither prepared nor "
                            f"committed on {self.shown}: its rows are lost (rolled back by hand?)") from None

    def _apply(self, txns: list[Transaction], writer_epoch: int) -> None:
        """An upsert sink: the staging rows of the committed ones of ``txns`` into the target (the
        latest row of a key, by transaction and flush, wins), deleted from staging, their markers
        applied: one transaction, refused for a fenced epoch."""
        from psycopg2 import sql

        markers = self._markers(self._gid(t) for t in txns)
        todo = [t for t in txns if markers.get(self._gid(t)) is False]  # committed, not applied yet
        if not todo:
            return
        handles, gids = [t.handle for t in todo], [self._gid(t) for t in todo]
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
                                "WHERE _ckpt_handle = ANY(%s) ORDER BY {keys}, _ckpt_seq DESC, _ckpt_flush DESC "
                                "ON CONFLICT ({keys}) {conflict}").format(
                t=sql.Identifier(*self.table), s=sql.Identifier(*self.staged), cols=cols, keys=keys,
                conflict=conflict), (handles,))
            cur.execute(sql.SQL("DELETE FROM {} WHERE _ckpt_handle = ANY(%s)").format(sql.Identifier(*self.staged)),
                        (handles,))
            cur.execute(sql.SQL("UPDATE {} SET applied = true WHERE gid = ANY(%s)").format(self._id(COMMITS)), (gids,))

    def _abort_older(self, epoch: int, keep: set[str]) -> None:
        """Abort every transaction of this sink of an epoch older than ``epoch`` that is not among
        ``keep`` and left something (a prepared id, staged flushes): a zombie's write that landed
        after the fence."""
        stale = [t for t in self.open_transactions() if t.epoch < epoch and t.handle not in keep]
        self.abort(stale)

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
        """Roll back what ``txns`` prepared (every id of theirs on the server), delete their staged
        rows and flushes, and forget them. Committed rows are never touched: an upsert sink keeps
        the staged rows of one that committed (its marker says so; a commit that owns it applies
        them). Idempotent."""
        from psycopg2 import sql

        gids = {t.handle: self._gid(t) for t in txns}
        if not gids:
            return
        self._roll_back(p.gid for p in self.prepared() if p.txn.handle in gids)
        handles = set(gids)
        if self.mode == "upsert":
            markers = self._markers(gids.values())
            handles = {h for h, g in gids.items() if g not in markers}
        with self._session() as cur:
            cur.execute(sql.SQL("DELETE FROM {} WHERE _ckpt_handle = ANY(%s)").format(sql.Identifier(*self.staged)),
                        (list(handles),))
            cur.execute(sql.SQL("DELETE FROM {} WHERE pipeline = %s AND sink = %s AND handle = ANY(%s)").format(
                self._id(FLUSHES)), (self.pipeline, self.name, list(handles)))

    def discard(self, txns: Iterable[Transaction]) -> None:
        """After ``txns`` committed: forget their staged flushes and an append sink's staged copies
        (the target holds the rows; their markers stay: they prove the commit to a recovery that
        re-commits them). Idempotent."""
        from psycopg2 import sql

        handles = [t.handle for t in txns]
        if not handles:
            return
        with self._session() as cur:
            if self.mode == "append":
                cur.execute(sql.SQL("DELETE FROM {} WHERE _ckpt_handle = ANY(%s)").format(
                    sql.Identifier(*self.staged)), (handles,))
            cur.execute(sql.SQL("DELETE FROM {} WHERE pipeline = %s AND sink = %s AND handle = ANY(%s)").format(
                self._id(FLUSHES)), (self.pipeline, self.name, handles))

    def open_transactions(self) -> list[Transaction]:
        """Every transaction with an id prepared or flushes staged, of every epoch: recovery
        re-commits those the restored checkpoint owns and aborts the rest (a zombie's included)."""
        from psycopg2 import sql

        found: dict[str, Transaction] = {p.txn.handle: p.txn for p in self.prepared()}
        with self._session(autocommit=True) as cur:
            cur.execute(sql.SQL("SELECT DISTINCT handle FROM {} WHERE pipeline = %s AND sink = %s").format(
                self._id(FLUSHES)), (self.pipeline, self.name))
            for (handle,) in cur.fetchall():
                found.setdefault(handle, Transaction.from_handle(handle))
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


def _add_missing(cur, table: str, name: str, statement, what: str) -> None:
    """Run ``statement`` (adding column or index ``name`` to ``table``) unless ``table`` has it;
    refused at once, not waited for, when a transaction holds the table (a prepared one holds it
    until it commits)."""
    from psycopg2 import errors

    cur.execute("SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = %s AND NOT attisdropped "
                "UNION ALL SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE i.indrelid = to_regclass(%s) AND c.relname = %s", (table, name, table, name))
    if cur.fetchone() is not None:
        return
    try:
        cur.execute("SET lock_timeout = '5s'")
        cur.execute(statement)
    except (errors.DuplicateColumn, errors.DuplicateTable, errors.DuplicateObject):
        pass  # a racing creator made it first
    except errors.LockNotAvailable:
        raise PostgresConfigurationError(
            f"{what}: cannot add {name} to {table}, which a prepared transaction (of an earlier version of the sink) "
            "holds: run the pipeline once with that version to commit it, or roll it back "
            "(ROLLBACK PREPARED), then start again") from None
    finally:
        cur.execute("RESET lock_timeout")


def _server(uri: str) -> tuple[str, int]:
    parts = urlsplit(uri)
    return parts.hostname or "localhost", parts.port or 5432


def _index_name(table: str, what: str) -> str:
    """An index's name from its table's (cut to PostgreSQL's length with a hash, never silently)."""
    name = f"{table}_{what}"
    if len(name.encode()) <= _MAX_NAME:
        return name
    import hashlib

    return f"{name.encode()[:_MAX_NAME - 9].decode(errors='ignore')}_{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def _same_type(have: tuple[str, Any, Any], want: str) -> bool:
    data_type, precision, scale = have
    if want.startswith("numeric"):
        m = re.match(r"numeric\((\d+)\s*,\s*(\d+)\)", want)
        return data_type == "numeric" and (m is None or (int(m[1]), int(m[2])) == (precision, scale))
    aliases = {"timestamp": "timestamp without time zone"}
    return data_type == aliases.get(want, want)


def _postgres_sink(declaration: PostgresSink, site: SinkSite) -> PostgresTwoPhaseSink:
    server_sinks = [(n, d, p) for n, d, p in site.sinks if isinstance(d, PostgresSink)]
    return PostgresTwoPhaseSink(site.spark, site.name, declaration, pipeline_of(site.app_prefix),
                                check_epoch=site.check_epoch, parallelism=site.parallelism or 1,
                                kill_points=site.kill_points, pending=site.pending_checkpoints,
                                server_sinks=server_sinks)


register_sink(PostgresSink, _postgres_sink)

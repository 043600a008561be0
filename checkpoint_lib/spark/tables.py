"""Small Delta helpers shared by the Spark adapters."""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import contextlib
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..delta.log import clear_abandoned_creation, is_delta_table
from ..objectstore import is_remote

log = logging.getLogger(__name__)
R = TypeVar("R")
CONFLICT_ATTEMPTS = 6

EPOCH_SHIFT = 32
"""A fenced write's Delta transaction version is ``epoch << EPOCH_SHIFT | sequence``."""
_SEQUENCE = (1 << EPOCH_SHIFT) - 1
_SESSION_CONF_LOCK = threading.RLock()


def struct_type(columns: Mapping[str, str] | Iterable[tuple[str, str]]) -> T.StructType:
    """A Spark schema from ``{name: "type"}`` (or ``(name, type)`` pairs) as pipelines declare them
    (Spark SQL type strings: ``"string"``, ``"long"``, ``"decimal(18,2)"``); every field nullable."""
    pairs = columns.items() if isinstance(columns, Mapping) else columns
    return T.StructType([T.StructField(n, T._parse_datatype_string(t), True) for n, t in pairs])


LITERAL_ENTRIES = 64
"""Up to this many entries a small table a plan looks rows up in is a :func:`literal_map`; a larger
one is joined by broadcast (a Spark job each time the plan runs, but no search key by key)."""


def literal_map(entries: Mapping[Any, Sequence[Any]], key_type: str, values: T.StructType) -> Column:
    """A map literal from each key of ``entries`` (cast to ``key_type``) to a struct of its values
    (named and typed by ``values``): a small table looked up inside a plan
    (``literal_map(...)[column]``, null for a key it lacks), where a broadcast join would cost a
    Spark job each time the plan runs. Searched key by key: for tens of entries, not thousands."""
    return F.create_map(*[part for key, row in entries.items() for part in (
        F.lit(key).cast(key_type),
        F.struct(*[F.lit(v).cast(f.dataType).alias(f.name) for f, v in zip(values.fields, row, strict=True)]))])


def looked_up(df: DataFrame, key: Column, entries: Mapping[Any, Sequence[Any]], key_type: str,
              values: T.StructType) -> tuple[DataFrame, Column]:
    """``df`` and a column holding, for each row, the struct of values ``entries`` has for its
    ``key`` (null for a key it lacks): a :func:`literal_map` for up to :data:`LITERAL_ENTRIES`
    entries, a broadcast left join beyond (its key and value columns under temporary names). A
    condition inside ``key`` (``F.when``) keeps what it guards from being computed for other rows."""
    if 0 < len(entries) <= LITERAL_ENTRIES:
        return df, literal_map(entries, key_type, values)[key]
    from uuid import uuid4

    from ..reserved import temporary

    k, v = temporary(f"key_{uuid4().hex[:8]}"), temporary(f"found_{uuid4().hex[:8]}")
    table = df.sparkSession.createDataFrame(
        [(key_value, tuple(row)) for key_value, row in entries.items()],
        T.StructType([T.StructField(k, T._parse_datatype_string(key_type)), T.StructField(v, values)]))
    return df.join(F.broadcast(table), key == F.col(k), "left").drop(k), F.col(v)


def fenced_version(epoch: int, sequence: int) -> int:
    """The Delta idempotent-write version of a write by ``epoch``: Delta skips a write whose
    version is not above the table's version for the same application id, so once an epoch's
    write (or fence) landed, every write of an older epoch is skipped INSIDE its own commit (and one
    racing it conflicts on the application id, retries, and is skipped then)."""
    if not 0 <= sequence <= _SEQUENCE or epoch < 0:
        raise ValueError(f"cannot stamp epoch {epoch}, sequence {sequence}")
    return epoch << EPOCH_SHIFT | sequence


def split_version(version: int | None) -> tuple[int, int]:
    """``(epoch, sequence)`` of a stamp (``(-1, -1)``: none). A stamp below ``1 << EPOCH_SHIFT``
    (one written before epochs were part of it) is epoch 0."""
    if version is None:
        return -1, -1
    return int(version) >> EPOCH_SHIFT, int(version) & _SEQUENCE


def stamp_of(path: str, app_id: str) -> int | None:
    """The table's Delta transaction version for ``app_id`` (None: no table, or never stamped)."""
    from deltalake import DeltaTable

    if not is_delta_table(path):
        return None
    version = DeltaTable(path).transaction_version(app_id)
    return None if version is None else int(version)


def refuse_if_fenced(path: str, have: int | None, epoch: int) -> None:
    """Before a commit by ``epoch`` on a snapshot whose stamp is ``have``: raise
    :class:`~checkpoint_lib.core.errors.FencedError` when a newer epoch stamped it (a zombie's commit)."""
    from ..core.errors import FencedError

    have_epoch = split_version(have)[0]
    if have_epoch > epoch:
        raise FencedError(f"{path}: epoch {epoch} is fenced: epoch {have_epoch} has taken over "
                          "(a zombie of an older attempt: its commit was refused)")


def stamped_commit(path: str, app_id: str, actions: list, decide: Callable[[int], int | None], *,
                   epoch: int | None = None, attempts: int = 20, what: str = "") -> int | None:
    """Commit ``actions`` (delta-rs add actions; none: a stamp alone) to table ``path`` with a stamp
    for ``app_id``, as a compare-and-swap: on each snapshot, ``decide(its stamp, -1 for none)`` gives
    the stamp to commit, or None for nothing to do; with ``epoch``, a stamp of a newer epoch refuses
    first (:class:`FencedError`: a zombie's commit). The commit lands exactly on the snapshot that
    decided (no retries inside delta-rs), else the next snapshot decides again. Returns the stamp
    committed, or None."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties
    from deltalake.transaction import Transaction as AppTransaction

    from ..core.cas import commit_on_snapshot

    def attempt(dt: DeltaTable) -> int | None:
        have = dt.transaction_version(app_id)
        if epoch is not None:
            refuse_if_fenced(path, have, epoch)
        version = decide(-1 if have is None else int(have))
        if version is None:
            return None
        dt.create_write_transaction(
            actions, mode="append", schema=dt.schema(),
            commit_properties=CommitProperties(app_transactions=[AppTransaction(app_id, version)],
                                               max_commit_retries=0),
        )
        return version

    committed, _ = commit_on_snapshot(
        lambda: DeltaTable(path), attempt, lost=CommitFailedError, attempts=attempts,
        exhausted=lambda n: ConcurrentWriterError(f"{what or path}: {n} attempts to commit to {path} lost to concurrent writers"))
    return committed


@contextmanager
def session_confs(spark: SparkSession, confs: Mapping[str, str]) -> Iterator[None]:
    """Set the session settings ``confs`` for the commands run inside, then put back the caller's.
    Session settings are shared by every thread of the session: one such block at a time."""
    with _SESSION_CONF_LOCK:
        conf = spark.conf
        previous = {key: conf.get(key, None) for key in confs}
        for key, value in confs.items():
            conf.set(key, value)
        try:
            yield
        finally:
            for key, value in previous.items():
                if value is None:
                    conf.unset(key)
                else:
                    conf.set(key, value)


def stamped(spark: SparkSession, app_id: str, version: int) -> "contextlib.AbstractContextManager[None]":
    """Stamp the DML commands (MERGE, DELETE) run inside with Delta's idempotent-write transaction
    ``(app_id, version)``: a session setting, so one stamped command at a time per session."""
    return session_confs(spark, {"spark.databricks.delta.write.txnAppId": app_id,
                                 "spark.databricks.delta.write.txnVersion": str(version)})


def raise_fence(spark: SparkSession, path: str, app_id: str, epoch: int, sequence: int | None = None) -> int:
    """Fence table ``path`` for ``epoch``: one empty commit stamped ``(app_id, fenced_version(epoch,
    s))`` (``s``: ``sequence``, default the current stamp's), after which every write of an older
    epoch stamped with ``app_id`` is refused inside its commit. Idempotent. Raises
    :class:`~checkpoint_lib.core.errors.FencedError` if a newer epoch fenced it first. Returns the
    stamp's sequence. The table must exist. The commit is a delta-rs compare-and-swap of the stamp
    alone when the table's protocol allows it (:func:`_stamp_alone_by_delta_rs`: the state table,
    deletion vectors and all), else a stamped empty Spark append."""
    from ..core.errors import FencedError

    if _stamp_alone_by_delta_rs(path):  # a compare-and-swap of the stamp alone: milliseconds, no Spark job
        decided: list[int] = []

        def decide(have: int) -> int | None:
            have_epoch, have_seq = split_version(None if have < 0 else have)
            seq = max(have_seq, 0) if sequence is None else sequence
            decided[:] = [have_seq if have_epoch == epoch and have_seq >= seq else seq]
            return None if have_epoch == epoch and have_seq >= seq else fenced_version(epoch, seq)

        stamped_commit(path, app_id, [], decide, epoch=epoch, what=f"fence of {path} for epoch {epoch}")
        return decided[0]

    def once() -> int:
        have_epoch, have_seq = split_version(stamp_of(path, app_id))
        if have_epoch > epoch:
            raise FencedError(f"{path}: epoch {epoch} is fenced: epoch {have_epoch} has taken over")
        seq = max(have_seq, 0) if sequence is None else sequence
        if have_epoch == epoch and have_seq >= seq:
            return have_seq
        schema = spark.read.format("delta").load(path).schema
        (
            spark.createDataFrame([], schema).write.format("delta").mode("append")
            .option("txnAppId", app_id).option("txnVersion", str(fenced_version(epoch, seq))).save(path)
        )
        check_not_fenced(path, app_id, epoch)
        return seq

    return retry_conflicts(once, f"fence of {path} for epoch {epoch}")


STAMP_ALONE_WRITER_FEATURES = frozenset({"appendOnly", "invariants", "timestampNtz", "deletionVectors"})
"""Writer features a commit of a stamp alone (a ``txn`` action, no data) honours by construction:
it adds and removes no file, so no row, deletion vector or constraint is touched."""

FILE_ADD_WRITER_FEATURES = STAMP_ALONE_WRITER_FEATURES
"""Writer features a delta-rs commit adding whole new files (an append sink's, a keyed state run)
honours: it adds files with no deletion vector and removes nothing. ``invariants`` (NOT NULL
columns) are the writer's to keep: Spark does not check them in a plain Parquet write."""


def files_commit_problem(dt, partitioned_by: Sequence[str] = ()) -> str | None:
    """Why a delta-rs commit may not add Parquet files Spark wrote with the table's schema to the
    delta-rs table ``dt`` (None: it may): partition columns other than ``partitioned_by`` (what the
    writer gives each file's add action the values of), column mapping (other physical names) or
    a writer feature it does not honour."""
    if list(dt.metadata().partition_columns) != list(partitioned_by):
        return f"it is partitioned by {dt.metadata().partition_columns}"
    if (dt.metadata().configuration or {}).get("delta.columnMapping.mode", "none") != "none":
        return "it maps column names (delta.columnMapping.mode)"
    return writer_protocol_problem(dt.protocol(), FILE_ADD_WRITER_FEATURES)


def writer_protocol_problem(protocol, honoured: Iterable[str]) -> str | None:
    """Why a delta-rs commit that honours only the writer features ``honoured`` may not write a
    table with writer ``protocol`` (None: it may): a writer version above 2 other than 7, or a
    writer feature outside ``honoured``."""
    if protocol.min_writer_version <= 2:
        return None
    if protocol.min_writer_version != 7:
        return f"its writer protocol is version {protocol.min_writer_version}"
    beyond = set(protocol.writer_features or []) - set(honoured)
    return f"it uses the writer features {sorted(beyond)}" if beyond else None


def _stamp_alone_by_delta_rs(path: str) -> bool:
    """Whether delta-rs may commit a stamp alone to ``path``: its protocol asks for nothing beyond
    :data:`STAMP_ALONE_WRITER_FEATURES` (the state table's deletion vectors among them); else the
    fence is a stamped empty Spark append."""
    from deltalake import DeltaTable

    return writer_protocol_problem(DeltaTable(path).protocol(), STAMP_ALONE_WRITER_FEATURES) is None


def check_not_fenced(path: str, app_id: str, epoch: int) -> None:
    """After a stamped write by ``epoch``: raise :class:`~checkpoint_lib.core.errors.FencedError`
    if the table's stamp names a newer epoch (Delta then skipped our write: nothing of it landed)."""
    from ..core.errors import FencedError

    have_epoch, _ = split_version(stamp_of(path, app_id))
    if have_epoch > epoch:
        raise FencedError(
            f"{path}: epoch {epoch} is fenced: epoch {have_epoch} has taken over (this is a zombie of an "
            "older attempt; Delta refused its write inside the commit, nothing of it landed)"
        )


class ConcurrentWriterError(RuntimeError):
    """Another writer kept changing a table we write (OPTIMIZE, a foreign append or MERGE) and every
    attempt of ours conflicted with it. Nothing of the last attempt was committed."""


def conflict_types() -> tuple[type, ...]:
    """Delta's optimistic-concurrency conflicts, as PySpark raises them. Delta throws them before
    the commit file is written: the losing transaction committed nothing, so trying it again on the
    new snapshot is safe."""
    from delta.exceptions import (
        ConcurrentAppendException, ConcurrentDeleteDeleteException, ConcurrentDeleteReadException,
        ConcurrentTransactionException, ConcurrentWriteException, DeltaConcurrentModificationException,
        MetadataChangedException, ProtocolChangedException,
    )

    return (ConcurrentAppendException, ConcurrentDeleteDeleteException, ConcurrentDeleteReadException,
            ConcurrentTransactionException, ConcurrentWriteException, DeltaConcurrentModificationException,
            MetadataChangedException, ProtocolChangedException)


def retry_conflicts(write: Callable[[], R], what: str, *, before_retry: Callable[[], None] | None = None,
                    attempts: int | None = None) -> R:
    """Run ``write`` (one Delta transaction, planned afresh on every call), again after a Delta
    conflict, with jittered backoff (0.2 s doubling). ``before_retry`` runs before every retry (the
    epoch fence: a zombie must not win by retrying). After ``attempts`` (default
    :data:`CONFLICT_ATTEMPTS`) conflicts raise :class:`ConcurrentWriterError`, which names
    ``what`` and the concurrent writer's conflict."""
    conflicts = conflict_types()
    attempts = CONFLICT_ATTEMPTS if attempts is None else attempts
    for attempt in range(1, attempts + 1):
        if attempt > 1 and before_retry is not None:
            before_retry()
        try:
            return write()
        except conflicts as exc:
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            if attempt == attempts:
                raise ConcurrentWriterError(
                    f"{what}: {attempts} attempts conflicted with a concurrent writer of the table "
                    f"({type(exc).__name__}: {first}). Nothing of the last attempt was committed; running "
                    "again retries it (our writes are idempotent or restored on recovery). Schedule OPTIMIZE "
                    "and other writers of this table outside the pipeline's commits."
                ) from exc
            message = f"{what}: conflict with a concurrent writer ({type(exc).__name__}), attempt {attempt} of {attempts}"
            log.warning(message)
            time.sleep(0.2 * 2 ** (attempt - 1) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def create_if_missing(
    spark: SparkSession, path: str, schema: T.StructType, partition_by: list[str] | None = None,
    properties: dict[str, str] | None = None,
) -> None:
    """Create an empty Delta table at ``path`` unless one exists, with the table ``properties``
    (``delta.*`` settings) given. Idempotent and race-safe: two creators racing both end with the
    table (the loser's commit of version 0 fails). An existing table keeps its own properties; what
    a creation killed before its first commit left is cleared first."""
    if is_delta_table(path):
        return
    clear_abandoned_creation(path)  # a creation killed before its first commit: Spark would see a table
    if not is_remote(path):  # an object store has no folders to make
        os.makedirs(os.path.dirname(path.rstrip("/")) or ".", exist_ok=True)
    from delta.tables import DeltaTable

    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
    if partition_by:
        builder = builder.partitionedBy(*partition_by)
    for key, value in (properties or {}).items():
        builder = builder.property(key, value)
    try:
        builder.execute()
    except Exception:
        if not is_delta_table(path):
            raise


Bounds = Mapping[str, tuple[int | None, int | None]]
"""Column -> closed range ``(lo, hi)`` of its values (``None``: unbounded on that side)."""


def delete_where(spark: SparkSession, path: str, condition: Column, *, what: str) -> None:
    """DELETE the rows matching ``condition`` (idempotent: deleting what is gone deletes nothing),
    planned again after a Delta conflict (a user's OPTIMIZE of the table, say: :func:`retry_conflicts`,
    which names ``what``). No-op on a missing table."""
    if not is_delta_table(path):
        return
    from delta.tables import DeltaTable

    retry_conflicts(lambda: DeltaTable.forPath(spark, path).delete(condition), what)


def delete_within(spark: SparkSession, path: str, bounds: Bounds, *, what: str) -> None:
    """:func:`delete_where` the rows whose every column of ``bounds`` lies in its range; with no
    Spark job at all when the files' statistics show that none can (:func:`may_hold`): the DELETE
    Delta would run on this snapshot deletes nothing then. A truncation with nothing to truncate (a
    log at a first start, or already consumed) costs milliseconds instead of a Spark job."""
    if not may_hold(path, bounds):
        return
    condition = None
    for column, (lo, hi) in bounds.items():
        for part in ((F.col(column) >= lo) if lo is not None else None, (F.col(column) <= hi) if hi is not None else None):
            if part is not None:
                condition = part if condition is None else condition & part
    delete_where(spark, path, F.lit(True) if condition is None else condition, what=what)


def remove_files_within(path: str, bounds: Bounds, *, what: str) -> bool:
    """Remove from the Delta table at ``path`` every file whose statistics show that all its rows
    lie within ``bounds``, in one delta-rs commit of remove actions: no Spark job, nothing
    rewritten, where Delta's DELETE rebuilds the snapshot, scans and rewrites in Spark jobs. A file
    with rows on both sides of a bound (steps a user's OPTIMIZE compacted together) or without
    statistics for a column of ``bounds`` stays: for rows nothing reads again, whose removal only
    keeps the table small. A commit racing ours that removed some of the same files (that OPTIMIZE,
    their rows now in its files) makes our removes of them change nothing (delta-rs commits them;
    were it to refuse, nothing would be removed this time, logged: the next call retries). False, with
    nothing done, when delta-rs may not remove files of the table (:func:`files_commit_problem`,
    or a deletion vector on a file, which a remove must name) or the log keeps no statistics of a
    column of ``bounds`` (a user's ``delta.dataSkippingNumIndexedCols``): the caller deletes through Delta."""
    if not is_delta_table(path):
        return True
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import RemoveAction

    dt = DeltaTable(path)
    parts = list(dt.metadata().partition_columns)
    if files_commit_problem(dt, partitioned_by=parts) is not None or any(b.num_rows for b in dt.deletion_vectors()):
        return False
    actions = dt.get_add_actions(flatten=True)
    if any(f"{stat}.{c}" not in actions.schema.names for c in bounds for stat in ("min", "max")):
        return False  # no statistics for a bound's column (a user's table property): Delta's DELETE
    within = _per_file(actions, bounds, _lies_within)
    if not any(within):
        return True
    now = int(time.time() * 1000)
    columns = {c: actions.column(f"partition.{c}").to_pylist() for c in parts}
    removes = [RemoveAction(p, True, now, size, {c: _partition_value(columns[c][i]) for c in parts} if parts else None)
               for i, (p, size) in enumerate(zip(actions.column("path").to_pylist(),
                                                  actions.column("size_bytes").to_pylist())) if within[i]]
    try:
        dt.create_write_transaction(removes, mode="append", schema=dt.schema(), partition_by=parts or None)
    except CommitFailedError as exc:
        log.info("%s: a concurrent commit removed some of its files first; nothing removed this time (%s)", what, exc)
    return True


def _partition_value(value: Any) -> str | None:
    """A partition value as the log spells it (delta-rs lists them typed)."""
    return None if value is None else str(value)


def may_hold(path: str, bounds: Bounds) -> bool:
    """Whether a file of the Delta table at ``path`` may hold a row whose every column of ``bounds``
    lies in its range, judged by the files' min/max statistics in the log (delta-rs: no Spark job).
    A file without statistics for such a column may; a missing table holds nothing."""
    if not is_delta_table(path):
        return False
    from deltalake import DeltaTable

    return any(_may_hold_each(DeltaTable(path).get_add_actions(flatten=True), bounds))


def _may_hold_each(actions: Any, bounds: Bounds) -> list[bool]:
    """Per file of delta-rs's flattened add actions ``actions``: whether its min/max statistics
    allow a row whose every column of ``bounds`` lies in its range (no statistics: it may)."""
    return _per_file(actions, bounds, _may_lie_within)


def _may_lie_within(low: Any, high: Any, nulls: int | None, lo: Any, hi: Any) -> bool:
    """A file whose column spans ``low``..``high`` may hold a value in ``lo``..``hi`` (a missing
    statistic or bound rules nothing out)."""
    return not ((lo is not None and high is not None and high < lo) or (hi is not None and low is not None and low > hi))


def _lies_within(low: Any, high: Any, nulls: int | None, lo: Any, hi: Any) -> bool:
    """Every value of a file's column (``low``..``high``, ``nulls`` of them null) lies in
    ``lo``..``hi``: known only with both statistics and no null (a null lies in no range)."""
    return (low is not None and high is not None and nulls == 0
            and (lo is None or low >= lo) and (hi is None or high <= hi))


def _per_file(actions: Any, bounds: Bounds, rule: Callable[[Any, Any, int | None, Any, Any], bool]) -> list[bool]:
    """Per file of delta-rs's flattened add actions ``actions``: whether ``rule`` holds for its
    statistics of every column of ``bounds`` (its min, max and null count, each None where the file
    has none); a column the log keeps no min/max statistics of rules nothing out (a caller for whom
    that must mean "unknown" checks the columns first, as :func:`remove_files_within` does). The
    one reading of a file's statistics, for "may hold a row within" and "holds only rows within"."""
    names = set(actions.schema.names)
    result = [True] * actions.num_rows
    for column, (lo, hi) in bounds.items():
        if f"min.{column}" not in names or f"max.{column}" not in names:
            continue
        nulls = (actions.column(f"null_count.{column}").to_pylist() if f"null_count.{column}" in names
                 else [None] * actions.num_rows)
        for i, (low, high, n) in enumerate(zip(actions.column(f"min.{column}").to_pylist(),
                                               actions.column(f"max.{column}").to_pylist(), nulls)):
            if not rule(low, high, n, lo, hi):
                result[i] = False
    return result


def files_read(spark: SparkSession, path: str, version: int | None = None,
               bounds: Bounds | None = None) -> DataFrame:
    """The rows of the Delta table at ``path`` at ``version`` (None: the latest), its Parquet files
    read directly as the log lists them (delta-rs, on the driver): what Delta's own read returns,
    without the Spark jobs in which it rebuilds the table's snapshot at every new version (and
    chooses its files). With ``bounds``, only the files whose statistics allow a row within them
    (:func:`may_hold`; the caller still filters the rows). A partition column's value comes from
    the file's add action (the files do not hold it). Where the files do not hold the rows as they
    are (deletion vectors, column mapping) or delta-rs cannot read the log, Delta's own read."""
    direct = _listed_files_read(spark, path, version, bounds)
    if direct is not None:
        return direct
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(path)


def _listed_files_read(spark: SparkSession, path: str, version: int | None, bounds: Bounds | None) -> DataFrame | None:
    """:func:`files_read` from the files delta-rs lists; None where Delta must read."""
    try:
        import json

        from deltalake import DeltaTable

        table = DeltaTable(path) if version is None else DeltaTable(path, version=version)
        metadata = table.metadata()
        if (metadata.configuration or {}).get("delta.columnMapping.mode", "none") != "none":
            return None
        if any(batch.num_rows for batch in table.deletion_vectors()):
            return None
        schema = T.StructType.fromJson(json.loads(table.schema().to_json()))
        uris = table.file_uris()
        parts = list(metadata.partition_columns)
        if bounds or parts:
            actions = table.get_add_actions(flatten=True)
            paths = actions.column("path").to_pylist()
            if len(paths) != len(uris) or any(not uri.endswith(p) for uri, p in zip(uris, paths)):
                return None  # not the same files in the same order: let Delta read it
            keep = _may_hold_each(actions, bounds or {})
            values = list(zip(*(actions.column(f"partition.{c}").to_pylist() for c in parts))) if parts else [()] * len(uris)
            chosen = [(uri, value) for uri, value, kept in zip(uris, values, keep) if kept]
        else:
            chosen = [(uri, ()) for uri in uris]
    except Exception:  # noqa: BLE001 - any reason delta-rs cannot list them: Delta reads the table
        return None
    if not chosen:
        return spark.createDataFrame([], schema)
    from .paths import spark_path

    if not parts:
        return spark.read.schema(schema).parquet(*(spark_path(uri) for uri, _ in chosen))
    stored = T.StructType([f for f in schema.fields if f.name not in parts])
    frames = []
    for value in sorted({v for _, v in chosen}, key=repr):
        df = spark.read.schema(stored).parquet(*(spark_path(uri) for uri, v in chosen if v == value))
        for column, held in zip(parts, value):
            df = df.withColumn(column, F.lit(held).cast(schema[column].dataType))
        frames.append(df.select(*schema.fieldNames()))
    out = frames[0]
    for df in frames[1:]:
        out = out.unionByName(df)
    return out


def blind_append(df: DataFrame, path: str, partition_by: str | None = None) -> None:
    """``df`` (the table's columns, with its types) appended to the Delta table at ``path`` in ONE
    commit that reads nothing of the table: one Spark job writes its Parquet files into the table's
    folder (:data:`~checkpoint_lib.layout.PENDING_FOLDER`, where nothing refers to them yet), one
    delta-rs commit adds those holding rows (``partition_by``: the table's one partition column,
    each file's value from the folder Spark wrote it in). Delta's own append rebuilt the table's
    snapshot in Spark jobs at every append. Only for rows no decision depends on the table's
    content for (delta-rs retries the commit on a racing one); a table delta-rs may not add files
    to (:func:`files_commit_problem`) takes Delta's append."""
    import uuid

    from deltalake import DeltaTable
    from deltalake.transaction import AddAction

    from ..delta.pending import describe_written, files_with_rows
    from ..files import files_at
    from ..layout import PENDING_FOLDER, location

    dt = DeltaTable(path)
    parts = () if partition_by is None else (partition_by,)
    if files_commit_problem(dt, partitioned_by=parts) is not None:
        df.write.format("delta").mode("append").save(path)
        return
    written = f"{path}/{PENDING_FOLDER}/w-{uuid.uuid4().hex}"
    writer = df.write if partition_by is None else df.write.partitionBy(partition_by)
    writer.parquet(written)
    folder = location(written)
    if partition_by is None:
        folders = [(folder, {})]
    else:
        describe_written(folder, path)  # Spark's markers removed
        prefix = f"{partition_by}="
        folders = [(folder / name, {partition_by: name[len(prefix):]})
                   for name in files_at(folder).names(folder) if name.startswith(prefix)]
    actions = [AddAction(f.path, f.size, value, f.modification_time, True, f.stats)
               for where, value in folders for f in files_with_rows(where, path)]
    if actions:
        dt.create_write_transaction(actions, mode="append", schema=dt.schema(), partition_by=list(parts) or None)


def version(spark: SparkSession, path: str) -> int:
    from ..delta.log import latest_version

    v = latest_version(path)
    if v is None:
        raise FileNotFoundError(f"no Delta table at {path}")
    return v


def columns_of(path: str, nested: str | None = None) -> dict[str, str] | None:
    """The top-level columns of the Delta table at ``path`` (or the fields of its struct column
    ``nested``), name -> type name (``struct`` for a struct; None: no table there), from its log
    (delta-rs), with no Spark job."""
    if not is_delta_table(path):
        return None
    from deltalake import DeltaTable

    fields = DeltaTable(path).schema().fields
    if nested is not None:
        fields = next((f.type.fields for f in fields if f.name == nested and hasattr(f.type, "fields")), [])
    return {f.name: str(getattr(f.type, "type", f.type)) for f in fields}

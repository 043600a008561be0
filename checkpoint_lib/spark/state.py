"""Keyed state in a Delta table, by key group, kept as appended runs.

A subtask's state is the keys of the key groups it owns. A flush appends one **run**: the new row
of every key it changed (added to, :meth:`KeyedStateTable.add`; or replaced, and deleted by a
tombstone, :meth:`KeyedStateTable.replace`), each row stamped with the run's number
(:data:`~checkpoint_lib.reserved.STATE_RUN`, the table version the run is meant to land at), in
one Delta commit fenced by the epoch. A key's state is the row of its newest run unless that is a
tombstone (:func:`live`), so a flush writes what changed, never the rest of the state, and reads
only its own keys' rows (:meth:`KeyedStateTable.read_keys`). Once the runs since the last
compaction hold as many rows as the table held then, a compaction folds them (one row per key,
each keeping its run; an overwrite that changes no state, fenced like a flush), so reading stays
within twice the state and each changed row costs O(1) on average.

A snapshot costs nothing: it is the table version after the subtask's last flush before its
barrier, plus its key-group range (:class:`~checkpoint_lib.core.acks.PinnedState`, in the
subtask's ack). Restore rebuilds the table from those versions (time travel): nothing to do when
every subtask snapshotted one version and no commit since changed the state (a kill before the
next flush; a compaction changes none), otherwise each subtask's key groups of the state at its
own version, written by one stamped overwrite (a RESTORE outside a recovery, when one version
covers all). The snapshot is never a copy; old versions stay readable until the table is vacuumed,
which must therefore keep what retained checkpoints pin.

State with a TTL (:class:`~checkpoint_lib.pipeline.StateTtl`): each row keeps its write time, and
each flush's commit its :class:`TtlMarks` (the operator's newest write and the flush's run), so
the rows its cleanup drops are hidden from every later flush at once and dropped by the next
compaction, whatever the flushes and compactions in between: a replay cleans up what the
failure-free run did.
"""

from __future__ import annotations

from datetime import datetime
from functools import reduce
from typing import Any, Callable, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..core.acks import PinnedState
from ..core.keygroups import DEFAULT_MAX_PARALLELISM
from ..delta.ttl_marks import TtlMarks, marks_at
from ..layout import KEY_GROUP
from ..pipeline import DELETE, TTL_COLUMN, StateTtl
from ..reserved import STATE_GONE, STATE_RUN, temporary
from . import tables

FIRST_RECORD = temporary("ttl_first")
"""In the rows a flush hands to a MERGE of state with a TTL: the event time of the key's earliest
record in the flush (what decides whether its stored state expired)."""


class StateTableChangedError(RuntimeError):
    """Another writer changed a keyed state table's rows (a RESTORE, an append, a DELETE or an
    overwrite of the table under the checkpoint root) after the version a flush read: the flush's
    run would mix the two. Raised before the run is appended when seen then (nothing written), or
    just after it when the change raced it; either way the next run finds the table moved past where
    it stopped and recovers: the latest completed checkpoint's state version is restored (it is
    still in the table's history) and what came after it is replayed."""


class StateFilesLostError(RuntimeError):
    """The files of a keyed state version a checkpoint's snapshot pins are gone (a VACUUM below the
    state table's retention, after an OPTIMIZE or a fold rewrote them): that state cannot be restored."""


def expired(written: F.Column, first_record: F.Column, ttl: StateTtl) -> F.Column:
    """Whether state written at ``written`` is expired for a flush whose earliest record of the
    key is at ``first_record`` (false when either is unknown): the one definition of expiry."""
    late = written + F.expr(f"INTERVAL {ttl.ttl_seconds} SECONDS") < first_record
    return F.coalesce(late, F.lit(False))

def apply_with_ttl(apply: Callable[[DataFrame], tuple[Any, Any]], records: Sequence[DataFrame], stored: DataFrame,
                   key: str, ttl: StateTtl, cached: Callable[[DataFrame], DataFrame],
                   newest_before: datetime | None = None) -> tuple[Any, Any, datetime | None]:
    """Run a keyed operator (``apply(visible state) -> (state rows, outputs)``) on state that
    expires in event time (:class:`~checkpoint_lib.pipeline.StateTtl`), over the flush's
    ``records`` (one DataFrame per input: a two-input operator's both) and the ``stored`` state of
    their keys (key, state columns and :data:`TTL_COLUMN`). The operator sees no state for a key
    written more than the TTL before the key's earliest record here; the state rows it returns
    carry the write time (the key's newest record) and that earliest record (:data:`FIRST_RECORD`)
    for the flush's write; and the third value is the operator's newest write after this flush
    (``newest_before``, the one before it, and this flush's records: one Spark job over the
    flush's keys), from which the cleanup follows (:class:`TtlMarks`). The one definition of TTL
    in a flush, for every keyed vertex of a graph."""
    times = reduce(DataFrame.unionByName, [r.select(key, ttl.time_column) for r in records])
    times = cached(times.groupBy(key).agg(F.min(ttl.time_column).alias(FIRST_RECORD),
                                          F.max(ttl.time_column).alias(TTL_COLUMN)))
    visible = (stored.join(times.select(key, FIRST_RECORD), key, "left")
               .where(~expired(F.col(TTL_COLUMN), F.col(FIRST_RECORD), ttl))
               .drop(FIRST_RECORD, TTL_COLUMN))
    deltas, outputs = apply(visible)
    here = times.agg(F.max(TTL_COLUMN)).first()[0]
    newest = max((t for t in (newest_before, here) if t is not None), default=None)
    return deltas.join(times, key, "left"), outputs, newest


# A flush's MERGE touches keys spread over every file of the table. Without deletion vectors Delta
# rewrites each touched file whole, so every checkpoint would rewrite the whole state; with them it
# marks the replaced rows and writes only the changed ones, so what a checkpoint writes follows what
# changed. Time travel, RESTORE and overwrite all honour them. (delta-rs reads such a table's log but
# not its rows; nothing here reads state rows outside Spark.)
# A snapshot is a table version read by time travel (restore is a RESTORE or a read AS OF it), and a
# savepoint pins its version for ever. Delta takes versions away in two ways: it deletes log entries
# older than ``delta.logRetentionDuration`` (30 days) whenever it writes a log checkpoint, and it
# refuses time travel past ``delta.deletedFileRetentionDuration`` (7 days; the span a VACUUM must
# leave), so a weekly pipeline could not restore its last checkpoint. The state table sets both
# beyond any savepoint's life: its log is small JSON (readers start from the latest log checkpoint),
# and a VACUUM run on it with the table's retention deletes no file a snapshot may still pin.
PINNED_RETENTION = "interval 36500 days"
STATE_TABLE_PROPERTIES = {
    "delta.enableDeletionVectors": "true",
    "delta.logRetentionDuration": PINNED_RETENTION,
    "delta.deletedFileRetentionDuration": PINNED_RETENTION,
}


def key_group_column(key: str, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> F.Column:
    """The key group of ``key``: a stable hash (xxhash64) modulo max parallelism."""
    return F.pmod(F.xxhash64(F.col(key)), F.lit(max_parallelism)).cast("int")


def subtask_column(key_group: F.Column, parallelism: int, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> F.Column:
    """The receiving subtask of a key group (same formula as core.keygroups.subtask_for_key_group)."""
    return F.floor(key_group * F.lit(parallelism) / F.lit(max_parallelism)).cast("int")


class KeyedStateTable:
    def __init__(self, spark: SparkSession, path: str, key: str, values: T.StructType, *, app_id: str | None = None,
                 key_type: T.DataType | None = None, ttl: StateTtl | None = None):
        self.spark = spark
        self.path = path
        self.ttl = ttl
        """With a TTL, ``values`` ends with :data:`TTL_COLUMN`, the rows a flush writes carry
        :data:`FIRST_RECORD` (expired state is reset, not added to: see :class:`StateTtl`), and
        every flush's commit its :class:`TtlMarks`."""
        self.app_id = app_id
        """Delta idempotent-write application id of the fence: with it, every write by an epoch is
        stamped ``epoch << 32 | next table version`` and refused inside its commit once a newer
        epoch fenced the table (:meth:`fence`)."""
        self.key = key
        self.values = values
        self.schema = T.StructType(
            [T.StructField(KEY_GROUP, T.IntegerType(), False), T.StructField(key, key_type or T.StringType(), False)]
            + list(values.fields)
            + [T.StructField(STATE_RUN, T.LongType(), True), T.StructField(STATE_GONE, T.BooleanType(), True)]
        )
        self._appended = 0  # rows appended since the table was last compacted, restored or opened
        self._base: int | None = None  # rows the table held then (None: counted before the next run)
        self._marks: dict[int, TtlMarks] = {}  # table version -> its TTL marks, as read or written

    def create(self) -> None:
        tables.create_if_missing(self.spark, self.path, self.schema, properties=STATE_TABLE_PROPERTIES)
        self.upgrade()

    def version(self) -> int:
        return tables.version(self.spark, self.path)

    # reading -------------------------------------------------------------------------------------

    def stored(self, version: int | None = None) -> DataFrame:
        """The table's rows as stored (every run's, tombstones included). Its files are read as
        the log lists them (:func:`~checkpoint_lib.spark.tables.files_read`): Delta's read rebuilt
        the table's snapshot in Spark jobs at every flush's new version, five jobs of every step; a
        table with deletion vectors (a DELETE by someone else) is read by Delta."""
        return tables.files_read(self.spark, self.path, version)

    def read(self, version: int | None = None) -> DataFrame:
        """The keyed state at ``version`` (None: the latest): one row per key (its key group, the
        key and the values)."""
        return self._visible(live(self.stored(version), self.key, keep_run=True), version)

    def read_keys(self, keys: DataFrame, version: int | None = None) -> DataFrame:
        """The state of the keys in ``keys`` (a DataFrame with the key column) at ``version``: what
        a flush of those keys reads (a keyed function sees its keys' state only, as in Flink)."""
        mine = self.stored(version).join(keys.select(self.key).distinct(), self.key, "left_semi")
        return self._visible(live(mine, self.key, keep_run=True), version)

    def _visible(self, state: DataFrame, version: int | None, keep_run: bool = False) -> DataFrame:
        """``state`` (:func:`live` rows, with the run when ``keep_run``) without what the TTL's
        cleanup took as of ``version`` (:class:`TtlMarks`)."""
        if self.ttl is not None:
            state = without_cleaned(state, self.ttl, self.marks(self.version() if version is None else version))
        return state if keep_run else state.drop(STATE_RUN, STATE_GONE)

    def marks(self, version: int) -> TtlMarks:
        """The TTL marks of the state at ``version`` (-1: none written): those of the newest commit
        at or before it that has them (a fence's commit has none); a table MERGEd before runs
        existed has none: its newest write is then read from its rows (one Spark job)."""
        if version < 0:
            return TtlMarks()
        if version not in self._marks:
            found = marks_at(self.path, version)
            if found is None:
                newest = (self.stored(version).agg(F.max(TTL_COLUMN)).first()[0]
                          if self.ttl is not None and TTL_COLUMN in self.stored(version).columns else None)
                found = TtlMarks(newest, -1)
            self._marks[version] = found
        return self._marks[version]

    def upgrade(self) -> None:
        """A state table created before runs existed (one row per key, MERGEd in place): add the
        run columns (its rows are then the oldest run). Idempotent; one metadata commit, once."""
        if STATE_RUN in self.stored().columns:
            return
        self.spark.sql(f"ALTER TABLE delta.`{self.path}` ADD COLUMNS (`{STATE_RUN}` BIGINT, `{STATE_GONE}` BOOLEAN)")

    # fences --------------------------------------------------------------------------------------

    def _fenced(self, epoch: int | None) -> None:
        if epoch is not None and self.app_id is not None:
            tables.check_not_fenced(self.path, self.app_id, epoch)

    def fence(self, epoch: int) -> None:
        """Recovery by ``epoch``, before it restores: from this commit on, every write of an older
        epoch to the state is refused inside its own Delta commit. Idempotent; FencedError if a
        newer epoch fenced it first."""
        assert self.app_id is not None, "a fenced state table needs an application id"
        tables.raise_fence(self.spark, self.path, self.app_id, epoch, self.version() + 1)

    # a flush -------------------------------------------------------------------------------------

    def add(self, deltas: DataFrame, before_retry: Callable[[], None] | None = None, *, epoch: int | None = None,
            current: DataFrame | None = None, newest: datetime | None = None) -> int:
        """Add ``deltas`` (key, key_group and one column per value) to the state (new keys start
        from them): one run appended. Returns the table version after it. With ``epoch``, the
        write is fenced inside its commit (FencedError after it if a newer epoch fenced the
        table: nothing landed). ``current``: the state of (at least) the deltas' keys as the flush
        read it (else read here). With a TTL, an expired key's state is replaced by its deltas,
        and ``newest`` is the operator's newest write after this flush (its cleanup)."""
        return self._flush(deltas, additive=True, before_retry=before_retry, epoch=epoch, current=current,
                           newest=newest)

    def replace(self, rows: DataFrame, before_retry: Callable[[], None] | None = None, *,
                epoch: int | None = None, current: DataFrame | None = None, newest: datetime | None = None) -> int:
        """Make each key of ``rows`` (key, key_group and one column per value, at most one row per
        key) hold that row; a row whose ``_delete`` column is true removes its key. Keys not in
        ``rows`` keep their state (with a TTL, unless cleaned up). One run appended, as :meth:`add`."""
        return self._flush(rows, additive=False, before_retry=before_retry, epoch=epoch, current=current,
                           newest=newest)

    def apply(self, deltas: DataFrame, *, replace: bool, before_retry: Callable[[], None], epoch: int | None,
              compact: bool = False, current: DataFrame | None = None, newest: datetime | None = None,
              reached: Callable[[str], None] | None = None, read_at: int | None = None) -> int:
        """A flush's state rows: :meth:`replace` them (``replace``) or :meth:`add` them (to
        ``current``, the state the flush read), then, with ``compact`` or once the runs appended
        since the last compaction hold as many rows as the table held then (:meth:`due`), a
        compaction (:meth:`compact`, after ``before_retry``'s epoch check): the same state in fewer
        rows and files, so a snapshot of this flush may pin either version. Returns the table
        version after both. The one flush path of every keyed operator. ``reached``: the
        process's kill points (``state_run``: the run's files written, not committed;
        ``state_compact``: the run committed, the compaction not yet).
        ``read_at``: the table version the flush read its state at (the operator's last write); a
        change of the table's rows by anyone else since is refused (:class:`StateTableChangedError`)."""
        version = self._flush(deltas, additive=not replace, before_retry=before_retry, epoch=epoch, current=current,
                              newest=newest, read_at=read_at, reached=reached)
        if compact or self.due():
            before_retry()
            if reached is not None:
                reached("state_compact")
            version = self.compact(before_retry=before_retry, epoch=epoch)
        return version

    def _flush(self, rows: DataFrame, *, additive: bool, before_retry, epoch: int | None, current: DataFrame | None,
               newest: datetime | None, read_at: int | None = None,
               reached: Callable[[str], None] | None = None) -> int:
        """One run: each key's new row (its current values plus the deltas when ``additive``,
        else the row; a tombstone for ``_delete``; with a TTL, reset when expired and stamped
        with its write time) appended."""
        names = self._operator_values()
        gone = F.coalesce(F.col(f"d.{DELETE}"), F.lit(False)) if DELETE in rows.columns else F.lit(False)
        if not additive and self.ttl is None:  # the rows are the new state: nothing to read
            out = rows.alias("d").select(F.col(f"d.{KEY_GROUP}"), F.col(f"d.{self.key}"),
                                         *[F.col(f"d.{n}") for n in names], gone.alias(STATE_GONE))
            return self._append(out, before_retry, epoch, None, read_at, reached)
        if current is None:
            current = self.read_keys(rows)
        present = temporary("present")
        kept = [*names, TTL_COLUMN] if self.ttl is not None else names
        s = current.select(self.key, *kept).withColumn(present, F.lit(True))
        joined = rows.alias("d").join(s.alias("s"), self.key, "left")
        keep = F.col(f"s.{present}").isNotNull()
        if self.ttl is not None:
            keep = keep & ~expired(F.col(f"s.{TTL_COLUMN}"), F.col(f"d.{FIRST_RECORD}"), self.ttl)
        values = [(F.when(keep, F.col(f"s.{n}") + F.col(f"d.{n}")).otherwise(F.col(f"d.{n}")) if additive
                   else F.col(f"d.{n}")).alias(n) for n in names]
        if self.ttl is not None:
            values.append(F.when(keep, F.greatest(F.col(f"s.{TTL_COLUMN}"), F.col(f"d.{TTL_COLUMN}")))
                          .otherwise(F.col(f"d.{TTL_COLUMN}")).alias(TTL_COLUMN))
        out = joined.select(F.col(f"d.{KEY_GROUP}").alias(KEY_GROUP), F.col(self.key), *values, gone.alias(STATE_GONE))
        return self._append(out, before_retry, epoch, newest, read_at, reached)

    def _unchanged_since(self, read_at: int | None, ours: str | None, landed: bool) -> None:
        """Refuse (:class:`StateTableChangedError`) a run on a table whose rows someone else changed
        after ``read_at``, the version the flush read (its own commits, stamped ``ours``, aside)."""
        if read_at is None or read_at < 0:
            return
        from ..delta.log import data_changes_since

        changes = data_changes_since(self.path, read_at, ours)
        if changes:
            what = ", ".join(f"{operation} at version {v}" for v, operation in changes[:3])
            done = ("this flush's run landed after it and is discarded by the recovery" if landed
                    else "this flush's run was not written")
            raise StateTableChangedError(
                f"state table {self.path}: its rows were changed by another writer after version {read_at}, the "
                f"state this flush read ({what}); {done}. A keyed state table is written by its pipeline alone. "
                "The next run recovers: it restores the latest completed checkpoint's state version and replays "
                "what came after it")

    def _append(self, rows: DataFrame, before_retry, epoch: int | None, newest: datetime | None,
                read_at: int | None = None, reached: Callable[[str], None] | None = None) -> int:
        """``rows`` (key group, key, values, :data:`STATE_GONE`) appended as one run, each with the
        run's number (the table version it lands at: above every run before it), in one commit
        fenced by ``epoch`` and carrying the TTL marks. Returns the table version. The table's rows
        must not have been changed by anyone else since ``read_at``, the version the flush read.

        One Spark job writes the run's files into the table's folder, where nothing refers to them
        yet, and one delta-rs commit adds them exactly on the snapshot that decided the run's
        number, the fence and the foreign-change check (a compare-and-swap: a writer racing it makes
        it decide again, its files deleted), so every check holds where the run lands. Delta's own
        append rebuilt the table's snapshot in three Spark jobs at every flush. A table delta-rs may
        not add files to (:func:`~checkpoint_lib.spark.tables.files_commit_problem`: column mapping,
        say) is appended to by Delta."""
        if self._base is None:  # the first run since the table was opened, folded or rewritten
            self._base = self._rows()
        from deltalake import DeltaTable
        from deltalake.exceptions import CommitFailedError

        from ..core.cas import commit_on_snapshot

        first = DeltaTable(self.path)
        if tables.files_commit_problem(first) is not None:
            return self._append_by_delta(rows, before_retry, epoch, newest, read_at)
        snapshots = iter([first])
        landed: list[tuple[int, TtlMarks | None, int]] = []

        def read() -> DeltaTable:
            dt = next(snapshots, None)
            if dt is not None:
                return dt
            if before_retry is not None:
                before_retry()  # a lost race: a zombie must not win by retrying
            return DeltaTable(self.path)

        def attempt(dt: DeltaTable) -> None:
            if epoch is not None and self.app_id is not None:  # a zombie is told it is fenced, first: the
                # newer epoch's writes are its pipeline's, not "another writer's"
                tables.refuse_if_fenced(self.path, dt.transaction_version(self.app_id), epoch)
            self._unchanged_since(read_at, None, landed=False)
            run = dt.version() + 1
            marks = TtlMarks(newest, run) if self.ttl is not None else None
            landed[:] = [(run, marks, self._commit_run(dt, rows, run, epoch, marks, reached))]

        commit_on_snapshot(read, attempt, lost=CommitFailedError, attempts=tables.CONFLICT_ATTEMPTS,
                           exhausted=lambda n: tables.ConcurrentWriterError(
                               f"state {self.path}: {n} attempts to commit a flush's run lost to concurrent writers"))
        ((version, marks, added),) = landed
        if marks is not None:
            self._marks[version] = marks
        self._counted(added)
        return version

    def _commit_run(self, dt, rows: DataFrame, run: int, epoch: int | None, marks: TtlMarks | None,
                    reached: Callable[[str], None] | None = None) -> int:
        """Write ``rows`` as run ``run`` (one Spark job, into :data:`~checkpoint_lib.layout.PENDING_FOLDER`
        of the table) and add its files in one delta-rs commit on exactly the snapshot ``dt``: stamped
        for ``epoch`` (its caller refused a newer epoch's stamp on ``dt``), with the TTL ``marks``.
        Returns the rows added. A lost race (CommitFailedError) deletes the files before it propagates.
        ``reached``: the kill points (``state_run``: the run's files written, their commit not yet)."""
        import uuid

        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import CommitProperties
        from deltalake.transaction import Transaction as AppTransaction

        from ..delta.pending import add_actions, files_with_rows
        from ..files import files_at
        from ..layout import PENDING_FOLDER

        stamp = None
        if epoch is not None and self.app_id is not None:  # refused on ``dt`` already when fenced (:meth:`_append`)
            stamp = AppTransaction(self.app_id, tables.fenced_version(epoch, run))
        key = F.col(self.key)
        out = (rows.withColumn(STATE_RUN, F.lit(run).cast("long"))
               .withColumn(self.key, F.when(key.isNull(), F.raise_error(F.lit(
                   f"state {self.path}: a state row with a null key {self.key!r}"))).otherwise(key))
               .select(*self.schema.fieldNames()))
        folder = f"{self.path}/{PENDING_FOLDER}/run-{run}-{uuid.uuid4().hex}"
        out.write.parquet(folder)
        files = files_with_rows(folder, self.path)  # none: an empty run is its commit alone
        metadata = {"userMetadata": marks.to_json()} if marks is not None else None
        if reached is not None:
            reached("state_run")
        try:
            dt.create_write_transaction(
                add_actions(files), mode="append", schema=dt.schema(),
                commit_properties=CommitProperties(app_transactions=None if stamp is None else [stamp],
                                                   custom_metadata=metadata, max_commit_retries=0))
        except CommitFailedError:
            files_at(folder).delete_tree(folder)  # nothing refers to them: decide again on the new snapshot
            raise
        return sum(f.rows for f in files)

    def _counted(self, added: int) -> None:
        """Count a run's ``added`` rows towards the next fold (:meth:`due`)."""
        if self._base == 0 and self._appended == 0:
            self._base = added  # a run into an empty table replaces nothing: as good as folded
        else:
            self._appended += added

    def _append_by_delta(self, rows: DataFrame, before_retry, epoch: int | None, newest: datetime | None,
                         read_at: int | None) -> int:
        """:meth:`_append` through Delta's own append (a table delta-rs may not add files to):
        fenced by Delta's idempotent-write stamp, the foreign-change check made before the commit
        and, where the commit carries the fence's stamp, again after it (a change that raced it). A
        zombie is told it is fenced before it is told of a change (the newer epoch's own writes)."""
        if epoch is not None and self.app_id is not None:
            tables.refuse_if_fenced(self.path, tables.stamp_of(self.path, self.app_id), epoch)
        self._unchanged_since(read_at, None, landed=False)
        marks: list[TtlMarks] = []

        def append() -> None:
            run = self.version() + 1
            out = rows.withColumn(STATE_RUN, F.lit(run).cast("long")).select(*self.schema.fieldNames())
            writer = out.write.format("delta").mode("append")
            if self.ttl is not None:
                marks[:] = [TtlMarks(newest, run)]
                writer = writer.option("userMetadata", marks[0].to_json())
            self._save(writer, epoch, run)

        # a conflicting append committed nothing, so appending the rows again appends them once
        tables.retry_conflicts(append, f"state {self.path}: a flush's run", before_retry=before_retry)
        self._fenced(epoch)
        if epoch is not None and self.app_id is not None:
            self._unchanged_since(read_at, self.app_id, landed=True)
        version = self.version()
        if marks:
            self._marks[version] = marks[0]
        self._counted(_rows_added(self.path, version))
        return version

    def _save(self, writer, epoch: int | None, sequence: int) -> None:
        if epoch is not None and self.app_id is not None:
            writer = writer.option("txnAppId", self.app_id).option(
                "txnVersion", str(tables.fenced_version(epoch, sequence)))
        writer.save(self.path)

    def _operator_values(self) -> list[str]:
        return [n for n in self.values.fieldNames() if n != TTL_COLUMN]

    # compaction ----------------------------------------------------------------------------------

    def due(self) -> bool:
        """Whether the runs appended since the table was last compacted (or restored, or this
        process opened it) hold more rows than it held then: folding them now keeps a flush's read
        within twice the state, and costs each appended row O(1) on average. A run into an empty
        table (a pipeline's first step) counts as the table's first fold: it replaces nothing."""
        if self._base is None or self._appended <= COMPACT_AT_LEAST:
            return False
        return self._appended > self._base

    def _rows(self) -> int:
        """The rows of the table's latest version (its files' statistics: no Spark job)."""
        from deltalake import DeltaTable

        actions = DeltaTable(self.path).get_add_actions(flatten=True)
        return int(sum(n or 0 for n in actions.column("num_records").to_pylist())) if actions.num_rows else 0

    def _rewritten(self) -> None:
        """The table was just rewritten (compacted, restored, cleared): count the runs from here."""
        self._base, self._appended = None, 0

    def compact(self, before_retry: Callable[[], None] | None = None, epoch: int | None = None) -> int:
        """Fold the runs: the table rewritten as its state (:func:`live`: one row per key, each
        keeping its run; tombstones, replaced rows and what the TTL cleaned up gone), so reading
        the state stays proportional to it. The state does not change (``dataChange=false``: every
        version a snapshot pinned reads the same state, and a kill before, during or after it
        leaves the same state); the overwrite is fenced like a flush (an older epoch's is refused
        inside its commit) and carries the TTL marks on. Returns the table version after it."""

        def fold() -> None:
            version = self.version()
            state = self._visible(live(self.stored(version), self.key, keep_run=True), version, keep_run=True)
            self._overwrite(state, epoch, data_change=False, marks=self.marks(version) if self.ttl else None)

        tables.retry_conflicts(fold, f"state {self.path}: compaction", before_retry=before_retry)
        return self.version()

    # restore -------------------------------------------------------------------------------------

    def restore(self, snapshots: Sequence[PinnedState], *, epoch: int | None = None) -> None:
        """Make the table hold, for every snapshot (its ``table_version`` and ``key_groups``), exactly
        its key groups as of its version. Idempotent: running it twice gives the same table.

        When one snapshot covers every key group and no commit since its version changed the state,
        nothing is written. Otherwise, with ``epoch`` (a recovery, after :meth:`fence`) the state
        is rewritten by one stamped overwrite, so a stalled older recovery's restore landing later
        is refused inside its commit; a Delta RESTORE cannot carry the stamp. Without, a RESTORE
        when one snapshot covers every key group (no data rewritten)."""
        from delta.tables import DeltaTable

        from ..delta.log import rows_unchanged_since

        versions = {s.table_version for s in snapshots}
        covered = sorted((s.key_groups.start, s.key_groups.end) for s in snapshots)
        full = len(versions) == 1 and _covers_all(covered)
        if full:
            (version,) = versions
            if rows_unchanged_since(self.path, version):
                # The table still holds the snapshot (nothing since it but stamps and compactions,
                # as after a kill before the next flush): nothing to write. After the recovery's
                # fence no older epoch can change that; a newer epoch's fence is checked as a write's.
                self._fenced(epoch)
                return
        self._check_whole(sorted(versions))
        if full and epoch is None:
            DeltaTable.forPath(self.spark, self.path).restoreToVersion(min(versions))
            self._rewritten()
            return
        parts = [
            self._visible(live(self.stored(s.table_version), self.key, keep_run=True), s.table_version, keep_run=True)
            .where(F.col(KEY_GROUP).between(s.key_groups.start, s.key_groups.end))
            for s in snapshots
        ]
        df = reduce(DataFrame.unionByName, parts)
        marks = None
        if self.ttl is not None:  # the newest of the snapshots' marks (one vertex: one cleanup)
            held = [self.marks(s.table_version) for s in snapshots]
            marks = TtlMarks(max((m.newest for m in held if m.newest is not None), default=None),
                             max(m.run for m in held))
        self._overwrite(df, epoch, marks=marks)

    def _check_whole(self, versions: Sequence[int]) -> None:
        """Refuse (:class:`StateFilesLostError`) to restore ``versions`` when files they hold are
        gone, before reading them (Spark would fail on the first missing file, saying less)."""
        from urllib.parse import unquote

        from deltalake import DeltaTable

        from ..files import files_at
        from ..layout import location

        root = location(self.path)
        files = files_at(root)
        for version in versions:
            held = DeltaTable(self.path, version=version).get_add_actions(flatten=True).column("path").to_pylist()
            gone = [p for p in held if not files.exists(root / unquote(p))]
            if gone:
                raise StateFilesLostError(
                    f"state table {self.path}: {len(gone)} of the {len(held)} files of version {version}, the state a "
                    f"snapshot being restored pins, are gone (e.g. {unquote(gone[0])}): a VACUUM with a retention below "
                    "the table's deleted them after an OPTIMIZE rewrote them (RETAIN 0 HOURS with Delta's safety check "
                    "off). That state cannot be restored. Restore an older checkpoint whose state is whole "
                    "(`ckpt recover <pipeline> --checkpoint N`; `ckpt checkpoints <pipeline>` lists them), or start "
                    "the pipeline over in a new warehouse. A state table keeps every version a retained checkpoint "
                    "pins: VACUUM it with its own retention (the default), never below")

    def clear(self, *, epoch: int | None = None) -> None:
        """Empty the table (an operator new to the restored snapshot starts empty); fenced like
        :meth:`restore`. A table with no rows is left alone (a pipeline's first start): after the
        recovery's fence no older attempt can add any."""
        from deltalake import DeltaTable

        if DeltaTable(self.path).get_add_actions(flatten=False).num_rows == 0:
            return
        self._overwrite(self.spark.createDataFrame([], self.schema), epoch, marks=TtlMarks() if self.ttl else None)

    def _overwrite(self, df: DataFrame, epoch: int | None, data_change: bool = True,
                   marks: TtlMarks | None = None) -> None:
        writer = df.select(*self.schema.fieldNames()).write.format("delta").mode("overwrite")
        if not data_change:
            writer = writer.option("dataChange", "false")
        if marks is not None:
            writer = writer.option("userMetadata", marks.to_json())
        self._save(writer, epoch, self.version() + 1)
        self._fenced(epoch)
        if marks is not None:
            self._marks[self.version()] = marks
        self._rewritten()


def _covers_all(ranges: list[tuple[int, int]]) -> bool:
    expected = 0
    for start, end in ranges:
        if start != expected:
            return False
        expected = end + 1
    return expected == DEFAULT_MAX_PARALLELISM



def without_cleaned(state: DataFrame, ttl: StateTtl | None, marks: TtlMarks | None) -> DataFrame:
    """``state`` (:func:`live` rows with their run) without the rows a TTL's cleanup took by the
    flush of ``marks``: from a run before it, written ``ttl + cleanup_lateness`` before its newest
    write (the one definition; ``delta/inspect.py::_live`` says the same in SQL)."""
    cut = None if ttl is None or marks is None else marks.expire_before(ttl)
    if cut is None or STATE_RUN not in state.columns:
        return state
    return state.where(~((F.coalesce(F.col(STATE_RUN), F.lit(-1)) < marks.run) & (F.col(TTL_COLUMN) < F.lit(cut))))


def state_of(spark: SparkSession, path: str, key: str, ttl: StateTtl | None = None,
             version: int | None = None) -> DataFrame:
    """The keyed state the state table at ``path`` holds at ``version`` (None: the latest), as the
    operator's flushes read it (:meth:`KeyedStateTable.read`): for readers that have the key and
    the operator's TTL but not its state table."""
    return KeyedStateTable(spark, path, key, T.StructType([]), ttl=ttl).read(version)


def _rows_added(path: str, version: int) -> int:
    """The rows commit ``version`` of table ``path`` added (its files' statistics; 0 without them)."""
    import json

    from ..delta.log import commit_actions

    rows = 0
    for action in commit_actions(path, version):
        stats = (action.get("add") or {}).get("stats")
        rows += int(json.loads(stats).get("numRecords", 0)) if stats else 0
    return rows


COMPACT_AT_LEAST = 100_000
"""A table of runs is compacted once its runs since the last compaction hold more rows than it
held then, and more than this many (a small table is cheap to read as it is)."""


def live(stored: DataFrame, key: str, *, keep_run: bool = False) -> DataFrame:
    """The keyed state a state table's ``stored`` rows hold: per key, the row of the newest run,
    unless it is a tombstone (one aggregation; a table written before runs, or MERGEd in place,
    is its state as it is). ``keep_run``: with the run column (what a rewrite keeps)."""
    if STATE_RUN not in stored.columns:
        return stored
    others = [c for c in stored.columns if c != key]
    newest = (stored.groupBy(key)
              .agg(F.max_by(F.struct(*[F.col(f"`{c}`") for c in others]),
                            F.coalesce(F.col(STATE_RUN), F.lit(-1))).alias("s"))
              .select(key, *[F.col(f"s.`{c}`").alias(c) for c in others]))
    newest = newest.where(~F.coalesce(F.col(STATE_GONE), F.lit(False)))
    return newest.select(*stored.columns) if keep_run else newest.drop(STATE_RUN, STATE_GONE)

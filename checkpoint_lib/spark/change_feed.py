"""A Delta table read through its change data feed (:class:`~checkpoint_lib.pipeline.ChangeFeedSource`).

Offsets are the table's versions, as for an append-only Delta source, and a step is whole
versions, planned from the table's log on the driver without reading data
(:class:`~checkpoint_lib.delta.log.ChangeFeedPlanner`): one entry per version that changed rows
(``cdf@<version>``, its rows from the log). Reading a step is one Spark batch ``readChangeFeed``
from its first version to its last; each change becomes one record:

- the declared columns, in their declared types (a value that does not convert is null and the
  row gets the reason in ``_ckpt_error``, so it goes to the dead letters);
- :data:`~checkpoint_lib.pipeline.CHANGE_COLUMN` (string): ``insert``, ``update`` (Delta's
  ``update_postimage``; the ``update_preimage`` row is not read) or ``delete`` (the deleted row);
- the offset: ``src_version`` (long, Delta's ``_commit_version``), ``src_file`` (string,
  ``cdf@<version>``) and ``src_row`` (long, from 0 within the version: the version's changes
  numbered deletes first, then updates, then inserts, each kind ordered by the declared columns'
  values as the table holds them, so a re-read of a version numbers its changes alike; changes
  equal in every declared column are interchangeable);
- ``sender`` (int): the version's position in the step modulo the source parallelism (as a
  file's for the other kinds: a version is this kind's file).

The table must record its changes (``delta.enableChangeDataFeed = true``) at every version a step
reads that changed rows: a table that never did, or a step starting before the version that
turned the feed on, is refused before anything is read (:class:`ChangeFeedUnavailableError`),
naming the table and the way out; so is a RESTORE that changed rows (Delta records no row changes
for it: its feed is the whole files it took out and brought back), and a version written with a
column the table no longer has in that type (an overwrite that replaced the schema: Delta reads a
step's versions with the table's current schema and refuses those, :class:`SchemaMismatchError`).
Registered in :mod:`checkpoint_lib.spark.sources` (which imports this module: the one place that
names the kinds of source).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..delta import log as delta_log
from ..delta.log import AddedFile
from ..files import files_at
from ..layout import location
from ..pipeline import CHANGE_COLUMN, ChangeFeedSource
from ..reserved import ERROR_COLUMN, temporary
from ..schema import SchemaMismatchError
from . import tables

ERROR_PREVIEW = 200
"""How much of a value that does not convert the reason quotes."""


class ChangeFeedUnavailableError(SchemaMismatchError):
    """The table did not record the row changes of a version the source must read: its change data
    feed was off then, or the version is a RESTORE."""


def _orderable(dt: T.DataType) -> bool:
    """Whether Spark sorts values of ``dt`` (maps and variants it does not)."""
    if isinstance(dt, T.StructType):
        return all(_orderable(f.dataType) for f in dt.fields)
    if isinstance(dt, T.ArrayType):
        return _orderable(dt.elementType)
    return not isinstance(dt, (T.MapType, T.VariantType))


def _sort_key(name: str, dt: T.DataType) -> Column:
    column = F.col(name)
    return column.asc_nulls_first() if _orderable(dt) else F.to_json(F.struct(column)).asc_nulls_first()


class DeltaLogReader:
    """What the readers of a Delta table by its versions share (a :class:`ChangeFeedSource`'s here,
    a ``DeltaSource``'s in :mod:`.sources`): the declaration, where it is read, the planner of its
    log (each commit parsed once), the newest version, the rows between two versions and when a
    version was committed (a graph cuts a step across its sources by it)."""

    def __init__(self, spec: Any, site: Any, planner: Any):
        self.spec, self.site, self.path = spec, site, site.location
        self.planner = planner
        self.schema_checked_at = -1
        self._ignored_columns: list[str] = []

    def missing_table(self) -> str:
        """Why discovering found no table, and what to do."""
        raise NotImplementedError

    def latest(self) -> int | None:
        return delta_log.latest_version(self.path)

    def discover(self) -> int | None:
        latest = self.latest()
        if latest is None:
            raise FileNotFoundError(self.missing_table())
        return latest

    def pending_rows(self, after: int, upto: int) -> int:
        return self.planner.rows_between(after, upto)

    def commit_time(self, version: int) -> int | None:
        """When ``version`` was committed (ms since the epoch)."""
        return self.planner.commit_time(version)


class ChangeFeedReader(DeltaLogReader):
    """The :class:`~checkpoint_lib.spark.sources.SourceReader` of a :class:`ChangeFeedSource`."""

    caches_step = True  # a feed read and a numbering of each version: computed once per step
    writes_on_discover = False

    def __init__(self, spec: ChangeFeedSource, site: Any):  # site: a sources.SourceSite (that module imports this one)
        super().__init__(spec, site, delta_log.ChangeFeedPlanner(site.location))

    def missing_table(self) -> str:
        return (f"no Delta table at {self.path}: create it with its change data feed on (TBLPROPERTIES "
                f"(delta.enableChangeDataFeed = true)), or generate data first (ckpt generate {self.site.pipeline})")

    def next_step(self, after: int, upto: int, rows_per_step: int) -> list[AddedFile]:
        """The versions after ``after`` (at most ``upto``) that changed rows, whole, until they hold
        at least ``rows_per_step`` rows (a version whose count the log does not give ends a step).
        A step never spans a version at which the feed was off; one of those that changed rows is
        refused."""
        if rows_per_step < 1:
            raise ValueError(f"rows_per_step must be >= 1, got {rows_per_step}")
        self.planner.forget(after)
        if self.schema_checked_at != upto:
            if self.schema_checked_at < 0 or self.planner.metadata_changed(self.schema_checked_at, upto):
                self._check_schema(upto)
            self.schema_checked_at = upto
        written = current = None  # the columns the versions were written with, and the table's now
        if self.planner.metadata_changed(after, upto):
            written, current = self._columns(after + 1), self._columns(upto)
        step: list[AddedFile] = []
        rows = 0
        for version in range(after + 1, upto + 1):
            change = self.planner.version(version)
            entry = change.entry
            if written is not None and version > after + 1 and change.metadata_changed:
                written = self._columns(version)
            if not self.planner.feed_on(version):
                if entry is not None:
                    raise self._unrecorded(version, after, upto)
                if step:
                    break  # one feed read covers the step: it must not span a version without one
                continue
            if entry is None:
                continue
            if change.restore is not None:
                raise self._restored(change.restore, after)
            if written is not None:
                self._check_readable(version, after, written, current)
            step.append(entry)
            rows += max(entry.rows, 0)
            if entry.rows < 0 or rows >= rows_per_step:
                break
        return step

    def _copy(self) -> str:
        """The way on from a version the feed cannot give: read a copy of the table."""
        return (f"copy the table into a new one created with the feed on (CREATE TABLE ... TBLPROPERTIES "
                f"(delta.enableChangeDataFeed = true) AS SELECT * FROM delta.`{self.path}`) and read that one")

    def _unrecorded(self, version: int, after: int, upto: int) -> ChangeFeedUnavailableError:
        name, path, copy = self.site.pipeline, self.path, self._copy()
        turned_on = self.planner.feed_turned_on(version, upto)
        if turned_on is not None:
            return ChangeFeedUnavailableError(
                f"{path}: version {version} changed rows before the table's change data feed was turned on (at version "
                f"{turned_on}), so those changes were never recorded and pipeline {name!r}, reading its ChangeFeedSource "
                f"after version {after}, cannot read them. To go on, {copy}, or restore a checkpoint whose source "
                f"offset is {turned_on - 1} or later (ckpt checkpoints list {name}; ckpt recover {name} --checkpoint N). "
                "Nothing was read or written."
            )
        return ChangeFeedUnavailableError(
            f"{path} has no change data feed (delta.enableChangeDataFeed is not true at version {version}, which changed "
            f"rows): pipeline {name!r} reads it as a ChangeFeedSource, its inserts, updates and deletes as Delta records "
            f"them. Turn the feed on (ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)): "
            f"changes are recorded from then on, so for the rows written before, {copy}; or read an append-only table "
            "as a DeltaSource. Nothing was read or written."
        )

    def _restored(self, restore: delta_log.Restore, after: int) -> ChangeFeedUnavailableError:
        to = f"version {restore.restored}" if restore.restored is not None else f"its state at {restore.timestamp}"
        return ChangeFeedUnavailableError(
            f"{self.path}: version {restore.version} is a RESTORE (to {to}), and Delta records no row changes for a "
            "RESTORE: its change data feed has every row of the files it took out as deleted and every row of the files "
            "it brought back as inserted, unchanged rows too, with the values they had then (the rows it brings back "
            f"look older than their own deletes). Pipeline {self.site.pipeline!r}, reading its ChangeFeedSource after "
            f"version {after}, cannot read that as the table's changes. To bring rows back, write them as changes "
            f"(MERGE INTO the table USING (SELECT * FROM delta.`{self.path}` VERSION AS OF N) ...) rather than RESTORE "
            f"it; to go on from here, {self._copy()}. Nothing was read or written."
        )

    def _columns(self, version: int) -> dict[str, T.DataType]:
        """The table's columns at ``version``."""
        return {f.name: f.dataType for f in T.StructType.fromJson(delta_log.schema_json_at(self.path, version)).fields}

    def _check_readable(self, version: int, after: int, written: dict[str, T.DataType],
                        current: dict[str, T.DataType]) -> None:
        """Delta reads a step's changes with the table's current columns (``current``) and refuses a
        version written with a column it no longer has, or has in another type: refused first, here."""
        changed = [f"{c!r} ({t.simpleString()}, now " + (f"{current[c].simpleString()})" if c in current else "gone)")
                   for c, t in written.items() if c not in current or current[c].simpleString() != t.simpleString()]
        if changed:
            raise SchemaMismatchError(
                f"{self.path}: version {version} was written with the columns {', '.join(changed)}: a later commit "
                "replaced the table's schema (an overwrite with overwriteSchema, or a column's type changed), and Delta "
                "reads the changes of a range of versions with the table's current schema only, so pipeline "
                f"{self.site.pipeline!r}, reading its ChangeFeedSource after version {after}, cannot read it. To go on, "
                f"{self._copy()}. Nothing was read or written."
            )

    def _check_schema(self, version: int) -> None:
        """Every declared column is in the table (a column of another type is cast, row by row)."""
        have = self._columns(version)
        want = self.spec.declared
        missing = [c for c in want if c not in have]
        if missing:
            raise SchemaMismatchError(
                f"{self.path} at version {version} does not fit pipeline {self.site.pipeline!r}: "
                + "; ".join(f"column {c!r} is missing" for c in missing) + ". Nothing was read or written."
            )
        extra = sorted(set(have) - set(want))
        if extra and extra != self._ignored_columns:
            self._ignored_columns = extra
            self.site.progress(
                f"{self.path} at version {version} has columns pipeline {self.site.pipeline!r} does not "
                f"declare: {extra} (ignored; declare them in the source schema to use them)"
            )

    def read(self, step: list[AddedFile], senders: int) -> DataFrame:
        """The step's changes (module docstring): one batch ``readChangeFeed`` of its versions."""
        spark = self.site.spark
        versions = [f.version for f in step]
        version, change, sender = temporary("version"), temporary("change"), temporary("sender")
        positions = spark.createDataFrame([(v, i % senders) for i, v in enumerate(versions)],
                                          f"{version} long, {sender} int")
        feed = (
            spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", min(versions)).option("endingVersion", max(versions))
            .load(self.path)
        )
        declared = tables.struct_type(self.spec.declared)
        table_types = {f.name: f.dataType for f in feed.schema.fields}
        kinds = F.col("_change_type")
        rank = F.when(kinds == "delete", 0).when(kinds == "update_postimage", 1).when(kinds == "insert", 2)
        numbered = (
            feed.where(kinds != "update_preimage")
            .select(
                *[F.col(f.name) for f in declared.fields],
                F.col("_commit_version").cast("long").alias(version),
                kinds.alias(change),
                F.when(rank.isNotNull(), rank).otherwise(F.raise_error(F.concat(
                    F.lit(f"{self.path}: a change of unknown type "), kinds))).alias(temporary("rank")),
            )
        )
        order = [F.col(temporary("rank")), *[_sort_key(f.name, table_types[f.name]) for f in declared.fields]]
        numbered = numbered.withColumn(
            "src_row", (F.row_number().over(Window.partitionBy(version).orderBy(*order)) - 1).cast("long"))
        values, problems = [], []
        for f in declared.fields:
            if table_types[f.name].simpleString() == f.dataType.simpleString():
                values.append(F.col(f.name))
                continue
            converted = F.col(f.name).try_cast(f.dataType)
            values.append(converted.alias(f.name))
            problems.append(F.when(
                F.col(f.name).isNotNull() & converted.isNull(),
                F.concat(F.lit(f'wrong type for {f.name}: "'),
                         F.substring(F.col(f.name).cast("string"), 1, ERROR_PREVIEW),
                         F.lit(f'" (expected {f.dataType.simpleString()})'))))
        error = F.lit(None).cast("string")
        if problems:
            reasons = F.concat_ws("; ", *problems)
            error = F.when(reasons != "", reasons)
        named = F.when(F.col(change) == "update_postimage", F.lit("update")).otherwise(F.col(change))
        unmatched = F.concat(F.lit(f"{self.path}: a change of version "), F.col(version).cast("string"),
                             F.lit(" that is no version of the step"))
        return (
            numbered.join(F.broadcast(positions), version, "left")
            .select(
                *values,
                named.alias(CHANGE_COLUMN),
                F.col(version).alias("src_version"),
                F.concat(F.lit(delta_log.CHANGE_ENTRY_PREFIX), F.col(version).cast("string")).alias("src_file"),
                F.col("src_row"),
                F.when(F.col(sender).isNotNull(), F.col(sender)).otherwise(F.raise_error(unmatched)).cast("int")
                .alias("sender"),
                error.alias(ERROR_COLUMN),
            )
        )

    def missing(self, step: list[AddedFile]) -> list[str]:
        """The files the step's versions' changes are read from that are gone (a VACUUM removed
        change files, or data files of versions read as inserts and deletes)."""
        root = location(self.path)
        files = files_at(root)
        gone = []
        for f in step:
            for path in self.planner.version(f.version).files:
                if not files.exists(root / unquote(path)):
                    gone.append(f"{self.path}/{unquote(path)}")
        return gone

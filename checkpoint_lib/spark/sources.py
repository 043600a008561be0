"""The kinds of source a source stage reads, behind one small protocol.

A source is replayable by offsets that are the versions of a log: the landing Delta table's own
(:class:`~checkpoint_lib.pipeline.DeltaSource`, its added files; or
:class:`~checkpoint_lib.pipeline.ChangeFeedSource`, its change data feed:
:mod:`checkpoint_lib.spark.change_feed`), or the manifest that registers a landing folder's
files (:class:`~checkpoint_lib.pipeline.FolderSource`, :mod:`checkpoint_lib.spark.landing`). A
step is a list of whole versions' files (:class:`~checkpoint_lib.delta.log.AddedFile`), planned
from that log on the driver without reading any data; the source stage does everything else the
same way for every kind (dead letters, ``map()`` steps, routing, the channel or the chained
operator, the sources' acknowledgements with their offsets).

A new kind of source is one class implementing :class:`SourceReader` and one
:func:`register_source` call for its declaration (a dataclass with ``path``, ``schema`` and
``validate``, as the ones above), in one file: nothing else in the runtime names a kind of source.
The kinds this library brings are registered at the end of this module (a kind whose reader has
a file of its own, as the change feed's, is imported here: that file imports nothing of this one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol
from urllib.parse import unquote

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..delta import log as delta_log
from ..delta.log import AddedFile
from ..kinds import Kinds
from ..files import files_at
from ..layout import location, source_manifest
from ..pipeline import ChangeFeedSource, DeltaSource, FolderSource
from ..reserved import ERROR_COLUMN, temporary
from ..schema import SchemaMismatchError
from . import tables
from .change_feed import ChangeFeedReader, DeltaLogReader
from .landing import LandingFolderSource
from .paths import path_below, reported_path, spark_path


class SourceReader(Protocol):
    """One kind of source, as a source stage reads it. Built once per process (it may keep what
    it parsed of its log); every method but :meth:`discover` only reads.

    - ``caches_step``: its rows are parsed (text): the stage caches a step's read for the step,
      since the dead letters and the records both read it;
    - ``writes_on_discover``: :meth:`discover` writes (a manifest): the stage checks its fence first;
    - :meth:`latest`: the newest offset, None before anything landed (registers nothing);
    - :meth:`discover`: the newest offset after registering what landed, if the kind registers;
      raises :class:`FileNotFoundError` when the source does not exist;
    - :meth:`pending_rows`: the rows of offsets ``after+1 .. upto`` (from the log, no data read);
    - :meth:`next_step`: the files of the next whole offsets after ``after`` (up to ``upto``)
      holding at least ``rows_per_step`` rows (all of them if fewer); may refuse a source that no
      longer fits the pipeline (:class:`SchemaMismatchError`) before anything is read;
    - :meth:`read`: the step's rows, nothing collected: the declared columns, ``src_version``,
      ``src_file``, ``src_row`` (the offset of each row), ``sender`` (the source subtask: the
      file's position in the step modulo ``senders``) and ``_ckpt_error`` (:data:`~checkpoint_lib.reserved.ERROR_COLUMN`) (why a row is bad, null when
      it parsed);
    - ``commit_time(version)`` (optional): when that offset was committed (ms since the epoch),
      or None; a graph cuts each step across its sources at one commit time
      (:func:`checkpoint_lib.graph.steps.plan_step`), a kind without it is read whole;
    - :meth:`missing`: the step's files that are gone (asked only after a step failed: the stage
      then says what was lost and what to do, instead of the engine's file-not-found).
    """

    caches_step: bool
    writes_on_discover: bool

    def latest(self) -> int | None: ...

    def discover(self) -> int | None: ...

    def pending_rows(self, after: int, upto: int) -> int: ...

    def next_step(self, after: int, upto: int, rows_per_step: int) -> list[AddedFile]: ...

    def read(self, step: list[AddedFile], senders: int) -> DataFrame: ...

    def missing(self, step: list[AddedFile]) -> list[str]: ...


class SourceFilesLostError(RuntimeError):
    """Files the next source step needs are gone (a VACUUM after an OPTIMIZE while the pipeline
    lagged, or a restore of a checkpoint older than the source's retention)."""


@dataclass(frozen=True)
class SourceSite:
    """Where a source is read from and for whom: what a reader's factory gets."""

    spark: SparkSession
    location: str  # the declaration's path in the warehouse
    root: str  # the pipeline's checkpoint root (a kind that registers keeps its manifest there)
    pipeline: str
    progress: Callable[[str], None]


_KINDS: Kinds[SourceReader] = Kinds("source", "reader", "checkpoint_lib.spark.sources.register_source")
register_source = _KINDS.register
"""``register_source(declaration type, factory)``: sources declared as instances of that type (or of a
subclass with none of its own) are run by ``factory(declaration, SourceSite)``."""


def source_reader(declaration: Any, site: SourceSite) -> SourceReader:
    return _KINDS.build(declaration, site, f"pipeline {site.pipeline!r}")


def bootstrap_records(spark: SparkSession, path: str, bootstrap: Any, who: str,
                      progress: Callable[[str], None]) -> DataFrame:
    """A source's :class:`~checkpoint_lib.pipeline.Bootstrap` as records (``to_records`` of the
    table's latest version, with the offset columns and ``sender`` 0): what a source sends before
    its first records when the pipeline starts from scratch, in a linear pipeline or a graph.
    ``path`` is the table's location, ``who`` names the pipeline in an error."""
    version = delta_log.latest_version(path)
    if version is None:
        raise FileNotFoundError(f"{who} starts from {path}, which does not exist")
    cols = list(bootstrap.schema)
    df = (
        spark.read.format("delta").option("versionAsOf", version).load(path).select(*cols)
        .withColumn("src_version", F.lit(-1).cast("long"))
        .withColumn("src_file", F.lit(f"bootstrap:{bootstrap.path}@{version}"))
        .withColumn("src_row", F.xxhash64(*cols))
        .withColumn("sender", F.lit(0).cast("int"))
    )
    progress(f"bootstrap: reading {bootstrap.path} at version {version}")
    return bootstrap.to_records(df)


def schema_problems(have: Mapping[str, T.DataType], want: Mapping[str, str]) -> list[str]:
    """What keeps a table with columns ``have`` from being read as the declared ``want`` (column ->
    Spark SQL type, as pipelines declare them): missing columns and other types. Types compare as
    Spark reads them, so the declaration's spelling does not matter (``int`` = ``integer``,
    ``bigint`` = ``long``, ``decimal(18, 2)``, nested types), nor does nullability."""
    problems = []
    for c, t in want.items():
        if c not in have:
            problems.append(f"column {c!r} is missing")
            continue
        if have[c].simpleString() != T._parse_datatype_string(t).simpleString():
            shown = have[c].jsonValue()  # Delta's name: integer, long, decimal(18,2), ...
            problems.append(f"column {c!r} is {shown if isinstance(shown, str) else have[c].simpleString()}, expected {t}")
    return problems


class DeltaTableReader(DeltaLogReader):
    """An append-only Delta table read by version (:class:`~checkpoint_lib.pipeline.DeltaSource`).
    Steps are planned from its log, parsed once per version
    (:class:`~checkpoint_lib.delta.log.StepPlanner`); its schema is checked against the declared one
    whenever a version to read changed the table's metadata; its Parquet files are read directly."""

    caches_step = False
    writes_on_discover = False

    def __init__(self, spec: DeltaSource, site: SourceSite):
        super().__init__(spec, site, delta_log.StepPlanner(site.location))

    def missing_table(self) -> str:
        return f"no landing table at {self.path}: generate data first (ckpt generate {self.site.pipeline})"

    def next_step(self, after: int, upto: int, rows_per_step: int) -> list[AddedFile]:
        if self.schema_checked_at != upto:
            if self.schema_checked_at < 0 or self.planner.metadata_changed(self.schema_checked_at, upto):
                self._check_schema(upto)
            self.schema_checked_at = upto
        return self.planner.next_step(after, upto, rows_per_step)

    def _check_schema(self, version: int) -> None:
        # Deletion vectors enabled are fine: an append-only table's added files carry none (a file
        # that gets one is a data removal, refused by the planner). Column mapping renames the
        # Parquet columns, which are read directly.
        features = delta_log.table_features(self.path, version)
        if "columnMapping" in features:
            raise SchemaMismatchError(
                f"{self.path} uses column mapping: an incremental source reads its Parquet files directly and "
                "needs the columns under their own names. Nothing was read or written."
            )
        have = {f.name: f.dataType for f in T.StructType.fromJson(delta_log.schema_json_at(self.path, version)).fields}
        want = self.spec.schema
        problems = schema_problems(have, want)
        if problems:
            raise SchemaMismatchError(
                f"{self.path} at version {version} does not fit pipeline {self.site.pipeline!r}: "
                + "; ".join(problems) + ". Nothing was read or written."
            )
        extra = sorted(set(have) - set(want))
        if extra and extra != self._ignored_columns:  # schema drift that loses nothing the pipeline reads
            self._ignored_columns = extra
            self.site.progress(
                f"{self.path} at version {version} has columns pipeline {self.site.pipeline!r} does not "
                f"declare: {extra} (ignored; declare them in the source schema to use them)"
            )

    def read(self, step: list[AddedFile], senders: int) -> DataFrame:
        """The step's files are known exactly from the Delta log, and the table is append-only
        without deletion vectors or column mapping (checked with the schema), so its Parquet files
        are read directly: that gives each row its offset (file, row index). A file is its whole
        path in the table (``src_file``, decoded), matched to the row however Spark encodes it
        (:func:`_with_files`); a row whose file is not the step's fails the read rather than being
        dropped."""
        spark = self.site.spark
        relative = [unquote(f.path) for f in step]
        full = [f"{self.path}/{r}" for r in relative]
        files = [StepFile(reported_path(p), r, f.version, i % senders) for i, (p, r, f) in enumerate(zip(full, relative, step))]
        scan = spark.read.schema(tables.struct_type(self.spec.schema)).parquet(*map(spark_path, full)).select(
            *self.spec.schema.keys(),
            F.col("_metadata.file_path").alias(temporary("file_path")),
            F.col("_metadata.row_index").alias("src_row"),
        )
        return _with_files(scan, files, self.path).withColumn(ERROR_COLUMN, F.lit(None).cast("string"))

    def missing(self, step: list[AddedFile]) -> list[str]:
        root = location(self.path)
        files = files_at(root)
        return [f"{self.path}/{unquote(f.path)}" for f in step if not files.exists(root / unquote(f.path))]


@dataclass(frozen=True)
class StepFile:
    """One file of a Delta source's step: ``_metadata.file_path`` as Spark will report it
    (:func:`~checkpoint_lib.spark.paths.reported_path`), its path in the table (decoded), the
    version that added it and the sender subtask its rows go out from."""

    reported: str
    src_file: str
    src_version: int
    sender: int


_FILE = T.StructType([T.StructField("src_file", T.StringType()), T.StructField("src_version", T.LongType()),
                      T.StructField("sender", T.IntegerType())])


def _with_files(scan: DataFrame, files: list[StepFile], root: str) -> DataFrame:
    """``scan``'s rows (``_metadata.file_path`` as :func:`temporary` ``file_path``) with their
    file's ``src_file``, ``src_version`` and ``sender``: matched by the path Spark reports, and a
    row no file matched that way (a name spelled otherwise) by its path decoded
    (:func:`~checkpoint_lib.spark.paths.path_below`, computed for those rows only). A row that
    matches no file fails the read; it is never dropped."""
    fp = F.col(temporary("file_path"))
    df, by_reported = tables.looked_up(scan, fp, {f.reported: (f.src_file, f.src_version, f.sender) for f in files},
                                       "string", _FILE)
    df, by_path = tables.looked_up(df, F.when(by_reported.isNull(), path_below(root)),
                                   {f.src_file: (f.src_file, f.src_version, f.sender) for f in files}, "string", _FILE)
    found = temporary("file")
    df = df.withColumn(found, F.coalesce(by_reported, by_path))
    src_file, version, sender = (F.col(found)[c] for c in ("src_file", "src_version", "sender"))
    unmatched = F.raise_error(F.concat(F.lit(f"{root}: a row of "), fp, F.lit(" matches no file of the step's Delta log entries")))
    return df.select(
        src_file.alias("src_file"),
        *[F.col(f"`{c}`") for c in scan.columns if c not in (temporary("file_path"), "src_row")],
        "src_row",
        F.when(version.isNotNull(), version).otherwise(unmatched).cast("long").alias("src_version"),
        sender.alias("sender"),
    )


class LandingFolderReader:
    """A landing folder (:class:`~checkpoint_lib.pipeline.FolderSource`): its files registered in
    a manifest under the checkpoint root, whose versions are the offsets
    (:class:`~checkpoint_lib.spark.landing.LandingFolderSource`); text is parsed, parse errors in
    ``_ckpt_error``."""

    caches_step = True
    writes_on_discover = True

    def __init__(self, spec: FolderSource, site: SourceSite):
        self.site = site
        self.folder = LandingFolderSource(site.spark, site.location, str(source_manifest(site.root)), spec.schema,
                                          format=spec.format, options=spec.options)

    def latest(self) -> int | None:
        return self.folder.latest_version()

    def discover(self) -> int | None:
        return self.folder.discover()

    def pending_rows(self, after: int, upto: int) -> int:
        return sum(max(f.rows, 0) for f in self.folder.added_files(after, upto))

    def next_step(self, after: int, upto: int, rows_per_step: int) -> list[AddedFile]:
        steps = delta_log.plan_steps(self.folder.added_files(after, upto), rows_per_step)
        return steps[0] if steps else []

    def missing(self, step: list[AddedFile]) -> list[str]:
        return []  # a registered file that vanished is refused by the read itself, naming it

    def read(self, step: list[AddedFile], senders: int) -> DataFrame:
        rows = self.folder.read(step)
        others = [F.col(f"`{c}`") for c in rows.columns if c not in ("src_file", "src_version")]
        df, found = tables.looked_up(rows, F.col("src_file"), {f.path: (f.version, i % senders) for i, f in enumerate(step)},
                                     "string", T.StructType(_FILE.fields[1:]))
        sender = F.when(found["src_version"] == F.col("src_version"), found["sender"]).otherwise(F.raise_error(
            F.concat(F.lit("landing source: a row of "), F.col("src_file"), F.lit(" is not of the step's files"))))
        return df.select("src_file", "src_version", *others, sender.alias("sender"))


register_source(DeltaSource, DeltaTableReader)
register_source(FolderSource, LandingFolderReader)
register_source(ChangeFeedSource, ChangeFeedReader)

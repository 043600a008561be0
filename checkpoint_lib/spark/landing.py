"""A landing folder of files (JSON lines, CSV or Parquet) as a replayable, incremental source.

A folder that upstream systems drop files into is not replayable by itself: listing it twice can
give different answers, and nothing says which files an earlier run already read. The
:class:`LandingFolderSource` makes it replayable by *registering* files in a **manifest**, an
append-only Delta table with one row per file::

    file string, size long, rows long, rows_exact boolean, modified_at timestamp, registered_at timestamp

:meth:`~LandingFolderSource.discover` lists the folder on the driver (names and sizes, never data)
and appends every file not registered yet in ONE Delta commit. The **manifest version is the
source offset**, exactly as the table version is for the Delta source: the files of versions
``(a, b]`` are what those commits registered, so the existing planning machinery
(:func:`checkpoint_lib.delta.log.plan_steps`, whole versions per step, recovery from an offset)
applies unchanged.

Which files a version registered
--------------------------------
A row cannot carry the version of the commit that writes it (the version is only known once the
commit won, and delta-rs rebases a blind append onto whatever committed first). Instead
:meth:`~LandingFolderSource.added_files` reads the manifest's transaction log with
:func:`checkpoint_lib.delta.log.added_files`: the manifest data files that commit ``v`` added hold
exactly the rows registered by ``v``; those small Parquet files are read on the driver. Like the
Delta source this needs the manifest's JSON commits after the offset (Delta log retention, 30 days
by default; :class:`~checkpoint_lib.delta.log.MissingLogError` otherwise) and its data files: do not
VACUUM the manifest after compacting it (it is one tiny row per file anyway). A commit that removed
manifest rows makes it non-replayable: :class:`~checkpoint_lib.delta.log.NotAppendOnlyError`.

Two discovers racing (two processes) can both register the same new file, in two commits: Delta
appends never conflict. Hence **the first registration wins**: ``added_files`` ignores a file
already registered by an earlier version (it reads the manifest snapshot at ``after`` for that),
so a file has exactly one offset whatever the race, and every reader agrees on it.

Crash safety
------------
- ``discover``: (1) list, (2) one Delta commit. A crash before (2) registers nothing (data files of
  an unfinished commit are invisible); the next discover lists again. After (2) the files are
  registered, once: discover skips every name already in the manifest, so a repeat adds nothing.
- ``read``: reads only; the same ``AddedFile`` list always gives the same rows with the same
  offsets (below), which is what recovery relies on when it re-reads a step.

Row offsets (``src_version``, ``src_file``, ``src_row``) and why they are stable
-----------------------------------------------------------------------------
- **Parquet**: ``src_row`` is Spark's ``_metadata.row_index``, the row's position in the file
  (from the row-group layout): a property of the file's bytes, not of how Spark splits the read.
- **JSON lines / CSV**: Spark has no ``row_index`` for text formats, and numbering rows after the
  fact (``monotonically_increasing_id``, ``zipWithIndex`` over a multi-file read) depends on the
  partitioning. So each file is read whole (``spark.read.text(wholetext=True)``: one row per file,
  never split), split into lines with ``\\r?\\n`` and exploded with ``posexplode``: ``src_row`` is
  the 0-based **physical line number**, a pure function of the file's content. The terminating
  newline of the last line does not make an extra line; an empty file has no lines. With a CSV
  header the header is line 0 and is not emitted, so data rows start at ``src_row = 1``.
  Cost: a file is one task and must fit in a task's memory (a JVM string: well below 2 GiB);
  landing files are expected to be small to medium.

Every line of a JSON/CSV file yields exactly one row: nothing is dropped. A line is parsed twice
with the declared schema, PERMISSIVE (``from_json`` / ``from_csv``): once typed, once with every
column as a string (the raw values). ``_ckpt_error`` is null for a good row, else:

- ``empty line`` for a blank (whitespace-only) line;
- ``unparsable row: <first 200 chars>`` when the line is not a JSON object, or (CSV) does not have
  exactly as many fields as the schema: ``unparsable row (expected 3 fields): ...``;
- ``wrong type for amount_cents: "abc" (expected bigint)`` for every column whose raw value is
  present but did not convert (several are joined with ``; ``).

A missing JSON key or an empty CSV field is null, not an error (required fields are the pipeline's
``validate``). Parquet files are typed: ``_ckpt_error`` is always null, and a file whose column types do
not match the declared schema fails the read (loudly, naming the file).

Row counts for step planning
----------------------------
``AddedFile.rows`` comes from the manifest. Parquet: **exact**, from the file footer (metadata
only, read on the driver at discover). JSON/CSV: an **estimate**, ``ceil(size /
estimated_row_bytes)`` (default 100 bytes per line), because counting lines means reading the data;
``rows_exact`` in the manifest says which. Steps are therefore only approximately
``rows_per_step`` rows for text formats; the rows actually read are whatever ``read`` returns.

Rules for the landing folder
----------------------------
- Files must be complete when they appear: writers write ``name.tmp`` (or ``_name`` / ``.name``)
  in the folder itself and rename it to its final name, which is atomic on POSIX (a rename within
  one filesystem). On an object store (``s3://``) a file is an object, which appears whole when its
  upload completes: upload it under its final name (the folder is listed from the objects,
  :mod:`checkpoint_lib.files`). Names starting with ``.`` or ``_`` or ending in one of :data:`IGNORED_SUFFIXES`
  are never registered; neither are directories (only the folder's top level is listed).
- A name is registered once, forever: never reuse a file name (include a timestamp or a UUID), and
  never change or delete a registered file. A registered file that vanished
  (:class:`LandingFileMissingError`) or changed size (:class:`LandingFileChangedError`) makes the
  source non-replayable: ``read`` refuses rather than skipping it.
- Text files are UTF-8, one record per line (a CSV field cannot contain a newline). CSV columns are
  matched to the schema by position (the header, if any, is skipped, not interpreted). Names with
  ``:`` (Hadoop paths cannot hold them) are refused at discover (:class:`UnsupportedFileError`).
- ``AddedFile.path`` is the plain file name relative to the folder, NOT URL-encoded as the paths
  of a Delta log are: do not ``unquote`` it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..delta import log as delta_log
from ..delta.log import AddedFile
from ..files import files_at
from ..layout import warehouse_location
from ..objectstore import is_remote
from ..reserved import ERROR_COLUMN, check_columns, temporary
from . import tables
from .paths import decoded_metadata, spark_path

FORMATS = ("json", "csv", "parquet")
IGNORED_PREFIXES = (".", "_")
IGNORED_SUFFIXES = (
    ".tmp", ".temp", ".inprogress", ".in-progress", ".partial", ".crdownload", ".filepart",
    ".swp", ".crc", "._copying_",
)
"""Lower-case suffixes of files still being written (``hdfs dfs -put`` writes ``name._COPYING_``)."""
ERROR_PREVIEW = 200
"""Characters of a bad line (or raw value) quoted in ``_ckpt_error``."""

MANIFEST_SCHEMA = pa.schema(
    [
        pa.field("file", pa.string(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("rows_exact", pa.bool_(), nullable=False),
        pa.field("modified_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("registered_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
"""The manifest: one row per registered file (``file`` is the name relative to the folder)."""

_CORRUPT = temporary("corrupt_record")
_TYPED, _RAW = temporary("typed"), temporary("raw")
_RESERVED_TEXT_OPTIONS = frozenset(
    {"mode", "columnnameofcorruptrecord", "multiline", "linesep", "encoding", "charset", "wholetext"}
)
_COMMIT_RETRIES = 5


class LandingFolderError(Exception):
    """Base class of the landing-folder source's own errors."""


class LandingFileMissingError(LandingFolderError, FileNotFoundError):
    """A file registered in the manifest is gone: its rows cannot be read (or replayed) again."""


class LandingFileChangedError(LandingFolderError, RuntimeError):
    """A registered file's size differs from its registration: it was rewritten in place, so a
    replay would not read what the first read did."""


class UnsupportedFileError(LandingFolderError, ValueError):
    """A file in the landing folder cannot be registered (its name, or an unreadable footer)."""


@dataclass(frozen=True)
class _Listed:
    name: str
    size: int
    modified_at: datetime


class LandingFolderSource:
    """Files dropped into ``folder``, made replayable by the manifest Delta table at
    ``manifest_path`` (see the module docstring).

    ``schema`` maps column -> Spark SQL type name (``"string"``, ``"long"``, ``"timestamp"``,
    ``"decimal(10,2)"``, ...), in column order (the CSV field order). ``options`` go to
    ``from_json`` / ``from_csv`` (e.g. ``timestampFormat``, ``sep``; CSV ``header=true`` skips the
    first line of every file) or to the Parquet reader.
    """

    def __init__(
        self,
        spark: SparkSession,
        folder: str,
        manifest_path: str,
        schema: Mapping[str, str],
        *,
        format: str = "json",
        options: Mapping[str, str] | None = None,
        estimated_row_bytes: int = 100,
    ):
        if format not in FORMATS:
            raise ValueError(f"unknown landing file format {format!r}; expected one of {', '.join(FORMATS)}")
        if not schema:
            raise ValueError("the landing source needs a schema with at least one column")
        check_columns(schema, f"landing source {folder}", fix="leave it out of the schema")
        if estimated_row_bytes < 1:
            raise ValueError(f"estimated_row_bytes must be >= 1, got {estimated_row_bytes}")
        self.spark = spark
        self.folder = warehouse_location(folder)
        self.manifest_path = warehouse_location(manifest_path)
        self._files = files_at(self.folder)
        self.format = format
        self.estimated_row_bytes = estimated_row_bytes
        fields = []
        for name, type_name in schema.items():
            try:
                fields.append(T.StructField(name, T.DataType.fromDDL(type_name), True))
            except Exception as e:  # pyspark's ParseException
                raise ValueError(f"column {name!r}: unknown Spark SQL type {type_name!r}") from e
        self.schema = T.StructType(fields)
        opts = {str(k): str(v) for k, v in (options or {}).items()}
        self.header = False
        if format != "parquet":
            reserved = sorted(k for k in opts if k.lower() in _RESERVED_TEXT_OPTIONS)
            if reserved:
                raise ValueError(
                    f"options {reserved} are fixed by the landing source (UTF-8, one PERMISSIVE "
                    "record per line)"
                )
            header = next((k for k in opts if k.lower() == "header"), None)
            if header is not None:
                if format != "csv":
                    raise ValueError("option 'header' is for CSV only")
                value = opts.pop(header).strip().lower()
                if value not in ("true", "false"):
                    raise ValueError(f"option header must be true or false, got {value!r}")
                self.header = value == "true"
        self.options = opts

    # the manifest ----------------------------------------------------------------------------

    def latest_version(self) -> int | None:
        """The manifest's latest version, None when nothing was ever registered."""
        return delta_log.latest_version(self.manifest_path)

    def discover(self) -> int | None:
        """Register every file of the folder that is not in the manifest yet, in ONE Delta commit
        (rows sorted by name); no commit when there is none. Idempotent. Returns the manifest's
        latest version (None when nothing was ever registered).

        Raises :class:`FileNotFoundError` if the folder does not exist and
        :class:`UnsupportedFileError` for a file that cannot be registered (nothing is
        registered then: rename or remove the file)."""
        from deltalake import write_deltalake
        from deltalake.exceptions import CommitFailedError

        from ..core.cas import commit_on_snapshot

        if not is_remote(self.folder) and not os.path.isdir(self.folder):  # (an object store has no empty folders)
            raise FileNotFoundError(f"landing folder {self.folder} does not exist")
        def register(latest: int | None) -> int | None:
            known = self._registered_names(latest)
            new = [f for f in self._list() if f.name not in known]
            if new:
                write_deltalake(self.manifest_path, self._manifest_rows(new), mode="append")
            return self.latest_version()

        # Only a racing creation of the manifest (version 0) fails; the failed commit wrote
        # nothing visible, so list again and register again.
        latest, _ = commit_on_snapshot(
            self.latest_version, register, lost=CommitFailedError, attempts=_COMMIT_RETRIES,
            exhausted=lambda n: CommitFailedError(f"{self.manifest_path}: {n} registrations lost to concurrent writers"))
        return latest

    def added_files(self, after: int, upto: int) -> list[AddedFile]:
        """The files registered by manifest versions ``after+1 .. upto``, in (version, path) order:
        ``AddedFile(version, path = name relative to the folder (not URL-encoded), rows, size)``.
        ``rows`` is exact for Parquet, an estimate from the size for JSON/CSV (module docstring).

        A file registered again by a later version (racing discovers) keeps its first version."""
        if after >= upto:
            return []
        latest = self.latest_version()
        if latest is None or upto > latest:
            raise ValueError(
                f"manifest {self.manifest_path} has no version {upto} (latest: {latest})"
            )
        seen = self._registered_names(after) if after >= 0 else set()
        found: list[AddedFile] = []
        for data_file in delta_log.added_files(self.manifest_path, max(after, -1), upto):
            path = f"{self.manifest_path}/{unquote(data_file.path)}"
            try:
                with files_at(path).open(path) as fh:
                    table = pq.read_table(fh, columns=["file", "size", "rows"])
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"manifest data file {path} of version {data_file.version} is gone (was the "
                    "manifest vacuumed?): the landing source cannot be replayed from this offset"
                ) from None
            for row in table.to_pylist():
                found.append(AddedFile(data_file.version, row["file"], row["rows"], row["size"]))
        files: list[AddedFile] = []
        for f in sorted(found):  # first registration wins
            if f.path not in seen:
                seen.add(f.path)
                files.append(f)
        return files

    def _registered_names(self, version: int | None) -> set[str]:
        """Every file name registered up to ``version`` (None: nothing registered)."""
        if version is None:
            return set()
        from deltalake import DeltaTable

        table = DeltaTable(self.manifest_path, version=version).to_pyarrow_table(columns=["file"])
        return set(table.column("file").to_pylist())

    def _list(self) -> list[_Listed]:
        """The folder's complete files, sorted by name: names and sizes only."""
        return [_Listed(name, st.size, datetime.fromtimestamp(st.modification_time / 1000, tz=timezone.utc))
                for name, st in self._files.entries(self.folder) if not is_ignored(name)]

    def _manifest_rows(self, files: list[_Listed]) -> pa.Table:
        now = datetime.now(timezone.utc)
        rows = []
        for f in files:
            _check_name(f.name, self.folder)
            count, exact = self._row_count(f)
            rows.append(
                {"file": f.name, "size": f.size, "rows": count, "rows_exact": exact,
                 "modified_at": f.modified_at, "registered_at": now}
            )
        return pa.Table.from_pylist(rows, schema=MANIFEST_SCHEMA)

    def _row_count(self, f: _Listed) -> tuple[int, bool]:
        """(rows, exact): the Parquet footer's row count, else an estimate from the size."""
        if self.format == "parquet":
            path = f"{self.folder}/{f.name}"
            try:
                with self._files.open(path) as fh:
                    return pq.read_metadata(fh).num_rows, True
            except Exception as e:  # pyarrow raises ArrowInvalid/OSError for a bad footer
                raise UnsupportedFileError(
                    f"{path} is not a readable Parquet file ({e}); was it written in place instead "
                    "of renamed into the folder when complete? Remove or fix it: nothing was registered"
                ) from e
        return math.ceil(f.size / self.estimated_row_bytes), False

    # reading -----------------------------------------------------------------------------------

    def output_schema(self) -> T.StructType:
        """The columns and types of :meth:`read`: the declared columns, the offsets and ``_ckpt_error``
        (the nullability of the offsets in an actual read may be stricter)."""
        return T.StructType(
            [
                *self.schema.fields,
                T.StructField("src_version", T.LongType(), True),
                T.StructField("src_file", T.StringType(), True),
                T.StructField("src_row", T.LongType(), True),
                T.StructField(ERROR_COLUMN, T.StringType(), True),
            ]
        )

    def read(self, files: Sequence[AddedFile]) -> DataFrame:
        """The rows of ``files`` (a DataFrame; nothing is collected to the driver): the declared
        columns, typed, then ``src_version``, ``src_file``, ``src_row`` and ``_ckpt_error`` (module
        docstring). Every line of a JSON/CSV file (but a CSV header) and every row of a Parquet
        file is exactly one output row.

        Raises :class:`LandingFileMissingError` / :class:`LandingFileChangedError` when a file is
        gone or no longer has its registered size."""
        versions: dict[str, int] = {}
        for f in files:
            if f.path in versions:
                raise ValueError(f"{f.path} is listed twice (versions {versions[f.path]} and {f.version})")
            versions[f.path] = f.version
            self._check_unchanged(f)
        if not files:
            return self.spark.createDataFrame([], self.output_schema())
        paths = [spark_path(f"{self.folder}/{f.path}") for f in files]
        df = self._read_parquet(paths) if self.format == "parquet" else self._read_text(paths)
        # A lookup and a loud failure: a row whose file name did not match is never dropped.
        df, found = tables.looked_up(df, F.col("src_file"), {p: (v,) for p, v in versions.items()}, "string",
                                     T.StructType([T.StructField("src_version", T.LongType())]))
        version = found["src_version"]
        unmatched = F.concat(F.lit("landing source: no version for file "), F.col("src_file"))
        version = F.when(version.isNull(), F.raise_error(unmatched)).otherwise(version)
        return df.select(
            *[F.col(_quote(c)) for c in self.schema.fieldNames()],
            version.cast("long").alias("src_version"),
            "src_file",
            F.col("src_row").cast("long").alias("src_row"),
            ERROR_COLUMN,
        )

    def _reader(self) -> DataFrameReader:
        # Whatever the session says: a missing or corrupt file must fail the read, never be skipped.
        return self.spark.read.option("ignoreMissingFiles", "false").option("ignoreCorruptFiles", "false")

    def _read_parquet(self, paths: list[str]) -> DataFrame:
        """Typed by the files; ``src_row`` is the row's position in its file."""
        return (
            self._reader().options(**self.options).schema(self.schema).parquet(*paths)
            .select(
                *[F.col(_quote(c)) for c in self.schema.fieldNames()],
                decoded_metadata("file_name").alias("src_file"),
                F.col("_metadata.row_index").alias("src_row"),
                F.lit(None).cast("string").alias(ERROR_COLUMN),
            )
        )

    def _read_text(self, paths: list[str]) -> DataFrame:
        """One row per line (``src_row`` = physical line number), parsed typed and raw."""
        lines = (
            self._reader().text(paths, wholetext=True)  # one row per file: files are never split
            .select(
                decoded_metadata("file_name").alias("src_file"),
                F.posexplode(_lines(F.col("value"))).alias("src_row", "line"),
            )
        )
        if self.header:
            lines = lines.where(F.col("src_row") > 0)
        parsed = lines.select(
            "src_file", "src_row", "line",
            self._parse(F.col("line"), self.schema).alias(_TYPED),
            self._parse(F.col("line"), self._raw_schema()).alias(_RAW),
        )
        return parsed.select(
            *[F.col(_TYPED).getField(c).alias(c) for c in self.schema.fieldNames()],
            "src_file",
            "src_row",
            self._error(F.col("line"), F.col(_TYPED), F.col(_RAW)),
        )

    def _check_unchanged(self, f: AddedFile) -> None:
        path = f"{self.folder}/{f.path}"
        try:
            size = self._files.stat(path).size
        except FileNotFoundError:
            raise LandingFileMissingError(
                f"{path} (registered by manifest version {f.version} of {self.manifest_path}) is "
                "gone: the landing source cannot be read or replayed without it; restore the file"
            ) from None
        if size != f.size:
            raise LandingFileChangedError(
                f"{path} has {size} bytes but was registered with {f.size} (manifest version "
                f"{f.version}): registered files must never change; restore the original"
            )

    # parsing text lines --------------------------------------------------------------------

    def _parse(self, line: Column, schema: T.StructType) -> Column:
        """``line`` parsed PERMISSIVE into ``schema`` plus the corrupt-record column."""
        with_corrupt = T.StructType([*schema.fields, T.StructField(_CORRUPT, T.StringType(), True)])
        options = {**self.options, "mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
        if self.format == "json":
            return F.from_json(line, with_corrupt, options)
        return F.from_csv(line, with_corrupt.toDDL(), options)

    def _raw_schema(self) -> T.StructType:
        """Every column as a string: the value as it was in the line (JSON values as JSON text)."""
        return T.StructType([T.StructField(f.name, T.StringType(), True) for f in self.schema.fields])

    def _error(self, line: Column, typed: Column, raw: Column) -> Column:
        """``_ckpt_error`` of a line from its typed and raw (all-string) parses (module docstring)."""
        preview = F.substring(line, 1, ERROR_PREVIEW)
        if self.format == "csv":
            expected = len(self.schema.fields)
            unparsable = F.concat(F.lit(f"unparsable row (expected {expected} fields): "), preview)
        else:
            unparsable = F.concat(F.lit("unparsable row: "), preview)
        wrong_types = F.concat_ws(
            "; ",
            *[
                F.when(
                    raw.getField(f.name).isNotNull() & typed.getField(f.name).isNull(),
                    F.concat(
                        F.lit(f'wrong type for {f.name}: "'),
                        F.substring(raw.getField(f.name), 1, ERROR_PREVIEW),
                        F.lit(f'" (expected {f.dataType.simpleString()})'),
                    ),
                )
                for f in self.schema.fields
            ],
        )
        return (
            F.when(line.rlike(r"^\s*$"), F.lit("empty line"))
            .when(raw.isNull() | raw.getField(_CORRUPT).isNotNull(), unparsable)
            .when(wrong_types != "", wrong_types)
            .when(typed.isNull() | typed.getField(_CORRUPT).isNotNull(), unparsable)
            .otherwise(F.lit(None).cast("string"))
            .alias(ERROR_COLUMN)
        )


def is_ignored(name: str) -> bool:
    """Whether discover skips ``name``: hidden, ``_``-prefixed or still being written."""
    return name.startswith(IGNORED_PREFIXES) or name.lower().endswith(IGNORED_SUFFIXES)


def _check_name(name: str, folder: str) -> None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsupportedFileError(
            f"{folder}: file name {name!r} is not valid UTF-8; rename it (nothing was registered)"
        ) from None
    if ":" in name:
        raise UnsupportedFileError(
            f"{os.path.join(folder, name)}: file names with ':' cannot be read by Spark (Hadoop "
            "paths); rename it (nothing was registered)"
        )


def _lines(text: Column) -> Column:
    """A whole file's lines: split on ``\\r?\\n``; the last line's terminator does not start
    another line, and an empty file has none."""
    body = F.regexp_replace(text, r"\r?\n\z", "")
    return F.when(text == "", F.array().cast("array<string>")).otherwise(F.split(body, r"\r?\n", -1))


def _quote(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"

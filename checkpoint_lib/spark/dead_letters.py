"""A source's dead-letter table: the rows a source vertex cannot pass on (unparsable, of the wrong
type, without the key they are keyed by, refused by the source's ``validate``), each with the
reason, its source offset and the epoch that wrote it.

One :class:`DeadLetterTable` per source that declares one (the linear pipeline's
``dead_letters(path)``, a graph source's ``stream.dead_letters(path)``). Appends are stamped: a
re-read of the same source versions after a recovery, whatever the step boundaries are then,
adds nothing twice, and a writer racing it (a zombie) makes it filter again.
"""

from __future__ import annotations

import uuid
from typing import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..core.cas import commit_on_snapshot
from ..layout import PENDING_FOLDER
from ..reserved import ERROR_COLUMN, OFFSET_COLUMNS, RECORD
from . import tables
from .channels import nests_records

DLQ_COLUMNS = (("error", T.StringType()), *zip(OFFSET_COLUMNS, (T.LongType(), T.StringType(), T.LongType())),
               ("epoch", T.LongType()))
"""The dead-letter table's own columns, beside the bad row (the source's columns, in its types) in
:data:`~checkpoint_lib.reserved.RECORD`: the reason, the source offset, the epoch that wrote it."""
DLQ_ATTEMPTS = 5


class _StampMoved(Exception):
    """Dead letters filtered on a stamp that another writer moved before our commit."""


class DeadLetterTable:
    """The dead letters of one source at ``path``: rows of the source's declared ``schema``;
    ``app_id`` stamps the appends (``<app prefix>/dlq`` for a linear pipeline)."""

    def __init__(self, spark: SparkSession, path: str, schema: Mapping[str, str], app_id: str):
        self.spark, self.path, self.schema, self.app_id = spark, path, dict(schema), app_id
        self._nested: bool | None = None
        self._record: T.StructType | None = None

    @property
    def nested(self) -> bool:
        """Whether the table keeps the bad row in :data:`RECORD` (else an earlier version's flat
        table, whose layout is kept; :func:`~checkpoint_lib.spark.channels.nests_records`)."""
        if self._nested is None:
            self._nested = nests_records(
                self.path, [c for c, _ in DLQ_COLUMNS], list(self.schema), "the dead-letter table",
                "Start a new dead-letter table: declare another path with dead_letters(...) (the old one keeps "
                "what it holds).")
        return self._nested

    @property
    def record(self) -> T.StructType:
        """The bad row's columns as the table keeps them: in the source's declared types (a
        timestamp keeps its instant, a number stays a number; a value of a landing file that did
        not convert is null there, and the reason quotes it), or all as text in a table an earlier
        version wrote so."""
        if self._record is None:
            declared = tables.struct_type(self.schema)
            have = tables.columns_of(self.path, nested=RECORD if self.nested else None)
            as_text = have is not None and all(have.get(f.name) == "string" for f in declared.fields)
            self._record = (T.StructType([T.StructField(f.name, T.StringType(), True) for f in declared.fields])
                            if as_text else declared)
        return self._record

    def table_schema(self) -> T.StructType:
        """The table: the bad row (:attr:`record`) in :data:`RECORD`, the reason, the source offset,
        the epoch (flat, an earlier version's table: the row's columns beside those)."""
        ours = [T.StructField(c, t, False) for c, t in DLQ_COLUMNS]
        if self.nested:
            return T.StructType([T.StructField(RECORD, self.record, True), *ours])
        return T.StructType(list(self.record.fields) + ours)

    def create(self) -> None:
        tables.create_if_missing(self.spark, self.path, self.table_schema())

    def append(self, bad: DataFrame, end_version: int, epoch: int) -> None:
        """Append the bad rows of a step read up to source version ``end_version`` (the source's
        columns, :data:`ERROR_COLUMN` and the offset), idempotently: stamped ``(app id,
        end_version)``, and only rows of versions above the stamp. One Spark job writes the files
        into the table's folder (unreferenced, so unseen), one delta-rs commit adds them, on the
        very snapshot whose stamp filtered them: a writer racing us makes us filter again."""
        from ..delta.pending import add_actions, files_with_rows
        from ..files import files_at

        row = [F.col(f"`{f.name}`").cast(f.dataType).alias(f.name) for f in self.record.fields]

        def read() -> int:
            stamp = tables.stamp_of(self.path, self.app_id)
            return -1 if stamp is None else stamp

        def write(stamp: int) -> None:
            if end_version <= stamp:
                return
            rows = bad.where(F.col("src_version") > stamp).select(
                *([F.struct(*row).alias(RECORD)] if self.nested else row),  # a flat table: an earlier version's
                F.col(ERROR_COLUMN).alias("error"), *OFFSET_COLUMNS,
                F.lit(epoch).cast("long").alias("epoch"),
            )
            folder = f"{self.path}/{PENDING_FOLDER}/v{end_version}-{uuid.uuid4().hex}"
            rows.write.parquet(folder)
            files = files_with_rows(folder, self.path)
            if not files:  # nothing bad since the stamp: nothing to stamp either
                return
            if tables.stamped_commit(self.path, self.app_id, add_actions(files),
                                     lambda have: end_version if have == stamp else None,
                                     what="the dead-letter table") is None:
                files_at(folder).delete_tree(folder)  # filtered on a stamp that moved: filter again
                raise _StampMoved()

        commit_on_snapshot(read, write, lost=_StampMoved, attempts=DLQ_ATTEMPTS, exhausted=lambda n: tables.ConcurrentWriterError(
            f"{self.path}: {n} attempts to append dead letters lost to concurrent writers"))

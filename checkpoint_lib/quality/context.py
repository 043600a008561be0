"""What the view builders of one validation share (:class:`Context`), and the Delta tables one
command reads, each loaded once (:class:`Tables`). A view is computed by Spark once
(:meth:`Context.materialize`) and, when its inputs are small enough for the driver
(:data:`DRIVER_ROWS`), collected as a pandas DataFrame that GX validates with its pandas engine."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from ..delta import log as delta_log
from ..delta.store import DeltaCheckpointStore
from ..layout import checkpoint_root
from ..pipeline import Pipeline
from .paths import inside
from .spec import QualitySpec

DRIVER_ROWS = 2_000_000
"""A view is collected to the driver (pandas) when the Delta tables it was built from hold at most
this many rows together, by their logs' statistics (no Spark job counts them); otherwise, or when a
table's log has no row counts, it stays in Spark. A view has at most as many rows as its inputs,
unless a pipeline's ``map()`` multiplies records."""



class Tables:
    """The Delta tables one validation command reads, each (table, version) loaded once: every
    view and suite of the command that reads it shares the one DataFrame (and so its resolved
    snapshot). ``version`` None is the latest version as of the first load."""

    def __init__(self, spark: SparkSession):
        self.spark = spark
        self._frames: dict[tuple[str, int | None], DataFrame] = {}
        self._rows: dict[tuple[str, int | None], int | None] = {}
        self._cached: list[DataFrame] = []

    def load(self, path: str, version: int | None = None) -> DataFrame:
        """The table at ``version``. One of at most :data:`DRIVER_ROWS` rows (by its log) is read by
        delta-rs and handed to Spark as Arrow: resolving a Delta snapshot in Spark costs seconds of
        jobs on a cold JVM, more than such a table's data. Such a frame is cached (in memory, by
        the first job that reads it): otherwise every view's job ships the table's rows to the
        executors again, inside its tasks. A table delta-rs does not read (a reader feature it
        lacks, a store it is not set up for) or a larger one is read by Spark."""
        key = (str(path), version)
        if key not in self._frames:
            rows = self.rows(path, version)
            frame = _driver_read(self.spark, str(path), version) if rows is not None and rows <= DRIVER_ROWS else None
            if frame is not None:
                frame = frame.cache()
                self._cached.append(frame)
            else:
                reader = self.spark.read.format("delta")
                if version is not None:
                    reader = reader.option("versionAsOf", version)
                frame = reader.load(str(path))
            self._frames[key] = frame
        return self._frames[key]

    def release(self) -> None:
        """Drop the cached tables (a validation inside a long-lived process, the runner's gate
        before a commit, must not keep them)."""
        for frame in self._cached:
            frame.unpersist(blocking=False)
        self._cached.clear()

    @property
    def loaded(self) -> list[tuple[str, int | None]]:
        """The (table, version) pairs loaded so far, in order."""
        return list(self._frames)

    def rows(self, path: str, version: int | None = None) -> int | None:
        """The rows of the table at ``version`` by its log's statistics (delta-rs: no Spark job);
        None when a file has no row count or the log cannot be read here."""
        key = (str(path), version)
        if key not in self._rows:
            self._rows[key] = _rows_by_stats(str(path), version)
        return self._rows[key]


def _driver_read(spark: SparkSession, path: str, version: int | None) -> DataFrame | None:
    """The table at ``version`` read by delta-rs into a Spark DataFrame with the table's own
    schema; None when delta-rs cannot read it, so that Spark, the reference reader, does.
    DataFusion (delta-rs's ``QueryBuilder``) applies deletion vectors, which the state tables use;
    a table whose columns it returns under other names (column mapping) fails the cast to the
    table's schema and goes to Spark too."""
    try:
        import pyarrow as pa
        from deltalake import DeltaTable

        from ..delta.inspect import query

        table = DeltaTable(path, version=version)
        declared = table.schema()
        schema = T.StructType.fromJson(json.loads(declared.to_json()))
        data = query(table, "select * from t").cast(pa.schema(declared.to_arrow()))  # string views: plain strings
    except Exception:  # any reason delta-rs cannot read it: Spark reads it, or reports why it cannot
        return None
    if data.num_rows == 0:  # Arrow without chunks is refused by createDataFrame
        return spark.createDataFrame([], schema)
    return spark.createDataFrame(data, schema=schema)


def _rows_by_stats(path: str, version: int | None) -> int | None:
    try:
        from deltalake import DeltaTable

        counts = DeltaTable(path, version=version).get_add_actions(flatten=True).column("num_records").to_pylist()
    except Exception:  # no statistics column, a store delta-rs is not set up for: the size is unknown
        return None
    if any(n is None or n < 0 for n in counts):
        return None
    return int(sum(counts))


def driver_sized(pipeline: Any, warehouse: Path) -> bool:
    """Whether the Delta tables a validation of ``pipeline`` reads (its Delta source, sinks, dead
    letters, keyed state and channel state, at their latest versions; a dataflow graph's sources,
    sinks, dead letters and every operator's state) hold at most :data:`DRIVER_ROWS` rows together
    by their logs (delta-rs, no Spark): then every view is collected to the driver and the command
    is seconds of small Spark jobs. False when a table's size is unknown."""
    from ..layout import checkpoint_root, state_table

    root = checkpoint_root(warehouse, pipeline.name)
    if hasattr(pipeline, "vertices"):  # a dataflow graph (checkpoint_lib.graph.StreamGraph)
        relative = [*(getattr(v.spec, "path", None) for v in pipeline.sources),
                    *(d.path for d in pipeline.dead_letters),
                    *(getattr(s.spec, "path", None) for s in pipeline.sinks)]
        paths = [str(inside(warehouse, r)) for r in relative if isinstance(r, str)]
        paths += [str(state_table(root, v.uid)) for v in pipeline.operators]
    else:
        relative = [getattr(pipeline.source_spec, "path", None), pipeline.dlq_path,
                    *(getattr(spec, "path", None) for spec in pipeline.sinks.values())]
        paths = [str(inside(warehouse, r)) for r in relative if isinstance(r, str)]
        from ..spark.channels import pipeline_channel_state_tables

        paths += [path for path, _ in pipeline_channel_state_tables(str(root), pipeline)]
        paths += [str(state_table(root, pipeline.operator_uid))] if pipeline.operator_uid else []
    total = 0
    for path in paths:
        if not delta_log.is_delta_table(path):
            continue
        rows = _rows_by_stats(path, None)
        if rows is None:
            return False
        total += rows
    return total <= DRIVER_ROWS


@dataclass
class Context:
    """Everything the view builders share for one validation run."""

    spark: SparkSession
    pipeline: Pipeline | Any
    """The linear pipeline validated, or the dataflow graph (a ``StreamGraph``)."""
    spec: QualitySpec | Any
    """Its :class:`~.spec.QualitySpec`, or the graph's :class:`~.spec.GraphQualitySpec`."""
    warehouse: Path
    store: DeltaCheckpointStore
    cached: list[DataFrame] = field(default_factory=list)
    progress: Callable[[str, str], None] | None = None
    """Told ``("computed", view)`` as each view is computed (the CLI's progress)."""
    tables: Tables | None = None
    """The command's shared table loads (a new :class:`Tables` when not given)."""
    read: list[tuple[str, int | None]] = field(default_factory=list)
    """The (table, version) pairs this run's views read: what bounds a view's size."""

    def __post_init__(self) -> None:
        if self.tables is None:
            self.tables = Tables(self.spark)

    def table(self, path: str, version: int | None = None) -> DataFrame:
        """The Delta table at ``path`` (at ``version``; None: latest), loaded once per command."""
        assert self.tables is not None
        self.note_read(path, version)
        return self.tables.load(path, version)

    def note_read(self, path: str, version: int | None = None) -> None:
        """Count the Delta table at ``path`` (``version``) among this run's inputs: a view read it
        by other means than :meth:`table` (a source's files with their offsets, a change feed)."""
        key = (str(path), version)
        if key not in self.read:
            self.read.append(key)

    def input_rows(self) -> int | None:
        """The rows of every table this run read so far (by their logs), None if one is unknown."""
        assert self.tables is not None
        total = 0
        for path, version in self.read:
            n = self.tables.rows(path, version)
            if n is None:
                return None
            total += n
        return total

    @property
    def root(self) -> Path:
        return checkpoint_root(self.warehouse, self.pipeline.name)

    def path(self, relative: str) -> str:
        return str(inside(self.warehouse, relative))

    def materialize(self, df: DataFrame, view: str) -> Any:
        """Compute view ``view`` once, in Spark: GX runs a dozen metrics on each view, and each
        would otherwise re-read the Delta tables. When its inputs hold at most :data:`DRIVER_ROWS`
        rows, the view is collected (Arrow) and returned as a pandas DataFrame, which GX validates
        without Spark; otherwise it is kept on the executors by an eager local checkpoint (one
        Spark job; ``cache()``'s plan matching costs seconds per call on Delta time-travel plans).
        Views built on a view use the Spark DataFrame they were given, not the returned one."""
        bound = self.input_rows()
        if bound is not None and bound <= DRIVER_ROWS:
            out: Any = df.toArrow().to_pandas()
        else:
            out = df.localCheckpoint(eager=True)
            self.cached.append(out)
        if self.progress is not None:
            self.progress("computed", view)
        return out

    def release(self) -> None:
        """Forget the materialized views (their blocks go with the DataFrames)."""
        self.cached.clear()



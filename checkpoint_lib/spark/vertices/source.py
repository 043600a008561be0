"""A source vertex of a running graph: its source read step by step, bad rows to its dead letters.

Each step the graph runner asks every source for its next whole versions
(:meth:`SourceVertex.propose`), cuts them at one commit time across the sources
(:func:`checkpoint_lib.graph.steps.plan_step`), then reads each one's share
(:meth:`SourceVertex.read`): the good rows with their source offset and sending subtask, after the
source's ``map()`` steps; the bad ones (unparsable, refused by the source's ``validate``, or
without a key an edge out of it hashes by) are appended to its dead-letter table, stamped by the
version read up to, so a replay adds nothing twice; with an
:class:`~checkpoint_lib.graph.model.AheadBound`, so are rows stamped too far in the future. Its
acknowledgement is its offset (and the bound's reference event time).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ...core.acks import SourceAckState
from ...core.types import SubtaskAck, SubtaskId
from ...delta.log import AddedFile
from ...graph.steps import Proposal
from ...graph.model import Partitioning, SourceVertex
from ...layout import app_prefix
from ...reserved import ERROR_COLUMN, OFFSET_COLUMNS
from .. import tables
from ..dead_letters import DeadLetterTable
from ..sources import SourceFilesLostError, SourceSite, bootstrap_records, source_reader


class SourceVertexRun:
    """One source vertex of a graph, running (see the module)."""

    def __init__(self, vertex: SourceVertex, graph: Any, *, spark, warehouse: str, root: str,
                 progress) -> None:
        self.vertex, self.spark, self.warehouse, self.progress = vertex, spark, warehouse, progress
        self.name, self.P, self.graph_name = vertex.name, vertex.parallelism, graph.name
        # how messages call it: its name only where the graph has several sources
        self.called = f"source {vertex.name!r}" if len(graph.sources) > 1 else "source"
        self.ids = [SubtaskId(vertex.name, i) for i in range(self.P)]
        self.schema = dict(vertex.spec.schema)
        self.reader = source_reader(vertex.spec, SourceSite(spark, f"{warehouse}/{vertex.spec.path}", root,
                                                            graph.name, progress))
        # rows without the key an edge out of this source hashes by have no key group: dead letters
        self.keys = sorted({e.key for e in graph.outputs_of(vertex.name)
                            if e.partitioning is Partitioning.HASH and e.key in self.schema})
        dlq = graph.dead_letters_of(vertex.name)
        self.dead_letters = (DeadLetterTable(spark, f"{warehouse}/{dlq[0].path}", self.schema,
                                             f"{app_prefix(graph.name)}/{dlq[0].stamp or f'dlq/{vertex.name}'}") if dlq else None)
        self.offset = -1
        self.time_reference: float | None = None  # its AheadBound's reference event time (s), in its acks
        self._times: dict[int, int] = {}

    def create(self) -> None:
        if self.dead_letters is not None:
            self.dead_letters.create()

    # planning -----------------------------------------------------------------------------------

    def propose(self, rows_per_step: int) -> Proposal | None:
        """The next whole versions (about ``rows_per_step`` rows), or None: nothing new."""
        latest = self.reader.discover()
        if latest is None or latest <= self.offset:
            return None
        step = self.reader.next_step(self.offset, latest, rows_per_step)
        end = max((f.version for f in step), default=latest) if step else latest
        times = None
        commit_time = getattr(self.reader, "commit_time", None)
        if commit_time is not None:
            for v in range(self.offset + 1, end + 1):
                if v not in self._times:
                    self._times[v] = commit_time(v)
            times = {v: self._times[v] for v in range(self.offset + 1, end + 1)}
            if any(t is None for t in times.values()):
                times = None  # a commit that does not say when: this source is read whole, never cut
        return Proposal(tuple(step), end, end < latest, times)

    def advance(self, end: int) -> None:
        """The step read up to version ``end`` (its records went downstream in this step)."""
        self.offset = end
        for v in [v for v in self._times if v <= end]:
            del self._times[v]

    # reading --------------------------------------------------------------------------------------

    def read(self, step: list[AddedFile], end: int, epoch: int, reached) -> DataFrame:
        """The step's good records: the declared columns after the ``map()`` steps, the offset and
        ``sender`` (the source subtask); bad rows are appended to the dead letters first."""
        reached("source_read")
        df = self.reader.read(step, self.P)
        validate = getattr(self.vertex.spec, "validate", None)
        if validate is not None:
            df = df.withColumn(ERROR_COLUMN, F.coalesce(F.col(ERROR_COLUMN), validate(df)))
        for key in self.keys:
            df = df.withColumn(ERROR_COLUMN, F.coalesce(
                F.col(ERROR_COLUMN), F.when(F.col(key).isNull(), F.lit(f"null key {key}"))))
        df = self._bound_event_time(df)
        if self.dead_letters is not None:
            reached("dlq")
            self.dead_letters.append(df.where(F.col(ERROR_COLUMN).isNotNull()), end, epoch)
        else:  # nowhere to put a bad row: refuse it rather than lose it
            why = F.concat(F.lit(f"source {self.name!r}: a bad row and no dead_letters() declared for it: "),
                           F.col(ERROR_COLUMN))
            df = df.withColumn(ERROR_COLUMN, F.when(F.col(ERROR_COLUMN).isNotNull(), F.raise_error(why)))
        df = df.where(F.col(ERROR_COLUMN).isNull()).drop(ERROR_COLUMN)
        for map_step in self.vertex.maps:
            df = map_step.fn(df)
        records = [*self.columns(), *OFFSET_COLUMNS, "sender"]
        if self.offset == -1 and self.vertex.bootstrap is not None:
            # starting from scratch: the bootstrap's records go before the source's first ones (a
            # restore of any completed checkpoint restores what they put into state; a recovery
            # with none starts from scratch again, state empty, and reads them again)
            boot = bootstrap_records(self.spark, f"{self.warehouse}/{self.vertex.bootstrap.path}", self.vertex.bootstrap,
                                     f"source {self.name!r}", self.progress)
            return boot.select(*records).unionByName(df.select(*records))
        return df.select(*records)

    def _bound_event_time(self, df: DataFrame) -> DataFrame:
        """With an :class:`~checkpoint_lib.graph.model.AheadBound`: rows whose event time is more
        than its bound after the reference (the newest step median of the good rows so far, this
        step's included: one Spark job) are bad. The reference goes into the acks, so a replay
        after a restore decides exactly as the first attempt did."""
        ahead = self.vertex.ahead
        if ahead is None:
            return df
        seconds = F.col(ahead.time_column).cast("double")
        median = df.where(F.col(ERROR_COLUMN).isNull()).select(F.median(seconds)).first()[0]
        if median is None:
            return df
        reference = median if self.time_reference is None else max(self.time_reference, median)
        self.time_reference = reference
        why = (f" is more than {ahead.max_ahead} after the reference event time "
               f"{datetime.fromtimestamp(reference, timezone.utc):%Y-%m-%d %H:%M:%S} UTC (StateTtl.max_ahead)")
        reason = F.concat(F.lit(f"{ahead.time_column} "), F.col(ahead.time_column).cast("string"), F.lit(why))
        limit = reference + ahead.max_ahead.total_seconds()
        return df.withColumn(ERROR_COLUMN, F.coalesce(F.col(ERROR_COLUMN), F.when(seconds > limit, reason)))

    def columns(self) -> list[str]:
        """The records' columns (after the maps), in order."""
        return list(self.vertex.record_schema or self.schema)

    def empty(self) -> DataFrame:
        """No records, with the records' columns: what the vertex sends in a step it reads nothing."""
        schema = {**(self.vertex.record_schema or self.schema), "src_version": "long", "src_file": "string",
                  "src_row": "long", "sender": "int"}
        return self.spark.createDataFrame([], tables.struct_type(schema))

    def lost(self, step: list[AddedFile]) -> SourceFilesLostError | None:
        """After a failed read: the files of ``step`` that are gone, as an error saying what to do."""
        gone = self.reader.missing(step) if step else []
        if not gone:
            return None
        versions = sorted({f.version for f in step})
        name = self.graph_name
        return SourceFilesLostError(
            f"pipeline {name!r}: {self.called} versions {versions[0]}..{versions[-1]} (read next, after version "
            f"{self.offset}) reference {len(gone)} files that are gone (e.g. {gone[0]}): the source was VACUUMed "
            "after an OPTIMIZE or a rewrite while the pipeline lagged behind it. Nothing of this step was committed. "
            f"Restore a checkpoint taken after version {versions[-1]} (ckpt checkpoints list {name}; ckpt recover "
            f"{name} --checkpoint N), or append those rows to the source again and restore one after them.")

    # acknowledging ----------------------------------------------------------------------------

    def acks(self) -> dict[SubtaskId, SubtaskAck]:
        """Every subtask's acknowledgement of a checkpoint at the end of this step: the offset."""
        state = SourceAckState(version=self.offset, next_seq=0, barrier_seq=-1,
                               event_time_reference=self.time_reference).to_state()
        return {sid: SubtaskAck(state=state) for sid in self.ids}

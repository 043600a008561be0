"""Persisted channels: a Delta log of records and barriers per (sender, receiver) subtask pair.

One table holds every channel of one edge of the pipeline graph (e.g. ``source -> keyed``). Each
row carries ``sender``, ``receiver``, a position ``seq``, a ``kind`` and the record, in one struct
column :data:`~checkpoint_lib.reserved.RECORD` (so no column of a record ever meets ours):

- ``data``: a record of the segment at ``seq`` (all rows of one segment share the position);
- ``barrier``: the barrier of ``checkpoint_id`` at ``seq`` (one row per channel);
- ``end``: the channel ended (one row per channel).

Positions increase along every channel. Readers learn what there is from :meth:`index` (one small
aggregation, collected to the driver: it is metadata), hand segments to the barrier handlers as
opaque records, and read the data of the segments they deliver with :meth:`read` (a Spark
DataFrame, never collected: ``sender``, ``receiver`` and the record's columns). Recovery cuts
everything after the restored positions (:meth:`truncate_after`); completed checkpoints let older
positions go (:meth:`truncate_upto`).

Tables written by an earlier version keep the record's columns beside ours ("flat"): an existing
table's layout is read from its schema and kept (:func:`nests_records`), for the channel logs and
the channel-state table alike (:class:`ChannelStateTable`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..reserved import RECEIVER, RECORD, SENDER, ReservedColumnError
from . import tables

log = logging.getLogger(__name__)

DATA, BARRIER, END = "data", "barrier", "end"
_KINDS = (DATA, BARRIER, END)

CHANNEL_STATE_ROW_BYTES = 64
"""A channel-state row's size estimate in an ack (the Delta files are compressed; the rows are exact)."""

CONTROL_COLUMNS = [
    T.StructField("sender", T.IntegerType(), False),
    T.StructField("receiver", T.IntegerType(), False),
    T.StructField("seq", T.LongType(), False),
    T.StructField("kind", T.StringType(), False),
    T.StructField("checkpoint_id", T.LongType(), True),
    T.StructField("barrier_ts", T.DoubleType(), True),
    T.StructField("epoch", T.LongType(), False),
]


CONTROL_NAMES = tuple(f.name for f in CONTROL_COLUMNS)


def nests_records(path: str, ours: Sequence[str], record: Sequence[str], what: str, fix: str) -> bool:
    """Whether the table at ``path`` keeps each record in the struct column :data:`RECORD` beside
    ``ours`` (this version's layout, and what a new table gets) rather than flat beside them (an
    earlier version's). A flat table a column of ``record`` would meet is refused, naming it and
    ``fix``: the earlier layout cannot hold such a record."""
    have = tables.columns_of(path)
    if have is None:
        return True
    beside = set(record) - set(ours) - {RECORD}
    flat = bool(beside) and beside <= set(have)  # the record's own columns beside ours: an earlier layout
    if set(ours) <= set(have) and have.get(RECORD) == "struct" and not flat:
        return True  # this layout, whatever nullable columns a user's ALTER TABLE added beside
    clash = [c for c in record if c in ours]
    if clash:
        raise ReservedColumnError(
            f"{what} at {path} was written by an earlier version of checkpoint_lib, with the records' columns beside "
            f"its own, and the records now have a column {clash[0]!r}, which is one of its own ({', '.join(ours)}). "
            f"{fix}")
    return False


def packed(df: DataFrame, payload: T.StructType) -> F.Column:
    """The record's columns of ``df`` as one :data:`RECORD` struct."""
    return F.struct(*[F.col(f"`{n}`") for n in payload.fieldNames()]).alias(RECORD)


@dataclass(frozen=True, order=True)
class ChannelEvent:
    """One entry of a channel, as the driver sees it: a segment, a barrier or the end."""

    seq: int
    sender: int
    receiver: int
    kind: str
    checkpoint_id: int | None = None
    barrier_ts: float | None = None
    rows: int = 0


_EVENT_KEY = ("seq", "sender", "receiver", "kind", "checkpoint_id", "barrier_ts")
"""What identifies one event on a channel log: :class:`ChannelEvent` without its row count."""


class DeltaChannelLog:
    def __init__(self, spark: SparkSession, path: str, payload: T.StructType):
        self.spark = spark
        self.path = path
        self.payload = payload
        self._nested: bool | None = None
        self._indexed: tuple[int | None, int, int] | None = None  # (version, epoch, last position) last indexed

    @property
    def nested(self) -> bool:
        """Whether the log keeps each record in :data:`RECORD` (else an earlier version's flat table)."""
        if self._nested is None:
            self._nested = nests_records(
                self.path, CONTROL_NAMES, self.payload.fieldNames(), "the channel log",
                "Rename that record column (a map() can), or let the earlier version consume the log up to a final "
                "checkpoint (ckpt run --final-checkpoint) and delete the table: the next run creates it in this "
                "version's layout.")
        return self._nested

    @property
    def schema(self) -> T.StructType:
        if self.nested:
            return T.StructType(CONTROL_COLUMNS + [T.StructField(RECORD, self.payload, True)])
        return T.StructType(CONTROL_COLUMNS + list(self.payload.fields))

    def create(self) -> None:
        tables.create_if_missing(self.spark, self.path, self.schema, partition_by=["receiver"])

    def append(
        self,
        data: DataFrame | None,
        seq: int,
        senders: Sequence[int],
        receivers: Sequence[int],
        barrier: tuple[int, float] | None = None,
        end: bool = False,
        *,
        epoch: int,
    ) -> None:
        """Append one step of every channel from ``senders`` in ONE Delta commit (atomic).

        ``data`` has the payload columns plus ``sender`` and ``receiver``; its rows form the segment
        at ``seq``. The barrier (``(checkpoint_id, timestamp)``) goes to ``seq + 1`` and an end
        marker after it, on every (sender, receiver) channel.
        """
        parts: list[tuple] = [] if data is None else [(DATA, seq, data)]
        pos = seq + 1
        if barrier is not None:
            parts.append((BARRIER, pos, barrier, senders, receivers))
            pos += 1
        if end:
            parts.append((END, pos, senders, receivers))
        self.write(parts, epoch=epoch)

    def write(self, parts: Sequence[tuple], *, epoch: int) -> None:
        """Append ``parts`` in ONE Delta commit (atomic), each at its own position:
        ``("data", seq, df)`` (a segment: ``df`` has the payload plus ``sender`` and ``receiver``),
        ``("barrier", seq, (checkpoint_id, ts), senders, receivers)`` and
        ``("end", seq, senders, receivers)`` (one row per (sender, receiver) channel). Senders may
        put their barriers at different positions: that is what makes records in flight."""
        frames: list[DataFrame] = []
        markers = []
        for part in parts:
            if part[0] == DATA:
                _, seq, df = part
                record = [packed(df, self.payload)] if self.nested else [F.col(f"`{n}`") for n in self.payload.fieldNames()]
                frames.append(df.select(
                    F.col(SENDER).cast("int").alias("sender"), F.col(RECEIVER).cast("int").alias("receiver"),
                    F.lit(seq).cast("long").alias("seq"), F.lit(DATA).alias("kind"),
                    F.lit(None).cast("long").alias("checkpoint_id"), F.lit(None).cast("double").alias("barrier_ts"),
                    F.lit(epoch).cast("long").alias("epoch"), *record,
                ))
            elif part[0] == BARRIER:
                _, pos, (cid, ts), senders, receivers = part
                markers += [(s, r, pos, BARRIER, cid, ts, epoch) for s in senders for r in receivers]
            elif part[0] == END:
                _, pos, senders, receivers = part
                markers += [(s, r, pos, END, None, None, epoch) for s in senders for r in receivers]
            else:
                raise ValueError(f"unknown channel entry {part[0]!r}")
        if markers:
            empty = (None,) if self.nested else (None,) * len(self.payload.fields)
            frames.append(self.spark.createDataFrame([m + empty for m in markers], self.schema))
        if not frames:
            return
        df = frames[0]
        for f in frames[1:]:
            df = df.unionByName(f)
        # a blind append, its files by receiver: a zombie's rows carry its older epoch, which readers
        # ignore, so nothing depends on the log's content
        tables.blind_append(df.select(*self.schema.fieldNames()), self.path, partition_by="receiver")

    def index(self, epoch: int, receivers: Iterable[int] | None = None, after: int = -1) -> list[ChannelEvent]:
        """Every event ``epoch`` wrote with position > ``after`` (for ``receivers``), in position
        order. After a recovery everything past the cut is rewritten by the new epoch, so rows of
        any other epoch there are a zombie's and are ignored."""
        rows = self._index_rows(epoch, receivers, after)
        if rows is None:  # a table delta-rs cannot read as a dataset: one Spark job
            df = self.spark.read.format("delta").load(self.path).where((F.col("seq") > after) & (F.col("epoch") == epoch))
            if receivers is not None:
                df = df.where(F.col("receiver").isin(list(receivers)))
            rows = [tuple(r) for r in df.groupBy(*_EVENT_KEY).agg(F.count(F.lit(1)).alias("rows")).collect()]
        foreign = [r for r in rows if r[3] not in _KINDS]
        if foreign:  # no writer of ours wrote them: another tool's rows in our table, never read
            log.warning("the channel log %s holds %d events of epoch %d that no writer of checkpoint_lib wrote "
                        "(kinds %s; another tool appended them?): ignored", self.path, len(foreign), epoch,
                        sorted({str(r[3]) for r in foreign})[:5])
        return sorted(
            ChannelEvent(seq, sender, receiver, kind, cid, ts, rows if kind == DATA else 0)
            for seq, sender, receiver, kind, cid, ts, rows in rows if kind in _KINDS
        )

    def _index_rows(self, epoch: int, receivers: Iterable[int] | None, after: int) -> list[tuple] | None:
        """:meth:`index`'s rows, ``(*_EVENT_KEY, rows)``, read by delta-rs: only the control columns of
        the files whose statistics may hold positions past ``after`` of ``epoch`` (no Spark job: an
        index is a few columns of the step's files). None for a table with a reader feature pyarrow
        datasets lack (deletion vectors a user turned on, say): Spark reads that one."""
        import pyarrow.dataset as ds
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaProtocolError

        try:
            dataset = DeltaTable(self.path).to_pyarrow_dataset()
        except DeltaProtocolError:
            return None
        where = (ds.field("seq") > after) & (ds.field("epoch") == epoch)
        if receivers is not None:
            where = where & ds.field("receiver").isin(list(receivers))
        table = dataset.to_table(columns=list(_EVENT_KEY), filter=where)
        counted = table.group_by(list(_EVENT_KEY), use_threads=False).aggregate([([], "count_all")])
        return list(zip(*(counted.column(c).to_pylist() for c in (*_EVENT_KEY, "count_all"))))

    def index_past(self, epoch: int, after: int) -> list[ChannelEvent]:
        """:meth:`index` past ``after`` for its reader, without the Spark job when the log's Delta
        version did not move since the index that left the reader at ``after`` (an idle poll:
        nothing new)."""
        from ..delta.log import latest_version

        version = latest_version(self.path)
        if self._indexed == (version, epoch, after):
            return []  # that version of the log holds nothing of this epoch past ``after``
        events = self.index(epoch, after=after)
        self._indexed = (version, epoch, max((e.seq for e in events), default=after))
        return events

    def read(self, segments: Iterable[ChannelEvent], epoch: int) -> DataFrame:
        """The records of ``segments`` (data events of ``epoch``): ``sender``, ``receiver`` and
        the record's columns (what the operator's stage reads; nothing else of ours)."""
        df = self.read_packed(segments, epoch)
        return df.select("sender", "receiver", *[F.col(f"{RECORD}.`{n}`").alias(n) for n in self.payload.fieldNames()])

    def read_packed(self, segments: Iterable[ChannelEvent], epoch: int) -> DataFrame:
        """The records of ``segments`` as ``sender``, ``receiver``, ``seq`` and :data:`RECORD` (a
        struct of the record's columns), whatever the log's layout: what channel state copies."""
        keys = sorted({(e.sender, e.receiver, e.seq) for e in segments if e.kind == DATA})
        if not keys:
            empty = self.spark.createDataFrame([], self.schema)
            record = F.col(RECORD) if self.nested else packed(empty, self.payload)
            return empty.select("sender", "receiver", "seq", record.alias(RECORD))
        seqs = [k[2] for k in keys]
        # Only the files whose statistics may hold the segments' positions of this epoch (each append
        # is its own files, with min/max seq stats), however long the untruncated log: chosen on the
        # driver from the log (tables.files_read), or by Delta's data skipping when Delta reads it.
        df = tables.files_read(self.spark, self.path, bounds={"seq": (min(seqs), max(seqs)), "epoch": (epoch, epoch)})
        df = df.where((F.col("kind") == DATA) & (F.col("epoch") == epoch) & F.col("seq").between(min(seqs), max(seqs)))
        key_df = self.spark.createDataFrame(keys, "sender int, receiver int, seq long")
        df = df.join(F.broadcast(key_df), ["sender", "receiver", "seq"])
        record = F.col(RECORD) if self.nested else packed(df, self.payload)
        return df.select("sender", "receiver", "seq", record.alias(RECORD))

    def truncate_after(self, seq: int, epoch: int) -> None:
        """Delete every event after position ``seq`` written by ``epoch`` or an older one (recovery:
        the senders will write them again). Never a newer epoch's: a stalled older attempt that
        wakes up cannot delete what the attempt that took over wrote."""
        tables.delete_within(self.spark, self.path, {"seq": (seq + 1, None), "epoch": (None, epoch)},
                             what=f"truncating the channel log {self.path} after position {seq}")

    def truncate_upto(self, seq: int, epoch: int) -> None:
        """Remove the events at or before ``seq`` written by ``epoch`` or an older one (no retained
        checkpoint needs them, no reader reads them again); never a newer epoch's (see
        :meth:`truncate_after`). Whole files, one delta-rs commit (:func:`tables.remove_files_within`:
        a step's files hold its positions alone); a file that also holds later positions stays
        until they are truncated too. A log delta-rs may not remove files of: Delta's DELETE."""
        bounds = {"seq": (None, seq), "epoch": (None, epoch)}
        what = f"truncating the channel log {self.path} up to position {seq}"
        if not tables.remove_files_within(self.path, bounds, what=what):
            tables.delete_within(self.spark, self.path, bounds, what=what)

    def clear(self, epoch: int) -> None:
        """Delete every event of ``epoch`` and older ones (never a newer epoch's)."""
        tables.delete_within(self.spark, self.path, {"epoch": (None, epoch)},
                             what=f"clearing the channel log {self.path} of epoch {epoch} and older ones")


class ChannelStateTable:
    """The channel-state table: per checkpoint, the in-flight records each receiving subtask
    logged, with their channel (``receiver``, ``sender``) and position (``seq``), the record in
    :data:`RECORD` (an earlier version's flat table keeps its layout: :func:`nests_records`)."""

    OURS = (
        T.StructField("checkpoint_id", T.LongType(), False),
        T.StructField("receiver", T.IntegerType(), False),
        T.StructField("sender", T.IntegerType(), False),
        T.StructField("seq", T.LongType(), False),
    )

    def __init__(self, spark: SparkSession, path: str, payload: T.StructType):
        self.spark = spark
        self.path = path
        self.payload = payload
        self._nested: bool | None = None

    @property
    def nested(self) -> bool:
        if self._nested is None:
            self._nested = nests_records(
                self.path, [f.name for f in self.OURS], self.payload.fieldNames(), "the channel-state table",
                "Rename that record column (a map() can): the table holds the retained checkpoints' records in flight.")
        return self._nested

    @property
    def schema(self) -> T.StructType:
        record = [T.StructField(RECORD, self.payload, True)] if self.nested else list(self.payload.fields)
        return T.StructType(list(self.OURS) + record)

    def create(self) -> None:
        tables.create_if_missing(self.spark, self.path, self.schema)

    def append(self, checkpoint_id: int, records: DataFrame) -> None:
        """Append ``records`` (``sender``, ``receiver``, ``seq`` and :data:`RECORD`, as
        :meth:`DeltaChannelLog.read_packed` gives them) as the channel state of ``checkpoint_id``."""
        record = [RECORD] if self.nested else [F.col(f"{RECORD}.`{n}`").alias(n) for n in self.payload.fieldNames()]
        tables.blind_append(records.select(
            F.lit(checkpoint_id).cast("long").alias("checkpoint_id"), "receiver", "sender", "seq", *record), self.path)

    def records(self, checkpoint_id: int, receivers: Iterable[int] | None = None) -> DataFrame:
        """The records ``receivers`` (all: None) logged for ``checkpoint_id``: ``sender``,
        ``receiver`` and the record's columns (what a restore replays)."""
        df = tables.files_read(self.spark, self.path, bounds={"checkpoint_id": (checkpoint_id, checkpoint_id)})
        df = df.where(F.col("checkpoint_id") == checkpoint_id)
        if receivers is not None:
            df = df.where(F.col("receiver").isin(list(receivers)))
        record = [F.col(f"{RECORD}.`{n}`").alias(n) if self.nested else F.col(f"`{n}`") for n in self.payload.fieldNames()]
        return df.select("sender", "receiver", *record)


def read_channel_state(spark: SparkSession, path: str, checkpoint_id: int, record: bool = True,
                       table: DataFrame | None = None) -> DataFrame:
    """The records in flight that checkpoint ``checkpoint_id`` logged in the channel-state table at
    ``path``, whatever its layout: the record's columns, beside ``checkpoint_id``, ``receiver``,
    ``sender`` and ``seq`` (a record column of one of those names hides ours: ``sender`` and
    ``receiver`` are reserved, the others are not); without ``record``, those four only (always
    ours: where each record was). The one reader of that table outside the runtime (the quality
    views, ``inspect``). ``table``: that table already loaded (a caller reading it more than once
    loads it once)."""
    if table is None:
        table = spark.read.format("delta").load(path)
    df = table.where(F.col("checkpoint_id") == checkpoint_id)
    if not record:
        return df.select(*[f.name for f in ChannelStateTable.OURS])
    if set(df.columns) != {*[f.name for f in ChannelStateTable.OURS], RECORD}:
        return df  # an earlier version's flat table
    fields = df.schema[RECORD].dataType.fieldNames()
    ours = [F.col(c) for c in ("checkpoint_id", "receiver", "sender", "seq") if c not in fields]
    return df.select(*ours, *[F.col(f"{RECORD}.`{n}`").alias(n) for n in fields])


def pipeline_channel_state_tables(root: str, pipeline: Any) -> list[tuple[str, bool]]:
    """Every channel-state table a linear pipeline's checkpoints may have logged into, as ``(path,
    feedback)``: the one table of checkpoints taken before the graph runtime ran linear pipelines
    (``channel_state``, feedback channels already numbered from the source parallelism), then its
    graph's per-edge tables: the source edge's (``source_<uid>``) and, with ``iterate()``, the
    feedback edge's (``<uid>_<uid>``, ``feedback``: its senders are channels S + i)."""
    from ..graph.lowering import SOURCE
    from ..layout import channel_name, channel_state_table

    uid = pipeline.operator_uid
    paths = [(str(channel_state_table(root)), False), (str(channel_state_table(root, channel_name(SOURCE, uid))), False)]
    if pipeline.feedback:
        paths.append((str(channel_state_table(root, channel_name(uid, uid))), True))
    return paths


def source_senders(operators: Iterable[str], declared: int) -> int:
    """How many source subtasks a linear pipeline's checkpoint had (its channels ``0..S-1``; the
    feedback channels are numbered from S): the source acks among ``operators`` (each ack's
    operator id), or ``declared`` (the pipeline's source parallelism) when it holds none."""
    from ..graph.lowering import SOURCE

    return sum(1 for operator in operators if operator == SOURCE) or declared


def read_pipeline_channel_state(spark: SparkSession, root: str, pipeline: Any, checkpoint_id: int, sources: int,
                                record: bool = True, load: Callable[[str], DataFrame] | None = None
                                ) -> DataFrame | None:
    """The records in flight that checkpoint ``checkpoint_id`` of the linear ``pipeline`` logged,
    as :func:`read_channel_state` gives them, whichever tables hold them
    (:func:`pipeline_channel_state_tables`), the channels numbered as a linear pipeline's: a source
    subtask ``i`` is channel ``i``, a feedback sender ``j`` channel ``sources + j`` (``sources``: the
    checkpoint's source parallelism). None when no such table exists. ``load``: reads a table (a
    caller that loads each table once)."""
    from ..delta import log as delta_log

    parts = []
    for path, feedback in pipeline_channel_state_tables(root, pipeline):
        if not delta_log.is_delta_table(path):
            continue
        df = read_channel_state(spark, path, checkpoint_id, record, table=None if load is None else load(path))
        if feedback:
            df = df.withColumn(SENDER, F.col(SENDER) + F.lit(int(sources)))
        parts.append(df)
    if not parts:
        return None
    out = parts[0]
    for df in parts[1:]:
        out = out.unionByName(df, allowMissingColumns=True)
    return out

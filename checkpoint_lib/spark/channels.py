"""Persisted channels: a Delta log of records and barriers per (sender, receiver) subtask pair.

One table holds every channel of one edge of the pipeline graph (e.g. ``source -> keyed``). Each
row carries ``sender``, ``receiver``, a position ``seq`` and a ``kind``:

- ``data``: a record of the segment at ``seq`` (all rows of one segment share the position);
- ``barrier``: the barrier of ``checkpoint_id`` at ``seq`` (one row per channel);
- ``end``: the channel ended (one row per channel).

Positions increase along every channel. Readers learn what there is from :meth:`index` (one small
aggregation, collected to the driver: it is metadata), hand segments to the barrier handlers as
opaque records, and read the data of the segments they deliver with :meth:`read` (a Spark
DataFrame, never collected). Recovery cuts everything after the restored positions
(:meth:`truncate_after`); completed checkpoints let older positions go (:meth:`truncate_upto`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from . import tables

DATA, BARRIER, END = "data", "barrier", "end"

CONTROL_COLUMNS = [
    T.StructField("sender", T.IntegerType(), False),
    T.StructField("receiver", T.IntegerType(), False),
    T.StructField("seq", T.LongType(), False),
    T.StructField("kind", T.StringType(), False),
    T.StructField("checkpoint_id", T.LongType(), True),
    T.StructField("barrier_ts", T.DoubleType(), True),
    T.StructField("epoch", T.LongType(), False),
]


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


class DeltaChannelLog:
    def __init__(self, spark: SparkSession, path: str, payload: T.StructType):
        self.spark = spark
        self.path = path
        self.payload = payload
        self.schema = T.StructType(CONTROL_COLUMNS + list(payload.fields))

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
                frames.append(
                    df.withColumn("seq", F.lit(seq).cast("long"))
                    .withColumn("kind", F.lit(DATA))
                    .withColumn("checkpoint_id", F.lit(None).cast("long"))
                    .withColumn("barrier_ts", F.lit(None).cast("double"))
                    .withColumn("epoch", F.lit(epoch).cast("long"))
                    .select(*self.schema.fieldNames())
                )
            elif part[0] == BARRIER:
                _, pos, (cid, ts), senders, receivers = part
                markers += [(s, r, pos, BARRIER, cid, ts, epoch) for s in senders for r in receivers]
            elif part[0] == END:
                _, pos, senders, receivers = part
                markers += [(s, r, pos, END, None, None, epoch) for s in senders for r in receivers]
            else:
                raise ValueError(f"unknown channel entry {part[0]!r}")
        if markers:
            rows = [m + (None,) * len(self.payload.fields) for m in markers]
            frames.append(self.spark.createDataFrame(rows, self.schema))
        if not frames:
            return
        df = frames[0]
        for f in frames[1:]:
            df = df.unionByName(f)
        df.write.format("delta").mode("append").save(self.path)

    def index(self, epoch: int, receivers: Iterable[int] | None = None, after: int = -1) -> list[ChannelEvent]:
        """Every event ``epoch`` wrote with position > ``after`` (for ``receivers``), in position
        order. After a recovery everything past the cut is rewritten by the new epoch, so rows of
        any other epoch there are a zombie's and are ignored."""
        df = self.spark.read.format("delta").load(self.path).where((F.col("seq") > after) & (F.col("epoch") == epoch))
        if receivers is not None:
            df = df.where(F.col("receiver").isin(list(receivers)))
        rows = (
            df.groupBy("seq", "sender", "receiver", "kind", "checkpoint_id", "barrier_ts")
            .agg(F.count(F.lit(1)).alias("rows"))
            .collect()
        )
        return sorted(
            ChannelEvent(r.seq, r.sender, r.receiver, r.kind, r.checkpoint_id, r.barrier_ts,
                         r.rows if r.kind == DATA else 0)
            for r in rows
        )

    def read(self, segments: Iterable[ChannelEvent], epoch: int) -> DataFrame:
        """The records of ``segments`` (data events of ``epoch``), with sender, receiver, seq."""
        keys = sorted({(e.sender, e.receiver, e.seq) for e in segments if e.kind == DATA})
        df = self.spark.read.format("delta").load(self.path).where((F.col("kind") == DATA) & (F.col("epoch") == epoch))
        if not keys:
            return df.limit(0)
        # Redundant with the join, but lets Delta skip every file outside the segments' positions
        # (each append is its own files, with min/max seq stats), however long the untruncated log.
        seqs = [k[2] for k in keys]
        df = df.where(F.col("seq").between(min(seqs), max(seqs)))
        key_df = self.spark.createDataFrame(keys, "sender int, receiver int, seq long")
        return df.join(F.broadcast(key_df), ["sender", "receiver", "seq"])

    def truncate_after(self, seq: int, epoch: int) -> None:
        """Delete every event after position ``seq`` written by ``epoch`` or an older one (recovery:
        the senders will write them again). Never a newer epoch's: a stalled older attempt that
        wakes up cannot delete what the attempt that took over wrote."""
        tables.delete_where(self.spark, self.path, (F.col("seq") > seq) & (F.col("epoch") <= epoch))

    def truncate_upto(self, seq: int, epoch: int) -> None:
        """Delete every event at or before ``seq`` written by ``epoch`` or an older one (no retained
        checkpoint needs them); never a newer epoch's (see :meth:`truncate_after`)."""
        tables.delete_where(self.spark, self.path, (F.col("seq") <= seq) & (F.col("epoch") <= epoch))

    def clear(self, epoch: int) -> None:
        """Delete every event of ``epoch`` and older ones (never a newer epoch's)."""
        tables.delete_where(self.spark, self.path, F.col("epoch") <= epoch)

"""Records may use the names the library uses for its own bookkeeping (issue 46): the channel
logs' control columns (``kind``, ``seq``, ``checkpoint_id``, ``barrier_ts``, ``epoch``), the dead
letters' ``error``, the struct ``record`` they keep records in, the temporaries of earlier versions
(``_error``, ``_rank``, ...) and a sink's staging columns (as record columns). What must stay
reserved is refused at declaration (``tests/core/test_reserved.py``). Tables an earlier version
wrote, with the records' columns beside ours, keep their layout and still restore."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.pipeline import FEEDBACK, DeltaSink, DeltaSource, Pipeline
from checkpoint_lib.reserved import RECORD, ReservedColumnError
from checkpoint_lib.spark import inspect, tables
from checkpoint_lib.spark.runner import PipelineRunner
from checkpoint_lib.verify import read_delta

pytestmark = pytest.mark.spark

NAMES = {
    # the channel logs' and channel-state table's own columns, the dead letters' own columns
    "kind": "string", "seq": "long", "checkpoint_id": "long", "barrier_ts": "double", "epoch": "long",
    "error": "string", "record": "string",
    # temporaries of earlier versions, and a sink's staging columns (reserved in sinks only)
    "_error": "string", "_rank": "long", "_file_path": "string", "_ttl_first": "string", "_delete": "string",
    "txn_handle": "string", "txn_seq": "long", "flush": "long",
}
SOURCE = {"id": "string", "account": "string", "other": "string", "amount": "long", "hops": "integer", **NAMES}
SINK_NAMES = [c for c in SOURCE if c not in ("txn_handle", "txn_seq", "flush")]
OFFSETS = ("src_version", "src_file", "src_row")


class Totals:
    """Sums ``amount`` per account and writes every record it sees; with ``cycle``, a record with
    hops left goes back to its ``other`` account (a feedback edge into itself)."""

    state_schema = "total long"
    order_by = OFFSETS

    def __init__(self, source: dict[str, str], cycle: bool = False):
        self.source, self.cycle = source, cycle

    def apply(self, records, state, key):
        expected = {*self.source, *OFFSETS, "sink_subtask"}  # nothing else of ours
        assert set(records.columns) == expected, sorted(set(records.columns) ^ expected)
        deltas = records.groupBy(key).agg(F.sum("amount").alias("total"))
        totals = deltas.join(state.withColumnRenamed("total", "before"), key, "left").select(
            key, (F.coalesce("before", F.lit(0)) + F.col("total")).alias("total"))
        outputs = {"out": records.select(*[c for c in self.source if c in SINK_NAMES]), "totals": totals}
        if self.cycle:
            outputs[FEEDBACK] = records.where(F.col("hops") > 0).select(
                *[F.col("other").alias("account") if c == "account" else F.col("account").alias("other")
                  if c == "other" else (F.col("hops") - 1).cast("int").alias("hops") if c == "hops" else F.col(c)
                  for c in self.source], *OFFSETS, "sink_subtask")
        return deltas, outputs


def bad_amount(df):
    return F.when(F.col("amount").isNull(), F.lit("null amount"))


def pipeline(name: str, source: dict[str, str] = SOURCE, cycle: bool = False) -> Pipeline:
    sink = [(c, t) for c, t in source.items() if c in SINK_NAMES]
    p = (
        Pipeline(name)
        .source(DeltaSource(f"landing/{name}", source, validate=bad_amount), parallelism=2)
        .key_by("account", parallelism=2)
        .process(Totals(source, cycle), uid="totals")
    )
    if cycle:
        p = p.iterate()
    return (
        p.sink("out", DeltaSink(f"gold/{name}", tuple(sink)))
        .sink("totals", DeltaSink(f"gold/{name}_totals", "account string, total long", mode="upsert", keys=("account",)))
        .dead_letters(f"dlq/{name}")
    )


def land(spark, w: str, name: str, batches: int = 3, rows: int = 10, source: dict[str, str] = SOURCE) -> None:
    """``batches`` versions of ``rows`` rows in two files each; every fifth amount is null (a dead letter)."""
    values = {"string": lambda b, i, c: f"{c}-{b}-{i}", "long": lambda b, i, c: 1000 * b + i,
              "double": lambda b, i, c: b + i / 10, "integer": lambda b, i, c: 1}
    for b in range(batches):
        data = []
        for i in range(rows):
            row = {c: values[t](b, i, c) for c, t in source.items()}
            row.update(id=f"e{b}-{i}", account=f"a{i % 3}", other=f"a{(i + 1) % 3}", amount=None if i % 5 == 4 else i + 1)
            data.append(tuple(row[c] for c in source))
        ddl = ", ".join(f"`{c}` {t}" for c, t in source.items())
        spark.createDataFrame(data, ddl).coalesce(2).write.format("delta").mode("append").save(f"{w}/landing/{name}")


def check_outputs(w: str, name: str, source: dict[str, str] = SOURCE, hops: int = 0) -> None:
    """Every valid record in the sink exactly once (``hops + 1`` times through a cycle) with its
    own values in the columns named like ours, every bad one a dead letter with its values (in the
    source's types; as text in an earlier version's flat table)."""
    landing = read_delta(f"{w}/landing/{name}")
    good, bad = landing[landing["amount"].notna()], landing[landing["amount"].isna()]
    out = read_delta(f"{w}/gold/{name}")
    names = [c for c in source if c in SINK_NAMES and c not in ("account", "other", "hops")]
    got = sorted(tuple(r) for r in out[names].itertuples(index=False))
    want = sorted(tuple(r) for r in good[names].itertuples(index=False) for _ in range(hops + 1))
    assert got == want
    totals = dict(zip(*read_delta(f"{w}/gold/{name}_totals")[["account", "total"]].T.values))
    assert sum(totals.values()) == (hops + 1) * int(good["amount"].sum())
    dlq = read_delta(f"{w}/dlq/{name}")
    assert set(dlq["error"]) == {"null amount"} and len(dlq) == len(bad)
    # the bad row's columns: typed in ``record``, or as text beside ours in an earlier version's flat table
    nested = tables.columns_of(f"{w}/dlq/{name}")[RECORD] == "struct" if RECORD in dlq.columns else False
    letters = list(dlq[RECORD]) if nested else dlq[list(source)].to_dict("records")
    if nested:
        cols = [c for c in source if c != "amount"]
        got = sorted(tuple(r[c] for c in cols) for r in letters)
        assert got == sorted(tuple(r[c] for c in cols) for r in bad.to_dict("records"))
    else:
        texts = [c for c, t in source.items() if t in ("string", "long", "integer") and c != "amount"]
        got = sorted(tuple(r[c] for c in texts) for r in letters)
        assert got == sorted(tuple(str(r[c]) for c in texts) for r in bad.to_dict("records"))


def channel_state_rows(w: str, name: str) -> dict[int, int]:
    store = DeltaCheckpointStore.open(f"{w}/_checkpoints/{name}")
    return {c.checkpoint_id: sum(a.channel_state_rows for a in c.acks.values()) for c in store.checkpoints.all()}


def test_records_named_like_our_columns_run_unaligned_with_a_lagging_source_and_into_the_dead_letters(spark, tmp_path):
    w = str(tmp_path)
    # unaligned with a lagging source: records in the channel log and in channel state, then a
    # restore of a checkpoint with channel state replays them exactly once
    name = "names"
    land(spark, w, name, batches=2)
    p = pipeline(name)
    PipelineRunner(p, w, spark, rows_per_checkpoint=10, mode="unaligned", lagging_sources=1, chaining=False).run()
    check_outputs(w, name)
    logged = [cid for cid, rows in channel_state_rows(w, name).items() if rows]
    assert logged, channel_state_rows(w, name)
    chan = inspect.channel_state(spark, w, p, logged[0])
    assert {"kind", "epoch", "error", "record", "sender", "receiver"} <= set(chan.columns)  # the records' own
    assert chan.where(F.col("kind").startswith("kind-")).count() == chan.count() > 0
    again = PipelineRunner(p, w, spark, rows_per_checkpoint=10, mode="unaligned", lagging_sources=1, chaining=False,
                           restore_checkpoint=logged[0]).run()
    assert again.restored == logged[0]
    check_outputs(w, name)


@pytest.mark.slow  # CI tier: the test above (channel log, channel state, dead letters); the feedback log is the
# channel log's class, and transfers' cycle runs in CI (test_transfers.py::test_the_commit_phase_commits_only_a_validated_checkpoint)
def test_records_named_like_our_columns_run_chained_and_go_round_a_cycle(spark, tmp_path):
    w = str(tmp_path)
    # chained: no channel, the same records and dead letters
    land(spark, w, "chained", batches=2)
    PipelineRunner(pipeline("chained"), w, spark, rows_per_checkpoint=10).run()
    check_outputs(w, "chained")
    # a cycle: every record goes round once more, on the feedback log
    land(spark, w, "cycle", batches=2)
    PipelineRunner(pipeline("cycle", cycle=True), w, spark, rows_per_checkpoint=10, mode="unaligned").run()
    check_outputs(w, "cycle", hops=1)


PLAIN = {c: t for c, t in SOURCE.items() if c in ("id", "account", "other", "amount", "hops", "_error", "_rank")}


@pytest.mark.slow  # CI tier: two runs more; CI runs the current layout's restore above and the refusals in tests/core
def test_tables_an_earlier_version_wrote_flat_keep_their_layout_and_restore(spark, tmp_path):
    """The channel log and the dead letters created the way earlier versions did (the records'
    columns beside ours): written in that layout, a checkpoint with channel state restored; a
    record column named like one of their own is refused, naming it."""
    from pyspark.sql import types as T

    from checkpoint_lib.layout import channel_log
    from checkpoint_lib.spark.channels import CONTROL_COLUMNS, DeltaChannelLog
    from checkpoint_lib.spark.vertices.gate import payload_of

    w, name = str(tmp_path), "flat"
    land(spark, w, name, source=PLAIN)
    p = pipeline(name, PLAIN)
    r = PipelineRunner(p, w, spark)
    r._wire_state()  # every output's columns, from the plans on empty inputs (nothing written)
    payload = payload_of(r.schemas[("source", "records")])
    log_path = str(channel_log(r.root, "source", p.operator_uid))
    dead_letters = r.sources["source"].dead_letters
    for flat in (DeltaChannelLog(spark, log_path, payload).schema, dead_letters.table_schema()):
        assert RECORD in flat.fieldNames()  # before anything exists: ours
    tables.create_if_missing(spark, log_path, T.StructType(CONTROL_COLUMNS + list(payload.fields)),
                             partition_by=["receiver"])
    tables.create_if_missing(spark, dead_letters.path, T.StructType(
        [T.StructField(c, T.StringType()) for c in PLAIN] +
        [f for f in dead_letters.table_schema().fields if f.name != RECORD]))

    kw = dict(rows_per_checkpoint=10, mode="unaligned", lagging_sources=1, chaining=False)
    PipelineRunner(p, w, spark, **kw).run()
    for path in (log_path, dead_letters.path):
        assert RECORD not in tables.columns_of(path) and "amount" in tables.columns_of(path), path
    check_outputs(w, name, PLAIN)
    logged = [cid for cid, rows in channel_state_rows(w, name).items() if rows]
    assert logged
    assert PipelineRunner(p, w, spark, restore_checkpoint=logged[0], **kw).run().restored == logged[0]
    check_outputs(w, name, PLAIN)

    # the records gain a column named like one of the flat tables' own: refused, naming it and the way out
    renamed = pipeline(name, {**PLAIN, "kind": "string"})
    with pytest.raises(ReservedColumnError, match="column 'kind'.*channel log|channel log.*'kind'"):
        PipelineRunner(renamed, w, spark, **kw).open()
    dlq = PipelineRunner(pipeline(name, {**PLAIN, "error": "string"}), w, spark).sources["source"].dead_letters
    with pytest.raises(ReservedColumnError, match="dead-letter table.*'error'.*Start a new dead-letter table"):
        dlq.table_schema()

"""Our tables beside the rest of a lakehouse: what other tools and other pipelines do to them
(and what they hold) never makes us lose or duplicate a row silently.

- a Delta source's files are identified by their full path in the table, however Spark encodes
  it: files that share a base name in different folders (an append sink's ``txn_handle=``
  folders, Hive-style partitions) are each read once, and a name with a space, ``%``, ``+`` or
  non-ASCII characters is read, not skipped;
- an append sink's abort deletes only files no version of the target references: a recovery
  after an OPTIMIZE (which took committed files out of the current snapshot) keeps them, so time
  travel and the rollback to a retained checkpoint still work;
- a target that exists with other columns than the sink declares is refused before any write,
  both schemas named.
"""

from __future__ import annotations

import os
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pyspark.sql import functions as F
from pyspark.sql import types as T

from checkpoint_lib.core.twophase import Transaction
from checkpoint_lib.pipeline import DeltaSource
from checkpoint_lib.spark.sinks import DeltaTwoPhaseSink, SinkConfigurationError
from checkpoint_lib.spark.sources import SourceSite, source_reader

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("event_id", pa.string()), ("amount", pa.int64())])


def _commit_files(table: str, files: dict[str, pa.Table]) -> None:
    """Write each table of ``files`` as Parquet at its path relative to ``table``, and add them all in
    one commit (delta-rs URI-encodes each path in the log, as Delta's protocol says)."""
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction

    actions = []
    for relative, rows in files.items():
        path = os.path.join(table, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(rows, path)
        stats = f'{{"numRecords": {rows.num_rows}}}'
        actions.append(AddAction(relative, os.path.getsize(path), {}, 0, True, stats))
    dt = DeltaTable(table)
    dt.create_write_transaction(actions, mode="append", schema=dt.schema())


def _rows(prefix: str, n: int) -> pa.Table:
    return pa.Table.from_pylist([{"event_id": f"{prefix}-{i}", "amount": i} for i in range(n)], schema=SCHEMA)


def _read_all(spark, table: str, tmp_path) -> list:
    site = SourceSite(spark, table, str(tmp_path / "root"), "neighbours", progress=lambda _: None)
    reader = source_reader(DeltaSource(path="landing", schema={"event_id": "string", "amount": "long"}), site)
    step = reader.next_step(-1, reader.latest(), 1_000_000)
    return reader.read(step, senders=2).select("event_id", "src_file", "src_row", "src_version").collect()


@pytest.fixture(params=["map literal", "broadcast join"])
def file_lookup(request, monkeypatch):
    """Both ways a step's rows find their file: a map literal in the scan's plan (a step of up to
    ``tables.LITERAL_ENTRIES`` files) and broadcast joins (more)."""
    from checkpoint_lib.spark import tables

    monkeypatch.setattr(tables, "LITERAL_ENTRIES", 64 if request.param == "map literal" else 0)
    return request.param


def test_files_that_share_a_name_in_different_folders_are_each_read_once(spark, tmp_path, file_lookup):
    """What a pipeline reading another pipeline's append sink sees: one flush writes a
    ``part-00000-<uuid>.c000.snappy.parquet`` into every ``txn_handle=...`` folder."""
    from deltalake import write_deltalake

    table = str(tmp_path / "landing")
    write_deltalake(table, _rows("v0", 0).slice(0, 0))
    name = "part-00000-0f0e.c000.snappy.parquet"
    _commit_files(table, {f"_pending/w1/txn_handle={h}/{name}": _rows(h, 100) for h in ("a", "b", "c")})

    rows = _read_all(spark, table, tmp_path)
    assert len(rows) == 300
    assert len({r.event_id for r in rows}) == 300
    # each row's offset names its own file: the offsets of two rows never collide
    assert len({(r.src_version, r.src_file, r.src_row) for r in rows}) == 300
    assert {r.src_file for r in rows} == {f"_pending/w1/txn_handle={h}/{name}" for h in ("a", "b", "c")}


@pytest.mark.parametrize("name", ["export 2.parquet", "100%.parquet", "a+b.parquet", "zürich é.parquet",
                                  "dir with space/x y.parquet"])
def test_a_file_whose_name_needs_escaping_is_read(spark, tmp_path, name, file_lookup):
    from deltalake import write_deltalake

    table = str(tmp_path / "landing")
    write_deltalake(table, _rows("plain", 5))
    _commit_files(table, {name: _rows("odd", 7)})

    rows = _read_all(spark, table, tmp_path)
    assert sorted(r.event_id for r in rows) == sorted([f"plain-{i}" for i in range(5)] + [f"odd-{i}" for i in range(7)])
    assert {r.src_file for r in rows if r.event_id.startswith("odd")} == {name}


def test_a_row_of_a_file_the_step_does_not_name_fails_the_read(spark, tmp_path, file_lookup):
    """A row whose file is not one of the step's is never dropped nor given another file's offset."""
    from checkpoint_lib.reserved import temporary
    from checkpoint_lib.spark.paths import reported_path
    from checkpoint_lib.spark.sources import StepFile, _with_files

    table = tmp_path / "landing"
    table.mkdir()
    for name in ("known.parquet", "stray.parquet"):
        pq.write_table(_rows(name, 3), table / name)
    scan = spark.read.parquet(str(table)).select(
        "event_id", F.col("_metadata.file_path").alias(temporary("file_path")), F.col("_metadata.row_index").alias("src_row"))
    known = [StepFile(reported_path(f"{table}/known.parquet"), "known.parquet", 4, 1)]
    rows = _with_files(scan.where(F.col("event_id").startswith("known")), known, str(table)).collect()
    assert {(r.src_file, r.src_version, r.sender) for r in rows} == {("known.parquet", 4, 1)} and len(rows) == 3
    with pytest.raises(Exception, match="stray.parquet matches no file of the step"):
        _with_files(scan, known, str(table)).collect()


def test_a_step_of_few_files_finds_them_without_a_broadcast_job(spark, tmp_path):
    """Each broadcast join is a Spark job every time a plan reading the step runs."""
    from deltalake import write_deltalake

    from checkpoint_lib.spark import tables

    table = str(tmp_path / "landing")
    write_deltalake(table, _rows("a", 5))
    site = SourceSite(spark, table, str(tmp_path / "root"), "neighbours", progress=lambda _: None)
    reader = source_reader(DeltaSource(path="landing", schema={"event_id": "string", "amount": "long"}), site)
    step = reader.next_step(-1, reader.latest(), 1_000_000)
    plan = reader.read(step, senders=2)._jdf.queryExecution().executedPlan().toString()
    assert "Broadcast" not in plan, plan
    assert len(step) <= tables.LITERAL_ENTRIES


def test_the_driver_spells_each_files_path_as_spark_reports_it_so_rows_match_without_decoding(spark, tmp_path):
    """``reported_path`` is what ``_metadata.file_path`` says for every name Spark's writers and
    Delta give their files and for escaped ones too; only a non-ASCII name (which java.net.URI
    leaves as it is) is spelled otherwise, and its rows are matched by their decoded path
    (``test_a_file_whose_name_needs_escaping_is_read``). Without it every row's path was decoded by
    a regular expression and a URL decoding: about a quarter of a 1M-row step (measured 0.75-0.77)."""
    from checkpoint_lib.spark.paths import reported_path, spark_path

    names = ["part-00000-0f0e-4a1b.c000.snappy.parquet", "txn_handle=a-1/part-0.parquet", "export 2.parquet",
             "100%.parquet", "a+b.parquet", "a[1]{x}.parquet", "c,;$&=@!'()*~.parquet", "dir with space/x y.parquet",
             "zürich é.parquet"]
    table = tmp_path / "t t"
    for name in names:
        (table / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(_rows("x", 1), table / name)
    for root in (str(table), f"file:{table}", f"file://{table}", f"{table}/./"):
        for name in names:
            reported = spark.read.parquet(spark_path(f"{root}/{name}")).select("_metadata.file_path").first()[0]
            if name.isascii():
                assert reported_path(f"{root}/{name}") == reported, (root, name)
            else:
                assert reported_path(f"{root}/{name}") != reported


SINK_SCHEMA = T.StructType([T.StructField("account", T.StringType()), T.StructField("amount_cents", T.LongType())])


def test_a_source_with_deletion_vectors_enabled_is_read_and_a_delete_on_it_is_refused(spark, tmp_path):
    """Deletion vectors on (Databricks' default for new tables, or an upgrade): an append-only
    table's files carry none, so they are read as before. A DELETE that gives a file one removes
    rows the source may have read: refused, naming the commit and the ways out."""
    from checkpoint_lib.delta.log import NotAppendOnlyError

    table = tmp_path / "landing"
    spark.sql(f"CREATE TABLE delta.`{table}` (event_id STRING, amount BIGINT) USING delta "
              "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"INSERT INTO delta.`{table}` VALUES ('a', 1), ('b', 2)")
    assert sorted(r.event_id for r in _read_all(spark, str(table), tmp_path)) == ["a", "b"]
    spark.sql(f"DELETE FROM delta.`{table}` WHERE event_id = 'a'")
    with pytest.raises(NotAppendOnlyError, match=r"version 2 \(DELETE\) removed data.*TO VERSION AS OF 1"):
        _read_all(spark, str(table), tmp_path)


def _sink(spark, tmp_path, schema=SINK_SCHEMA) -> DeltaTwoPhaseSink:
    return DeltaTwoPhaseSink(spark, "ledger", str(tmp_path / "ledger"), str(tmp_path / "staging"), schema,
                             app_prefix="checkpoint_lib/p")


def _stage(spark, sink, txn, rows, flush=1) -> None:
    sink.stage(spark.createDataFrame([(0, *r) for r in rows], "sink_subtask int, account string, amount_cents long"),
               {0: txn}, flush=flush)


def _every_version_readable(path: str) -> list[int]:
    """The row count of every version of the table (time travel reads each version's files)."""
    from deltalake import DeltaTable

    latest = DeltaTable(path).version()
    return [DeltaTable(path, version=v).to_pyarrow_table().num_rows for v in range(latest + 1)]


def test_a_recovery_after_an_optimize_keeps_the_committed_files_older_versions_reference(spark, tmp_path):
    """Committed transactions stay in the bookkeeping until their clean-up; a crash before it puts
    them on the recovery's abort list. The OPTIMIZE took their files out of the current snapshot,
    but the versions that committed them still reference them."""
    sink = _sink(spark, tmp_path)
    sink.create()
    for cid in (1, 2):
        txn = Transaction(cid, "a", 1, checkpoint_id=cid)
        _stage(spark, sink, txn, [(f"k{cid}-{i}", i) for i in range(3)])
        sink.commit([txn], cid, writer_epoch=1)
    open_txn = Transaction(3, "a", 1)
    _stage(spark, sink, open_txn, [("never", 1)])  # pre-committed, never committed: its files must go
    spark.sql(f"OPTIMIZE delta.`{sink.target}`")
    before = _every_version_readable(sink.target)

    sink.abort(sink.open_transactions())  # the recovery's abort of everything the checkpoint does not own

    assert sink.open_transactions() == []
    assert _every_version_readable(sink.target) == before
    assert spark.read.format("delta").load(sink.target).count() == 6
    left = {str(p.relative_to(sink.target)) for p in (tmp_path / "ledger").rglob("*.parquet")}
    assert not any("txn_handle=a.e1.s3" in p for p in left)  # the uncommitted transaction's files are gone


def test_a_target_with_other_columns_than_the_sink_declares_is_refused_before_any_write(spark, tmp_path):
    """A user pre-created the target with ``amount`` where the sink declares ``amount_cents``: a
    commit of bare add actions would land rows whose ``amount`` reads NULL."""
    path = tmp_path / "ledger"
    spark.sql(f"CREATE TABLE delta.`{path}` (account STRING, amount BIGINT) USING delta")
    sink = _sink(spark, tmp_path)
    with pytest.raises(SinkConfigurationError, match=r"amount_cents.*amount|amount.*amount_cents"):
        sink.create()
    retyped = tmp_path / "retyped"
    spark.sql(f"CREATE TABLE delta.`{retyped}` (account STRING, amount_cents INT) USING delta")
    other = DeltaTwoPhaseSink(spark, "ledger", str(retyped), str(tmp_path / "staging2"), SINK_SCHEMA,
                              app_prefix="checkpoint_lib/p")
    with pytest.raises(SinkConfigurationError, match="amount_cents"):
        other.create()
    from deltalake import DeltaTable

    assert DeltaTable(str(path)).version() == 0 and DeltaTable(str(retyped)).version() == 0  # nothing written


def test_a_target_with_more_nullable_columns_takes_the_rows_and_merge_schema_adds_declared_ones(spark, tmp_path):
    """Another writer's nullable column on the target (or an ALTER TABLE ADD COLUMNS while the
    pipeline is down) reads NULL in the pipeline's rows, as in a Spark append that lacks it, and an
    upsert keeps its values; a NOT NULL one is refused. A declared column the table lacks is refused
    unless the sink says ``merge_schema=True``, which adds it (nullable) before the first write."""
    from checkpoint_lib.verify import read_delta

    wide = tmp_path / "wide"
    spark.sql(f"CREATE TABLE delta.`{wide}/ledger` (account STRING, amount_cents BIGINT, note STRING) USING delta")
    sink = _sink(spark, wide)
    sink.create()
    txn = Transaction(1, "a", 1, checkpoint_id=1)
    _stage(spark, sink, txn, [("x", 1), ("y", 2)])
    sink.commit([txn], 1, writer_epoch=1)
    rows = read_delta(sink.target).sort_values("account")
    assert rows["amount_cents"].tolist() == [1, 2] and rows["note"].isna().all()

    required = tmp_path / "required"
    spark.sql(f"CREATE TABLE delta.`{required}/ledger` (account STRING, amount_cents BIGINT, note STRING NOT NULL) USING delta")
    with pytest.raises(SinkConfigurationError, match=r"NOT NULL columns \['note'\]"):
        _sink(spark, required).create()

    narrow = tmp_path / "narrow"
    spark.sql(f"CREATE TABLE delta.`{narrow}/ledger` (account STRING) USING delta")
    with pytest.raises(SinkConfigurationError, match=r"lacks \['amount_cents'\].*merge_schema=True"):
        _sink(spark, narrow).create()
    evolving = DeltaTwoPhaseSink(spark, "ledger", str(narrow / "ledger"), str(narrow / "staging"), SINK_SCHEMA,
                                 app_prefix="checkpoint_lib/p", merge_schema=True)
    evolving.create()
    evolving.create()  # idempotent
    _stage(spark, evolving, txn, [("z", 3)])
    evolving.commit([txn], 1, writer_epoch=1)
    assert read_delta(evolving.target).to_dict("records") == [{"account": "z", "amount_cents": 3}]

    upsert_schema = T.StructType([T.StructField("account", T.StringType()), T.StructField("balance", T.LongType())])
    spark.sql(f"CREATE TABLE delta.`{tmp_path}/balances` (account STRING, balance BIGINT, note STRING) USING delta")
    spark.sql(f"INSERT INTO delta.`{tmp_path}/balances` VALUES ('a', 1, 'kept')")
    upsert = DeltaTwoPhaseSink(spark, "balances", str(tmp_path / "balances"), str(tmp_path / "bstaging"),
                               upsert_schema, app_prefix="checkpoint_lib/p", mode="upsert", keys=["account"])
    upsert.create()
    upsert.stage(spark.createDataFrame([(0, "a", 5), (0, "b", 7)], "sink_subtask int, account string, balance long"),
                 {0: txn}, flush=1)
    upsert.commit([txn], 1, writer_epoch=1)
    got = read_delta(upsert.target).sort_values("account").to_dict("records")
    assert got == [{"account": "a", "balance": 5, "note": "kept"}, {"account": "b", "balance": 7, "note": None}]


@pytest.mark.slow  # ~45 s; CI tier: a RESTORE of a graph's source refused (test_graph_neighbours.py); the sinks'
# table checks before any write in tests/spark/test_sink_configuration.py
def test_a_sink_table_restored_by_someone_else_is_refused_and_our_own_rollback_is_not(spark, tmp_path):
    """A RESTORE keeps the commit stamps: after one back to checkpoint 1's version, the table says 3
    is committed while holding 1's rows. Committing 4 on top would lose 2 and 3 for good: refused,
    naming the way out. The pipeline's own rollback (a RESTORE too, tagged) is not refused."""
    from deltalake import DeltaTable

    from checkpoint_lib.spark.sinks import SinkTableRewoundError

    sink = _sink(spark, tmp_path)
    sink.create()
    versions = {}
    for cid in (1, 2, 3):
        txn = Transaction(cid, "a", 1, checkpoint_id=cid)
        _stage(spark, sink, txn, [(f"k{cid}", cid)])
        sink.commit([txn], cid, writer_epoch=1)
        versions[cid] = DeltaTable(sink.target).version()
    spark.sql(f"RESTORE TABLE delta.`{sink.target}` TO VERSION AS OF {versions[1]}")
    restore = DeltaTable(sink.target).version()
    fourth = Transaction(4, "a", 1, checkpoint_id=4)
    _stage(spark, sink, fourth, [("k4", 4)])
    with pytest.raises(SinkTableRewoundError, match=rf"RESTOREd to version {versions[1]} by version {restore}, which "
                       rf"holds what checkpoint 1 committed, while checkpoint 3 is committed.*TO VERSION AS OF "
                       rf"{restore - 1}.*ckpt recover p --checkpoint 1"):
        sink.commit([fourth], 4, writer_epoch=1)
    assert DeltaTable(sink.target).version() == restore  # nothing written

    sink.rollback_to(1)  # what `ckpt recover p --checkpoint 1` does to each sink (then it replays 2..)
    assert sink.commit([fourth], 4, writer_epoch=2) == [fourth]
    assert sorted(spark.read.format("delta").load(sink.target).toPandas()["account"]) == ["k1", "k4"]

    undone = tmp_path / "undone"
    other = _sink(spark, undone)
    other.create()
    for cid in (1, 2):
        txn = Transaction(cid, "a", 1, checkpoint_id=cid)
        _stage(spark, other, txn, [(f"k{cid}", cid)])
        other.commit([txn], cid, writer_epoch=1)
    latest = DeltaTable(other.target).version()
    spark.sql(f"RESTORE TABLE delta.`{other.target}` TO VERSION AS OF {latest - 1}")
    spark.sql(f"RESTORE TABLE delta.`{other.target}` TO VERSION AS OF {latest}")  # the user undid it
    third = Transaction(3, "a", 1, checkpoint_id=3)
    _stage(spark, other, third, [("k3", 3)])
    assert other.commit([third], 3, writer_epoch=1) == [third]


@pytest.mark.slow  # 75 s; CI tier: the abort after an OPTIMIZE above and the chained pipelines below (a recovery
# re-committing and aborting), tests/crash/test_object_store.py (killed between completion and commit)
def test_a_vacuum_that_deleted_a_completed_checkpoints_uncommitted_files_is_repaired_by_replaying_it(spark, tmp_path):
    """Killed between checkpoint 2's completion and its commit, then the ledger VACUUMed with a
    retention shorter than the downtime (here 0 hours, the safety check off): checkpoint 2's
    transaction files are gone, so it can never be committed. The next start restores checkpoint 1
    instead (rolling back whatever a sink committed of 2) and replays: exactly once, no dead end."""
    from checkpoint_lib.delta.store import DeltaCheckpointStore
    from checkpoint_lib.pipelines import get
    from checkpoint_lib.pipelines.payments import generate
    from checkpoint_lib.spark.runner import PipelineRunner
    from checkpoint_lib.spark.tables import session_confs
    from checkpoint_lib.verify import check_payments
    from in_process_kills import raise_at

    rows = 300
    for seed in (1, 2, 3):
        generate(spark, str(tmp_path), rows, bad_fraction=0.05, accounts=30, seed=seed)
    first = PipelineRunner(get("payments"), str(tmp_path), spark, rows_per_checkpoint=rows)
    first.ctx.kills.reached = raise_at("commit", 2)
    with pytest.raises(RuntimeError, match="killed"):
        first.run()
    ledger = tmp_path / "gold" / "ledger"
    staged = {p for p in (ledger / "ckpt").rglob("*.parquet")}
    with session_confs(spark, {"spark.databricks.delta.retentionDurationCheck.enabled": "false"}):
        spark.sql(f"VACUUM delta.`{ledger}` RETAIN 0 HOURS")
    assert staged - {p for p in (ledger / "ckpt").rglob("*.parquet")}, "the VACUUM deleted no uncommitted file"

    done = PipelineRunner(get("payments"), str(tmp_path), spark, rows_per_checkpoint=rows).run()

    assert done.restored == 1
    store = DeltaCheckpointStore.open(f"{tmp_path}/_checkpoints/payments")
    assert store.checkpoints.status(2)["status"] == "discarded" and "rolled back to checkpoint 1" in store.checkpoints.status(2)["message"]
    check = check_payments(str(tmp_path))
    assert check.ok, check.summary()
    assert check.ledger_rows == check.valid_rows


@pytest.mark.slow  # 50 s; CI tier: the reader tests above (a step's files matched by whole path)
def test_a_source_vacuumed_while_the_pipeline_lagged_fails_with_what_was_lost_and_what_to_do(spark, tmp_path):
    """The landing table is OPTIMIZEd and VACUUMed (0 hours) while the pipeline is behind it: the
    files of the versions it reads next are gone (their rows live on in the compacted file, which
    an incremental reader cannot tell apart). One clear message, naming the versions and the way
    out, instead of the engine's file-not-found; nothing of the step is committed."""
    from checkpoint_lib.pipelines import get
    from checkpoint_lib.pipelines.payments import generate
    from checkpoint_lib.spark.runner import PipelineRunner
    from checkpoint_lib.spark.sources import SourceFilesLostError
    from checkpoint_lib.spark.tables import session_confs

    generate(spark, str(tmp_path), 200, bad_fraction=0.05, accounts=20, seed=1)
    PipelineRunner(get("payments"), str(tmp_path), spark, rows_per_checkpoint=200).run()
    for seed in (2, 3):
        generate(spark, str(tmp_path), 200, bad_fraction=0.05, accounts=20, seed=seed)
    landing = tmp_path / "landing" / "payments"
    spark.sql(f"OPTIMIZE delta.`{landing}`")
    with session_confs(spark, {"spark.databricks.delta.retentionDurationCheck.enabled": "false"}):
        spark.sql(f"VACUUM delta.`{landing}` RETAIN 0 HOURS")
    ledger = spark.read.format("delta").load(str(tmp_path / "gold" / "ledger")).count()

    with pytest.raises(SourceFilesLostError, match=r"source versions 1\.\.2 \(read next, after version 0\).*"
                                                   r"files that are gone.*ckpt recover payments --checkpoint N"):
        PipelineRunner(get("payments"), str(tmp_path), spark, rows_per_checkpoint=1000).run()
    assert spark.read.format("delta").load(str(tmp_path / "gold" / "ledger")).count() == ledger


def test_two_pipelines_chained_through_a_sink_are_exactly_once_downstream_across_a_crash_in_each(spark, tmp_path):
    """A medallion chain: payments writes ``gold/ledger`` (an append sink: one flush writes a file of
    the same name into each of its 3 subtasks' transaction folders); a second pipeline reads that
    table as its source and keeps its own running balances in ``platinum/``. Each is killed in a
    two-phase-commit window (the second again during its recovery, between its two sinks'
    re-commits) and recovers; downstream every gold row is applied exactly once."""
    from checkpoint_lib.pipelines import get
    from checkpoint_lib.pipelines.payments import generate, running_balances
    from checkpoint_lib.spark.runner import PipelineRunner
    from checkpoint_lib.verify import check_payments, read_delta
    from in_process_kills import raise_at

    platinum = running_balances(
        "platinum", DeltaSource("gold/ledger", {"event_id": "string", "account": "string", "amount_cents": "long"}),
        ledger="platinum/ledger", balances="platinum/balances", dead_letters="dlq/platinum", parallelism=(2, 2),
    )
    w = str(tmp_path)
    for seed in (1, 2, 3):
        generate(spark, w, 200, bad_fraction=0.05, accounts=25, seed=seed)

    gold = PipelineRunner(get("payments"), w, spark, rows_per_checkpoint=200)
    gold.ctx.kills.reached = raise_at("commit", 2)  # checkpoint 2 complete, not committed
    with pytest.raises(RuntimeError, match="killed"):
        gold.run()
    silver = PipelineRunner(platinum, w, spark, rows_per_checkpoint=150)
    silver.ctx.kills.reached = raise_at("sink_commit", 1)  # its ledger committed, its balances not
    with pytest.raises(RuntimeError, match="killed"):
        silver.run()
    again = PipelineRunner(platinum, w, spark, rows_per_checkpoint=150)
    again.ctx.kills.reached = raise_at("restore", 2)  # its recovery, between the two sinks' re-commits
    with pytest.raises(RuntimeError, match="killed"):
        again.run()
    assert PipelineRunner(get("payments"), w, spark, rows_per_checkpoint=200).run().restored == 2
    assert PipelineRunner(platinum, w, spark, rows_per_checkpoint=150).run().restored == 1

    assert check_payments(w).ok
    gold_ledger, plat_ledger = read_delta(f"{w}/gold/ledger"), read_delta(f"{w}/platinum/ledger")
    assert len(plat_ledger) == len(set(plat_ledger["event_id"])) == len(gold_ledger) > 400
    assert set(plat_ledger["event_id"]) == set(gold_ledger["event_id"])
    balances = {r.account: (r.balance_cents, r.event_count) for r in read_delta(f"{w}/gold/balances").itertuples()}
    assert {r.account: (r.balance_cents, r.event_count)
            for r in read_delta(f"{w}/platinum/balances").itertuples()} == balances

"""The reference pipelines with the whole warehouse on a real S3-compatible server (SeaweedFS,
tests/s3server.py): landing, channel logs, state, channel state, sinks, requests and the control
plane on ``s3://``, killed with SIGKILL and recovered by running the same command again.

Spark reaches the server through S3A (``s3://`` mapped to it) and commits Delta versions with the
conditional-put log store; the control plane and the sinks' transaction files go through obstore.
The outputs are compared with the independent pandas computation, read back from the server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from checkpoint_lib.files import files_at
from checkpoint_lib.layout import location
from checkpoint_lib.pipelines import payments, transfers
from checkpoint_lib.quality import data_docs_index
from checkpoint_lib.spark.session import use_warehouse
from checkpoint_lib.submit import ckpt_run_argv, ckpt_run_env
from checkpoint_lib.verify import check_payments, check_transfers

pytestmark = [pytest.mark.crash, pytest.mark.spark, pytest.mark.objectstore]
TIMEOUT = float(os.environ.get("CKPT_TEST_RUN_TIMEOUT", "900"))


def ckpt_run(pipeline: str, warehouse: str, rows: int, *extra: str, kill_at: str | None = None):
    cmd = ckpt_run_argv(pipeline, warehouse, "--rows-per-checkpoint", str(rows), *extra)
    return subprocess.run(cmd, env=ckpt_run_env("local[2]", kill_at=kill_at), capture_output=True, text=True,
                          timeout=TIMEOUT)


def crash_then_recover(pipeline: str, warehouse: str, rows: int, kill_at: str, *extra: str) -> str:
    crashed = ckpt_run(pipeline, warehouse, rows, *extra, kill_at=kill_at)
    assert crashed.returncode == -signal.SIGKILL, f"{kill_at} was not reached:\n{crashed.stdout}\n{crashed.stderr[-3000:]}"
    done = ckpt_run(pipeline, warehouse, rows, *extra)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "restored checkpoint" in done.stdout, done.stdout
    return done.stdout


@pytest.mark.slow  # 3-5 min; CI tier: a real kill and recovery in tests/crash/test_postgres_crash.py; on S3 the log
# store's refusal below, the stores (tests/delta/test_store_s3.py) and maintenance (tests/delta/test_maintenance.py)
def test_payments_on_s3_killed_between_completion_and_commit_recovers_exactly_once(spark, s3, tmp_path, monkeypatch):
    """Unaligned with a lagging source subtask (records in flight: channel state on S3), killed in
    the 2PC window of checkpoint 1; the rerun re-commits what checkpoint 1 owns, then goes on."""
    monkeypatch.chdir(tmp_path)  # nothing may land in a local folder named "s3:" (the runs inherit the cwd)
    use_warehouse(spark, s3)
    payments.generate(spark, s3, 200, bad_fraction=0.05, accounts=20, seed=0)
    crash_then_recover("payments", s3, 200, "commit:1", "--mode", "unaligned", "--lagging-sources", "1")
    check = check_payments(s3, exact_order=False)
    assert check.ok, check.summary()
    assert check.bad_rows and check.dlq_rows == check.bad_rows  # the dead letters went to S3 too
    root = location(s3) / "_checkpoints" / "payments"
    on_s3 = files_at(root).names(root)
    assert {"channels", "edge_state", "state", "_ids", "epochs"} <= set(on_s3), on_s3
    assert not (tmp_path / "s3:").exists()


@pytest.mark.slow  # CI tier: payments above; the cycle's feedback log and its channel state on S3
def test_transfers_on_s3_killed_at_a_snapshot_recovers_exactly_once(spark, s3, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    use_warehouse(spark, s3)
    for v in range(3):
        transfers.generate(spark, s3, 300, accounts=30, bad_fraction=0.03, skew=0.3, seed=v)
    # a checkpoint snapshots the source group once and each of bank's 3 subtasks: the 6th snapshot is
    # a subtask's of checkpoint 2, checkpoint 1 completed (the rerun restores it)
    crash_then_recover("transfers", s3, 300, "snapshot:6", "--mode", "unaligned")
    check = check_transfers(s3)
    assert check.ok, check.summary()
    # every checkpoint was validated (the commit gate) and the Data Docs were published beside the data
    docs = data_docs_index(s3, "transfers")
    assert files_at(docs).exists(docs) and files_at(docs).exists(location(s3) / "_checkpoints" / "transfers" / "validations")
    assert not (tmp_path / "s3:").exists()


def test_the_log_store_refuses_a_version_another_writer_committed_by_the_put_itself(spark, s3):
    """Deterministic: version 1 exists (a delta-rs commit); the log store's write of version 1 must
    fail with FileAlreadyExistsException (Delta's "another writer won": re-read, retry) and leave
    the other commit as it was; its own commit written again (an SDK retry whose first PUT landed)
    counts as done. Its write makes no existence probe (S3A skips them for a conditional create), so
    only the server's 412 on If-None-Match can refuse it: the window the stock log store leaves open
    between its probe and its PUT."""
    from py4j.protocol import Py4JJavaError

    from checkpoint_lib.spark.jars import LOGSTORE_CLASS

    use_warehouse(spark, s3)
    jvm = spark.sparkContext._jvm
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    store = jvm.io.checkpointlib.delta.S3ConditionalLogStore(hadoop)  # what spark.delta.logStore.s3.impl names
    assert spark.sparkContext.getConf().get("spark.delta.logStore.s3.impl") == LOGSTORE_CLASS
    log = location(s3) / "t" / "_delta_log"
    theirs = b'{"commitInfo":{"by":"delta-rs"}}\n'
    files_at(log).put(log / f"{1:020d}.json", theirs)

    def write(lines):
        path = jvm.org.apache.hadoop.fs.Path(str(log / f"{1:020d}.json"))
        store.write(path, jvm.java.util.ArrayList(lines).iterator(), False, hadoop)

    with pytest.raises(Py4JJavaError, match="FileAlreadyExistsException"):
        write(['{"commitInfo":{"by":"spark"}}'])
    assert files_at(log).read_bytes(log / f"{1:020d}.json") == theirs
    write(['{"commitInfo":{"by":"delta-rs"}}'])  # the same bytes: our own earlier PUT, not a lost race
    mine = log / f"{2:020d}.json"
    store.write(jvm.org.apache.hadoop.fs.Path(str(mine)), jvm.java.util.ArrayList(['{"a":1}']).iterator(), False, hadoop)
    assert files_at(mine).read_bytes(mine) == b'{"a":1}\n'


@pytest.mark.race
@pytest.mark.slow  # CI tier: the deterministic test above
def test_spark_and_delta_rs_appending_to_one_s3_table_at_once_lose_no_commit(spark, s3):
    """Both writers at once, end to end: every append lands in its own version. (The interleaving
    that lost a commit with Delta's stock S3 log store, a commit landing between its probe and its
    PUT, is rare here; the test above pins the mechanism deterministically.)"""
    import threading

    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    use_warehouse(spark, s3)
    table = f"{s3}/raced"
    spark.range(0).selectExpr("id", "'init' as who").write.format("delta").save(table)
    rounds, errors = 12, []

    def spark_appends():
        try:
            for i in range(rounds):
                spark.createDataFrame([(1000 + i, "spark")], "id long, who string").write.format("delta") \
                    .mode("append").save(table)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def delta_rs_appends():
        try:
            for i in range(rounds):
                write_deltalake(table, pa.table({"id": pa.array([2000 + i], pa.int64()), "who": ["delta-rs"]}),
                                mode="append")
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=spark_appends), threading.Thread(target=delta_rs_appends)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    got = sorted(DeltaTable(table).to_pyarrow_table().column("id").to_pylist())
    assert got == [*range(1000, 1000 + rounds), *range(2000, 2000 + rounds)]
    assert DeltaTable(table).version() == 2 * rounds  # every commit its own version: none overwritten


@pytest.mark.slow  # CI tier: payments killed on S3 above; this is `CKPT_WAREHOUSE=s3://... ckpt demo`, as a user runs it
def test_the_demo_runs_against_the_object_store(s3, tmp_path):
    """The README's demo with the warehouse on the server: a kill -9, the recovery, the independent
    check and the GX suites, their Data Docs published to the bucket, nothing written locally."""
    env = {**os.environ, "CKPT_WAREHOUSE": s3, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "checkpoint_lib.cli", "demo", "--rows", "8000"], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "kill -9" in done.stdout and "restored checkpoint" in done.stdout
    assert "exactly once, nothing lost" in done.stdout and done.stdout.count("PASSED") == 2, done.stdout[-3000:]
    docs = data_docs_index(f"{s3}/demo", "payments")
    assert f"Data Docs:    {docs}" in done.stdout and files_at(docs).exists(docs)
    assert not (tmp_path / "s3:").exists()


@pytest.mark.slow  # ~50 s; CI tier: landing folders on a local disk (tests/spark/test_landing.py), payments on S3 above
def test_a_landing_folder_on_s3_is_read_once_and_its_bad_lines_dead_lettered(spark, s3):
    """The folder source on a bucket prefix: files listed from the objects (a temporary name is
    ignored until it is "renamed", i.e. put under its final name), registered in a manifest on S3,
    read by Spark through S3A, exactly once; unparsable lines, wrong types and null keys
    dead-lettered with their offsets; a file landing later is read alone, by the stages run as
    separate runs."""
    import json

    from storage import put
    from folder_payments import events, expected, folder_payments

    from checkpoint_lib.spark.runner import PipelineRunner
    from checkpoint_lib.verify import read_delta

    use_warehouse(spark, s3)
    folder = location(s3) / "landing" / "payment_files"
    first, second = events("f1", 40), events("f2", 30)
    put(folder / "part-001.json", ("\n".join([json.dumps(e) for e in first] + [
        "{not json",                                                              # unparsable
        json.dumps({"event_id": "x1", "account": "a1", "amount_cents": "abc"}),  # wrong type
        json.dumps({"event_id": "x2", "account": None, "amount_cents": 5}),      # null account
    ]) + "\n").encode())
    put(folder / "part-002.json", ("\n".join(json.dumps(e) for e in second) + "\n").encode())
    put(folder / ".part-003.json.inprogress", b"{half a file")

    def run(**kw):
        return PipelineRunner(folder_payments(), s3, spark, rows_per_checkpoint=20, **kw).run()

    def balances():
        return {r.account: (r.balance_cents, r.event_count) for r in read_delta(f"{s3}/gold/files_balances").itertuples()}

    run()
    assert balances() == expected(first + second)
    ledger = read_delta(f"{s3}/gold/files_ledger")
    assert sorted(ledger["event_id"]) == sorted(e["event_id"] for e in first + second)
    dlq = read_delta(f"{s3}/dlq/payment_files").sort_values("src_row")
    assert list(dlq["src_file"]) == ["part-001.json"] * 3 and list(dlq["src_row"]) == [40, 41, 42]
    errors = list(dlq["error"])
    assert errors[0].startswith("unparsable row: {not json")
    assert errors[1].startswith("wrong type for amount_cents")
    assert errors[2] == "null or empty account"

    # a new file, in separate stage runs: only it is read, nothing twice
    third = events("f3", 25)
    put(folder / "part-004.json", ("\n".join(json.dumps(e) for e in third) + "\n").encode())
    # a layout switch (chained -> separate stages) restores the latest checkpoint, then reads on
    assert run(stage="source").restored is not None
    run(stage="keyed")
    assert len(read_delta(f"{s3}/gold/files_ledger")) == len(first + second + third)
    assert balances() == expected(first + second + third)
    assert len(read_delta(f"{s3}/dlq/payment_files")) == 3

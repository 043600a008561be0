"""The files of uncommitted sink transactions (checkpoint_lib/delta/pending.py), with Parquet files
written as Spark's partitioned writer lays them out, on a local folder and on a real S3-compatible
server (SeaweedFS): the same outcomes, and the same relative paths in the add actions. No JVM. This
is the contract of the core's ``TransactionStore`` (sinks' pre-committed transactions) on both roots."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from storage import put

from checkpoint_lib.core.twophase import Transaction
from checkpoint_lib.delta.pending import HANDLE_COLUMN, PendingFiles, PendingFilesLostError, describe_written
from checkpoint_lib.files import files_at
from checkpoint_lib.layout import location


def spark_like_write(write_dir: str, rows_by_handle: dict[str, list[tuple]]) -> None:
    """What ``df.write.partitionBy(txn_handle).parquet(write_dir)`` leaves (the checksums only on a disk)."""
    folder = location(write_dir)
    for handle, rows in rows_by_handle.items():
        table = pa.table({"account": [r[0] for r in rows], "amount_cents": pa.array([r[1] for r in rows], pa.int64())})
        data = io.BytesIO()
        pq.write_table(table, data)
        put(folder / f"{HANDLE_COLUMN}={handle}" / "part-00000-x.c000.snappy.parquet", data.getvalue())
        if isinstance(folder, Path):
            put(folder / f"{HANDLE_COLUMN}={handle}" / ".part-00000-x.c000.snappy.parquet.crc", b"")
    put(folder / "_SUCCESS", b"")


@pytest.fixture
def pending(storage_root) -> PendingFiles:
    return PendingFiles(str(storage_root / "control"), str(storage_root / "table" / "ckpt"),
                        table_root=str(storage_root / "table"))


@pytest.fixture
def files(storage_root):
    return files_at(storage_root)


A, B = Transaction(1, "p.s-0-1", 1), Transaction(1, "p.s-1-1", 1)


def test_a_sealed_write_lists_each_transactions_files_with_exact_statistics(pending, storage_root, files):
    write_dir = pending.begin_write([A, B])
    assert isinstance(write_dir, str) and write_dir.startswith(f"{storage_root}/table/ckpt/")  # what Spark writes to
    spark_like_write(write_dir, {A.handle: [("x", 5), ("b", None), ("y", -3)], B.handle: [("k", 7)]})
    assert pending.seal_write(write_dir, [A, B]) == 4
    assert pending.transactions() == sorted([A, B])
    (a,) = pending.files([A])
    name = location(write_dir).name
    assert a.path == f"ckpt/{name}/{HANDLE_COLUMN}={A.handle}/part-00000-x.c000.snappy.parquet" and a.rows == 3
    on_disk = files.stat(storage_root / "table" / a.path)
    assert (a.size, a.modification_time) == (on_disk.size, on_disk.modification_time)
    stats = json.loads(a.stats)
    assert stats == {"numRecords": 3, "minValues": {"account": "b", "amount_cents": -3},
                     "maxValues": {"account": "y", "amount_cents": 5}, "nullCount": {"account": 0, "amount_cents": 1}}
    left = [p.name for p in files.walk(location(write_dir))]
    assert len(left) == 2 and all(n.endswith(".parquet") for n in left), left  # no _SUCCESS, no hidden checksums


def test_several_writes_of_one_transaction_add_up_and_an_unsealed_one_is_not_listed(pending):
    first = pending.begin_write([A])
    spark_like_write(first, {A.handle: [("x", 1)]})
    pending.seal_write(first, [A])
    second = pending.begin_write([A])
    spark_like_write(second, {A.handle: [("x", 2), ("z", 3)]})
    pending.seal_write(second, [A])
    crashed = pending.begin_write([A])  # a crash during the Spark write: an intent, no manifest
    spark_like_write(crashed, {A.handle: [("q", 9)]})
    assert sorted(f.rows for f in pending.files([A])) == [1, 2]


def test_an_abort_deletes_every_write_an_intent_names_and_a_commit_keeps_the_files(pending, files):
    done = pending.begin_write([A, B])
    spark_like_write(done, {A.handle: [("x", 1)], B.handle: [("y", 2)]})
    pending.seal_write(done, [A, B])
    crashed = pending.begin_write([A])
    spark_like_write(crashed, {A.handle: [("q", 9)]})
    kept = [f.path for f in pending.files([B])]
    pending.forget([A], delete_data=True)  # an abort
    pending.forget([B], delete_data=False)  # committed: its files are the table's now
    assert pending.transactions() == [] and files.names(pending.control) == []
    assert not files.exists(location(crashed)) and not files.exists(location(done) / f"{HANDLE_COLUMN}={A.handle}")
    assert all(files.exists(pending.table_root / p) for p in kept)
    pending.forget([A, B], delete_data=True)  # idempotent: what is forgotten stays forgotten
    assert all(files.exists(pending.table_root / p) for p in kept)


def test_a_file_gone_before_the_commit_is_refused_not_skipped(pending, files):
    write_dir = pending.begin_write([A])
    spark_like_write(write_dir, {A.handle: [("x", 1)]})
    pending.seal_write(write_dir, [A])
    (f,) = pending.files([A])
    files.delete(pending.table_root / f.path)  # e.g. VACUUM RETAIN 0 HOURS
    with pytest.raises(PendingFilesLostError, match="VACUUM"):
        pending.files([A])
    assert pending.files([A], missing_ok=True) == [f]


def test_a_transaction_whose_start_a_crash_interrupted_is_not_listed(pending):
    folder = pending.control / A.handle
    if isinstance(folder, Path):
        folder.mkdir(parents=True)  # the folder, not yet its txn.json (a store has no folder without a file)
    else:
        put(folder / ".txn.json.tmp", b"")  # what a store can hold: anything but txn.json
    assert pending.transactions() == []


def test_an_upsert_sinks_files_are_named_by_their_full_location(storage_root, files):
    pending = PendingFiles(storage_root / "txns", storage_root / "files")  # no table root: staged outside a table
    write_dir = pending.begin_write([A])
    spark_like_write(write_dir, {A.handle: [("x", 1), ("y", 2)]})
    assert pending.seal_write(write_dir, [A]) == 2
    (f,) = pending.files([A])
    assert f.path == f"{write_dir}/{HANDLE_COLUMN}={A.handle}/part-00000-x.c000.snappy.parquet" and files.exists(f.path)
    pending.forget([A], delete_data=True)  # staged files of a committed upsert
    assert files.names(storage_root / "files") == [] and files.names(storage_root / "txns") == []


def test_describe_written_names_a_dead_letter_write_relative_to_its_table(storage_root, files):
    folder = storage_root / "dlq" / "ckpt" / "v3-x"
    data = io.BytesIO()
    pq.write_table(pa.table({"x": [1, 2]}), data)
    put(folder / "part-00000.parquet", data.getvalue())
    put(folder / "_SUCCESS", b"")
    (f,) = describe_written(str(folder), str(storage_root / "dlq"))
    assert f.path == "ckpt/v3-x/part-00000.parquet" and f.rows == 2
    assert not files.exists(folder / "_SUCCESS")
    assert describe_written(str(storage_root / "dlq" / "ckpt" / "none"), str(storage_root / "dlq")) == []

"""The files of uncommitted sink transactions (checkpoint_lib/delta/pending.py), with Parquet files
written as Spark's partitioned writer lays them out. No JVM."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from checkpoint_lib.core.twophase import Transaction
from checkpoint_lib.delta.pending import HANDLE_COLUMN, PendingFiles, PendingFilesLostError


def spark_like_write(write_dir: str, rows_by_handle: dict[str, list[tuple]]) -> None:
    """What ``df.write.partitionBy(txn_handle).parquet(write_dir)`` leaves on a local disk."""
    for handle, rows in rows_by_handle.items():
        folder = os.path.join(write_dir, f"{HANDLE_COLUMN}={handle}")
        os.makedirs(folder)
        table = pa.table({"account": [r[0] for r in rows], "amount_cents": pa.array([r[1] for r in rows], pa.int64())})
        pq.write_table(table, os.path.join(folder, "part-00000-x.c000.snappy.parquet"))
        open(os.path.join(folder, ".part-00000-x.c000.snappy.parquet.crc"), "w").close()
    open(os.path.join(write_dir, "_SUCCESS"), "w").close()


@pytest.fixture
def pending(tmp_path) -> PendingFiles:
    return PendingFiles(str(tmp_path / "control"), str(tmp_path / "table" / "ckpt"), table_root=str(tmp_path / "table"))


A, B = Transaction(1, "p.s-0-1", 1), Transaction(1, "p.s-1-1", 1)


def test_a_sealed_write_lists_each_transactions_files_with_exact_statistics(pending, tmp_path):
    write_dir = pending.begin_write([A, B])
    spark_like_write(write_dir, {A.handle: [("x", 5), ("b", None), ("y", -3)], B.handle: [("k", 7)]})
    assert pending.seal_write(write_dir, [A, B]) == 4
    assert pending.transactions() == sorted([A, B])
    (a,) = pending.files([A])
    assert a.path.startswith("ckpt/") and os.path.exists(tmp_path / "table" / a.path) and a.rows == 3
    stats = json.loads(a.stats)
    assert stats == {"numRecords": 3, "minValues": {"account": "b", "amount_cents": -3},
                     "maxValues": {"account": "y", "amount_cents": 5}, "nullCount": {"account": 0, "amount_cents": 1}}
    left = [n for _, _, names in os.walk(write_dir) for n in names]
    assert all(n.endswith(".parquet") for n in left), left  # no _SUCCESS, no hidden checksums


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


def test_an_abort_deletes_every_write_an_intent_names_and_a_commit_keeps_the_files(pending):
    done = pending.begin_write([A, B])
    spark_like_write(done, {A.handle: [("x", 1)], B.handle: [("y", 2)]})
    pending.seal_write(done, [A, B])
    crashed = pending.begin_write([A])
    spark_like_write(crashed, {A.handle: [("q", 9)]})
    kept = [f.path for f in pending.files([B])]
    pending.forget([A], delete_data=True)  # an abort
    pending.forget([B], delete_data=False)  # committed: its files are the table's now
    assert pending.transactions() == []
    assert not os.path.exists(crashed) and not os.path.exists(os.path.join(done, f"{HANDLE_COLUMN}={A.handle}"))
    assert all(os.path.exists(os.path.join(pending.table_root, p)) for p in kept)
    pending.forget([A, B], delete_data=True)  # idempotent: what is forgotten stays forgotten
    assert all(os.path.exists(os.path.join(pending.table_root, p)) for p in kept)


def test_a_file_gone_before_the_commit_is_refused_not_skipped(pending):
    write_dir = pending.begin_write([A])
    spark_like_write(write_dir, {A.handle: [("x", 1)]})
    pending.seal_write(write_dir, [A])
    (f,) = pending.files([A])
    os.remove(os.path.join(pending.table_root, f.path))  # e.g. VACUUM RETAIN 0 HOURS
    with pytest.raises(PendingFilesLostError, match="VACUUM"):
        pending.files([A])
    assert pending.files([A], missing_ok=True) == [f]


def test_a_transaction_whose_start_a_crash_interrupted_is_not_listed(pending):
    os.makedirs(os.path.join(pending.control, A.handle))  # the folder, not yet its txn.json
    assert pending.transactions() == []

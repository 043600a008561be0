"""Our tables beside the rest of a lakehouse: what other tools and other pipelines do to them
(and what they hold) never makes us lose or duplicate a row silently.

- a Delta source's files are identified by their full path in the table, however Spark encodes
  it: files that share a base name in different folders (an append sink's ``txn_handle=``
  folders, Hive-style partitions) are each read once, and a name with a space, ``%``, ``+`` or
  non-ASCII characters is read, not skipped;
"""

from __future__ import annotations

import os
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from checkpoint_lib.pipeline import DeltaSource
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


def test_files_that_share_a_name_in_different_folders_are_each_read_once(spark, tmp_path):
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
def test_a_file_whose_name_needs_escaping_is_read(spark, tmp_path, name):
    from deltalake import write_deltalake

    table = str(tmp_path / "landing")
    write_deltalake(table, _rows("plain", 5))
    _commit_files(table, {name: _rows("odd", 7)})

    rows = _read_all(spark, table, tmp_path)
    assert sorted(r.event_id for r in rows) == sorted([f"plain-{i}" for i in range(5)] + [f"odd-{i}" for i in range(7)])
    assert {r.src_file for r in rows if r.event_id.startswith("odd")} == {name}

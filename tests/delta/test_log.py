"""The driver-side Delta log reader (no Spark): schema and features must survive log retention; on a
local table and on one on a real S3-compatible server (SeaweedFS) alike."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from checkpoint_lib.delta.log import (
    MissingLogError,
    added_files,
    change_version,
    clear_abandoned_creation,
    data_changes_since,
    is_delta_table,
    latest_version,
    rows_unchanged_since,
    schema_at,
    table_features,
)
from checkpoint_lib.files import files_at

SCHEMA = pa.schema([("event_id", pa.string()), ("account", pa.string()), ("amount_cents", pa.int64())])


def _table(path, versions: int) -> str:
    for i in range(versions):
        rows = pa.Table.from_pylist([{"event_id": f"e{i}", "account": "a", "amount_cents": i}], schema=SCHEMA)
        write_deltalake(str(path), rows, mode="append")
    return str(path)


def _expire(path, below: int) -> None:
    """What Delta's log cleanup does after a log checkpoint: commits older than it are deleted."""
    for v in range(below):
        files_at(path).delete(path / "_delta_log" / f"{v:020d}.json")


def test_the_latest_version_is_that_of_the_newest_commit(storage_root):
    assert latest_version(storage_root / "t") is None and not is_delta_table(storage_root / "t")
    table = _table(storage_root / "t", 3)
    assert latest_version(table) == 2 and is_delta_table(table)
    assert not is_delta_table(storage_root / "t" / "_delta_log")  # a folder, but not a table


def test_schema_and_features_are_read_from_the_log_checkpoint_once_the_first_commits_are_gone(storage_root):
    table = _table(storage_root, 4)
    want = {"event_id": "string", "account": "string", "amount_cents": "long"}
    assert schema_at(table, 3) == want  # from the JSON commits
    plain_features = table_features(table, 3)
    DeltaTable(table).create_checkpoint()  # at version 3
    _table(storage_root, 2)  # versions 4, 5 after it
    _expire(storage_root, 3)  # the metaData action (version 0) is gone
    assert schema_at(table, 5) == want
    assert table_features(table, 5) == plain_features
    assert [f.version for f in added_files(table, 3, 5)] == [4, 5]  # newer commits still read
    with pytest.raises(MissingLogError, match="version 1"):
        added_files(table, 0, 5)  # what retention removed cannot be read incrementally: said so


def test_without_a_log_checkpoint_a_missing_commit_is_a_clear_error(storage_root):
    table = _table(storage_root, 3)
    _expire(storage_root, 1)
    with pytest.raises(MissingLogError, match="can no longer be read"):
        schema_at(table, 2)


def test_the_step_planner_plans_what_plan_steps_does_and_parses_each_commit_once(storage_root, monkeypatch):
    from checkpoint_lib.delta import log
    from checkpoint_lib.delta.log import StepPlanner, plan_steps

    table = _table(storage_root, 7)  # versions 0..6, one row each
    want = {after: plan_steps(added_files(table, after, 6), 3)[0] for after in (-1, 2, 5)}
    parsed = []
    actions = log.commit_actions
    monkeypatch.setattr(log, "commit_actions", lambda t, v: parsed.append(v) or actions(t, v))
    planner = StepPlanner(table)
    offset, steps = -1, []
    while offset < 6:
        step = planner.next_step(offset, 6, rows_per_step=3)
        assert step == want[offset]
        steps.append([f.version for f in step])
        offset = step[-1].version
    assert steps == [[0, 1, 2], [3, 4, 5], [6]]
    assert sorted(parsed) == list(range(7))  # each commit parsed once, however many steps
    assert not planner.metadata_changed(0, 6)  # versions 1..6: appends only
    wider = pa.schema([*SCHEMA, ("memo", pa.string())])
    write_deltalake(table, pa.Table.from_pylist([{"event_id": "x", "account": "a", "amount_cents": 1, "memo": "m"}],
                                                schema=wider), mode="append", schema_mode="merge")
    assert planner.metadata_changed(6, 7) and [f.version for f in planner.next_step(6, 7, 3)] == [7]


def test_rows_unchanged_since_a_version_allows_stamps_and_compactions_only(storage_root):
    """What lets a recovery skip rewriting a state table that still holds its snapshot."""
    from checkpoint_lib.spark.tables import stamped_commit

    table = _table(storage_root, 3)
    assert rows_unchanged_since(table, 2) and not rows_unchanged_since(table, 1)
    stamped_commit(table, "app", [], lambda have: 7)  # a fence: a stamp, no file
    DeltaTable(table).optimize.compact()  # files rewritten, rows the same (dataChange false)
    assert latest_version(table) == 4 and rows_unchanged_since(table, 2)
    assert not rows_unchanged_since(table, 5) and not rows_unchanged_since(storage_root / "none", 0)
    DeltaTable(table).alter.set_table_properties({"delta.appendOnly": "false"})  # metadata: not the same table
    assert not rows_unchanged_since(table, 2) and rows_unchanged_since(table, 5)
    _table(storage_root, 1)  # rows added
    assert not rows_unchanged_since(table, 5)
    _expire(storage_root, 4)  # a commit it needs is gone: cannot tell, so no
    assert not rows_unchanged_since(table, 2)


def test_data_changes_since_names_other_writers_commits_that_changed_rows_and_leaves_ours_aside(storage_root):
    """What a state table's flush checks before and after its run: every commit since the version
    it read that added or removed rows, but not its own (stamped with its application id), nor a
    fence, an OPTIMIZE or a metadata change."""
    from checkpoint_lib.spark.tables import stamped_commit

    table = _table(storage_root, 2)
    assert data_changes_since(table, 1) == [] and data_changes_since(table, 5) == []
    stamped_commit(table, "ours", [], lambda have: 7)  # a fence: a stamp, no file
    DeltaTable(table).optimize.compact()  # rows the same
    DeltaTable(table).alter.set_table_properties({"delta.appendOnly": "false"})
    assert data_changes_since(table, 1) == []
    DeltaTable(table).restore(1)  # someone's RESTORE
    _table(storage_root, 1)  # someone's append
    assert [op for _, op in data_changes_since(table, 1)] == ["RESTORE", "WRITE"]
    assert data_changes_since(table, 0)[0] == (1, "WRITE")  # the second of the first two appends
    _expire(storage_root, 3)  # a commit it needs is gone: cannot tell, so a change
    assert (2, "unknown") in data_changes_since(table, 1)


def test_what_a_creation_killed_before_its_first_commit_left_is_cleared_and_a_commit_never_is(storage_root):
    files = files_at(storage_root)
    log = storage_root / "t" / "_delta_log"
    assert not clear_abandoned_creation(storage_root / "t")  # nothing there
    files.put(log / ".00000000000000000000.json.5f1e.tmp", b'{"commitInfo":{}}')  # killed before its rename
    files.put(log / "_staged_commits" / ".keep", b"")
    assert clear_abandoned_creation(storage_root / "t")
    assert not files.exists(log) and not is_delta_table(storage_root / "t")
    table = _table(storage_root / "t", 2)  # a creation that lands: its commits are never touched
    files.put(log / ".00000000000000000002.json.9a9a.tmp", b"{}")
    assert not clear_abandoned_creation(table)
    assert latest_version(table) == 1 and files.exists(log / ".00000000000000000002.json.9a9a.tmp")


@pytest.mark.objectstore
def test_the_directory_marker_a_creation_killed_on_an_object_store_left_is_cleared(s3, s3_server):
    """Through S3A, Delta's mkdirs of ``_delta_log`` leaves an empty object ``<table>/_delta_log/``
    (Hadoop keeps directory markers): all a creation killed before commit 0 leaves on a bucket."""
    from pyarrow import fs

    from checkpoint_lib.layout import location

    bucket = fs.S3FileSystem(endpoint_override=s3_server.endpoint.removeprefix("http://"), scheme="http",
                             access_key=s3_server.access_key, secret_key=s3_server.secret_key, region="us-east-1")
    prefix = s3.removeprefix("s3://")
    bucket.create_dir(f"{prefix}/t/_delta_log")  # the marker, as S3A makes it

    def objects() -> list[str]:
        return [i.path.removeprefix(f"{prefix}/") for i in bucket.get_file_info(fs.FileSelector(prefix, recursive=True))]

    root = location(s3)
    assert "t/_delta_log" in objects() and files_at(root).exists(root / "t" / "_delta_log")
    assert clear_abandoned_creation(root / "t")
    assert objects() == ["t"]
    _table(root / "t", 1)  # the table is created where the killed creation was
    assert latest_version(root / "t") == 0


def _stats(n: int) -> str:
    return f'{{"numRecords": {n}}}'


def test_a_change_feed_versions_rows_come_from_its_files_or_its_metrics():
    """What a change-data-feed reader counts of a commit (no update row before the update, no copied
    row, a deletion vector's growth): from the log alone."""
    def rows(*actions):
        change = change_version("t", 7, list(actions))
        return None if change.entry is None else (change.entry.path, change.entry.rows, change.files)

    merge = {"commitInfo": {"operation": "MERGE", "operationMetrics": {
        "numTargetRowsInserted": "1", "numTargetRowsUpdated": "2", "numTargetRowsDeleted": "0", "numTargetRowsCopied": "9",
        "numOutputRows": "12"}}}
    cdc = {"cdc": {"path": "_change_data/cdc-1.parquet", "size": 10, "dataChange": False}}
    rewritten = ({"add": {"path": "b.parquet", "size": 5, "stats": _stats(12)}},
                 {"remove": {"path": "a.parquet", "size": 5, "dataChange": True}})
    assert rows(merge, cdc, *rewritten) == ("cdf@7", 3, ("_change_data/cdc-1.parquet",))
    snake = {"commitInfo": {"operation": "UPDATE", "operationMetrics": {"num_updated_rows": 4, "num_copied_rows": 6}}}
    assert rows(snake, cdc)[1] == 4  # delta-rs names its metrics in snake case
    assert rows({"commitInfo": {}}, cdc)[1] == -1  # nobody says
    assert rows({"commitInfo": {}}, {"add": {"path": "n.parquet", "size": 5, "stats": _stats(3)}}) == (
        "cdf@7", 3, ("n.parquet",))  # an append: its inserts
    # a DELETE with deletion vectors: the file removed and added again, its vector grown by 2 rows
    assert rows({"remove": {"path": "a.parquet", "size": 5, "stats": _stats(10), "deletionVector": {"cardinality": 1}}},
                {"add": {"path": "a.parquet", "size": 5, "stats": _stats(10), "deletionVector": {"cardinality": 3}}}
                ) == ("cdf@7", 2, ("a.parquet",))
    # whole files deleted: the rows they still showed
    assert rows({"remove": {"path": "a.parquet", "size": 5, "stats": _stats(10), "deletionVector": {"cardinality": 4}}},
                {"remove": {"path": "b.parquet", "size": 5, "stats": _stats(2)}})[1] == 8
    assert rows({"commitInfo": {"operation": "DELETE", "operationMetrics": {"numDeletedRows": "5"}}},
                {"remove": {"path": "a.parquet", "size": 5}})[1] == 5  # no row count on the file: the metrics
    # a compaction and a property change change no row; the latter says whether the feed is on
    assert rows({"add": {"path": "c.parquet", "size": 5, "dataChange": False, "stats": _stats(3)}},
                {"remove": {"path": "a.parquet", "size": 5, "dataChange": False}}) is None
    on = change_version("t", 1, [{"metaData": {"configuration": {"delta.enableChangeDataFeed": "true"}}}])
    assert (on.entry, on.feed, on.metadata_changed) == (None, True, True)
    assert change_version("t", 2, [{"metaData": {"configuration": {}}}]).feed is False
    assert change_version("t", 3, [{"commitInfo": {}}]).feed is None


def test_delta_rs_commits_keep_the_state_tables_whole_log_where_a_default_table_loses_it(tmp_path):
    """A keyed state run, a fence and a sink's commit are delta-rs commits, and delta-rs cleans up
    log files older than ``delta.logRetentionDuration`` whenever it writes a log checkpoint: the
    state table's 100-year retention (``STATE_TABLE_PROPERTIES``) must hold there too, or the
    versions its snapshots pin would go with the log (as they do from a table at the default)."""
    import os
    import time

    from checkpoint_lib.spark.state import STATE_TABLE_PROPERTIES

    def logs(properties: dict[str, str]) -> list[str]:
        path = tmp_path / str(len(os.listdir(tmp_path)))
        write_deltalake(str(path), _rows(0), configuration={**properties, "delta.checkpointInterval": "5"})
        for i in range(1, 4):
            write_deltalake(str(path), _rows(i), mode="append")
        old = time.time() - 60 * 86400  # two months ago: past Delta's default of 30 days
        for name in os.listdir(path / "_delta_log"):
            os.utime(path / "_delta_log" / name, (old, old))
        for i in range(4, 7):  # one of them writes a log checkpoint
            write_deltalake(str(path), _rows(i), mode="append")
        return sorted(n for n in os.listdir(path / "_delta_log") if n.endswith(".json"))

    kept = logs({k: v for k, v in STATE_TABLE_PROPERTIES.items() if k != "delta.enableDeletionVectors"})
    assert kept == [f"{v:020d}.json" for v in range(7)]
    assert logs({})[0] != f"{0:020d}.json"  # the default: the old commit files are gone


def _rows(i: int) -> pa.Table:
    return pa.Table.from_pylist([{"event_id": f"e{i}", "account": "a", "amount_cents": i}], schema=SCHEMA)

"""What a Delta table's per-file statistics let us decide without a Spark job: whether a file may
hold a row within some bounds (a read or a DELETE skips it otherwise), and whether it holds only
such rows (a truncation removes it whole). Written and read by delta-rs alone: milliseconds."""
from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from checkpoint_lib.spark import tables


def _append(path, seqs, epochs, **kwargs):
    write_deltalake(path, pa.table({"seq": pa.array(seqs, pa.int64()), "epoch": pa.array(epochs, pa.int64())}),
                    mode="append", **kwargs)


def _rows(path):
    table = DeltaTable(path).to_pyarrow_table()
    return sorted(zip(table.column("seq").to_pylist(), table.column("epoch").to_pylist()), key=repr)


def test_a_file_may_hold_rows_within_bounds_unless_its_statistics_rule_them_out(tmp_path):
    path = str(tmp_path / "log")
    _append(path, [0, 1], [1, 1])
    _append(path, [2, 5], [1, 2])
    _append(path, [None, 9], [2, 2])
    actions = DeltaTable(path).get_add_actions(flatten=True)
    files = actions.column("max.seq").to_pylist()  # a file by its largest seq (the log lists them in any order)

    def may_hold(bounds):
        return dict(zip(files, tables._may_hold_each(actions, bounds)))

    assert may_hold({"seq": (3, 4)}) == {1: False, 5: True, 9: False}
    assert may_hold({"seq": (None, 1)}) == {1: True, 5: False, 9: False}
    assert may_hold({"seq": (6, None), "epoch": (None, 1)}) == {1: False, 5: False, 9: False}
    assert may_hold({"other": (0, 0)}) == {1: True, 5: True, 9: True}  # no statistics: it may
    assert tables.may_hold(path, {"seq": (9, 9)}) and not tables.may_hold(path, {"seq": (10, None)})


def test_only_files_whose_every_row_lies_within_are_removed_whole(tmp_path):
    """A file straddling a bound stays, and so does one with a null in a bound's column (a null
    lies in no range); what stays is exactly the rows of the files kept."""
    path = str(tmp_path / "log")
    _append(path, [0, 1], [1, 1])      # within
    _append(path, [2, 3], [1, 1])      # within
    _append(path, [3, 4], [1, 1])      # straddles seq <= 3
    _append(path, [None, 1], [1, 1])   # a null seq
    _append(path, [1, 2], [2, 2])      # a newer epoch
    assert tables.remove_files_within(path, {"seq": (None, 3), "epoch": (None, 1)}, what="a truncation")
    assert _rows(path) == sorted([(3, 1), (4, 1), (None, 1), (1, 1), (1, 2), (2, 2)], key=repr)
    assert DeltaTable(path).history(1)[0]["operation"] == "WRITE" and len(DeltaTable(path).file_uris()) == 3
    version = DeltaTable(path).version()
    assert tables.remove_files_within(path, {"seq": (None, -1)}, what="nothing within")
    assert DeltaTable(path).version() == version  # nothing to remove: no commit


def test_a_table_that_keeps_no_statistics_is_left_to_deltas_delete(tmp_path):
    """A user's `delta.dataSkippingNumIndexedCols = 0` leaves the log without min/max: no file can be
    shown to lie within, so the caller is told to delete through Delta (the log would grow forever
    otherwise), and every file may hold any row."""
    path = str(tmp_path / "log")
    _append(path, [0, 1], [1, 1], configuration={"delta.dataSkippingNumIndexedCols": "0"})
    _append(path, [2, 3], [1, 1])
    assert not tables.remove_files_within(path, {"seq": (None, 3)}, what="a truncation")
    assert len(_rows(path)) == 4
    assert tables._may_hold_each(DeltaTable(path).get_add_actions(flatten=True), {"seq": (9, 9)}) == [True, True]

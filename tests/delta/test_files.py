"""The files of the data plane (checkpoint_lib/files.py): one contract, run on a local folder and on
a real S3-compatible server (SeaweedFS, tests/s3server.py). No Spark."""

from __future__ import annotations

import io
import json
import os
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from storage import put

from checkpoint_lib import files as files_module
from checkpoint_lib.files import LocalFiles, ObjectFiles, files_at, read_json, write_once
from checkpoint_lib.objectstore import ObjectUri


@pytest.fixture
def files(storage_root):
    return files_at(storage_root)


def test_a_file_is_written_once_and_a_second_write_changes_nothing(storage_root, files):
    path = storage_root / "control" / "a.json"
    assert files.write_once(path, {"by": "first", "n": 1})
    assert not files.write_once(path, {"by": "second"})
    assert files.read_json(path) == {"by": "first", "n": 1}
    assert json.loads(files.read_text(path)) == {"by": "first", "n": 1}
    assert files.names(storage_root / "control") == ["a.json"]  # no temporary file left
    assert not write_once(path, {"by": "third"}) and read_json(path) == {"by": "first", "n": 1}  # the module's own


@pytest.mark.race
def test_of_racing_writers_of_one_file_exactly_one_wins(storage_root, files):
    for i in range(5):
        path = storage_root / f"race{i}.json"
        barrier = threading.Barrier(4)
        won: list[int] = []

        def write(who: int) -> None:
            barrier.wait()
            if files.write_once(path, {"by": who}):
                won.append(who)

        threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert len(won) == 1 and files.read_json(path) == {"by": won[0]}


def test_names_list_files_and_sub_folders_directly_under_a_folder(storage_root, files):
    folder = storage_root / "folder"
    put(folder / "b.txt", b"b")
    put(folder / "sub" / "deep" / "c.txt", b"c")
    put(storage_root / "folder_sibling" / "d.txt", b"d")  # a longer name with the folder's as prefix
    assert files.names(folder) == ["b.txt", "sub"]
    assert files.names(storage_root) == ["folder", "folder_sibling"]
    assert files.names(storage_root / "missing") == [] and files.names(folder / "b.txt") == []
    assert files.is_dir(folder) and files.is_dir(folder / "sub") and not files.is_dir(folder / "b.txt")
    assert not files.is_dir(storage_root / "missing")
    assert files.exists(folder / "b.txt") and files.exists(folder / "sub") and not files.exists(folder / "nope")
    assert sorted(p.name for p in files.walk(folder)) == ["b.txt", "c.txt"]
    assert all(isinstance(p, type(storage_root)) for p in files.walk(folder))
    assert list(files.walk(storage_root / "missing")) == []


def test_delete_tree_deletes_a_folder_and_nothing_beside_it_and_is_idempotent(storage_root, files):
    folder = storage_root / "folder"
    put(folder / "b.txt", b"b")
    put(folder / "sub" / "c.txt", b"c")
    put(storage_root / "folder_sibling" / "d.txt", b"d")
    files.delete_tree(folder)
    assert not files.exists(folder) and files.names(folder) == []
    assert files.names(storage_root) == ["folder_sibling"]  # an emptied folder is not listed (SeaweedFS keeps one)
    files.delete_tree(folder)  # again: nothing to do
    files.delete(folder / "b.txt")  # a missing file: nothing to do
    files.delete(storage_root / "folder_sibling" / "d.txt")
    assert files.names(storage_root) in ([], ["folder_sibling"])  # a disk keeps the empty folder, a store cannot


def test_a_missing_file_cannot_be_read_nor_stated(storage_root, files):
    missing = storage_root / "nope.json"
    assert files.read_json(missing) is None
    with pytest.raises(FileNotFoundError):
        files.read_bytes(missing)
    with pytest.raises(FileNotFoundError):
        files.stat(missing)


def test_stat_gives_the_size_and_the_modification_time_in_ms(storage_root, files):
    before = time.time()
    put(storage_root / "f.bin", b"x" * 1234)
    after = time.time()
    st = files.stat(storage_root / "f.bin")
    assert st.size == 1234
    assert int(before) * 1000 - 1000 <= st.modification_time <= after * 1000 + 1000  # a store: whole seconds


def test_a_parquet_footer_is_read_through_open(storage_root, files):
    buffer = io.BytesIO()
    pq.write_table(pa.table({"x": list(range(5000))}), buffer, row_group_size=1000)
    put(storage_root / "p.parquet", buffer.getvalue())
    with files.open(storage_root / "p.parquet") as fh:
        meta = pq.ParquetFile(fh).metadata
        assert (meta.num_rows, meta.num_row_groups) == (5000, 5)
        fh.seek(0)
        assert fh.read(4) == b"PAR1"


# --- which implementation, without a server -----------------------------------------------------


def test_files_at_chooses_by_location(tmp_path):
    assert isinstance(files_at(tmp_path), LocalFiles) and isinstance(files_at(str(tmp_path)), LocalFiles)
    for uri in ("s3://b/x", "s3a://b/x", "gs://b/x", "az://c/x", ObjectUri("s3://b/x")):
        assert isinstance(files_at(uri), ObjectFiles)
    with pytest.raises(ValueError, match="object store"):
        LocalFiles().names("s3://b/x")


def test_an_object_store_is_built_once_per_bucket_and_environment(monkeypatch):
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    files = ObjectFiles()
    store, key, bucket = files._at("s3://b/x/y")
    assert (key, bucket) == ("x/y", "s3://b")
    assert files._at(ObjectUri("s3://b/z"))[0] is store
    assert files._at("s3://other/z")[0] is not store
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")  # another server: another client
    assert files._at("s3://b/x")[0] is not store
    assert files_module.files_at("s3://b") is files_module.files_at("gs://c")  # one ObjectFiles, its stores kept


@pytest.mark.objectstore
def test_maintain_on_an_object_store_works_there_and_never_on_a_local_folder_named_s3(s3, tmp_path, monkeypatch):
    """ckpt maintain on s3:// lists and deletes through the store: a pipeline that never ran there
    is reported as such, and nothing lands in a local folder called "s3:" (tests/delta/test_maintenance.py
    runs every rule on the server)."""
    from checkpoint_lib.maintenance import maintain

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    report = maintain(s3, "payments")
    assert report.warehouse == s3 and len(report.rules) == 1 and "never ran" in report.rules[0].skipped
    assert report.rules[0].target == "_checkpoints/payments"
    assert not os.path.exists("s3:") and os.listdir(tmp_path) == []


def test_walk_entries_are_every_file_under_a_folder_with_its_size_and_time(storage_root, files):
    folder = storage_root / "table"
    before = time.time()
    put(folder / "part-0.parquet", b"12345")
    put(folder / "_delta_log" / f"{0:020d}.json", b"{}")
    put(folder / "key=1" / "part-1.parquet", b"123")
    put(storage_root / "table_sibling" / "x", b"x")  # a longer name with the folder's as prefix
    after = time.time()
    found = {str(path): st for path, st in files.walk_entries(folder)}
    assert set(found) == {str(p) for p in files.walk(folder)} == {
        str(folder / "part-0.parquet"), str(folder / "_delta_log" / f"{0:020d}.json"), str(folder / "key=1" / "part-1.parquet")}
    assert {name.rsplit("/", 1)[-1]: st.size for name, st in found.items()} == {
        "part-0.parquet": 5, f"{0:020d}.json": 2, "part-1.parquet": 3}
    assert all(int(before) * 1000 - 1000 <= st.modification_time <= after * 1000 + 1000 for st in found.values())
    assert all(isinstance(path, type(storage_root)) for path, _ in files.walk_entries(folder))
    assert list(files.walk_entries(storage_root / "missing")) == []


def test_entries_are_the_files_directly_under_a_folder_with_their_sizes(storage_root, files):
    folder = storage_root / "landing"
    put(folder / "b.json", b"12345")
    put(folder / "a.json", b"1")
    put(folder / "sub" / "c.json", b"123")
    assert [(name, st.size) for name, st in files.entries(folder)] == [("a.json", 1), ("b.json", 5)]
    assert all(st.modification_time > 1_700_000_000_000 for _, st in files.entries(folder))
    assert files.entries(storage_root / "missing") == []


def test_put_replaces_a_published_file_whole(storage_root, files):
    path = storage_root / "_quality" / "p" / "data_docs" / "index.html"
    files.put(path, b"<html>one</html>")
    files.put(path, b"<html>two</html>")
    assert files.read_bytes(path) == b"<html>two</html>" and files.names(path.parent) == ["index.html"]


@pytest.mark.objectstore
def test_data_docs_are_published_to_an_object_store_warehouse_and_dropped_pages_go(s3, tmp_path, monkeypatch):
    from checkpoint_lib.quality.paths import data_docs_index, publish_data_docs, quality_root

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    local = quality_root(s3, "payments") / "data_docs"
    assert tmp_path in local.parents  # GX's working copy is on this machine
    for name in ("index.html", "validations/run1.html", "validations/run2.html"):
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_text(f"<html>{name}</html>")
    publish_data_docs(s3, "payments")
    index = data_docs_index(s3, "payments")
    files = files_at(index)
    assert files.names(index.parent / "validations") == ["run1.html", "run2.html"]
    (local / "validations" / "run1.html").unlink()  # ckpt maintain dropped that run
    (local / "index.html").write_text("<html>index without run1</html>")
    publish_data_docs(s3, "payments")
    assert files.names(index.parent / "validations") == ["run2.html"]
    assert files.read_bytes(index) == b"<html>index without run1</html>"

"""The landing-folder source: discovery into the manifest (once, one version per call, crash-safe),
version ranges, typed reads with stable offsets, bad lines with ``_ckpt_error`` and nothing dropped, for
JSON lines, CSV and Parquet, and clear errors."""

from __future__ import annotations

import json
import math
import os
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from checkpoint_lib.delta.log import AddedFile, plan_steps
from checkpoint_lib.spark.landing import (
    MANIFEST_SCHEMA,
    LandingFileChangedError,
    LandingFileMissingError,
    LandingFolderSource,
    UnsupportedFileError,
    is_ignored,
)

pytestmark = pytest.mark.spark

SCHEMA = {"id": "long", "name": "string", "amount_cents": "long", "ts": "timestamp"}


def drop(folder: Path, name: str, content: str | bytes) -> Path:
    """Write a file the way writers must: under a temporary name, then rename (atomic)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    tmp.write_bytes(content.encode() if isinstance(content, str) else content)
    os.replace(tmp, folder / name)
    return folder / name


def jsonl(*records: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def source(spark, tmp_path: Path, fmt: str = "json", schema=SCHEMA, **kw) -> LandingFolderSource:
    return LandingFolderSource(spark, str(tmp_path / "landing"), str(tmp_path / "manifest"), schema, format=fmt, **kw)


def rows_by_offset(df) -> dict[tuple[str, int], tuple]:
    """(src_file, src_row) -> the whole row, checking offsets are unique."""
    rows = df.collect()
    mapping = {(r["src_file"], r["src_row"]): tuple(r) for r in rows}
    assert len(mapping) == len(rows), "duplicate offsets"
    return mapping


# discovery and the manifest ----------------------------------------------------------------------


def test_discover_registers_new_files_once_one_version_per_call(spark, tmp_path):
    landing = tmp_path / "landing"
    src = source(spark, tmp_path)
    landing.mkdir()
    assert src.discover() is None and src.latest_version() is None  # nothing, no table yet

    drop(landing, "b.json", jsonl({"id": 2}))
    drop(landing, "a.json", jsonl({"id": 1}, {"id": 11}))
    for ignored in (".hidden.json", "_SUCCESS", "c.json.tmp", "d.json.inprogress", "e.json._COPYING_"):
        (landing / ignored).write_text("{}\n")
    (landing / "subdir").mkdir()
    (landing / "subdir" / "f.json").write_text("{}\n")

    assert src.discover() == 0
    assert src.discover() == 0  # idempotent: no new commit
    assert src.latest_version() == 0
    assert [f.path for f in src.added_files(-1, 0)] == ["a.json", "b.json"]

    drop(landing, "g.json", jsonl({"id": 3}))
    assert src.discover() == 1
    assert src.discover() == 1
    assert [(f.version, f.path) for f in src.added_files(-1, 1)] == [(0, "a.json"), (0, "b.json"), (1, "g.json")]

    manifest = pq.read_table([str(p) for p in (tmp_path / "manifest").glob("*.parquet")]).to_pylist()
    assert sorted(r["file"] for r in manifest) == ["a.json", "b.json", "g.json"]  # each once
    assert all(r["size"] == (landing / r["file"]).stat().st_size for r in manifest)
    assert all(r["rows_exact"] is False for r in manifest)


def test_a_folder_given_from_home_is_the_one_in_home(spark, tmp_path, monkeypatch):
    """``~/landing`` is the home folder's, as for a warehouse (it was taken as a folder named
    ``~`` under the working directory)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    s = LandingFolderSource(spark, "~/landing/", "~/manifest", SCHEMA)
    assert (s.folder, s.manifest_path) == (str(tmp_path / "home" / "landing"), str(tmp_path / "home" / "manifest"))


def test_is_ignored():
    assert not is_ignored("part-0001.json")
    for name in (".x.json", "_tmp_x.json", "x.TMP", "x.json.inprogress", "x.crc", "x.partial"):
        assert is_ignored(name), name


def test_added_files_returns_exactly_the_files_of_those_versions(spark, tmp_path):
    landing = tmp_path / "landing"
    src = source(spark, tmp_path, estimated_row_bytes=10)
    by_version = [["v0-a.json", "v0-b.json"], ["v1-a.json"], ["v2-a.json", "v2-b.json", "v2-c.json"]]
    for v, names in enumerate(by_version):
        for name in names:
            drop(landing, name, jsonl(*({"id": i} for i in range(v + 1))))
        assert src.discover() == v

    def names(after: int, upto: int) -> list[tuple[int, str]]:
        return [(f.version, f.path) for f in src.added_files(after, upto)]

    assert names(-1, 0) == [(0, n) for n in by_version[0]]
    assert names(0, 2) == [(1, "v1-a.json")] + [(2, n) for n in by_version[2]]
    assert names(1, 2) == [(2, n) for n in by_version[2]]
    assert names(2, 2) == [] and names(2, 1) == []
    with pytest.raises(ValueError, match="no version 3"):
        src.added_files(2, 3)

    f = src.added_files(0, 1)[0]
    size = (landing / "v1-a.json").stat().st_size
    assert f == AddedFile(1, "v1-a.json", math.ceil(size / 10), size)  # text rows: an estimate from the size
    steps = plan_steps(src.added_files(-1, 2), rows_per_step=1)
    assert [{g.version for g in step} for step in steps] == [{0}, {1}, {2}]  # whole versions


def test_a_racing_second_registration_keeps_the_first_version(spark, tmp_path):
    """Two discovers racing can register a file twice (Delta appends never conflict): the first
    registration is its only offset."""
    from deltalake import write_deltalake

    landing = tmp_path / "landing"
    src = source(spark, tmp_path)
    drop(landing, "a.json", jsonl({"id": 1}))
    assert src.discover() == 0
    now = datetime.now(timezone.utc)
    row = {"file": "a.json", "size": 1, "rows": 1, "rows_exact": False, "modified_at": now, "registered_at": now}
    write_deltalake(str(tmp_path / "manifest"), pa.Table.from_pylist([row], schema=MANIFEST_SCHEMA), mode="append")
    drop(landing, "b.json", jsonl({"id": 2}))
    assert src.discover() == 2
    assert [(f.version, f.path) for f in src.added_files(-1, 2)] == [(0, "a.json"), (2, "b.json")]
    assert [f.path for f in src.added_files(0, 2)] == ["b.json"]


def test_a_crash_before_the_commit_registers_nothing(spark, tmp_path, monkeypatch):
    import deltalake

    landing = tmp_path / "landing"
    src = source(spark, tmp_path)
    drop(landing, "a.json", jsonl({"id": 1}))

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed between listing and commit")

    with monkeypatch.context() as m:
        m.setattr(deltalake, "write_deltalake", crash)
        with pytest.raises(KeyboardInterrupt):
            src.discover()
    assert src.latest_version() is None
    assert src.discover() == 0
    assert [f.path for f in src.added_files(-1, 0)] == ["a.json"]


# reading JSON lines ---------------------------------------------------------------------------------

GOOD = [
    {"id": 1, "name": "ann", "amount_cents": 100, "ts": "2024-01-02T03:04:05"},
    {"id": 2, "name": "bob", "amount_cents": -5},
]
JSON_LINES = [
    json.dumps(GOOD[0]),
    json.dumps({"id": 3, "name": "cat", "amount_cents": "abc"}),
    "{not json at all",
    "",
    json.dumps(GOOD[1]),
    json.dumps({"id": "x", "amount_cents": 1.5}),
    "[1, 2]",
]


def test_json_read_types_offsets_and_bad_lines(spark, tmp_path):
    landing = tmp_path / "landing"
    src = source(spark, tmp_path)
    drop(landing, "one.json", "\n".join(JSON_LINES) + "\n")
    drop(landing, "two.json", json.dumps(GOOD[1]))  # no final newline: still one line
    drop(landing, "empty.json", "")
    src.discover()
    df = src.read(src.added_files(-1, 0))

    assert df.schema.simpleString() == (
        "struct<id:bigint,name:string,amount_cents:bigint,ts:timestamp,"
        "src_version:bigint,src_file:string,src_row:bigint,_ckpt_error:string>"
    )
    rows = rows_by_offset(df)
    assert len(rows) == len(JSON_LINES) + 1  # one row per line, nothing dropped
    assert sorted(rows) == [("one.json", i) for i in range(len(JSON_LINES))] + [("two.json", 0)]
    got = {k: dict(zip(df.columns, v)) for k, v in rows.items()}

    first = got["one.json", 0]
    assert (first["id"], first["name"], first["amount_cents"], first["_ckpt_error"]) == (1, "ann", 100, None)
    assert first["ts"] == datetime(2024, 1, 2, 3, 4, 5) and first["src_version"] == 0
    assert got["one.json", 4]["_ckpt_error"] is None and got["two.json", 0]["amount_cents"] == -5

    assert got["one.json", 1]["_ckpt_error"] == 'wrong type for amount_cents: "abc" (expected bigint)'
    assert got["one.json", 1]["id"] == 3  # the other columns still parse
    assert got["one.json", 2]["_ckpt_error"] == "unparsable row: {not json at all"
    assert got["one.json", 3]["_ckpt_error"] == "empty line"
    assert got["one.json", 5]["_ckpt_error"] == (
        'wrong type for id: "x" (expected bigint); wrong type for amount_cents: "1.5" (expected bigint)'
    )
    assert got["one.json", 6]["_ckpt_error"] == "unparsable row: [1, 2]"
    assert sum(1 for r in got.values() if r["_ckpt_error"] is None) == 3


def test_unparsable_preview_is_capped(spark, tmp_path):
    src = source(spark, tmp_path)
    drop(tmp_path / "landing", "long.json", "x" * 1000 + "\n")
    src.discover()
    (row,) = src.read(src.added_files(-1, 0)).collect()
    assert row["_ckpt_error"] == "unparsable row: " + "x" * 200


@pytest.fixture(params=["map literal", "broadcast join"])
def file_lookup(request, monkeypatch):
    """Both ways a row finds its file's version: a map literal in the plan (up to
    ``tables.LITERAL_ENTRIES`` files a step) and a broadcast join (more)."""
    from checkpoint_lib.spark import tables

    monkeypatch.setattr(tables, "LITERAL_ENTRIES", 64 if request.param == "map literal" else 0)
    return request.param


def test_reads_are_stable_whatever_the_step_and_the_partitioning(spark, tmp_path, file_lookup):
    landing = tmp_path / "landing"
    src = source(spark, tmp_path)
    for i in range(3):
        drop(landing, f"f{i}.json", "".join(
            (json.dumps({"id": i * 100 + j, "amount_cents": j}) if j % 7 else "bad line") + "\r\n"
            for j in range(40)
        ))
    src.discover()
    files = src.added_files(-1, 0)
    first = rows_by_offset(src.read(files))
    assert len(first) == 120
    for (name, line), values in first.items():  # the line number is the position in the file
        file_no = int(name[1])
        assert values[-1] == ("unparsable row: bad line" if line % 7 == 0 else None)
        assert values[0] == (None if line % 7 == 0 else file_no * 100 + line)
    assert rows_by_offset(src.read(files)) == first
    assert rows_by_offset(src.read(list(reversed(files)))) == first
    alone = rows_by_offset(src.read([files[1]]))
    assert alone == {k: v for k, v in first.items() if k[0] == "f1.json"}
    with_conf(spark, {"spark.sql.files.maxPartitionBytes": "64", "spark.sql.files.openCostInBytes": "1"})
    try:
        assert rows_by_offset(src.read(files)) == first
    finally:
        with_conf(spark, {"spark.sql.files.maxPartitionBytes": None, "spark.sql.files.openCostInBytes": None})


def with_conf(spark, conf: dict[str, str | None]) -> None:
    for key, value in conf.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


def test_odd_file_names_keep_their_names(spark, tmp_path, file_lookup):
    landing = tmp_path / "landing"
    src = source(spark, tmp_path, schema={"id": "long"})
    names = ["a b.json", "x+y.json", "c[1]%41.json", "q{1,2}*?.json", "é.json"]
    for i, name in enumerate(names):
        drop(landing, name, jsonl({"id": i}))
    src.discover()
    rows = src.read(src.added_files(-1, 0)).collect()
    assert sorted((r["src_file"], r["id"]) for r in rows) == sorted((n, i) for i, n in enumerate(names))


def test_read_of_nothing_is_empty_with_the_schema(spark, tmp_path):
    src = source(spark, tmp_path)
    df = src.read([])
    assert df.count() == 0 and df.schema.simpleString() == src.output_schema().simpleString()


# CSV and Parquet --------------------------------------------------------------------------------------


def test_csv_with_header_types_offsets_and_bad_rows(spark, tmp_path):
    landing = tmp_path / "landing"
    src = source(spark, tmp_path, "csv", schema={"id": "long", "name": "string", "amount_cents": "long"},
                 options={"header": "true"})
    lines = ["id,name,amount_cents", "1,ann,100", "2,bob", "3,cat,abc", "4,,7", '5,"d, e",8', "6,f,9,10", "", "7,g,1"]
    drop(landing, "a.csv", "\n".join(lines) + "\n")
    src.discover()
    df = src.read(src.added_files(-1, 0))
    got = {k[1]: dict(zip(df.columns, v)) for k, v in rows_by_offset(df).items()}
    assert sorted(got) == list(range(1, len(lines)))  # every line but the header; physical line numbers

    assert [got[1][c] for c in ("id", "name", "amount_cents", "_ckpt_error")] == [1, "ann", 100, None]
    assert got[2]["_ckpt_error"] == "unparsable row (expected 3 fields): 2,bob"
    assert got[3]["_ckpt_error"] == 'wrong type for amount_cents: "abc" (expected bigint)'
    assert (got[4]["name"], got[4]["_ckpt_error"]) == (None, None)  # an empty field is null, not an error
    assert (got[5]["name"], got[5]["_ckpt_error"]) == ("d, e", None)
    assert got[6]["_ckpt_error"] == "unparsable row (expected 3 fields): 6,f,9,10"
    assert got[7]["_ckpt_error"] == "empty line"
    assert got[8]["_ckpt_error"] is None and got[8]["src_version"] == 0


def test_csv_without_header_and_with_options(spark, tmp_path):
    landing = tmp_path / "landing"
    src = source(spark, tmp_path, "csv", schema={"id": "long", "day": "date"},
                 options={"sep": ";", "dateFormat": "dd.MM.yyyy"})
    drop(landing, "a.csv", "1;02.01.2024\n2;2024-01-02\n")
    src.discover()
    rows = sorted(src.read(src.added_files(-1, 0)).collect(), key=lambda r: r["src_row"])
    assert [(r["src_row"], r["id"], str(r["day"])) for r in rows] == [(0, 1, "2024-01-02"), (1, 2, "None")]
    assert rows[0]["_ckpt_error"] is None
    assert rows[1]["_ckpt_error"] == 'wrong type for day: "2024-01-02" (expected date)'


def test_parquet_rows_are_exact_typed_and_stable(spark, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    src = source(spark, tmp_path, "parquet", schema={"id": "long", "name": "string", "missing": "double"})
    for f, n in (("a.parquet", 25), ("b b.parquet", 7)):
        table = pa.table({"id": list(range(n)), "name": [f"{f}-{i}" for i in range(n)]})
        pq.write_table(table, landing / f".{f}.inprogress", row_group_size=4)
        os.replace(landing / f".{f}.inprogress", landing / f)
    assert src.discover() == 0
    files = src.added_files(-1, 0)
    assert [(f.path, f.rows) for f in files] == [("a.parquet", 25), ("b b.parquet", 7)]  # exact, from footers
    df = src.read(files)
    assert df.schema.simpleString() == src.output_schema().simpleString()
    first = rows_by_offset(df)
    assert len(first) == 32
    for (name, row), values in first.items():
        assert values[:3] == (row, f"{name}-{row}", None) and values[-1] is None  # row index = position in file
    assert rows_by_offset(src.read(list(reversed(files)))) == first

    pq.write_table(pa.table({"id": ["not", "a long"]}), landing / ".c.parquet.tmp")
    os.replace(landing / ".c.parquet.tmp", landing / "c.parquet")
    assert src.discover() == 1
    with pytest.raises(Exception, match="c.parquet"):  # typed files: a wrong type fails the read, loudly
        src.read(src.added_files(0, 1)).collect()


def test_unreadable_parquet_is_refused_at_discover(spark, tmp_path):
    landing = tmp_path / "landing"
    src = source(spark, tmp_path, "parquet", schema={"id": "long"})
    drop(landing, "half-written.parquet", b"PAR1 not really")
    with pytest.raises(UnsupportedFileError, match="half-written.parquet"):
        src.discover()
    assert src.latest_version() is None


# errors ----------------------------------------------------------------------------------------------------


def test_missing_folder_and_bad_arguments(spark, tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "landing")):
        source(spark, tmp_path).discover()
    with pytest.raises(ValueError, match="unknown landing file format 'xml'"):
        source(spark, tmp_path, "xml")
    with pytest.raises(ValueError, match="reserved"):
        source(spark, tmp_path, schema={"id": "long", "src_row": "long"})
    with pytest.raises(ValueError, match="unknown Spark SQL type 'lng'"):
        source(spark, tmp_path, schema={"id": "lng"})
    with pytest.raises(ValueError, match="fixed by the landing source"):
        source(spark, tmp_path, options={"mode": "FAILFAST"})
    with pytest.raises(ValueError, match="CSV only"):
        source(spark, tmp_path, options={"header": "true"})


def test_a_vanished_or_changed_file_is_an_error_not_a_skip(spark, tmp_path):
    landing = tmp_path / "landing"
    src = source(spark, tmp_path)
    drop(landing, "a.json", jsonl({"id": 1}))
    drop(landing, "b.json", jsonl({"id": 2}))
    src.discover()
    files = src.added_files(-1, 0)
    (landing / "b.json").unlink()
    with pytest.raises(LandingFileMissingError, match="b.json") as missing:
        src.read(files)
    assert isinstance(missing.value, FileNotFoundError)
    drop(landing, "b.json", jsonl({"id": 2, "name": "rewritten"}))
    with pytest.raises(LandingFileChangedError, match="b.json"):
        src.read(files)
    assert src.discover() == 0  # the name is registered: never again, even after a rewrite


def test_a_name_spark_cannot_read_is_refused_and_nothing_registered(spark, tmp_path):
    landing = tmp_path / "landing"
    src = source(spark, tmp_path)
    drop(landing, "a.json", jsonl({"id": 1}))
    drop(landing, "at 12:00.json", jsonl({"id": 2}))
    with pytest.raises(UnsupportedFileError, match="at 12:00.json"):
        src.discover()
    assert src.latest_version() is None
    os.replace(landing / "at 12:00.json", landing / "at 12-00.json")
    assert src.discover() == 0 and len(src.added_files(-1, 0)) == 2

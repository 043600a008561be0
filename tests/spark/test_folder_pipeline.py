"""A pipeline fed by a landing folder of JSON files: exactly-once ledger and balances, unparsable
lines and wrong types dead-lettered with their offsets, files picked up incrementally, temp files
ignored, and the stages in separate runs."""

from __future__ import annotations

import json
import os

import pytest
from folder_payments import events, expected, folder_payments

from checkpoint_lib.spark.runner import PipelineRunner
from checkpoint_lib.verify import read_delta

pytestmark = pytest.mark.spark


def write_file(folder, name: str, lines: list[str]) -> None:
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f"{name}.tmp")
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.rename(tmp, os.path.join(folder, name))  # appear complete, atomically


@pytest.mark.slow  # ~20 s; CI tier: tests/spark/test_landing.py (local folders: listing, bad lines, manifests); the
# same files, bad lines and separate stage runs on S3 in tests/crash/test_object_store.py (slow too)
def test_landing_folder_pipeline_is_exactly_once_and_dead_letters_bad_lines(spark, tmp_path):
    folder = tmp_path / "landing" / "payment_files"
    first, second = events("f1", 40), events("f2", 30)
    write_file(folder, "part-001.json", [json.dumps(e) for e in first] + [
        "{not json",                                                              # unparsable
        json.dumps({"event_id": "x1", "account": "a1", "amount_cents": "abc"}),  # wrong type
        json.dumps({"event_id": "x2", "account": None, "amount_cents": 5}),      # null account
    ])
    write_file(folder, "part-002.json", [json.dumps(e) for e in second])
    (folder / ".part-003.json.inprogress").write_text("{half a file")  # ignored until renamed

    def run(**kw):
        return PipelineRunner(folder_payments(), str(tmp_path), spark, rows_per_checkpoint=20, **kw).run()

    run()
    balances = read_delta(f"{tmp_path}/gold/files_balances")
    got = {r.account: (r.balance_cents, r.event_count) for r in balances.itertuples()}
    assert got == expected(first + second)
    ledger = read_delta(f"{tmp_path}/gold/files_ledger")
    assert sorted(ledger["event_id"]) == sorted(e["event_id"] for e in first + second)
    dlq = read_delta(f"{tmp_path}/dlq/payment_files").sort_values("src_row")
    assert list(dlq["src_file"]) == ["part-001.json"] * 3
    assert list(dlq["src_row"]) == [40, 41, 42]
    errors = list(dlq["error"])
    assert errors[0].startswith("unparsable row: {not json")
    assert errors[1].startswith("wrong type for amount_cents")
    assert errors[2] == "null or empty account"

    # a new file, in separate stage runs: only it is read, nothing twice
    third = events("f3", 25)
    write_file(folder, "part-004.json", [json.dumps(e) for e in third])
    # a layout switch (chained -> separate stages) restores the latest checkpoint, then reads on
    # (sessions.resume_of: the chained epoch has no resume point for the source stage alone)
    src = run(stage="source")
    assert src.restored is not None and src.epoch > 1
    run(stage="keyed")
    balances = read_delta(f"{tmp_path}/gold/files_balances")
    got = {r.account: (r.balance_cents, r.event_count) for r in balances.itertuples()}
    assert got == expected(first + second + third)
    assert len(read_delta(f"{tmp_path}/gold/files_ledger")) == len(first + second + third)
    assert len(read_delta(f"{tmp_path}/dlq/payment_files")) == 3

"""A pipeline fed by a landing folder of JSON files: exactly-once ledger and balances, unparsable
lines and wrong types dead-lettered with their offsets, files picked up incrementally, temp files
ignored, and the stages in separate runs."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from checkpoint_lib.pipeline import DeltaSink, FolderSource, Pipeline
from checkpoint_lib.pipelines.payments import BALANCES_SCHEMA, LEDGER_SCHEMA, SOURCE_SCHEMA, RunningBalance, payment_errors
from checkpoint_lib.spark.runner import PipelineRunner
from checkpoint_lib.verify import read_delta

pytestmark = pytest.mark.spark


def folder_payments() -> Pipeline:
    return (
        Pipeline("payments_files")
        .source(FolderSource("landing/payment_files", SOURCE_SCHEMA, format="json", validate=payment_errors),
                parallelism=2)
        .key_by("account", parallelism=3)
        .process(RunningBalance(), uid="balance")
        .sink("ledger", DeltaSink("gold/files_ledger", LEDGER_SCHEMA))
        .sink("balances", DeltaSink("gold/files_balances", BALANCES_SCHEMA, mode="upsert", keys=("account",)))
        .dead_letters("dlq/payment_files")
    )


def write_file(folder, name: str, lines: list[str]) -> None:
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f"{name}.tmp")
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.rename(tmp, os.path.join(folder, name))  # appear complete, atomically


def events(prefix: str, n: int, accounts: int = 7) -> list[dict]:
    return [{"event_id": f"{prefix}-{i}", "account": f"a{i % accounts}", "amount_cents": (i * 37) % 1000 - 400,
             "ts": "2026-01-01T00:00:00Z"} for i in range(n)]


def expected(good: list[dict]) -> dict[str, tuple[int, int]]:
    df = pd.DataFrame(good)
    agg = df.groupby("account")["amount_cents"].agg(["sum", "count"])
    return {a: (int(r["sum"]), int(r["count"])) for a, r in agg.iterrows()}


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
    src = run(stage="source")
    assert src.restored is None
    run(stage="keyed")
    balances = read_delta(f"{tmp_path}/gold/files_balances")
    got = {r.account: (r.balance_cents, r.event_count) for r in balances.itertuples()}
    assert got == expected(first + second + third)
    assert len(read_delta(f"{tmp_path}/gold/files_ledger")) == len(first + second + third)
    assert len(read_delta(f"{tmp_path}/dlq/payment_files")) == 3

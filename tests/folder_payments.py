"""The payments pipeline fed by a landing folder of JSON files, and its expected outcome: shared by
the folder tests on a local warehouse (tests/spark/test_folder_pipeline.py) and on S3
(tests/crash/test_object_store.py)."""

from __future__ import annotations

import pandas as pd

from checkpoint_lib.pipeline import FolderSource, Pipeline
from checkpoint_lib.pipelines.payments import SOURCE_SCHEMA, payment_errors, running_balances


def folder_payments() -> Pipeline:
    return running_balances(
        "payments_files", FolderSource("landing/payment_files", SOURCE_SCHEMA, format="json", validate=payment_errors),
        ledger="gold/files_ledger", balances="gold/files_balances", dead_letters="dlq/payment_files",
    )


def events(prefix: str, n: int, accounts: int = 7) -> list[dict]:
    return [{"event_id": f"{prefix}-{i}", "account": f"a{i % accounts}", "amount_cents": (i * 37) % 1000 - 400,
             "ts": "2026-01-01T00:00:00Z"} for i in range(n)]


def expected(good: list[dict]) -> dict[str, tuple[int, int]]:
    df = pd.DataFrame(good)
    agg = df.groupby("account")["amount_cents"].agg(["sum", "count"])
    return {a: (int(r["sum"]), int(r["count"])) for a, r in agg.iterrows()}

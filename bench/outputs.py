"""The input every contender of the benchmark reads, and the check of what each one writes: a
contender whose outputs differ from the floor's has its time thrown away (:class:`WrongOutputs`)."""

from __future__ import annotations

from typing import Any

FILES_PER_VERSION = 2


class WrongOutputs(AssertionError):
    pass


def diff_outputs(spark: Any, want: str, got: str, *, ledger_order: bool = True) -> list[str]:
    """How the outputs under ``got`` differ from those under ``want`` (empty: equal). Runs in
    Spark; only counts reach the driver. ``ledger_order=False`` ignores ``balance_after_cents``
    (records in flight from a lagging source reach an account in another, equally valid order)."""
    from pyspark.sql import functions as F

    def load(root: str, name: str):
        return spark.read.format("delta").load(f"{root}/{name}")

    problems = []
    ledger_cols = ["event_id", "account", "amount_cents"] + (["balance_after_cents"] if ledger_order else [])
    for name, cols in (("gold/ledger", ledger_cols), ("gold/balances", ["account", "balance_cents", "event_count"])):
        a, b = load(want, name).select(*cols), load(got, name).select(*cols)
        missing, extra = a.exceptAll(b).count(), b.exceptAll(a).count()
        if missing or extra:
            problems.append(f"{name}: {missing} rows missing, {extra} rows extra")
    a, b = load(want, "dlq/payments"), load(got, "dlq/payments")
    by_error = lambda df: {r["error"]: r["n"] for r in df.groupBy("error").agg(F.count("*").alias("n")).collect()}  # noqa: E731
    if by_error(a) != by_error(b):
        problems.append(f"dlq/payments: {by_error(b)} rows by error, expected {by_error(a)}")
    return problems


def generate_landing(spark: Any, warehouse: str, rows: int, rows_per_version: int, accounts: int) -> int:
    from checkpoint_lib.pipelines.payments import generate

    versions = max(1, -(-rows // rows_per_version))
    for v in range(versions):
        n = min(rows_per_version, rows - v * rows_per_version)
        generate(spark, warehouse, n, bad_fraction=0.001, accounts=accounts, seed=v, files=FILES_PER_VERSION)
    return versions


def check(spark: Any, floor_out: str, got: str, who: str, *, ledger_order: bool = True) -> None:
    problems = diff_outputs(spark, floor_out, got, ledger_order=ledger_order)
    if problems:
        raise WrongOutputs(f"{who}: outputs differ from the floor's, its time does not count:\n  - "
                           + "\n  - ".join(problems))

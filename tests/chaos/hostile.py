"""Hostile and bad input, tried on the real ``payments`` pipeline (local Spark, real Delta).

Each :class:`Case` lands one kind of bad input and runs the pipeline in-process. It expects
one of two things:
- a clear error: the given exception class and message, with nothing written (no ledger,
  balances or dead letters) and the checkpoint store still restorable;
- clean handling: the run finishes, and the outputs match the independent pandas computation
  (bad rows dead-lettered with a reason, nothing lost).

The rows a case writes are few (built on the driver on purpose: hand-made edge cases).
tests/chaos/test_hostile.py runs every case in CI. ``make chaos`` runs them again and lists
the inputs tried and errors raised in docs/reliability.md.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

LONG_MAX = 2**63 - 1


@dataclass(frozen=True)
class Case:
    name: str
    input: str  # what is tried, for the table
    land: Callable[[Any, str], None]  # (spark, warehouse): write the landing table
    error: type | None = None  # the exception expected, or None: the run must succeed
    message: str = ""  # a regex the error message must match
    check: Callable[[str, list[str]], list[str]] | None = None  # (warehouse, progress) -> problems


@dataclass
class Tried:
    case: str
    input: str
    result: str  # the error raised (class: message), or what the run did
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _ts(i: int) -> datetime:
    return datetime(2026, 1, 1, tzinfo=timezone.utc).replace(second=i % 60)


def _rows(spark, warehouse: str, rows: list[tuple], schema: str, mode: str = "append") -> None:
    df = spark.createDataFrame(rows, schema)
    df.coalesce(1).write.format("delta").mode(mode).save(f"{warehouse}/landing/payments")


PAYMENTS = "event_id string, account string, amount_cents long, ts timestamp"


def _good(spark, warehouse: str, n: int = 12, prefix: str = "e") -> None:
    _rows(spark, warehouse, [(f"{prefix}{i}", f"acct-{i % 3}", 100 * (i + 1), _ts(i)) for i in range(n)], PAYMENTS)


def _exact(warehouse: str, _progress: list[str]) -> list[str]:
    from checkpoint_lib.verify import check_payments

    check = check_payments(warehouse)
    return [] if check.ok else check.problems


def _extra_column(spark, w):
    _rows(spark, w, [(f"e{i}", f"acct-{i % 3}", 100 * i, _ts(i), "note") for i in range(12)],
          PAYMENTS + ", memo string")


def _extra_column_is_named(w, progress):
    named = any("memo" in line and "ignored" in line for line in progress)
    return _exact(w, progress) + ([] if named else ["no progress message names the ignored column 'memo'"])


def _column_added_later(spark, w):
    _good(spark, w)
    spark.conf.set("spark.databricks.delta.schema.autoMerge.enabled", "true")
    try:
        (spark.createDataFrame([(f"x{i}", "acct-1", 5, _ts(i), "late") for i in range(4)], PAYMENTS + ", memo string")
         .write.format("delta").mode("append").option("mergeSchema", "true").save(f"{w}/landing/payments"))
    finally:
        spark.conf.unset("spark.databricks.delta.schema.autoMerge.enabled")


def _missing_column(spark, w):
    _rows(spark, w, [(f"e{i}", f"acct-{i % 3}", _ts(i)) for i in range(5)], "event_id string, account string, ts timestamp")


def _retyped_column(spark, w):
    _rows(spark, w, [(f"e{i}", f"acct-{i % 3}", str(100 * i), _ts(i)) for i in range(5)],
          "event_id string, account string, amount_cents string, ts timestamp")


def _narrower_type(spark, w):
    _rows(spark, w, [(f"e{i}", f"acct-{i % 3}", 100 * i, _ts(i)) for i in range(5)],
          "event_id string, account string, amount_cents int, ts timestamp")


def _nulls(spark, w):
    rows = [(None, "acct-1", 5, _ts(0)), ("n1", None, 5, _ts(1)), ("n2", "   ", 5, _ts(2)), ("n3", "acct-1", None, _ts(3)),
            ("n4", "acct-2", 7, None), (None, None, None, None)]
    _rows(spark, w, rows + [(f"e{i}", f"acct-{i % 3}", 100 * i, _ts(i)) for i in range(6)], PAYMENTS)


def _nulls_dead_lettered(w, progress):
    from checkpoint_lib.verify import read_delta

    problems = _exact(w, progress)
    dlq = read_delta(f"{w}/dlq/payments")
    if len(dlq) != 5:  # a null ts is not an error of payments: the event is valid
        problems.append(f"expected 5 dead letters, got {len(dlq)}")
    if dlq["error"].fillna("").str.strip().eq("").any():  # the reason: what a dead letter is for
        problems.append("a dead letter without a reason")
    if not dlq["error"].str.startswith("null ").all():
        problems.append(f"a dead letter for another reason than its null: {sorted(set(dlq['error']))}")
    return problems


def _huge_values(spark, w):
    rows = [("h0", "acct-big", LONG_MAX, _ts(0)), ("h1", "acct-small", -LONG_MAX - 1, _ts(1)),
            ("h2", "a" * 100_000, 1, _ts(2)), ("h3", "acct-1", 3, _ts(3)), ("x" * 10_000, "acct-1", 4, _ts(4))]
    _rows(spark, w, rows, PAYMENTS)


def _overflow(spark, w):
    _rows(spark, w, [("o0", "acct-1", LONG_MAX - 5, _ts(0)), ("o1", "acct-1", 10, _ts(1))], PAYMENTS)


def _duplicate_ids(spark, w):
    _rows(spark, w, [("same", "acct-1", 100, _ts(0)), ("same", "acct-1", 100, _ts(1)), ("e2", "acct-2", 5, _ts(2))],
          PAYMENTS)


def _duplicates_are_two_events(w, progress):
    from checkpoint_lib.verify import read_delta

    ledger = read_delta(f"{w}/gold/ledger")
    balances = read_delta(f"{w}/gold/balances").set_index("account")
    problems = []
    if int((ledger["event_id"] == "same").sum()) != 2:
        problems.append(f"the duplicated id is in the ledger {int((ledger['event_id'] == 'same').sum())} times, not 2")
    if int(balances.loc["acct-1", "balance_cents"]) != 200:
        problems.append("acct-1's balance is not 200")
    return problems


def _empty_table(spark, w):
    _rows(spark, w, [], PAYMENTS)


def _empty_outputs(w, progress):
    from checkpoint_lib.verify import read_delta

    sizes = {t: len(read_delta(f"{w}/{t}")) for t in ("gold/ledger", "gold/balances", "dlq/payments")}
    return [f"{t} has {n} rows" for t, n in sizes.items() if n]


def _no_table(spark, w):
    Path(w).mkdir(parents=True, exist_ok=True)


def _rewritten(spark, w):
    from checkpoint_lib.pipelines import get
    from checkpoint_lib.spark.runner import PipelineRunner

    _good(spark, w)
    PipelineRunner(get("payments"), w, spark, rows_per_checkpoint=100).run()
    spark.sql(f"DELETE FROM delta.`{w}/landing/payments` WHERE account = 'acct-1'")
    _good(spark, w, prefix="f")


def _unchanged_since_first_run(w, progress):
    from checkpoint_lib.verify import read_delta

    ledger = read_delta(f"{w}/gold/ledger")
    return [] if len(ledger) == 12 and ledger["event_id"].str.startswith("e").all() else [
        f"the ledger changed after the rewrite: {len(ledger)} rows"]


CASE_NAMES = ("extra_column", "column_added_later", "missing_column", "retyped_column", "narrower_type", "nulls",
              "huge_values", "balance_overflow", "duplicate_event_ids", "empty_table", "no_table", "rewritten_in_place")


def case(name: str) -> Case:
    return {c.name: c for c in cases()}[name]


def cases() -> list[Case]:
    from checkpoint_lib.delta.log import NotAppendOnlyError
    from checkpoint_lib.spark.runner import SchemaMismatchError

    return [
        Case("extra_column", "landing table with a column the pipeline does not declare (memo string)",
             _extra_column, check=_extra_column_is_named),
        Case("column_added_later", "a column added by a later append (mergeSchema)", _column_added_later,
             check=_extra_column_is_named),
        Case("missing_column", "landing table without amount_cents", _missing_column, SchemaMismatchError,
             r"column 'amount_cents' is missing\. Nothing was read or written"),
        Case("retyped_column", "amount_cents as string", _retyped_column, SchemaMismatchError,
             r"column 'amount_cents' is string, expected long"),
        Case("narrower_type", "amount_cents as int", _narrower_type, SchemaMismatchError,
             r"column 'amount_cents' is integer, expected long"),
        Case("nulls", "null event_id / account / amount, blank account, all-null row, null ts", _nulls,
             check=_nulls_dead_lettered),
        Case("huge_values", "amount_cents = ±2^63, a 100,000-character account, a 10,000-character event id",
             _huge_values, check=_exact),
        Case("balance_overflow", "two amounts whose running balance exceeds 2^63-1", _overflow, Exception,
             r"(?i)overflow"),
        Case("duplicate_event_ids", "the same event_id on two landing rows", _duplicate_ids,
             check=_duplicates_are_two_events),
        Case("empty_table", "a landing table with the schema and no rows", _empty_table, check=_empty_outputs),
        Case("no_table", "no landing table at all", _no_table, FileNotFoundError, r"no landing table at .*ckpt generate"),
        Case("rewritten_in_place", "rows DELETEd from the landing table after a run, then an append", _rewritten,
             NotAppendOnlyError, r"must be append-only", check=_unchanged_since_first_run),
    ]


def _written(w: str) -> dict[str, int]:
    from checkpoint_lib.verify import read_delta

    out = {}
    for t in ("gold/ledger", "gold/balances", "dlq/payments"):
        try:
            out[t] = len(read_delta(f"{w}/{t}"))
        except Exception:  # noqa: BLE001 - not created: nothing written
            out[t] = 0
    return out


def try_case(spark, warehouse: str | Path, case: Case) -> Tried:
    """Land ``case``'s input, run payments, and say what happened and what was wrong with it."""
    from checkpoint_lib.pipelines import get
    from checkpoint_lib.spark.runner import PipelineRunner

    w = str(warehouse)
    case.land(spark, w)
    before = _written(w)
    progress: list[str] = []
    tried = Tried(case.name, case.input, "")
    try:
        summary = PipelineRunner(get("payments"), w, spark, rows_per_checkpoint=100, progress=progress.append).run()
    except Exception as exc:  # noqa: BLE001 - recorded and judged below
        message = " ".join(str(exc).split()).replace(w, "<warehouse>")
        tried.result = f"{type(exc).__name__}: {message[:300]}"
        if case.error is None:
            tried.problems.append(f"unexpected error:\n{traceback.format_exc()[-2000:]}")
        elif not isinstance(exc, case.error) or not re.search(case.message, str(exc)):
            tried.problems.append(f"expected {case.error.__name__} matching {case.message!r}, got {tried.result}")
        after = _written(w)
        if after != before:
            tried.problems.append(f"written despite the error: {before} -> {after}")
    else:
        tried.result = (f"ran: {summary.rows_in} rows read, checkpoints {summary.completed}; "
                        + ", ".join(f"{t} {n}" for t, n in _written(w).items()))
        if case.error is not None:
            tried.problems.append(f"expected {case.error.__name__}, the run succeeded")
    if case.check is not None and not tried.problems:
        tried.problems += case.check(w, progress)
    return tried


# Recovery and control parameters (the Airflow forms, the CLI, the REST plugin all use these).
PARAMETERS = [
    ("checkpoint id", "../../x"), ("checkpoint id", "1; drop table x"), ("checkpoint id", "9" * 5000),
    ("checkpoint id", "-3"), ("checkpoint id", "0x10"), ("pipeline", "../../etc"), ("pipeline", "payments; rm -rf /"),
    ("pipeline", "p" * 5000), ("request id", "../x"), ("request id", "a b"), ("request id", "x" * 201),
]


def try_parameters() -> list[Tried]:
    from checkpoint_lib.control import parse_checkpoint_id, validate_pipeline_name, validate_request_id

    fn = {"checkpoint id": parse_checkpoint_id, "pipeline": validate_pipeline_name, "request id": validate_request_id}
    out = []
    for what, value in PARAMETERS:
        shown = value if len(value) <= 24 else f"{value[:8]}... ({len(value)} chars)"
        tried = Tried(f"param_{what.replace(' ', '_')}", f"{what} `{shown}`", "")
        try:
            fn[what](value)
        except ValueError as exc:
            tried.result = f"ValueError: {str(exc)[:160]}"
        else:
            tried.result = "accepted"
            tried.problems.append(f"{what} {shown!r} was accepted")
        out.append(tried)
    return out


def render(tried: list[Tried]) -> str:
    lines = ["| input tried | result (error raised, or what the run did) | as expected |", "|---|---|---|"]
    for t in tried:
        result = t.result.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {t.input} | {result} | {'yes' if t.ok else 'NO: ' + '; '.join(t.problems)[:200]} |")
    return "\n".join(lines)

"""``payments_pg``: :mod:`payments <checkpoint_lib.pipelines.payments>` with its balances also
upserted into PostgreSQL, exactly once, through two-phase commit (``PREPARE TRANSACTION``; the
sink: :class:`~checkpoint_lib.pipeline.PostgresSink`).

It reads and writes the warehouse tables ``payments`` does (``landing/payments``, ``gold/ledger``,
``gold/balances``, ``dlq/payments``; so ``ckpt generate payments`` feeds it and the payments verifier
checks it), plus the PostgreSQL table ``balances`` of the connection ``ckpt_postgres``::

    export AIRFLOW_CONN_CKPT_POSTGRES='postgresql://user:password@host:5432/database'
    ckpt run checkpoint_lib.pipelines.payments_postgres:pipeline --warehouse ./warehouse

Not registered by name: it needs a server, which the built-in pipelines do not.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..pipeline import DeltaSink, DeltaSource, Pipeline, PostgresSink
from .payments import BALANCES_SCHEMA, LEDGER_SCHEMA, SOURCE_SCHEMA, RunningBalance, generate, payment_errors

TABLE = "balances"
"""The PostgreSQL table the balances are upserted into (in the connection's default schema)."""


class RunningBalanceEverywhere(RunningBalance):
    """:class:`~checkpoint_lib.pipelines.payments.RunningBalance`, its outputs ``also`` (names) also
    for the PostgreSQL sinks ``<name>_pg`` (the same rows, computed once)."""

    def __init__(self, also: tuple[str, ...] = ("balances",)):
        self.also = tuple(also)

    def apply(self, records: Any, state: Any, key: str) -> tuple[Any, Mapping[str, Any]]:
        deltas, outputs = super().apply(records, state, key)
        return deltas, {**outputs, **{f"{name}_pg": outputs[name] for name in self.also}}


def build(*, ledger_table: str | None = None) -> Pipeline:
    """``payments_pg``; with ``ledger_table``, the ledger is also appended to that PostgreSQL table
    (sink ``ledger_pg``: an append, where a row committed twice would show)."""
    p = (
        Pipeline("payments_pg")
        .source(DeltaSource("landing/payments", SOURCE_SCHEMA, validate=payment_errors), parallelism=2)
        .key_by("account", parallelism=3)
        .process(RunningBalanceEverywhere(("balances", "ledger") if ledger_table else ("balances",)), uid="balance")
        .sink("ledger", DeltaSink("gold/ledger", LEDGER_SCHEMA))
        .sink("balances", DeltaSink("gold/balances", BALANCES_SCHEMA, mode="upsert", keys=("account",)))
        .sink("balances_pg", PostgresSink(TABLE, BALANCES_SCHEMA, mode="upsert", keys=("account",)))
        .dead_letters("dlq/payments")
        .generator(generate)
    )
    if ledger_table:
        p = p.sink("ledger_pg", PostgresSink(ledger_table, LEDGER_SCHEMA))
    return p


pipeline = build()

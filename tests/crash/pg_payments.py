"""The crash tests' variant of ``payments_pg``: its ledger also appended to PostgreSQL (a row committed
twice would show there), by reference ``pg_payments:pipeline`` from this folder."""

from checkpoint_lib.pipelines.payments_postgres import build

pipeline = build(ledger_table="ledger")

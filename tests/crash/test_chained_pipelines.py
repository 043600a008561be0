"""Two pipelines chained through a sink, each killed -9 in a real ``ckpt run`` process: payments
writes ``gold/ledger`` (an append sink), a second pipeline (a user's, by ``module:attr``) reads it
as its source and keeps its own ledger and running balances in ``platinum/``. Exactly once
downstream. (CI runs the same chain with in-process kills: tests/spark/test_lakehouse.py.)"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from checkpoint_lib.submit import ckpt_run_argv, ckpt_run_env

pytestmark = [pytest.mark.crash, pytest.mark.spark]
TIMEOUT = float(os.environ.get("CKPT_TEST_RUN_TIMEOUT", "900"))
MODULE = '''
from checkpoint_lib.pipeline import DeltaSource
from checkpoint_lib.pipelines.payments import running_balances

platinum = running_balances(
    "platinum", DeltaSource("gold/ledger", {"event_id": "string", "account": "string", "amount_cents": "long"}),
    ledger="platinum/ledger", balances="platinum/balances", dead_letters="dlq/platinum", parallelism=(2, 2),
)
'''


def _run(folder, warehouse, ref: str, rows: int, kill_at: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(ckpt_run_argv(ref, warehouse, "--rows-per-checkpoint", str(rows)), cwd=folder,
                          env=ckpt_run_env("local[2]", kill_at=kill_at), capture_output=True, text=True,
                          timeout=TIMEOUT)


@pytest.mark.slow  # about 4 min; CI tier: the in-process chain of tests/spark/test_lakehouse.py
def test_two_pipelines_chained_through_a_sink_each_killed_minus_9_are_exactly_once_downstream(spark, tmp_path):
    from checkpoint_lib.pipelines.payments import generate
    from checkpoint_lib.verify import check_payments, read_delta

    (tmp_path / "chained.py").write_text(MODULE)
    w = str(tmp_path / "warehouse")
    for seed in (1, 2, 3):
        generate(spark, w, 200, bad_fraction=0.05, accounts=25, seed=seed)

    gold = _run(tmp_path, w, "payments", 200, kill_at="commit:2")  # checkpoint 2 complete, not committed
    assert gold.returncode == -signal.SIGKILL, gold.stdout + gold.stderr[-3000:]
    silver = _run(tmp_path, w, "chained:platinum", 150, kill_at="sink_commit:1")  # its ledger committed, balances not
    assert silver.returncode == -signal.SIGKILL, silver.stdout + silver.stderr[-3000:]
    for ref, rows in (("payments", 200), ("chained:platinum", 150)):
        done = _run(tmp_path, w, ref, rows)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        assert "restored checkpoint" in done.stdout, done.stdout

    assert check_payments(w).ok
    gold_ledger, plat_ledger = read_delta(f"{w}/gold/ledger"), read_delta(f"{w}/platinum/ledger")
    assert len(plat_ledger) == len(set(plat_ledger["event_id"])) == len(gold_ledger) > 400
    assert set(plat_ledger["event_id"]) == set(gold_ledger["event_id"])
    balances = {r.account: (r.balance_cents, r.event_count) for r in read_delta(f"{w}/gold/balances").itertuples()}
    assert {r.account: (r.balance_cents, r.event_count)
            for r in read_delta(f"{w}/platinum/balances").itertuples()} == balances

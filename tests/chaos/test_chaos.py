"""The chaos suite (tests/chaos/chaos_harness.py): real ``ckpt run`` processes killed with SIGKILL,
recovered, compared with the failure-free result.

The slow suite runs one fixed scenario with two kills (between the two sinks' commits of a
checkpoint, then during the restore, between the two sinks' re-commits), ``CKPT_CHAOS_RUNS``
(default 24) seeded random scenarios, ``CKPT_CHAOS_MAINTENANCE_RUNS`` (default 6) with a
maintenance operation drawn between kills, and ``CKPT_CHAOS_PG_RUNS`` (default 2) of ``payments_pg``
against a real PostgreSQL server; ``make chaos`` runs them and rewrites
docs/reliability.md (tests/chaos/run_chaos.py). CI's real kill -9 and recovery is
tests/crash/test_object_store.py (killed between completion and commit); in-process kills at
``sink_commit`` and then inside that recovery's restore, between its two sinks' re-commits, run in
CI in tests/spark/test_lakehouse.py (the chained pipelines).
"""

from __future__ import annotations

import os

import pytest

from chaos_harness import (ENRICHMENT_GROUPS_SEEDS, ENRICHMENT_SEEDS, MAINTENANCE_SEEDS, PG_SEEDS, Kill, Scenario,
                           record, run_scenario, scenario)
from checkpoint_lib.verify import read_delta

pytestmark = [pytest.mark.crash, pytest.mark.spark]
RESULTS = os.environ.get("CKPT_CHAOS_RESULTS")


@pytest.mark.slow  # 143 s; CI tier: see the module's docstring
def test_killed_between_two_sinks_commits_then_again_inside_the_restore(spark, tmp_path):
    """Payments, unaligned, a lagging source (records in flight): killed after the ledger committed
    checkpoint 2 and before the balances did, then while the recovery re-commits checkpoint 2's
    transactions (after the first sink's). The third run recovers: exactly once."""
    s = Scenario(seed=0, pipeline="payments", mode="unaligned", lagging=1,
                 first=Kill("sink_commit", 3), then=(Kill("restore", 2),))
    outcome = run_scenario(spark, tmp_path, s)
    assert outcome.survived, outcome.mismatch
    assert outcome.kills == ["sink_commit", "restore"] and not outcome.not_reached, outcome
    channel_state = read_delta(f"{tmp_path}/_checkpoints/payments/edge_state/source_balance")
    assert (channel_state["checkpoint_id"] == 2).sum() > 0, "checkpoint 2 should hold records in flight"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(int(os.environ.get("CKPT_CHAOS_RUNS", "24"))))
def test_chaos(spark, tmp_path, seed):
    outcome = run_scenario(spark, tmp_path, scenario(seed))
    if RESULTS:
        record(RESULTS, outcome)
    assert outcome.survived, f"{scenario(seed).label}: {outcome.mismatch}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(MAINTENANCE_SEEDS, MAINTENANCE_SEEDS + int(os.environ.get("CKPT_CHAOS_MAINTENANCE_RUNS", "6"))))
def test_chaos_with_maintenance_between_kills(spark, tmp_path, seed):
    s = scenario(seed)
    assert len(s.maintenance) == len(s.chain)
    outcome = run_scenario(spark, tmp_path, s)
    if RESULTS:
        record(RESULTS, outcome)
    assert outcome.survived, f"{s.label}: {outcome.mismatch}"
    assert len(outcome.maintenance) == len(s.chain)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(ENRICHMENT_SEEDS, ENRICHMENT_SEEDS + int(os.environ.get("CKPT_CHAOS_ENRICHMENT_RUNS", "6"))))
def test_chaos_enrichment(spark, tmp_path, seed):
    """The enrichment graph (its graph runner: one process, every edge chained) killed and recovered."""
    outcome = run_scenario(spark, tmp_path, scenario(seed))
    if RESULTS:
        record(RESULTS, outcome)
    assert outcome.survived, f"{scenario(seed).label}: {outcome.mismatch}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(ENRICHMENT_GROUPS_SEEDS, ENRICHMENT_GROUPS_SEEDS + int(os.environ.get("CKPT_CHAOS_ENRICHMENT_GROUPS_RUNS", "4"))))
def test_chaos_enrichment_with_a_process_per_vertex(spark, tmp_path, seed):
    """The enrichment graph in the run DAG's layout (a ``ckpt run --stage G`` per process group, every
    edge a channel log, the operators gates), killed in one of its processes and recovered."""
    outcome = run_scenario(spark, tmp_path, scenario(seed))
    if RESULTS:
        record(RESULTS, outcome)
    assert outcome.survived, f"{scenario(seed).label}: {outcome.mismatch}"


@pytest.mark.slow  # about 6 min a seed
@pytest.mark.parametrize("seed", range(PG_SEEDS, PG_SEEDS + int(os.environ.get("CKPT_CHAOS_PG_RUNS", "2"))))
def test_chaos_postgres(spark, tmp_path, chaos_postgres, seed):
    """``payments_pg`` (its balances and ledger also in a real PostgreSQL server, by two-phase
    commit) killed, inside the sink's commit and rollback too, and recovered: the warehouse and the
    database's tables exactly once, nothing left prepared."""
    outcome = run_scenario(spark, tmp_path, scenario(seed), postgres=chaos_postgres)
    if RESULTS:
        record(RESULTS, outcome)
    assert outcome.survived, f"{scenario(seed).label}: {outcome.mismatch}"

"""The chaos suite (tests/chaos/chaos_harness.py): real ``ckpt run`` processes killed with SIGKILL,
recovered, compared with the failure-free result.

CI runs one fixed scenario with two kills at the points no other CI test reaches: between the two
sinks' commits of a checkpoint, then during the restore, between the two sinks' re-commits. The
slow suite runs ``CKPT_CHAOS_RUNS`` (default 24) seeded random scenarios; ``make chaos`` runs them
and rewrites docs/reliability.md (tests/chaos/run_chaos.py).
"""

from __future__ import annotations

import os

import pytest

from chaos_harness import Kill, Scenario, record, run_scenario, scenario
from checkpoint_lib.verify import read_delta

pytestmark = [pytest.mark.crash, pytest.mark.spark]
RESULTS = os.environ.get("CKPT_CHAOS_RESULTS")


def test_killed_between_two_sinks_commits_then_again_inside_the_restore(spark, tmp_path):
    """Payments, unaligned, a lagging source (records in flight): killed after the ledger committed
    checkpoint 2 and before the balances did, then while the recovery re-commits checkpoint 2's
    transactions (after the first sink's). The third run recovers: exactly once."""
    s = Scenario(seed=0, pipeline="payments", mode="unaligned", lagging=1,
                 first=Kill("sink_commit", 3), then=(Kill("restore", 2),))
    outcome = run_scenario(spark, tmp_path, s)
    assert outcome.survived, outcome.mismatch
    assert outcome.kills == ["sink_commit", "restore"] and not outcome.not_reached, outcome
    channel_state = read_delta(f"{tmp_path}/_checkpoints/payments/channel_state")
    assert (channel_state["checkpoint_id"] == 2).sum() > 0, "checkpoint 2 should hold records in flight"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(int(os.environ.get("CKPT_CHAOS_RUNS", "24"))))
def test_chaos(spark, tmp_path, seed):
    outcome = run_scenario(spark, tmp_path, scenario(seed))
    if RESULTS:
        record(RESULTS, outcome)
    assert outcome.survived, f"{scenario(seed).label}: {outcome.mismatch}"

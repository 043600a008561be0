"""The hook's spark-submit launcher for real: ``jobs/run_stage.py`` submitted with ``--master``
(local here; a ``spark://`` master is the same argv), each stage its own application, then the
outputs are exactly once. Slow: two spark-submit applications."""

from __future__ import annotations

import pytest

from checkpoint_lib.verify import check_payments
from ckpt_airflow.hooks import CheckpointHook
from helpers import append_payments

pytestmark = pytest.mark.slow


def test_stages_submitted_with_spark_submit_are_exactly_once(tmp_path):
    warehouse = tmp_path / "warehouse"
    append_payments(warehouse, 200, batch=0)
    hook = CheckpointHook("payments", warehouse=str(warehouse), launcher="spark-submit", spark_master="local[2]")
    assert hook.run_stage("source", rows_per_checkpoint=100) == {"stage": "source", "launcher": "spark-submit"}
    hook.run_stage("keyed", rows_per_checkpoint=100)
    check = check_payments(str(warehouse))
    assert check.ok, check.summary()
    assert check.ledger_rows == check.valid_rows > 190
    assert hook.control().store.checkpoints.latest() is not None

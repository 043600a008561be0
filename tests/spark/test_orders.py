"""``orders``: non-additive keyed state (state that is replaced: deduplication by id within a
retention window, each customer's last order, a lifetime max), checked against an independent
pandas computation: exactly once across a crash between completion and commit, rescaled 3 -> 5 -> 2,
and the generic quality suites passing on it and failing on a tampered copy."""

from __future__ import annotations

import pytest

from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.pipelines import get
from checkpoint_lib.pipelines.orders import generate
from checkpoint_lib.quality import QualityCheckFailed, validate_checkpoint, validate_restore
from checkpoint_lib.spark.runner import PipelineRunner
from checkpoint_lib.verify import check_orders
from in_process_kills import raise_at

pytestmark = pytest.mark.spark
ROWS = 240


def check(warehouse) -> None:
    result = check_orders(warehouse)
    assert result.ok, result.summary()
    assert result.repeats > 20 and result.bad_rows > 0  # repeats within a batch and across batches


@pytest.mark.parametrize("narrow", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["3to5", "3to5to2"])
def test_orders_exactly_once_across_a_crash_and_rescaled_3_to_5_to_2(spark, tmp_path, narrow):
    w = str(tmp_path)
    for seed in (1, 2, 3):
        generate(spark, w, ROWS, bad_fraction=0.04, customers=12, repeat_fraction=0.2, seed=seed)

    at3 = PipelineRunner(get("orders"), w, spark, rows_per_checkpoint=ROWS)
    assert at3.operator.P == 3

    at3.ctx.kills.reached = raise_at("commit", 2)  # completed, not committed
    with pytest.raises(RuntimeError, match="killed"):
        at3.run()
    crashed_at = DeltaCheckpointStore.open(f"{w}/_checkpoints/orders").checkpoints.latest().checkpoint_id

    at5 = PipelineRunner(get("orders").with_parallelism(operator=5), w, spark, rows_per_checkpoint=ROWS).run()
    assert at5.restored == crashed_at
    check(w)

    if narrow:  # CI tier: the restore at 5 above rescales; this one narrows to 2 with a new version
        generate(spark, w, ROWS, bad_fraction=0.04, customers=12, repeat_fraction=0.2, seed=4)
        at2 = PipelineRunner(get("orders").with_parallelism(operator=2), w, spark, rows_per_checkpoint=ROWS).run()
        assert at2.restored == at5.completed[-1] and at2.rows_in == ROWS
        check(w)
        assert validate_checkpoint(spark, "orders", w).success

    # the generic suites hold on it (each distinct order once; state, sink and source agree per
    # customer), and so do the pipeline's own GX expectations on its sinks
    restored = validate_restore(spark, "orders", w)
    assert restored.success, restored.summary(verbose=True)
    assert {"events", "keys", "totals", "sink_customers", "sink_orders"} <= {o.view for o in restored.outcomes}

    if not narrow:  # CI tier: the healthy suites; the slow one also fails a tampered copy
        return
    # a tampered copy: a customer's count zeroed breaks the pipeline's own expectation (and the
    # generic keys view), an order written twice breaks exactly-once
    from delta.tables import DeltaTable

    customers = DeltaTable.forPath(spark, f"{w}/gold/customers")
    victim = customers.toDF().first()["customer"]
    customers.update(f"customer = '{victim}'", {"orders": "0"})
    target = f"{w}/gold/orders"
    spark.read.format("delta").load(target).limit(1).write.format("delta").mode("append").save(target)
    with pytest.raises(QualityCheckFailed) as failed:
        validate_restore(spark, "orders", w)
    found = {(o.view, o.target) for o in failed.value.result.failed}
    assert {("sink_customers", "orders"), ("events", "sink_copies")} <= found, found

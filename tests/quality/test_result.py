"""What a validation says about itself (pure: no Spark, no GX)."""

from __future__ import annotations

from checkpoint_lib.quality.result import QualityResult


def result(**kw) -> QualityResult:
    base = dict(pipeline="orders", kind="restore", checkpoint_id=4, epoch=3, restored_checkpoint_id=None,
                run_name="r", data_docs="")
    return QualityResult(**{**base, **kw})


def test_a_restore_validation_says_what_the_epoch_restored_once_it_is_known():
    assert "(epoch 3 restored checkpoint 2)" in result(restored_checkpoint_id=2, restore_known=True).headline()
    fresh = result(restore_known=True).headline()
    assert "(epoch 3 restored nothing (started from scratch))" in fresh


def test_a_restore_validation_that_failed_before_reading_the_restore_does_not_claim_one():
    """A view that could not be built: what the epoch restored was never read, so the headline
    must not say it started from scratch."""
    headline = result(error="QualityCheckError: sink 'orders' has no table").headline()
    assert "started from scratch" not in headline and "restored" not in headline
    assert headline.endswith("ERROR QualityCheckError: sink 'orders' has no table")

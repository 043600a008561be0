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


def test_the_suites_notes_speak_of_the_pipelines_own_sinks_and_columns():
    """A failure names what the pipeline calls its sinks, ids and columns, never another
    pipeline's words ("ledger": the payments example's)."""
    from checkpoint_lib.quality.spec import QualitySpec
    from checkpoint_lib.quality.validate import suite_for

    spec = QualitySpec("stockflow", event_sink="moves", event_id="move_id", event_columns=("sku", "qty"),
                       key_sink="stock", aggregates={"on_hand": lambda: None})
    suite = suite_for("restore", spec, "sku")
    notes = [e["notes"] for v in suite.views.values() for e in v.get("expectations", []) if e.get("notes")]
    text = "\n".join(notes)
    assert "{" not in text and "ledger" not in text.lower(), text
    assert "sku, qty in sink 'moves' equal the records'" in text
    assert "every record is in sink 'moves' exactly once, by move_id" in text
    assert "on_hand in sink 'stock' = recomputed from the records" in text
    assert "every sku with records has a row in sink 'stock'" in text
    generic = suite_for("restore", QualitySpec("g", event_sink=None, event_id=None))
    assert "{" not in "".join(e.get("notes", "") for v in generic.views.values() for e in v.get("expectations", []))

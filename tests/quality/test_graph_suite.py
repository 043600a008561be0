"""The ``enrichment`` graph's after-restore suite (``expectations/enrichment_after_restore.json``,
views of ``pipelines/enrichment_quality.py``): ``ckpt recover enrichment`` runs it after the restore
and records it, ``ckpt validate enrichment`` runs it at the latest and at an earlier checkpoint,
and it fails, naming the views, on a tampered region total and on a deleted tagged row.

One healthy warehouse per module (a small graph run, then a recovery); the breaking test works on
its own copy."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

from checkpoint_lib import cli
from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.pipelines.enrichment import graph
from checkpoint_lib.pipelines.enrichment_data import check_enrichment, generate
from checkpoint_lib.quality import QualityCheckFailed, data_docs_index, validate_restore
from checkpoint_lib.quality.records import ValidationLog
from checkpoint_lib.spark.graph_runner import GraphRunner

# Slow (the module's graph run and recovery take 2-4 min); CI tier: an after-restore suite run and recorded by
# `ckpt recover`, and its failures, on payments (tests/quality/test_quality_suites.py); graphs recovered through the
# CLI (tests/spark/test_graph_cli.py)
pytestmark = [pytest.mark.spark, pytest.mark.slow]
VIEWS = {"events", "totals", "dedup_state", "accounted", "tag_state"}


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def healthy(spark, tmp_path_factory) -> tuple[Path, list[int]]:
    """Generate, run the graph, then ``ckpt recover enrichment`` (which must pass its suite); the
    warehouse and the checkpoints the run completed."""
    w = tmp_path_factory.mktemp("graphgx") / "w"
    w.mkdir()
    generate(None, str(w), 400, rounds=2, accounts=20, seed=1)
    run = GraphRunner(graph(), str(w), spark, rows_per_checkpoint=150).run()
    assert len(run.completed) >= 2 and not run.aborted
    code, out, err = _cli("recover", "enrichment", "--warehouse", str(w), "-o", "json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["epoch"] == 2 and summary["restored"] == run.final
    assert [(v["suite"], v["success"], v["failed"]) for v in summary["validations"]] == [("restore", True, 0)], err
    assert "skipped" not in err
    result = check_enrichment(str(w))  # the independent verifier agrees: the outputs are exact
    assert result.ok and result.duplicates and result.rejected_rows and result.dead_letters, result.summary()
    return w, run.completed


def test_recover_runs_the_graph_suite_and_records_it(healthy):
    w, completed = healthy
    root = w / "_checkpoints" / "enrichment"
    row = ValidationLog(root).latest(kind="restore")
    assert row is not None and row["success"] and row["status"] == "passed"
    store = DeltaCheckpointStore(root)
    assert row["epoch"] == store.epochs.current() == 2
    # the recovery restored the run's last checkpoint and took one more: the suite checked that one
    assert row["restored_checkpoint_id"] == completed[-1]
    assert row["checkpoint_id"] == store.checkpoints.latest().checkpoint_id > completed[-1]
    outcomes = json.loads(row["details_json"])
    assert {o["view"] for o in outcomes["outcomes"]} == VIEWS and row["failed"] == 0
    metrics = outcomes["metrics"]
    assert metrics["landed"] == metrics["tagged"] + metrics["rejected"] + metrics["dead_letters"] + metrics["duplicates"]
    assert metrics["duplicates"] > 0 and metrics["rejected"] > 0 and metrics["dead_letters"] == metrics["bad_rows"] > 0
    index = data_docs_index(w, "enrichment")
    assert index.is_file() and row["run_name"] in index.read_text()
    for view in VIEWS:
        assert (index.parent / "validations" / "enrichment" / "enrichment_after_restore" / view / row["run_name"]).is_dir()


def test_validate_runs_the_graph_suite_at_any_completed_checkpoint(healthy):
    w, completed = healthy
    code, out, err = _cli("validate", "enrichment", "--warehouse", str(w), "--checkpoint", str(completed[0]),
                          "-o", "json")
    assert code == 0, err
    (doc,) = json.loads(out)
    assert (doc["suite"], doc["success"], doc["checkpoint_id"], doc["failed"]) == ("restore", True, completed[0], 0)
    assert doc["expectations"] == 15
    assert ValidationLog(w / "_checkpoints" / "enrichment").latest()["checkpoint_id"] == completed[0]
    # a graph has its after-restore suite only: the per-checkpoint one is refused before Spark
    code, _, err = _cli("validate", "enrichment", "--warehouse", str(w), "--suite", "checkpoint")
    assert code == cli.EXIT_USER_ERROR and "has an after-restore suite only so far" in err


def _failed_views(exc: QualityCheckFailed) -> set[str]:
    return {o.view for o in exc.result.failed}


def test_a_tampered_total_and_a_deleted_tagged_row_fail_naming_their_views(spark, healthy, tmp_path, monkeypatch):
    """A region total changed in the sink: ``totals`` fails, both ways (the tagged rows and the
    state disagree with it); with it, the tag state expected to keep a removed account under
    another status: ``tag_state`` fails on the removed accounts. Then a tagged row deleted: the
    totals, the dedup state and the accounting of the landed rows fail, not ``events``."""
    from checkpoint_lib.pipelines import enrichment_quality

    w = tmp_path / "w"
    shutil.copytree(healthy[0], w)
    totals, tagged = f"{w}/gold/enrichment/region_totals", f"{w}/gold/enrichment/tagged"
    region = spark.read.format("delta").load(totals).first()["region"]
    spark.sql(f"UPDATE delta.`{totals}` SET total_cents = total_cents + 1 WHERE region = '{region}'")
    with monkeypatch.context() as m:
        m.setattr(enrichment_quality, "REMOVED", "deleted")
        with pytest.raises(QualityCheckFailed) as err:
            validate_restore(spark, "enrichment", str(w))
    assert _failed_views(err.value) == {"totals", "tag_state"}, err.value.result.summary()
    failed = {(o.view, o.target): o.unexpected_count for o in err.value.result.failed}
    assert failed.pop(("tag_state", "agrees")) >= 1  # every account removed up to the offset
    assert failed == {("totals", "agrees"): 1, ("totals", "state_agrees"): 1}, err.value.result.summary()

    spark.sql(f"UPDATE delta.`{totals}` SET total_cents = total_cents - 1 WHERE region = '{region}'")
    gone = spark.read.format("delta").load(tagged).orderBy("event_id").first()["event_id"]
    spark.sql(f"DELETE FROM delta.`{tagged}` WHERE event_id = '{gone}'")
    code, _, err_text = _cli("validate", "enrichment", "--warehouse", str(w))
    assert code == cli.EXIT_QUALITY
    assert "ckpt: validation failed: restore validation of enrichment checkpoint" in err_text
    row = ValidationLog(w / "_checkpoints" / "enrichment").latest()
    assert row["status"] == "failed"
    views = {o["view"] for o in json.loads(row["details_json"])["outcomes"] if not o["success"]}
    assert views == {"totals", "dedup_state", "accounted"}, err_text
    assert all(f" {view}: expect_" in err_text for view in views), err_text  # the summary names each view

"""The lakehouse neighbours (tests/neighbours.py) on a dataflow graph: the ``enrichment`` example
run by the graph runner, what other tools do to its two input tables, checked by the independent
verifier (``enrichment_data.check_enrichment``). Each case ends exactly once or with a clear
refusal (one of ``neighbours.REFUSALS``, naming the table or source and what to do).

- ``accounts``, read through its change data feed, between runs with unread versions pending:
  OPTIMIZE, Z-ORDER, VACUUM (default retention), another writer's append, ADD COLUMNS: exactly
  once; OPTIMIZE then VACUUM RETAIN 0 HOURS (the change files of its MERGEs gone; or the data file
  of an append, read as inserts, compacted and gone): ``SourceFilesLostError``; RESTORE:
  ``ChangeFeedUnavailableError`` (Delta records no row changes for it: its feed lists whole files,
  unchanged rows as deleted and inserted again with their old values, which no "as of" lookup can
  apply); an overwrite with the same rows (a refresh: every row deleted and inserted again in one
  version): exactly once, every account kept; an overwrite that changes a column's type:
  ``SchemaMismatchError``; the feed turned off,
  a row changed, the feed on again: ``ChangeFeedUnavailableError``.
- ``payments`` (an append-only Delta table): OPTIMIZE, and OPTIMIZE then VACUUM RETAIN 0 HOURS,
  while the graph is down after a kill at ``complete`` or ``sink_commit``, and inside a step (its
  files planned, not read yet): exactly once, or ``SourceFilesLostError``.
- The step cut across the sources (``graph.steps.plan_step``): an OPTIMIZE of ``payments`` (a
  commit without rows, committed after everything landed before it) in the middle of a backlog of
  both tables neither lets ``accounts`` read ahead of the payments nor stalls the graph.

CI runs one case (a RESTORE of the change-feed source refused); the rest are slow.
"""

from __future__ import annotations

import pytest

import neighbours as nb
from checkpoint_lib.delta import log as delta_log
from checkpoint_lib.pipelines.enrichment import graph
from checkpoint_lib.pipelines.enrichment_data import (ACCOUNTS_PATH, PAYMENTS_PATH, TAGGED_PATH, bad_payments,
                                                      check_enrichment, generate)
from checkpoint_lib.spark.graph_runner import GraphRunner
from in_process_kills import raise_at

pytestmark = pytest.mark.spark

ROWS = 60  # payments per round (two appends); each round lands one or two MERGEs and a DELETE of accounts first
ACCOUNTS = 20
ROWS_PER_CHECKPOINT = 50  # a step: about a round


def land(w: str, seed: int, rounds: int = 2) -> None:
    generate(None, w, ROWS * rounds, rounds=rounds, accounts=ACCOUNTS, seed=seed)


def runner(spark, w: str, rows_per_checkpoint: int = ROWS_PER_CHECKPOINT) -> GraphRunner:
    return GraphRunner(graph(), w, spark, rows_per_checkpoint=rows_per_checkpoint)


def exactly_once(w: str) -> None:
    result = check_enrichment(w)
    assert result.ok, result.summary()


def refused(exc: BaseException, name: str, *words: str) -> None:
    """``exc`` is the clear refusal ``name``, and its message holds ``words``."""
    assert nb.refusal(exc) == name, f"expected {name}, got {type(exc).__name__}: {str(exc)[:2000]}"
    for word in words:
        assert word in str(exc), str(exc)


def between(spark, w: str, operation) -> None:
    """A run to the end, more landed (unread), then ``operation``."""
    land(w, 1)
    runner(spark, w).run()
    land(w, 2)
    operation()


def accounts(w: str) -> str:
    return f"{w}/{ACCOUNTS_PATH}"


def payments(w: str) -> str:
    return f"{w}/{PAYMENTS_PATH}"


# -- the change-feed source -----------------------------------------------------------------------

@pytest.mark.slow  # CI tier: the RESTORE case below; the linear matrix's cases in test_lakehouse.py
@pytest.mark.parametrize("operation", ["optimize", "zorder", "vacuum", "external_append", "schema_change"])
def test_the_change_feed_source_reads_exactly_once_across_a_neighbours_operation(spark, tmp_path, operation):
    w = str(tmp_path)
    between(spark, w, lambda: nb.OPERATIONS[operation][1](spark, accounts(w)))
    run = runner(spark, w)
    run.run()
    assert run.sources["accounts"].offset == delta_log.latest_version(accounts(w))
    exactly_once(w)


@pytest.mark.slow  # CI tier: the RESTORE case below; the linear matrix's cases in test_lakehouse.py
def test_change_files_of_unread_versions_vacuumed_are_refused_naming_the_source(spark, tmp_path):
    w = str(tmp_path)
    between(spark, w, lambda: nb.OPERATIONS["vacuum_0h"][1](spark, accounts(w)))
    with pytest.raises(Exception) as info:
        runner(spark, w).run()
    refused(info.value, "SourceFilesLostError", "source 'accounts'", "_change_data/", "Restore a checkpoint")


@pytest.mark.slow  # CI tier: the RESTORE case below; the linear matrix's cases in test_lakehouse.py
def test_an_appended_file_read_as_inserts_compacted_and_vacuumed_is_refused(spark, tmp_path):
    """A commit without change files (an append): its feed is the data files it added."""
    w = str(tmp_path)
    land(w, 1)
    runner(spark, w).run()
    nb.OPERATIONS["external_append"][1](spark, accounts(w))
    nb.OPERATIONS["vacuum_0h"][1](spark, accounts(w))
    with pytest.raises(Exception) as info:
        runner(spark, w).run()
    refused(info.value, "SourceFilesLostError", "source 'accounts'", "files that are gone")


def test_a_restore_of_the_change_feed_source_is_refused_with_the_way_out(spark, tmp_path):
    """What the verifier expects of a RESTORE: a refusal. Its feed holds no row changes (Delta
    writes no change files for it): every row of each file it took out is a delete and of each file
    it brought back an insert, unchanged rows included, with the values they had, so the rows it
    brings back are older than their deletes and an "as of" lookup (``tag``) cannot see the
    restored table. Nothing of it may be read."""
    w = str(tmp_path)
    land(w, 1)  # two rounds: the accounts opened, moved, closed, one removed
    done = delta_log.latest_version(accounts(w))
    nb.OPERATIONS["restore"][1](spark, accounts(w))  # to before the DELETE
    for _ in range(2):  # refused again by the next run: it is never skipped
        run = runner(spark, w, rows_per_checkpoint=10 * ROWS)
        with pytest.raises(Exception) as info:
            run.run()
        refused(info.value, "ChangeFeedUnavailableError", f"version {done + 1} is a RESTORE (to version {done - 1})",
                "ChangeFeedSource", "enableChangeDataFeed")
        assert run.sources["accounts"].offset == -1 and run.sources["payments"].offset == -1


@pytest.mark.slow  # CI tier: the RESTORE case below; the linear matrix's cases in test_lakehouse.py
def test_an_overwrite_that_changes_a_column_type_is_refused(spark, tmp_path):
    from pyspark.sql import functions as F

    w = str(tmp_path)

    def overwrite() -> None:
        (spark.read.format("delta").load(accounts(w)).withColumn("updated_at", F.col("updated_at").cast("string"))
         .write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(accounts(w)))

    between(spark, w, overwrite)
    with pytest.raises(Exception) as info:
        runner(spark, w).run()
    refused(info.value, "SchemaMismatchError", "updated_at", "accounts")


@pytest.mark.slow  # CI tier: the RESTORE case above; the tie rule of tag and of the verifier (test_enrichment.py,
# test_enrichment_data.py)
def test_a_dimension_refreshed_by_an_overwrite_keeps_every_account(spark, tmp_path):
    """The accounts table overwritten with its own rows (a nightly refresh): Delta writes no change
    files for it, so its feed deletes every row and inserts it again in one version, with the same
    ``updated_at``. The insert is the table after the commit: every account stays what it was, the
    payments after it are tagged (before, ``tag`` let the delete win that tie and rejected every
    later payment as an unknown account), and the verifier agrees."""
    import pandas as pd

    from checkpoint_lib.verify import read_delta

    w = str(tmp_path)

    def refresh() -> None:
        spark.read.format("delta").load(accounts(w)).write.format("delta").mode("overwrite").save(accounts(w))

    land(w, 1)
    runner(spark, w).run()
    refresh()
    land(w, 2)
    runner(spark, w).run()
    exactly_once(w)
    present = read_delta(accounts(w))
    open_now = set(present[present.status == "open"].account)
    landing = read_delta(payments(w))
    later = landing[landing.ts > pd.Timestamp(present.updated_at.max())]
    tagged = set(read_delta(f"{w}/{TAGGED_PATH}").event_id)
    assert not later.empty
    later = later[~bad_payments(later)]  # the dead letters
    assert {e for e, a in zip(later.event_id, later.account) if a in open_now} <= tagged


@pytest.mark.slow  # CI tier: the RESTORE case below; the linear matrix's cases in test_lakehouse.py
def test_changes_made_while_the_feed_was_off_are_refused(spark, tmp_path):
    w = str(tmp_path)

    def off_and_on() -> None:
        path = accounts(w)
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = false)").collect()
        spark.sql(f"UPDATE delta.`{path}` SET region = 'nowhere' WHERE status = 'open'").collect()
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)").collect()

    between(spark, w, off_and_on)
    with pytest.raises(Exception) as info:
        runner(spark, w).run()
    refused(info.value, "ChangeFeedUnavailableError", "before the table's change data feed was turned on")


# -- the payments landing table -------------------------------------------------------------------

@pytest.mark.slow  # CI tier: the RESTORE case below; the linear matrix's cases in test_lakehouse.py
@pytest.mark.parametrize("kill", ["complete:2", "sink_commit:4"])
@pytest.mark.parametrize("operation", ["optimize", "vacuum_0h"])
def test_payments_maintained_while_the_graph_is_down_after_a_kill(spark, tmp_path, kill, operation):
    w = str(tmp_path)
    land(w, 1, rounds=3)
    first = runner(spark, w)
    phase, _, n = kill.partition(":")
    first.kills.reached = raise_at(phase, int(n))
    with pytest.raises(RuntimeError, match="killed"):
        first.run()
    nb.OPERATIONS[operation][1](spark, payments(w))
    if operation == "optimize":
        runner(spark, w).run()
        exactly_once(w)
        return
    with pytest.raises(Exception) as info:
        runner(spark, w).run()
    refused(info.value, "SourceFilesLostError", "source 'payments'", "Restore a checkpoint")


@pytest.mark.slow  # CI tier: the RESTORE case below; the linear matrix's cases in test_lakehouse.py
@pytest.mark.parametrize("operation", ["optimize", "vacuum_0h"])
def test_payments_maintained_inside_a_step(spark, tmp_path, operation):
    """The operation runs when the second step's payments are planned and not read yet."""
    w = str(tmp_path)
    land(w, 1, rounds=3)
    run = runner(spark, w)
    reader = run.sources["payments"].reader
    read, reads = reader.read, []

    def planned_then_read(step, senders):
        reads.append(step)
        if len(reads) == 2:
            nb.OPERATIONS[operation][1](spark, payments(w))
        return read(step, senders)

    reader.read = planned_then_read
    if operation == "optimize":
        run.run()
        exactly_once(w)
        return
    with pytest.raises(Exception) as info:
        run.run()
    refused(info.value, "SourceFilesLostError", "source 'payments'")
    with pytest.raises(Exception) as info:
        runner(spark, w).run()  # the next run: the same refusal, nothing skipped
    refused(info.value, "SourceFilesLostError", "source 'payments'")


# -- the step cut across the sources --------------------------------------------------------------

@pytest.mark.slow  # CI tier: the RESTORE case below; the linear matrix's cases in test_lakehouse.py
def test_an_optimize_of_one_source_neither_moves_the_cut_of_the_other_nor_stalls_the_graph(spark, tmp_path):
    """payments OPTIMIZEd (a commit without rows, committed after everything before it) with a
    backlog of both tables before it and more landed after it: ``accounts`` is read up to what had
    landed when each step's payments landed (read ahead or behind, ``tag`` would look payments up
    in the wrong state: the verifier would see it), and both sources reach their latest version."""
    w = str(tmp_path)
    land(w, 1, rounds=3)
    runner(spark, w).run(max_steps=2)
    nb.OPERATIONS["optimize"][1](spark, payments(w))
    land(w, 2, rounds=2)
    run = runner(spark, w)
    run.run()
    assert run.sources["payments"].offset == delta_log.latest_version(payments(w))
    assert run.sources["accounts"].offset == delta_log.latest_version(accounts(w))
    exactly_once(w)


# -- a sink table VACUUMed under a completed checkpoint ---------------------------------------------

@pytest.mark.slow  # CI tier: the RESTORE case above; the linear pipeline's case in test_lakehouse.py
def test_a_vacuum_that_deleted_a_completed_checkpoints_uncommitted_files_is_repaired_by_replaying_it(spark, tmp_path):
    """Killed between checkpoint 2's completion and its commit, then the tagged ledger VACUUMed with
    a retention shorter than the downtime: checkpoint 2's transaction files are gone, so it can
    never be committed. The next start restores checkpoint 1 instead (rolling back whatever a sink
    committed of 2, discarding 2) and replays it: exactly once, no dead end, as a linear pipeline."""
    from checkpoint_lib.delta.store import DeltaCheckpointStore
    from checkpoint_lib.spark.tables import session_confs

    w = str(tmp_path)
    land(w, 1, rounds=3)
    first = runner(spark, w)
    first.kills.reached = raise_at("commit", 2)
    with pytest.raises(RuntimeError, match="killed"):
        first.run()
    ledger = tmp_path / TAGGED_PATH
    staged = set((ledger / "ckpt").rglob("*.parquet"))
    with session_confs(spark, {"spark.databricks.delta.retentionDurationCheck.enabled": "false"}):
        spark.sql(f"VACUUM delta.`{ledger}` RETAIN 0 HOURS")
    assert staged - set((ledger / "ckpt").rglob("*.parquet")), "the VACUUM deleted no uncommitted file"

    done = runner(spark, w).run()

    assert done.restored == 1
    store = DeltaCheckpointStore.open(f"{w}/_checkpoints/enrichment")
    row = store.checkpoints.status(2)
    assert row["status"] == "discarded" and "rolled back to checkpoint 1" in row["message"], row
    exactly_once(w)

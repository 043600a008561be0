"""The payments pipeline on local Spark and real Delta: exactly-once against an independent
pandas computation, reruns, fencing, idempotent commits, bad input, state read-back."""

from __future__ import annotations

from collections import Counter

import pytest

from checkpoint_lib.core.decider import CheckpointConfig
from checkpoint_lib.core.errors import FencedError
from checkpoint_lib.core.types import CheckpointKind
from checkpoint_lib.delta.log import NotAppendOnlyError
from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.metrics import METRICS_ENV
from checkpoint_lib.pipelines import get
from checkpoint_lib.pipelines.payments import generate
from checkpoint_lib.spark.runner import PipelineRunner, SchemaMismatchError
from checkpoint_lib.verify import check_payments, read_delta
from channel_writes import channel_writes
from in_process_kills import raise_at
from statsd import StatsdCollector

pytestmark = pytest.mark.spark
ROWS = 600


def runner(spark, w, **kw) -> PipelineRunner:
    kw.setdefault("rows_per_checkpoint", ROWS)
    return PipelineRunner(get("payments"), str(w), spark, **kw)


@pytest.mark.slow  # ~60 s; CI tier: payments' long run (tests/spark/test_long_runs.py) and its kill on S3
def test_exactly_once_across_runs_and_appends(spark, tmp_path, monkeypatch):
    """Both stages in one process are chained: the records go from the landing read to the operator
    with no channel log. A later source-only process writes the channel log; the next chained
    process applies what it left first, then goes on chained, exactly once and in order. The first
    run reports its checkpoints and its start (a recovery from scratch) to a StatsD collector."""
    for seed in (1, 2):
        generate(spark, str(tmp_path), ROWS, bad_fraction=0.05, accounts=40, seed=seed)
    with StatsdCollector() as collector:
        monkeypatch.setenv(METRICS_ENV, collector.url)
        r = runner(spark, tmp_path)
        monkeypatch.delenv(METRICS_ENV)
        writes = channel_writes(r)
        r.open()
        assert r.backlog_rows() == 2 * ROWS  # the progress bar's total: the landing log's row counts
        seen = []
        first = r.run(on_step=lambda s: seen.append((s.rows_in, r.backlog_rows())))
        metrics = collector.received()
    assert [done + left for done, left in seen] == [2 * ROWS] * len(seen) and seen[-1] == (2 * ROWS, 0)
    assert r.chained and writes == []
    assert first.restored is None and len(first.completed) >= 2
    counted = Counter(name for name, _, kind in metrics if kind == "c")
    assert counted == {"checkpoint_lib.payments.checkpoint.completed": len(first.completed),
                       "checkpoint_lib.payments.recovery": 1}
    durations = [v for name, v, _ in metrics if name == "checkpoint_lib.payments.checkpoint.duration"]
    assert len(durations) == len(first.completed) and all(v > 0 for v in durations)
    assert any(name.endswith("checkpoint.state_bytes") and v > 0 for name, v, _ in metrics)
    check = check_payments(str(tmp_path))
    assert check.ok, check.summary()
    assert check.bad_rows > 0 and check.dlq_rows == check.bad_rows

    again = runner(spark, tmp_path).run()  # a clean stop: resumes in the same epoch, adds nothing
    assert again.restored is None and again.epoch == first.epoch and again.rows_in == 0
    assert check_payments(str(tmp_path)).ok

    generate(spark, str(tmp_path), ROWS, bad_fraction=0.05, accounts=40, seed=3)
    source = runner(spark, tmp_path, stage="source").run()  # into the channel log, with its final barrier
    assert source.rows_in == ROWS and source.completed == []
    generate(spark, str(tmp_path), ROWS, bad_fraction=0.05, accounts=40, seed=4)
    r = runner(spark, tmp_path)
    writes = channel_writes(r)
    third = r.run()
    # one process for both stages is another layout than the source process's: it restores the latest
    # checkpoint (the barrier the source process left never completes) and reads the source's rows again
    assert writes == [] and third.epoch > first.epoch and third.restored == again.final
    assert third.rows_in == 2 * ROWS and source.final not in third.completed
    check = check_payments(str(tmp_path))
    assert check.ok, check.summary()
    assert check.ledger_rows == check.valid_rows


# Every other barrier mode, with records really in flight: tests/spark/test_inflight.py


@pytest.fixture(scope="module")
def healthy(spark, tmp_path_factory):
    """One clean run, shared by the tests that only read what it left (a run costs about a minute)."""
    w = tmp_path_factory.mktemp("healthy")
    generate(spark, str(w), ROWS, bad_fraction=0.2, accounts=20, seed=4)
    summary = runner(spark, w).run()
    return w, summary


def test_checkpoint_history_records_acks_and_sizes(healthy):
    w, summary = healthy
    store = DeltaCheckpointStore.open(f"{w}/_checkpoints/payments")
    latest = store.checkpoints.latest()
    assert latest.checkpoint_id == summary.completed[-1]
    operators = sorted({s.operator for s in latest.acks})
    assert operators == ["balance", "sink_balances", "sink_ledger", "source"]
    assert len(latest.acks) == 2 + 3 + 3 + 3
    assert latest.state_size_bytes > 0
    assert all(a.state["table_version"] >= 0 for s, a in latest.acks.items() if s.operator == "balance")


@pytest.mark.race
def test_commit_repeated_after_success_is_a_no_op(spark, healthy):
    from checkpoint_lib.core.recovery import SINK_STATE_KEY
    from checkpoint_lib.core.twophase import SinkSnapshot

    w, summary = healthy
    before = read_delta(f"{w}/gold/ledger")
    latest = DeltaCheckpointStore.open(f"{w}/_checkpoints/payments").checkpoints.latest()
    owned = [
        txn
        for sid, ack in latest.acks.items() if sid.operator == "sink_ledger"
        for txn in SinkSnapshot.from_dict(ack.state[SINK_STATE_KEY]).pending
    ]
    sink = runner(spark, w).sinks["ledger"]  # not opened: a retried commit from another process
    assert len(owned) >= 3 and all(sink.is_committed(t) for t in owned)
    assert sink.commit(owned, latest.checkpoint_id, summary.epoch) == []  # Airflow's retry
    after = read_delta(f"{w}/gold/ledger")
    assert len(after) == len(before) == check_payments(str(w)).valid_rows


def test_dead_letters_have_reason_and_offset(healthy):
    w, _ = healthy
    dlq = read_delta(f"{w}/dlq/payments")
    assert len(dlq) > 0
    assert set(dlq["error"]) <= {"null or empty account", "null amount_cents", "null event_id"}
    assert dlq["src_version"].min() >= 0 and dlq["src_row"].notna().all() and dlq["src_file"].notna().all()
    check = check_payments(str(w))
    assert check.ok and check.dlq_rows == check.bad_rows > 0, check.summary()


@pytest.mark.race
@pytest.mark.slow  # a minute; CI tier: each of a zombie's writes fenced in tests/spark/test_fences.py (its sink
# commit, its state table's run, its channel deletes)
def test_zombie_of_an_older_epoch_is_fenced_and_its_writes_ignored(spark, tmp_path):
    generate(spark, str(tmp_path), ROWS, accounts=10, seed=5)
    zombie = runner(spark, tmp_path, chaining=False)  # unchained: the source edge is a channel log
    zombie.open()
    winner = runner(spark, tmp_path, chaining=False)
    winner.open()  # a newer epoch: fences the zombie
    assert winner.epoch > zombie.epoch
    with pytest.raises(FencedError, match="zombie"):
        zombie.source_step()  # refused before it writes anything
    with pytest.raises(FencedError, match="zombie"):  # and a commit of its own is refused too
        zombie.sinks["ledger"].commit([], 1, zombie.epoch)
    # even a write that slipped past the check is ignored: the channel only serves its epoch
    zombie.channel.append(None, 0, [0], [0], (99, 0.0), epoch=zombie.epoch)
    assert winner.channel.index(winner.epoch) == []
    winner.run()
    check = check_payments(str(tmp_path))
    assert check.ok, check.summary()


def test_schema_drift_stops_before_writing_anything(spark, tmp_path):
    from pyspark.sql import functions as F

    (spark.range(3).select(F.col("id").cast("string").alias("event_id"), F.lit("a").alias("account"),
                           F.lit("12").alias("amount_cents"), F.current_timestamp().alias("ts"))
     .write.format("delta").save(f"{tmp_path}/landing/payments"))
    with pytest.raises(SchemaMismatchError, match="column 'amount_cents' is string, expected long"):
        runner(spark, tmp_path).run()
    assert len(read_delta(f"{tmp_path}/gold/ledger")) == 0


@pytest.mark.slow  # CI tier: tests/chaos/test_hostile.py runs the same case (rewritten_in_place) in CI
def test_landing_rewritten_in_place_is_refused(spark, tmp_path):
    generate(spark, str(tmp_path), ROWS, accounts=10, seed=10)
    runner(spark, tmp_path).run()
    spark.sql(f"DELETE FROM delta.`{tmp_path}/landing/payments` WHERE account = 'acct-000001'")
    generate(spark, str(tmp_path), ROWS, accounts=10, seed=11)
    with pytest.raises(NotAppendOnlyError, match="must be append-only"):
        runner(spark, tmp_path).run()


@pytest.mark.slow  # CI tier: ~100 s
def test_state_read_back_equals_balances_and_savepoints_survive_retention(spark, tmp_path):
    from checkpoint_lib.spark import inspect

    generate(spark, str(tmp_path), ROWS, accounts=15, seed=12)
    runner(spark, tmp_path).run()
    savepoint = runner(spark, tmp_path).run(max_steps=0, final_kind=CheckpointKind.SAVEPOINT).final
    state = inspect.operator_state(spark, str(tmp_path), get("payments"), savepoint).toPandas()
    balances = read_delta(f"{tmp_path}/gold/balances")
    got = dict(zip(state["account"], state["balance_cents"]))
    assert got == dict(zip(balances["account"], balances["balance_cents"]))
    assert sorted(state["subtask"].unique()) == [0, 1, 2]
    for seed in range(13, 16):
        generate(spark, str(tmp_path), ROWS // 3, accounts=15, seed=seed)
    config = CheckpointConfig(interval=0, timeout=3600, retained=2)
    later = runner(spark, tmp_path, rows_per_checkpoint=ROWS // 3, config=config).run()
    assert len(later.completed) >= 4  # more checkpoints than retained
    store = DeltaCheckpointStore.open(f"{tmp_path}/_checkpoints/payments")
    ids = [c.checkpoint_id for c in store.checkpoints.all()]
    assert savepoint in ids and store.checkpoints.get(savepoint).is_savepoint
    assert [c.checkpoint_id for c in store.checkpoints.all() if not c.is_savepoint] == later.completed[-2:]


def test_restore_checks_the_snapshot_fits_the_pipeline(spark, tmp_path):
    from checkpoint_lib.core.checkpoints import CompletedCheckpoint
    from checkpoint_lib.core.recovery import plan_recovery
    from checkpoint_lib.core.types import SubtaskAck, SubtaskId
    from checkpoint_lib.core.errors import SnapshotIncompatibleError
    from checkpoint_lib.spark.graph_recovery import GraphRecovery

    r = runner(spark, tmp_path)
    acks = {SubtaskId("source", i): SubtaskAck() for i in range(2)}
    acks.update({SubtaskId("balance", i): SubtaskAck() for i in range(5)})  # parallelism 5, now 3: rescales
    acks[SubtaskId("dedup", 0)] = SubtaskAck()  # an operator the pipeline no longer has
    plan = plan_recovery([CompletedCheckpoint(4, CheckpointKind.CHECKPOINT, 0.0, 1.0, acks)], current_epoch=0)
    with pytest.raises(SnapshotIncompatibleError) as err:
        GraphRecovery(r)._check_compatible(plan)
    message = str(err.value)
    assert "parallelism" not in message  # 5 -> 3 is a rescale, not an incompatibility
    assert "removed operators ['dedup']: pass --allow-non-restored-state" in message
    assert "operator 'sink_ledger' is not in the snapshot (new operator: starts empty)" in message


@pytest.mark.slow  # CI tier: ~100 s of real processes
def test_stages_run_as_separate_processes_resume_where_they_stopped(spark, tmp_path):
    """The source and keyed stages in separate runs (sessions of one epoch), joined by the
    channel log: the source's final barrier completes when the keyed stage processes it."""
    for seed in (21, 22):
        generate(spark, str(tmp_path), ROWS, bad_fraction=0.05, accounts=25, seed=seed)
    src = runner(spark, tmp_path, stage="source").run()
    assert src.rows_in == 2 * ROWS and src.completed == [] and src.final is not None
    assert len(read_delta(f"{tmp_path}/gold/ledger")) == 0  # nothing is visible before completion
    assert runner(spark, tmp_path, stage="keyed").run().completed[-1] == src.final
    check = check_payments(str(tmp_path))
    assert check.ok, check.summary()

    generate(spark, str(tmp_path), ROWS, bad_fraction=0.05, accounts=25, seed=23)
    again = runner(spark, tmp_path, stage="source").run()
    assert again.rows_in == ROWS and again.epoch == src.epoch and again.restored is None
    keyed = runner(spark, tmp_path, stage="keyed").run()
    assert keyed.completed[-1] == again.final
    check = check_payments(str(tmp_path))
    assert check.ok, check.summary()
    assert check.ledger_rows == check.valid_rows

    store = DeltaCheckpointStore.open(f"{tmp_path}/_checkpoints/payments")
    assert store.epochs.current() == src.epoch  # no recovery was needed
    rows = store.sessions.of_epoch(src.epoch)
    ended = sorted((r["stage"], r["session"]) for r in rows if r["event"] == "end")
    assert ended == [("keyed", 1), ("keyed", 2), ("source", 1), ("source", 2)]
    # nothing new: a keyed run stops at once; an 'all' run is another layout (one process, the edge
    # chained), so it restores the latest checkpoint, which holds everything
    assert runner(spark, tmp_path, stage="keyed").run().steps == 1
    both = runner(spark, tmp_path).run()
    assert both.epoch == src.epoch + 1 and both.rows_in == 0 and check_payments(str(tmp_path)).ok

    # A polling keyed stage runs no Spark job while the channel log's Delta version stands still,
    # and sees the next source run's records at once.
    keyed = runner(spark, tmp_path, stage="keyed")
    keyed.open()
    calls = []
    index = keyed.channel.index
    keyed.channel.index = lambda *a, **kw: calls.append(a) or index(*a, **kw)
    assert keyed.keyed_step() is False and keyed.keyed_step() is False and keyed.keyed_step() is False
    assert len(calls) == 1
    generate(spark, str(tmp_path), ROWS, bad_fraction=0.05, accounts=25, seed=24)
    last = runner(spark, tmp_path, stage="source").run()
    assert keyed.keyed_step() is True and len(calls) == 2
    assert keyed.run().completed[-1] == last.final
    check = check_payments(str(tmp_path))
    assert check.ok, check.summary()
    assert check.ledger_rows == check.valid_rows


@pytest.mark.slow  # CI tier: ~200 s; tests/spark/test_state.py checks compaction in CI
def test_the_state_table_is_compacted_every_n_flushes_and_resume_and_restore_still_fit(spark, tmp_path):
    small = ROWS // 2  # a flush per landing version: four flushes (runs), a compaction after the 2nd and the 4th
    for seed in (31, 32, 33, 34):
        generate(spark, str(tmp_path), small, bad_fraction=0.05, accounts=400, seed=seed)
    first = runner(spark, tmp_path, rows_per_checkpoint=small, state_compact_every=2).run()
    state = f"{tmp_path}/_checkpoints/payments/state/balance"
    from checkpoint_lib.delta.log import commit_actions, latest_version

    history = spark.sql(f"DESCRIBE HISTORY delta.`{state}`").collect()
    runs = [r for r in history if r["operation"] == "WRITE" and r["operationParameters"]["mode"] == "Append"]
    folds = [v for v in range(latest_version(state) + 1)  # a compaction: files added with no data change
             if any((a.get("add") or {}).get("dataChange") is False for a in commit_actions(state, v))]
    assert len(runs) == 4 and len(folds) == 2, [(r["operation"], r["operationParameters"]) for r in history]
    check = check_payments(str(tmp_path))
    assert check.ok, check.summary()

    # the keyed stage stopped at the compaction's version: the next run resumes, it does not recover
    generate(spark, str(tmp_path), small, bad_fraction=0.05, accounts=400, seed=35)
    again = runner(spark, tmp_path, rows_per_checkpoint=small, state_compact_every=2).run()
    assert again.restored is None and again.epoch == first.epoch and again.rows_in == small
    check = check_payments(str(tmp_path))
    assert check.ok, check.summary()

    # an older checkpoint pinned a version from before a compaction: restoring it replays exactly once
    oldest = min(c.checkpoint_id for c in DeltaCheckpointStore.open(f"{tmp_path}/_checkpoints/payments").checkpoints.all())
    assert oldest in first.completed[:-1]  # retained: a checkpoint of the first run, followed by a compaction
    older = runner(spark, tmp_path, rows_per_checkpoint=small, state_compact_every=2,
                   restore_checkpoint=oldest).run()
    assert older.restored == oldest
    check = check_payments(str(tmp_path))
    assert check.ok, check.summary()
    assert check.ledger_rows == check.valid_rows


@pytest.mark.slow  # CI tier: ~80 s; tests/chaos/test_chaos.py kills and recovers in CI
def test_a_stage_whose_last_process_died_recovers_the_pipeline(spark, tmp_path):
    generate(spark, str(tmp_path), ROWS, accounts=25, seed=31)
    first = runner(spark, tmp_path).run()
    generate(spark, str(tmp_path), ROWS, accounts=25, seed=32)
    dead = runner(spark, tmp_path, stage="keyed")
    dead.open()  # another layout: it restores (for the stages' processes); then the process dies: its session never ends
    assert dead.epoch > first.epoch
    src = runner(spark, tmp_path, stage="source").run()  # the source's own sessions are clean: joins
    assert src.epoch == dead.epoch and src.rows_in == ROWS
    keyed = runner(spark, tmp_path, stage="keyed").run()
    assert keyed.epoch > first.epoch and keyed.restored == first.completed[-1]
    # the recovery cut the channel back to the restored checkpoint: the source re-reads
    redo = runner(spark, tmp_path, stage="source").run()
    assert redo.epoch == keyed.epoch and redo.rows_in == ROWS
    runner(spark, tmp_path, stage="keyed").run()
    check = check_payments(str(tmp_path))
    assert check.ok, check.summary()
    with pytest.raises(FencedError):  # the dead process's zombie cannot even end its session
        dead.close()


@pytest.mark.slow  # CI tier: ~150 s; CI rolls back in tests/spark/test_fences.py
def test_restoring_an_older_checkpoint_rolls_sinks_back_even_across_a_crash(spark, tmp_path):
    for seed in (41, 42, 43):
        generate(spark, str(tmp_path), ROWS, bad_fraction=0.02, accounts=20, seed=seed)
    first = runner(spark, tmp_path).run()
    assert len(first.completed) >= 3
    oldest, later = first.completed[0], first.completed[1:]
    store = DeltaCheckpointStore.open(f"{tmp_path}/_checkpoints/payments")

    # the ledger's history back to the oldest checkpoint's commit is gone (log retention): the
    # recovery is refused before it discards or restores anything
    from checkpoint_lib.spark.sinks import RollbackUnavailableError
    from delta_history import expire_log_through, unexpire

    ledger = tmp_path / "gold" / "ledger"
    aside = expire_log_through(ledger, runner(spark, tmp_path).sinks["ledger"].rollback_version(oldest))
    with pytest.raises(RollbackUnavailableError, match=f"sink ledger: .* cannot be rolled back to what checkpoint {oldest}"):
        runner(spark, tmp_path, restore_checkpoint=oldest).run()
    assert store.sessions.owed_rollback() is None and store.checkpoints.latest().checkpoint_id == later[-1]
    unexpire(ledger, aside)

    def die_mid_rollback(phase):  # the process dies after discarding, before the sinks roll back
        if phase == "rollback":
            raise RuntimeError("killed")

    doomed = runner(spark, tmp_path, restore_checkpoint=oldest)
    doomed.ctx.kills.reached = die_mid_rollback
    with pytest.raises(RuntimeError, match="killed"):
        doomed.run()
    assert store.checkpoints.latest().checkpoint_id == oldest and store.sessions.owed_rollback() == oldest
    assert {r["checkpoint_id"]: r["status"] for r in store.checkpoints.history()}[later[-1]] == "discarded"

    again = runner(spark, tmp_path).run()  # a plain run finishes the owed rollback, then replays
    assert again.restored == oldest and again.rows_in == 2 * ROWS and store.sessions.owed_rollback() is None
    check = check_payments(str(tmp_path))
    assert check.ok, check.summary()
    assert check.ledger_rows == check.valid_rows


@pytest.mark.slow  # CI tier: ~100 s; CI keeps tests/delta/test_store.py's corrupt rows
def test_an_unreadable_latest_checkpoint_whose_commit_landed_is_rolled_back_not_replayed_twice(spark, tmp_path):
    """The latest completed checkpoint committed its sinks, then its metadata row went corrupt:
    recovery falls back to the previous one and must roll the sinks back to it before replaying,
    or the records of the unreadable checkpoint land twice."""
    from deltalake import DeltaTable

    for seed in (61, 62, 63):
        generate(spark, str(tmp_path), ROWS, bad_fraction=0.02, accounts=20, seed=seed)

    def die_after_second_commit(phase, seen=[]):  # noqa: B006 - the counter is the point
        if seen.count("commit") == 2 and phase != "commit":
            raise RuntimeError("killed after the second commit landed")
        seen.append(phase)

    doomed = runner(spark, tmp_path)
    doomed.ctx.kills.reached = die_after_second_commit
    with pytest.raises(RuntimeError, match="killed"):
        doomed.run()
    store = DeltaCheckpointStore.open(f"{tmp_path}/_checkpoints/payments")
    latest = store.checkpoints.latest().checkpoint_id
    assert latest >= 2 and doomed.sinks["ledger"].committed_checkpoint(doomed.epoch) == latest

    DeltaTable(f"{tmp_path}/_checkpoints/payments/checkpoints").update(
        new_values={"acks_json": '{"version": 1, "acks": {'},
        predicate=f"checkpoint_id = {latest} AND status = 'completed'",
    )
    with pytest.warns(Warning, match=f"checkpoint {latest} has a corrupt row"):
        assert store.checkpoints.latest().checkpoint_id < latest

    again = runner(spark, tmp_path).run()
    assert again.restored == latest - 1 and again.rows_in > 0
    check = check_payments(str(tmp_path))
    assert check.ok, check.summary()
    assert check.ledger_rows == check.valid_rows
    row = next(h for h in store.checkpoints.history() if h["checkpoint_id"] == latest)
    assert row["status"] == "discarded" and not row["corrupt"] and "unreadable" in row["message"]

    # a damaged control-table FILE (not a row: the disk or a tool) is refused, naming the file,
    # before anything is written: no epoch begins, no fence, no sink or state commit
    from checkpoint_lib.delta.control_table import CorruptControlTableError

    root = tmp_path / "_checkpoints" / "payments"
    tables = [root / "epochs", root / "state" / "balance", tmp_path / "gold" / "ledger", tmp_path / "gold" / "balances"]
    versions = [DeltaTable(str(t)).version() for t in tables]
    damaged = max((root / "sessions").glob("*.parquet"), key=lambda f: f.stat().st_mtime)
    damaged.write_bytes(damaged.read_bytes()[:100])
    with pytest.raises(CorruptControlTableError, match=f"data file {damaged} is damaged"):
        runner(spark, tmp_path).run()
    assert [DeltaTable(str(t)).version() for t in tables] == versions


@pytest.mark.slow  # CI tier: several runs at three parallelisms
def test_rescaling_3_to_5_to_2_restores_state_by_key_group_and_recommits_every_old_subtask(spark, tmp_path):
    """Restore at another parallelism (Flink's rescaling): state split by key group, the source's
    offsets shared, and the pre-committed transactions of *every* old sink subtask re-committed
    - here the run at 3 dies between completion and commit, so the restore at 5 must commit them."""
    from checkpoint_lib.core.keygroups import range_for_subtask

    for seed in (51, 52, 53):
        generate(spark, str(tmp_path), ROWS // 2, bad_fraction=0.02, accounts=30, seed=seed)
    at3 = runner(spark, tmp_path, rows_per_checkpoint=ROWS // 2)
    assert at3.operator.P == 3

    at3.ctx.kills.reached = raise_at("commit", 2)  # completed, not committed
    with pytest.raises(RuntimeError, match="killed"):
        at3.run()
    store = DeltaCheckpointStore.open(f"{tmp_path}/_checkpoints/payments")
    crashed_at = store.checkpoints.latest().checkpoint_id

    wide = get("payments").with_parallelism(source=3, operator=5)
    at5 = PipelineRunner(wide, str(tmp_path), spark, rows_per_checkpoint=ROWS // 2).run()
    assert at5.restored == crashed_at and at5.epoch == 2
    check = check_payments(str(tmp_path))
    assert check.ok, check.summary()

    generate(spark, str(tmp_path), ROWS // 2, bad_fraction=0.02, accounts=30, seed=54)
    narrow = get("payments").with_parallelism(operator=2, origin="--parallelism 2")
    said: list[str] = []
    at2 = PipelineRunner(narrow, str(tmp_path), spark, rows_per_checkpoint=ROWS // 2, progress=said.append).run()
    assert at2.restored == at5.completed[-1] and at2.rows_in == ROWS // 2
    # the rescale says where each parallelism comes from and how to keep the earlier one
    assert ("parallelism changed: the pipeline stopped at source 3, operator 5, now source 2, operator 2 "
            "(from --parallelism 2); recovering to rescale the latest checkpoint (to keep the earlier "
            "parallelism, run with --source-parallelism 3 --parallelism 5)") in said, said
    check = check_payments(str(tmp_path))
    assert check.ok, check.summary()
    assert check.ledger_rows == check.valid_rows
    latest = store.checkpoints.latest()
    balance = sorted((s.index, tuple(a.state["key_groups"])) for s, a in latest.acks.items() if s.operator == "balance")
    assert balance == [(i, tuple(range_for_subtask(i, 2).to_list())) for i in range(2)]
    assert sorted(s.index for s in latest.acks if s.operator == "source") == [0, 1]


def test_a_resume_point_the_linear_runtime_wrote_makes_the_next_start_recover(tmp_path):
    """After the upgrade to the graph runtime, a stage whose last session ended with the linear
    runtime's resume point (offset and channel positions, no per-vertex keys) recovers from the latest
    checkpoint instead of reading it (no Spark: the recovery's choice alone)."""
    from types import SimpleNamespace

    from checkpoint_lib.spark.graph_recovery import GraphRecovery

    store = DeltaCheckpointStore.open(str(tmp_path))
    epoch = store.epochs.begin("linear")
    store.sessions.record_restored(epoch, None, {"source": {"version": -1, "next_seq": 0}, "keyed": {"cursor": -1}})
    number = store.sessions.begin(epoch, "source")
    store.sessions.end(epoch, "source", number, {"version": 3, "next_seq": 7, "parallelism": {"source": 2}})
    said = []
    runner = SimpleNamespace(store=store, stage="source", progress=said.append, noun="pipeline 'payments'",
                             _what="process group source", parallelism={"source": 2, "balance": 3})
    assert GraphRecovery(runner).resume_point(epoch) is None
    assert "stopped before the graph runtime ran it" in said[-1]
    runner.stage = "all"  # a layout the linear runtime's restore gave no point to
    assert GraphRecovery(runner).resume_point(epoch) is None and "another layout" in said[-1]

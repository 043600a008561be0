"""The graph runner (``checkpoint_lib.spark.graph_runner``) on real Delta: a two-input keyed
operator, a second and a third keyed operator under other keys, sinks at several vertices, a
stateless vertex on a fan-out; exactly once across in-process kills in every phase of every vertex
kind, restored at another parallelism; the step cut across sources at one commit time."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

import pandas as pd
import pytest

from checkpoint_lib.graph import Graph
from checkpoint_lib.pipeline import DeltaSink, DeltaSource
from checkpoint_lib.pipelines.enrichment import MAIN, Dedup, RegionTotals, TagRegion
from checkpoint_lib.spark.graph_runner import GraphRunner
from checkpoint_lib.verify import read_delta
from in_process_kills import raise_at

pytestmark = pytest.mark.spark

PAYMENTS = {"event_id": "string", "account": "string", "amount_cents": "long", "ts": "timestamp"}
ACCOUNTS = {"account": "string", "region": "string", "status": "string", "updated_at": "timestamp", "change": "string"}
TAGGED = (("event_id", "string"), ("account", "string"), ("amount_cents", "long"), ("ts", "timestamp"),
          ("region", "string"))
TOTALS = (("region", "string"), ("total_cents", "long"), ("payment_count", "long"))
REJECTED = (("event_id", "string"), ("account", "string"), ("amount_cents", "long"), ("ts", "timestamp"),
            ("reason", "string"))
LARGE = (("event_id", "string"), ("amount_cents", "long"))
T0 = datetime(2026, 1, 1)


class Large:
    """Stateless: the payments of at least 500 cents."""

    def apply(self, records):
        return {MAIN: records.where("amount_cents >= 500").select("event_id", "amount_cents")}


def graph(parallelism: int = 2, name: str = "g"):
    g = Graph(name)
    payments = g.source("payments", DeltaSource("landing/payments", PAYMENTS), parallelism=2)
    payments.dead_letters("dlq/payments")
    accounts = g.source("accounts", DeltaSource("landing/accounts", ACCOUNTS))
    tagged = (payments.key_by("account", parallelism=parallelism).connect(accounts.key_by("account"))
              .process(TagRegion(), uid="tag"))
    tagged.output("rejected").sink("rejected", DeltaSink("out/rejected", REJECTED))
    unique = tagged.key_by("event_id", parallelism=parallelism).process(Dedup(), uid="dedup")
    unique.output(MAIN).sink("tagged", DeltaSink("out/tagged", TAGGED))
    totals = unique.key_by("region").process(RegionTotals(), uid="totals")
    totals.output(MAIN).sink("totals", DeltaSink("out/totals", TOTALS, mode="upsert", keys=("region",)))
    unique.rebalance(2).process(Large(), uid="large").output(MAIN).sink("large", DeltaSink("out/large", LARGE))
    return g.build()


def land(spark, w: str, rounds: range) -> None:
    """Per round: the accounts' changes, then the payments of that round (one commit each): a1 moves
    from north to south in round 1, a2 closes in round 2, a3 is removed in round 3, a4 never exists;
    every round repeats one payment of the round before; one bad payment (no account)."""
    accounts = {0: [("a1", "north", "open"), ("a2", "north", "open"), ("a3", "east", "open")],
                1: [("a1", "south", "open")], 2: [("a2", "north", "closed")], 3: [("a3", "east", "delete")]}
    for k in rounds:
        previous = (f"e{k - 1}-0", "a1", 100, T0 + timedelta(hours=k - 1, minutes=1)) if k else None
        start = T0 + timedelta(hours=k)
        rows = [(a, region, "open" if status == "delete" else status, start, "delete" if status == "delete" else
                 ("insert" if k == 0 else "update")) for a, region, status in accounts.get(k, [])]
        if rows:
            spark.createDataFrame(rows, ", ".join(f"{c} {t}" for c, t in ACCOUNTS.items())) \
                .write.format("delta").mode("append").save(f"{w}/landing/accounts")
        pays = [(f"e{k}-{i}", f"a{1 + i % 4}", 100 * (i + 1), start + timedelta(minutes=1 + i)) for i in range(8)]
        pays.append((f"e{k}-bad", None, 5, start + timedelta(minutes=30)))
        if previous:
            pays.append(previous)
        spark.createDataFrame(pays, ", ".join(f"{c} {t}" for c, t in PAYMENTS.items())) \
            .write.format("delta").mode("append").save(f"{w}/landing/payments")


def expected(spark, w: str) -> dict[str, pd.DataFrame]:
    """The outputs, computed from the landing tables alone (pandas)."""
    pays = read_delta(f"{w}/landing/payments")
    changes = read_delta(f"{w}/landing/accounts")
    rows = []
    for p in pays.itertuples():
        if p.account is None:
            continue
        seen = changes[(changes.account == p.account) & (changes.updated_at <= p.ts)].sort_values("updated_at")
        status = None if seen.empty else ("removed" if seen.iloc[-1].change == "delete" else seen.iloc[-1].status)
        region = None if seen.empty else seen.iloc[-1].region
        reason = {None: "unknown account", "removed": "unknown account", "closed": "closed account"}.get(status)
        rows.append({"event_id": p.event_id, "account": p.account, "amount_cents": p.amount_cents, "ts": p.ts,
                     "region": region, "reason": reason})
    all_rows = pd.DataFrame(rows)
    rejected = all_rows[all_rows.reason.notna()].drop(columns=["region"])
    tagged = all_rows[all_rows.reason.isna()].drop(columns=["reason"]).drop_duplicates("event_id")
    totals = tagged.groupby("region").agg(total_cents=("amount_cents", "sum"),
                                          payment_count=("amount_cents", "size")).reset_index()
    large = tagged[tagged.amount_cents >= 500][["event_id", "amount_cents"]]
    return {"tagged": tagged, "rejected": rejected, "totals": totals, "large": large}


def sorted_frame(df: pd.DataFrame, columns) -> pd.DataFrame:
    return df[list(columns)].sort_values(list(columns)).reset_index(drop=True).astype(object)


def check(spark, w: str, rounds: int, outputs=("tagged", "rejected", "totals", "large")) -> None:
    want = expected(spark, w)
    schemas = {"tagged": TAGGED, "rejected": REJECTED, "totals": TOTALS, "large": LARGE}
    for name in outputs:
        schema = schemas[name]
        columns = [c for c, _ in schema]
        got = sorted_frame(read_delta(f"{w}/out/{name}"), columns)
        pd.testing.assert_frame_equal(got, sorted_frame(want[name], columns), check_dtype=False, obj=name)
    dlq = read_delta(f"{w}/dlq/payments")
    assert len(dlq) == rounds  # one bad row per round, once


@pytest.mark.slow  # CI tier: tests/spark/test_graph_cli.py runs a graph, resumes and recovers it through the CLI
def test_a_graph_runs_exactly_once_and_resumes(spark, tmp_path):
    w = str(tmp_path)
    land(spark, w, range(2))
    first = GraphRunner(graph(), w, spark, rows_per_checkpoint=5).run()
    assert len(first.completed) >= 3 and first.restored is None
    check(spark, w, rounds=2)
    land(spark, w, range(2, 4))
    second = GraphRunner(graph(), w, spark, rows_per_checkpoint=5).run()
    assert second.restored is None and second.rows_in == 22  # joined the epoch where the first stopped
    check(spark, w, rounds=4)


PHASES = ["source_read", "dlq", "flush_stage:3", "flush_merge:2", "flush_merge:5", "snapshot:2", "ack:2",
          "complete:2", "commit:2", "sink_commit:3"]


@pytest.mark.slow  # CI tier: a kill in a gate with channel state (tests/spark/test_graph_cut_edges.py), mid-commit
@pytest.mark.parametrize("phase", PHASES)  # in tests/crash/test_graph_crash.py
def test_a_kill_in_any_phase_of_any_vertex_recovers_exactly_once_at_another_parallelism(spark, tmp_path, phase):
    """Killed at ``phase`` (the n-th time: a later vertex's MERGE, a later sink's commit), then
    recovered with every operator at parallelism 3: the outputs are exactly once."""
    w = str(tmp_path)
    land(spark, w, range(3))
    name, _, n = phase.partition(":")
    runner = GraphRunner(graph(), w, spark, rows_per_checkpoint=5)
    runner.kills.reached = raise_at(name, int(n or 1))
    with pytest.raises(RuntimeError, match="killed"):
        runner.run()
    again = GraphRunner(graph(parallelism=3), w, spark, rows_per_checkpoint=5).run()
    assert again.epoch == 2
    check(spark, w, rounds=3)


class DedupWithFirstSeen(Dedup):
    state_schema = "seen boolean, first_ts timestamp"


@pytest.mark.slow  # ~50 s; CI tier: the restore plan's rules for added, removed and changed operators (tests/core/test_recovery.py)
def test_a_savepoint_restores_into_a_changed_graph(spark, tmp_path):
    """Savepoint, then the graph changes: an operator added starts empty; one removed needs
    allow_non_restored_state; a changed state schema is refused naming the operator."""
    from checkpoint_lib.core.errors import SnapshotIncompatibleError
    from checkpoint_lib.core.types import CheckpointKind

    w = str(tmp_path)
    land(spark, w, range(2))
    taken = GraphRunner(graph(), w, spark, rows_per_checkpoint=50).run(final_kind=CheckpointKind.SAVEPOINT)
    savepoint = taken.final

    g = graph()
    changed_state = dataclasses.replace(g, vertices=tuple(
        dataclasses.replace(v, operator=DedupWithFirstSeen()) if v.id == "dedup" else v for v in g.vertices))
    with pytest.raises(SnapshotIncompatibleError, match="operator 'dedup'.*first_ts"):
        GraphRunner(changed_state, w, spark, restore_checkpoint=savepoint).open()

    without_large = dataclasses.replace(
        g, vertices=tuple(v for v in g.vertices if v.id != "large"),
        edges=tuple(e for e in g.edges if e.receiver != "large"),
        sinks=tuple(s for s in g.sinks if s.vertex != "large"))
    with pytest.raises(SnapshotIncompatibleError, match="removed operators.*large"):
        GraphRunner(without_large, w, spark, restore_checkpoint=savepoint).open()

    # a keyed operator added (counting tagged payments per account) starts empty, the rest restores
    land(spark, w, range(2, 3))
    added = graph_with_counts()
    run = GraphRunner(added, w, spark, restore_checkpoint=savepoint, allow_non_restored_state=True).run()
    assert run.restored == savepoint
    check(spark, w, rounds=3, outputs=("tagged", "rejected", "totals"))
    counts = read_delta(f"{w}/out/counts")
    tagged = read_delta(f"{w}/out/tagged")
    from_savepoint = tagged[tagged.event_id.str.startswith("e2-")]  # its repeat of e1-0 is a duplicate
    assert counts.set_index("account")["n"].to_dict() == from_savepoint.groupby("account").size().to_dict()


class Count:
    state_schema = "n long"

    def apply(self, records, state, key):
        from pyspark.sql import functions as F

        step = records.groupBy(key).agg(F.count(F.lit(1)).alias("n"))
        prior = state.select(key, F.col("n").alias("prior"))
        total = step.join(prior, key, "left").fillna(0, ["prior"]).select(key, (F.col("n") + F.col("prior")).alias("n"))
        return step, {MAIN: total}


def graph_with_counts():
    """``graph()`` without ``large``, with a keyed count of tagged payments per account after dedup."""
    g = Graph("g")
    payments = g.source("payments", DeltaSource("landing/payments", PAYMENTS), parallelism=2)
    payments.dead_letters("dlq/payments")
    accounts = g.source("accounts", DeltaSource("landing/accounts", ACCOUNTS))
    tagged = (payments.key_by("account", parallelism=2).connect(accounts.key_by("account"))
              .process(TagRegion(), uid="tag"))
    tagged.output("rejected").sink("rejected", DeltaSink("out/rejected", REJECTED))
    unique = tagged.key_by("event_id", parallelism=2).process(Dedup(), uid="dedup")
    unique.output(MAIN).sink("tagged", DeltaSink("out/tagged", TAGGED))
    totals = unique.key_by("region").process(RegionTotals(), uid="totals")
    totals.output(MAIN).sink("totals", DeltaSink("out/totals", TOTALS, mode="upsert", keys=("region",)))
    counts = unique.key_by("account", parallelism=3).process(Count(), uid="counts")
    counts.output(MAIN).sink("counts", DeltaSink("out/counts", (("account", "string"), ("n", "long")), mode="upsert",
                                                 keys=("account",)))
    return g.build()


@pytest.mark.race
@pytest.mark.slow  # CI tier: the fences are the sink and state tables' own, shared with the linear runner
# (tests/spark/test_fences.py, test_payments.py's zombie); the graph's recovery fences them in CI through its kills
def test_an_older_attempt_still_running_is_fenced_out_of_every_table(spark, tmp_path):
    """Attempt A runs a step; attempt B recovers (a new epoch) and runs to the end; A, still alive,
    tries its next step: refused (its epoch is fenced), and the outputs stay exactly once."""
    from checkpoint_lib.core.errors import FencedError

    w = str(tmp_path)
    land(spark, w, range(3))
    a = GraphRunner(graph(), w, spark, rows_per_checkpoint=5)
    a.open()
    assert a.step()
    b = GraphRunner(graph(), w, spark, rows_per_checkpoint=5, recover=True).run()
    assert b.epoch == a.epoch + 1
    with pytest.raises(FencedError):
        a.step()
        a.final_checkpoint()
    check(spark, w, rounds=3)


@pytest.mark.slow  # CI tier: which barrier answers which request is next_trigger's (tests/delta/test_control.py),
# shared by both runners
def test_a_running_graph_takes_requested_checkpoints_and_savepoints_at_its_next_step(spark, tmp_path):
    """A "checkpoint now" request (the snapshot DAG) and a savepoint request (``ckpt savepoint`` of
    a running graph) are answered by the running graph's next step: a savepoint in place of the
    periodic checkpoint, even with nothing new to read; the commit phase then finds its
    transactions committed. The run goes on and ends exactly once."""
    from checkpoint_lib.checkpoint_requests import CheckpointRequests
    from checkpoint_lib.commit_phase import CommitPhase

    w = str(tmp_path)
    land(spark, w, range(2))
    runner = GraphRunner(graph(), w, spark, rows_per_checkpoint=12)
    runner.open()
    assert runner.step()
    requests = CheckpointRequests(runner.root)
    requests.create("sp", kind="savepoint")
    assert runner.step()
    sp = requests.get("sp").checkpoint_id
    assert runner.store.checkpoints.get(sp).is_savepoint and sp == runner.summary.completed[-1]
    while runner.step():
        pass
    requests.create("now")
    assert runner.step()  # nothing new: a barrier only, for the request
    now = requests.get("now").checkpoint_id
    assert now == runner.summary.completed[-1] and not runner.store.checkpoints.get(now).is_savepoint
    assert not runner.step()
    runner.final_checkpoint()
    runner.close()
    phase = CommitPhase(runner.store, "g", runner.warehouse, runner.root)
    phase.pipeline = lambda: graph()  # "g" is not registered: the declaration a registry would give
    assert phase.all_committed(sp) and phase.commit(sp).noop
    check(spark, w, rounds=2)

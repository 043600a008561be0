"""Cut edges in the graph runner, on real Delta. An input that lags (its records and barriers reach
the operator a step after the other input's, through a channel log) makes the two-input operator
read both inputs from logs, and every operator after it (:attr:`~checkpoint_lib.graph.JobGraph.gated`):
each aligns barriers over all its input channels, whatever edge they come from, in every mode,
and an unaligned checkpoint stores the records in flight as channel state of their input edge.
Exactly once across kills in every phase of a gate, restored at another parallelism (an
order-insensitive two-input operator, so any arrival order has one right answer). A process group
per vertex (the Airflow layout) runs ``enrichment``'s graph exactly once, also across a kill in
one process. A cycle (``iterate()``) runs in a graph, unaligned, its in-flight records channel state."""

from __future__ import annotations

import pandas as pd
import pytest
from deltalake import DeltaTable

from checkpoint_lib.graph import Graph, plan
from checkpoint_lib.layout import channel_state_table, checkpoint_root
from checkpoint_lib.pipeline import DeltaSink, DeltaSource
from checkpoint_lib.pipelines.enrichment import MAIN
from checkpoint_lib.spark.graph_runner import GraphRunner
from checkpoint_lib.verify import read_delta
from in_process_kills import raise_at
from test_graph_runner import ACCOUNTS, PAYMENTS, check, graph, land

pytestmark = pytest.mark.spark


class Tally:
    """Two-input keyed by account: the payments' cents and count, and the account changes' count
    (additive state). Order-insensitive, so every arrival order gives the same totals: exactly
    once is the totals the landing tables give."""

    state_schema = "paid_cents long, payments long, changes long"

    def apply(self, payments, accounts, state, key):
        from pyspark.sql import functions as F

        zero = F.lit(0).cast("long")
        paid = payments.groupBy(key).agg(F.sum("amount_cents").cast("long").alias("paid_cents"),
                                         F.count(F.lit(1)).alias("payments")).withColumn("changes", zero)
        changed = (accounts.groupBy(key).agg(F.count(F.lit(1)).alias("changes"))
                   .withColumn("paid_cents", zero).withColumn("payments", zero))
        deltas = paid.unionByName(changed).groupBy(key).agg(
            *[F.sum(c).cast("long").alias(c) for c in ("paid_cents", "payments", "changes")])
        before = state.select(key, *[F.col(c).alias(f"_{c}") for c in ("paid_cents", "payments", "changes")])
        totals = deltas.join(before, key, "left").select(
            key, *[(F.col(c) + F.coalesce(F.col(f"_{c}"), zero)).alias(c) for c in ("paid_cents", "payments", "changes")])
        return deltas, {MAIN: totals}


TALLIES = (("account", "string"), ("paid_cents", "long"), ("payments", "long"), ("changes", "long"))


def tally(parallelism: int = 2):
    g = Graph("t")
    payments = g.source("payments", DeltaSource("landing/payments", PAYMENTS), parallelism=2)
    payments.dead_letters("dlq/payments")
    accounts = g.source("accounts", DeltaSource("landing/accounts", ACCOUNTS))
    tallied = (payments.key_by("account", parallelism=parallelism).connect(accounts.key_by("account"))
               .process(Tally(), uid="tally"))
    tallied.output(MAIN).sink("tallies", DeltaSink("out/tallies", TALLIES, mode="upsert", keys=("account",)))
    return g.build()


def check_tallies(w: str) -> None:
    pays = read_delta(f"{w}/landing/payments")
    pays = pays[pays.account.notna()]
    changes = read_delta(f"{w}/landing/accounts")
    want = pays.groupby("account").agg(paid_cents=("amount_cents", "sum"), payments=("amount_cents", "size"))
    want = want.join(changes.groupby("account").size().rename("changes"), how="outer").fillna(0).astype("int64")
    got = read_delta(f"{w}/out/tallies").set_index("account")[["paid_cents", "payments", "changes"]].astype("int64")
    pd.testing.assert_frame_equal(got.sort_index(), want.sort_index(), check_names=False)
    assert len(read_delta(f"{w}/dlq/payments")) == len(read_delta(f"{w}/landing/payments")) - len(pays)


def lagging(spark, w: str, lag: int, mode: str = "unaligned", parallelism: int = 2, **kw) -> GraphRunner:
    """The tally with input ``lag`` (1: payments, 2: the accounts) a step late, in one process."""
    return GraphRunner(tally(parallelism), w, spark, rows_per_checkpoint=5, mode=mode, lagging=[("tally", lag)], **kw)


def logged(w: str, edge: str) -> pd.DataFrame:
    table = channel_state_table(checkpoint_root(w, "t"), edge)
    return DeltaTable(str(table)).to_pandas() if (table / "_delta_log").exists() else pd.DataFrame()


def log_positions(w: str, edge: str) -> list[int]:
    """The positions a cut edge's channel log holds now."""
    from checkpoint_lib.layout import CHANNELS

    return sorted(DeltaTable(str(checkpoint_root(w, "t") / CHANNELS / edge)).to_pandas()["seq"].tolist())


def test_a_lagging_input_cuts_the_operator_and_everything_after_it():
    job = plan(graph(), lagging=[("tag", 2)])
    assert job.gated == ("tag", "dedup", "totals", "large")
    cut = {e.channel_log: [str(r) for r in e.reasons] for e in job.cut}
    assert cut == {"payments_tag": ["inputs"], "accounts_tag": ["lagging"], "tag_dedup": ["sender"],
                   "dedup_totals": ["sender"], "dedup_large": ["sender"]}
    assert job.channel_map("tag").channels == 3  # payments' two subtasks, then accounts' one


@pytest.mark.slow  # CI tier: the kill below, unaligned with channel state on the lagging edge
@pytest.mark.parametrize("lag, mode", [(1, "unaligned"), (2, "unaligned"), (1, "aligned"), (2, "at_least_once")])
def test_a_lagging_input_runs_exactly_once_and_unaligned_logs_it_in_flight(spark, tmp_path, monkeypatch, lag, mode):
    """The lagging input's records of a step reach the operator after the other input's barrier:
    aligned, that input's channels wait for them; unaligned, they are in flight, and the checkpoint
    stores them as channel state of their edge (the other edge has none). The gate deletes what it
    consumed of its logs during the run (here after every completed checkpoint) and at its clean stop."""
    from checkpoint_lib.spark import completion

    monkeypatch.setattr(completion, "TRUNCATE_EVERY", 1)
    w = str(tmp_path)
    land(spark, w, range(3))
    lowest = []
    summary = lagging(spark, w, lag, mode).run(
        on_step=lambda _s: lowest.append(min(log_positions(w, "accounts_tally") + log_positions(w, "payments_tally"),
                                             default=None)))
    assert len(summary.completed) >= 3 and not summary.aborted
    check_tallies(w)
    assert any(low is not None and low > 1 for low in lowest), lowest  # positions went while it ran
    assert log_positions(w, "accounts_tally") == log_positions(w, "payments_tally") == []
    late, timely = ("payments_tally", "accounts_tally")[::1 if lag == 1 else -1]
    if mode == "unaligned":
        assert len(logged(w, late)) > 0 and set(logged(w, late)["checkpoint_id"]) <= set(summary.completed)
        assert len(logged(w, timely)) == 0
    else:
        assert len(logged(w, late)) == len(logged(w, timely)) == 0


@pytest.mark.slow  # CI tier: the gate kill below (a whole edge lagging); this is --lagging-sources' layout
@pytest.mark.parametrize("mode", ["unaligned", "aligned"])
def test_lagging_subtasks_of_a_sender_run_exactly_once_and_unaligned_log_only_their_records(spark, tmp_path, mode):
    """One of the payments source's two subtasks lags (as ``--lagging-sources 1`` makes a linear
    pipeline's last source subtask): its records and barrier of a step reach the gate with the next
    step, after the other subtask's barrier on the same edge. Unaligned, what a checkpoint logs as
    in flight is that subtask's records on that edge, and nothing else."""
    w = str(tmp_path)
    land(spark, w, range(3))
    summary = lagging(spark, w, 1, mode, lagging_senders={"payments": [1]}).run()
    assert len(summary.completed) >= 3 and not summary.aborted
    check_tallies(w)
    state = logged(w, "payments_tally")
    assert len(logged(w, "accounts_tally")) == 0
    if mode == "unaligned":
        assert len(state) > 0 and set(state["sender"]) == {1}, state
    else:
        assert len(state) == 0
    with pytest.raises(ValueError, match="at least one keeps pace"):
        lagging(spark, w, 1, mode, lagging_senders={"payments": [0, 1]})
    with pytest.raises(ValueError, match="sends on no lagging input"):
        lagging(spark, w, 2, mode, lagging_senders={"payments": [1]})  # the accounts lag, not the payments


@pytest.mark.slow  # CI tier: the gate kill below (its gates read logs cut for a lagging input)
def test_chaining_off_runs_every_operator_as_a_gate_in_one_process_exactly_once(spark, tmp_path):
    """``ckpt run G --no-chaining``: the per-vertex layout's data path in one process (every edge a
    channel log, every operator a gate), here the tally's two inputs, unaligned."""
    w = str(tmp_path)
    land(spark, w, range(3))
    runner = GraphRunner(tally(), w, spark, rows_per_checkpoint=5, mode="unaligned", chaining=False)
    assert runner.job.gated == ("tally",) and not runner.job.chained
    summary = runner.run()
    assert len(summary.completed) >= 3 and not summary.aborted
    check_tallies(w)
    assert log_positions(w, "accounts_tally") == log_positions(w, "payments_tally") == []  # consumed, truncated


@pytest.mark.slow  # CI tier: a graph's clean resume in tests/spark/test_graph_cli.py
def test_a_lagging_graph_resumes_where_it_stopped_and_reports_its_metrics(spark, tmp_path, monkeypatch):
    from statsd import StatsdCollector

    w = str(tmp_path)
    land(spark, w, range(2))
    with StatsdCollector() as collector:
        monkeypatch.setenv("CKPT_METRICS", f"{collector.url}/ckpt")
        first = lagging(spark, w, 2, "aligned").run()
        got = collector.received()
    completed = [v for name, v, _ in got if name == "ckpt.t.checkpoint.completed"]
    assert len(completed) == len(first.completed) and ("ckpt.t.recovery", 1.0, "c") in got  # started from scratch
    land(spark, w, range(2, 4))
    second = lagging(spark, w, 2, "aligned").run()
    assert second.restored is None and second.epoch == 1  # joined the epoch where the first stopped
    check_tallies(w)


KILLS = [(2, "aligned", "flush_merge:3"), (1, "aligned", "channel_write:4"), (2, "unaligned", "snapshot:3"),
         (2, "unaligned", "channel_state:1"), (1, "unaligned", "channel_state:2"), (1, "unaligned", "complete:2"),
         (2, "unaligned", "sink_commit:2")]
"""A gate's phases, each in one mode with one input lagging (the n-th time)."""


@pytest.mark.parametrize("lag, mode, phase", [
    pytest.param(*k, marks=pytest.mark.slow) for k in KILLS])  # CI tier: the cut above, and a graph recovered
# through the CLI (tests/spark/test_graph_cli.py); a restore at another parallelism: tests/spark/test_orders.py
def test_a_kill_in_a_gate_recovers_exactly_once_at_another_parallelism(spark, tmp_path, lag, mode, phase):
    """Killed at ``phase``, then recovered with the operator at parallelism 3 (its channel state
    routed again to the subtasks owning each record now): the totals are exactly once. The state
    table is compacted every second flush of a process, so a snapshot may pin a version before or
    after one (a run killed early, or a recovery's few steps, would not reach a fourth flush; a
    run into the empty table no longer counts as a fold)."""
    w = str(tmp_path)
    land(spark, w, range(3))
    name, _, n = phase.partition(":")
    first = lagging(spark, w, lag, mode, state_compact_every=2)
    first.kills.reached = raise_at(name, int(n or 1))
    with pytest.raises(RuntimeError, match="killed"):
        first.run()
    again = lagging(spark, w, lag, mode, parallelism=3, state_compact_every=2).run()
    assert again.epoch == 2
    check_tallies(w)
    from checkpoint_lib.delta.log import commit_actions, latest_version

    table = checkpoint_root(w, "t") / "state" / "tally"
    folds = [v for v in range(latest_version(table) + 1)  # a compaction: files added with no data change
             if any((a.get("add") or {}).get("dataChange") is False for a in commit_actions(table, v))]
    assert folds, [h["operation"] for h in DeltaTable(str(table)).history()]
    # every log starts empty in the new epoch; at the clean stop nothing consumed is left
    assert log_positions(w, "accounts_tally") == log_positions(w, "payments_tally") == []


# --- several processes: a process group per vertex (the Airflow layout) ---------------------------------------------

def run_groups(spark, w: str, mode: str = "aligned", parallelism: int = 2, kill: tuple[str, str] | None = None):
    """Each process group of the per-vertex layout in turn, in topological order, as the Airflow
    run DAG's tasks run them (each its own runner: its own session, its own coordinator)."""
    from checkpoint_lib.graph import Layout

    done = {}
    for group in plan(graph(parallelism), Layout.PER_VERTEX).groups:
        runner = GraphRunner(graph(parallelism), w, spark, rows_per_checkpoint=5, mode=mode,
                             processes=Layout.PER_VERTEX, group=group.name)
        if kill is not None and kill[0] == group.name:
            name, _, n = kill[1].partition(":")
            runner.kills.reached = raise_at(name, int(n or 1))
        done[group.name] = runner.run()
    return done


@pytest.mark.slow  # CI tier: a gate's kill above; the run DAG's per-vertex form in tests/airflow/test_graph_dags.py
@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_a_process_group_per_vertex_runs_exactly_once(spark, tmp_path, mode):
    w = str(tmp_path)
    land(spark, w, range(2))
    first = run_groups(spark, w, mode)
    assert list(first) == ["sources", "tag", "dedup", "totals", "large"]
    # the sources' group injects the checkpoints; the last group to acknowledge completes them
    assert first["sources"].completed == [] and first["sources"].final is not None
    assert set(first["large"].completed) | set(first["totals"].completed)
    land(spark, w, range(2, 3))
    second = run_groups(spark, w, mode)  # every group commits what the previous pass completed
    assert all(s.epoch == 1 and s.restored is None for s in second.values())
    run_groups(spark, w, mode)
    check(spark, w, rounds=3)


@pytest.mark.slow
def test_a_kill_in_one_process_group_recovers_every_vertex_exactly_once(spark, tmp_path):
    """The tagging operator's process dies mid-step; the next run of its group restores the whole
    graph (a new epoch); the other groups' next runs join it."""
    w = str(tmp_path)
    land(spark, w, range(2))
    with pytest.raises(RuntimeError, match="killed"):
        run_groups(spark, w, "unaligned", kill=("tag", "flush_merge:2"))
    # at another parallelism: the first group to start recovers (epoch 2), every other one joins it
    again = run_groups(spark, w, "unaligned", parallelism=3)
    assert {s.epoch for s in again.values()} == {2}  # nothing had completed: restarted from scratch
    last = run_groups(spark, w, "unaligned", parallelism=3)  # the sinks of the groups before the last commit
    assert {s.epoch for s in last.values()} == {2}
    check(spark, w, rounds=2)


# --- a cycle: the operator's feedback edge into its own gate -------------------------------------------------------

@pytest.mark.slow  # CI tier: transfers' cycle in the linear runner (tests/spark/test_long_runs.py)
def test_a_cycle_in_a_graph_runs_unaligned_and_its_in_flight_credits_are_channel_state(spark, tmp_path):
    """``transfers`` as a graph: the bank's feedback edge comes back into its own gate (its source edge
    is then read from a log too); its barrier comes only after the snapshot, so aligned is refused,
    and unaligned checkpoints log the credits in flight on the cycle as channel state of that edge."""
    from checkpoint_lib.graph import from_pipeline
    from checkpoint_lib.pipelines import get
    from checkpoint_lib.pipelines.transfers import generate
    from checkpoint_lib.verify import check_transfers

    transfers = from_pipeline(get("transfers"))
    with pytest.raises(ValueError, match=r"feedback edge \(a cycle, bank -> bank\).*Use mode unaligned"):
        GraphRunner(transfers, str(tmp_path), spark)
    w = str(tmp_path)
    for v in range(2):
        generate(spark, w, 200, accounts=20, bad_fraction=0.03, skew=0.3, seed=v)
    summary = GraphRunner(transfers, w, spark, rows_per_checkpoint=200, mode="unaligned").run()
    check = check_transfers(w)
    assert check.ok, check.summary()
    assert len(summary.completed) >= 2
    logged = DeltaTable(str(channel_state_table(checkpoint_root(w, "transfers"), "bank_bank"))).to_pandas()
    assert len(logged) > 0 and set(logged["checkpoint_id"]) <= set(summary.completed)

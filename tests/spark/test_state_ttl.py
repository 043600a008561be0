"""State TTL in event time (:class:`checkpoint_lib.pipeline.StateTtl`): a key's state expires
``ttl`` after its last write, measured by the records' timestamps, so a crashed and recovered run
expires exactly what an uninterrupted one does; idle keys are cleaned up past the lateness."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from checkpoint_lib.layout import checkpoint_root, state_table
from checkpoint_lib.pipeline import TTL_COLUMN, DeltaSink, DeltaSource, Pipeline, StateTtl
from checkpoint_lib.spark.runner import PipelineRunner
from in_process_kills import raise_at

pytestmark = pytest.mark.spark
CLICKS = "click_id string, user string, ts timestamp"
T0 = datetime(2026, 5, 1, 10, 0)


class SessionClicks:
    """Per user, the clicks of the current session: a session ends 30 minutes after its last click."""

    state_schema = "clicks long"
    state_ttl = StateTtl(timedelta(minutes=30), time_column="ts")
    order_by = ("src_version", "src_file", "src_row")

    def apply(self, records, state, key):
        from pyspark.sql import functions as F

        counts = records.groupBy(key).agg(F.count(F.lit(1)).alias("clicks"))
        totals = counts.join(state.withColumnRenamed("clicks", "prior"), key, "left").select(
            key, (F.coalesce("prior", F.lit(0)) + F.col("clicks")).alias("clicks"))
        return counts, {"sessions": totals}


def sessions(operator=None) -> Pipeline:
    return (
        Pipeline("sessions")
        .source(DeltaSource("landing/clicks", CLICKS))
        .key_by("user", parallelism=2)
        .process(operator or SessionClicks(), uid="session_clicks")
        .sink("sessions", DeltaSink("gold/sessions", "user string, clicks long", mode="upsert", keys=("user",)))
        .dead_letters("dlq/clicks")
    )


def land(spark, warehouse: str, clicks: list[tuple[str, int]]) -> None:
    """One landing version: (user, minutes after T0) per click."""
    rows = [(f"{user}@{minute}", user, T0 + timedelta(minutes=minute)) for user, minute in clicks]
    spark.createDataFrame(rows, CLICKS).write.format("delta").mode("append").save(f"{warehouse}/landing/clicks")


def table(spark, path: str, key: str, *columns: str) -> dict[str, tuple]:
    return {r[key]: tuple(r[c] for c in columns) for r in spark.read.format("delta").load(path).collect()}


def state(spark, path: str, *columns: str) -> dict[str, tuple]:
    """The operator's state as its next flush reads it (the newest run per key, minus what the
    TTL cleaned up)."""
    from checkpoint_lib.spark.state import state_of

    return {r["user"]: tuple(r[c] for c in columns)
            for r in state_of(spark, path, "user", SessionClicks.state_ttl).collect()}


@pytest.mark.parametrize("kills", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["run", "killed"])
def test_state_expires_in_event_time_and_idle_keys_are_cleaned_up(spark, tmp_path, kills):
    w = str(tmp_path)
    path = str(state_table(checkpoint_root(w, "sessions"), "session_clicks"))

    def run(kill: str) -> None:
        runner = PipelineRunner(sessions(), w, spark, rows_per_checkpoint=100)
        if kills:  # killed, then recovered: the replay expires and cleans up the same keys
            runner.ctx.kills.reached = raise_at(kill, 1)
            with pytest.raises(RuntimeError, match="killed"):
                runner.run()
            runner = PipelineRunner(sessions(), w, spark, rows_per_checkpoint=100)
        runner.run()

    land(spark, w, [("u1", 0), ("u1", 5), ("u2", 0), ("u3", 0)])
    PipelineRunner(sessions(), w, spark, rows_per_checkpoint=100).run()
    assert table(spark, f"{w}/gold/sessions", "user", "clicks") == {"u1": (2,), "u2": (1,), "u3": (1,)}

    # u1 within 30 minutes of its last write (10:05): the session goes on; u2 40 minutes after
    # its last: a new session
    land(spark, w, [("u1", 20), ("u2", 40)])
    run(kill="flush_merge")  # before the state MERGE commits
    assert table(spark, f"{w}/gold/sessions", "user", "clicks") == {"u1": (3,), "u2": (1,), "u3": (1,)}
    assert state(spark, path, "clicks", TTL_COLUMN) == {
        "u1": (3, T0 + timedelta(minutes=20)), "u2": (1, T0 + timedelta(minutes=40)), "u3": (1, T0)}

    # 12:00: u1's session expired (100 minutes); the newest write is now 12:00, so rows written
    # before 11:00 (ttl + lateness, 60 minutes) go: u3. u2's click at 10:45 is late but within
    # the TTL of its 10:40 session; its row is rewritten, so it stays.
    land(spark, w, [("u1", 120), ("u2", 45)])
    run(kill="commit")  # completed, not committed
    assert table(spark, f"{w}/gold/sessions", "user", "clicks") == {"u1": (1,), "u2": (2,), "u3": (1,)}
    assert state(spark, path, "clicks", TTL_COLUMN) == {
        "u1": (1, T0 + timedelta(minutes=120)), "u2": (2, T0 + timedelta(minutes=45))}
    # `ckpt state` (delta-rs, no Spark) shows the state the operator sees: u3 cleaned up, though
    # its row stays in the table until a compaction
    from checkpoint_lib.delta.inspect import operator_state

    shown = operator_state(w, sessions(), uid="session_clicks")
    assert sorted(r["user"] for r in shown["rows"]) == ["u1", "u2"] and shown["keys"] == 2


class BoundedSessionClicks(SessionClicks):
    state_ttl = StateTtl(timedelta(minutes=30), time_column="ts", max_ahead=timedelta(hours=6))


@pytest.mark.slow  # ~30 s; CI tier: expiry in event time in the test below
def test_one_timestamp_far_in_the_future_is_a_dead_letter_and_expires_no_state(spark, tmp_path):
    """Without a bound, a click stamped 70 years ahead becomes the operator's newest write and the
    clean-up deletes every other session. With ``max_ahead`` it is a dead letter with the reason,
    decided the same way by the replay after a kill (the reference is in the sources' acks)."""
    w = str(tmp_path)
    bounded = sessions(BoundedSessionClicks())
    land(spark, w, [("u1", 0), ("u2", 0), ("u3", 0)])
    land(spark, w, [("u1", 5), ("u2", 6), ("evil", 60 * 24 * 365 * 70)])
    doomed = PipelineRunner(bounded, w, spark, rows_per_checkpoint=3)
    doomed.ctx.kills.reached = raise_at("flush_merge", 2)  # the dead letters of version 2 written, its state not
    with pytest.raises(RuntimeError, match="killed"):
        doomed.run()
    assert PipelineRunner(bounded, w, spark, rows_per_checkpoint=3).run().restored == 1
    land(spark, w, [("u3", 20)])  # 20 minutes after u3's last click: the same session
    PipelineRunner(bounded, w, spark, rows_per_checkpoint=3).run()

    assert table(spark, f"{w}/gold/sessions", "user", "clicks") == {"u1": (2,), "u2": (2,), "u3": (2,)}
    dead = spark.read.format("delta").load(f"{w}/dlq/clicks").collect()
    assert [(r.record.user, r.src_version) for r in dead] == [("evil", 1)]
    assert "is more than 6:00:00 after the reference event time 2026-05-01 10:06:00 UTC" in dead[0].error
    # the bad row keeps the source's types: the timestamp is the landed instant, zone and all
    landed = spark.read.format("delta").load(f"{w}/landing/clicks").where("user = 'evil'").first()
    assert isinstance(dead[0].record.ts, datetime) and dead[0].record.ts == landed.ts
    from checkpoint_lib.verify import read_delta

    ts = read_delta(f"{w}/dlq/clicks")["record"][0]["ts"]
    assert ts.tzinfo is not None and ts.timestamp() == landed.ts.timestamp()


def test_a_state_ttl_is_declared_on_a_timestamp_column_of_keyed_state():
    source = DeltaSource("landing/clicks", CLICKS)
    op = SessionClicks()

    op.state_ttl = StateTtl(60, time_column="click_id")
    with pytest.raises(ValueError, match="time_column 'click_id' must be a timestamp"):
        Pipeline("s").source(source).key_by("user").process(op, uid="op")
    op.state_ttl = 60
    with pytest.raises(TypeError, match="must be a StateTtl"):
        Pipeline("s").source(source).key_by("user").process(op, uid="op")
    with pytest.raises(ValueError, match="positive"):
        StateTtl(0, "ts")
    assert StateTtl(timedelta(minutes=30), "ts").cleanup_seconds == 3600
    with pytest.raises(ValueError, match="positive"):
        StateTtl(60, "ts", max_ahead=0)
    op.state_ttl = StateTtl(60, time_column="at", max_ahead=3600)
    renamed = {"click_id": "string", "user": "string", "at": "timestamp"}
    with pytest.raises(ValueError, match="max_ahead needs time_column 'at' among the source's columns"):
        Pipeline("s").source(source).map(lambda df: df.withColumnRenamed("ts", "at"), renamed).key_by("user").process(
            op, uid="op")
    assert StateTtl(1800, "ts", cleanup_lateness=0).cleanup_seconds == 1800

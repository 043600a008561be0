"""Metrics (checkpoint_lib.metrics): StatsD datagrams a local collector receives, the
configuration from CKPT_METRICS or Airflow's StatsD settings, and sending that never fails a run."""

from __future__ import annotations

import pytest
from statsd import StatsdCollector

from checkpoint_lib.core.checkpoints import CompletedCheckpoint
from checkpoint_lib.core.types import CheckpointKind, SubtaskAck, SubtaskId
from checkpoint_lib.metrics import NoMetrics, PipelineMetrics, StatsdMetrics, from_env


def _checkpoint() -> CompletedCheckpoint:
    acks = {SubtaskId("op", 0): SubtaskAck(state_size_bytes=1000, channel_state_rows=3, channel_state_bytes=192,
                                           alignment_ms=12.5),
            SubtaskId("op", 1): SubtaskAck(state_size_bytes=500, alignment_ms=40.0)}
    return CompletedCheckpoint(7, CheckpointKind.CHECKPOINT, 100.0, 101.25, acks, {s: 100.5 for s in acks})


def test_a_collector_receives_a_checkpoint_a_failure_and_a_recovery():
    with StatsdCollector() as collector:
        m = PipelineMetrics("pay ments", from_env({"CKPT_METRICS": f"{collector.url}/team.ckpt"}))
        m.checkpoint_completed(_checkpoint())
        m.checkpoint_failed("expired")
        m.recovered(2.5)
        got = collector.received()
    assert got == [
        ("team.ckpt.pay_ments.checkpoint.duration", 1250.0, "ms"),
        ("team.ckpt.pay_ments.checkpoint.alignment", 40.0, "ms"),
        ("team.ckpt.pay_ments.checkpoint.state_bytes", 1500.0, "g"),
        ("team.ckpt.pay_ments.checkpoint.channel_state_bytes", 192.0, "g"),
        ("team.ckpt.pay_ments.checkpoint.channel_state_rows", 3.0, "g"),
        ("team.ckpt.pay_ments.checkpoint.completed", 1.0, "c"),
        ("team.ckpt.pay_ments.checkpoint.failed", 1.0, "c"),
        ("team.ckpt.pay_ments.checkpoint.failed.expired", 1.0, "c"),
        ("team.ckpt.pay_ments.recovery", 1.0, "c"),
        ("team.ckpt.pay_ments.recovery.duration", 2500.0, "ms"),
    ]


def test_configuration_from_ours_then_airflows_settings():
    assert isinstance(from_env({}), NoMetrics)
    ours = from_env({"CKPT_METRICS": "statsd://collector:9125"})
    assert isinstance(ours, StatsdMetrics) and ours.address == ("collector", 9125) and ours.prefix == "checkpoint_lib"
    airflows = from_env({"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "statsd",
                         "AIRFLOW__METRICS__STATSD_PORT": "8125"})
    assert isinstance(airflows, StatsdMetrics) and airflows.address == ("statsd", 8125)
    with pytest.raises(ValueError, match="statsd://host:port"):
        from_env({"CKPT_METRICS": "http://collector:9125"})


def test_sending_to_nowhere_never_fails():
    m = StatsdMetrics("192.0.2.1", 9)  # TEST-NET: nothing answers, nothing is raised
    m.timing("x", 1.0)
    m._socket.close()  # the socket itself broken: still nothing raised
    m.incr("y")

"""Kill points (checkpoint_lib/killpoints.py): parsed strictly, counted per phase, traced."""

from __future__ import annotations

import pytest

from checkpoint_lib.killpoints import KILL_PHASES, KillPoints, parse


def test_a_kill_point_names_a_known_phase_and_a_hit_count():
    assert parse("commit:3") == ("commit", 3) and parse("fence") == ("fence", 1) and parse("") is None
    with pytest.raises(ValueError, match="CKPT_KILL_AT phase must be one of"):
        parse("comit:1")
    with pytest.raises(ValueError, match="CKPT_PAUSE_AT"):
        KillPoints({"CKPT_PAUSE_AT": "nope"})


def test_every_point_passed_is_traced_with_its_count_and_unset_points_count_nothing(tmp_path):
    trace = tmp_path / "trace"
    points = KillPoints({"CKPT_PHASE_TRACE": str(trace), "CKPT_KILL_AT": "commit:99"})
    for phase in ("source_read", "commit", "source_read"):
        points.reached(phase)
    assert trace.read_text().split("\n")[:-1] == ["source_read 1", "commit 1", "source_read 2"]
    idle = KillPoints({})
    idle.reached("commit")
    assert dict(idle.counts) == {} and set(KILL_PHASES) >= {"commit", "channel_write", "fence"}


def test_a_point_counted_here_and_acted_on_elsewhere_returns_its_signal_once():
    import signal

    points = KillPoints({"CKPT_PAUSE_AT": "prepare:2", "CKPT_KILL_AT": "prepared_commit:1"})
    assert [points.due("prepare") for _ in range(3)] == [None, signal.SIGSTOP, None]
    assert points.due("prepared_commit") == signal.SIGKILL and points.due("prepared_commit") is None
    assert KillPoints({}).due("prepare") is None

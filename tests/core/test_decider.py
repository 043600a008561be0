"""Unit tests for checkpoint_lib.core.decider: config validation and the pure trigger policy."""

from __future__ import annotations

import pytest

from checkpoint_lib.core.decider import CheckpointConfig, Decision, Verdict, decide
from checkpoint_lib.core.errors import FailureReason

EXECUTE = Decision(Verdict.EXECUTE)


def ask(config: CheckpointConfig, now: float, **facts) -> Decision:
    """decide() with quiet defaults: periodic, all running, nothing pending, nothing happened yet."""
    facts.setdefault("forced", False)
    facts.setdefault("all_tasks_running", True)
    facts.setdefault("pending_periodic", 0)
    facts.setdefault("last_trigger_time", None)
    facts.setdefault("last_completion_time", None)
    return decide(config, now, **facts)


# --- CheckpointConfig ------------------------------------------------------------------------------


def test_config_defaults():
    config = CheckpointConfig()
    assert (
        config.interval,
        config.min_pause,
        config.max_concurrent,
        config.timeout,
        config.tolerable_failed_checkpoints,
        config.retained,
    ) == (60.0, 0.0, 1, 600.0, 0, 3)


def test_config_accepts_boundary_values():
    config = CheckpointConfig(
        interval=0, min_pause=0, max_concurrent=1, timeout=0.001, tolerable_failed_checkpoints=0, retained=1
    )
    assert config.interval == 0 and config.retained == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"interval": -1}, r"^interval must be >= 0 seconds, got -1$"),
        ({"min_pause": -0.5}, r"^min_pause must be >= 0 seconds, got -0.5$"),
        ({"max_concurrent": 0}, r"^max_concurrent must be >= 1, got 0$"),
        ({"timeout": 0}, r"^timeout must be > 0 seconds, got 0$"),
        ({"timeout": -5}, r"^timeout must be > 0 seconds, got -5$"),
        ({"tolerable_failed_checkpoints": -1}, r"^tolerable_failed_checkpoints must be >= 0, got -1$"),
        ({"retained": 0}, r"^retained must be >= 1, got 0$"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else "",
)
def test_config_validation_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CheckpointConfig(**kwargs)


def test_config_is_immutable():
    config = CheckpointConfig()
    with pytest.raises(AttributeError):
        config.interval = 1  # type: ignore[misc]


# --- decide: tasks not running ----------------------------------------------------------------------


def test_not_all_tasks_running_drops():
    decision = ask(CheckpointConfig(interval=10), 100.0, all_tasks_running=False)
    assert decision == Decision(Verdict.DROP, FailureReason.NOT_ALL_TASKS_RUNNING)


def test_not_all_tasks_running_drops_forced_requests_too():
    decision = ask(CheckpointConfig(), 100.0, forced=True, all_tasks_running=False)
    assert decision == Decision(Verdict.DROP, FailureReason.NOT_ALL_TASKS_RUNNING)


def test_not_all_tasks_running_wins_over_every_other_rule():
    decision = ask(
        CheckpointConfig(interval=10, min_pause=5, max_concurrent=1),
        1.0,
        all_tasks_running=False,
        pending_periodic=3,
        last_trigger_time=0.0,
        last_completion_time=0.5,
    )
    assert decision == Decision(Verdict.DROP, FailureReason.NOT_ALL_TASKS_RUNNING)


# --- decide: the first trigger, interval ------------------------------------------------------------


def test_first_periodic_trigger_executes_at_once():
    assert ask(CheckpointConfig(interval=60), 0.0) == EXECUTE


def test_interval_postpones_with_not_before():
    decision = ask(CheckpointConfig(interval=10), 15.0, last_trigger_time=7.0)
    assert decision == Decision(Verdict.POSTPONE, None, 17.0)


def test_interval_elapsed_exactly_executes():
    assert ask(CheckpointConfig(interval=10), 17.0, last_trigger_time=7.0) == EXECUTE


def test_interval_zero_executes_again_immediately():
    assert ask(CheckpointConfig(interval=0), 7.0, last_trigger_time=7.0) == EXECUTE


# --- decide: concurrency -------------------------------------------------------------------------


def test_max_concurrent_postpones():
    decision = ask(CheckpointConfig(max_concurrent=2), 100.0, pending_periodic=2)
    assert decision == Decision(Verdict.POSTPONE, FailureReason.TOO_MANY_CONCURRENT_CHECKPOINTS)


def test_below_max_concurrent_executes():
    assert ask(CheckpointConfig(interval=10, max_concurrent=2), 100.0, pending_periodic=1,
               last_trigger_time=50.0) == EXECUTE


def test_max_concurrent_is_checked_before_interval():
    decision = ask(CheckpointConfig(interval=10), 1.0, pending_periodic=1, last_trigger_time=0.0)
    assert decision == Decision(Verdict.POSTPONE, FailureReason.TOO_MANY_CONCURRENT_CHECKPOINTS)


# --- decide: minimum pause ----------------------------------------------------------------------------


def test_min_pause_postpones_until_pause_end():
    # interval passed long ago (not_before 10), pause ends at 25
    decision = ask(
        CheckpointConfig(interval=10, min_pause=5), 22.0, last_trigger_time=0.0, last_completion_time=20.0
    )
    assert decision == Decision(Verdict.POSTPONE, FailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS, 25.0)


def test_min_pause_not_before_is_next_interval_when_later():
    # pause ends at 14, but the next interval is only at 20
    decision = ask(
        CheckpointConfig(interval=20, min_pause=2), 13.0, last_trigger_time=0.0, last_completion_time=12.0
    )
    assert decision == Decision(Verdict.POSTPONE, FailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS, 20.0)


def test_min_pause_without_previous_trigger_uses_pause_end():
    decision = ask(CheckpointConfig(interval=10, min_pause=5), 3.0, last_completion_time=1.0)
    assert decision == Decision(Verdict.POSTPONE, FailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS, 6.0)


def test_min_pause_elapsed_exactly_executes():
    assert ask(
        CheckpointConfig(interval=10, min_pause=5), 25.0, last_trigger_time=0.0, last_completion_time=20.0
    ) == EXECUTE


def test_min_pause_elapsed_falls_back_to_interval():
    decision = ask(
        CheckpointConfig(interval=30, min_pause=5), 26.0, last_trigger_time=0.0, last_completion_time=20.0
    )
    assert decision == Decision(Verdict.POSTPONE, None, 30.0)


def test_zero_min_pause_ignores_last_completion():
    assert ask(
        CheckpointConfig(interval=10, min_pause=0), 20.0, last_trigger_time=10.0, last_completion_time=20.0
    ) == EXECUTE


# --- decide: forced -------------------------------------------------------------------------------------


def test_forced_ignores_interval_min_pause_and_concurrency():
    decision = ask(
        CheckpointConfig(interval=100, min_pause=50, max_concurrent=1),
        1.0,
        forced=True,
        pending_periodic=5,
        last_trigger_time=0.5,
        last_completion_time=0.9,
    )
    assert decision == EXECUTE

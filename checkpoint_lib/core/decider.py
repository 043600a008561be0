"""The pure trigger policy: should a checkpoint be triggered now?

Like Flink's ``CheckpointRequestDecider``: a function of the config, the clock and a few facts,
returning a decision instead of acting.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .errors import FailureReason


DEFAULT_ROWS_PER_STEP = 1_000_000
"""Source rows a step reads (in whole landing-table versions), the default of the runner, the CLI and
the DAGs: with a checkpoint at every step (interval 0), a checkpoint every million rows, so a step's
fixed cost (a few Delta commits) is spread over enough rows for an hourly batch."""

@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpointing settings (names follow Flink's ``execution.checkpointing.*``).

    ``CheckpointConfig(interval=60, min_pause=10, max_concurrent=1, timeout=600)`` checkpoints
    every minute, at least 10 s apart, one at a time, and aborts one that takes over 10 minutes.
    """

    interval: float = 60.0
    """Seconds between periodic triggers (0: whenever the other rules allow)."""
    min_pause: float = 0.0
    """Seconds between the end of one checkpoint and the trigger of the next."""
    max_concurrent: int = 1
    """At most this many periodic checkpoints pending at once."""
    timeout: float = 600.0
    """A pending checkpoint older than this is aborted as EXPIRED."""
    tolerable_failed_checkpoints: int = 0
    """Consecutive counted failures tolerated before the job fails."""
    retained: int = 3
    """Completed checkpoints kept; savepoints are kept in addition and never deleted."""

    def __post_init__(self) -> None:
        if self.interval < 0:
            raise ValueError(f"interval must be >= 0 seconds, got {self.interval}")
        if self.min_pause < 0:
            raise ValueError(f"min_pause must be >= 0 seconds, got {self.min_pause}")
        if self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {self.max_concurrent}")
        if self.timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")
        if self.tolerable_failed_checkpoints < 0:
            raise ValueError(
                f"tolerable_failed_checkpoints must be >= 0, got {self.tolerable_failed_checkpoints}"
            )
        if self.retained < 1:
            raise ValueError(f"retained must be >= 1, got {self.retained}")


class Verdict(enum.Enum):
    EXECUTE = "execute"
    POSTPONE = "postpone"
    """Not now; ask again at ``not_before``."""
    DROP = "drop"
    """Refused (``reason`` says why); a forced request that is dropped fails."""


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: FailureReason | None = None
    not_before: float | None = None


def decide(
    config: CheckpointConfig,
    now: float,
    *,
    forced: bool,
    all_tasks_running: bool,
    pending_periodic: int,
    last_trigger_time: float | None,
    last_completion_time: float | None,
) -> Decision:
    """Decide whether to trigger a checkpoint now.

    ``forced`` requests (savepoints, a user's "checkpoint now") skip the interval, min pause and
    concurrency limits; nothing triggers while a task is not running, because a source that is not
    running cannot inject a barrier.
    """
    if not all_tasks_running:
        return Decision(Verdict.DROP, FailureReason.NOT_ALL_TASKS_RUNNING)
    if forced:
        return Decision(Verdict.EXECUTE)
    if pending_periodic >= config.max_concurrent:
        return Decision(Verdict.POSTPONE, FailureReason.TOO_MANY_CONCURRENT_CHECKPOINTS)
    not_before = 0.0
    if last_trigger_time is not None:
        not_before = last_trigger_time + config.interval
    if last_completion_time is not None and config.min_pause > 0:
        pause_end = last_completion_time + config.min_pause
        if pause_end > now:
            return Decision(
                Verdict.POSTPONE,
                FailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS,
                max(pause_end, not_before),
            )
    if now < not_before:
        return Decision(Verdict.POSTPONE, None, not_before)
    return Decision(Verdict.EXECUTE)

"""The in-process stand-in of ``CKPT_KILL_AT`` for runner tests that need no child process."""

from __future__ import annotations

from typing import Callable


def raise_at(phase: str, n: int = 1) -> Callable[[str], None]:
    """A ``runner.ctx.kills.reached`` hook: raises ``RuntimeError("killed at <phase>:<n>")`` the
    ``n``-th time the runner reaches ``phase`` (e.g. ``commit``, 2: between the second checkpoint's
    completion and its commit)."""
    hits = 0

    def reached(reached_phase: str) -> None:
        nonlocal hits
        if reached_phase == phase:
            hits += 1
            if hits == n:
                raise RuntimeError(f"killed at {phase}:{n}")

    return reached

"""Injected time. The core never reads the wall clock itself."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds, monotonic within a process (absolute where the adapter needs wall time)."""
        ...


class SystemClock:
    """Wall-clock time (epoch seconds): checkpoint timestamps are meaningful across processes."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock tests move by hand: ``clock.advance(5)``."""

    def __init__(self, start: float = 0.0):
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("a clock never goes backwards")
        self._now += seconds
        return self._now

    def set(self, t: float) -> None:
        if t < self._now:
            raise ValueError("a clock never goes backwards")
        self._now = float(t)

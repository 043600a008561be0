"""For tests of chained stages: what a runner writes to its channel log."""

from __future__ import annotations


def channel_writes(runner) -> list:
    """Every write ``runner`` (a :class:`~checkpoint_lib.spark.runner.PipelineRunner`) makes to its
    channel log, from now on: each call's positional arguments."""
    calls, write = [], runner.channel.write
    runner.channel.write = lambda *a, **kw: calls.append(a) or write(*a, **kw)
    return calls

"""For tests of chained stages: what a runner writes to its channel logs."""

from __future__ import annotations


def channel_writes(runner) -> list:
    """Every write ``runner`` (a :class:`~checkpoint_lib.spark.runner.PipelineRunner`, opened or
    not) makes to its channel logs (a chained one has none), from now on: each call's positional
    arguments."""
    calls: list = []

    def watch() -> None:
        for log in runner.logs.values():
            if not getattr(log, "_watched", False):
                write = log.write
                log.write = lambda *a, _write=write, **kw: calls.append(a) or _write(*a, **kw)
                log._watched = True

    wire = runner._wire_logs

    def wired() -> None:
        wire()
        watch()

    runner._wire_logs = wired
    watch()
    return calls

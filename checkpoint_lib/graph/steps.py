"""Planning a graph's next step across its sources (pure: no engine).

Each source proposes its next whole versions (a :class:`Proposal`); :func:`plan_step` cuts them at
one commit time, so every source reads only what had been committed by then: a dimension table is
read up to what had landed when the events after it landed, whatever the step size. The graph
runner (:mod:`checkpoint_lib.spark.graph_runner`) reads each source's share.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..delta.log import AddedFile


@dataclass(frozen=True)
class Proposal:
    """What a source could read next: the files of its next whole versions after its offset
    (``step``), the version that step ends at (``end``), whether it stops before the source's latest
    version (``bounded``: the step is full) and each version's commit time (ms; None: the kind of
    source does not say)."""

    step: tuple[AddedFile, ...]
    end: int
    bounded: bool
    times: dict[int, int] | None


def plan_step(proposals: dict[str, Proposal | None]) -> dict[str, tuple[list, int]]:
    """Each source's share of the next step, ``name -> (files, end version)``, cut at one commit
    time across the sources: the earliest time a full proposal (``bounded``) ends at, and every
    version committed after it is left for a later step. A source whose kind does not say its
    commit times reads its whole proposal; one whose share is empty is left out. Pure."""
    timed = {name: p for name, p in proposals.items() if p is not None and p.bounded and p.times}
    cut = min((p.times[p.end] for p in timed.values()), default=None)
    shares: dict[str, tuple[list, int]] = {}
    for name, p in proposals.items():
        if p is None:
            continue
        if cut is None or not p.times:
            shares[name] = (list(p.step), p.end)
            continue
        end = None
        for v in sorted(p.times):  # whole versions, in order, up to the first one committed after the cut
            if p.times[v] > cut:
                break
            end = v
        if end is not None:
            shares[name] = ([f for f in p.step if f.version <= end], end)
    if not shares and timed:  # commit times out of order: the full proposal that set the cut goes whole
        name = min(timed, key=lambda n: timed[n].times[timed[n].end])
        shares[name] = (list(timed[name].step), timed[name].end)
    return shares

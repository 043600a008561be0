"""The one compare-and-swap loop of the control plane: commit on the snapshot that decided, or
decide again.

Every conditional write of ours (a control-table row, a stamped commit, a maintenance rewrite, a
table-property change) reads a snapshot, decides from it, and commits *exactly on top of it*: the
storage refuses the commit when anyone committed since (delta-rs with ``max_commit_retries=0``, a
conditional put). Nothing of a refused commit is visible, so the loop reads the new snapshot and
decides again; every check the decision made (a status, a fence, the next number) holds at the
instant the commit lands, however long the writer stalled. Pure: the storage is the caller's.
"""

from __future__ import annotations

import random
import time
from typing import Callable, TypeVar

S = TypeVar("S")
R = TypeVar("R")

PAUSE_SECONDS = 0.005
"""The first back-off after a lost race; it grows with each attempt (up to 20 times) and is
jittered, so racing writers spread out."""


def commit_on_snapshot(
    read: Callable[[], S],
    attempt: Callable[[S], R],
    *,
    lost: type[BaseException] | tuple[type[BaseException], ...],
    attempts: int,
    exhausted: Callable[[int], BaseException],
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[R, int]:
    """``attempt(read())`` until it does not raise ``lost``: ``attempt`` decides from the snapshot
    and commits on exactly that snapshot (or returns without committing: nothing to do, or a
    refusal it raises); ``lost`` means another commit took the version and nothing of ours landed
    (``read`` may raise it too: a racing creation of the table).
    Returns ``attempt``'s result and how many races were lost before it. After ``attempts`` lost
    races, raises ``exhausted(attempts)``."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    for n in range(attempts):
        try:
            return attempt(read()), n
        except lost:  # at the commit, or already at the read (e.g. two writers creating the table)
            sleep(PAUSE_SECONDS * min(n + 1, 20) * (0.5 + random.random()))
    raise exhausted(attempts)

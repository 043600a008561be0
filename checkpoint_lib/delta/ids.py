"""The durable ``CheckpointIdCounter``: strictly increasing ids, unique under races and crashes.

Every id that is written to the checkpoints table (``record_pending``, ``record_aborted``,
``add``) is also marked first (:mod:`.reservations`), so the markers are a superset of the ids in
the table and a counter that probes ``1 + max(table, what this process handed out)`` upwards,
skipping existing markers, never returns an id anyone has used, even one whose process died before
writing any row. Markers are tiny and never deleted (deleting them safely would need a fence of its
own); the hot path never lists the directory, it only probes the next few names.

Decision: ``get_and_increment`` only reserves (the marker is the durable reservation) and writes
no row, because it does not know the checkpoint's kind or epoch. ``record_pending`` writes the
``pending`` row for the history, explicitly, when the adapter triggers the checkpoint. A crash
between the two leaves a marker and no row: the id is skipped forever and the history never shows
it, which is what a checkpoint that was never triggered should look like.

Crash safety: (1) create the marker, (2) fsync the directory. Before (1): nothing happened. After
(1)/(2): the number is burnt (never handed out again) but unused.
"""

from __future__ import annotations

import threading

from ..core.types import CheckpointId
from .control_table import ControlTable
from .reservations import Reservations, reserve_from

NAMESPACE = "ids"


class DeltaCheckpointIdCounter:
    """Hands out checkpoint ids above every id in the checkpoints table and every marker."""

    def __init__(self, checkpoints: ControlTable, reservations: Reservations):
        self._checkpoints = checkpoints
        self.reservations = reservations
        self._lock = threading.Lock()
        self._high_water = 0

    def get_and_increment(self) -> CheckpointId:
        """Reserve and return the next id: durable (its marker exists) before it is returned.

        Starts at 1 + max(every id in the table, every id this instance handed out) and skips
        markers left by other processes (alive, racing, or dead). Writes no row (see module doc).
        """
        with self._lock:
            start = max(self._checkpoints.max("checkpoint_id"), self._high_water) + 1
            checkpoint_id = reserve_from(self.reservations, NAMESPACE, start)
            self._high_water = checkpoint_id
            return checkpoint_id

    def peek(self) -> CheckpointId:
        """The id the next ``get_and_increment`` returns (unless another process takes it first)."""
        with self._lock:
            candidate = max(self._checkpoints.max("checkpoint_id"), self._high_water) + 1
            while self.reservations.exists(NAMESPACE, candidate):
                candidate += 1
            return candidate

    def claim(self, checkpoint_id: CheckpointId) -> None:
        """Mark ``checkpoint_id`` used before a row of it is written: never handed out after."""
        self.reservations.claim(NAMESPACE, checkpoint_id)

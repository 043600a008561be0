"""The durable control plane of a pipeline: small Delta tables written and read from the driver.

Everything here uses the ``deltalake`` library (delta-rs, no JVM) and imports without Spark. It
holds metadata only (checkpoint ids and statuses, the completed checkpoints' acknowledgements,
epochs), never pipeline data.

- :mod:`.store`: :class:`~.store.DeltaCheckpointStore`, one per pipeline, rooted at
  ``<warehouse>/_checkpoints/<pipeline>``. It is both the core's ``CheckpointIdCounter`` and its
  ``CompletedCheckpointStore`` (same contract as the in-memory ones), plus the epoch table that
  fences zombie attempts and a status history for the UI.
- :mod:`.log`: reading a Delta table's transaction log (which files each version added), for
  incremental, replayable reads of append-only tables.

``DeltaCheckpointStore`` is importable from this package; the import of ``deltalake`` happens on
first use, so ``import checkpoint_lib.delta`` itself stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DeltaCheckpointStore", "CorruptCheckpointWarning", "LocalReservations"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The durable control plane of a pipeline: small Delta tables written and read from the driver.

Everything here uses the ``deltalake`` library (delta-rs, no JVM) and imports without Spark. It
holds metadata only (checkpoint ids and statuses, the completed checkpoints' acknowledgements,
epochs), never pipeline data.

- :mod:`.store`: :class:`~.store.DeltaCheckpointStore`, one per pipeline, rooted at
  ``<warehouse>/_checkpoints/<pipeline>``: the control stores of the pipeline, one per role, each
  on its own table (:mod:`.control_table`): ids (:mod:`.ids`, :mod:`.reservations`), completed
  checkpoints and their statuses (:mod:`.completed`, :mod:`.checkpoint_table`, :mod:`.ack_codec`),
  validation verdicts (:mod:`.verdicts`), epochs (:mod:`.epochs`), acks of pending checkpoints
  (:mod:`.acks`), stage sessions (:mod:`.sessions`). The ids and the completed checkpoints are the
  core's ``CheckpointIdCounter`` and ``CompletedCheckpointStore`` (same contract as the in-memory
  ones).
- :mod:`.log`: reading a Delta table's transaction log (which files each version added), for
  incremental, replayable reads of append-only tables.

``DeltaCheckpointStore`` is importable from this package; the import of ``deltalake`` happens on
first use, so ``import checkpoint_lib.delta`` itself stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DeltaCheckpointStore", "CorruptCheckpointWarning", "LocalReservations"]
_HOMES = {"DeltaCheckpointStore": "store", "CorruptCheckpointWarning": "checkpoint_table",
          "LocalReservations": "reservations"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

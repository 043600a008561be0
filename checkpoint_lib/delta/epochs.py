"""Epochs: one per attempt of a pipeline (a run that restored, or a recovery). The largest is the
current one, and every fenced control table carries it as its fence, so a zombie of an older
attempt cannot write, however long it stalled between its checks and its commit.

``begin``: (1) the epoch row, committed on top of the snapshot whose largest epoch it follows (so
the number is unique under races), then (2) the fence of every fenced table raised to it. After
(1), before the last of (2), a crash leaves an epoch nobody acts as; the next ``begin`` takes the
next number and fences above it. The epoch is a value: it is returned to the attempt, which passes
it to each of its writes; no store keeps one.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Sequence

import pyarrow as pa
from deltalake import DeltaTable

from ..core.errors import FencedError
from .control_table import ControlRoot, ControlTable

EPOCHS_SCHEMA = pa.schema(
    [
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("started_at", pa.float64(), nullable=False),
        pa.field("owner", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
    ]
)
"""The ``epochs`` table: one row per attempt; the largest epoch is the current one."""


class DeltaEpochStore:
    """The ``epochs`` table, and the fence it raises on the tables of ``fenced``."""

    def __init__(self, place: ControlRoot, fenced: Sequence[ControlTable]):
        self.table = ControlTable(place, "epochs", EPOCHS_SCHEMA)
        self._fenced = {t.name: t for t in fenced}

    def current(self) -> int:
        """The newest epoch anyone began (0 before the first)."""
        return self.table.max("epoch")

    def begin(self, owner: str | None = None, reason: str = "") -> int:
        """Begin a new attempt and return its epoch, every fenced table fenced at it (see the
        module doc). :class:`FencedError` if a newer epoch began meanwhile (this one lost before it
        started)."""
        row = {
            "started_at": float(self.table.place.now()),
            "owner": owner or f"{socket.gethostname()}:{os.getpid()}",
            "reason": reason,
        }
        chosen: dict[str, int] = {}

        def build(dt: DeltaTable) -> list[dict[str, Any]]:
            chosen["epoch"] = self.table.max("epoch", dt=dt) + 1
            return [{"epoch": chosen["epoch"], **row}]

        self.table.commit(build)
        epoch = chosen["epoch"]
        for table in self._fenced.values():
            table.raise_fence(epoch)
        return epoch

    def check(self, epoch: int) -> None:
        """Raise :class:`FencedError` if an epoch newer than ``epoch`` has begun."""
        current = self.current()
        if epoch < current:
            raise FencedError(
                f"{self.table.place.root}: epoch {epoch} is fenced: epoch {current} has taken over "
                "(this is a zombie of an older attempt)"
            )

    def all(self) -> list[dict[str, Any]]:
        """Every epoch row, newest first."""
        return sorted(self.table.rows(), key=lambda r: r["epoch"], reverse=True)

    def fence(self, name: str) -> int:
        """The newest epoch that fenced table ``name`` (0: none yet)."""
        return self._fenced[name].fenced_by()

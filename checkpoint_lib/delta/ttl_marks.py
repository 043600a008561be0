"""The TTL marks of a keyed state table: what a state table's commit says about its cleanup, read
from the Delta log without Spark (the runtime's flushes and restores write them, the read-only
commands read them)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .log import user_metadata_at


@dataclass(frozen=True)
class TtlMarks:
    """Where the cleanup of state with a TTL stands after a flush: the operator's ``newest``
    write so far and the ``run`` of that flush. A key's row from a run before it, written
    ``ttl + cleanup_lateness`` before ``newest``, is cleaned up: no later flush sees it (what a
    MERGE deleting the keys its flush did not touch left), and a compaction drops it. Kept in
    the commit of the flush (and of every rewrite after it) as its user metadata, so the state
    at any pinned version knows its own."""

    newest: datetime | None = None
    run: int = -1

    def expire_before(self, ttl: Any) -> datetime | None:
        """The write time below which a row of an earlier run is cleaned up (``ttl``: the operator's
        :class:`~checkpoint_lib.pipeline.StateTtl`)."""
        return None if self.newest is None else self.newest - timedelta(seconds=ttl.cleanup_seconds)

    def to_json(self) -> str:
        return json.dumps({"ttl_newest": None if self.newest is None else self.newest.isoformat(),
                           "ttl_run": self.run})

    @classmethod
    def from_json(cls, text: str | None) -> TtlMarks | None:
        try:
            held = json.loads(text) if text else None
        except ValueError:
            return None
        if not isinstance(held, dict) or "ttl_run" not in held:
            return None
        newest = held.get("ttl_newest")
        return cls(None if newest is None else datetime.fromisoformat(newest), int(held["ttl_run"]))


def marks_at(table: str | os.PathLike, version: int) -> TtlMarks | None:
    """The marks of the state at ``version`` of ``table``: those of the newest commit at or before
    it that has them (a fence's commit has none); None when none has (a table MERGEd before runs)."""
    return None if version < 0 else TtlMarks.from_json(user_metadata_at(table, version))

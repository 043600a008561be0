"""Sessions: within an epoch, each run of a stage (a process) is a session with a ``start`` row
and, when it stopped cleanly, an ``end`` row carrying where the next session of the stage resumes.
The epoch's ``restored`` row (stage ``*``) says which checkpoint it restored (null: none) once the
restore is done; a ``rollback`` row is the intent of a recovery to an older checkpoint. A start
without an end means the process died: the next start of that stage recovers (a new epoch).
Every write is decided on the snapshot it lands on and fenced by its epoch in that commit."""

from __future__ import annotations

import json
import os
import re
import socket
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import pyarrow as pa
from deltalake import DeltaTable

from ..core.retention import Restores, Retention
from ..core.types import CheckpointId
from .control_table import ControlRoot, ControlTable, StoreOnTable

SESSIONS_SCHEMA = pa.schema(
    [
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("session", pa.int64(), nullable=False),
        pa.field("event", pa.string(), nullable=False),
        pa.field("checkpoint_id", pa.int64()),
        pa.field("resume_json", pa.string()),
        pa.field("owner", pa.string(), nullable=False),
        pa.field("recorded_at", pa.float64(), nullable=False),
    ]
)
"""The ``sessions`` table (see the module doc)."""

START, END, RESTORED, ROLLBACK = "start", "end", "restored", "rollback"
ALL_STAGES = "*"
_STAGE = re.compile(r"^[a-z][a-z0-9_]*$")


class DeltaSessionStore(StoreOnTable):
    """The ``sessions`` table: at most one live session per stage and epoch, resume points, the
    restore and rollback records.

    ``after_commit(file_count)``: told the table's data-file count after each write (compaction)."""

    def __init__(self, place: ControlRoot, after_commit: Callable[[int], None] = lambda files: None):
        self.table = ControlTable(place, "sessions", SESSIONS_SCHEMA)
        self._after_commit = after_commit

    def of_epoch(self, epoch: int, dt: DeltaTable | None = None) -> list[dict[str, Any]]:
        """Every session row of ``epoch`` (as of ``dt``'s snapshot), in the order they were recorded."""
        rows = [r for r in self.table.rows(dt) if r["epoch"] == epoch]
        return sorted(rows, key=lambda r: (r["recorded_at"], r["session"]))

    def record_restored(self, epoch: int, checkpoint_id: CheckpointId | None, resume: Mapping[str, Any]) -> None:
        """``epoch`` finished restoring ``checkpoint_id`` (None: started from scratch); ``resume``
        maps each stage to where its first session of the epoch starts. Stages may join it now.
        Fenced in its commit."""
        text = json.dumps(dict(resume), sort_keys=True)
        row = self._row(epoch, ALL_STAGES, 0, RESTORED, checkpoint_id, text)
        self.table.commit(lambda dt: [row], fence=epoch)

    def begin(self, epoch: int, stage: str, after: int | None = None) -> int | None:
        """Start the next session of ``stage`` in ``epoch`` and return its number, or None when the
        caller lost a race: a session of the stage is live (started, not ended), or, with ``after``
        (the session whose end row the caller resumes from; 0: the epoch's restored row), another
        session started since. Decided on the snapshot the start row lands on, so a stage has at
        most one live session per epoch, provably. Fenced in its commit."""
        if not _STAGE.match(stage):
            raise ValueError(f"bad stage name {stage!r}")
        got: dict[str, int | None] = {}

        def build(dt: DeltaTable) -> list[dict[str, Any]] | None:
            mine = [r for r in self.of_epoch(epoch, dt) if r["stage"] == stage]
            started = {r["session"] for r in mine if r["event"] == START}
            ended = {r["session"] for r in mine if r["event"] == END}
            last = max(started, default=0)
            if started - ended or (after is not None and last != after):
                got["number"] = None
                return None
            got["number"] = last + 1
            return [self._row(epoch, stage, last + 1, START, None, None)]

        file_count = self.table.commit(build, fence=epoch)
        if got["number"] is not None:
            self._after_commit(file_count + 1)
        return got["number"]

    def end(self, epoch: int, stage: str, session: int, resume: Mapping[str, Any]) -> None:
        """The live ``session`` stopped cleanly; ``resume`` (JSON) is where the next one continues.
        ``ValueError`` if it is not live (never started, or already ended). Fenced in its commit."""
        row = self._row(epoch, stage, session, END, None, json.dumps(dict(resume), sort_keys=True))

        def build(dt: DeltaTable) -> list[dict[str, Any]]:
            events = {r["event"] for r in self.of_epoch(epoch, dt) if r["stage"] == stage and r["session"] == session}
            if events != {START}:
                raise ValueError(f"session {session} of stage {stage} in epoch {epoch} is not live ({sorted(events)})")
            return [row]

        self.table.commit(build, fence=epoch)

    def record_rollback(self, epoch: int, checkpoint_id: CheckpointId) -> None:
        """Intent, written before anything is rolled back: ``epoch`` restores ``checkpoint_id``, older
        than the latest completed one, so the sinks must be rolled back to it and every later
        checkpoint discarded. It stays owed (:meth:`owed_rollback`) until an epoch at or after it
        finishes restoring. Fenced in its commit."""
        row = self._row(epoch, ALL_STAGES, 0, ROLLBACK, checkpoint_id, None)
        self.table.commit(lambda dt: [row], fence=epoch)

    def owed_rollback(self) -> CheckpointId | None:
        """The checkpoint of a rollback whose epoch crashed before it finished restoring (and no
        later epoch finished one either): the next recovery must complete it. None otherwise."""
        return owed_rollback_of(self.table.rows())

    def restores(self, rows: Sequence[Mapping[str, Any]] | None = None) -> Restores:
        """The newest finished restore and an owed rollback (of ``rows``; default: a fresh read):
        what retention must keep for the after-restore suite and the next recovery."""
        rows = self.table.rows() if rows is None else rows
        restored = [r for r in rows if r["event"] == RESTORED]
        if not restored:
            return Restores(owed_rollback=owed_rollback_of(rows))
        epoch = max(r["epoch"] for r in restored)
        first = min((r for r in restored if r["epoch"] == epoch), key=lambda r: (r["recorded_at"], r["session"]))
        return Restores(None if first["checkpoint_id"] is None else int(first["checkpoint_id"]), int(epoch),
                        float(first["recorded_at"]), owed_rollback_of(rows))

    # --- what maintenance may prune (core.retention.PrunedStore) ---------------------------------

    def rows_to_keep(self, snapshot: Any, rows: Sequence[Mapping[str, Any]],
                     retention: Retention | None = None) -> list[Mapping[str, Any]]:
        """:func:`sessions_to_keep`: decided from the rows alone."""
        return sessions_to_keep(rows)

    def keeps(self, retention: Retention | None = None) -> str:
        return ("rows of the newest epoch that finished restoring and later ones (restores, rollbacks); "
                "per stage the last session, the last ended one, any that never ended")

    def _row(self, epoch, stage, session, event, checkpoint_id, resume_json) -> dict[str, Any]:
        return {
            "epoch": int(epoch), "stage": stage, "session": int(session), "event": event,
            "checkpoint_id": None if checkpoint_id is None else int(checkpoint_id),
            "resume_json": resume_json, "owner": f"{socket.gethostname()}:{os.getpid()}",
            "recorded_at": float(self.table.place.now()),
        }


@dataclass(frozen=True)
class Resume:
    """Where a stage (a process group) resumes in an epoch, from the epoch's session rows
    (:func:`resume_of`): ``point`` (None: it must recover, ``why`` says why) and ``after``, the
    session whose end it is (0: the restore's)."""

    point: dict[str, Any] | None
    after: int = 0
    why: str = ""
    """``unfinished``: the epoch's recovery never finished; ``unclean``: a session of the stage
    started and never ended (its process died); ``layout``: the epoch was restored for other
    process groups (a pipeline run in another layout: ``--stage all`` after separate stages, or
    the other way round), so there is no point to resume this one from."""


def resume_of(rows: Sequence[Mapping[str, Any]], stage: str, restored_key: str | None = None) -> Resume:
    """Of one epoch's session ``rows``: where ``stage`` resumes. The last session that ended
    gives its resume point; with none, the restore's (``restored_key``: the restore's point is a
    mapping of stages, this one's under that key; default ``stage``). The one reading of the
    session rows, for the linear runner's stages and a graph's process groups."""
    restored = [r for r in rows if r["event"] == RESTORED]
    if not restored:
        return Resume(None, why="unfinished")
    mine = [r for r in rows if r["stage"] == stage]
    started = {r["session"] for r in mine if r["event"] == START}
    ended = {r["session"]: r for r in mine if r["event"] == END}
    if started - set(ended):
        return Resume(None, why="unclean")
    if ended:
        return Resume(json.loads(ended[max(ended)]["resume_json"]), max(ended))
    points = json.loads(restored[0]["resume_json"])
    if (restored_key or stage) not in points:
        return Resume(None, why="layout")
    return Resume(points[restored_key or stage], 0)


def owed_rollback_of(rows: Sequence[Mapping[str, Any]]) -> CheckpointId | None:
    """Of the session ``rows``: :meth:`DeltaSessionStore.owed_rollback`."""
    rollbacks = [r for r in rows if r["event"] == ROLLBACK]
    if not rollbacks:
        return None
    last = max(rollbacks, key=lambda r: (r["epoch"], r["recorded_at"]))
    if any(r["event"] == RESTORED and r["epoch"] >= last["epoch"] for r in rows):
        return None
    return int(last["checkpoint_id"])


def sessions_to_keep(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The session rows resuming, ``begin``, ``end`` and ``owed_rollback`` read: every row of the
    newest epoch that finished restoring and of later epochs, except the start and end rows of
    sessions that ended and are neither the last session of their stage nor the last one that
    ended. Everything when no epoch finished restoring."""
    restored = [r["epoch"] for r in rows if r["event"] == RESTORED]
    if not restored:
        return list(rows)
    newest = max(restored)
    events: dict[tuple[int, str], dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    for r in rows:
        if r["epoch"] >= newest and r["stage"] != ALL_STAGES:
            events[(r["epoch"], r["stage"])][r["session"]].add(r["event"])
    needed: dict[tuple[int, str], set[int]] = {}
    for key, sessions in events.items():
        ended = [s for s, ev in sessions.items() if END in ev]
        live_or_odd = {s for s, ev in sessions.items() if ev != {START, END}}
        needed[key] = {max(sessions), *([max(ended)] if ended else []), *live_or_odd}
    return [r for r in rows if r["epoch"] >= newest
            and (r["stage"] == ALL_STAGES or r["session"] in needed[(r["epoch"], r["stage"])])]

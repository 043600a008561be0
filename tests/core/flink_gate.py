"""Flink's barrier-handling tests, replayed on our handlers: the helpers of tests/core/test_flink_*.py.

A Flink test feeds a ``CheckpointedInputGate`` a sequence of buffers and events, each on a channel,
and checks what comes out (``check(sequence[i], ...)``) and what the task was told (checkpoints
triggered, aborted). :class:`Gate` does the same with one of our handlers, from a compact script::

    gate = Gate(3, "aligned")
    gate.feed("0 2 0 1@1 1@2 0 1@0")   # buffers on channels 0, 2, 0, barrier 1 on 1, ...
    assert gate.delivered == [0, 1, 2, 5]  # records are their index in the whole sequence
    assert gate.triggered == [1]

Tokens (one sequence element each, so indices match Flink's ``sequence[i]``):

- ``3``: a buffer (one record) on channel 3;
- ``2@1``: the barrier of checkpoint 2 on channel 1; ``s2@1``: the same, a savepoint's;
- ``E1``: end of channel 1 (Flink's ``EndOfPartitionEvent``);
- ``X4`` or ``X4@0``: the coordinator aborts checkpoint 4 (Flink's ``CancelCheckpointMarker`` on
  channel 0). Our aborts are not channel markers: the handler hears them out of band, at once, and
  the channel is only written down to keep Flink's sequence readable;
- ``T0.5``: half a second passes and the alignment timer fires (Flink's active timeout);
  ``t0.5``: half a second passes, no timer (the next event notices: Flink's passive timeout).

:func:`violations` checks a run against the consistent-cut conditions of BRIEF.md.
"""

from __future__ import annotations

import re
from typing import Any

from checkpoint_lib.core.barriers import (
    CheckpointDone,
    DeclineCheckpoint,
    Deliver,
    LogChannelState,
    TakeSnapshot,
    create_handler,
)
from checkpoint_lib.core.clock import ManualClock
from checkpoint_lib.core.types import Barrier, BarrierMode, CheckpointKind

_TOKEN = re.compile(
    r"(?P<record>\d+)"
    r"|(?P<savepoint>s?)(?P<barrier>\d+)@(?P<on>\d+)"
    r"|E(?P<end>\d+)"
    r"|X(?P<abort>\d+)(?:@\d+)?"
    r"|(?P<clock>[Tt])(?P<seconds>[\d.]+)"
)
ALL_MODES = [m.value for m in BarrierMode]


class Gate:
    """One handler fed a Flink-style sequence; every effect is kept with the event that caused it."""

    def __init__(self, channels: int, mode: str, *, timeout: float | None = None, max_tracked: int = 50):
        if mode == BarrierMode.ALIGNED_WITH_TIMEOUT.value and timeout is None:
            timeout = 1e9  # "aligned, never times out" unless a test says otherwise
        self.clock = ManualClock()
        self.h = create_handler(channels, mode, self.clock, alignment_timeout=timeout, max_tracked=max_tracked)
        self.channels = channels
        self.sequence: list[tuple[str, Any]] = []  # (kind, payload), index = the record's name
        self.log: list[tuple[int, Any]] = []  # (index of the event that caused it, effect)
        self.aborted_at: dict[int, int] = {}  # checkpoint id -> index of its abort

    def feed(self, script: str) -> list:
        """Feed every token of ``script``; return the effects they caused, in order."""
        start = len(self.log)
        for token in script.split():
            match = _TOKEN.fullmatch(token)
            if match is None:
                raise ValueError(f"unknown token {token!r}")
            self._event(match)
        return [effect for _, effect in self.log[start:]]

    def _event(self, m: re.Match) -> None:
        i = len(self.sequence)
        h = self.h
        if m["record"] is not None:
            self.sequence.append(("record", int(m["record"])))
            effects = h.on_record(int(m["record"]), i)
        elif m["barrier"] is not None:
            kind = CheckpointKind.SAVEPOINT if m["savepoint"] else CheckpointKind.CHECKPOINT
            barrier = Barrier(int(m["barrier"]), self.clock.now(), kind)
            self.sequence.append(("barrier", (int(m["on"]), barrier.checkpoint_id)))
            effects = h.on_barrier(int(m["on"]), barrier)
        elif m["end"] is not None:
            self.sequence.append(("end", int(m["end"])))
            effects = h.on_end_of_channel(int(m["end"]))
        elif m["abort"] is not None:
            self.sequence.append(("abort", int(m["abort"])))
            self.aborted_at.setdefault(int(m["abort"]), i)
            effects = h.on_checkpoint_aborted(int(m["abort"]))
        else:
            self.sequence.append(("clock", float(m["seconds"])))
            self.clock.advance(float(m["seconds"]))
            effects = h.on_timer() if m["clock"] == "T" else []
        self.log += [(i, e) for e in effects]

    @property
    def records(self) -> list[int]:
        """Every record fed so far, in order (what a handler that never blocks delivers)."""
        return [i for i, (kind, _) in enumerate(self.sequence) if kind == "record"]

    # what came out -----------------------------------------------------------------------------

    def _of(self, kind: type) -> list:
        return [e for _, e in self.log if isinstance(e, kind)]

    def _ids(self, kind: type) -> list[int]:
        return [e.checkpoint_id for e in self._of(kind)]

    @property
    def delivered(self) -> list[int]:
        return [e.record for e in self._of(Deliver)]

    @property
    def triggered(self) -> list[int]:
        """Checkpoints snapshotted (Flink: ``triggerCheckpointOnBarrier``), in order."""
        return self._ids(TakeSnapshot)

    @property
    def unaligned(self) -> list[int]:
        return [e.checkpoint_id for e in self._of(TakeSnapshot) if e.unaligned]

    @property
    def acknowledged(self) -> list[int]:
        return self._ids(CheckpointDone)

    @property
    def declined(self) -> list[int]:
        """Checkpoints this subtask gave up (Flink: ``abortCheckpointOnBarrier``, subsumed)."""
        return self._ids(DeclineCheckpoint)

    @property
    def in_flight(self) -> dict[int, list[int]]:
        """Records logged as channel state, by checkpoint (Flink: the channel state writer)."""
        out: dict[int, list[int]] = {}
        for e in self._of(LogChannelState):
            out.setdefault(e.checkpoint_id, []).append(e.record)
        return out

    def snapshot(self, checkpoint_id: int) -> TakeSnapshot:
        (snap,) = [e for e in self._of(TakeSnapshot) if e.checkpoint_id == checkpoint_id]
        return snap

    def cut(self, checkpoint_id: int) -> list[int]:
        """The records delivered before ``checkpoint_id``'s snapshot: what its state holds."""
        records = []
        for _, e in self.log:
            if isinstance(e, TakeSnapshot) and e.checkpoint_id == checkpoint_id:
                return records
            if isinstance(e, Deliver):
                records.append(e.record)
        raise AssertionError(f"checkpoint {checkpoint_id} was never snapshotted")

    def during_alignment(self, checkpoint_id: int) -> list[int]:
        """Records delivered from the first barrier of ``checkpoint_id`` to its acknowledgement
        (Flink's "bytes processed during alignment")."""
        first = next(i for i, (kind, p) in enumerate(self.sequence) if kind == "barrier" and p[1] == checkpoint_id)
        records = []
        for i, e in self.log:
            if isinstance(e, CheckpointDone) and e.checkpoint_id == checkpoint_id:
                return records
            if i >= first and isinstance(e, Deliver):
                records.append(e.record)
        raise AssertionError(f"checkpoint {checkpoint_id} was never acknowledged")


def violations(gate: Gate) -> list[str]:
    """Every breach of BRIEF.md in ``gate``'s run, described; [] when there is none.

    All modes: each record is delivered once, in its channel's order, and none is left held once
    every channel ended; no checkpoint is snapshotted after the handler heard of its abort. The
    exactly-once modes also give consistent cuts: for a snapshot of ``c`` and each channel, let
    n = the records the channel carried before its first barrier of ``c`` or later (all of them if
    it has none) and m = the records taken before the snapshot. Then m <= n; and when ``c`` is
    acknowledged, the channel state logged is records m+1..n (none at all for an aligned
    snapshot: m = n, no record after a channel's barrier is in the snapshot).
    """
    out: list[str] = []
    records: dict[int, list[int]] = {k: [] for k in range(gate.channels)}
    barriers: dict[int, list[tuple[int, int]]] = {k: [] for k in range(gate.channels)}  # (id, n)
    for i, (kind, p) in enumerate(gate.sequence):
        if kind == "record":
            records[p].append(i)
        elif kind == "barrier":
            barriers[p[0]].append((p[1], len(records[p[0]])))
    channel_of = {i: k for k, rs in records.items() for i in rs}
    taken: dict[int, list[int]] = {k: [] for k in records}
    cuts: dict[int, tuple[bool, dict[int, int]]] = {}  # checkpoint -> (unaligned, m per channel)
    logged: dict[tuple[int, int], list[int]] = {}
    for i, e in gate.log:
        if isinstance(e, Deliver):
            taken[channel_of[e.record]].append(e.record)
        elif isinstance(e, TakeSnapshot):
            cuts[e.checkpoint_id] = (e.unaligned, {k: len(v) for k, v in taken.items()})
            if gate.aborted_at.get(e.checkpoint_id, i) < i:
                out.append(f"checkpoint {e.checkpoint_id} snapshotted after its abort")
        elif isinstance(e, LogChannelState):
            logged.setdefault((e.checkpoint_id, e.channel), []).append(e.record)
    for k, rs in records.items():
        if taken[k] != rs[: len(taken[k])]:
            out.append(f"channel {k}: delivered {taken[k]}, not a prefix of {rs} once each")
        elif gate.h.finished and len(taken[k]) != len(rs):
            out.append(f"channel {k}: records {rs[len(taken[k]):]} never delivered")
    if not gate.h.mode.exactly_once:
        return out
    acknowledged = set(gate.acknowledged)
    for c, (unaligned, m_of) in cuts.items():
        for k, rs in records.items():
            n = next((n for cid, n in barriers[k] if cid >= c), len(rs))
            m, state = m_of[k], logged.get((c, k), [])
            if m > n:
                out.append(f"checkpoint {c} channel {k}: took {m} records, only {n} before its barrier")
            elif c in acknowledged and state != rs[m:n]:
                out.append(f"checkpoint {c} channel {k}: channel state {state} != records m+1..n {rs[m:n]}")
            elif c in acknowledged and state and not unaligned:
                out.append(f"checkpoint {c} channel {k}: aligned snapshot with channel state {state}")
    return out

"""What each kind of subtask acknowledges, typed: the ``state`` of a :class:`~.types.SubtaskAck`.

A checkpoint stores each subtask's state as a small JSON-able dict (the store keeps dicts, and
checkpoints stored by every earlier version must still read). This module is the one definition
of those dicts: each kind of subtask has a frozen value with one ``to_state()`` (the dict, exactly
as stored) and one ``from_state()`` (the dict back, older stored forms included). The runtime
builds and reads these values; nothing else spells the keys.

- :class:`SourceAckState`: a source subtask's offset (the source's table version read up to), the
  channel-log positions of the checkpoint's barriers and where a restore resumes writing the log;
- :class:`KeyedAckState`: an operator subtask's channel-log cursor, the keyed state it pins
  (:class:`PinnedState`: a state table version and the key groups it covers; none for a
  stateless operator) and, in a cycle, where its barrier went on the feedback log;
- :class:`SinkAckState`: a sink subtask's transactions (its 2PC :class:`~.twophase.SinkSnapshot`).

A restore turns them into positions, one per stage, that the stage applies itself:
:class:`SourcePosition` and :class:`KeyedPosition`.

>>> state = SourceAckState(version=4, next_seq=12, barrier_seq=11, barrier_seqs={0: 11})
>>> state.to_state()["barrier_seqs"]
{'0': 11}
>>> SourceAckState.from_state(state.to_state()) == state
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .keygroups import KeyGroupRange
from .twophase import SinkSnapshot

SINK_STATE_KEY = "twophase"
"""Key under which a 2PC sink subtask stores its :class:`SinkSnapshot` (as a dict) in its ack."""

EVENT_TIME_REFERENCE = "event_time_reference"
"""In a source's ack and resume point: the reference event time of ``StateTtl.max_ahead``."""


@dataclass(frozen=True)
class SourcePosition:
    """Where the source stage goes on from: after table version ``offset`` of the source, writing the
    channel log from position ``next_seq``, with ``time_reference`` (``StateTtl.max_ahead``'s
    reference event time, seconds; None: none yet). The default is a start from scratch."""

    offset: int = -1
    next_seq: int = 0
    time_reference: float | None = None


@dataclass(frozen=True)
class SourceAckState:
    """A source subtask's acknowledged state (every source subtask acks the same one).

    ``version``: the source's table version the checkpoint read up to (the offset); ``next_seq``:
    the channel-log position a restore resumes writing at (past every barrier of the checkpoint);
    ``barrier_seq``: the position of the last of its barriers; ``barrier_seqs``: each source
    subtask's barrier position (they differ with lagging subtasks; None in checkpoints stored
    before lagging subtasks existed); ``event_time_reference``: see :class:`SourcePosition`."""

    version: int
    next_seq: int
    barrier_seq: int
    barrier_seqs: Mapping[int, int] | None = None
    event_time_reference: float | None = None

    @property
    def position(self) -> SourcePosition:
        """Where a restore of this checkpoint resumes the source stage."""
        return SourcePosition(self.version, self.next_seq, self.event_time_reference)

    def to_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"version": self.version, "next_seq": self.next_seq, "barrier_seq": self.barrier_seq}
        if self.barrier_seqs is not None:
            state["barrier_seqs"] = {str(s): p for s, p in self.barrier_seqs.items()}
        state[EVENT_TIME_REFERENCE] = self.event_time_reference
        return state

    @staticmethod
    def offset_in(state: Mapping[str, Any]) -> int | None:
        """The offset (source table version) a source subtask's ack ``state`` names, or None (not
        a source subtask's state). Reads only the offset, so it also reads a state that lacks the
        channel positions (what a reader that shows offsets needs)."""
        version = state.get("version")
        return None if version is None or "table_version" in state else int(version)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> SourceAckState:
        seqs = state.get("barrier_seqs")
        reference = state.get(EVENT_TIME_REFERENCE)
        return cls(
            int(state["version"]), int(state["next_seq"]), int(state["barrier_seq"]),
            None if seqs is None else {int(s): int(p) for s, p in seqs.items()},
            None if reference is None else float(reference),
        )


@dataclass(frozen=True)
class PinnedState:
    """Keyed state as a snapshot pins it: the state table's ``table_version`` (no copy is taken)
    and the ``key_groups`` of it that the snapshotting subtask owned."""

    table_version: int
    key_groups: KeyGroupRange

    def to_state(self) -> dict[str, Any]:
        """Its part of the operator subtask's ack state (:meth:`KeyedAckState.to_state`)."""
        return {"table_version": self.table_version, "key_groups": self.key_groups.to_list()}

    @classmethod
    def held_in(cls, state: Mapping[str, Any]) -> PinnedState | None:
        """The keyed state an operator subtask's ack ``state`` pins, or None (it pins none: a
        stateless operator's)."""
        if "table_version" not in state:
            return None
        lo, hi = state["key_groups"]
        return cls(int(state["table_version"]), KeyGroupRange(int(lo), int(hi)))


@dataclass(frozen=True)
class KeyedAckState:
    """An operator subtask's acknowledged state.

    ``cursor``: the last channel-log position the subtask had read at its snapshot; ``pinned``:
    the keyed state it pinned (None: a stateless operator, nothing pinned); ``feedback_barrier_seq``:
    in a cycle, the feedback-log position of the barrier it forwarded (None: no cycle, or not
    forwarded yet); ``barrier_seqs``: per input channel (numbered across the input edges), the
    log position of the checkpoint's barrier the subtask received on it (the cut ``m`` of each
    channel: every record it logged as channel state was before it; None in checkpoints stored
    before gates recorded them)."""

    cursor: int
    pinned: PinnedState | None = None
    feedback_barrier_seq: int | None = None
    barrier_seqs: Mapping[int, int] | None = None

    def to_state(self) -> dict[str, Any]:
        state: dict[str, Any] = self.pinned.to_state() if self.pinned is not None else {}
        state["cursor"] = self.cursor
        if self.feedback_barrier_seq is not None:
            state["feedback_barrier_seq"] = self.feedback_barrier_seq
        if self.barrier_seqs is not None:
            state["barrier_seqs"] = {str(c): int(p) for c, p in sorted(self.barrier_seqs.items())}
        return state

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> KeyedAckState:
        fb, seqs = state.get("feedback_barrier_seq"), state.get("barrier_seqs")
        return cls(int(state["cursor"]), PinnedState.held_in(state), None if fb is None else int(fb),
                   None if seqs is None else {int(c): int(p) for c, p in seqs.items()})


@dataclass(frozen=True)
class SinkAckState:
    """A sink subtask's acknowledged state: its transactions (the current one, and the pending ones
    the checkpoint owns), as :class:`~.twophase.SinkSnapshot`."""

    snapshot: SinkSnapshot

    def to_state(self) -> dict[str, Any]:
        return {SINK_STATE_KEY: self.snapshot.to_dict()}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> SinkAckState:
        return cls(SinkSnapshot.from_dict(state[SINK_STATE_KEY]))

    @classmethod
    def held_in(cls, state: Mapping[str, Any]) -> SinkAckState | None:
        """The sink state ``state`` holds, or None (not a sink subtask's)."""
        return cls.from_state(state) if SINK_STATE_KEY in state else None


@dataclass(frozen=True)
class KeyedPosition:
    """Where the keyed stage goes on from after a restore: channel-log ``cursor`` (the last position
    read), the state table at ``state_version`` (-1: a stateless operator), and per sink, per
    subtask, the :class:`SinkSnapshot` its transactions continue from (None: a subtask the
    checkpoint did not have, which starts afresh). The feedback log of a cycle starts empty."""

    cursor: int
    state_version: int
    sinks: Mapping[str, tuple[SinkSnapshot | None, ...]] = field(default_factory=dict)

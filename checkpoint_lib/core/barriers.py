"""Per-subtask barrier handlers: aligned, unaligned, aligned-with-timeout and the tracker.

A handler sits between a subtask's input channels (numbered ``0 .. n-1``) and its operator. The
runtime feeds it what each channel delivers, in the order it arrives:

- ``on_record(channel, record)``, ``on_barrier(channel, barrier)``, ``on_end_of_channel(channel)``
- ``on_timer()`` (lets aligned-with-timeout switch to unaligned when no event arrives)
- ``on_checkpoint_aborted(checkpoint_id)`` (the coordinator aborted a checkpoint)

and carries out the returned effects, in order:

- :class:`Deliver`: give the record to the operator;
- :class:`TakeSnapshot`: snapshot the operator's state for the barrier's checkpoint;
- :class:`ForwardBarrier`: emit the barrier on every output channel;
- :class:`LogChannelState`: persist the record as channel state of a checkpoint (unaligned);
- :class:`ChannelStateComplete`: a channel's part of a checkpoint's channel state is complete;
- :class:`CheckpointDone`: everything of the checkpoint is captured; acknowledge it;
- :class:`DeclineCheckpoint`: this subtask gives the checkpoint up (tell the coordinator).

Records are opaque: a single row in the simulator, a segment of a Delta channel log (a range of
positions) in the Spark runtime.

Rules common to all modes (BRIEF.md): barrier ids on one channel increase strictly (a repeated or
backwards barrier is a corrupt stream, :class:`~.errors.CorruptStreamError`), nothing may follow a
channel's end, and a barrier lower than the newest checkpoint this subtask has started is ignored.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Mapping, TypeVar, Union

from .clock import Clock
from .errors import CorruptStreamError, FailureReason
from .types import Barrier, BarrierMode, CheckpointId

R = TypeVar("R")


# --- effects -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Deliver(Generic[R]):
    channel: int
    record: R


@dataclass(frozen=True)
class TakeSnapshot:
    barrier: Barrier
    unaligned: bool = False
    alignment_s: float = 0.0

    @property
    def checkpoint_id(self) -> CheckpointId:
        return self.barrier.checkpoint_id


@dataclass(frozen=True)
class ForwardBarrier:
    barrier: Barrier


@dataclass(frozen=True)
class LogChannelState(Generic[R]):
    checkpoint_id: CheckpointId
    channel: int
    record: R


@dataclass(frozen=True)
class ChannelStateComplete:
    checkpoint_id: CheckpointId
    channel: int


@dataclass(frozen=True)
class CheckpointDone:
    checkpoint_id: CheckpointId


@dataclass(frozen=True)
class DeclineCheckpoint:
    checkpoint_id: CheckpointId
    reason: FailureReason


Effect = Union[
    Deliver, TakeSnapshot, ForwardBarrier, LogChannelState, ChannelStateComplete, CheckpointDone,
    DeclineCheckpoint,
]

_RECORD, _BARRIER, _END = "record", "barrier", "end"


# --- alignment state objects (aligned and aligned-with-timeout) -----------------------------------


@dataclass
class _Collecting:
    """Aligning ``barrier``: ``received`` channels delivered it and are blocked."""

    barrier: Barrier
    started_at: float
    received: set[int] = field(default_factory=set)


@dataclass
class _Logging:
    """Unaligned checkpoint snapshotted; ``awaiting`` channels have not delivered its barrier yet."""

    barrier: Barrier
    awaiting: set[int]


class BarrierHandler:
    """One subtask's barrier handling. Build it with :func:`create_handler`."""

    def __init__(
        self,
        num_channels: int,
        mode: BarrierMode,
        clock: Clock,
        *,
        alignment_timeout: float | None = None,
        max_tracked: int = 50,
    ):
        if num_channels < 1:
            raise ValueError(f"a subtask needs at least one input channel, got {num_channels}")
        if mode is BarrierMode.ALIGNED_WITH_TIMEOUT:
            if alignment_timeout is None or alignment_timeout < 0:
                raise ValueError("aligned_with_timeout needs alignment_timeout >= 0 seconds")
        elif alignment_timeout is not None:
            raise ValueError(f"alignment_timeout only applies to aligned_with_timeout, not {mode.value}")
        if max_tracked < 1:
            raise ValueError(f"max_tracked must be >= 1, got {max_tracked}")
        self.num_channels = num_channels
        self.mode = mode
        self.clock = clock
        self.alignment_timeout = alignment_timeout
        self.max_tracked = max_tracked
        # arrival bookkeeping (checked when an event arrives, held or not)
        self._last_barrier: dict[int, CheckpointId] = {}
        self._arrived_end: set[int] = set()
        # processing bookkeeping
        self.ended: set[int] = set()
        self.latest_started: CheckpointId = 0
        self.blocked: set[int] = set()
        self._held: deque[tuple[int, str, Any]] = deque()
        self._collecting: _Collecting | None = None
        self._logging: dict[CheckpointId, _Logging] = {}
        self._tracked: OrderedDict[CheckpointId, tuple[Barrier, set[int]]] = OrderedDict()

    # public events ----------------------------------------------------------------------------

    def on_record(self, channel: int, record: Any) -> list[Effect]:
        self._arrive(channel, _RECORD, record)
        return self._dispatch(channel, _RECORD, record)

    def on_barrier(self, channel: int, barrier: Barrier) -> list[Effect]:
        self._arrive(channel, _BARRIER, barrier)
        return self._dispatch(channel, _BARRIER, barrier)

    def on_end_of_channel(self, channel: int) -> list[Effect]:
        self._arrive(channel, _END, None)
        return self._dispatch(channel, _END, None)

    def on_timer(self) -> list[Effect]:
        return self._check_alignment_timeout()

    def on_checkpoint_aborted(self, checkpoint_id: CheckpointId) -> list[Effect]:
        """The coordinator aborted ``checkpoint_id``: stop aligning or logging for it."""
        effects: list[Effect] = []
        self.latest_started = max(self.latest_started, checkpoint_id)
        if self._collecting and self._collecting.barrier.checkpoint_id == checkpoint_id:
            self._collecting = None
            effects += self._release()
        self._logging.pop(checkpoint_id, None)
        self._tracked.pop(checkpoint_id, None)
        return effects

    # introspection ----------------------------------------------------------------------------

    @property
    def aligning(self) -> CheckpointId | None:
        return self._collecting.barrier.checkpoint_id if self._collecting else None

    @property
    def logging_channel_state(self) -> dict[CheckpointId, frozenset[int]]:
        return {c: frozenset(l.awaiting) for c, l in self._logging.items()}

    @property
    def tracked(self) -> list[CheckpointId]:
        return list(self._tracked)

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def held_records(self) -> list[Any]:
        """The records held (aligned mode), in arrival order: still to be delivered."""
        return [payload for _, kind, payload in self._held if kind == _RECORD]

    @property
    def finished(self) -> bool:
        return len(self.ended) == self.num_channels

    # arrival checks ---------------------------------------------------------------------------

    def _arrive(self, channel: int, kind: str, payload: Any) -> None:
        if not 0 <= channel < self.num_channels:
            raise ValueError(f"channel {channel} out of range 0..{self.num_channels - 1}")
        if channel in self._arrived_end:
            raise CorruptStreamError(f"channel {channel} delivered a {kind} after its end")
        if kind == _BARRIER:
            last = self._last_barrier.get(channel, 0)
            if payload.checkpoint_id == last:
                raise CorruptStreamError(
                    f"channel {channel} delivered the barrier of checkpoint {last} twice"
                )
            if payload.checkpoint_id < last:
                raise CorruptStreamError(
                    f"channel {channel} delivered barrier {payload.checkpoint_id} after barrier {last}"
                )
            self._last_barrier[channel] = payload.checkpoint_id
        elif kind == _END:
            self._arrived_end.add(channel)

    # processing -------------------------------------------------------------------------------

    def _dispatch(self, channel: int, kind: str, payload: Any) -> list[Effect]:
        effects = self._check_alignment_timeout()
        if channel in self.blocked:
            self._held.append((channel, kind, payload))
            return effects
        return effects + self._process(channel, kind, payload)

    def _process(self, channel: int, kind: str, payload: Any) -> list[Effect]:
        if kind == _RECORD:
            effects: list[Effect] = [
                LogChannelState(c, channel, payload)
                for c, log in self._logging.items()
                if channel in log.awaiting
            ]
            effects.append(Deliver(channel, payload))
            return effects
        if kind == _END:
            self.ended.add(channel)
            return self._channel_finished_for_logging(channel, None) + self._on_end_alignment()
        if self.mode is BarrierMode.AT_LEAST_ONCE:
            return self._track(channel, payload)
        return self._exactly_once_barrier(channel, payload)

    # exactly-once modes -----------------------------------------------------------------------

    def _exactly_once_barrier(self, channel: int, barrier: Barrier) -> list[Effect]:
        cid = barrier.checkpoint_id
        effects = self._channel_finished_for_logging(channel, cid)
        collecting = self._collecting
        if collecting is not None and cid == collecting.barrier.checkpoint_id:
            collecting.received.add(channel)
            self.blocked.add(channel)
            return effects + self._maybe_aligned()
        if collecting is not None and cid > collecting.barrier.checkpoint_id:
            # A newer barrier while aligning: abandon the older checkpoint, release everything,
            # then handle this barrier as the first of the new one. Checked before the ids already
            # started: the coordinator may have aborted the newer checkpoint already, and its
            # barrier still tells that this channel will never deliver the older one.
            abandoned = collecting.barrier.checkpoint_id
            self._collecting = None
            effects.append(DeclineCheckpoint(abandoned, FailureReason.ALIGNMENT_ABANDONED))
            effects += self._release()
            return effects + self._process(channel, _BARRIER, barrier)
        if cid <= self.latest_started:
            return effects  # lower id (or a checkpoint already logging or aborted): ignored
        self.latest_started = cid
        if self.mode is BarrierMode.UNALIGNED:
            return effects + self._snapshot_unaligned(barrier, {channel}, 0.0)
        self._collecting = _Collecting(barrier, self.clock.now(), {channel})
        self.blocked.add(channel)
        # An alignment timeout of 0 means "unaligned from the first barrier on".
        return effects + (self._maybe_aligned() or self._check_alignment_timeout())

    def _maybe_aligned(self) -> list[Effect]:
        collecting = self._collecting
        assert collecting is not None
        if len(collecting.received | self.ended) < self.num_channels:
            return []
        self._collecting = None
        barrier = collecting.barrier
        effects: list[Effect] = [
            TakeSnapshot(barrier, False, self.clock.now() - collecting.started_at),
            ForwardBarrier(barrier),
            CheckpointDone(barrier.checkpoint_id),
        ]
        return effects + self._release()

    def _on_end_alignment(self) -> list[Effect]:
        if self._collecting is None:
            return self._track_end() if self.mode is BarrierMode.AT_LEAST_ONCE else []
        return self._maybe_aligned()

    def _check_alignment_timeout(self) -> list[Effect]:
        collecting = self._collecting
        if collecting is None or self.mode is not BarrierMode.ALIGNED_WITH_TIMEOUT:
            return []
        assert self.alignment_timeout is not None
        waited = self.clock.now() - collecting.started_at
        if waited < self.alignment_timeout:
            return []
        self._collecting = None
        effects = self._snapshot_unaligned(collecting.barrier, collecting.received, waited)
        return effects + self._release()

    def _snapshot_unaligned(self, barrier: Barrier, received: set[int], waited: float) -> list[Effect]:
        awaiting = set(range(self.num_channels)) - received - self.ended
        effects: list[Effect] = [
            TakeSnapshot(barrier, True, waited),
            ForwardBarrier(barrier),
        ]
        if awaiting:
            self._logging[barrier.checkpoint_id] = _Logging(barrier, awaiting)
        else:
            effects.append(CheckpointDone(barrier.checkpoint_id))
        return effects

    def _channel_finished_for_logging(self, channel: int, cid: CheckpointId | None) -> list[Effect]:
        """``channel`` delivered barrier ``cid`` (or ended, when ``cid`` is None)."""
        effects: list[Effect] = []
        for checkpoint_id in sorted(self._logging):
            log = self._logging[checkpoint_id]
            if channel in log.awaiting and (cid is None or checkpoint_id <= cid):
                log.awaiting.discard(channel)
                effects.append(ChannelStateComplete(checkpoint_id, channel))
                if not log.awaiting:
                    del self._logging[checkpoint_id]
                    effects.append(CheckpointDone(checkpoint_id))
        return effects

    def _release(self) -> list[Effect]:
        """Unblock every channel and process what was held, in arrival order."""
        self.blocked.clear()
        held, self._held = self._held, deque()
        effects: list[Effect] = []
        while held:
            channel, kind, payload = held.popleft()
            if channel in self.blocked:  # a held barrier started a new alignment
                self._held.append((channel, kind, payload))
                continue
            effects += self._process(channel, kind, payload)
        return effects

    # at-least-once (tracker) ------------------------------------------------------------------

    def _track(self, channel: int, barrier: Barrier) -> list[Effect]:
        cid = barrier.checkpoint_id
        if cid <= self.latest_started:
            return []
        seen = self._tracked.get(cid)
        if seen is None:
            seen = (barrier, set())
            self._tracked[cid] = seen
            self._tracked = OrderedDict(sorted(self._tracked.items()))
            while len(self._tracked) > self.max_tracked:
                self._tracked.popitem(last=False)  # too many pending: forget the oldest
            if cid not in self._tracked:
                return []
        seen[1].add(channel)
        return self._track_end()

    def _track_end(self) -> list[Effect]:
        complete = [
            cid for cid, (_, seen) in self._tracked.items()
            if len(seen | self.ended) >= self.num_channels
        ]
        if not complete:
            return []
        cid = max(complete)
        barrier = self._tracked[cid][0]
        for older in [c for c in self._tracked if c <= cid]:
            del self._tracked[older]
        # Never backwards: an abort may have moved it past ``cid`` (an end of channel completes an
        # older checkpoint after the coordinator aborted a newer one).
        self.latest_started = max(self.latest_started, cid)
        return [TakeSnapshot(barrier), ForwardBarrier(barrier), CheckpointDone(cid)]


def carry_out(effects: Mapping[int, list[Effect]], effect: Callable[[int, Effect], None],
              flush: Callable[[], None], snapshot: Callable[[int, TakeSnapshot], None]) -> None:
    """Carry out the handlers' ``effects`` (subtask -> its effects, in order) with Spark work
    batched: every subtask's effects up to its next :class:`TakeSnapshot` (``effect(subtask, e)``),
    then one ``flush()`` of what was delivered, then those snapshots (``snapshot(subtask, e)``),
    and so on; a last ``flush()`` at the end. A snapshot thus sees every delivery before it, and
    none after it, of its subtask. The one order the runtime's stages and gates share."""
    queues = {r: deque(es) for r, es in effects.items()}
    while any(queues.values()):
        for r, q in queues.items():
            while q and not isinstance(q[0], TakeSnapshot):
                effect(r, q.popleft())
        snapping = [r for r, q in queues.items() if q and isinstance(q[0], TakeSnapshot)]
        if snapping:
            flush()
            for r in snapping:
                snapshot(r, queues[r].popleft())
    flush()


def create_handler(
    num_channels: int,
    mode: BarrierMode | str,
    clock: Clock,
    *,
    alignment_timeout: float | None = None,
    max_tracked: int = 50,
) -> BarrierHandler:
    """Build the handler for ``mode`` (a :class:`BarrierMode` or its value, e.g. ``"aligned"``)."""
    try:
        mode = BarrierMode(mode)
    except ValueError:
        modes = ", ".join(m.value for m in BarrierMode)
        raise ValueError(f"unknown barrier mode {mode!r}; expected one of: {modes}") from None
    return BarrierHandler(
        num_channels, mode, clock, alignment_timeout=alignment_timeout, max_tracked=max_tracked
    )

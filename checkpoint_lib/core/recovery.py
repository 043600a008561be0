"""Recovery planning: from the completed checkpoints to what must be restored, replayed,
re-committed and aborted. Pure: the adapters list what exists and carry the plan out."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Sequence

from .acks import SINK_STATE_KEY, PinnedState, SinkAckState
from .checkpoints import CompletedCheckpoint
from .errors import NoCheckpointError, SnapshotIncompatibleError, UnknownCheckpointError
from .twophase import SinkRecovery, Transaction, recover
from .types import CheckpointId, SubtaskId

__all__ = ["SINK_STATE_KEY", "RecoveryPlan", "check_fits", "choose_checkpoint", "owned_transactions", "plan_recovery"]
# SINK_STATE_KEY is defined in .acks, and still importable from here (the Delta store reads it here).


@dataclass(frozen=True)
class RecoveryPlan:
    checkpoint: CompletedCheckpoint | None
    """The checkpoint to restore; None means start from scratch (nothing completed yet)."""
    new_epoch: int
    """The attempt that recovers; every writer of an older epoch is fenced."""
    restore: Mapping[SubtaskId, Mapping[str, Any]]
    """Each subtask's state handle."""
    replay_channel_state: tuple[SubtaskId, ...]
    """Subtasks with channel state to replay before reading their inputs."""
    sinks: Mapping[SubtaskId, SinkRecovery] = field(default_factory=dict)
    orphans: tuple[Transaction, ...] = ()
    """Open transactions no restored sink subtask knows of: aborted too."""
    rollback_after: CheckpointId | None = None
    """Set when restoring an older checkpoint than the latest completed one (readable or not):
    sinks must undo what checkpoints after it committed (Delta: restore the sink table to its
    version at this checkpoint), or the replay would commit those records a second time. 0 (no
    checkpoint id) means back to before the first checkpoint committed anything."""

    @property
    def checkpoint_id(self) -> CheckpointId | None:
        return self.checkpoint.checkpoint_id if self.checkpoint else None

    @property
    def recommit(self) -> list[Transaction]:
        return [t for s in self.sinks.values() for t in s.recommit]

    def recommit_of(self, sink: str) -> list[Transaction]:
        """What the restored checkpoint owns of sink ``sink`` (every subtask's), oldest first."""
        return sorted(t for s, rec in self.sinks.items() if s.sink == sink for t in rec.recommit)

    @property
    def abort(self) -> list[Transaction]:
        return sorted({t.handle: t for s in self.sinks.values() for t in s.abort}.values()) + list(
            self.orphans
        )

    def to_dict(self) -> dict[str, Any]:
        """The plan for machines (``ckpt recover --dry-run -o json``): plain JSON-able values."""
        c = self.checkpoint
        return {
            "checkpoint_id": self.checkpoint_id,
            "kind": c.kind.value if c else None,
            "completed_at": c.completion_time if c else None,
            "new_epoch": self.new_epoch,
            "restore": {str(s): dict(self.restore[s]) for s in sorted(self.restore)},
            "replay_channel_state": [str(s) for s in self.replay_channel_state],
            "recommit": [{"handle": t.handle, "checkpoint_id": t.checkpoint_id} for t in self.recommit],
            "abort": [t.handle for t in self.abort],
            "rollback_after": self.rollback_after,
        }

    def describe(self) -> str:
        """A human-readable plan (what a dry run prints)."""
        if self.checkpoint is None:
            head = f"no completed checkpoint: start from scratch as epoch {self.new_epoch}"
        else:
            c = self.checkpoint
            head = (
                f"restore {c.kind.value} {c.checkpoint_id} (completed "
                f"{datetime.fromtimestamp(c.completion_time, timezone.utc):%Y-%m-%d %H:%M:%S} UTC) "
                f"as epoch {self.new_epoch}"
            )
        lines = [head]
        for subtask in sorted(self.restore):
            lines.append(f"  restore {subtask}: {dict(self.restore[subtask])}")
        for subtask in self.replay_channel_state:
            lines.append(f"  replay channel state of {subtask}")
        for txn in self.recommit:
            lines.append(f"  re-commit {txn.handle} (checkpoint {txn.checkpoint_id})")
        for txn in self.abort:
            lines.append(f"  abort {txn.handle}")
        if self.rollback_after is not None:
            lines.append(f"  roll sinks back to what checkpoint {self.rollback_after} committed")
        return "\n".join(lines)


def choose_checkpoint(
    completed: Sequence[CompletedCheckpoint], checkpoint_id: CheckpointId | None = None
) -> CompletedCheckpoint | None:
    """The named checkpoint, or the latest completed one (None when there is none)."""
    if checkpoint_id is None:
        return max(completed, key=lambda c: c.checkpoint_id, default=None)
    for c in completed:
        if c.checkpoint_id == checkpoint_id:
            return c
    known = sorted(c.checkpoint_id for c in completed)
    raise UnknownCheckpointError(
        f"checkpoint {checkpoint_id} is not a retained completed checkpoint; known: {known or 'none'}"
    )


def owned_transactions(checkpoint: CompletedCheckpoint) -> dict[str, list[Transaction]]:
    """Per sink, what completed ``checkpoint`` owns (:attr:`SinkSnapshot.owned` of each of its
    subtasks' snapshots), oldest first: what committing it commits and restoring it re-commits."""
    owned: dict[str, list[Transaction]] = {}
    for subtask, ack in sorted(checkpoint.acks.items()):
        if subtask.sink is not None and (sink := SinkAckState.held_in(ack.state)) is not None:
            owned.setdefault(subtask.sink, []).extend(sink.snapshot.owned)
    return {name: sorted(set(txns)) for name, txns in owned.items()}


def plan_recovery(
    completed: Sequence[CompletedCheckpoint],
    *,
    current_epoch: int,
    checkpoint_id: CheckpointId | None = None,
    open_transactions: Iterable[Transaction] = (),
    require_checkpoint: bool = False,
    unreadable: Iterable[CheckpointId] = (),
) -> RecoveryPlan:
    """Plan recovery to ``checkpoint_id`` (default: the latest completed checkpoint).

    ``unreadable``: ids of checkpoints recorded as completed whose record cannot be read (a
    corrupt metadata entry). They cannot be restored, but they did complete, so their sinks may
    have committed: restoring anything older rolls the sinks back to it, exactly as restoring an
    older checkpoint on purpose does (with nothing readable at all, back to before the first
    checkpoint, ``rollback_after == 0``), or the replay would commit those records twice."""
    chosen = choose_checkpoint(completed, checkpoint_id)
    above = max(unreadable, default=None)
    if chosen is None and require_checkpoint:
        raise NoCheckpointError("there is no completed checkpoint to recover from")
    open_txns = list(open_transactions)
    new_epoch = current_epoch + 1
    if chosen is None:
        return RecoveryPlan(None, new_epoch, {}, (), {}, tuple(sorted(open_txns)), 0 if above is not None else None)
    sinks: dict[SubtaskId, SinkRecovery] = {}
    for subtask, ack in chosen.acks.items():
        if (sink := SinkAckState.held_in(ack.state)) is not None:
            snapshot = sink.snapshot
            prefix = snapshot.current.txn_id.rsplit("-", 1)[0]
            mine = [t for t in open_txns if t.txn_id.rsplit("-", 1)[0] == prefix]
            sinks[subtask] = recover(snapshot, mine)
    known = {t.handle for s in sinks.values() for t in (*s.recommit, *s.abort)}
    orphans = tuple(sorted(t for t in open_txns if t.handle not in known))
    replay = tuple(sorted(s for s, a in chosen.acks.items() if a.channel_state_rows > 0))
    restore = {s: a.state for s, a in chosen.acks.items()}
    latest = max(c.checkpoint_id for c in completed)
    if above is not None:
        latest = max(latest, above)
    rollback = chosen.checkpoint_id if chosen.checkpoint_id < latest else None
    return RecoveryPlan(chosen, new_epoch, restore, replay, sinks, orphans, rollback)


def check_fits(
    checkpoint: CompletedCheckpoint,
    subtasks: Iterable[SubtaskId],
    *,
    keyed_operator: str | Iterable[str],
    max_parallelism: int,
    partitioning: str,
    allow_non_restored_state: bool = False,
) -> list[str]:
    """Whether ``checkpoint`` can be restored into a pipeline of ``subtasks``: operators must match
    by stable uid (a new one starts empty; state of a removed one is dropped only when allowed).
    Parallelism may differ: restoring then *rescales* (keyed state is redistributed by key group, as
    Flink does; the sources' offsets are shared by all their subtasks; sink transactions of every
    old subtask are re-committed), unless the key-group count changed, the snapshot's key groups do
    not cover ``0..max_parallelism - 1`` (keys would restore without state), or in-flight channel
    state cannot be re-routed (broadcast and forward edges). Returns the rescalings (``"op 5 -> 3"``)
    and the new operators; raises :class:`SnapshotIncompatibleError` listing every problem."""
    have = Counter(s.operator for s in checkpoint.acks)
    want = Counter(s.operator for s in subtasks)
    problems, notes, rescaled = [], [], []
    for op, n in sorted(want.items()):
        if op not in have:
            notes.append(f"operator {op!r} is not in the snapshot (new operator: starts empty)")
        elif have[op] != n:
            rescaled.append(f"{op} {have[op]} -> {n}")
    removed = sorted(set(have) - set(want))
    if removed and not allow_non_restored_state:
        problems.append(
            f"the snapshot holds state of removed operators {removed}: pass --allow-non-restored-state to drop it"
        )
    for keyed in ((keyed_operator,) if isinstance(keyed_operator, str) else tuple(keyed_operator)):
        pinned = [PinnedState.held_in(ack.state) for sid, ack in checkpoint.acks.items() if sid.operator == keyed]
        spans = [p.key_groups for p in pinned if p is not None]
        if not spans:
            continue
        top = max(kg.end for kg in spans)
        if top >= max_parallelism:
            problems.append(
                f"operator {keyed!r} was snapshotted with more key groups than max parallelism "
                f"{max_parallelism}: its state cannot be split that way"
            )
        elif top < max_parallelism - 1:
            problems.append(
                f"operator {keyed!r}: the snapshot's key groups end at {top}, not at "
                f"{max_parallelism - 1} (max parallelism {max_parallelism}): the keys of groups "
                f"{top + 1}..{max_parallelism - 1} would restore without state"
            )
    if rescaled and any(checkpoint.acks[s].channel_state_rows > 0 for s in checkpoint.acks) \
            and partitioning in ("broadcast", "forward"):
        problems.append(
            f"checkpoint {checkpoint.checkpoint_id} holds in-flight channel state on a {partitioning} edge, "
            "which cannot be re-routed to a new parallelism: restore it at its own parallelism first"
        )
    if problems:
        raise SnapshotIncompatibleError(
            f"checkpoint {checkpoint.checkpoint_id} does not fit the pipeline:\n  - " + "\n  - ".join(problems + notes)
        )
    return rescaled + notes

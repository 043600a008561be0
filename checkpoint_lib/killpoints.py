"""Kill points: where the crash and chaos tests stop a running process, precisely.

A process passes named points (:data:`KILL_PHASES`) as it works. With ``CKPT_KILL_AT=phase:n`` it
SIGKILLs itself the n-th time it reaches ``phase``; with ``CKPT_PAUSE_AT=phase:n`` it SIGSTOPs
itself there instead (a stalled zombie that keeps everything in memory until it gets SIGCONT);
with ``CKPT_PHASE_TRACE=file`` it appends ``phase n`` to ``file`` at every point, so a kill from
outside at a random instant can be attributed to the phase it interrupted. Unset, a point costs
one comparison. Pure: the standard library only.
"""

from __future__ import annotations

import os
import signal
from collections import defaultdict
from typing import Mapping

KILL_PHASES = (
    "source_read", "dlq", "channel_write", "source_ack", "flush_stage", "flush_merge", "state_run", "state_compact",
    "snapshot", "ack", "channel_state", "complete", "commit", "sink_commit", "recover", "rollback",
    "restore", "feedback_write", "validate", "fence",
    # inside a transactional database sink's commit: after one prepared transaction is committed
    # (the next subtask's not yet), after one is rolled back (the next not yet)
    "prepared_commit", "prepared_rollback",
    # inside a database sink's subtask write, after it read the fence and before it stages or
    # prepares: counted by the driver per flush (acted on by the Spark task's process) and per
    # transaction it prepares itself at a barrier (pause: a zombie)
    "prepare",
)
KILL_AT, PAUSE_AT, PHASE_TRACE = "CKPT_KILL_AT", "CKPT_PAUSE_AT", "CKPT_PHASE_TRACE"


def parse(value: str | None, variable: str = KILL_AT) -> tuple[str, int] | None:
    """``"phase:n"`` (``n`` defaults to 1) as ``(phase, n)``; None for unset. A phase that is not
    one of :data:`KILL_PHASES` is refused, so a typo never silently kills nothing."""
    if not value:
        return None
    phase, _, n = value.partition(":")
    if phase not in KILL_PHASES:
        raise ValueError(f"{variable} phase must be one of {', '.join(KILL_PHASES)}, got {phase!r}")
    return phase, int(n or 1)


class KillPoints:
    """The kill points of one process, as its environment sets them."""

    def __init__(self, environ: Mapping[str, str] | None = None):
        env = os.environ if environ is None else environ
        self.kill_at = parse(env.get(KILL_AT), KILL_AT)
        self.pause_at = parse(env.get(PAUSE_AT), PAUSE_AT)
        self.trace = env.get(PHASE_TRACE) or None
        self.counts: dict[str, int] = defaultdict(int)

    def reached(self, phase: str) -> None:
        """Count ``phase``; trace it, then SIGKILL or SIGSTOP this process when asked to here."""
        act(self.due(phase))

    def due(self, phase: str) -> int | None:
        """Count ``phase`` and trace it; the signal to send when asked to stop here (SIGKILL,
        SIGSTOP), else None. For a point another process acts on (a Spark task's, :func:`act`)."""
        if self.kill_at is None and self.trace is None and self.pause_at is None:
            return None
        self.counts[phase] += 1
        if self.trace is not None:
            with open(self.trace, "a") as f:
                f.write(f"{phase} {self.counts[phase]}\n")
        if self.kill_at == (phase, self.counts[phase]):
            return signal.SIGKILL
        if self.pause_at == (phase, self.counts[phase]):
            return signal.SIGSTOP  # a stalled zombie until SIGCONT
        return None


def act(sig: int | None) -> None:
    """In the process that does the work of a point counted elsewhere (:meth:`KillPoints.due`):
    send ``sig`` to itself, if any."""
    if sig is not None:
        os.kill(os.getpid(), sig)

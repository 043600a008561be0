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
    "source_read", "dlq", "channel_write", "source_ack", "flush_stage", "flush_merge", "state_compact",
    "snapshot", "ack", "channel_state", "complete", "commit", "sink_commit", "recover", "rollback",
    "restore", "feedback_write", "validate", "fence",
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
        if self.kill_at is None and self.trace is None and self.pause_at is None:
            return
        self.counts[phase] += 1
        if self.trace is not None:
            with open(self.trace, "a") as f:
                f.write(f"{phase} {self.counts[phase]}\n")
        if self.kill_at == (phase, self.counts[phase]):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.pause_at == (phase, self.counts[phase]):
            os.kill(os.getpid(), signal.SIGSTOP)  # a stalled zombie until SIGCONT

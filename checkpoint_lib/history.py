"""Rendering checkpoint histories for people (tables) and machines (JSON-able dicts)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Iterable, Sequence

from .core.checkpoints import CompletedCheckpoint
from .core.types import CheckpointStatus


def checkpoint_row(c: CompletedCheckpoint) -> dict:
    return {
        "id": c.checkpoint_id,
        "kind": c.kind.value,
        "status": CheckpointStatus.COMPLETED.value,
        "trigger_time": c.trigger_time,
        "duration_ms": round(c.duration * 1000, 3),
        "subtasks": len(c.acks),
        "state_bytes": c.state_size_bytes,
        "channel_state_rows": sum(a.channel_state_rows for a in c.acks.values()),
        "channel_state_bytes": c.channel_state_bytes,
        "alignment_ms": round(c.alignment_ms, 3),
        "unaligned": c.unaligned,
    }


def with_durations(rows: Sequence[dict]) -> list[dict]:
    """History rows of the store with ``duration_ms`` (completion - trigger) added."""
    out = []
    for r in rows:
        done, start = r.get("completion_time"), r.get("trigger_time")
        out.append({**r, "duration_ms": round((done - start) * 1000, 1) if done and start else None})
    return out


def format_table(rows: Sequence[dict], columns: Iterable[str] | None = None) -> str:
    """A plain fixed-width table (no dependencies): what ``ckpt ... list`` prints."""
    if not rows:
        return "(none)"
    cols = list(columns or rows[0].keys())
    cells = [[_fmt(r.get(c), c) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda values: "  ".join(v.rjust(w) for v, w in zip(values, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths]), *map(line, cells)])


def human_bytes(n: int | float) -> str:
    """``1536`` -> ``1.5 KiB``: a size for people (the one definition: CLI tables, maintenance
    reports, the benchmarks' tables)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{int(n)} B"


def _fmt(value, column: str = "") -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value > 1e9:  # an epoch timestamp: the date too, runs span days
        return datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    if column.endswith("_bytes") and isinstance(value, (int, float)):
        return human_bytes(value)
    if isinstance(value, float):
        return f"{value:.1f}"
    return "" if value is None else str(value)

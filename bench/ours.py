"""Ours: the payments pipeline on checkpoint_lib, in one barrier mode, with its checkpoint figures."""

from __future__ import annotations

import shutil
from pathlib import Path
import statistics
import time
from typing import Any

OFF = "off"
"""Checkpointing off: no periodic checkpoint (interval 10^9 s). The sinks commit by two-phase
commit, so one checkpoint still comes at the first step and one at the end."""
UNCHAINED = "aligned_unchained"
"""Aligned with the stages not chained (``--no-chaining``): every record goes through the persisted
channel log, as when the source and keyed stages run as separate processes (the ``<p>_run`` DAG)."""


def copy_landing(src_warehouse: str, dst_warehouse: str) -> None:
    """Every contender reads the same bytes: copy the generated landing table (a file copy; an
    upload of each file when the destination is on an object store)."""
    from checkpoint_lib.files import files_at
    from checkpoint_lib.layout import location
    from checkpoint_lib.objectstore import is_remote

    if not is_remote(dst_warehouse):
        shutil.copytree(f"{src_warehouse}/landing", f"{dst_warehouse}/landing")
        return
    src, dst = Path(src_warehouse, "landing"), location(dst_warehouse) / "landing"
    files = files_at(dst)
    for path in sorted(p for p in src.rglob("*") if p.is_file() and not p.name.endswith(".crc")):
        files.put(dst / path.relative_to(src).as_posix(), path.read_bytes())


def run_ours(spark: Any, warehouse: str, *, mode: str, rows_per_checkpoint: int, lagging_sources: int = 0,
             progress=None) -> dict:
    """Run ``payments`` in ``warehouse`` (its landing table already there) until caught up.
    ``mode`` is a barrier mode, :data:`OFF` or :data:`UNCHAINED`. Returns the run's figures."""
    from checkpoint_lib.core.decider import CheckpointConfig
    from checkpoint_lib.delta.store import DeltaCheckpointStore
    from checkpoint_lib.layout import checkpoint_root
    from checkpoint_lib.pipelines import get
    from checkpoint_lib.spark.runner import PipelineRunner

    interval = 1e9 if mode == OFF else 0.0
    config = CheckpointConfig(interval=interval, max_concurrent=1, timeout=3600, retained=5)
    started = time.monotonic()
    runner = PipelineRunner(
        get("payments"), warehouse, spark, mode="aligned" if mode in (OFF, UNCHAINED) else mode, config=config,
        rows_per_checkpoint=rows_per_checkpoint, lagging_sources=lagging_sources, progress=progress,
        chaining=mode != UNCHAINED,
    )
    summary = runner.run()
    seconds = time.monotonic() - started
    history = DeltaCheckpointStore.open(checkpoint_root(warehouse, "payments")).checkpoints.history()
    done = [r for r in history if r["completion_time"] and r["checkpoint_id"] != summary.final]
    durations = [(r["completion_time"] - r["trigger_time"]) * 1000 for r in done]
    return {
        "seconds": seconds,
        "rows": summary.rows_in,
        "steps": summary.steps,
        "checkpoints": len(summary.completed),
        "median_checkpoint_ms": statistics.median(durations) if durations else 0.0,
        "max_checkpoint_ms": max(durations, default=0.0),
        "median_alignment_ms": statistics.median([r["alignment_ms"] for r in done]) if done else 0.0,
        "channel_state_rows": sum(r["channel_state_rows"] for r in done),
        "channel_state_bytes": sum(r["channel_state_bytes"] for r in done),
        "median_state_bytes": statistics.median([r["state_bytes"] for r in done]) if done else 0,
        "unaligned": sum(1 for r in done if r["unaligned"]),
        "measured_checkpoints": len(done),
        **interval_trend([r["completion_time"] for r in history if r["completion_time"]]),
    }


def interval_trend(completion_times: list[float]) -> dict:
    """Whether a checkpoint interval costs more late in a run than early (tables with longer
    histories): the median time between consecutive checkpoint completions over the first and the
    last tenth of the run, in seconds. Empty with fewer than three checkpoints (checkpointing off)."""
    times = sorted(completion_times)
    gaps = [b - a for a, b in zip(times, times[1:])]
    if len(gaps) < 2:
        return {}
    tenth = max(1, len(gaps) // 10)
    return {"interval_s_first_tenth": statistics.median(gaps[:tenth]),
            "interval_s_last_tenth": statistics.median(gaps[-tenth:])}

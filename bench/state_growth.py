"""Checkpoint duration and snapshot size as keyed state grows, with a fixed number of events per
checkpoint: a snapshot's cost should follow what changed, not the total state.

For each state size A (``--state-sizes``) the landing table holds a first version with one event
per account (``acct-0..A-1``: the state then holds A accounts), then ``--state-checkpoints``
versions of ``--state-events`` events on accounts drawn at random among the A. Ours (aligned, a
checkpoint every ``--state-events`` events, so one per version) runs them in process; its outputs
must equal the floor's. Per A, from the checkpoint history: the bootstrap checkpoint (the A-event
first step), then over the fixed-size checkpoints only (the bootstrap and the final, empty one
excluded) the median duration (trigger to completion: the step's processing, snapshot and commit),
the median ``state_bytes`` (the state table's size a snapshot pins) and the median bytes the state
table gained between two checkpoints' pinned versions (the Parquet files the checkpoint's MERGE
added, from the Delta log with ``deltalake``: what a checkpoint actually wrote).

The landing is written here rather than with ``payments.generate``: ``generate`` draws accounts
at random (a first version of A events would leave about A/e accounts out of the state). Account
numbers are padded as ``generate`` pads them (``account_digits``). Same schema, same event-id scheme
(``b{version}-{n}``, so the floor's offset order holds), no bad rows.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from typing import Any

from checkpoint_lib.core.acks import KeyedAckState
from checkpoint_lib.core.types import CheckpointStatus
from checkpoint_lib.history import human_bytes


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("state growth (bench/state_growth.py)")
    g.add_argument("--skip-state", action="store_true", help="skip the state-growth table")
    g.add_argument("--state-sizes", default="100000,1000000,5000000", help="accounts in state, comma-separated")
    g.add_argument("--state-events", type=int, default=50_000, help="events per checkpoint (default 50,000)")
    g.add_argument("--state-checkpoints", type=int, default=5,
                   help="fixed-size checkpoints measured per state size (default 5)")


QUICK = {"state_sizes": "10000,50000", "state_events": 2_000, "state_checkpoints": 2}


def append_version(spark: Any, warehouse: str, rows: int, *, accounts: int, seed: int, one_each: bool,
                   files: int = 2) -> int:
    """Append one landing version of ``rows`` events: account ``n`` for event ``n`` (``one_each``),
    else accounts drawn at random among ``accounts``. Returns the version written."""
    from pyspark.sql import functions as F

    from checkpoint_lib.delta.log import latest_version
    from checkpoint_lib.pipelines.payments import account_digits

    path = f"{warehouse}/landing/payments"
    previous = latest_version(path)
    batch = 0 if previous is None else previous + 1
    width = account_digits(accounts)
    number = F.col("id") if one_each else F.pmod(F.xxhash64(F.col("id"), F.lit(seed)), F.lit(accounts))
    start = 1_767_225_600 + 86_400 * batch  # 2026-01-01 UTC + one day per version, as generate
    df = spark.range(rows, numPartitions=max(1, files)).select(
        F.concat(F.lit(f"b{batch}-"), F.col("id").cast("string")).alias("event_id"),
        F.concat(F.lit("acct-"), F.lpad(number.cast("string"), width, "0")).alias("account"),
        (F.pmod(F.xxhash64(F.col("id"), F.lit(seed + 1)), F.lit(100_001)) - F.lit(50_000)).cast("long")
        .alias("amount_cents"),
        F.timestamp_seconds(F.lit(start) + F.col("id")).alias("ts"),
    )
    df.write.format("delta").mode("append").save(path)
    return latest_version(path) or 0


def state_sizes(args: argparse.Namespace) -> list[int]:
    sizes = [int(s) for s in str(args.state_sizes).split(",") if s]
    small = [a for a in sizes if a < args.state_events]
    if small:
        raise ValueError(f"--state-sizes {small} are below --state-events {args.state_events}: the first "
                         "version (one event per account) must be a step of its own")
    return sizes


def state_growth(spark: Any, base: str, args: argparse.Namespace, log) -> list[dict]:
    from bench.outputs import check
    from bench.floor import run_floor
    from bench.ours import copy_landing, run_ours

    rows = []
    for accounts in state_sizes(args):
        data = f"{base}/state{accounts}"
        t0 = time.monotonic()
        append_version(spark, data, accounts, accounts=accounts, seed=0, one_each=True)
        for v in range(args.state_checkpoints):
            append_version(spark, data, args.state_events, accounts=accounts, seed=1 + v, one_each=False)
        log(f"state: {accounts:,} accounts + {args.state_checkpoints} x {args.state_events:,} events generated "
            f"in {time.monotonic() - t0:.0f} s")
        floor_out = f"{data}/floor"
        run_floor(spark, f"{data}/landing/payments", floor_out)
        w = f"{data}/ours"
        copy_landing(data, w)
        run = run_ours(spark, w, mode="aligned", rows_per_checkpoint=args.state_events)
        check(spark, floor_out, w, f"ours aligned, {accounts:,} accounts in state")
        figures = checkpoint_figures(spark, w)
        if figures["fixed_checkpoints"] != args.state_checkpoints:
            raise RuntimeError(f"expected {args.state_checkpoints} fixed-size checkpoints, got "
                               f"{figures['fixed_checkpoints']} (one per landing version)")
        rows.append({"accounts": accounts, "events": args.state_events, "seconds": run["seconds"], **figures})
        log(f"  {accounts:,} accounts: median checkpoint {figures['median_checkpoint_ms']:.0f} ms, state "
            f"{figures['median_state_bytes']:,} B, written {figures['median_written_bytes']:,} B per checkpoint")
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)
    return rows


def checkpoint_figures(spark, warehouse: str, pipeline: str = "payments") -> dict:
    """From the checkpoint history of a finished run: the first (bootstrap) checkpoint, and the
    medians of the ones between it and the final checkpoint. The keys are the state's (each key's
    newest run, as a flush reads it), counted in Spark: the table's rows also hold the runs a key
    left behind until the next fold."""
    from deltalake import DeltaTable

    from checkpoint_lib.delta.store import DeltaCheckpointStore
    from checkpoint_lib.layout import checkpoint_root
    from checkpoint_lib.pipelines import get

    from checkpoint_lib.spark.state import state_of

    operator, key = get(pipeline).operator_uid, get(pipeline).key
    root = str(checkpoint_root(warehouse, pipeline))
    store = DeltaCheckpointStore.open(root)
    done = sorted((r for r in store.checkpoints.history() if r["status"] == CheckpointStatus.COMPLETED),
                  key=lambda r: r["checkpoint_id"])
    pinned = {}
    for r in done:
        versions = [KeyedAckState.from_state(a["state"]).pinned.table_version
                    for a in store.checkpoints.acks(r["checkpoint_id"]) if a["operator"] == operator]
        pinned[r["checkpoint_id"]] = max(versions)
    state_path = f"{root}/state/{operator}"
    files = {}  # pinned version -> {file path: size}

    def files_at(version: int) -> dict[str, int]:
        if version not in files:
            actions = DeltaTable(state_path, version=version).get_add_actions(flatten=True)
            files[version] = dict(zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist()))
        return files[version]

    bootstrap, fixed = done[0], done[1:-1]  # the last one is the final checkpoint (no new events)
    written = []
    for prev, cur in zip(done, fixed):
        before, after = files_at(pinned[prev["checkpoint_id"]]), files_at(pinned[cur["checkpoint_id"]])
        written.append(sum(size for path, size in after.items() if path not in before))
    last = pinned[done[-1]["checkpoint_id"]]
    ms = lambda r: (r["completion_time"] - r["trigger_time"]) * 1000  # noqa: E731
    return {
        "state_rows": state_of(spark, state_path, key, version=last).count(),
        "fixed_checkpoints": len(fixed),
        "bootstrap_s": ms(bootstrap) / 1000,
        "bootstrap_state_bytes": int(bootstrap["state_bytes"]),
        "median_checkpoint_ms": statistics.median(ms(r) for r in fixed) if fixed else 0.0,
        "max_checkpoint_ms": max((ms(r) for r in fixed), default=0.0),
        "median_state_bytes": int(statistics.median(r["state_bytes"] for r in fixed)) if fixed else 0,
        "median_written_bytes": int(statistics.median(written)) if written else 0,
    }


def render_state(rows: list[dict]) -> str:
    from bench.markdown import table

    return table(
        ["accounts in state", "events per checkpoint", "median checkpoint (ms)", "max checkpoint (ms)",
         "median state", "written per checkpoint", "written / state", "bootstrap step (s)"],
        [[f"{r['state_rows']:,}", f"{r['events']:,}", f"{r['median_checkpoint_ms']:.0f}",
          f"{r['max_checkpoint_ms']:.0f}", human_bytes(r["median_state_bytes"]), human_bytes(r["median_written_bytes"]),
          f"{r['median_written_bytes'] / r['median_state_bytes']:.2f}" if r["median_state_bytes"] else "",
          f"{r['bootstrap_s']:.1f}"] for r in rows],
    )




def describe(args: argparse.Namespace) -> str:
    return (f"{args.state_checkpoints} checkpoints of {args.state_events:,} events per state size, aligned; "
            "medians over those checkpoints (the bootstrap and the final checkpoint excluded)")

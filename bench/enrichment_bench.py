"""The ``enrichment`` section: the two-input example graph (``checkpoint_lib/pipelines/enrichment.py``)
beside a plain batch job and Structured Streaming as an expert writes it, on the same landing tables.

The data (``enrichment_data.generate``, pandas + delta-rs): ``--enrichment-size`` payment events
in landed versions of ``--enrichment-rows-per-checkpoint`` (K) each, one round of accounts changes
(opens, moves, closes, removals, late changes: a MERGE and a DELETE on the change-data-feed table)
before each, 2% bad rows, 5% of the events landed again, ``--accounts`` accounts. It is generated
once and every contender reads the same bytes:

- **floor** (``bench/enrichment_floor.py``): one plain PySpark batch job, the whole payments table
  and the accounts' whole change feed, the as-of lookup, dedup and totals in one pass, no fault
  tolerance;
- **expert peer** (``bench/enrichment_peer.py``): one ``availableNow`` streaming query, a
  micro-batch per landed version (K events); in ``foreachBatch`` the as-of lookup on the accounts'
  change history read at the batch, dedup against the tagged table, the totals and the tagged rows
  MERGEd, appends stamped with Delta's idempotent ``txnAppId``/``txnVersion``;
- **ours** (``GraphRunner`` on ``enrichment.graph()``, aligned): a step of about K events from
  the payments table and the accounts changes landed before them, a checkpoint every step.

The floor's outputs are checked by the independent verifier's expectations (pandas:
``enrichment_data.expected_enrichment`` / ``compare_rows``, the dead letters counted), then each
other contender's against the floor's in Spark (``exceptAll`` both ways, dead letters by reason),
before its time counts. Times are compared with the floor's and the expert peer's of the same run.
``--contenders`` leaves out the expert peer or ours as in the payments tables; the floor always runs
(the others are checked against it). Each row goes to the results log as section ``enrichment``.
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from bench.enrichment_floor import OUTPUTS

FLOOR = "floor (plain Spark batch)"
EXPERT = "expert peer (foreachBatch: as-of join + MERGE)"
OURS = "ours, aligned"
ORDER = (FLOOR, EXPERT, OURS)
ROUNDS_PER_CALL = 10
"""Rounds (landed versions) per call of the generator: a repeated event copies one of the same
call's, and each call keeps its rows in memory, so a large size is landed in several calls."""


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("enrichment (bench/enrichment_bench.py)")
    g.add_argument("--skip-enrichment", action="store_true", help="skip the enrichment (two-input graph) table")
    g.add_argument("--enrichment-size", type=int, default=1_000_000, help="payment events (default 1,000,000)")
    g.add_argument("--enrichment-rows-per-checkpoint", type=int, default=100_000,
                   help="events per landed version, micro-batch and checkpoint (default 100,000)")


QUICK = {"enrichment_size": 20_000, "enrichment_rows_per_checkpoint": 5_000}


def check_sizes(args: argparse.Namespace) -> None:
    if args.enrichment_size < 1 or args.enrichment_rows_per_checkpoint < 1:
        raise ValueError("--enrichment-size and --enrichment-rows-per-checkpoint must be at least 1")


def generate_landing(warehouse: str, size: int, rows_per_version: int, accounts: int) -> int:
    """``size`` payments in versions of ``rows_per_version`` (the last one may hold fewer), each
    after a round of accounts changes; seeded. Returns the number of payments versions."""
    from checkpoint_lib.pipelines.enrichment_data import generate

    versions = max(1, math.ceil(size / rows_per_version))
    for call, first in enumerate(range(0, versions, ROUNDS_PER_CALL)):
        rounds = min(ROUNDS_PER_CALL, versions - first)
        rows = min(size - first * rows_per_version, rounds * rows_per_version)
        generate(None, warehouse, rows, rounds=rounds, accounts=accounts, commits_per_round=1, seed=call)
    return versions


# --- checking the outputs ----------------------------------------------------------------------

class WrongOutputs(AssertionError):
    pass


def expected_problems(warehouse: str, out: str) -> list[str]:
    """How the outputs under ``out`` differ from what exactly-once processing of the landing tables
    under ``warehouse`` must produce (the verifier's expectations, pandas; empty: exact)."""
    from checkpoint_lib.delta.log import is_delta_table
    from checkpoint_lib.pipelines.enrichment_data import (REGION_TOTALS_SCHEMA, REJECTED_SCHEMA, TAGGED_SCHEMA,
                                                          compare_rows, expected_enrichment)
    from checkpoint_lib.verify import read_delta

    want = expected_enrichment(warehouse)
    problems: list[str] = []

    def read(name: str):
        path = Path(out, OUTPUTS[name])
        return read_delta(path) if is_delta_table(path) else None

    for name, schema, key in (("tagged", TAGGED_SCHEMA, "event_id"), ("region_totals", REGION_TOTALS_SCHEMA, "region"),
                              ("rejected", REJECTED_SCHEMA, None)):
        problems += compare_rows(OUTPUTS[name], read(name), want[name], schema, key=key)
    dlq = read("dead_letters")
    held, bad = 0 if dlq is None else len(dlq), len(want["dead_letters"])
    if held != bad:
        problems.append(f"{OUTPUTS['dead_letters']}: holds {held} rows, expected the {bad} bad landed payments")
    return problems


def diff_outputs(spark: Any, want: str, got: str) -> list[str]:
    """How the outputs under ``got`` differ from those under ``want`` (empty: equal), in Spark:
    tagged, region totals and rejected rows as multisets, dead letters by reason. Only counts
    reach the driver."""
    from pyspark.sql import functions as F

    from checkpoint_lib.pipelines.enrichment_data import REGION_TOTALS_SCHEMA, REJECTED_SCHEMA, TAGGED_SCHEMA

    def load(root: str, name: str):
        return spark.read.format("delta").load(f"{root.rstrip('/')}/{OUTPUTS[name]}")

    problems = []
    for name, schema in (("tagged", TAGGED_SCHEMA), ("region_totals", REGION_TOTALS_SCHEMA),
                         ("rejected", REJECTED_SCHEMA)):
        cols = [n for n, _ in schema]
        a, b = load(want, name).select(*cols), load(got, name).select(*cols)
        missing, extra = a.exceptAll(b).count(), b.exceptAll(a).count()
        if missing or extra:
            problems.append(f"{OUTPUTS[name]}: {missing} rows missing, {extra} rows extra")

    def by_error(df):
        return {r["error"]: r["n"] for r in df.groupBy("error").agg(F.count("*").alias("n")).collect()}

    a, b = by_error(load(want, "dead_letters")), by_error(load(got, "dead_letters"))
    if a != b:
        problems.append(f"{OUTPUTS['dead_letters']}: {b} rows by error, expected {a}")
    return problems


def _raise(problems: list[str], who: str, what: str) -> None:
    if problems:
        raise WrongOutputs(f"{who}: outputs differ from {what}, its time does not count:\n  - "
                           + "\n  - ".join(problems))


# --- ours ----------------------------------------------------------------------------------------

def run_ours(spark: Any, warehouse: str, *, rows_per_checkpoint: int, progress=None) -> dict:
    """``enrichment`` on the graph runner in ``warehouse`` (its landing tables there), aligned, a
    checkpoint every step of about ``rows_per_checkpoint`` events, until caught up."""
    from checkpoint_lib.core.decider import CheckpointConfig
    from checkpoint_lib.delta.store import DeltaCheckpointStore
    from checkpoint_lib.layout import checkpoint_root
    from checkpoint_lib.pipelines.enrichment import graph
    from checkpoint_lib.spark.graph_runner import GraphRunner

    g = graph()
    config = CheckpointConfig(interval=0.0, max_concurrent=1, timeout=3600, retained=5)
    started = time.monotonic()
    summary = GraphRunner(g, warehouse, spark, mode="aligned", rows_per_checkpoint=rows_per_checkpoint,
                          config=config, progress=progress).run()
    seconds = time.monotonic() - started
    history = DeltaCheckpointStore.open(checkpoint_root(warehouse, g.name)).checkpoints.history()
    done = [r for r in history if r["completion_time"] and r["checkpoint_id"] != summary.final]
    durations = [(r["completion_time"] - r["trigger_time"]) * 1000 for r in done]
    return {
        "seconds": seconds,
        "rows": summary.rows_in,  # both sources': payments and accounts changes
        "steps": summary.steps,
        "checkpoints": len(summary.completed),
        "median_checkpoint_ms": statistics.median(durations) if durations else 0.0,
        "max_checkpoint_ms": max(durations, default=0.0),
        "measured_checkpoints": len(done),
    }


# --- the section ---------------------------------------------------------------------------------

def enrichment(spark: Any, base: str, args: argparse.Namespace, log) -> list[dict]:
    """One row per contender, each after its outputs were checked."""
    from bench.enrichment_floor import run_enrichment_floor
    from bench.enrichment_peer import run_enrichment_peer
    from bench.ours import copy_landing
    from bench.work import Work

    size, k, accounts = args.enrichment_size, args.enrichment_rows_per_checkpoint, args.accounts
    config = {"events": size, "rows_per_checkpoint": k, "accounts": accounts}
    data = f"{base}/enrichment-n{size}-k{k}"
    shutil.rmtree(data, ignore_errors=True)  # a stopped run's leftovers: the generator is seeded, regenerate
    t0 = time.monotonic()
    versions = generate_landing(data, size, k, accounts)
    log(f"enrichment: {size:,} events in {versions} versions of {k:,} generated in {time.monotonic() - t0:.0f} s")
    if args.warm_up:
        run_enrichment_floor(spark, data, f"{base}/enrichment-warm-up")  # JIT, Delta's classes: nobody pays them
        shutil.rmtree(f"{base}/enrichment-warm-up", ignore_errors=True)
    rows: list[dict] = []

    floor_out = f"{data}/floor"
    with Work(spark, floor_out) as work:
        figures = run_enrichment_floor(spark, data, floor_out)
    _raise(expected_problems(data, floor_out), "enrichment floor", "the verifier's expectations")
    rows.append({**config, "contender": FLOOR, **figures, **work.figures(steps=1)})
    log(f"  enrichment floor: {figures['seconds']:.1f} s")
    if "expert" in args.contenders:
        out = f"{data}/expert"
        with Work(spark, out) as work:
            figures = run_enrichment_peer(spark, data, out)
        _raise(diff_outputs(spark, floor_out, out), "enrichment expert peer", "the floor's")
        rows.append({**config, "contender": EXPERT, **figures, **work.figures(steps=figures["batches"])})
        log(f"  enrichment expert peer: {figures['seconds']:.1f} s, {figures['batches']} micro-batches")
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    if "ours" in args.contenders:
        w = f"{data}/ours"
        copy_landing(data, w)
        with Work(spark, w) as work:
            figures = run_ours(spark, w, rows_per_checkpoint=k)
        _raise(diff_outputs(spark, floor_out, w), "enrichment ours", "the floor's")
        rows.append({**config, "contender": OURS, "mode": "aligned", **figures, **work.figures(steps=figures["steps"])})
        log(f"  enrichment ours: {figures['seconds']:.1f} s, {figures['checkpoints']} checkpoints")
        if not args.keep:
            shutil.rmtree(w, ignore_errors=True)
    return rows


def with_ratios(rows: list[dict]) -> list[dict]:
    """``rows`` in contender order with ``events_per_s``, ``ratio`` (time / the floor's) and
    ``vs_expert`` (time / the expert peer's; None without one), each against the rows of the same
    configuration."""
    from bench.results import ranked_with_ratios

    return ranked_with_ratios(rows, ORDER, {"ratio": FLOOR, "vs_expert": EXPERT})


def render_enrichment(rows: list[dict]) -> str:
    from bench.markdown import table

    def ratio(value: float | None) -> str:
        return "" if value is None else f"{value:.2f}"

    def per_step(r: dict) -> list[str]:
        if "spark_jobs" not in r:
            return ["", "", ""]
        return [str(r.get("steps", r.get("batches", 1))), f"{r['jobs_per_step']:.1f}", f"{r['commits_per_step']:.1f}"]

    return table(
        ["contender", "events", "time (s)", "events/s", "time / floor", "time / expert peer", "checkpoints",
         "median checkpoint (ms)", "steps", "Spark jobs / step", "Delta commits / step", "outputs exact"],
        [[r["contender"], f"{r['events']:,}", f"{r['seconds']:.1f}", f"{r['events_per_s']:,.0f}", ratio(r["ratio"]),
          ratio(r["vs_expert"]), str(r.get("checkpoints", "")),
          f"{r['median_checkpoint_ms']:.0f}" if "median_checkpoint_ms" in r else "", *per_step(r), "yes"]
         for r in with_ratios(rows)],
    )


def describe(args: argparse.Namespace) -> str:
    k = args.enrichment_rows_per_checkpoint
    versions = max(1, math.ceil(args.enrichment_size / k))
    return (f"enrichment, {args.enrichment_size:,} payment events in {versions} landed versions of {k:,} (a "
            f"micro-batch and a checkpoint each), {args.accounts:,} accounts; the floor checked by the verifier's "
            f"expectations, the others against the floor")

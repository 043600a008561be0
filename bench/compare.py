"""Side-by-side benchmark of the payments pipeline: the floor, the peer and ours, on the same data;
then ours alone: recovery time, state growth, a standalone cluster.

    make bench-quick                       # every section at small sizes: a few minutes on an idle machine
    make bench                             # 1M, 5M and 20M events and the sections below at full size: hours on 2 cores
    .venv/bin/python bench/compare.py --sizes 1000000 --rows-per-checkpoint 100000 --docs docs/benchmarks.md
    .venv/bin/python bench/compare.py --sizes '' --skip-state --skip-cluster --docs docs/benchmarks.md  # one section

Contenders (bench/floor.py, bench/peer.py, bench/ours.py):
- **floor**: one plain PySpark batch job, no fault tolerance;
- **peer**: Spark Structured Streaming, micro-batches of one checkpoint interval, per-account state
  in the RocksDB state store, outputs by foreachBatch with Delta idempotent writes;
- **ours**: checkpoint_lib with checkpointing off, aligned, unaligned and at-least-once, a
  checkpoint every ``--rows-per-checkpoint`` events.

Sections (tables), each written between its ``<!-- bench:NAME -->`` markers:
- ``throughput`` and ``overhead``: every contender at each of ``--sizes``;
- ``skew``: aligned vs unaligned with one lagging source subtask (``--skew-size``, 0 skips it);
- ``recovery`` (bench/recovery.py): a real ``ckpt run`` killed with SIGKILL at 10%, 50% and 90% of
  a checkpoint interval, then the recovery timed as restore + replay (``--recovery-interval``,
  ``--recovery-kills``; ``--skip-recovery``);
- ``state`` (bench/state_growth.py): checkpoint duration, snapshot size and bytes written as keyed
  state grows with fixed events per checkpoint (``--state-sizes``, ``--state-events``,
  ``--state-checkpoints``; ``--skip-state``);
- ``cluster`` (bench/cluster.py): ``spark-submit jobs/run_stage.py`` on a standalone master + 2
  workers started from the pyspark install (``--cluster-size``, ``--cluster-workers``,
  ``--cluster-cores``, ``--cluster-memory``; ``--skip-cluster``).

Every run's outputs are compared with the floor's (of the same landing versions), in Spark (nothing
is collected), before its time counts: a wrong result fails the run. Then the tables are printed,
and with ``--docs`` written into that file between its markers (the rest of the file is kept).
``--quick`` sets small sizes for every option left at its default.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parent.parent)
sys.path.insert(0, ROOT)  # run as a script: bench.* importable

from bench import cluster as cluster_bench  # noqa: E402
from bench import recovery as recovery_bench  # noqa: E402
from bench import state_growth as state_bench  # noqa: E402
from bench.floor import run_floor  # noqa: E402
from bench.ours import OFF, copy_landing, run_ours  # noqa: E402

MODES = (OFF, "aligned", "unaligned", "at_least_once")
FILES_PER_VERSION = 2
SECTIONS = (recovery_bench, state_bench, cluster_bench)  # each: add_arguments, QUICK, its run and render
QUICK = {"sizes": "100000", "rows_per_checkpoint": 25_000, "accounts": 2_000}


class WrongOutputs(AssertionError):
    pass


def diff_outputs(spark: Any, want: str, got: str, *, ledger_order: bool = True) -> list[str]:
    """How the outputs under ``got`` differ from those under ``want`` (empty: equal). Runs in
    Spark; only counts reach the driver. ``ledger_order=False`` ignores ``balance_after_cents``
    (records in flight from a lagging source reach an account in another, equally valid order)."""
    from pyspark.sql import functions as F

    def load(root: str, name: str):
        return spark.read.format("delta").load(f"{root}/{name}")

    problems = []
    ledger_cols = ["event_id", "account", "amount_cents"] + (["balance_after_cents"] if ledger_order else [])
    for name, cols in (("gold/ledger", ledger_cols), ("gold/balances", ["account", "balance_cents", "event_count"])):
        a, b = load(want, name).select(*cols), load(got, name).select(*cols)
        missing, extra = a.exceptAll(b).count(), b.exceptAll(a).count()
        if missing or extra:
            problems.append(f"{name}: {missing} rows missing, {extra} rows extra")
    a, b = load(want, "dlq/payments"), load(got, "dlq/payments")
    by_error = lambda df: {r["error"]: r["n"] for r in df.groupBy("error").agg(F.count("*").alias("n")).collect()}  # noqa: E731
    if by_error(a) != by_error(b):
        problems.append(f"dlq/payments: {by_error(b)} rows by error, expected {by_error(a)}")
    return problems


def generate_landing(spark: Any, warehouse: str, rows: int, rows_per_version: int, accounts: int) -> int:
    from checkpoint_lib.pipelines.payments import generate

    versions = max(1, -(-rows // rows_per_version))
    for v in range(versions):
        n = min(rows_per_version, rows - v * rows_per_version)
        generate(spark, warehouse, n, bad_fraction=0.001, accounts=accounts, seed=v, files=FILES_PER_VERSION)
    return versions


def throughput(spark: Any, base: str, size: int, args: argparse.Namespace, log) -> list[dict]:
    """One size: every contender on the same landing table, verified against the floor."""
    k = args.rows_per_checkpoint
    data = f"{base}/n{size}"
    t0 = time.monotonic()
    versions = generate_landing(spark, data, size, k, args.accounts)
    log(f"{size:,} events in {versions} versions of {k:,} generated in {time.monotonic() - t0:.0f} s")
    landing = f"{data}/landing/payments"
    if args.warm_up:
        run_floor(spark, landing, f"{base}/warm-up")  # JIT, Delta's classes: nobody pays the first run
        shutil.rmtree(f"{base}/warm-up", ignore_errors=True)
    rows: list[dict] = []
    floor_out = f"{data}/floor"
    figures = run_floor(spark, landing, floor_out)
    rows.append({"contender": "floor (plain Spark batch)", **figures})
    log(f"  floor: {figures['seconds']:.1f} s")
    if "peer" in args.contenders:
        from bench.peer import run_peer

        out = f"{data}/peer"
        figures = run_peer(spark, landing, out, files_per_batch=FILES_PER_VERSION,
                           checkpoint_location=f"{out}/_checkpoint")
        check(spark, floor_out, out, "peer")
        rows.append({"contender": "peer (Structured Streaming, RocksDB)", **figures})
        log(f"  peer: {figures['seconds']:.1f} s, {figures['batches']} micro-batches")
    for mode in args.modes:
        w = f"{data}/ours-{mode}"
        copy_landing(data, w)
        figures = run_ours(spark, w, mode=mode, rows_per_checkpoint=k)
        check(spark, floor_out, w, f"ours {mode}")
        label = "ours, checkpointing off" if mode == OFF else f"ours, {mode.replace('_', '-')}"
        rows.append({"contender": label, **figures})
        log(f"  {label}: {figures['seconds']:.1f} s, {figures['checkpoints']} checkpoints")
        if not args.keep:
            shutil.rmtree(w, ignore_errors=True)
    floor_s = rows[0]["seconds"]
    for r in rows:
        r.update(events=size, events_per_s=size / r["seconds"], ratio=r["seconds"] / floor_s)
    return rows


def skew(spark: Any, base: str, size: int, args: argparse.Namespace, log) -> list[dict]:
    """Aligned vs unaligned on the same data with one slow source channel (records in flight)."""
    k = args.rows_per_checkpoint
    data = f"{base}/skew{size}"
    generate_landing(spark, data, size, k, args.accounts)
    floor_out = f"{data}/floor"
    run_floor(spark, f"{data}/landing/payments", floor_out)
    rows = []
    for mode in ("aligned", "unaligned", "aligned_with_timeout"):
        w = f"{data}/ours-{mode}"
        copy_landing(data, w)
        figures = run_ours(spark, w, mode=mode, rows_per_checkpoint=k, lagging_sources=1)
        check(spark, floor_out, w, f"ours {mode}, lagging", ledger_order=False)
        rows.append({"mode": mode, **figures})
        log(f"  {mode} with a lagging channel: {figures['seconds']:.1f} s, "
            f"median checkpoint {figures['median_checkpoint_ms']:.0f} ms")
        if not args.keep:
            shutil.rmtree(w, ignore_errors=True)
    return rows


def check(spark: Any, floor_out: str, got: str, who: str, *, ledger_order: bool = True) -> None:
    problems = diff_outputs(spark, floor_out, got, ledger_order=ledger_order)
    if problems:
        raise WrongOutputs(f"{who}: outputs differ from the floor's, its time does not count:\n  - "
                           + "\n  - ".join(problems))


# --- rendering ---------------------------------------------------------------------------------

def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def render_throughput(rows: list[dict]) -> str:
    return table(
        ["contender", "events", "time (s)", "events/s", "time / floor", "checkpoints", "median checkpoint (ms)"],
        [[r["contender"], f"{r['events']:,}", f"{r['seconds']:.1f}", f"{r['events_per_s']:,.0f}",
          f"{r['ratio']:.2f}", str(r.get("checkpoints", "")),
          f"{r['median_checkpoint_ms']:.0f}" if "median_checkpoint_ms" in r else ""] for r in rows],
    )


def render_overhead(rows: list[dict]) -> str:
    by_size: dict[int, dict[str, dict]] = {}
    for r in rows:
        by_size.setdefault(r["events"], {})[r["contender"]] = r
    out = []
    for size, rs in by_size.items():
        off = rs.get("ours, checkpointing off")
        if off is None:
            continue
        for label, r in rs.items():
            if label.startswith("ours, ") and r is not off:
                out.append([f"{size:,}", label.removeprefix("ours, "), str(r["checkpoints"]),
                            f"{r['seconds']:.1f}", f"{off['seconds']:.1f}", f"{r['seconds'] / off['seconds']:.2f}"])
    return table(["events", "mode", "checkpoints", "time (s)", "off (s)", "time / off"], out)


def render_skew(rows: list[dict]) -> str:
    return table(
        ["mode", "time (s)", "checkpoints", "median checkpoint (ms)", "max checkpoint (ms)",
         "median alignment (ms)", "ended unaligned", "channel state rows", "channel state bytes"],
        [[r["mode"], f"{r['seconds']:.1f}", str(r["measured_checkpoints"]), f"{r['median_checkpoint_ms']:.0f}",
          f"{r['max_checkpoint_ms']:.0f}", f"{r['median_alignment_ms']:.0f}", str(r["unaligned"]),
          f"{r['channel_state_rows']:,}", f"{r['channel_state_bytes']:,}"] for r in rows],
    )


def machine(spark: Any) -> str:
    mem = ""
    try:
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        mem = f", {kb / 2**20:.0f} GiB"
    except (OSError, AttributeError):
        pass
    import pyspark

    return (f"{os.cpu_count()} cores{mem}, {platform.system()} {platform.machine()}, Python "
            f"{platform.python_version()}, PySpark {pyspark.__version__}, master {spark.conf.get('spark.master')}")


def write_section(doc: Path, name: str, body: str) -> None:
    """Replace the text between ``<!-- bench:name -->`` and ``<!-- /bench:name -->`` in ``doc``."""
    text = doc.read_text()
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"{doc} has no {start} ... {end} section")
    doc.write_text(pattern.sub(lambda _m: f"{start}\n{body}\n{end}", text))


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[int], int]:
    """The options (``--quick`` applied), the throughput sizes and the skew size."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes for every section (100k events, a "
                    "checkpoint every 25k; see each section's QUICK) unless given: a few minutes")
    ap.add_argument("--sizes", default="1000000,5000000,20000000", help="events, comma-separated")
    ap.add_argument("--rows-per-checkpoint", type=int, default=100_000)
    ap.add_argument("--accounts", type=int, default=10_000)
    ap.add_argument("--modes", default=",".join(MODES), help=f"ours: any of {', '.join(MODES)}")
    ap.add_argument("--contenders", default="floor,peer,ours")
    ap.add_argument("--skew-size", type=int, default=None, help="events for the aligned-vs-unaligned table "
                    "(default: the smallest size; 0 skips it)")
    ap.add_argument("--work", default=None, help="working folder (default: a temporary one, deleted)")
    ap.add_argument("--keep", action="store_true", help="keep every contender's warehouse")
    ap.add_argument("--no-warm-up", dest="warm_up", action="store_false")
    ap.add_argument("--docs", default=None, help="write the tables into this markdown file's bench sections")
    for section in SECTIONS:
        section.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.quick:
        for name, value in [*QUICK.items(), *(kv for section in SECTIONS for kv in section.QUICK.items())]:
            if getattr(args, name) == ap.get_default(name):
                setattr(args, name, value)
    try:  # bad section sizes fail before Spark starts
        recovery_bench.kill_points(args)
        state_bench.state_sizes(args)
    except ValueError as exc:
        ap.error(str(exc))
    sizes = [int(s) for s in args.sizes.split(",") if s]
    args.modes = [m for m in args.modes.split(",") if m] if "ours" in args.contenders else []
    unknown = set(args.modes) - set(MODES)
    if unknown:
        ap.error(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    skew_size = min(sizes, default=0) if args.skew_size is None else args.skew_size
    return args, sizes, skew_size


def main(argv: list[str] | None = None) -> int:
    args, sizes, skew_size = parse_args(argv)
    # Before Spark starts: its Python workers unpickle the peer's state function by its module
    # (bench.peer), and pyspark 4.2's own pandas padding warns once per group in them.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    from checkpoint_lib.spark.session import get_spark

    log = lambda m: print(m, flush=True)  # noqa: E731
    base = args.work or tempfile.mkdtemp(prefix="ckpt-bench-")
    command = "python bench/compare.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    spark = get_spark(app_name="checkpoint_lib-bench", ui=False)
    started = datetime.now(timezone.utc)
    try:
        results = []
        for size in sizes:
            results += throughput(spark, base, size, args, log)
        skewed = skew(spark, base, skew_size, args, log) if skew_size and "ours" in args.contenders else []
        ours = "ours" in args.contenders
        recovered = recovery_bench.recovery(spark, base, args, log) if ours and not args.skip_recovery else []
        states = state_bench.state_growth(spark, base, args, log) if ours and not args.skip_state else []
        clustered = cluster_bench.cluster(spark, base, args, log, results) if ours and not args.skip_cluster else []
    finally:
        if args.work is None and not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    measured = f"Measured {started:%Y-%m-%d %H:%M} UTC on {machine(spark)}"
    stamp = (f"{measured}; a checkpoint every {args.rows_per_checkpoint:,} events, {args.accounts:,} accounts. "
             f"Command: `{command.strip()}`")
    sections = {}
    if results:
        sections["throughput"] = f"{stamp}\n\n{render_throughput(results)}"
    if results and OFF in args.modes and len(args.modes) > 1:  # else the overhead table has no rows
        sections["overhead"] = f"{stamp}\n\n{render_overhead(results)}"
    if skewed:
        sections["skew"] = (f"{stamp}; {skew_size:,} events, one of the two source subtasks one step behind "
                            f"(records in flight at every checkpoint).\n\n{render_skew(skewed)}")
    for name, section, rows, render in (
        ("recovery", recovery_bench, recovered, recovery_bench.render_recovery),
        ("state", state_bench, states, state_bench.render_state),
        ("cluster", cluster_bench, clustered, cluster_bench.render_cluster),
    ):
        if rows:
            sections[name] = f"{measured}; {section.describe(args)}. Command: `{command.strip()}`\n\n{render(rows)}"
    for name, body in sections.items():
        print(f"\n## {name}\n{body}")
        if args.docs:
            write_section(Path(args.docs), name, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

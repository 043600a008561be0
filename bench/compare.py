"""Side-by-side benchmark of the payments pipeline: the floor, the peer and ours, on the same data;
the same for the two-input ``enrichment`` graph; then ours alone: recovery time, state growth, a
standalone cluster.

    make bench-quick                       # every section at small sizes: a few minutes on an idle machine
    make bench                             # 1M, 5M and 20M events and the sections below at full size: hours on 2 cores
    .venv/bin/python bench/compare.py --sizes 1000000 --rows-per-checkpoint 100000 --docs docs/benchmarks.md
    .venv/bin/python bench/compare.py --sizes '' --skip-state --skip-cluster --docs docs/benchmarks.md  # one section
    .venv/bin/python bench/compare.py --sizes '' --skip-recovery --skip-state --skip-cluster --skip-object-store \
        --enrichment-size 1000000 --enrichment-rows-per-checkpoint 100000 --docs docs/benchmarks.md  # enrichment alone
    .venv/bin/python bench/compare.py --sizes '' --skip-enrichment --skip-recovery --skip-state --skip-cluster \
        --skip-object-store --postgres-size 1000000 --docs docs/benchmarks.md  # PostgreSQL alone

Contenders (bench/floor.py, bench/expert_peer.py, bench/peer.py, bench/ours.py):
- **floor**: one plain PySpark batch job, no fault tolerance;
- **expert peer**: Spark Structured Streaming as an expert writes it: foreachBatch computes the
  running balance with a window over the micro-batch from the balances of the touched accounts,
  appends the ledger, then MERGEs the balances (deletion vectors), all with Delta's idempotent stamps;
- **peer**: Spark Structured Streaming, micro-batches of one checkpoint interval, per-account state
  in the RocksDB state store (``applyInPandasWithState``), outputs by foreachBatch with Delta
  idempotent writes;
- **ours**: checkpoint_lib with checkpointing off, aligned (stages chained, and unchained: every
  record through the channel log, as in the Airflow layout's separate processes), unaligned and at-least-once, a
  checkpoint every ``--rows-per-checkpoint`` events.

Sections (tables), each written between its ``<!-- bench:NAME -->`` markers:
- ``throughput-K`` and ``overhead-K``: every contender at each of ``--sizes``, a checkpoint every K
  (``--rows-per-checkpoint``) events: one pair of tables per interval;
- ``skew``: aligned vs unaligned with one lagging source subtask (``--skew-size``, 0 skips it);
- ``enrichment`` (bench/enrichment_bench.py): the two-input graph ``enrichment`` (payments tagged
  with their account's region as of their ts, from the accounts table's change data feed; dedup;
  totals per region) on its own generated landing tables: its floor (bench/enrichment_floor.py,
  one batch job), its expert peer (bench/enrichment_peer.py, foreachBatch: an as-of join on the
  accounts' change history, dedup against the tagged table, MERGEs and stamped appends) and ours
  (``GraphRunner``, aligned), a checkpoint (a micro-batch) every ``--enrichment-rows-per-checkpoint``
  events, ``--enrichment-size`` events; the floor's outputs checked by the verifier's expectations,
  the others' against the floor's; ratios to the floor and to the expert peer
  (``--skip-enrichment``);
- ``recovery`` (bench/recovery.py): a real ``ckpt run`` killed with SIGKILL at 10%, 50% and 90% of
  a checkpoint interval, then the recovery timed as restore + replay (``--recovery-interval``,
  ``--recovery-kills``; ``--skip-recovery``);
- ``state`` (bench/state_growth.py): checkpoint duration, snapshot size and bytes written as keyed
  state grows with fixed events per checkpoint (``--state-sizes``, ``--state-events``,
  ``--state-checkpoints``; ``--skip-state``);
- ``cluster`` (bench/cluster.py): ``spark-submit jobs/run_stage.py`` on a standalone master + 2
  workers started from the pyspark install (``--cluster-size``, ``--cluster-workers``,
  ``--cluster-cores``, ``--cluster-memory``; ``--skip-cluster``);
- ``object-store`` (bench/object_store.py): ours with the warehouse on a local S3 server beside
  local disk (``--object-store-size``; ``--skip-object-store``);
- ``postgres`` (bench/postgres.py): ``--postgres-size`` payments into PostgreSQL (a server started
  on 127.0.0.1): ours (``payments_pg``, ledger and balances by two-phase commit, a checkpoint every
  ``--postgres-rows-per-checkpoint``) beside a plain Spark JDBC write of the same rows and psycopg2's COPY
  from the driver alone, every contender's tables compared with the others' on the server, medians
  of ``--postgres-repeat`` sittings (``--skip-postgres``).

Every run's outputs are compared with the floor's (of the same landing versions), in Spark (nothing
is collected), before its time counts: a wrong result fails the run. Then the tables are printed,
and with ``--docs`` written into that file between its markers (the rest of the file is kept).
``--quick`` sets small sizes for every option left at its default.
"""

from __future__ import annotations

import argparse
import importlib
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
from bench import enrichment_bench  # noqa: E402
from bench import object_store as object_store_bench  # noqa: E402
from bench import postgres as postgres_bench  # noqa: E402
from bench import recovery as recovery_bench  # noqa: E402
from bench import results as results_log  # noqa: E402
from bench import state_growth as state_bench  # noqa: E402
from bench.floor import run_floor  # noqa: E402
from bench.markdown import table  # noqa: E402
from bench.ours import OFF, UNCHAINED, copy_landing, run_ours  # noqa: E402
from bench.outputs import FILES_PER_VERSION, check, generate_landing  # noqa: E402
from bench.work import Work  # noqa: E402

MODES = (OFF, "aligned", UNCHAINED, "unaligned", "at_least_once")


def label_of(mode: str) -> str:
    if mode == UNCHAINED:
        return "ours, aligned, stages unchained (channel log, as separate processes)"
    return "ours, checkpointing off" if mode == OFF else f"ours, {mode.replace('_', '-')}"


SECTIONS = (enrichment_bench, recovery_bench, state_bench, cluster_bench, object_store_bench, postgres_bench)  # each: add_arguments, QUICK, its run and render
QUICK = {"sizes": "100000", "rows_per_checkpoint": 25_000, "accounts": 2_000,
         "results": ""}  # a quick run's figures are a smoke test: they stay out of the results log


def throughput(spark: Any, base: str, size: int, args: argparse.Namespace, log, results: results_log.ResultsLog) -> list[dict]:
    """One size: every contender on the same landing table, verified against the floor. Each row
    goes into ``results`` (a :class:`bench.results.ResultsLog`; a quick run's has no path and only
    stamps it) once its outputs were checked; with ``args.resume`` a contender that log already holds for this configuration is not run
    again (the floor runs whenever another contender needs its outputs to be checked against)."""
    k = args.rows_per_checkpoint
    config = {"events": size, "rows_per_checkpoint": k, "accounts": args.accounts}
    todo = [EXPERT] if "expert" in args.contenders else []
    todo += [PEER] if "peer" in args.contenders else []
    todo += [label_of(m) for m in args.modes]
    done = {}
    if args.resume and results.path is not None:
        done = {c: r for c in [FLOOR, *todo] if (r := results.find("throughput", tuple(config.values()), c))}
        todo = [c for c in todo if c not in done]
        if done:
            log(f"{size:,} events: already in {results.path.name}: {', '.join(done)}")
        if not todo and FLOOR in done:
            return [done[FLOOR]] + [r for c, r in done.items() if c != FLOOR]
    data = f"{base}/n{size}"
    shutil.rmtree(data, ignore_errors=True)  # a stopped run's leftovers: the generator is seeded, regenerate
    t0 = time.monotonic()
    versions = generate_landing(spark, data, size, k, args.accounts)
    log(f"{size:,} events in {versions} versions of {k:,} generated in {time.monotonic() - t0:.0f} s")
    landing = f"{data}/landing/payments"
    if args.warm_up:
        run_floor(spark, landing, f"{base}/warm-up")  # JIT, Delta's classes: nobody pays the first run
        shutil.rmtree(f"{base}/warm-up", ignore_errors=True)
    rows: list[dict] = []

    def measured(contender: str, figures: dict) -> None:
        row = {**config, "contender": contender, **figures}
        rows.append(results.append("throughput", row))

    floor_out = f"{data}/floor"
    with Work(spark, floor_out) as work:
        figures = run_floor(spark, landing, floor_out)
    measured(FLOOR, {**figures, **work.figures(steps=1)})
    log(f"  floor: {rows[-1]['seconds']:.1f} s")
    for contender, name in ((EXPERT, "expert"), (PEER, "peer")):
        if contender not in todo:
            continue
        run = importlib.import_module(f"bench.{STREAMING[name]}").__dict__[f"run_{STREAMING[name]}"]
        out = f"{data}/{name}"
        with Work(spark, out) as work:
            figures = run(spark, landing, out, files_per_batch=FILES_PER_VERSION, checkpoint_location=f"{out}/_checkpoint")
        check(spark, floor_out, out, contender)
        measured(contender, {**figures, **work.figures(steps=figures["batches"])})
        log(f"  {contender}: {figures['seconds']:.1f} s, {figures['batches']} micro-batches")
    for mode in args.modes:
        label = label_of(mode)
        if label not in todo:
            continue
        w = f"{data}/ours-{mode}"
        copy_landing(data, w)
        with Work(spark, w) as work:
            figures = run_ours(spark, w, mode=mode, rows_per_checkpoint=k)
        check(spark, floor_out, w, f"ours {mode}")
        measured(label, {"mode": mode, **figures, **work.figures(steps=figures["steps"])})
        log(f"  {label}: {figures['seconds']:.1f} s, {figures['checkpoints']} checkpoints")
        if not args.keep:
            shutil.rmtree(w, ignore_errors=True)
    return rows + [r for c, r in done.items() if c != FLOOR]


FLOOR = "floor (plain Spark batch)"
PEER = "peer (Structured Streaming, RocksDB)"
EXPERT = "expert peer (foreachBatch: window + MERGE)"
STREAMING = {"expert": "expert_peer", "peer": "peer"}
"""The Structured Streaming contenders: ``bench/<module>.py`` with ``run_<module>()``."""


def with_ratios(rows: list[dict]) -> list[dict]:
    """Rows with ``events_per_s`` and ``ratio`` (time / the floor's time of the same configuration:
    events, interval and accounts), in configuration order, the floor first within each."""
    out = []
    for config, by in results_log.latest_by_config(rows).items():
        floor = by.get(FLOOR)
        if floor is None:
            raise ValueError(f"no floor row for {dict(zip(results_log.CONFIG_KEYS, config))}: nothing to compare with")
        for r in [floor, *(r for c, r in by.items() if c != FLOOR)]:
            out.append({**r, "events_per_s": r["events"] / r["seconds"], "ratio": r["seconds"] / floor["seconds"]})
    return out


ORDER = [FLOOR, EXPERT, PEER] + [label_of(m) for m in MODES]


def logged_throughput(store: results_log.ResultsLog, rows_per_checkpoint: int, accounts: int,
                      since: str = "") -> list[dict]:
    """Every size the log holds for this interval and number of accounts (measured at or after
    ``since``, a UTC date or time as the log writes them), its latest row per contender, smallest
    size first, in contender order: the table runs of several sittings make."""
    rows = [r for r in store.rows("throughput")
            if r.get("rows_per_checkpoint") == rows_per_checkpoint and r.get("accounts") == accounts
            and (r.get("measured_at") or "") >= since]
    latest = results_log.latest_by_config(rows)
    rank = {c: i for i, c in enumerate(ORDER)}
    return [r for config in sorted(latest, key=lambda c: c[0])
            for r in sorted(latest[config].values(), key=lambda r: rank.get(r["contender"], len(ORDER)))]


def provenance(rows: list[dict]) -> str:
    """Where a table's rows come from: each command, with its commit(s) and dates, and the machine(s)."""
    runs: dict[str, dict[str, set]] = {}
    for r in rows:
        run = runs.setdefault(r.get("command") or "(not recorded)", {"commit": set(), "at": set()})
        run["commit"].add(r.get("commit") or "unknown")
        run["at"].add(r.get("measured_at") or "")
    parts = []
    for command, run in runs.items():
        at = sorted(a for a in run["at"] if a)
        last = at[-1][11:] if len(at) > 1 and at[-1][:10] == at[0][:10] else at[-1] if at else ""
        when = "" if not at else f", {at[0]} UTC" if len(at) < 2 else f", {at[0]} to {last} UTC"
        parts.append(f"`{command}` at {', '.join(sorted(run['commit']))}{when}")  # undated: not from the log
    machines = sorted({r.get("machine") for r in rows if r.get("machine")})
    return (f"Measured on {'; '.join(machines) or 'an unrecorded machine'}. "
            f"{'Command' if len(parts) == 1 else 'Commands'}: {'; '.join(parts)}")


def skew(spark: Any, base: str, size: int, args: argparse.Namespace, log) -> list[dict]:
    """Aligned vs unaligned on the same data with one slow source channel (records in flight)."""
    k = args.rows_per_checkpoint
    data = f"{base}/skew{size}"
    shutil.rmtree(data, ignore_errors=True)
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


# --- rendering ---------------------------------------------------------------------------------

def render_throughput(rows: list[dict]) -> str:
    return table(
        ["contender", "events", "time (s)", "events/s", "time / floor", "checkpoints", "median checkpoint (ms)",
         "steps", "Spark jobs / step", "Delta commits / step", "measured (UTC)", "commit"],
        [[r["contender"], f"{r['events']:,}", f"{r['seconds']:.1f}", f"{r['events_per_s']:,.0f}",
          f"{r['ratio']:.2f}", str(r.get("checkpoints", "")),
          f"{r['median_checkpoint_ms']:.0f}" if "median_checkpoint_ms" in r else "",
          *_per_step(r), r.get("measured_at", ""), r.get("commit", "")] for r in rows],
    )


def _per_step(r: dict) -> list[str]:
    """Steps, Spark jobs and Delta commits per step (bench/work.py); blank for a row logged before
    they were counted."""
    if "spark_jobs" not in r:
        return ["", "", ""]
    steps = r.get("steps", r.get("batches", 1))
    return [str(steps), f"{r['jobs_per_step']:.1f}", f"{r['commits_per_step']:.1f}"]


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
                trend = [f"{r[k]:.1f}" if k in r else "" for k in ("interval_s_first_tenth", "interval_s_last_tenth")]
                out.append([f"{size:,}", label.removeprefix("ours, "), str(r["checkpoints"]),
                            f"{r['seconds']:.1f}", f"{off['seconds']:.1f}", f"{r['seconds'] / off['seconds']:.2f}",
                            *trend])
    return table(["events", "mode", "checkpoints", "time (s)", "off (s)", "time / off",
                  "interval, first tenth (s)", "interval, last tenth (s)"], out)


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
    """Replace the text between ``<!-- bench:name -->`` and ``<!-- /bench:name -->`` in ``doc``; a
    section the page does not have yet (the tables of a new interval) is added at its end."""
    text = doc.read_text()
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        doc.write_text(pattern.sub(lambda _m: f"{start}\n{body}\n{end}", text))
    else:
        print(f"{doc} had no {start} section: added at its end", flush=True)
        doc.write_text(f"{text.rstrip()}\n\n{start}\n{body}\n{end}\n")


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[int], int]:
    """The options (``--quick`` applied), the throughput sizes and the skew size."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes for every section (100k events, a "
                    "checkpoint every 25k; see each section's QUICK) unless given: a few minutes")
    ap.add_argument("--sizes", default="1000000,5000000,20000000", help="events, comma-separated")
    ap.add_argument("--rows-per-checkpoint", type=int, default=100_000)
    ap.add_argument("--accounts", type=int, default=10_000)
    ap.add_argument("--modes", default=",".join(MODES), help=f"ours: any of {', '.join(MODES)}")
    ap.add_argument("--contenders", default="floor,expert,peer,ours",
                    help="any of floor, expert (the expert peer), peer (the applyInPandasWithState one), ours")
    ap.add_argument("--skew-size", type=int, default=None, help="events for the aligned-vs-unaligned table "
                    "(default: the smallest size; 0 skips it)")
    ap.add_argument("--work", default=None, help="working folder (default: a temporary one, deleted)")
    ap.add_argument("--keep", action="store_true", help="keep every contender's warehouse")
    ap.add_argument("--no-warm-up", dest="warm_up", action="store_false")
    ap.add_argument("--docs", default=None, help="write the tables into this markdown file's bench sections")
    ap.add_argument("--results", default=str(results_log.DEFAULT), help="the results log every measured row is "
                    "appended to (JSON lines; '' for none)")
    ap.add_argument("--render-only", action="store_true", help="run nothing: rewrite the throughput and overhead "
                    "tables (this --rows-per-checkpoint and --accounts) from the results log into --docs")
    ap.add_argument("--since", default="", metavar="UTC", help="tables hold only rows measured at or after this "
                    "UTC date or time (e.g. 2026-11-26: one sitting's rows, older ones stay in the log)")
    ap.add_argument("--resume", action="store_true", help="skip contenders the results log already holds for "
                    "the same events, interval and accounts (a run that stopped goes on)")
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
        enrichment_bench.check_sizes(args)
        postgres_bench.check_sizes(args)
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
    if args.render_only:
        return render_only(args)
    # Before Spark starts: its Python workers unpickle the peer's state function by its module
    # (bench.peer), and pyspark 4.2's own pandas padding warns once per group in them.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    from checkpoint_lib.spark.session import get_spark

    log = lambda m: print(m, flush=True)  # noqa: E731
    base = args.work or tempfile.mkdtemp(prefix="ckpt-bench-")
    command = ("python bench/compare.py " + shlex.join(argv if argv is not None else sys.argv[1:])).strip()
    # (PostgreSQL's JDBC driver, fetched once, when the postgres section runs: before the JVM starts)
    spark = get_spark(app_name="checkpoint_lib-bench", ui=False, extra_conf=postgres_bench.spark_conf(args, log))
    started = datetime.now(timezone.utc)
    # a quick run (no --results) stamps its rows the same way and logs nothing
    store = results_log.ResultsLog(args.results or None, machine=machine(spark), command=command)
    try:
        results = []
        for size in sizes:
            results += throughput(spark, base, size, args, log, store)
        if store.path is not None:  # the table holds every size measured with this interval, in any run
            results = logged_throughput(store, args.rows_per_checkpoint, args.accounts, args.since) if results else []
        results = with_ratios(results)

        def logged(name: str, rows: list[dict]) -> list[dict]:  # kept as soon as the section is done
            return [store.append(name, r) for r in rows]

        ours = "ours" in args.contenders
        skewed = logged("skew", skew(spark, base, skew_size, args, log)) if skew_size and ours else []
        enriched = logged("enrichment", enrichment_bench.enrichment(spark, base, args, log)) \
            if not args.skip_enrichment else []
        recovered = logged("recovery", recovery_bench.recovery(spark, base, args, log)) \
            if ours and not args.skip_recovery else []
        states = logged("state", state_bench.state_growth(spark, base, args, log)) if ours and not args.skip_state else []
        local = logged_throughput(store, args.rows_per_checkpoint, args.accounts, args.since) if store.path is not None else results
        clustered = logged("cluster", cluster_bench.cluster(spark, base, args, log, local)) \
            if ours and not args.skip_cluster else []
        stored = logged("object-store", object_store_bench.object_store(spark, base, args, log)) \
            if ours and not args.skip_object_store else []
        into_pg = logged("postgres", postgres_bench.postgres(spark, base, args, log)) if postgres_bench.runs(args) else []
    finally:
        if args.work is None and not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    measured = f"Measured {started:%Y-%m-%d %H:%M} UTC at {store.commit} on {machine(spark)}"
    stamp = (f"{measured}; a checkpoint every {args.rows_per_checkpoint:,} events, {args.accounts:,} accounts. "
             f"Command: `{command}`")
    sections = throughput_sections(results, args) if results else {}
    if skewed:
        sections["skew"] = (f"{stamp}; {skew_size:,} events, one of the two source subtasks one step behind "
                            f"(records in flight at every checkpoint).\n\n{render_skew(skewed)}")
    for name, section, rows, render in (
        ("enrichment", enrichment_bench, enriched, enrichment_bench.render_enrichment),
        ("recovery", recovery_bench, recovered, recovery_bench.render_recovery),
        ("state", state_bench, states, state_bench.render_state),
        ("cluster", cluster_bench, clustered, cluster_bench.render_cluster),
        ("object-store", object_store_bench, stored, object_store_bench.render_object_store),
        ("postgres", postgres_bench, into_pg, postgres_bench.render_postgres),
    ):
        if rows:
            sections[name] = f"{measured}; {section.describe(args)}. Command: `{command}`\n\n{render(rows)}"
    publish(sections, args.docs)
    return 0


def throughput_sections(results: list[dict], args: argparse.Namespace) -> dict[str, str]:
    """The ``throughput`` and ``overhead`` tables of ``results`` (rows with ratios), with where
    each row was measured."""
    k = args.rows_per_checkpoint
    stamp = f"A checkpoint every {k:,} events, {args.accounts:,} accounts. {provenance(results)}"
    sections = {f"throughput-{k}": f"{stamp}\n\n{render_throughput(results)}"}
    overhead = render_overhead(results)
    if overhead.count("\n") > 1:  # a size with checkpointing off and another mode
        sections[f"overhead-{k}"] = f"{stamp}\n\n{overhead}"
    return sections


def render_only(args: argparse.Namespace) -> int:
    """Rewrite the throughput and overhead tables from the results log alone: no Spark, nothing run."""
    if not args.results:
        raise SystemExit("--render-only needs the results log (--results)")
    rows = logged_throughput(results_log.ResultsLog(args.results, commit=""), args.rows_per_checkpoint, args.accounts,
                             args.since)
    if not rows:
        raise SystemExit(f"{args.results} holds no throughput rows with a checkpoint every "
                         f"{args.rows_per_checkpoint:,} events and {args.accounts:,} accounts")
    publish(throughput_sections(with_ratios(rows), args), args.docs)
    return 0


def publish(sections: dict[str, str], docs: str | None) -> None:
    for name, body in sections.items():
        print(f"\n## {name}\n{body}")
        if docs:
            write_section(Path(docs), name, body)


if __name__ == "__main__":
    raise SystemExit(main())

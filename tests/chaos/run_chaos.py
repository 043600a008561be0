"""One command for the reliability figures: ``make chaos`` (``CHAOS_ARGS="--runs 40"``).

1. Runs ``--runs`` seeded chaos scenarios (tests/chaos/chaos_harness.py): each lands input, kills
   real ``ckpt run`` processes with SIGKILL (and each recovery again, up to three times in a chain),
   recovers undisturbed, and verifies the outputs against the independent computation.
   ``--pg-runs`` adds ``payments_pg`` scenarios against a real PostgreSQL server (tests/pg_server.py),
   one server for the whole command, started only when such a scenario is to run.
   Outcomes go to ``--results`` (JSON lines) as they finish; run again, the command skips the
   seeds already there, so an interrupted run continues where it stopped.
2. Tries every hostile input (tests/chaos/hostile.py) and the hostile recovery parameters.
3. Runs every race test (tests/chaos/races.py: ``pytest -m race``, slow ones included).
4. Rewrites the generated parts of ``--docs`` (docs/reliability.md, between their markers).
   ``--races-only`` runs and rewrites the race rows alone.

Exit status 1 if any run mismatched or any input was not handled as expected.
"""

from __future__ import annotations

import argparse
from itertools import zip_longest
import platform
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests/: pg_server
# this checkout's checkpoint_lib, not the one a shared virtualenv's editable install points at (another
# worktree's): the results name this checkout's commit, and the ckpt processes run the code imported here
sys.path.insert(2, str(Path(__file__).resolve().parents[2]))

import chaos_harness as harness  # noqa: E402
import hostile  # noqa: E402
import races  # noqa: E402

BEGIN = "<!-- BEGIN make chaos: generated, do not edit -->"
END = "<!-- END make chaos -->"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=24, help="chaos scenarios (seeds first-seed..), default 24")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--orders-runs", type=int, default=6,
                    help=f"orders scenarios too (seeds {harness.ORDERS_SEEDS}..), default 6")
    ap.add_argument("--orders-first-seed", type=int, default=harness.ORDERS_SEEDS)
    ap.add_argument("--enrichment-runs", type=int, default=6,
                    help=f"enrichment (graph) scenarios too (seeds {harness.ENRICHMENT_SEEDS}..), default 6")
    ap.add_argument("--enrichment-first-seed", type=int, default=harness.ENRICHMENT_SEEDS)
    ap.add_argument("--enrichment-groups-runs", type=int, default=6,
                    help=f"enrichment with a process per vertex (seeds {harness.ENRICHMENT_GROUPS_SEEDS}..), default 6")
    ap.add_argument("--state-runs", type=int, default=0,
                    help=f"scenarios with the keyed state folded every 1 or 2 flushes, half killed inside a fold "
                         f"(seeds {harness.STATE_SEEDS}..), default 0")
    ap.add_argument("--state-first-seed", type=int, default=harness.STATE_SEEDS)
    ap.add_argument("--pg-runs", type=int, default=0,
                    help=f"payments_pg scenarios against a real PostgreSQL server (seeds {harness.PG_SEEDS}..), "
                         "default 0")
    ap.add_argument("--pg-first-seed", type=int, default=harness.PG_SEEDS)
    ap.add_argument("--results", default="tests/chaos/results.jsonl",
                    help="outcomes, one JSON line per scenario (tracked, like bench/results.jsonl: the evidence behind docs/reliability.md)")
    ap.add_argument("--docs", default="docs/reliability.md", help="the page whose generated part is rewritten")
    ap.add_argument("--fresh", action="store_true", help="forget earlier outcomes (after a code change)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="scenarios at once (default 1); a scenario's time is mostly one JVM's driver, so 2 on 2 cores "
                         "does about twice the kills per hour. Correctness only: never while measuring")
    ap.add_argument("--skip-hostile", action="store_true", help="only the kills")
    ap.add_argument("--skip-races", action="store_true", help="not the race tests")
    ap.add_argument("--races-only", action="store_true", help="only the race tests and their rows")
    args = ap.parse_args(argv)
    if args.pg_runs and args.pg_first_seed < harness.PG_SEEDS:
        ap.error(f"--pg-first-seed must be at least {harness.PG_SEEDS} (the payments_pg seeds)")
    docs = Path(args.docs)
    if args.races_only:
        return _races(docs)

    from checkpoint_lib.spark.session import get_spark, stop_spark

    results = Path(args.results)
    results.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh:
        results.unlink(missing_ok=True)
    kinds = (range(args.first_seed, args.first_seed + args.runs),  # the seeds of each kind of scenario
             range(args.orders_first_seed, args.orders_first_seed + args.orders_runs),
             range(args.enrichment_first_seed, args.enrichment_first_seed + args.enrichment_runs),
             range(harness.ENRICHMENT_GROUPS_SEEDS, harness.ENRICHMENT_GROUPS_SEEDS + args.enrichment_groups_runs),
             range(args.state_first_seed, args.state_first_seed + args.state_runs),
             range(args.pg_first_seed, args.pg_first_seed + args.pg_runs))
    seeds = [s for kind in kinds for s in kind]
    done = {o.seed for o in harness.load(results)}
    # the orders, enrichment and payments_pg scenarios interleaved with the others: a run stopped early has some of each
    parts = ([s for s in kind if s not in done] for kind in kinds)
    todo = [s for group in zip_longest(*parts) for s in group if s is not None]
    spark = get_spark(master="local[2]", ui=False)
    started = time.monotonic()
    postgres = None  # one server for every payments_pg scenario of this command, if any is to run
    try:
        if any(harness.scenario(s).pipeline == harness.PG_PIPELINE for s in todo):
            from pg_server import PostgresServer

            postgres = PostgresServer().start()
        lock = threading.Lock()

        def one(seed: int) -> None:
            s = harness.scenario(seed)
            work = Path(tempfile.mkdtemp(prefix=f"chaos-{seed}-"))
            try:
                outcome = harness.run_scenario(spark, work, s, postgres=postgres)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            verdict = "survived" if outcome.survived else f"MISMATCH {outcome.mismatch}"
            with lock:
                harness.record(results, outcome)
                print(f"{s.label}: kills at {outcome.kills or '-'}"
                      f"{' (not reached: ' + ', '.join(outcome.not_reached) + ')' if outcome.not_reached else ''}"
                      f" -> {verdict} ({outcome.seconds:.0f} s)", flush=True)

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for f in [pool.submit(one, seed) for seed in todo]:
                f.result()
        tried: list[hostile.Tried] = []
        if not args.skip_hostile:
            for case in hostile.cases():
                work = Path(tempfile.mkdtemp(prefix=f"hostile-{case.name}-"))
                try:
                    t = hostile.try_case(spark, work, case)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                print(f"{case.name}: {t.result[:160]} -> {'as expected' if t.ok else 'NOT AS EXPECTED ' + str(t.problems)}",
                      flush=True)
                tried.append(t)
            tried += hostile.try_parameters()
    finally:
        stop_spark()
        if postgres is not None:
            postgres.close()
    outcomes = [o for o in harness.load(results) if o.seed in seeds]
    kept = sum(1 for s in seeds if s in done)
    section = generated(outcomes, tried, args, time.monotonic() - started, kept)
    text = docs.read_text() if docs.exists() else f"# Reliability\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        text += f"\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    docs.write_text(head + BEGIN + "\n" + section + "\n" + END + rest.split(END, 1)[1])
    print(f"wrote {docs}")
    bad = [o for o in outcomes if not o.survived] + [t for t in tried if not t.ok]
    raced = 0 if args.skip_races else _races(docs)
    return 1 if bad or raced else 0


def _races(docs: Path) -> int:
    outcomes = races.run()
    races.write(docs, f"Generated by `make chaos` (or `CHAOS_ARGS=--races-only`) at commit {harness.git_commit()} "
                      f"on {time.strftime('%Y-%m-%d')}.\n\n" + races.render(outcomes))
    print(f"races: {sum(o.passed for o in outcomes)}/{len(outcomes)} passed; wrote {docs}")
    return 0 if outcomes and all(o.passed for o in outcomes) else 1


def command_of(args: argparse.Namespace) -> str:
    """The ``make chaos`` invocation ``args`` came from: every option that changes what ran, and the
    scenarios at once (``--jobs``: what the invocation's minutes depend on)."""
    given = [f"--runs {args.runs}"]
    given += [f"--first-seed {args.first_seed}"] if args.first_seed else []
    given += [f"--orders-runs {args.orders_runs}"]
    given += [f"--orders-first-seed {args.orders_first_seed}"] if args.orders_first_seed != harness.ORDERS_SEEDS else []
    given += [f"--enrichment-runs {args.enrichment_runs}"]
    given += [f"--enrichment-first-seed {args.enrichment_first_seed}"] if (
        args.enrichment_first_seed != harness.ENRICHMENT_SEEDS) else []
    given += [f"--enrichment-groups-runs {args.enrichment_groups_runs}"]
    given += [f"--state-runs {args.state_runs}"] if args.state_runs else []
    given += [f"--state-first-seed {args.state_first_seed}"] if args.state_first_seed != harness.STATE_SEEDS else []
    given += [f"--pg-runs {args.pg_runs}"] if args.pg_runs else []
    given += [f"--pg-first-seed {args.pg_first_seed}"] if args.pg_runs and args.pg_first_seed != harness.PG_SEEDS else []
    given += [f"--jobs {args.jobs}"]
    given += [f"--{flag.replace('_', '-')}" for flag in ("skip_hostile", "skip_races") if getattr(args, flag)]
    return f"make chaos CHAOS_ARGS=\"{' '.join(given)}\""


def generated(outcomes, tried, args, seconds: float, kept: int = 0) -> str:
    command = command_of(args)
    earlier = (f" ({kept} of the scenarios below were run by earlier invocations of it and kept in "
               f"{args.results}: the command skips the seeds done)") if kept else ""
    parts = [
        f"Generated by `{command}` at commit {harness.git_commit()} on {time.strftime('%Y-%m-%d')}, {platform.machine()}, "
        f"{_cores()} cores, Python {platform.python_version()}; this invocation took {seconds / 60:.0f} min{earlier}.",
        "",
        "### Kills",
        "",
        harness.render(outcomes),
    ]
    if tried:
        errors = sum(1 for t in tried if t.result.split(":")[0].endswith(("Error", "Exception")))
        parts += ["", "### Hostile input and parameters", "",
                  f"{len(tried)} inputs tried, {errors} refused with an error, "
                  f"{sum(not t.ok for t in tried)} not as expected.", "", hostile.render(tried)]
    return "\n".join(parts)


def _cores() -> int:
    import os

    return os.cpu_count() or 0


if __name__ == "__main__":
    raise SystemExit(main())

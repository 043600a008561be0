"""Throughput of the payments pipeline: N events end to end, checkpoint durations, verified.

    .venv/bin/python bench/throughput.py --rows 1000000 --versions 10 --rows-per-checkpoint 100000
    .venv/bin/python bench/throughput.py --rows 200000 --mode aligned,unaligned --lagging-sources 1

Generates ``--rows`` events in ``--versions`` landing versions (in a fresh warehouse under
``--warehouse``), runs ``payments`` until caught up with a checkpoint every
``--rows-per-checkpoint`` rows (aligned unless ``--mode``), verifies the outputs against the
independent pandas computation (the time counts only if they are right) and prints the figures.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--versions", type=int, default=10)
    ap.add_argument("--rows-per-checkpoint", type=int, default=100_000)
    ap.add_argument("--accounts", type=int, default=10_000)
    ap.add_argument("--mode", default="aligned",
                    help="barrier mode, or several separated by commas: each runs on the same data")
    ap.add_argument("--lagging-sources", type=int, default=0,
                    help="slow source subtasks (one step behind): records in flight at every checkpoint")
    ap.add_argument("--warehouse", default=None, help="default: a temporary folder, deleted afterwards")
    args = ap.parse_args()

    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: bench.* importable
    from bench.ours import run_ours
    from checkpoint_lib.pipelines.payments import generate
    from checkpoint_lib.spark.session import get_spark
    from checkpoint_lib.verify import check_payments

    base = args.warehouse or tempfile.mkdtemp(prefix="ckpt-bench-")
    spark = get_spark(ui=False)
    modes = args.mode.split(",")
    table = []
    for mode in modes:
        w = base if len(modes) == 1 else f"{base}/{mode}"
        t0 = time.monotonic()
        per = args.rows // args.versions
        for v in range(args.versions):  # the same seeds: the same data for every mode
            generate(spark, w, per, bad_fraction=0.001, accounts=args.accounts, seed=v, files=2)
        gen = time.monotonic() - t0
        print(f"generated {per * args.versions:,} rows in {args.versions} versions in {gen:.1f} s", flush=True)

        f = run_ours(spark, w, mode=mode, rows_per_checkpoint=args.rows_per_checkpoint,
                     lagging_sources=args.lagging_sources, progress=lambda m: print(f"  {m}", flush=True))
        check = check_payments(w, exact_order=mode != "at_least_once" and not args.lagging_sources)
        if not check.ok:
            print("OUTPUTS WRONG:", check.summary())
            return 1
        print(f"\nmode {mode}: {f['rows']:,} rows in {f['seconds']:.1f} s = {f['rows'] / f['seconds']:,.0f} rows/s, "
              f"{f['steps']} steps, {f['checkpoints']} checkpoints")
        print(f"checkpoint duration (trigger -> completed, ms): median {f['median_checkpoint_ms']:.0f}, "
              f"max {f['max_checkpoint_ms']:.0f}")
        print(f"outputs verified: {check.summary()}")
        table.append((mode, f["seconds"], f["median_checkpoint_ms"], f["median_alignment_ms"],
                      f["channel_state_rows"], f["channel_state_bytes"]))
        if args.warehouse is None and len(modes) == 1:
            shutil.rmtree(w, ignore_errors=True)
    print(f"\n{args.rows:,} rows, a checkpoint every {args.rows_per_checkpoint:,}, "
          f"{args.lagging_sources} lagging source subtask(s); retained checkpoints but the final one:")
    print("| mode | run (s) | median checkpoint (ms) | median alignment (ms) "
          "| channel state rows | channel state bytes |")
    print("|---|---|---|---|---|---|")
    for mode, secs, dur, align, rows, nbytes in table:
        print(f"| {mode} | {secs:.1f} | {dur:.0f} | {align:.0f} | {rows:,} | {nbytes:,} |")
    if args.warehouse is None:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

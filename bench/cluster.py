"""Ours on a Spark standalone cluster, submitted through the ``jobs/`` entry point.

A master and ``--cluster-workers`` workers on 127.0.0.1, started from the pyspark install
(:class:`checkpoint_lib.spark.standalone.StandaloneCluster`: what docker-compose's spark services
run), then ``<pyspark>/bin/spark-submit --master spark://... jobs/run_stage.py payments --warehouse
W --stage all --mode aligned --rows-per-checkpoint K`` (built by :mod:`checkpoint_lib.submit`, as
the Airflow hook's ``spark-submit`` launcher builds it, Delta jars by ``--jars``) on a copy of the
same landing table as the local contenders.
Timed end to end (the spark-submit wall time: JVM start, executors, the run, the final commit)
and by the run's own figure (what ``ckpt run`` prints: open to close, comparable with the local
``ours, aligned``). The outputs must equal the floor's before the time counts.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

TIMEOUT = float(os.environ.get("CKPT_BENCH_RUN_TIMEOUT", "14400"))
_RUN_LINE = re.compile(r"epoch \d+: read ([\d,]+) rows in ([\d.]+) s")
"""``ckpt run``'s summary line (its row count printed with thousands separators)."""


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("standalone cluster (bench/cluster.py)")
    g.add_argument("--skip-cluster", action="store_true", help="skip the standalone-cluster table")
    g.add_argument("--cluster-size", type=int, default=5_000_000, help="events (default 5,000,000)")
    g.add_argument("--cluster-workers", type=int, default=2, help="workers (default 2)")
    g.add_argument("--cluster-cores", type=int, default=1, help="cores per worker (default 1)")
    g.add_argument("--cluster-memory", default="2g", help="memory per worker and its executor (default 2g)")


QUICK = {"cluster_size": 20_000, "cluster_memory": "1g"}


def submit_argv(master: str, warehouse: str, rows_per_checkpoint: int, memory: str) -> list[str]:
    """The hook's spark-submit argv of ``jobs/run_stage.py`` (whole pipeline, aligned), sized for the bench."""
    from checkpoint_lib.spark.jars import ensure_jars
    from checkpoint_lib.submit import build_submit_argv, spark_home, stage_args

    return build_submit_argv(
        "run_stage.py", stage_args("payments", warehouse, stage="all", rows_per_checkpoint=rows_per_checkpoint),
        master=master, spark_submit=str(spark_home() / "bin" / "spark-submit"), name="ckpt-bench-cluster",
        jars=[str(j) for j in ensure_jars()], driver_memory=os.environ.get("CKPT_DRIVER_MEMORY") or "2g",
        executor_memory=memory,
    )


def cluster(spark: Any, base: str, args: argparse.Namespace, log, local: list[dict] = ()) -> list[dict]:
    """One run on the cluster, on the landing table of that size (the one the local contenders
    used when the size was among ``--sizes``, else generated alike). ``local``: the throughput
    rows, for the ratio to the local ``ours, aligned`` of the same size."""
    from bench.outputs import check, generate_landing
    from bench.floor import run_floor
    from bench.ours import copy_landing
    from checkpoint_lib.spark.standalone import StandaloneCluster
    from checkpoint_lib.submit import submit_env

    size, k = args.cluster_size, args.rows_per_checkpoint
    data = f"{base}/n{size}"
    floor_out = f"{data}/floor"
    if not Path(f"{floor_out}/gold/ledger/_delta_log").is_dir():  # the size did not run locally
        data = f"{base}/cluster{size}"
        floor_out = f"{data}/floor"
        t0 = time.monotonic()
        generate_landing(spark, data, size, k, args.accounts)
        log(f"cluster: {size:,} events generated in {time.monotonic() - t0:.0f} s")
        run_floor(spark, f"{data}/landing/payments", floor_out)
    w = f"{data}/ours-cluster"
    copy_landing(data, w)
    with StandaloneCluster(workers=args.cluster_workers, cores=args.cluster_cores, memory=args.cluster_memory) as c:
        env = {**submit_env(c.master_url), **c.client_env(), "CKPT_SPARK_UI": "0"}
        env.pop("CKPT_KILL_AT", None)
        argv = submit_argv(c.master_url, w, k, args.cluster_memory)
        started = time.monotonic()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        wall = time.monotonic() - started
        apps = c.status().get("completedapps", []) if proc.returncode == 0 else []
    if proc.returncode == 0 and not apps:
        raise RuntimeError(f"the master at {c.master_url} saw no application: the job did not run on the cluster")
    if proc.returncode != 0:
        raise RuntimeError(f"spark-submit jobs/run_stage.py exited with {proc.returncode}:\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    m = _RUN_LINE.search(proc.stdout)
    if m is None:
        raise RuntimeError(f"jobs/run_stage.py did not print its summary:\n{proc.stdout[-2000:]}")
    rows_in, run_s = int(m.group(1).replace(",", "")), float(m.group(2))
    check(spark, floor_out, w, "ours aligned on the standalone cluster")
    same = [r for r in local if r["events"] == size and r["contender"] == "ours, aligned"]
    row = {
        "events": size, "rows_read": rows_in, "workers": args.cluster_workers, "cores": args.cluster_cores,
        "submit_s": wall, "seconds": run_s, "events_per_s": size / run_s if run_s else 0.0,
        "local_s": same[0]["seconds"] if same else None,
    }
    log(f"  cluster {args.cluster_workers} x {args.cluster_cores}: spark-submit {wall:.1f} s, run {run_s:.1f} s")
    if not args.keep:
        shutil.rmtree(w, ignore_errors=True)
    return [row]


def render_cluster(rows: list[dict]) -> str:
    from bench.markdown import table

    return table(
        ["events", "workers x cores", "spark-submit (s)", "run (s)", "events/s", "run / local ours aligned",
         "outputs exact"],
        [[f"{r['events']:,}", f"{r['workers']} x {r['cores']}", f"{r['submit_s']:.1f}", f"{r['seconds']:.1f}",
          f"{r['events_per_s']:,.0f}", f"{r['seconds'] / r['local_s']:.2f}" if r["local_s"] else "", "yes"]
         for r in rows],
    )


def describe(args: argparse.Namespace) -> str:
    cores = f"{args.cluster_cores} core{'s' if args.cluster_cores != 1 else ''}"
    return (f"{args.cluster_workers} workers x {cores} ({args.cluster_memory} each) on "
            f"127.0.0.1, aligned, a checkpoint every {args.rows_per_checkpoint:,} events, {args.accounts:,} accounts")

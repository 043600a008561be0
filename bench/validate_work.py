"""The work one ``ckpt validate`` does, counted rather than timed: Spark jobs and Delta table loads,
per suite and for the whole command.

    CKPT_JAR_DIR=... nice -n 19 .venv/bin/python bench/validate_work.py --warehouse W [payments] [--suite all]

Runs ``ckpt validate`` in this process (on this checkout's code: the folder above this file comes
first on the path) with two counters wrapped around it, and changes nothing the command does:

- Spark jobs: ``bench/work.py::spark_jobs``, the next job id Spark hands out, read before and after
  each suite (job ids are consecutive from 0 in every job group, so the difference is the number of
  jobs started, however short);
- Delta table loads: calls of ``spark.read.format("delta")...load(path)`` (each resolves a Delta
  snapshot in Spark, time travel included) and the small tables read by delta-rs instead
  (``quality.context._driver_read``), with the table, version and reader of each.

Validation writes its results into the warehouse: run it on a copy. Wall time is printed too, but
on a busy machine it means little; the counts do not depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.work import spark_jobs  # noqa: E402


class Counter:
    """Spark jobs and Delta loads, marked at named points."""

    def __init__(self) -> None:
        self.spark: Any = None
        self.loads: list[tuple[str, str | None, str]] = []  # (table, version, reader)
        self.marks: list[tuple[str, int, int, float]] = []  # (name, jobs so far, loads so far, time)

    def jobs(self) -> int:
        if self.spark is None:
            return 0
        return spark_jobs(self.spark)

    def mark(self, name: str) -> None:
        self.marks.append((name, self.jobs(), len(self.loads), time.monotonic()))


def install(counter: Counter) -> None:
    """Wrap the Delta reader's ``load`` and the two suites' entry points with the counters."""
    from pyspark.sql.readwriter import DataFrameReader

    import checkpoint_lib.quality as quality

    fmt, option, load = DataFrameReader.format, DataFrameReader.option, DataFrameReader.load

    def format_(self: Any, source: str) -> Any:
        self._bench_format = source
        return fmt(self, source)

    def option_(self: Any, key: str, value: Any) -> Any:
        if key == "versionAsOf":
            self._bench_version = str(value)
        return option(self, key, value)

    def load_(self: Any, path: Any = None, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_bench_format", None) == "delta" or kwargs.get("format") == "delta":
            counter.loads.append((str(path), getattr(self, "_bench_version", None), "spark"))
        return load(self, path, *args, **kwargs)

    DataFrameReader.format, DataFrameReader.option, DataFrameReader.load = format_, option_, load_

    from checkpoint_lib.quality import context

    driver_read = context._driver_read

    def driver_read_(spark: Any, path: str, version: int | None) -> Any:
        frame = driver_read(spark, path, version)
        if frame is not None:  # None: delta-rs could not read it, Spark's load (counted above) does
            counter.loads.append((str(path), None if version is None else str(version), "delta-rs"))
        return frame

    context._driver_read = driver_read_

    for kind in ("restore", "checkpoint"):
        name = f"validate_{kind}"
        run = getattr(quality, name)

        def counted(spark: Any, *args: Any, _run: Any = run, _kind: str = kind, **kwargs: Any) -> Any:
            counter.spark = spark
            counter.mark(f"{_kind} start")
            told = kwargs.get("progress")

            def progress(step: str, view: str) -> None:  # each view computed, then validated
                counter.mark(f"{_kind} {view} {step}")
                if told is not None:
                    told(step, view)

            kwargs["progress"] = progress
            try:
                return _run(spark, *args, **kwargs)
            finally:
                counter.mark(f"{_kind} end")

        setattr(quality, name, counted)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pipeline", nargs="?", default="payments")
    ap.add_argument("--warehouse", required=True, help="a copy: the validation writes its results into it")
    ap.add_argument("--suite", default="all", choices=("all", "restore", "checkpoint"))
    ap.add_argument("-o", "--output", choices=("text", "json"), default="text")
    args = ap.parse_args(argv)

    from checkpoint_lib import cli

    counter = Counter()
    install(counter)
    started = time.monotonic()
    code = cli.main(["validate", args.pipeline, "--warehouse", args.warehouse, "--suite", args.suite, "-o", "json"])
    counter.mark("command end")
    rows: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    marks = {name: (jobs, loads, at) for name, jobs, loads, at in counter.marks}
    for kind in ("restore", "checkpoint"):
        if f"{kind} start" in marks:
            (j0, l0, t0), (j1, l1, t1) = marks[f"{kind} start"], marks[f"{kind} end"]
            rows.append({"part": f"suite {kind}", "spark_jobs": j1 - j0, "delta_loads": l1 - l0,
                         "seconds": round(t1 - t0, 1)})
    last_suite = max((m for m in counter.marks if m[0].endswith(" end") and m[0] != "command end"),
                     key=lambda m: m[3], default=None)
    end = marks["command end"]
    if last_suite is not None:  # what the command does after its suites (the Data Docs build)
        rows.append({"part": "after the suites", "spark_jobs": end[0] - last_suite[1],
                     "delta_loads": end[1] - last_suite[2], "seconds": round(end[2] - last_suite[3], 1)})
    previous = None
    for name, jobs, loads, at in counter.marks:  # each step's share, in order
        if previous is not None and name.split()[-1] in ("computed", "validated"):
            steps.append({"step": name, "spark_jobs": jobs - previous[1], "delta_loads": loads - previous[2]})
        previous = (name, jobs, loads, at)
    rows.append({"part": "command", "spark_jobs": end[0], "delta_loads": end[1],
                 "seconds": round(end[2] - started, 1)})
    tables: dict[str, int] = {}
    for path, version, reader in counter.loads:
        key = f"{Path(path).name}@{'latest' if version is None else version} ({reader})"
        tables[key] = tables.get(key, 0) + 1
    if args.output == "json":
        print(json.dumps({"exit_code": code, "parts": rows, "steps": steps, "loads": tables}, indent=2))
    else:
        print(f"ckpt validate {args.pipeline} --suite {args.suite}: exit code {code}")
        print(f"{'part':<18} {'spark jobs':>10} {'delta loads':>11} {'seconds':>8}")
        for r in rows:
            print(f"{r['part']:<18} {r['spark_jobs']:>10} {r['delta_loads']:>11} {r['seconds']:>8}")
        print("by step (since the previous one): " + ", ".join(
            f"{r['step']} {r['spark_jobs']} jobs/{r['delta_loads']} loads" for r in steps))
        print("delta loads by table@version: " + ", ".join(f"{k} x{n}" for k, n in sorted(tables.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

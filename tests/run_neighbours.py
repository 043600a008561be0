"""One command for the lakehouse-neighbours matrix: ``make neighbours`` (``NEIGHBOURS_ARGS="-k vacuum"``).

Runs every cell of tests/neighbours.py (an operation of another tool on one side of the payments
pipeline, at one moment) in one process with one SparkSession, cells of one moment sharing their
identical beginning; outcomes go to ``--results`` (JSON lines) as they finish, and a second
invocation skips the cells already there (``--fresh`` forgets them). Then rewrites the generated
part of ``--docs`` (docs/reliability.md, between its markers). Exit status 1 if any cell failed or
ended otherwise than :func:`neighbours.expected` says.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import neighbours as nb  # noqa: E402
from chaos.chaos_harness import git_commit  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="tests/neighbours_results.jsonl")
    ap.add_argument("--docs", default="docs/reliability.md")
    ap.add_argument("--fresh", action="store_true", help="forget earlier outcomes (after a code change)")
    ap.add_argument("-k", dest="select", default="", help="only the cells whose id contains this")
    args = ap.parse_args(argv)
    results = Path(args.results)
    if args.fresh:
        results.unlink(missing_ok=True)
    done = nb.load(results)
    todo = [c for c in nb.CELLS if c.id not in done and args.select in c.id]
    if todo:
        from checkpoint_lib.spark.session import get_spark, stop_spark

        spark = get_spark(master="local[2]", ui=False)
        spark.sparkContext.setLogLevel("ERROR")
        base = Path(tempfile.mkdtemp(prefix="ckpt-neighbours-"))
        prefixes: dict = {}
        try:
            for cell in todo:
                outcome = nb.run_cell(spark, base / "w", cell, prefixes)
                outcome.extra["commit"] = git_commit()
                nb.record(results, outcome)
                print(f"{cell.id:42s} {outcome.result:13s} {outcome.seconds:5.1f} s  {outcome.detail[:160]}", flush=True)
        finally:
            stop_spark()
            shutil.rmtree(base, ignore_errors=True)
    done = nb.load(results)
    commits = sorted({o.extra.get("commit", "unrecorded") for o in done.values()})
    docs = Path(args.docs)
    text = docs.read_text()
    head, _, rest = text.partition(nb.BEGIN)
    _, _, tail = rest.partition(nb.END)
    docs.write_text(f"{head}{nb.BEGIN}\n{nb.render(done, ', '.join(commits))}{nb.END}{tail}")
    wrong = [o for o in done.values() if o.result == "FAILED" or not nb.as_expected(o)]
    for o in wrong:
        print(f"UNEXPECTED {o.cell}: {o.result} {o.detail[:300]}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

"""The read-only commands' wall time: ``ckpt checkpoints list/show``, ``state operator/channel/
handles``, ``recover --dry-run``, ``report`` and ``pipelines``, each a new ``ckpt`` process (what a
person waits for, Python's start-up and imports included), on a warehouse that already holds
checkpoints (by default the demo's, ``make demo``). They read with delta-rs and start no JVM:
a command that started one (a ``java`` child) fails the run, as does one that leaves anything in
its current folder. No Spark here. Each command runs once untimed first (the bytecode cache warm,
as an installed package has it), then ``--repeat`` times.

One row per command in ``bench/results.jsonl`` (section ``cli``; the best of ``--repeat`` runs, and
the warehouse's size: completed checkpoints, keys in the state), and the table between the
``<!-- bench:cli -->`` markers of ``--docs``:

    python bench/cli_inspect.py                                   # warehouse/demo, 3 runs each
    python bench/cli_inspect.py --warehouse W --docs docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import results as results_log  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SECTION = "cli"
LIMIT_S = 3.0  # the promise: each under 3 s on the demo's warehouse

COMMANDS = {
    "checkpoints list": ["checkpoints", "list", "{p}"],
    "checkpoints show": ["checkpoints", "show", "{p}", "{latest}"],
    "state operator": ["state", "operator", "{p}"],
    "state channel": ["state", "channel", "{p}"],
    "state handles": ["state", "handles", "{p}"],
    "recover --dry-run": ["recover", "{p}", "--dry-run"],
    "report": ["report", "{p}", "--out", "{tmp}/report.html"],
    "pipelines": ["pipelines"],
}


def _java_children(pid: int) -> list[int]:
    """The ``java`` processes below ``pid`` (Linux /proc; empty elsewhere)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            comm = stat[stat.index("(") + 1: stat.rindex(")")]
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError):
            continue
        if comm == "java" and ppid == pid:
            found.append(int(entry.name))
    return found


def _env(cache: str) -> dict[str, str]:
    """The child's environment: this checkout first on the path, and compiled bytecode kept (in
    ``cache`` when this environment says not to write it next to the sources), as an installed
    package has it: otherwise every run would compile pandas and pyarrow from source."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if env.pop("PYTHONDONTWRITEBYTECODE", None):
        env["PYTHONPYCACHEPREFIX"] = cache
    return env


def time_command(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[float, int, bool]:
    """Wall seconds of ``ckpt <argv>`` as a new process, its exit code, and whether a java child
    appeared while it ran (polled every 50 ms)."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "checkpoint_lib.cli", *argv], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    java = False
    while proc.poll() is None:
        java = java or bool(_java_children(proc.pid))
        time.sleep(0.05)
    return time.monotonic() - started, proc.returncode, java


def measure(warehouse: str, pipeline: str, repeat: int) -> list[dict]:
    from checkpoint_lib.delta.store import DeltaCheckpointStore
    from checkpoint_lib.layout import checkpoint_root

    store = DeltaCheckpointStore.existing(checkpoint_root(warehouse, pipeline))
    completed = [c.checkpoint_id for c in store.checkpoints.all()]
    rows = []
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as cache:
        env = _env(cache)
        for name, template in COMMANDS.items():
            argv = [a.format(p=pipeline, latest=max(completed), tmp=tmp) for a in template]
            if name != "pipelines":
                argv += ["--warehouse", warehouse]
            runs = [time_command(argv, tmp, env) for _ in range(repeat + 1)][1:]  # the first warms the cache
            failed = [code for _, code, _ in runs if code != 0]
            if failed:
                raise SystemExit(f"ckpt {' '.join(argv)} exited {failed[0]}")
            if any(java for _, _, java in runs):
                raise SystemExit(f"ckpt {' '.join(argv)} started a JVM")
            if os.listdir(tmp) not in ([], ["report.html"]):
                raise SystemExit(f"ckpt {' '.join(argv)} left {os.listdir(tmp)} in the current folder")
            best = min(s for s, _, _ in runs)
            print(f"  {name:<20} {best:5.2f} s (best of {repeat})", flush=True)
            rows.append({"cli": f"ckpt {name}", "seconds": round(best, 3), "runs": repeat,
                         "checkpoints": len(completed), "pipeline": pipeline, "jvm": False})
    return rows


def render(rows: list[dict]) -> str:
    lines = ["| command | wall time (s) | JVM |", "|---|---:|---|"]
    for r in rows:
        lines.append(f"| `{r['cli']}` | {r['seconds']:.2f} | {'yes' if r['jvm'] else 'none'} |")
    return "\n".join(lines)


def machine() -> str:
    return f"{os.cpu_count()} cores, {platform.system()} {platform.machine()}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--warehouse", default=str(ROOT / "warehouse" / "demo"))
    ap.add_argument("--pipeline", default="payments")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--docs", default=None, help="rewrite the <!-- bench:cli --> section of this markdown file")
    ap.add_argument("--results", default=str(results_log.DEFAULT), help="the results log ('' to write none)")
    args = ap.parse_args(argv)
    command = "python bench/cli_inspect.py " + " ".join(argv if argv is not None else sys.argv[1:])
    log = results_log.ResultsLog(args.results or None, machine=machine(), command=command.strip())
    rows = [log.append(SECTION, r) for r in measure(args.warehouse, args.pipeline, args.repeat)]
    slow = [r["cli"] for r in rows if r["seconds"] >= LIMIT_S]
    body = f"Measured {rows[0]['measured_at']} UTC on {rows[0]['machine']}, commit {rows[0]['commit']}; " \
           f"{rows[0]['checkpoints']} completed checkpoints. Command: `{log.command}`\n\n{render(rows)}"
    if args.docs:
        from bench.compare import write_section

        write_section(Path(args.docs), SECTION, body)
    print(json.dumps({"slow": slow}))
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())

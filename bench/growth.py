"""Growth over a long run: disk use of ``_checkpoints/<p>`` and the control plane's time per
checkpoint after 50 and after 1,000 checkpoints, with ``ckpt maintain``'s rules every 50
(``checkpoint_lib.maintenance``), and without them for comparison. No Spark: it drives the control
plane exactly as a payments run does, through ``DeltaCheckpointStore`` and ``CheckpointRequests``.

One simulated hourly run per checkpoint, as ``payments_run`` + ``payments_snapshot`` leave it:
a checkpoint request made and honoured, a session of each stage begun, the id reserved, the
``pending`` row, the source acks, the acks of the 3 keyed subtasks (a pinned state version each)
and of the 2 x 3 sink subtasks (their transactions), the ``completed`` row (``retained=5``, a
savepoint every 200 checkpoints), both sessions ended, one ``validations`` row, and a GX result and
Data Docs page per checkpoint (files of a real run's size, 16 and 40 KiB). What is timed, per
checkpoint, is the store's work (the rows above and the reads each write decides on): what a
checkpoint costs the runner in the control plane.

Maintenance runs every ``--maintain-every`` checkpoints with the clock of the simulation (an hour per
checkpoint: a maintenance every 50 is about every other day of hourly runs) and, because nothing
else runs in this process, a zero grace for removed files (in a deployment Delta's 7 days: the
files removed in the last week stay, a constant more). Delta logs are not simulated: Delta deletes
the control tables' commit files after 30 days of wall-clock time, which a run of a few minutes
never reaches, so ``_delta_log`` is measured and shown apart.

    python bench/growth.py                      # 1,000 checkpoints, maintenance every 50, and without
    python bench/growth.py --docs docs/reliability.md   # also rewrite the table in the docs
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from checkpoint_lib.checkpoint_requests import CheckpointRequests  # noqa: E402
from checkpoint_lib.core.acks import KeyedAckState, PinnedState, SinkAckState, SourceAckState  # noqa: E402
from checkpoint_lib.core.checkpoints import CompletedCheckpoint  # noqa: E402
from checkpoint_lib.core.keygroups import KeyGroupRange  # noqa: E402
from checkpoint_lib.core.twophase import SinkSnapshot, Transaction  # noqa: E402
from checkpoint_lib.core.types import CheckpointKind, SubtaskAck, SubtaskId, sink_operator  # noqa: E402
from checkpoint_lib.delta.store import DeltaCheckpointStore  # noqa: E402
from checkpoint_lib.history import human_bytes  # noqa: E402
from checkpoint_lib.layout import checkpoint_root, reservation_markers  # noqa: E402
from checkpoint_lib.maintenance import RetentionPolicy, maintain  # noqa: E402
from checkpoint_lib.quality.records import ValidationLog  # noqa: E402
from checkpoint_lib.quality.result import QualityResult  # noqa: E402

PIPELINE = "payments"
SOURCES, KEYED, SINKS = 2, 3, ("ledger", "balances")
T0 = 1_767_225_600.0  # 2026-01-01 UTC: the simulation's clock, an hour per checkpoint
MARK_BEGIN, MARK_END = "<!-- bench:growth -->", "<!-- /bench:growth -->"


def acks_of(cid: int, epoch: int) -> dict[SubtaskId, SubtaskAck]:
    source = SourceAckState(version=cid, next_seq=4 * cid, barrier_seq=4 * cid - 1,
                            barrier_seqs={s: 4 * cid - 1 for s in range(SOURCES)})
    acks = {SubtaskId("source", i): SubtaskAck(state=source.to_state()) for i in range(SOURCES)}
    span = 128 // KEYED
    for i in range(KEYED):
        hi = 127 if i == KEYED - 1 else (i + 1) * span - 1
        acks[SubtaskId("balance", i)] = SubtaskAck(
            state=KeyedAckState(4 * cid - 1, PinnedState(3 * cid, KeyGroupRange(i * span, hi))).to_state(),
            state_size_bytes=40_000, alignment_ms=3.0, duration_ms=40.0)
    for sink in SINKS:
        for i in range(KEYED):
            txn = Transaction(cid, f"{PIPELINE}.{sink}-{i}-{cid % 4}", epoch, cid)
            snap = SinkSnapshot(Transaction(cid + 1, f"{PIPELINE}.{sink}-{i}-{(cid + 1) % 4}", epoch), (txn,), cid + 2)
            acks[SubtaskId(sink_operator(sink), i)] = SubtaskAck(state=SinkAckState(snap).to_state())
    return acks


class Simulation:
    def __init__(self, warehouse: Path, *, retained: int = 5, savepoint_every: int = 200):
        self.warehouse = warehouse
        self.root = checkpoint_root(warehouse, PIPELINE)
        self.quality = warehouse / "_quality" / PIPELINE
        self.store = DeltaCheckpointStore.open(self.root, retained=retained)
        self.requests = CheckpointRequests(self.root)
        self.validations = ValidationLog(self.root)
        self.epoch = self.store.epochs.begin()
        self.store.sessions.record_restored(self.epoch, None, {"source": {}, "keyed": {}})
        self.sessions = {"source": 0, "keyed": 0}
        self.savepoint_every = savepoint_every
        self.gx_json, self.gx_html = b"{" + b" " * 16_000 + b"}", b"<html>" + b" " * 40_000 + b"</html>"

    def now(self, cid: int) -> float:
        return T0 + 3600.0 * cid

    def checkpoint(self) -> tuple[int, float]:
        """One hourly run; returns the checkpoint id and the seconds the store's work took."""
        store = self.store
        cid = store.ids.peek()
        t = self.now(cid)
        kind = CheckpointKind.SAVEPOINT if cid % self.savepoint_every == 0 else CheckpointKind.CHECKPOINT
        self.requests.create(f"scheduled__{cid}", "payments_snapshot", now=t)
        started = time.perf_counter()
        for stage in ("source", "keyed"):
            self.sessions[stage] = store.sessions.begin(self.epoch, stage, after=self.sessions[stage])
        got = store.ids.get_and_increment()
        assert got == cid, (got, cid)
        self.requests.honour(self.requests.open(), cid, self.epoch)
        store.checkpoints.record_pending(cid, kind, t, self.epoch)
        acks = acks_of(cid, self.epoch)
        store.acks.record(cid, {s: a for s, a in acks.items() if s.operator == "source"}, self.epoch, t)
        store.acks.record(cid, {s: a for s, a in acks.items() if s.operator != "source"}, self.epoch, t + 1)
        store.checkpoints.add(CompletedCheckpoint(cid, kind, t, t + 2, acks, {s: t + 1 for s in acks}), epoch=self.epoch)
        for stage in ("source", "keyed"):
            store.sessions.end(self.epoch, stage, self.sessions[stage], {"at": cid})
        spent = time.perf_counter() - started
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(t))
        run = f"{PIPELINE}-checkpoint-c{cid}-e{self.epoch}-{stamp}Z"
        self.validations.record(QualityResult(
            pipeline=PIPELINE, kind="checkpoint", checkpoint_id=cid, epoch=self.epoch, restored_checkpoint_id=None,
            run_name=run, data_docs="", started_at=t, finished_at=t + 1, validation_id=f"v{cid}"))
        for base, body, suffix in ((self.quality / "gx/uncommitted/validations", self.gx_json, ".json"),
                                   (self.quality / "data_docs/validations", self.gx_html, ".html")):
            f = base / PIPELINE / "per_checkpoint" / "subtasks" / run / f"{stamp}.000000Z" / f"warehouse{suffix}"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(body)
        return cid, spent


def disk(path: Path) -> tuple[int, int]:
    """(bytes under ``path``, of which in ``_delta_log`` directories)."""
    total = log = 0
    for dirpath, _dirs, names in os.walk(path):
        size = sum(os.lstat(os.path.join(dirpath, n)).st_size for n in names)
        total += size
        if "_delta_log" in Path(dirpath).parts:
            log += size
    return total, log


def run(base: Path, checkpoints: int, every: int | None, marks: list[int], log) -> dict[str, Any]:
    """Drive ``checkpoints`` checkpoints (maintenance every ``every``, or never); at each mark,
    the disk use before and after that mark's maintenance and the per-checkpoint times of the
    ``every`` checkpoints before it."""
    sim = Simulation(base)
    policy = RetentionPolicy(file_retention_hours=0.0, control_log_hours=0.0)
    times: list[float] = []
    out: dict[str, Any] = {"marks": {}, "maintain_s": []}
    window = every or 50
    started = time.monotonic()
    for n in range(1, checkpoints + 1):
        _, spent = sim.checkpoint()
        times.append(spent)
        mark: dict[str, Any] = {}
        if n in marks:
            mark["before"] = disk(sim.root)
            mark["quality_before"] = disk(sim.quality)[0]
            recent = times[-window:]
            mark["median_ms"] = statistics.median(recent) * 1000
            mark["p90_ms"] = sorted(recent)[int(0.9 * (len(recent) - 1))] * 1000
            mark["rows"] = len(sim.store.checkpoints.history())
            mark["markers"] = len(os.listdir(reservation_markers(sim.root, "ids")))
        if every and n % every == 0:
            t = time.monotonic()
            report = maintain(sim.warehouse, PIPELINE, now=sim.now(n) + 1800, policy=policy)
            out["maintain_s"].append(time.monotonic() - t)
            assert report.needs is not None and not [r for r in report.rules if r.skipped and "Spark" not in r.skipped]
        if n in marks:
            mark["after"] = disk(sim.root)
            mark["quality_after"] = disk(sim.quality)[0]
            mark["rows_after"] = len(sim.store.checkpoints.history())
            mark["markers_after"] = len(os.listdir(reservation_markers(sim.root, "ids")))
            out["marks"][n] = mark
            log(f"  {'maintained' if every else 'never maintained'}: {n} checkpoints, "
                f"{mark['median_ms']:.1f} ms per checkpoint, _checkpoints/{PIPELINE} {human_bytes(mark['after'][0])} "
                f"({human_bytes(mark['after'][1])} of it Delta logs), {mark['rows_after']} checkpoint ids, "
                f"{time.monotonic() - started:.0f} s so far")
    retained = [c.checkpoint_id for c in DeltaCheckpointStore(sim.root).checkpoints.all()]
    out["retained"] = retained
    return out




def render(results: dict[str, Any], marks: list[int], every: int) -> str:
    lo, hi = marks[0], marks[-1]
    rows = []
    for label, key in (("with `ckpt maintain` every %d" % every, "maintained"), ("never maintained", "baseline")):
        r = results.get(key)
        if r is None:
            continue
        a, b = r["marks"][lo], r["marks"][hi]

        def cell(m, after=True):
            total, logs = m["after" if after else "before"]
            return f"{human_bytes(total)} ({human_bytes(total - logs)} + {human_bytes(logs)} log)"

        rows.append([label,
                     f"{a['median_ms']:.0f} / {b['median_ms']:.0f} ms ({b['median_ms'] / a['median_ms']:.2f}x)",
                     f"{a['p90_ms']:.0f} / {b['p90_ms']:.0f} ms",
                     f"{cell(a)} / {cell(b)}",
                     f"{human_bytes(a['after'][0] - a['after'][1])} / {human_bytes(b['after'][0] - b['after'][1])} "
                     f"({(b['after'][0] - b['after'][1]) / max(1, a['after'][0] - a['after'][1]):.2f}x)",
                     f"{a['rows_after']} / {b['rows_after']}",
                     f"{a['markers_after']} / {b['markers_after']}",
                     f"{human_bytes(a['quality_after'])} / {human_bytes(b['quality_after'])}"])
    head = ["", f"control plane per checkpoint, median (at {lo} / {hi})", "p90",
            f"`_checkpoints/{PIPELINE}` (data + Delta log)", "without the Delta logs",
            "checkpoint ids in the table", "`_ids` markers", f"`_quality/{PIPELINE}`"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def write_docs(path: Path, text: str) -> None:
    doc = path.read_text()
    if MARK_BEGIN not in doc or MARK_END not in doc:
        raise SystemExit(f"{path} has no {MARK_BEGIN} ... {MARK_END} section")
    head, rest = doc.split(MARK_BEGIN, 1)
    _, tail = rest.split(MARK_END, 1)
    path.write_text(f"{head}{MARK_BEGIN}\n{text}\n{MARK_END}{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoints", type=int, default=1000)
    ap.add_argument("--maintain-every", type=int, default=50)
    ap.add_argument("--no-baseline", action="store_true", help="skip the run without maintenance")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one, deleted)")
    ap.add_argument("--docs", default=None, help="rewrite the table between the growth markers of this file")
    args = ap.parse_args(argv)
    every = args.maintain_every
    marks = [every, args.checkpoints]
    base = Path(args.dir or tempfile.mkdtemp(prefix="ckpt-growth-"))
    log = lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", flush=True)  # noqa: E731
    started = time.monotonic()
    results: dict[str, Any] = {}
    try:
        log(f"{args.checkpoints} checkpoints, maintenance every {every}")
        results["maintained"] = run(base / "maintained", args.checkpoints, every, marks, log)
        if not args.no_baseline:
            log(f"{args.checkpoints} checkpoints, never maintained")
            results["baseline"] = run(base / "baseline", args.checkpoints, None, marks, log)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    m = results["maintained"]
    table = render(results, marks, every)
    command = "python bench/growth.py" + (f" {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    cpus = os.cpu_count()
    footer = (f"Generated by `{command}` on {time.strftime('%Y-%m-%d')}, {platform.machine()}, {cpus} cores, "
              f"Python {platform.python_version()}, local disk; {time.monotonic() - started:.0f} s in all. "
              f"A maintenance took {statistics.median(m['maintain_s']):.2f} s (median of "
              f"{len(m['maintain_s'])}); retained at the end: {m['retained']}.")
    print(table)
    print(footer)
    if args.docs:
        write_docs(Path(args.docs), f"{table}\n\n{footer}")
        log(f"wrote {args.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

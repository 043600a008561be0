"""The lakehouse-neighbours matrix: what other tools do to our tables, at every moment that matters.

A :class:`Cell` is one maintenance or foreign operation (:data:`OPERATIONS`: OPTIMIZE, Z-ORDER,
VACUUM with the default retention and with 0 hours, RESTORE, an external append, a schema change, a
deletion-vectors upgrade, a log checkpoint) on one side of the payments pipeline or on its keyed
state (:data:`TARGETS`: its landing table, both its sink tables, its state table under the
checkpoint root, which a lakehouse-wide OPTIMIZE or VACUUM reaches too, or the channel log the
unchained layout writes there between the source and the keyed operator) at one moment (:data:`TIMINGS`):

- ``between``: after a run that completed two checkpoints, before the next run;
- ``down:<phase>``: while the pipeline is down after a kill in a two-phase-commit window (``complete``:
  checkpoint 2's transactions pre-committed, the checkpoint not complete; ``commit``: complete, not
  committed; ``sink_commit``: the ledger committed it, the balances not), before the recovery;
- ``during``: inside a running step (the source's step planned and its files not read yet; the
  sinks' checkpoint complete and their commit not started), the run then goes on.

Each cell ends exactly once (the outputs equal the independent computation of
:mod:`checkpoint_lib.verify`; rows a foreign writer appended to a sink are still there) or with a
clear refusal (one of :data:`REFUSALS`, whose message says what happened and what to do); anything
else (a mismatch, an engine error) fails it. In-process runs with the test's SparkSession; the kills
are :func:`in_process_kills.raise_at`-style exceptions at the runner's kill points (the chaos suite
kills real processes and can draw these operations between its kills: ``chaos_harness.MAINTENANCE``).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

ROWS = 120  # per landing version; one version per checkpoint
ACCOUNTS = 20
TARGETS = {"source": ("landing/payments",), "sinks": ("gold/ledger", "gold/balances"),
           "state": ("_checkpoints/payments/state/balance",), "logs": ("_checkpoints/payments/channels/source_balance",)}
UNCHAINED = ("logs",)
"""The targets whose cells run the pipeline unchained (``chaining=False``: its source edge a channel log)."""
TIMINGS = ("between", "down:complete", "down:commit", "down:sink_commit", "during")
DURING = {"source": ("source_read", 2), "sinks": ("commit", 2), "state": ("flush_merge", 2), "logs": ("channel_write", 2)}
"""Where ``during`` runs the operation: the state's between a flush's sink writes and its state run,
the channel log's before a step's append (the log then holds the steps before, some not read yet)."""
REFUSALS = ("SinkConfigurationError", "RollbackUnavailableError", "SinkTableRewoundError", "SourceFilesLostError",
            "SchemaMismatchError", "NotAppendOnlyError", "PendingFilesLostError", "ChangeFeedUnavailableError",
            "StateTableChangedError", "StateFilesLostError")
"""The clear refusals: each says what happened to which table and what to run."""


def _sql(spark, statement: str) -> None:
    spark.sql(statement).collect()


def _optimize(spark, path: str) -> None:
    _sql(spark, f"OPTIMIZE delta.`{path}`")


def _zorder(spark, path: str) -> None:
    """Z-ORDER by ``account`` (payments' tables), else by the table's first column."""
    names = spark.read.format("delta").load(path).columns
    _sql(spark, f"OPTIMIZE delta.`{path}` ZORDER BY (`{'account' if 'account' in names else names[0]}`)")


def _vacuum(spark, path: str) -> None:
    _sql(spark, f"VACUUM delta.`{path}`")  # the default retention (7 days), the safety check on


def _vacuum_0h(spark, path: str) -> None:
    from checkpoint_lib.spark.tables import session_confs

    _optimize(spark, path)  # so there is something for it to delete: the files compacted away
    with session_confs(spark, {"spark.databricks.delta.retentionDurationCheck.enabled": "false"}):
        _sql(spark, f"VACUUM delta.`{path}` RETAIN 0 HOURS")


def _restore(spark, path: str) -> None:
    """RESTORE to the version before the newest commit that added rows: the latest landing on a
    source, the pipeline's latest checkpoint commit on a sink (a fence after it adds none)."""
    log = Path(path) / "_delta_log"
    for version in sorted((int(p.stem) for p in log.glob("*.json") if p.stem.isdigit()), reverse=True):
        actions = [json.loads(line) for line in (log / f"{version:020d}.json").read_text().splitlines() if line]
        if any(a.get("add", {}).get("dataChange") for a in actions):
            _sql(spark, f"RESTORE TABLE delta.`{path}` TO VERSION AS OF {version - 1}")
            return
    raise AssertionError(f"{path}: no commit added rows")


EXTERNAL = "ext-"  # the key prefix of a foreign writer's rows


def _external_append(spark, path: str) -> None:
    """Another writer appends rows of the table's own columns (a Spark append, as any tool would)."""
    from pyspark.sql import functions as F

    columns = spark.read.format("delta").load(path).schema
    rows = spark.range(5).select(*[
        (F.concat(F.lit(f"{EXTERNAL}{f.name}-"), F.col("id").cast("string")) if f.dataType.typeName() == "string"
         else F.col("id").cast(f.dataType) if f.dataType.typeName() in ("long", "integer")
         else F.current_timestamp().cast(f.dataType) if f.dataType.typeName() == "timestamp"
         else F.lit(None).cast(f.dataType)).alias(f.name)
        for f in columns.fields
    ])
    rows.write.format("delta").mode("append").save(path)


def _schema_change(spark, path: str) -> None:
    """A new nullable column (``note``, ``note_1``, ... when done again)."""
    names = set(spark.read.format("delta").load(path).columns)
    column = next(c for c in ("note", *(f"note_{i}" for i in range(1, 100))) if c not in names)
    _sql(spark, f"ALTER TABLE delta.`{path}` ADD COLUMNS ({column} STRING)")


def _dv_upgrade(spark, path: str) -> None:
    _sql(spark, f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")


def _log_checkpoint(spark, path: str) -> None:
    from deltalake import DeltaTable

    DeltaTable(path).create_checkpoint()


OPERATIONS: dict[str, tuple[str, Callable]] = {
    "optimize": ("OPTIMIZE", _optimize),
    "zorder": ("OPTIMIZE ZORDER BY (account)", _zorder),
    "vacuum": ("VACUUM (default retention, 7 days)", _vacuum),
    "vacuum_0h": ("OPTIMIZE, then VACUUM RETAIN 0 HOURS (safety check off)", _vacuum_0h),
    "restore": ("RESTORE to the version before the latest that added rows", _restore),
    "external_append": ("another writer's append of 5 rows", _external_append),
    "schema_change": ("ALTER TABLE ADD COLUMNS (note STRING)", _schema_change),
    "dv_upgrade": ("enable deletion vectors (a protocol upgrade)", _dv_upgrade),
    "log_checkpoint": ("a Delta log checkpoint (delta-rs)", _log_checkpoint),
}


@dataclass(frozen=True)
class Cell:
    operation: str
    target: str
    timing: str

    @property
    def id(self) -> str:
        return f"{self.operation}-{self.target}-{self.timing}"


CELLS = [Cell(o, t, m) for o in OPERATIONS for t in TARGETS for m in TIMINGS]


@dataclass
class Outcome:
    cell: str
    result: str = ""  # "exactly once", "refused" or "FAILED"
    detail: str = ""  # the refusal's message, or what went wrong
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


class Killed(RuntimeError):
    pass


def refusal(exc: BaseException) -> str | None:
    """The name of the clear refusal ``exc`` is (one of :data:`REFUSALS`; a sink commit that failed
    with one is reported as a ``CommitError`` holding it), or None."""
    name = type(exc).__name__
    if name in REFUSALS:
        return name
    inner = {type(e).__name__ for _, e in getattr(exc, "errors", None) or []}
    return inner.pop() if name == "CommitError" and len(inner) == 1 and inner <= set(REFUSALS) else None


def operate(spark, warehouse: str, operation: str, target: str) -> None:
    for table in TARGETS[target]:
        OPERATIONS[operation][1](spark, f"{warehouse}/{table}")


def _hook(phase: str, n: int, action: Callable[[], None]) -> Callable[[str], None]:
    hits = 0

    def reached(p: str) -> None:
        nonlocal hits
        if p == phase:
            hits += 1
            if hits == n:
                action()

    return reached


def _kill(phase: str) -> None:
    raise Killed(f"killed at {phase}")


def _prefix(spark, w: str, timing: str, runner, land) -> None:
    """What every cell of ``timing`` does before its operation: the input landed, and for
    ``between`` a run that completed two checkpoints, for ``down:<phase>`` a run killed there."""
    if timing == "between":
        land(1), land(2)
        runner().run()
        land(3)
        return
    for seed in (1, 2, 3):
        land(seed)
    if timing.startswith("down:"):
        first = runner()
        phase = timing.split(":")[1]
        first.ctx.kills.reached = _hook(phase, 2, lambda: _kill(phase))
        try:
            first.run()
        except Killed:
            return
        raise AssertionError(f"the run never reached {phase}:2")


def _reuse(spark, w: str, golden: Path) -> None:
    """Put the warehouse back to ``golden`` (a copy taken at the same path, so every absolute path
    it records still holds), and make Spark forget what it cached of its tables."""
    shutil.rmtree(w)
    shutil.copytree(golden, w, symlinks=True)
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


def run_cell(spark, warehouse: str | Path, cell: Cell, prefixes: dict[str, Path] | None = None) -> Outcome:
    """Land the input, run the cell's moment with its operation, go on to the end, check.
    ``prefixes`` ((layout, timing) -> a copy of the warehouse after :func:`_prefix`, taken at the same
    path) lets cells of one layout and timing share their identical beginning; filled as it goes."""
    from checkpoint_lib.pipelines import get
    from checkpoint_lib.pipelines.payments import generate
    from checkpoint_lib.spark.runner import PipelineRunner

    w = str(warehouse)
    started = time.monotonic()
    out = Outcome(cell.id)

    def runner():
        return PipelineRunner(get("payments"), w, spark, rows_per_checkpoint=ROWS,
                              chaining=cell.target not in UNCHAINED)

    def land(seed: int) -> None:
        generate(spark, w, ROWS, bad_fraction=0.05, accounts=ACCOUNTS, seed=seed)

    def op() -> None:
        operate(spark, w, cell.operation, cell.target)

    try:
        layout = "unchained" if cell.target in UNCHAINED else "chained"
        golden = None if prefixes is None else prefixes.get((layout, cell.timing))
        if golden is not None and golden.exists():
            _reuse(spark, w, golden)
        else:
            shutil.rmtree(w, ignore_errors=True)
            Path(w).mkdir(parents=True)
            _prefix(spark, w, cell.timing, runner, land)
            if prefixes is not None:
                golden = Path(f"{w}.{layout}.{cell.timing.replace(':', '-')}.golden")
                shutil.copytree(w, golden, symlinks=True)
                prefixes[(layout, cell.timing)] = golden
        if cell.timing == "during":
            r = runner()
            r.ctx.kills.reached = _hook(*DURING[cell.target], op)
            try:
                r.run()
            except Exception as exc:  # noqa: BLE001 - a refusal may pass (the next run recovers); else classified below
                if refusal(exc) is None:
                    raise
                out.extra["first run refused"] = f"{refusal(exc)}: {str(exc)[:500]}"
        else:
            op()
        runner().run()  # the recovery, or whatever is left to do (as an Airflow retry would)
    except Exception as exc:  # noqa: BLE001 - classified below
        out.seconds = time.monotonic() - started
        if refusal(exc) is not None:
            out.result, out.detail = "refused", f"{refusal(exc)}: {exc}"
        else:
            out.result, out.detail = "FAILED", f"{type(exc).__name__}: {str(exc)[:2000]}"
        return out
    try:
        out.result, out.detail = check(spark, w, cell)
    except Exception as exc:  # noqa: BLE001 - the outputs could not be read: the cell failed
        out.result, out.detail = "FAILED", f"checking the outputs: {type(exc).__name__}: {str(exc)[:2000]}"
    out.seconds = time.monotonic() - started
    return out


def check(spark, warehouse: str, cell: Cell) -> tuple[str, str]:
    """Exactly once: a foreign writer's rows are still in the sinks (then set aside), and the
    outputs equal the independent computation."""
    from checkpoint_lib.verify import check_payments, read_delta

    if cell.operation == "external_append" and cell.target == "sinks":
        for table, key in (("gold/ledger", "event_id"), ("gold/balances", "account")):
            rows = read_delta(f"{warehouse}/{table}")
            foreign = rows[rows[key].astype(str).str.startswith(EXTERNAL)]
            if len(foreign) != 5:
                return "FAILED", f"{table} holds {len(foreign)} of the 5 rows another writer appended"
            spark.sql(f"DELETE FROM delta.`{warehouse}/{table}` WHERE {key} LIKE '{EXTERNAL}%'").collect()
    result = check_payments(warehouse)
    if not result.ok:
        return "FAILED", result.summary()
    return "exactly once", f"{result.ledger_rows} ledger rows, {result.dlq_rows} dead letters"


def expected(cell: Cell) -> str:
    """What the cell must end with: ``exactly once``, or ``refused`` with the error named."""
    if cell.target == "state":  # a foreign write is refused by the next flush, and the run after recovers
        return "exactly once"
    if cell.target == "logs":  # a reader reads its own epoch's events past its cursor, nothing else: a
        return "exactly once"  # RESTORE takes away what was read or is rewritten; a foreign row is ignored
    if cell.target == "source":
        if cell.operation == "vacuum_0h":  # the files of versions still to be read are gone
            return "refused SourceFilesLostError"
        if cell.operation == "restore":  # a commit that removed rows: a source cannot un-read them
            return "refused NotAppendOnlyError"
    elif cell.operation == "restore":  # the stamps say more is committed than the table holds
        return "refused SinkTableRewoundError"
    return "exactly once"


def as_expected(outcome: Outcome) -> bool:
    cell = next(c for c in CELLS if c.id == outcome.cell)
    want = expected(cell)
    if want == "exactly once":
        return outcome.result == want
    return outcome.result == "refused" and outcome.detail.startswith(want.split()[1] + ":")


def record(path: str | Path, outcome: Outcome) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(asdict(outcome)) + "\n")


def load(path: str | Path) -> dict[str, Outcome]:
    if not Path(path).exists():
        return {}
    outcomes = [Outcome(**json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]
    return {o.cell: o for o in outcomes}


# --- the report ----------------------------------------------------------------------------------

BEGIN = "<!-- BEGIN make neighbours: generated, do not edit -->"
END = "<!-- END make neighbours -->"


def render(outcomes: dict[str, Outcome], commit: str) -> str:
    """The matrix of docs/reliability.md (markdown): one table per side, operations by moments."""
    done = [o for o in outcomes.values() if o.cell in {c.id for c in CELLS}]
    failed = [o for o in done if o.result == "FAILED"]
    lines = [
        f"Generated by `make neighbours` at commit {commit}: {len(done)} of {len(CELLS)} cells, "
        f"{sum(o.result == 'exactly once' for o in done)} exactly once, {sum(o.result == 'refused' for o in done)} "
        f"clear refusals, **{len(failed)} failed**; {sum(o.seconds for o in done) / 60:.0f} min.",
        "",
    ]
    short = {"exactly once": "exactly once", "refused": "refused", "FAILED": "**FAILED**", "": "not run"}
    for target, tables in TARGETS.items():
        lines += [f"**{target}** ({', '.join(f'`{t}`' for t in tables)}):", "",
                  "| operation | " + " | ".join(TIMINGS) + " |", "|---|" + "---|" * len(TIMINGS)]
        for op, (what, _) in OPERATIONS.items():
            cells = []
            for timing in TIMINGS:
                o = outcomes.get(Cell(op, target, timing).id)
                note = (f" ({o.detail.split(':')[0]})" if o and o.result == "refused"
                        else " (on the next run)" if o and o.extra.get("first run refused") else "")
                cells.append(short[o.result if o else ""] + note)
            lines.append(f"| {what} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["\"(on the next run)\": the run the operation interrupted stopped with a clear refusal (a commit whose "
              "files a VACUUM deleted: `PendingFilesLostError`), and the next run recovered by itself, exactly once.", ""]
    refusals: dict[str, str] = {}
    for o in sorted(done, key=lambda o: o.cell):
        if o.result == "refused":
            refusals.setdefault(o.detail.split(":")[0], f"{o.cell}: {o.detail}")
    if refusals:
        lines += ["One message of each refusal, as the user reads it:", ""]
        lines += [f"- `{name}` ({text.split(':')[0]}): {text.split(': ', 2)[-1][:700]}" for name, text in refusals.items()]
        lines.append("")
    if failed:
        lines += ["Failed cells:", ""] + [f"- {o.cell}: {o.detail[:300]}" for o in failed] + [""]
    return "\n".join(lines).rstrip() + "\n"

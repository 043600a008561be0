"""The chaos harness: kill -9 real ``ckpt run`` processes at random instants, recover, compare.

A :class:`Scenario` is drawn from a seed: a pipeline (``payments`` or ``transfers``; ``orders`` from
seed :data:`ORDERS_SEEDS` on; the ``enrichment`` graph from :data:`ENRICHMENT_SEEDS` on, in one
process, and from :data:`ENRICHMENT_GROUPS_SEEDS` on as a process per vertex, the run DAG's
layout: every edge a channel log, each kill in one of the processes; ``payments_pg`` from
:data:`PG_SEEDS` on, its balances and ledger also written to a real PostgreSQL server by the
two-phase-commit sink, killed inside that sink's commit and rollback too), a barrier
mode (every mode the pipeline supports; a lagging source subtask in the non-aligned modes, so
records are in flight and unaligned checkpoints carry channel state), a first kill and then up to
three more, each during the recovery the one before it left to do (a chain: recovery killed,
recovered again, killed again). A kill is either precise - a phase and hit count
(``CKPT_KILL_AT``, checkpoint_lib.killpoints.KILL_PHASES: processing, snapshot and channel-state
writing, pre-commit, commit, between two sinks' commits, checkpoint metadata writes, recovery and
restore) - or a SIGKILL from outside after a random number of seconds, attributed to the phase it
interrupted through the runner's phase trace (``CKPT_PHASE_TRACE``).

After the kills the same command runs once more, undisturbed: it must recover by itself, and the
outputs must equal the independent pandas computation (checkpoint_lib.verify): exactly once, or
for at-least-once nothing lost; for ``payments_pg`` the database's tables too, with no transaction
left prepared on the server (:func:`postgres_problems`). Each run's :class:`Outcome` is one JSON line; :func:`tally`
and :func:`render` turn a results file into the tables of docs/reliability.md.

One command runs it all and rewrites docs/reliability.md: ``make chaos`` (tests/chaos/run_chaos.py).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter, defaultdict
import dataclasses
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from checkpoint_lib.submit import ckpt_run_argv, ckpt_run_env

ROWS = 400  # per landing version and per checkpoint
VERSIONS = 3
TIMEOUT = float(os.environ.get("CKPT_TEST_RUN_TIMEOUT", "900"))
PG_PIPELINE = "payments_pg"  # the PostgreSQL scenarios' (seeds PG_SEEDS on)

MODES = {
    "payments": ("aligned", "unaligned", "aligned_with_timeout", "at_least_once"),
    "transfers": ("unaligned", "aligned_with_timeout"),  # a cycle: aligned modes cannot checkpoint it
    # replaced state (dedup within a window): at-least-once would repeat state updates by design
    "orders": ("aligned", "unaligned", "aligned_with_timeout"),
    # a graph runs in one process with every edge chained: every mode is aligned there
    "enrichment": ("aligned",),
    # the exactly-once modes: the database check counts a ledger row written twice as a mismatch
    PG_PIPELINE: ("aligned", "unaligned", "aligned_with_timeout"),
}
ORDERS_SEEDS = 1000
"""Seeds from here on are ``orders`` scenarios (the seeds below keep the scenarios they always drew)."""
ENRICHMENT_SEEDS = 10_000
"""Seeds from here on are ``enrichment`` scenarios (a graph: two inputs, a two-input keyed operator,
two keyed operators after it; its own kill points: no channel log, no channel state)."""
ENRICHMENT_KILLS = {
    "source_read": 3, "dlq": 2, "flush_stage": 3, "flush_merge": 3, "snapshot": 3, "ack": 3, "complete": 3,
    "commit": 3, "sink_commit": 4,
}
"""Where a first kill of an ``enrichment`` run may land (its graph runner's phases; three steps
surely reach each count)."""
ENRICHMENT_GROUPS_SEEDS = 20_000
"""Seeds from here on are ``enrichment`` scenarios in the per-vertex layout: a pass runs each process
group (``ckpt run enrichment --stage G``) in topological order, as the run DAG's tasks do; a kill
lands in one group's process and ends the pass (the tasks after it do not run); every edge is a
channel log and the operators are gates, aligned or unaligned."""
GROUP_KILLS = {
    "sources": {"source_read": 3, "dlq": 2, "channel_write": 3, "snapshot": 2, "ack": 2},
    "operators": {"flush_stage": 3, "flush_merge": 3, "channel_write": 3, "snapshot": 4, "ack": 4,
                  "channel_state": 1, "complete": 3, "commit": 2, "sink_commit": 2},
}
"""Where a first kill of a per-vertex ``enrichment`` run may land: the sources' process, or an
operator's (a gate; ``channel_write`` only in one that sends on, ``channel_state`` only unaligned)."""
MAINTENANCE_SEEDS = 2000
"""Seeds from here on draw their scenario as ``seed - MAINTENANCE_SEEDS`` does, and besides one
maintenance operation of :data:`MAINTENANCE` on one of the pipeline's tables after each kill,
before the next run (another tool's work while the pipeline is down)."""
MAINTENANCE = ("optimize", "zorder", "vacuum", "log_checkpoint", "dv_upgrade", "schema_change")
"""The operations of the lakehouse-neighbours matrix (tests/neighbours.py) that end exactly once on
either side of every pipeline: drawn between kills. (The matrix covers the others, which end in a
refusal or leave foreign rows the verifier would count.)"""
STATE_SEEDS = 40_000
"""Seeds from here on draw their scenario as ``seed - STATE_SEEDS`` does (``payments`` or ``transfers``;
every third one as the ``orders`` seed ``ORDERS_SEEDS + seed - STATE_SEEDS`` does), with the keyed
state's runs folded every :data:`STATE_FOLDS` flushes (``--state-compact-every``: a 3-version run
otherwise never folds), half of them first killed inside a fold (``state_compact``: the flush's run
committed, the fold not yet) and a fifth between a run's files and their commit (``state_run``, reached
as often as ``flush_merge``)."""
STATE_FOLDS = {1: 3, 2: 1}
"""``--state-compact-every`` of a :data:`STATE_SEEDS` scenario, and the highest ``state_compact`` hit
a 3-version run surely reaches with it (a fold at every flush, or at every second one)."""
# Where a first kill may land, with the highest hit count that a 3-version run surely reaches
# (per-subtask phases are hit once per keyed subtask and checkpoint).
FIRST_KILLS = {
    "source_read": 3, "dlq": 2, "channel_write": 3, "source_ack": 3, "flush_stage": 3, "flush_merge": 3,
    "snapshot": 8, "channel_state": 1, "ack": 8, "complete": 3, "commit": 3, "sink_commit": 4,
    "feedback_write": 3,
}
CHAINED_KILLS = {"snapshot": 4, "ack": 4}
"""Lower counts where the source and the keyed operator run chained in one plan (see
:attr:`Scenario.chained`): the operator snapshots and acknowledges once per checkpoint there, not
once per keyed subtask (a 3-version run: 4 of each chained, 12 unchained with a lagging source)."""
# During a recovery that follows a kill (the recovery's own phases, then its first steps).
RECOVERY_KILLS = {"recover": 1, "restore": 2, "flush_merge": 1, "snapshot": 2, "commit": 1, "sink_commit": 1}
EXTERNAL = "external"  # a SIGKILL from outside at a random instant

PG_SEEDS = 30_000
"""Seeds from here on are ``payments_pg`` scenarios (:data:`PG_PIPELINE`): payments with its balances
upserted and its ledger appended to PostgreSQL by the two-phase-commit sink (``PREPARE TRANSACTION``
per subtask and flush, ``COMMIT PREPARED`` once the checkpoint completes), against the real server
:func:`run_scenario` is given (tests/pg_server.py). Checked as ``payments`` is, and the database's
tables too (:func:`postgres_problems`)."""
PG_REF = "pg_payments:pipeline"
"""What ``ckpt run`` runs for :data:`PG_PIPELINE`: tests/crash/pg_payments.py, ``payments_pg`` with its
ledger also appended to PostgreSQL (a row committed twice would show there), imported from
:data:`PG_REF_DIR` (the process's working folder, as the crash test runs it)."""
PG_REF_DIR = Path(__file__).resolve().parents[1] / "crash"
PG_KILLS = {
    "source_read": 3, "dlq": 2, "channel_write": 3, "source_ack": 3, "flush_stage": 3, "flush_merge": 3,
    "snapshot": 8, "channel_state": 1, "ack": 8, "complete": 3, "commit": 3, "sink_commit": 12,
}
"""Where a first kill of a ``payments_pg`` run may land among the runner's phases (:data:`FIRST_KILLS`
less the cycle's feedback write; four sinks commit at each checkpoint, two of them PostgreSQL's:
traced, 16 ``sink_commit`` aligned and chained, 12 unaligned with a lagging source)."""
PG_SINK_PHASES = ("prepare", "prepared_commit", "prepared_rollback")
"""The PostgreSQL sink's own kill points (checkpoint_lib.killpoints): a kill in one is a kill inside
the sink, in its write or its commit."""
PG_SINK_KILLS = {"prepared_commit": 18}
"""A first kill inside the PostgreSQL sink's commit: after one ``COMMIT PREPARED`` of a checkpoint,
before the next subtask's or sink's (drawn for a third of the precise first kills; traced, 18 aligned
and chained, 24 unaligned with a lagging source: three subtasks, two sinks, a flush per step). Not
``prepared_rollback``: a run that nothing killed before rolls nothing back. Not ``prepare``: it is
acted on in a Spark task, whose death fails the task, not the process."""
PG_SINK_RECOVERY_KILLS = {"prepared_commit": 3, "prepared_rollback": 3}
"""During a recovery, inside the PostgreSQL sink: after one of the re-commits of the checkpoint it
restores (or of the first checkpoint it completes), after one of the rollbacks of what the killed
attempt prepared for a checkpoint that never completed (half of a ``payments_pg`` run's precise
recovery kills; the other half from :data:`RECOVERY_KILLS`)."""


@dataclass(frozen=True)
class Kill:
    phase: str  # a KILL_PHASES name, or EXTERNAL
    n: int = 1  # the hit count (precise kills)
    after_s: float = 0.0  # seconds after the start (external kills)

    def __str__(self) -> str:
        return f"external@{self.after_s:.0f}s" if self.phase == EXTERNAL else f"{self.phase}:{self.n}"


@dataclass(frozen=True)
class Scenario:
    seed: int
    pipeline: str
    mode: str
    lagging: int
    first: Kill
    then: tuple[Kill, ...] = ()  # the kills during the recoveries that follow, in order
    maintenance: tuple[tuple[str, str], ...] = ()  # after each kill: (operation, table relative to the warehouse)
    groups: tuple[str, ...] = ()  # per-vertex layout: the process group each kill of the chain lands in
    compact_every: int = 0  # --state-compact-every when not 0 (the keyed state's runs folded every N flushes)

    @property
    def chain(self) -> tuple[Kill, ...]:
        return (self.first, *self.then)

    @property
    def kills(self) -> list[str]:
        """The chain's kills as text (``phase:n``, and ``@group`` in the per-vertex layout)."""
        return [f"{k}@{g}" if g else str(k) for k, g in zip(self.chain, self.groups or ("",) * len(self.chain))]

    @property
    def config(self) -> str:
        """The barrier mode, the layout when it is not one process, and the state's folds when
        drawn."""
        config = f"{self.mode}, a process per vertex" if self.groups else self.mode
        if self.compact_every:
            config += f", state folded every {self.compact_every} flush{'es' if self.compact_every > 1 else ''}"
        return config

    @property
    def chained(self) -> bool:
        """Both stages chained in the one process (the runner's default) unless a source lags, the
        pipeline has a cycle, or the first kill is in the channel log's write, which only an
        unchained run reaches (it then runs with ``--no-chaining``)."""
        return self.pipeline != "transfers" and not self.lagging and self.first.phase != "channel_write"

    @property
    def label(self) -> str:
        steps = self.kills
        for i, (operation, table) in enumerate(self.maintenance):
            steps[i] += f" +{operation}({table})"
        return f"#{self.seed} {self.pipeline}/{self.config}: {' then '.join(steps)}"


@dataclass
class Outcome:
    seed: int
    pipeline: str
    mode: str
    chain: list[str]  # the kills planned, in order (the first, then each during a recovery)
    kills: list[str] = field(default_factory=list)  # the phases actually interrupted, in order
    nth: list[int] = field(default_factory=list)  # for each of kills: its place in the chain (0: the first)
    not_reached: list[str] = field(default_factory=list)  # kills the run finished before
    survived: bool = False  # the undisturbed run recovered and the outputs were right
    mismatch: str | None = None  # what the verifier found wrong, or why recovery failed
    repeats: int = 0  # at-least-once: repeated effects (allowed)
    seconds: float = 0.0
    commit: str = ""  # the code that ran (git short hash)
    maintenance: list[str] = field(default_factory=list)  # "operation table" done after each kill, in order


def scenario(seed: int) -> Scenario:
    """The scenario of ``seed``: deterministic, so a failing seed can be run again alone."""
    if seed >= STATE_SEEDS:
        return _state_scenario(seed)
    if seed >= PG_SEEDS:
        return _pg_scenario(seed)
    if seed >= ENRICHMENT_GROUPS_SEEDS:
        return _enrichment_groups_scenario(seed)
    if seed >= ENRICHMENT_SEEDS:
        return _enrichment_scenario(seed)
    if seed >= MAINTENANCE_SEEDS:
        s = scenario(seed - MAINTENANCE_SEEDS)
        rng = random.Random(f"maintenance {seed}")
        tables = pipeline_tables(s.pipeline)
        drawn = tuple((rng.choice(MAINTENANCE), rng.choice(tables)) for _ in s.chain)
        return Scenario(seed, s.pipeline, s.mode, s.lagging, s.first, s.then, drawn)
    rng = random.Random(seed)
    pipeline = "payments" if rng.random() < 0.7 else "transfers"
    if seed >= ORDERS_SEEDS:
        pipeline = "orders"
    mode = rng.choice(MODES[pipeline])
    lagging = 1 if pipeline != "transfers" and mode != "aligned" else 0
    phases = [p for p in FIRST_KILLS if (p != "feedback_write" or pipeline == "transfers")
              and (p != "channel_state" or mode in ("unaligned", "aligned_with_timeout"))]
    if rng.random() < 0.2:
        first = Kill(EXTERNAL, after_s=round(rng.uniform(20, 80), 1))
    else:
        phase = phases[seed % len(phases)] if seed < 2 * len(phases) else rng.choice(phases)
        hits = FIRST_KILLS[phase]
        if Scenario(seed, pipeline, mode, lagging, Kill(phase)).chained:
            hits = CHAINED_KILLS.get(phase, hits)
        first = Kill(phase, rng.randint(1, hits))
    return Scenario(seed, pipeline, mode, lagging, first, _recovery_kills(rng))


def _state_scenario(seed: int) -> Scenario:
    base = seed - STATE_SEEDS
    s = scenario(ORDERS_SEEDS + base if base % 3 == 2 else base)
    rng = random.Random(f"state {seed}")
    every = rng.choice(sorted(STATE_FOLDS))
    first = s.first
    drawn = rng.random()
    if drawn < 0.5:
        first = Kill("state_compact", rng.randint(1, STATE_FOLDS[every]))
    elif drawn < 0.7:
        first = Kill("state_run", rng.randint(1, FIRST_KILLS["flush_merge"]))
    return dataclasses.replace(s, seed=seed, first=first, compact_every=every)


def _enrichment_scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    phases = list(ENRICHMENT_KILLS)
    if rng.random() < 0.2:
        first = Kill(EXTERNAL, after_s=round(rng.uniform(20, 80), 1))
    else:
        phase = phases[seed % len(phases)] if seed < ENRICHMENT_SEEDS + 2 * len(phases) else rng.choice(phases)
        first = Kill(phase, rng.randint(1, ENRICHMENT_KILLS[phase]))
    return Scenario(seed, "enrichment", "aligned", 0, first, _recovery_kills(rng))


def enrichment_groups() -> tuple[str, ...]:
    """``enrichment``'s process groups in the per-vertex layout, in the order the run DAG runs them."""
    from checkpoint_lib.graph import Layout, plan
    from checkpoint_lib.pipelines import declared

    return tuple(g.name for g in plan(declared("enrichment"), Layout.PER_VERTEX).groups)


def _enrichment_groups_scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    mode = rng.choice(("aligned", "unaligned"))
    groups = enrichment_groups()
    group = groups[seed % len(groups)]
    kills = GROUP_KILLS["sources" if group == groups[0] else "operators"]
    phases = [p for p in kills if p != "channel_state" or mode == "unaligned"]
    if rng.random() < 0.2:
        first = Kill(EXTERNAL, after_s=round(rng.uniform(10, 40), 1))
    else:
        phase = rng.choice(phases)
        first = Kill(phase, rng.randint(1, kills[phase]))
    then = _recovery_kills(rng)
    # a recovery is the first process of the next pass (the sources'); its steps' kills land in any group
    where = tuple(groups[0] if k.phase in ("recover", "restore") else rng.choice(groups) for k in then)
    return Scenario(seed, "enrichment", mode, 0, first, then, groups=(group, *where))


def _pg_scenario(seed: int) -> Scenario:
    """``payments_pg``: a mode and a lagging source as ``payments`` draws them (the exactly-once
    modes), a first kill among the runner's phases (each in turn over the first seeds) or inside
    the PostgreSQL sink's commit, then one to three kills of the recoveries (every run has its
    recovery killed: what the database holds prepared at a kill is the recovery's to sort out)."""
    rng = random.Random(seed)
    mode = rng.choice(MODES[PG_PIPELINE])
    lagging = 1 if mode != "aligned" else 0
    phases = [p for p in PG_KILLS if p != "channel_state" or mode != "aligned"]
    if rng.random() < 0.2:
        first = Kill(EXTERNAL, after_s=round(rng.uniform(20, 80), 1))
    elif rng.random() < 1 / 3:
        phase = rng.choice(list(PG_SINK_KILLS))
        first = Kill(phase, rng.randint(1, PG_SINK_KILLS[phase]))
    else:
        nth = seed - PG_SEEDS
        phase = phases[nth % len(phases)] if nth < 2 * len(phases) else rng.choice(phases)
        hits = PG_KILLS[phase]
        if Scenario(seed, PG_PIPELINE, mode, lagging, Kill(phase)).chained:
            hits = CHAINED_KILLS.get(phase, hits)
        first = Kill(phase, rng.randint(1, hits))
    return Scenario(seed, PG_PIPELINE, mode, lagging, first,
                    _recovery_kills(rng, (1, 2, 3), sink_kills=PG_SINK_RECOVERY_KILLS))


def _recovery_kills(rng: random.Random, how_many: tuple[int, ...] = (0, 1, 2, 3),
                    sink_kills: dict[str, int] | None = None) -> tuple[Kill, ...]:
    """Up to three kills, each during the recovery the one before it left to do; with
    ``sink_kills``, half of the precise ones drawn from those (a sink's own points)."""
    then = []
    for _ in range(rng.choice(how_many)):
        if rng.random() < 0.2:
            then.append(Kill(EXTERNAL, after_s=round(rng.uniform(15, 45), 1)))
        else:
            kills = sink_kills if sink_kills and rng.random() < 0.5 else RECOVERY_KILLS
            phase = rng.choice(list(kills))
            then.append(Kill(phase, rng.randint(1, kills[phase])))
    return tuple(then)


def pipeline_tables(name: str) -> tuple[str, ...]:
    """The pipeline's source and sink tables, relative to the warehouse."""
    from checkpoint_lib.pipelines import get

    p = get(name)
    return (p.source_spec.path, *sorted(s.path for s in p.sinks.values()))


def landing(spark, warehouse: str, s: Scenario) -> None:
    """The scenario's input: 3 landing versions of 400 rows, 3% bad."""
    if s.pipeline == "enrichment":  # three rounds: accounts changes, then payments, ~600 rows
        from checkpoint_lib.pipelines.enrichment_data import generate

        generate(spark, warehouse, 2 * ROWS, rounds=VERSIONS, accounts=30, seed=s.seed)
    elif s.pipeline == "orders":
        from checkpoint_lib.pipelines.orders import generate

        for v in range(VERSIONS):
            generate(spark, warehouse, ROWS, bad_fraction=0.03, customers=25, repeat_fraction=0.1, seed=s.seed * 100 + v)
    elif s.pipeline in ("payments", PG_PIPELINE):  # (payments_pg reads payments' landing table)
        from checkpoint_lib.pipelines.payments import generate

        for v in range(VERSIONS):
            generate(spark, warehouse, ROWS, bad_fraction=0.03, accounts=25, seed=s.seed * 100 + v)
    else:
        from checkpoint_lib.pipelines.transfers import generate

        for v in range(VERSIONS):
            generate(spark, warehouse, ROWS, accounts=30, bad_fraction=0.03, skew=0.3, seed=s.seed * 10 + v)


def _command(warehouse: str, s: Scenario) -> list[str]:
    if s.pipeline == "enrichment":  # a graph: one process, every edge chained
        return ckpt_run_argv(s.pipeline, warehouse, "--rows-per-checkpoint", str(ROWS // 2))
    cmd = ckpt_run_argv(PG_REF if s.pipeline == PG_PIPELINE else s.pipeline, warehouse, "--rows-per-checkpoint",
                        str(ROWS), "--mode", s.mode, "--lagging-sources", str(s.lagging))
    if s.mode == "aligned_with_timeout":
        cmd += ["--alignment-timeout", "0.5"]
    if s.pipeline != "transfers" and not s.lagging and not s.chained:
        cmd.append("--no-chaining")
    if s.compact_every:
        cmd += ["--state-compact-every", str(s.compact_every)]
    return cmd


def _pass(warehouse: str, s: Scenario, kill: Kill | None, group: str | None,
          trace: Path) -> tuple[int, str, str | None]:
    """The per-vertex layout: one ``ckpt run --stage G`` per process group in topological order, as
    the run DAG's tasks; ``kill`` in ``group``'s process ends the pass there (as a failed task
    leaves the ones after it unrun). Returns what :func:`_run` does for the process that stopped
    the pass (a kill or a failure), or the last one's."""
    result: tuple[int, str, str | None] = (0, "", None)
    for g in enrichment_groups():
        command = ckpt_run_argv(s.pipeline, warehouse, "--rows-per-checkpoint", str(ROWS // 2), "--mode", s.mode,
                                "--stage", g)
        result = _run(warehouse, s, kill if g == group else None, trace, command)
        if result[0] != 0:
            return result
    return result


def _run(warehouse: str, s: Scenario, kill: Kill | None, trace: Path,
         command: list[str] | None = None, postgres=None) -> tuple[int, str, str | None]:
    """One ``ckpt run``: (return code, output tail, the phase a kill interrupted or None); with the
    connection to ``postgres`` (a tests/pg_server.py server) for ``payments_pg``."""
    env = ckpt_run_env("local[2]", kill_at=str(kill) if kill is not None and kill.phase != EXTERNAL else None,
                       trace=trace)
    cwd = None
    if s.pipeline == PG_PIPELINE:
        env.update(postgres.env())
        cwd = PG_REF_DIR
    trace.unlink(missing_ok=True)
    proc = subprocess.Popen(command or _command(warehouse, s), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=cwd)
    try:
        if kill is not None and kill.phase == EXTERNAL:
            try:
                out, _ = proc.communicate(timeout=kill.after_s)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                out, _ = proc.communicate()
        else:
            out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return 124, f"timed out after {TIMEOUT:.0f} s\n{out[-3000:]}", None
    hit = None
    if proc.returncode == -signal.SIGKILL:
        lines = trace.read_text().split() if trace.exists() else []
        # the kill lands after the last point reached: in that phase, or in start-up before any
        hit = lines[-2] if lines else "startup"
    return proc.returncode, out[-3000:], hit


def run_scenario(spark, warehouse: str | Path, s: Scenario, postgres=None) -> Outcome:
    """Land the input, kill, kill each recovery the chain names, recover undisturbed, verify.
    A ``payments_pg`` scenario needs ``postgres``, a started tests/pg_server.py server: it waits for
    the server's other scenario to end, and gets the server's database new (:func:`fresh_database`)."""
    if s.pipeline == PG_PIPELINE and postgres is None:
        raise ValueError(f"{s.label}: a {PG_PIPELINE} scenario needs a PostgreSQL server (postgres=)")
    with _alone_on(postgres) if s.pipeline == PG_PIPELINE else nullcontext():
        return _run_scenario(spark, str(warehouse), s, postgres)


def _run_scenario(spark, warehouse: str, s: Scenario, postgres) -> Outcome:
    from checkpoint_lib.verify import check_orders, check_payments, check_transfers

    started = time.monotonic()
    out = Outcome(s.seed, s.pipeline, s.config, s.kills, commit=git_commit())
    landing(spark, warehouse, s)
    trace = Path(warehouse) / "phase-trace.txt"
    for nth, kill in enumerate(s.chain):
        if s.groups:
            code, tail, hit = _pass(warehouse, s, kill, s.groups[nth], trace)
        else:
            code, tail, hit = _run(warehouse, s, kill, trace, postgres=postgres)
        if code == -signal.SIGKILL:
            out.kills.append(hit)
            out.nth.append(nth)
        elif code == 0:
            out.not_reached.append(s.kills[nth])
        else:
            out.mismatch = f"the run with kill {kill} failed (exit {code}):\n{tail}"
            out.seconds = time.monotonic() - started
            return out
        if nth < len(s.maintenance):  # another tool, while the pipeline is down
            from neighbours import OPERATIONS

            operation, table = s.maintenance[nth]
            OPERATIONS[operation][1](spark, f"{warehouse}/{table}")
            out.maintenance.append(f"{operation} {table}")
    if s.groups:  # twice: the groups before the last commit what the last one completed at their next run
        code, tail, _ = _pass(warehouse, s, None, None, trace)
        if code == 0:
            code, tail, _ = _pass(warehouse, s, None, None, trace)
    else:
        code, tail, _ = _run(warehouse, s, None, trace, postgres=postgres)
    if code != 0:
        out.mismatch = f"recovery failed (exit {code}):\n{tail}"
    else:
        if s.pipeline == "enrichment":
            from checkpoint_lib.pipelines.enrichment_data import check_enrichment

            check = check_enrichment(warehouse)
        elif s.pipeline in ("payments", PG_PIPELINE):
            check = check_payments(warehouse, exact_order=not s.lagging, at_least_once=s.mode == "at_least_once")
            out.repeats = check.repeats
        elif s.pipeline == "orders":
            check = check_orders(warehouse)
        else:
            check = check_transfers(warehouse)
        problems = [] if check.ok else [check.summary()]
        if s.pipeline == PG_PIPELINE:
            problems += [f"PostgreSQL: {p}" for p in check_postgres(postgres, warehouse, exact_order=not s.lagging)]
        out.survived = not problems
        out.mismatch = "\n".join(problems) or None
    out.seconds = time.monotonic() - started
    return out


# --- the PostgreSQL scenarios' server --------------------------------------------------------------

_PG_LOCKS: dict[int, threading.Lock] = defaultdict(threading.Lock)


@contextmanager
def _alone_on(postgres):
    """One ``payments_pg`` scenario at a time on ``postgres`` (``--jobs 2`` runs another kind beside
    it), its database new: a prepared transaction's id is the server's, not a database's, and two
    warehouses of the same pipeline name the same ids (the pipeline, the sink, the subtask, the epoch
    from 1), so two scenarios at once would take each other's."""
    with _PG_LOCKS[id(postgres)]:
        fresh_database(postgres)
        yield


def fresh_database(postgres) -> None:
    """The server's database (the one of its URI) dropped and created anew, after every transaction
    left prepared on the server is rolled back (a database holding one cannot be dropped, and a new
    warehouse's transactions would take their ids): a new warehouse's epochs start at 1, so an
    earlier scenario's fences, commit bounds and markers would refuse or skip its writes."""
    database = urlsplit(postgres.uri).path.lstrip("/")
    for line in postgres.psql("SELECT database, gid FROM pg_prepared_xacts", database="postgres").splitlines():
        held_in, gid = line.split("|", 1)
        postgres.psql("ROLLBACK PREPARED '{}'".format(gid.replace("'", "''")), database=held_in)
    postgres.psql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)', database="postgres")
    postgres.psql(f'CREATE DATABASE "{database}"', database="postgres")


def pg_tables() -> dict[str, str]:
    """The PostgreSQL tables :data:`PG_REF` writes, by what they hold (``balances``, ``ledger``):
    its declaration's (the module loaded from its file, as ``ckpt run`` imports it from its folder)."""
    import importlib.util

    from checkpoint_lib.pipeline import PostgresSink

    module, _, attr = PG_REF.partition(":")
    spec = importlib.util.spec_from_file_location(f"_chaos_{module}", PG_REF_DIR / f"{module}.py")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    sinks = getattr(loaded, attr).sinks
    return {name.removesuffix("_pg"): sink.table for name, sink in sinks.items() if isinstance(sink, PostgresSink)}


def check_postgres(postgres, warehouse: str, *, exact_order: bool) -> list[str]:
    """What a ``payments_pg`` run left wrong in the database (:func:`postgres_problems`), against
    the independent computation from the landing files and the warehouse's own ledger."""
    from checkpoint_lib.verify import expected_payments, landing_in_offset_order, read_delta

    ledger, balances, _ = expected_payments(landing_in_offset_order(warehouse))
    return postgres_problems(postgres, ledger, balances, read_delta(f"{warehouse}/gold/ledger"),
                             exact_order=exact_order)


def postgres_problems(postgres, want_ledger, want_balances, warehouse_ledger, *, exact_order: bool) -> list[str]:
    """What the server holds wrong after the undisturbed run, each as a line (none: exactly once):

    - a transaction still prepared, of any id (the scenario is the server's only user): the run
      commits or rolls back everything it prepared;
    - the ``balances`` table: the expected accounts, each balance and event count the expected;
    - the ``ledger`` table: every valid event once (an append committed twice repeats rows), its
      account and amount; its running balance the expected one when the run was aligned (the
      source-offset order, ``exact_order``), and always the warehouse ledger's (both sinks commit
      the same rows of the same checkpoints)."""
    import pandas as pd
    import psycopg2

    problems = []
    tables = pg_tables()
    try:
        conn = psycopg2.connect(postgres.uri)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT gid FROM pg_prepared_xacts ORDER BY prepared")
                prepared = [g for (g,) in cur.fetchall()]
                frames = {}
                for what, want in (("balances", want_balances), ("ledger", want_ledger)):
                    columns = list(want.columns)
                    cur.execute(f'SELECT {", ".join(columns)} FROM "{tables[what]}"')
                    frames[what] = pd.DataFrame(cur.fetchall(), columns=columns)
        finally:
            conn.close()
    except psycopg2.Error as exc:
        return [f"cannot read the database: {' '.join(str(exc).split())}"]
    if prepared:
        problems.append(f"{len(prepared)} transactions still prepared after the undisturbed run, e.g. {prepared[0]}")
    got = frames["balances"].set_index("account").sort_index()
    want = want_balances.set_index("account").sort_index()
    if got.index.has_duplicates or not got.index.equals(want.index):
        problems.append(f"{tables['balances']} has {len(got)} rows for {got.index.nunique()} accounts, expected "
                        f"{len(want)} accounts")
    else:
        wrong = (got[list(want.columns)].astype("int64") != want.astype("int64")).any(axis=1)
        if wrong.any():
            problems.append(f"{int(wrong.sum())} accounts of {tables['balances']} have a wrong balance or count, "
                            f"e.g. {wrong[wrong].index[0]!r}")
    ledger = frames["ledger"]
    dup = int(ledger["event_id"].duplicated().sum())
    if dup:
        problems.append(f"{dup} rows of {tables['ledger']} repeat an event, e.g. "
                        f"{ledger['event_id'][ledger['event_id'].duplicated()].iloc[0]!r}")
    missing = set(want_ledger["event_id"]) - set(ledger["event_id"])
    extra = set(ledger["event_id"]) - set(want_ledger["event_id"])
    if missing:
        problems.append(f"{len(missing)} valid events missing from {tables['ledger']}, e.g. {sorted(missing)[:3]}")
    if extra:
        problems.append(f"{len(extra)} rows of {tables['ledger']} are not valid source events, "
                        f"e.g. {sorted(extra)[:3]}")
    if not dup and not missing and not extra:
        got = ledger.set_index("event_id").sort_index()
        want = want_ledger.set_index("event_id").sort_index()
        same = ["account", "amount_cents", "balance_after_cents"] if exact_order else ["account", "amount_cents"]
        wrong = (got[same].astype(want[same].dtypes.to_dict()) != want[same]).any(axis=1)
        if wrong.any():
            problems.append(f"{int(wrong.sum())} rows of {tables['ledger']} differ from the expected ledger, "
                            f"e.g. {wrong[wrong].index[0]!r}")
        theirs = warehouse_ledger.drop_duplicates("event_id").set_index("event_id")["balance_after_cents"]
        differ = got["balance_after_cents"].astype("int64") != theirs.reindex(got.index).astype("Int64")
        if differ.fillna(True).any():
            problems.append(f"{int(differ.fillna(True).sum())} rows of {tables['ledger']} have another running "
                            "balance than the warehouse's ledger")
    return problems


def git_commit() -> str:
    """The short hash of the checkout this harness runs from ("unknown" outside git)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def record(path: str | Path, outcome: Outcome) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(asdict(outcome)) + "\n")


def load(path: str | Path) -> list[Outcome]:
    if not Path(path).exists():
        return []
    return [Outcome(**json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]


# --- the report ----------------------------------------------------------------------------------


@dataclass
class Tally:
    runs: int = 0
    kills: int = 0
    recovery_kills: int = 0  # kills of a recovery (not the first of a chain)
    not_reached: int = 0
    survived: int = 0
    mismatches: int = 0
    repeats: int = 0
    seconds: float = 0.0
    by_phase: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    by_config: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))


def tally(outcomes: list[Outcome]) -> Tally:
    t = Tally()
    for o in outcomes:
        t.runs += 1
        t.kills += len(o.kills)
        t.recovery_kills += sum(1 for n in o.nth if n)
        t.not_reached += len(o.not_reached)
        t.survived += o.survived
        t.mismatches += not o.survived
        t.repeats += o.repeats
        t.seconds += o.seconds
        for nth, phase in zip(o.nth, o.kills):
            row = t.by_phase[phase]
            row["recovery" if nth else "first"] += 1
            row["external" if o.chain[nth].startswith("external") else "precise"] += 1
            row["survived" if o.survived else "mismatch"] += 1
        c = t.by_config[f"{o.pipeline} / {o.mode}"]
        c["runs"] += 1
        c["kills"] += len(o.kills)
        c["survived" if o.survived else "mismatch"] += 1
        c["repeats"] += o.repeats
    return t


def render(outcomes: list[Outcome]) -> str:
    """The chaos tables of docs/reliability.md (markdown)."""
    t = tally(outcomes)
    commits = sorted({o.commit or "unrecorded" for o in outcomes})
    lines = [
        f"The kills ran at commit{'s' if len(commits) > 1 else ''} {', '.join(commits)}.",
        "",
        "| runs | kills | of which during recovery | kills not reached | survived | mismatches | at-least-once repeats | time |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {t.runs} | {t.kills} | {t.recovery_kills} | {t.not_reached} | {t.survived} | **{t.mismatches}** | "
        f"{t.repeats} | {t.seconds / 60:.0f} min |",
        "",
        "Kills by the phase they interrupted (`external`: a SIGKILL from outside at a random instant, "
        "attributed through the phase trace; `startup`: before the first kill point):",
        "",
        "| phase | kills | first / during recovery | precise / external | survived | mismatches |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for phase in sorted(t.by_phase, key=lambda p: (-sum(t.by_phase[p][k] for k in ("first", "recovery")), p)):
        r = t.by_phase[phase]
        lines.append(f"| {phase} | {r['first'] + r['recovery']} | {r['first']} / {r['recovery']} | "
                     f"{r['precise']} / {r['external']} | {r['survived']} | {r['mismatch']} |")
    pg = [o for o in outcomes if o.pipeline == PG_PIPELINE]
    if pg:
        p = tally(pg)
        inside = sum(1 for o in pg for phase in o.kills if phase in PG_SINK_PHASES)
        lines += ["", f"PostgreSQL sink (`{PG_PIPELINE}`, seeds {PG_SEEDS}+: balances and ledger also written to a "
                      "real PostgreSQL server by two-phase commit, the database's tables checked too): "
                      f"{p.runs} runs, {p.kills} kills ({inside} of them inside the sink's write or commit: "
                      f"{', '.join(f'`{phase}`' for phase in PG_SINK_PHASES)}), {p.mismatches} mismatches."]
    operations = Counter(m.split()[0] for o in outcomes for m in o.maintenance)
    if operations:
        with_ops = [o for o in outcomes if o.maintenance]
        lines += ["", f"Maintenance drawn between kills (seeds {MAINTENANCE_SEEDS}+: one operation of "
                      "tests/neighbours.py on one of the pipeline's tables after each kill): "
                      f"{len(with_ops)} runs, {sum(o.survived for o in with_ops)} survived; "
                      + ", ".join(f"{op} {n}" for op, n in sorted(operations.items())) + "."]
    lines += ["", "By pipeline and mode:", "", "| pipeline / mode | runs | kills | survived | mismatches | repeats |",
              "|---|---:|---:|---:|---:|---:|"]
    for config in sorted(t.by_config):
        c = t.by_config[config]
        lines.append(f"| {config} | {c['runs']} | {c['kills']} | {c['survived']} | {c['mismatch']} | {c['repeats']} |")
    failed = [o for o in outcomes if not o.survived]
    if failed:
        lines += ["", "Mismatches:", ""]
        lines += [f"- seed {o.seed} ({o.pipeline}/{o.mode}, {' then '.join(o.chain)}): "
                  f"{str(o.mismatch).splitlines()[0]}" for o in failed]
    return "\n".join(lines)

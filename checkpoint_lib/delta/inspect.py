"""Reading a pipeline's checkpoints back with delta-rs: no JVM, no Spark (``ckpt state``,
``ckpt recover --dry-run``, the recover DAG's dry run).

- :func:`operator_state`: the keyed state of one operator as a checkpoint pinned it (each
  subtask's key groups at the table version its ack names), optionally one key, at most ``limit``
  rows; any keyed operator of a dataflow graph, or a linear pipeline's (:func:`keyed_operator`);
- :func:`channel_state`: the in-flight records a checkpoint logged, per receiving subtask;
- :func:`handles`: the sources' offsets and the sinks' transactions, as the acks hold them;
- :func:`recovery_preview`: what a recovery would do, in tables' versions and rows (a
  :class:`RecoveryPreview`, for people and for machines).

The first three take what a pipeline declares (:data:`Declared`): a linear
:class:`~checkpoint_lib.pipeline.Pipeline`, read as its graph of two vertices, or a dataflow graph
(a :class:`~checkpoint_lib.graph.StreamGraph`); the preview takes a linear pipeline.

Each returns plain values (JSON-able but for timestamps and decimals, which ``default=str``
prints); the Spark twins that return DataFrames are in :mod:`checkpoint_lib.spark.inspect`.
Nothing here writes: a missing table reads as "not there yet".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from ..core.acks import PinnedState, SinkAckState, SourceAckState
from ..core.checkpoints import CompletedCheckpoint
from ..core.errors import NoCheckpointError
from ..core.recovery import RecoveryPlan, choose_checkpoint
from ..core.types import SubtaskId
from ..graph.lowering import from_pipeline
from ..graph.model import OperatorKind, OperatorVertex, StreamGraph
from ..layout import (KEY_GROUP, channel_state_table, checkpoint_root, location, source_manifest, stamp_prefix,
                      state_table, warehouse_location)
from ..pipeline import TTL_COLUMN, ChangeFeedSource, DeltaSource, Pipeline
from ..reserved import STATE_GONE, STATE_RUN
from .log import ChangeFeedPlanner, MissingLogError, StepPlanner, latest_version, stamped_checkpoints, version_before_txn_above
from .store import DeltaCheckpointStore
from .ttl_marks import marks_at


Declared = Pipeline | StreamGraph
"""What a pipeline declares: a linear pipeline or a dataflow graph (``pipelines.declared``)."""


def _store(warehouse: str, pipeline: str) -> DeltaCheckpointStore:
    return DeltaCheckpointStore.existing(checkpoint_root(warehouse, pipeline))


def as_graph(pipeline: Declared) -> StreamGraph:
    """The dataflow graph of what a pipeline declares (a linear pipeline's two vertices)."""
    return pipeline if isinstance(pipeline, StreamGraph) else from_pipeline(pipeline)


def checkpoint(warehouse: str, pipeline: Declared, checkpoint_id: int | None = None) -> CompletedCheckpoint:
    """The named retained completed checkpoint, or the latest one."""
    chosen = choose_checkpoint(list(_store(warehouse, pipeline.name).checkpoints.all()), checkpoint_id)
    if chosen is None:
        raise NoCheckpointError(f"pipeline {pipeline.name!r} has no completed checkpoint in {warehouse}")
    return chosen


def _table(path: Any, version: int | None = None) -> DeltaTable | None:
    try:
        return DeltaTable(str(path), version=version)
    except Exception:  # noqa: BLE001 - not a table (yet), or that version is gone: "not there"
        return None


def _pinned(path: Any, version: int, c: CompletedCheckpoint) -> DeltaTable | None:
    """The state table at the version checkpoint ``c`` pinned (None for -1: nothing written yet);
    LookupError, saying which, when that version cannot be read."""
    if version < 0:
        return None
    try:
        return DeltaTable(str(path), version=version)
    except Exception as exc:  # noqa: BLE001 - delta-rs says why in its own words
        raise LookupError(f"{path} version {version}, which checkpoint {c.checkpoint_id} pinned, cannot be read: "
                          f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


def query(dt: DeltaTable, sql: str) -> pa.Table:
    """``sql`` over ``dt`` registered as ``t`` (DataFusion reads deletion vectors, which the state
    tables use and pyarrow's reader does not)."""
    return pa.table(QueryBuilder().register("t", dt).execute(sql))


def _count(dt: DeltaTable | None, where: str = "true", *, state_key: str | None = None,
           cleaned: tuple[int, datetime] | None = None) -> int:
    if dt is None:
        return 0
    return int(query(dt, f"{_live(dt, state_key, cleaned)}select count(*) as n from s where {where}")["n"][0].as_py())


def _cleaned(path: Any, version: int, ttl: Any) -> tuple[int, datetime] | None:
    """For an operator with a ``ttl``: the run and write time below which its state table's rows
    at ``version`` are cleaned up (:class:`~checkpoint_lib.delta.ttl_marks.TtlMarks`), or None."""
    marks = marks_at(str(path), version) if ttl is not None else None
    cut = marks.expire_before(ttl) if marks is not None else None
    return None if cut is None else (marks.run, cut)


def _live(dt: DeltaTable, state_key: str | None, cleaned: tuple[int, datetime] | None = None) -> str:
    """A ``with s as (...)`` naming what to read as ``s``: with ``state_key``, the keyed state
    the state table ``t`` holds (per key the newest run's row, unless a tombstone; minus the rows
    a TTL's cleanup took, ``cleaned``: :func:`_cleaned`; the one definition is
    :meth:`checkpoint_lib.spark.state.KeyedStateTable.read`), else ``t`` as it is."""
    names = {f.name for f in dt.schema().fields}
    if state_key is None or STATE_RUN not in names:
        return "with s as (select * from t) "
    cols = ", ".join(_quote(n) for n in sorted(names - {STATE_RUN, STATE_GONE}))
    where = f"_ckpt_newest = 1 and not coalesce({_quote(STATE_GONE)}, false)"
    if cleaned is not None:
        run, cut = cleaned
        where += (f" and not (coalesce({_quote(STATE_RUN)}, -1) < {int(run)} and "
                  f"{_quote(TTL_COLUMN)} < timestamp '{cut.isoformat(sep=' ')}')")
    return (f"with s as (select {cols} from (select *, row_number() over (partition by {_quote(state_key)} "
            f"order by coalesce({_quote(STATE_RUN)}, -1) desc) as _ckpt_newest from t) where {where}) ")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _when(c: CompletedCheckpoint) -> str:
    return f"{datetime.fromtimestamp(c.completion_time, timezone.utc):%Y-%m-%d %H:%M:%S} UTC"


def _checkpoint_fields(pipeline: Declared, c: CompletedCheckpoint) -> dict[str, Any]:
    return {"pipeline": pipeline.name, "checkpoint_id": c.checkpoint_id, "kind": c.kind.value,
            "completed_at": c.completion_time}


# --- state -----------------------------------------------------------------------------------


def _keyed_acks(uid: str, c: CompletedCheckpoint) -> list[tuple[SubtaskId, PinnedState]]:
    """Operator ``uid``'s subtasks at ``c`` with the keyed state each pinned (none when stateless)."""
    keyed = [(s, PinnedState.held_in(a.state)) for s, a in sorted(c.acks.items()) if s.operator == uid]
    return [(s, pinned) for s, pinned in keyed if pinned is not None]


def keyed_operator(graph: StreamGraph, uid: str | None = None) -> tuple[OperatorVertex, str]:
    """The keyed operator ``uid`` of ``graph`` (None: its only one) and its key column (its inputs'
    key). A ``ValueError`` naming the graph's keyed operators when ``uid`` is no operator of it,
    a stateless one, or None with several to choose from."""
    keyed = [v for v in graph.operators if v.kind is not OperatorKind.STATELESS]
    names = ", ".join(v.uid for v in keyed) if keyed else "none (every operator is stateless)"
    if uid is None:
        if len(keyed) != 1:
            raise ValueError(f"pipeline {graph.name!r} has {len(keyed) or 'no'} keyed operators: name one with "
                             f"--uid; its keyed operators: {names}")
        uid = keyed[0].uid
    vertex = next((v for v in graph.operators if v.uid == uid), None)
    if vertex is None:
        if any(v.id == uid for v in graph.sources):
            raise ValueError(f"{uid!r} is a source of pipeline {graph.name!r}, not an operator; its keyed operators: "
                             f"{names}")
        raise ValueError(f"pipeline {graph.name!r} has no operator {uid!r}; its keyed operators: {names}")
    if vertex.kind is OperatorKind.STATELESS:
        raise ValueError(f"operator {uid!r} of pipeline {graph.name!r} is stateless: it has no keyed state to show; "
                         f"its keyed operators: {names}")
    key = next(e.key for e in graph.inputs_of(uid) if not e.feedback and e.key is not None)
    return vertex, key


def operator_state(warehouse: str, pipeline: Declared, checkpoint_id: int | None = None, *, uid: str | None = None,
                   key: str | None = None, limit: int = 20) -> dict[str, Any]:
    """The keyed state of operator ``uid`` (None: the pipeline's only keyed operator, a linear
    pipeline's operator) at the checkpoint (default: the latest completed): per subtask its key
    groups, the state table version its ack pinned and how many keys it holds there, and the
    first ``limit`` rows by key (only key ``key``'s when given, compared as text), each with its
    ``subtask``: the union over the subtasks' pins."""
    vertex, key_column = keyed_operator(as_graph(pipeline), uid)
    c = checkpoint(warehouse, pipeline, checkpoint_id)
    acks = _keyed_acks(vertex.uid, c)
    if not acks:
        raise NoCheckpointError(f"checkpoint {c.checkpoint_id} holds no state of operator {vertex.uid!r}")
    path = state_table(checkpoint_root(warehouse, pipeline.name), vertex.uid)
    match = "true" if key is None else f"cast({_quote(key_column)} as varchar) = {_literal(key)}"
    subtasks, rows, total = [], [], 0
    ttl = getattr(vertex.operator, "state_ttl", None)
    tables: dict[int, tuple[DeltaTable | None, tuple[int, datetime] | None]] = {}  # per version: table, cleanup
    for sid, pinned in acks:
        version = pinned.table_version
        if version not in tables:
            tables[version] = (_pinned(path, version, c), _cleaned(path, version, ttl))
        dt, cleaned = tables[version]
        lo, hi = pinned.key_groups.start, pinned.key_groups.end
        where = f"{KEY_GROUP} between {lo} and {hi} and {match}"
        n = _count(dt, where, state_key=key_column, cleaned=cleaned)
        subtasks.append({"subtask": sid.index, "key_groups": [lo, hi], "table_version": version, "keys": n})
        total += n
        if dt is not None and n:  # each subtask's first ``limit`` by key: the first ``limit`` of all are among them
            for row in query(dt, f"{_live(dt, key_column, cleaned)}select * from s where {where} order by {_quote(key_column)} "
                                  f"limit {int(limit)}").to_pylist():
                row.pop(TTL_COLUMN, None)  # hidden: the operator never sees it
                rows.append({**row, "subtask": sid.index})
    rows.sort(key=lambda r: str(r.get(key_column)))
    return {**_checkpoint_fields(pipeline, c), "operator": vertex.uid, "key_column": key_column,
            "key": key, "table": str(path), "subtasks": subtasks, "keys": total, "limit": limit,
            "shown": len(rows[:limit]), "rows": rows[:limit]}


def channel_state(warehouse: str, pipeline: Declared, checkpoint_id: int | None = None, *,
                  limit: int = 20) -> dict[str, Any]:
    """The records in flight at the checkpoint (logged by unaligned snapshots): per receiving
    subtask how many its ack counted, and the first ``limit`` of them."""
    c = checkpoint(warehouse, pipeline, checkpoint_id)
    logged = [{"subtask": str(s), "rows": a.channel_state_rows, "bytes": a.channel_state_bytes}
              for s, a in sorted(c.acks.items()) if a.channel_state_rows]
    rows: list[dict[str, Any]] = []
    dt = _table(channel_state_table(checkpoint_root(warehouse, pipeline.name))) if logged else None
    if dt is not None:
        rows = query(dt, f"select * from t where checkpoint_id = {int(c.checkpoint_id)} limit {int(limit)}").to_pylist()
    return {**_checkpoint_fields(pipeline, c), "subtasks": logged, "records": sum(s["rows"] for s in logged),
            "limit": limit, "shown": len(rows), "rows": rows}


def handles(warehouse: str, pipeline: Declared, checkpoint_id: int | None = None) -> dict[str, Any]:
    """The small per-subtask handles: each source subtask's offset (of every source vertex), each
    sink subtask's transactions (the current one and those the checkpoint owns)."""
    sources = {v.id for v in as_graph(pipeline).sources}
    c = checkpoint(warehouse, pipeline, checkpoint_id)
    return {**_checkpoint_fields(pipeline, c),
            "sources": {str(s): dict(a.state) for s, a in sorted(c.acks.items()) if s.operator in sources},
            "sinks": sink_snapshots(c)}


def sink_snapshots(c: CompletedCheckpoint) -> dict[str, dict[str, Any]]:
    """Each sink subtask's transactions at ``c`` (its :class:`~checkpoint_lib.core.twophase.SinkSnapshot`, as a dict)."""
    sinks = {str(s): SinkAckState.held_in(a.state) for s, a in sorted(c.acks.items())}
    return {s: sink.snapshot.to_dict() for s, sink in sinks.items() if sink is not None}


# --- recovery preview --------------------------------------------------------------------------


@dataclass(frozen=True)
class SinkPreview:
    name: str
    table: str
    mode: str
    version_now: int | None
    """The table's newest version; None: the table does not exist yet."""
    version_after: int | None
    """The version the rollback restores (-1: before our first commit, the table emptied); None:
    nothing to roll back."""
    rows_now: int
    rows_after: int
    commits_undone: int
    """The pipeline's commits after ``version_after`` (what the rollback takes back)."""
    recommit: tuple[str, ...]
    """The handles of the transactions the restored checkpoint owns of this sink."""
    committed: bool
    """Whether those already landed (the table's newest stamp reaches the checkpoint): nothing to write."""
    abort: tuple[str, ...]

    @property
    def rows_discarded(self) -> int:
        return max(self.rows_now - self.rows_after, 0) if self.version_after is not None else 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "table": self.table, "mode": self.mode, "version_now": self.version_now,
                "version_after": self.version_after, "rows_now": self.rows_now, "rows_after": self.rows_after,
                "rows_discarded": self.rows_discarded, "commits_undone": self.commits_undone, "recommit": list(self.recommit),
                "recommit_committed": self.committed, "abort": list(self.abort)}


@dataclass(frozen=True)
class OperatorPreview:
    operator: str
    table: str
    version_now: int | None
    versions: tuple[int, ...]
    """The state table versions the subtasks' acks pinned (what the restore brings back)."""
    key_groups: tuple[int, int]
    subtasks: int
    keys: int
    state_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"operator": self.operator, "table": self.table, "version_now": self.version_now,
                "versions_restored": list(self.versions), "key_groups": list(self.key_groups),
                "subtasks": self.subtasks, "keys": self.keys, "state_bytes": self.state_bytes}


@dataclass(frozen=True)
class SourcePreview:
    table: str
    offset: Any
    """The source version the checkpoint's acks name (its offset: every version up to it was read)."""
    version_now: int | None
    rows_to_replay: int | None
    """Rows the versions after the offset hold (None: not counted: a landing folder's manifest, or
    a commit file is gone)."""

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "offset": self.offset, "version_now": self.version_now,
                "rows_to_replay": self.rows_to_replay}


@dataclass(frozen=True)
class RecoveryPreview:
    """A recovery plan (:class:`~checkpoint_lib.core.recovery.RecoveryPlan`, what the runner does)
    with the tables it touches read: per sink the version now and the one a rollback restores
    with the rows it discards, per operator the state restored, per source the offset and the rows
    to replay. What ``ckpt recover --dry-run`` and the recover DAG's dry run print."""

    pipeline: str
    plan: RecoveryPlan
    sinks: tuple[SinkPreview, ...] = ()
    operators: tuple[OperatorPreview, ...] = ()
    sources: tuple[SourcePreview, ...] = ()
    channel_state: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        c, plan = self.plan.checkpoint, self.plan
        return {
            "pipeline": self.pipeline, "checkpoint_id": plan.checkpoint_id, "kind": c.kind.value if c else None,
            "completed_at": c.completion_time if c else None, "new_epoch": plan.new_epoch,
            "rollback_after": plan.rollback_after,
            "sinks": [s.to_dict() for s in self.sinks], "operators": [o.to_dict() for o in self.operators],
            "sources": [s.to_dict() for s in self.sources], "channel_state": dict(self.channel_state),
            "orphans_aborted": [t.handle for t in plan.orphans],
        }

    def describe(self) -> str:
        plan, c = self.plan, self.plan.checkpoint
        if c is None:
            lines = [f"recovery of {self.pipeline}: no completed checkpoint, start from scratch as epoch {plan.new_epoch}"]
        else:
            lines = [f"recovery of {self.pipeline}: restore {c.kind.value} {c.checkpoint_id} (completed {_when(c)}) "
                     f"as epoch {plan.new_epoch}"]
        if plan.rollback_after is not None:
            back = f"what checkpoint {plan.rollback_after} committed" if plan.rollback_after else "before their first commit"
            lines.append(f"sinks: rolled back to {back}, then the checkpoint's transactions re-committed")
        else:
            lines.append("sinks: nothing committed after the checkpoint; its transactions re-committed")
        width = max((len(s.name) for s in self.sinks), default=0)
        for s in self.sinks:
            lines.append(f"  {s.name:<{width}}  {_sink_line(s)}")
        if self.operators:
            lines.append("operators: state restored")
        for o in self.operators:
            pinned = ", ".join(str(v) for v in o.versions)
            lines.append(f"  {o.operator}  restores state table {'version' if len(o.versions) == 1 else 'versions'} "
                         f"{pinned} (now at {_version(o.version_now)}): {o.keys:,} keys in key groups "
                         f"{o.key_groups[0]}..{o.key_groups[1]} over {o.subtasks} subtasks ({_bytes(o.state_bytes)})")
        if self.sources:
            lines.append("sources: replayed from the checkpoint's offsets")
        for src in self.sources:
            rows = "rows not counted" if src.rows_to_replay is None else \
                f"{src.rows_to_replay:,} rows to replay"
            lines.append(f"  {src.table}  after version {src.offset} up to version {_version(src.version_now)}: {rows}")
        if self.channel_state:
            total = sum(self.channel_state.values())
            lines.append(f"channel state: {total:,} in-flight records replayed first "
                         f"({', '.join(f'{s}: {n:,}' for s, n in self.channel_state.items())})")
        if plan.orphans:
            lines.append(f"abort {len(plan.orphans)} open transactions no restored sink knows of")
        return "\n".join(lines)


def _version(v: int | None) -> str:
    return "(none yet)" if v is None else str(v)


def _bytes(n: int) -> str:
    from ..history import human_bytes

    return human_bytes(n)


def _sink_line(s: SinkPreview) -> str:
    if s.version_now is None:
        where = f"{s.table}: no table yet"
    elif s.version_after is None:
        where = f"{s.table} version {s.version_now} kept ({s.rows_now:,} rows)"
    else:
        after = "emptied" if s.version_after < 0 else f"version {s.version_after}"
        undone = f"{s.commits_undone} {'commit' if s.commits_undone == 1 else 'commits'} undone"
        what = f"{s.rows_discarded:,} discarded" if s.mode == "append" else \
            f"{undone}, {s.rows_discarded:,} rows fewer"  # an upsert's commits change rows too
        where = f"{s.table} version {s.version_now} -> {after}: {s.rows_now:,} rows -> {s.rows_after:,} ({what})"
    recommit = "" if not s.recommit else \
        f"; re-commit {len(s.recommit)} transactions" + (" (already landed: nothing to write)" if s.committed else "")
    abort = f"; abort {len(s.abort)} uncommitted" if s.abort else ""
    return where + recommit + abort


def _stamped_commits(target: Any, prefix: str, after: int, upto: int) -> int:
    """How many commits of versions ``after+1 .. upto`` carry a stamp starting with ``prefix``."""
    return sum(1 for v in range(after + 1, upto + 1) if stamped_checkpoints(target, v, prefix))


def _newest_stamp(target: Any, prefix: str, upto: int) -> int | None:
    """The checkpoint of the newest commit at or below version ``upto`` stamped by ``prefix``
    (walking the log back), or None."""
    for version in range(upto, -1, -1):
        try:
            stamps = stamped_checkpoints(target, version, prefix)
        except MissingLogError:
            return None
        if stamps:
            return max(stamps)
    return None


def _sink_preview(warehouse: str, pipeline: str, name: str, spec: Any, plan: RecoveryPlan) -> SinkPreview:
    target = location(warehouse) / spec.path
    prefix = stamp_prefix(pipeline, name)
    now = latest_version(target)
    after = None
    if now is not None and plan.rollback_after is not None:
        try:
            after = version_before_txn_above(target, prefix, plan.rollback_after)
        except MissingLogError:
            after = None
    rows_now = _count(_table(target)) if now is not None else 0
    rows_after = rows_now if after is None else (0 if after < 0 else _count(_table(target, after)))
    undone = 0 if after is None else _stamped_commits(target, prefix, after, now)
    recommit = plan.recommit_of(name)
    kept = now if after is None else after  # what the table holds when the re-commit runs
    stamp = _newest_stamp(target, prefix, kept) if (recommit and kept is not None and kept >= 0) else None
    committed = bool(recommit) and stamp is not None and stamp >= (plan.checkpoint_id or 0)
    aborts = sorted({t.handle for s, rec in plan.sinks.items() if s.sink == name for t in rec.abort})
    return SinkPreview(name, spec.path, spec.mode, now, after, rows_now, rows_after, undone,
                       tuple(t.handle for t in recommit), committed, tuple(aborts))


def _operator_preview(warehouse: str, graph: StreamGraph, uid: str, c: CompletedCheckpoint) -> OperatorPreview | None:
    acks = _keyed_acks(uid, c)
    if not acks:
        return None
    path = state_table(checkpoint_root(warehouse, graph.name), uid)
    vertex, key = keyed_operator(graph, uid)
    ttl = getattr(vertex.operator, "state_ttl", None)
    keys, tables = 0, {}
    for _sid, pinned in acks:
        version = pinned.table_version
        if version not in tables:  # per version: the table and its cleanup, read once
            tables[version] = (_pinned(path, version, c), _cleaned(path, version, ttl))
        dt, cleaned = tables[version]
        keys += _count(dt, f"{KEY_GROUP} between {pinned.key_groups.start} and {pinned.key_groups.end}",
                       state_key=key, cleaned=cleaned)
    spans = [(pinned.key_groups.start, pinned.key_groups.end) for _s, pinned in acks]
    return OperatorPreview(
        uid, str(path), latest_version(path), tuple(sorted(tables)),
        (min(lo for lo, _ in spans), max(hi for _, hi in spans)), len(acks), keys,
        sum(c.acks[s].state_size_bytes for s, _ in acks))


def _source_preview(warehouse: str, pipeline: str, source: str, spec: Any, c: CompletedCheckpoint) -> SourcePreview | None:
    offsets = sorted({SourceAckState.from_state(a.state).version for s, a in c.acks.items() if s.operator == source})
    if not offsets or spec is None:
        return None
    offset = min(offsets)  # every source subtask shares the offset
    # a Delta table's versions are the offsets: rows it added, or (a change feed) rows it changed
    planner = (ChangeFeedPlanner if isinstance(spec, ChangeFeedSource)
               else StepPlanner if isinstance(spec, DeltaSource) else None)
    if planner is not None:
        table, shown = location(warehouse) / spec.path, spec.path
    else:  # a landing folder: its manifest table's version is the offset
        table, shown = source_manifest(checkpoint_root(warehouse, pipeline)), f"{spec.path} (manifest)"
    now = latest_version(table)
    rows: int | None = None  # a manifest's versions add files, whose rows nobody counted yet
    if planner is not None:
        try:
            rows = planner(table).rows_between(int(offset), now) if now is not None else 0
        except (MissingLogError, ValueError):
            rows = None
    return SourcePreview(shown, offset, now, rows)


def recovery_preview(warehouse: str, pipeline: Pipeline | StreamGraph | str, checkpoint_id: int | None = None,
                     plan: RecoveryPlan | None = None) -> RecoveryPreview:
    """What a recovery of ``pipeline`` (a linear pipeline, a dataflow graph, or a registered name)
    to ``checkpoint_id`` (None: the latest completed, or the one an owed rollback names) would do,
    with the tables it touches read (read-only; the store's
    :meth:`~checkpoint_lib.delta.store.DeltaCheckpointStore.recovery_plan` is the plan): every sink,
    every keyed operator, every source of the pipeline's graph (a linear pipeline's two vertices)."""
    if isinstance(pipeline, str):
        from ..pipelines import declared

        pipeline = declared(pipeline)
    graph = pipeline if isinstance(pipeline, StreamGraph) else from_pipeline(pipeline)
    warehouse = warehouse_location(warehouse)
    if plan is None:
        plan = _store(warehouse, graph.name).recovery_plan(checkpoint_id)
    c = plan.checkpoint
    sinks = tuple(_sink_preview(warehouse, graph.name, s.name, s.spec, plan) for s in graph.sinks
                  if getattr(s.spec, "path", None) is not None)  # (a Delta table: a PostgreSQL sink has no versions)
    if c is None:
        return RecoveryPreview(graph.name, plan, sinks)
    operators = tuple(o for v in graph.operators if v.kind is not OperatorKind.STATELESS
                      if (o := _operator_preview(warehouse, graph, v.uid, c)) is not None)
    sources = tuple(p for v in graph.sources if (p := _source_preview(warehouse, graph.name, v.name, v.spec, c)) is not None)
    channel = {str(s): c.acks[s].channel_state_rows for s in plan.replay_channel_state}
    return RecoveryPreview(graph.name, plan, sinks, operators, sources, channel)

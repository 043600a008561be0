"""The DAG factory: four DAGs for every registered linear pipeline and every registered
dataflow graph (:mod:`checkpoint_lib.pipelines`).

A deployment's DAGs folder needs one file that puts them in its globals (``dags/checkpoint_lib_dags.py``)::

    from ckpt_airflow.dag_factory import dags_for_every_pipeline

    globals().update(dags_for_every_pipeline())

A pipeline that is not registered (no entry point) gets its DAGs from its reference, in a DAG file
of its own: ``globals().update(build_dags("mypkg.flows:orders"))``. Parsing that file is what makes
the name known to the task processes that run its DAGs.

- ``<pipeline>_run``: the stages as separate tasks (``source`` then ``keyed``), on a schedule;
  each run reads what landed since the previous one (incremental) and ends with a checkpoint.
- ``<pipeline>_snapshot``: a periodic global snapshot: ``trigger`` (a durable request, subject to
  min pause / max concurrent) -> ``wait_for_acks`` (deferrable, with a timeout) -> ``commit``
  (idempotent), or ``abort`` when the wait failed (timeout, decline). The tasks that commit
  (``commit``, the run DAG's ``keyed``, the recover DAG's ``recover``) emit the pipeline's sinks as
  Assets (``ckpt_airflow.assets``): downstream DAGs can be scheduled on them. ``max_active_runs=1`` and
  the idempotent commit mean a checkpoint is never committed twice, also across retries.
- ``<pipeline>_recover``: manual, with a form: ``checkpoint_id`` ('latest' or a number), ``mode``,
  ``dry_run``. validate (fails fast, touching nothing) -> plan is printed; unless a dry run:
  pause the pipeline and its DAGs -> recover (new epoch, restore, re-commit/abort, replay) ->
  consistency checks -> unpause (always).
- ``<pipeline>_maintenance``: daily, one task ``maintain``: the retention rules of
  ``checkpoint_lib.maintenance`` (old control-table rows, reservation markers, request files,
  validation results, channel state, removed files), each tied to what the retained checkpoints
  and savepoints still need; safe while the pipeline runs, skipped while a recovery holds it.

A **dataflow graph** (:func:`build_graph_dags`) runs as its job plan says
(:func:`checkpoint_lib.graph.plan`, :attr:`~checkpoint_lib.graph.Layout.CHAINED`, what
:class:`~checkpoint_lib.spark.graph_runner.GraphRunner` runs): a task per process group. Today's
plans have one group, ``all`` (every vertex in one process, every edge chained), so:

- ``<graph>_run``: one task per process group, ``run_<group>`` (today ``run_all``), in the plan's
  topological order, a group downstream of every group a non-feedback edge of the graph reaches it
  from; scheduled as the linear run DAG; each task has its group's sinks as outlets.
- ``<graph>_recover``: manual, with a form: ``checkpoint_id``, ``allow_non_restored_state``,
  ``dry_run``. ``validate_params`` (prints the plan, every sink, keyed operator and source) ->
  ``unless_dry_run`` -> pause -> ``recover`` -> ``validate_restore`` (the after-restore suite the
  graph declares, ``Graph.quality``; skipped, saying so, for a graph that declares none) -> unpause
  (always). No ``mode``: every edge is chained, so every checkpoint of a graph is aligned.
- ``<graph>_maintenance``: as a linear pipeline's (the retention rules read the control tables and
  the data plane's folders, whatever declared them).
- ``<graph>_snapshot``: a linear pipeline's snapshot DAG (``trigger`` -> ``wait_for_acks`` ->
  ``commit`` | ``abort``): its durable request is answered by the running graph's next step (a
  running ``<graph>_run``; each run also ends with a completed checkpoint of its own).

Settings per pipeline from the JSON environment variable ``CKPT_DAG_SETTINGS``, e.g.
``{"payments": {"snapshot_every_s": 300, "min_pause_s": 30}}`` (keys: :data:`DEFAULTS`; ``notifiers``
lists ``"module:attr"`` notifiers - e.g. a configured ``SlackNotifier`` - told of every failure).
The warehouse comes from ``CKPT_WAREHOUSE`` or the Airflow Variable ``ckpt_warehouse`` (at run
time, never at parse time).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow.sdk import DAG, Param, TriggerRule

from checkpoint_lib.core.decider import DEFAULT_ROWS_PER_STEP
from checkpoint_lib.core.types import MODES
from checkpoint_lib.pipelines import declared, is_graph, name_of, names
from ckpt_airflow.operators import (
    AbortCheckpointOperator,
    CommitCheckpointOperator,
    MaintainPipelineOperator,
    PausePipelineOperator,
    RecoverPipelineOperator,
    RunStageOperator,
    TriggerCheckpointOperator,
    UnpausePipelineOperator,
    ValidateRecoveryParamsOperator,
    ValidateRestoreOperator,
)
from ckpt_airflow.assets import sink_assets
from ckpt_airflow.callbacks import FailureNotifier, resolve_notifier
from ckpt_airflow.sensors import CheckpointAcksSensor

DEFAULTS: dict[str, Any] = {
    "run_every_s": 600,          # <pipeline>_run schedule
    "snapshot_every_s": 900,     # <pipeline>_snapshot schedule
    "min_pause_s": 60,           # after the end of the last checkpoint, before a requested one
    "max_concurrent": 1,         # requests waiting for a barrier (one made while a checkpoint is in flight waits behind it)
    "ack_timeout_s": 900,        # a requested checkpoint not completed by then is aborted
    "poll_s": 10,                # how often the trigger reads the store
    "mode": "aligned",
    "layout": "chained",         # a dataflow graph's run DAG: chained (one task) or per_vertex (a task per group)
    "rows_per_checkpoint": DEFAULT_ROWS_PER_STEP,
    "launcher": None,            # None: the hook's default ("session"), or "spark-submit"
    "maintenance_every_s": 86_400,  # <pipeline>_maintenance schedule (daily)
    "retries": 2,
    "notifiers": [],             # "module:attr" notifiers told of every failure (after the task log's line)
}
START = datetime(2026, 1, 1, tzinfo=timezone.utc)
DAG_KINDS = ("run", "snapshot", "recover", "maintenance")
"""The DAGs :func:`build_dags` builds per linear pipeline: ``<pipeline>_<kind>``, in this order."""
GRAPH_DAG_KINDS = DAG_KINDS
"""The DAGs :func:`build_dags` builds per dataflow graph: the same kinds (see the module)."""


def settings_for(pipeline: str) -> dict[str, Any]:
    """:data:`DEFAULTS` updated with ``CKPT_DAG_SETTINGS[pipeline]``; unknown keys are an error. A
    pipeline with a cycle (``transfers``) defaults to unaligned: aligned cannot checkpoint it."""
    raw = os.environ.get("CKPT_DAG_SETTINGS", "").strip()
    overrides = json.loads(raw).get(pipeline, {}) if raw else {}
    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"CKPT_DAG_SETTINGS[{pipeline!r}]: unknown keys {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    base = dict(DEFAULTS)
    found = declared(pipeline)
    if any(e.feedback for e in found.edges) if is_graph(found) else found.feedback:
        base["mode"] = "unaligned"
    merged = {**base, **overrides}
    if merged["layout"] not in ("chained", "per_vertex"):
        raise ValueError(f"CKPT_DAG_SETTINGS[{pipeline!r}]: layout must be chained or per_vertex, got "
                         f"{merged['layout']!r}")
    return merged


def _default_args(s: dict[str, Any]) -> dict[str, Any]:
    notify = FailureNotifier(then=[resolve_notifier(name) for name in s["notifiers"]])
    return {"owner": "checkpoint_lib", "retries": s["retries"], "retry_delay": timedelta(seconds=30),
            "on_failure_callback": notify, "on_retry_callback": notify}


def _dag(pipeline: str, kind: str, description: str, s: dict[str, Any], **kwargs: Any) -> DAG:
    """One of the pipeline's DAGs, ``<pipeline>_<kind>``: never catching up, one run at a time (with
    the idempotent commit: never two commit phases of one checkpoint), tagged with the pipeline."""
    kwargs.setdefault("default_args", _default_args(s))
    return DAG(dag_id=f"{pipeline}_{kind}", description=f"{pipeline}: {description}", start_date=START,
               catchup=False, max_active_runs=1, tags=["checkpoint_lib", pipeline], **kwargs)


def build_run_dag(pipeline: str, s: dict[str, Any]) -> DAG:
    with _dag(pipeline, "run", "source and keyed stages, incremental, each run ends with a checkpoint", s,
              schedule=timedelta(seconds=s["run_every_s"])) as dag:
        common = dict(pipeline=pipeline, mode=s["mode"], rows_per_checkpoint=s["rows_per_checkpoint"],
                      launcher=s["launcher"])
        RunStageOperator(task_id="source", stage="source", **common) >> RunStageOperator(
            task_id="keyed", stage="keyed", outlets=sink_assets(pipeline), **common)
    return dag


def build_snapshot_dag(pipeline: str, s: dict[str, Any]) -> DAG:
    with _dag(pipeline, "snapshot", "periodic global snapshot (trigger, wait for acks, commit or abort)", s,
              schedule=timedelta(seconds=s["snapshot_every_s"])) as dag:
        trigger = TriggerCheckpointOperator(task_id="trigger", pipeline=pipeline, min_pause=s["min_pause_s"],
                                            max_concurrent=s["max_concurrent"])
        wait = CheckpointAcksSensor(
            task_id="wait_for_acks", pipeline=pipeline, request_id="{{ ti.xcom_pull(task_ids='trigger') }}",
            ack_timeout=s["ack_timeout_s"], poke_interval=s["poll_s"], retries=0,
        )
        commit = CommitCheckpointOperator(task_id="commit", pipeline=pipeline, launcher=s["launcher"],
                                          checkpoint_id="{{ ti.xcom_pull(task_ids='wait_for_acks') }}",
                                          outlets=sink_assets(pipeline))
        abort = AbortCheckpointOperator(
            task_id="abort", pipeline=pipeline, request_id="{{ ti.xcom_pull(task_ids='trigger') }}",
            reason="expired", message="the snapshot run {{ run_id }} gave up waiting for acks",
            trigger_rule=TriggerRule.ONE_FAILED,
        )
        trigger >> wait >> [commit, abort]
    return dag


def build_recover_dag(pipeline: str, s: dict[str, Any]) -> DAG:
    with _dag(
        pipeline, "recover", "restore a checkpoint and replay (manual, with a form)", s,
        schedule=None,
        default_args={**_default_args(s), "retries": 0},
        render_template_as_native_obj=True,  # XCom dicts and lists reach operators as such
        params={
            "checkpoint_id": Param(
                "latest", type="string", pattern=r"^(latest|[1-9][0-9]{0,17})$", maxLength=18,
                title="Checkpoint id", description="'latest' or the id of a retained completed checkpoint",
            ),
            "mode": Param(s["mode"], type="string", enum=list(MODES), title="Barrier mode after recovery"),
            "dry_run": Param(False, type="boolean", title="Dry run", description="only print the recovery plan"),
        },
    ) as dag:
        validate = ValidateRecoveryParamsOperator(
            task_id="validate_params", pipeline=pipeline, checkpoint_id="{{ params.checkpoint_id }}",
            mode="{{ params.mode }}", dry_run="{{ params.dry_run }}",
        )
        pause = PausePipelineOperator(task_id="pause", pipeline=pipeline,
                                      dag_ids=[f"{pipeline}_run", f"{pipeline}_snapshot"])
        recover = RecoverPipelineOperator(
            task_id="recover", pipeline=pipeline, launcher=s["launcher"], rows_per_checkpoint=s["rows_per_checkpoint"],
            params_in="{{ ti.xcom_pull(task_ids='validate_params') }}", outlets=sink_assets(pipeline),
        )
        check = ValidateRestoreOperator(task_id="validate_restore", pipeline=pipeline)  # the latest checkpoint
        unpause = UnpausePipelineOperator(task_id="unpause", pipeline=pipeline,
                                          paused_dag_ids="{{ ti.xcom_pull(task_ids='pause') }}")
        skip_if_dry = _dry_run_gate(validate.output)
        validate >> skip_if_dry >> pause >> recover >> check >> unpause
        # A teardown: runs whenever pause succeeded (also after a failed recovery), and does not
        # decide the run's state, so a failed recovery or check fails the run.
        unpause.as_teardown(setups=pause)
    return dag


def build_maintenance_dag(pipeline: str, s: dict[str, Any]) -> DAG:
    with _dag(pipeline, "maintenance", "delete what no retained checkpoint or savepoint needs (bounded growth)", s,
              schedule=timedelta(seconds=s["maintenance_every_s"])) as dag:
        MaintainPipelineOperator(task_id="maintain", pipeline=pipeline, launcher=s["launcher"])
    return dag


def _dry_run_gate(validated: Any):
    from airflow.sdk import task

    @task.short_circuit(task_id="unless_dry_run", ignore_downstream_trigger_rules=False)
    def unless_dry_run(validated: dict[str, Any]) -> bool:
        """A dry run stops here: the plan was printed by validate_params, nothing is changed."""
        return not validated["dry_run"]

    return unless_dry_run(validated)


def group_order(job: Any) -> list[tuple[str, list[str]]]:
    """The process groups of a job plan (:class:`checkpoint_lib.graph.JobGraph`), each with the
    groups it runs after: those a non-feedback edge reaches it from (a feedback edge goes back
    upstream: it orders nothing). In the plan's order (topological by first vertex), so every
    group's upstream groups come before it."""
    after: dict[str, list[str]] = {g.name: [] for g in job.groups}
    for e in job.edges:
        sender, receiver = job.processes[e.sender], job.processes[e.receiver]
        if sender != receiver and not e.feedback and sender not in after[receiver]:
            after[receiver].append(sender)
    return [(g.name, after[g.name]) for g in job.groups]


def build_graph_run_dag(graph: Any, s: dict[str, Any]) -> DAG:
    """``<graph>_run``: a ``run_<group>`` task per process group of the graph's job plan in the
    settings' ``layout`` (chained: one, ``run_all``; per_vertex: the sources' group and one per
    operator), downstream of the groups its edges come from; each task has its group's sinks as
    outlets. With several groups a last task, ``commit``, commits every sink up to the checkpoint
    the sources' group injected: the groups that ran before the last one acknowledged it left their
    transactions pre-committed."""
    from checkpoint_lib.graph import Layout, plan

    name, job = graph.name, plan(graph, Layout(s["layout"]))
    order = group_order(job)
    groups = ", ".join(f"`{g}`" for g, _ in order)
    doc = (f"Runs dataflow graph `{name}` until caught up, ending with a checkpoint: one task per process group "
           f"of its job plan ({groups}; `all` is every vertex in one process, every edge chained), through "
           "the graph runner (`ckpt run --stage <group>`)" + ("" if len(order) == 1 else
                                                              ", then `commit`: every sink up to that checkpoint")
           + ".")
    with _dag(name, "run", "the graph's process groups, incremental, each run ends with a checkpoint", s,
              schedule=timedelta(seconds=s["run_every_s"]), doc_md=doc) as dag:
        tasks = {}
        for group, after in order:
            tasks[group] = RunStageOperator(
                task_id=f"run_{group}", stage=group, pipeline=name, mode=s["mode"],
                rows_per_checkpoint=s["rows_per_checkpoint"], launcher=s["launcher"],
                outlets=sink_assets(name, job.group(group).sinks),
            )
            for upstream in after:
                tasks[upstream] >> tasks[group]
        if len(order) > 1:
            (steps,) = [g.name for g in job.groups if g.plans_steps]
            commit = CommitCheckpointOperator(
                task_id="commit", pipeline=name, launcher=s["launcher"], outlets=sink_assets(name),
                checkpoint_id=f"{{{{ ti.xcom_pull(task_ids='run_{steps}')['final'] }}}}")
            for group, _ in order:
                tasks[group] >> commit
    return dag


GRAPH_RECOVER_DOC = (
    "Recovers dataflow graph `{name}`: validate_params (prints the plan: every sink, keyed operator and source) "
    "-> unless_dry_run -> pause -> recover (new epoch, restore every vertex's state, re-commit or abort every "
    "sink's transactions, replay) -> validate_restore (the graph's own after-restore suite, `Graph.quality`, on "
    "the latest completed checkpoint, as `ckpt validate {name}` runs it; skipped, saying why, when the graph "
    "declares none) -> unpause (always).\n\n"
    "**Not for a graph yet:** no `mode` (every checkpoint of a graph is aligned)."
)


def build_graph_recover_dag(graph: Any, s: dict[str, Any]) -> DAG:
    """``<graph>_recover``: the linear recover DAG without a barrier mode (see
    :data:`GRAPH_RECOVER_DOC`), with ``allow_non_restored_state``; its ``validate_restore`` task runs
    the graph's own after-restore suite, or skips when the graph declares none."""
    name = graph.name
    with _dag(
        name, "recover", "restore a checkpoint and replay (manual, with a form)", s,
        schedule=None,
        default_args={**_default_args(s), "retries": 0},
        render_template_as_native_obj=True,  # XCom dicts and lists reach operators as such
        doc_md=GRAPH_RECOVER_DOC.format(name=name),
        params={
            "checkpoint_id": Param(
                "latest", type="string", pattern=r"^(latest|[1-9][0-9]{0,17})$", maxLength=18,
                title="Checkpoint id", description="'latest' or the id of a retained completed checkpoint",
            ),
            "allow_non_restored_state": Param(
                False, type="boolean", title="Allow non-restored state",
                description="drop the checkpoint's state of operators the graph no longer has (else refused)",
            ),
            "dry_run": Param(False, type="boolean", title="Dry run", description="only print the recovery plan"),
        },
    ) as dag:
        validate = ValidateRecoveryParamsOperator(
            task_id="validate_params", pipeline=name, checkpoint_id="{{ params.checkpoint_id }}",
            mode="aligned", allow_non_restored_state="{{ params.allow_non_restored_state }}",
            dry_run="{{ params.dry_run }}",
        )
        pause = PausePipelineOperator(task_id="pause", pipeline=name, dag_ids=[f"{name}_run", f"{name}_snapshot"])
        recover = RecoverPipelineOperator(
            task_id="recover", pipeline=name, launcher=s["launcher"], rows_per_checkpoint=s["rows_per_checkpoint"],
            params_in="{{ ti.xcom_pull(task_ids='validate_params') }}", outlets=sink_assets(name),
        )
        check = ValidateRestoreOperator(task_id="validate_restore", pipeline=name)  # the latest checkpoint
        unpause = UnpausePipelineOperator(task_id="unpause", pipeline=name,
                                          paused_dag_ids="{{ ti.xcom_pull(task_ids='pause') }}")
        validate >> _dry_run_gate(validate.output) >> pause >> recover >> check >> unpause
        # as the linear recover DAG's: a failed recovery or check still unpauses, and fails the run
        unpause.as_teardown(setups=pause)
    return dag


def build_graph_dags(graph: Any) -> dict[str, DAG]:
    """The four DAGs of a dataflow graph (a validated ``StreamGraph``): see the module."""
    s = settings_for(graph.name)
    dags = (build_graph_run_dag(graph, s), build_snapshot_dag(graph.name, s), build_graph_recover_dag(graph, s),
            build_maintenance_dag(graph.name, s))
    assert [d.dag_id for d in dags] == [f"{graph.name}_{kind}" for kind in GRAPH_DAG_KINDS]
    return {d.dag_id: d for d in dags}


def dag_kinds(pipeline: str) -> tuple[str, ...]:
    """The kinds of DAG :func:`build_dags` builds for ``pipeline`` (a name or a reference)."""
    return GRAPH_DAG_KINDS if is_graph(declared(pipeline)) else DAG_KINDS


def build_dags(pipeline: str) -> dict[str, DAG]:
    """The DAGs of ``pipeline``, a registered name or a ``module:attr`` reference: four of a linear
    pipeline (:data:`DAG_KINDS`), as many of a dataflow graph (:data:`GRAPH_DAG_KINDS`)."""
    pipeline = name_of(pipeline)
    found = declared(pipeline)
    if is_graph(found):
        return build_graph_dags(found)
    s = settings_for(pipeline)
    dags = (build_run_dag(pipeline, s), build_snapshot_dag(pipeline, s), build_recover_dag(pipeline, s),
            build_maintenance_dag(pipeline, s))
    assert [d.dag_id for d in dags] == [f"{pipeline}_{kind}" for kind in DAG_KINDS]
    return {d.dag_id: d for d in dags}


def dag_pipelines() -> list[str]:
    """The registered pipelines that get DAGs: every one, linear pipelines and dataflow graphs."""
    return names()


def dags_for_every_pipeline() -> dict[str, DAG]:
    """The DAGs of every registered pipeline and graph (:func:`build_dags`), by dag id (Airflow
    takes them from the globals of the DAG file that calls this, and attributes them to that
    file)."""
    dags: dict[str, DAG] = {}
    for name in dag_pipelines():
        dags.update(build_dags(name))
    return dags

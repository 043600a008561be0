"""``CheckpointHook``: every bit of I/O the Airflow side of checkpoint_lib does.

One hook per pipeline. It owns the checkpoint store (through :class:`checkpoint_lib.control.
PipelineControl`, delta-rs, no JVM), the Spark work (a stage run, a recovery, a commit that has
work to do) and the optional calls to Airflow's own REST API (pausing DAGs). Operators, the sensor
and the trigger only call it.

Where things come from (first match wins; nothing is resolved in the constructor):

- warehouse: the ``warehouse`` argument, the connection's extra ``warehouse``, the environment
  variable ``CKPT_WAREHOUSE``, the Airflow Variable ``ckpt_warehouse``.
- Spark master: the ``spark_master`` argument, the connection's host (``spark://host:7077``, or
  ``local[2]``), ``CKPT_SPARK_MASTER``, else ``local[2]``.
- launcher: ``"session"`` runs Spark inside the task process (one JVM per task process; under
  ``airflow dags test`` one for the whole run), ``"spark-submit"`` runs the ``jobs/`` entry points
  with ``spark-submit --master <master>`` as a child process (killed by ``on_kill``).

Connection ``checkpoint_lib_default`` (type ``checkpoint_lib``, with a form: Spark master,
warehouse, launcher) is read by every hook, operator and sensor unless they name another
(``ckpt_conn_id``); it is optional: without it the environment and the Variable answer. A
connection named explicitly must exist. ``host`` = Spark master, extra
``{"warehouse": "/data/warehouse", "launcher": "spark-submit"}``.
Connection ``ckpt_storage`` (type ``aws``, ``google_cloud_platform`` or ``wasb``; another id in the
checkpoint_lib connection's extra ``storage_conn_id``) is optional: the credentials of a warehouse
on object storage (``s3://``...), exported to the task's environment; without it the environment's.
Connection ``ckpt_airflow_api`` (type ``http``) is optional: host = the api-server URL, login and
password of a user allowed to pause DAGs; without it, DAGs are not paused in Airflow (the
pipeline's own pause flag in the warehouse still stops this provider's tasks).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from airflow.sdk.bases.hook import BaseHook

from checkpoint_lib.core.decider import DEFAULT_ROWS_PER_STEP
from checkpoint_lib.layout import DATA_PLANE, checkpoint_root, warehouse_location
from checkpoint_lib.objectstore import env_from_connection, is_remote
from checkpoint_lib.submit import build_submit_argv, stage_args, submit_env

if TYPE_CHECKING:
    from checkpoint_lib.control import CheckpointProgress, CommitOutcome, PipelineControl

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[2]"
LAUNCHERS = ("session", "spark-submit")
WAREHOUSE_ENV = "CKPT_WAREHOUSE"
WAREHOUSE_VARIABLE = "ckpt_warehouse"
API_CONN_ID = "ckpt_airflow_api"
STORAGE_CONN_ID = "ckpt_storage"


class WarehouseNotConfigured(RuntimeError):
    """No warehouse root: set CKPT_WAREHOUSE, the Variable ckpt_warehouse or the connection extra."""


def resolve_warehouse(explicit: str | None = None, conn_extra: dict[str, Any] | None = None) -> str:
    """The warehouse root, absolute (see the module docstring for the order)."""
    candidates: list[Callable[[], str | None]] = [
        lambda: explicit,
        lambda: (conn_extra or {}).get("warehouse"),
        lambda: os.environ.get(WAREHOUSE_ENV),
        _warehouse_variable,
    ]
    for candidate in candidates:
        value = candidate()
        if value:
            return warehouse_location(value)
    raise WarehouseNotConfigured(
        f"no warehouse configured: set the environment variable {WAREHOUSE_ENV}, the Airflow Variable "
        f"{WAREHOUSE_VARIABLE!r}, or the extra 'warehouse' of the connection"
    )


def _warehouse_variable() -> str | None:
    try:
        from airflow.sdk import Variable

        return Variable.get(WAREHOUSE_VARIABLE, default=None)
    except Exception:  # outside a task (api-server, triggerer) the SDK has no supervisor to ask
        return None


class CheckpointHook(BaseHook):
    """Checkpoint store, Spark and Airflow-API access for one pipeline (see the module docstring)."""

    conn_name_attr = "ckpt_conn_id"
    default_conn_name = "checkpoint_lib_default"
    conn_type = "checkpoint_lib"
    hook_name = "checkpoint_lib"

    @classmethod
    def connection_type_info(cls) -> dict[str, Any]:
        """The connection type and its form, as provider info declares them (``conn-fields``)."""
        return {
            "connection-type": cls.conn_type,
            "hook-class-name": f"{cls.__module__}.{cls.__qualname__}",
            "hook-name": "checkpoint_lib (Spark + Delta checkpoints)",
            "conn-fields": {
                "warehouse": {"label": "Warehouse", "description": "the warehouse root every pipeline lives in",
                              "schema": {"type": ["string", "null"]}},
                "launcher": {"label": "Launcher", "description": "session: Spark inside the task process; "
                             "spark-submit: the jobs/ entry points as a child process",
                             "schema": {"type": ["string", "null"], "enum": [*LAUNCHERS, None], "default": "session"}},
            },
            "ui-field-behaviour": {
                "hidden-fields": ["schema", "login", "password", "port"],
                "relabeling": {"host": "Spark master"},
                "placeholders": {"host": "local[2] or spark://spark-master:7077"},
            },
        }

    def __init__(
        self,
        pipeline: str,
        *,
        warehouse: str | None = None,
        ckpt_conn_id: str | None = None,
        spark_master: str | None = None,
        launcher: str | None = None,
    ):
        super().__init__()
        from checkpoint_lib.control import validate_pipeline_name

        self.pipeline = validate_pipeline_name(pipeline)
        self.ckpt_conn_id = ckpt_conn_id or self.default_conn_name
        self._conn_required = ckpt_conn_id is not None  # the default one may be absent
        self._warehouse = warehouse
        self._spark_master = spark_master
        if launcher is not None and launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
        self._launcher = launcher
        self._conn_extra: dict[str, Any] | None = None
        self._conn_host: str | None = None
        self._storage_applied = False
        self._control: PipelineControl | None = None
        self._child: subprocess.Popen[bytes] | None = None

    # --- configuration (resolved lazily) -------------------------------------------------------

    def _connection(self) -> None:
        if self._conn_extra is not None:
            return
        self._conn_extra = {}
        try:
            conn = self.get_connection(self.ckpt_conn_id)
        except Exception:  # noqa: BLE001 - AirflowNotFoundException, or no way to ask (outside a task)
            if self._conn_required:  # asked for explicitly: a missing one is an error
                raise
            log.debug("no connection %s: the environment and the Variable configure the hook", self.ckpt_conn_id)
            return
        extra = dict(conn.extra_dejson or {})
        prefix = f"extra__{self.conn_type}__"  # how the connection form may store its fields
        self._conn_extra = {k.removeprefix(prefix): v for k, v in extra.items() if v not in (None, "")}
        self._conn_host = conn.host or None

    @property
    def warehouse(self) -> str:
        self._connection()
        warehouse = resolve_warehouse(self._warehouse, self._conn_extra)
        if is_remote(warehouse):
            self._storage_credentials()
        return warehouse

    def _storage_credentials(self) -> None:
        """A warehouse on object storage: the credentials of the connection ``storage_conn_id``
        (the checkpoint_lib connection's extra, else ``ckpt_storage``; type ``aws``,
        ``google_cloud_platform`` or ``wasb``), exported as the standard variables delta-rs,
        obstore and Spark read, for this task process and the processes it starts. Without the
        connection, the environment's own credentials are used."""
        if self._storage_applied:
            return
        conn_id = (self._conn_extra or {}).get("storage_conn_id") or STORAGE_CONN_ID
        try:
            conn = self.get_connection(conn_id)
        except Exception:  # noqa: BLE001 - AirflowNotFoundException: the environment configures it
            if (self._conn_extra or {}).get("storage_conn_id"):  # named explicitly: must exist, every time
                raise
            log.debug("no connection %s: object-store credentials come from the environment", conn_id)
        else:
            env = env_from_connection(conn.conn_type, conn.login, conn.password, dict(conn.extra_dejson or {}))
            os.environ.update(env)
            log.info("object-store credentials from connection %s (%s)", conn_id, ", ".join(sorted(env)))
        self._storage_applied = True

    @property
    def spark_master(self) -> str:
        self._connection()
        return self._spark_master or self._conn_host or os.environ.get("CKPT_SPARK_MASTER") or DEFAULT_MASTER

    @property
    def launcher(self) -> str:
        self._connection()
        launcher = self._launcher or (self._conn_extra or {}).get("launcher") or "session"
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
        return launcher

    def control(self) -> "PipelineControl":
        """The pipeline's :class:`~checkpoint_lib.control.PipelineControl` (store opened lazily)."""
        if self._control is None:
            from checkpoint_lib.control import PipelineControl

            self._control = PipelineControl(self.warehouse, self.pipeline)
        return self._control

    # --- checkpoints (delta-rs, no JVM) ------------------------------------------------------

    def request_checkpoint(self, request_id: str, *, min_pause: float, max_concurrent: int, requested_by: str = ""):
        return self.control().request_checkpoint(
            request_id, min_pause=min_pause, max_concurrent=max_concurrent, requested_by=requested_by
        )

    def progress(self, *, request_id: str | None = None, checkpoint_id: int | None = None) -> "CheckpointProgress":
        return self.control().progress(request_id=request_id, checkpoint_id=checkpoint_id)

    async def aprogress(self, *, request_id: str | None = None, checkpoint_id: int | None = None) -> "CheckpointProgress":
        """:meth:`progress` off the event loop (for triggers): delta-rs reads block."""
        return await asyncio.to_thread(self.progress, request_id=request_id, checkpoint_id=checkpoint_id)

    def abort(self, **kwargs: Any):
        return self.control().abort(**kwargs)

    def commit(self, checkpoint_id: int) -> "CommitOutcome":
        """Commit phase (idempotent; Spark only if a transaction is actually uncommitted)."""
        control = self.control()
        if self.launcher == "session":
            return control.commit(checkpoint_id, spark=None if self._nothing_to_commit(checkpoint_id) else self.spark())
        return control.commit(checkpoint_id)

    def _nothing_to_commit(self, checkpoint_id: int) -> bool:
        try:
            return self.control().all_committed(checkpoint_id)
        except Exception:  # let commit() raise the precise error
            return True

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        return self.control().history(limit)

    # --- Spark work ------------------------------------------------------------------------------

    def spark(self):
        """The shared SparkSession of this process (started on first use, with Delta)."""
        from checkpoint_lib.spark.session import get_spark, use_warehouse

        spark = get_spark(master=self.spark_master, app_name=f"ckpt-{self.pipeline}", ui=False)
        use_warehouse(spark, self.warehouse)
        return spark

    def run_stage(self, stage: str, *, mode: str = "aligned", rows_per_checkpoint: int = DEFAULT_ROWS_PER_STEP,
                  max_steps: int | None = None) -> dict[str, Any]:
        """Run one stage of the pipeline until caught up (it recovers first if its last run died). For
        a dataflow graph ``stage`` names a process group of its job plan (:func:`graph_group`:
        today's plans have one, ``all``, which the graph runner runs)."""
        graph = self._graph()
        if graph is not None:
            stage = graph_group(graph, stage)
        args = stage_args(self.pipeline, self.warehouse, stage=stage, mode=mode,
                          rows_per_checkpoint=rows_per_checkpoint, max_steps=max_steps)
        if self.launcher == "spark-submit":
            self._submit("run_stage.py", args)  # `ckpt run` takes a graph: --stage all runs its one group
            return {"stage": stage, "launcher": "spark-submit"}
        if graph is not None:
            from checkpoint_lib.graph import Layout

            runner = self._graph_runner(graph, mode=mode, rows_per_checkpoint=rows_per_checkpoint,
                                        processes=Layout.of_stage(stage), group=stage)
            return _summary(runner.run(until_caught_up=True, max_steps=max_steps))
        from checkpoint_lib.pipelines import get
        from checkpoint_lib.spark.runner import PipelineRunner

        runner = PipelineRunner(
            get(self.pipeline), self.warehouse, self.spark(), mode=mode, rows_per_checkpoint=rows_per_checkpoint,
            config=_run_config(), progress=self.log.info, stage=stage,
        )
        return _summary(runner.run(until_caught_up=True, max_steps=max_steps))

    def _graph(self) -> Any:
        """The pipeline's dataflow graph (a validated ``StreamGraph``), or None for a linear pipeline."""
        from checkpoint_lib.pipelines import declared, is_graph

        found = declared(self.pipeline)
        return found if is_graph(found) else None

    def _graph_runner(self, graph: Any, *, mode: str, rows_per_checkpoint: int, **kwargs: Any):
        """A :class:`~checkpoint_lib.spark.graph_runner.GraphRunner` of ``graph`` in this process
        (every vertex, every edge chained: the plan's one group), as ``ckpt run`` builds it."""
        from checkpoint_lib.spark.graph_runner import GraphRunner

        return GraphRunner(graph, self.warehouse, self.spark(), mode=mode, rows_per_checkpoint=rows_per_checkpoint,
                           config=_run_config(), progress=self.log.info, **kwargs)

    def recovery_plan(self, checkpoint_id: int | None) -> str:
        """What a recovery would do, as ``ckpt recover --dry-run`` prints it: per sink the version
        now and the one it rolls back to with the rows discarded, per operator the state restored,
        per source the rows to replay (read-only, delta-rs)."""
        from checkpoint_lib.delta.inspect import recovery_preview

        return recovery_preview(self.warehouse, self.pipeline, checkpoint_id,
                                plan=self.control().store.recovery_plan(checkpoint_id)).describe()

    def recover(self, checkpoint_id: int | None, *, mode: str = "aligned",
                rows_per_checkpoint: int = DEFAULT_ROWS_PER_STEP, allow_non_restored_state: bool = False) -> dict[str, Any]:
        """Fence the old attempt (new epoch), restore ``checkpoint_id`` (None: the latest completed;
        an older one rolls the sinks back), re-commit what it owns, abort the rest, and replay every
        stage until caught up, ending with a completed checkpoint. A dataflow graph is recovered by
        its graph runner (every vertex's state, every sink). ``allow_non_restored_state``: drop the
        checkpoint's state of operators the pipeline no longer has (else such a restore is refused)."""
        if self.launcher == "spark-submit":
            args = stage_args(self.pipeline, self.warehouse, stage="all", mode=mode,
                              rows_per_checkpoint=rows_per_checkpoint)[:-1]
            if checkpoint_id is not None:
                args += ["--checkpoint", str(int(checkpoint_id))]
            if allow_non_restored_state:
                args += ["--allow-non-restored-state"]
            self._submit("recover.py", args)  # `ckpt recover` validates too (a graph: its own suite, if any)
            return {"restored": checkpoint_id, "launcher": "spark-submit"}
        restore = dict(recover=True, restore_checkpoint=checkpoint_id,
                       allow_non_restored_state=allow_non_restored_state)
        graph = self._graph()
        if graph is not None:
            runner = self._graph_runner(graph, mode=mode, rows_per_checkpoint=rows_per_checkpoint, **restore)
            return _summary(runner.run(until_caught_up=True))
        from checkpoint_lib.pipelines import get
        from checkpoint_lib.spark.runner import PipelineRunner

        runner = PipelineRunner(
            get(self.pipeline), self.warehouse, self.spark(), mode=mode, rows_per_checkpoint=rows_per_checkpoint,
            config=_run_config(), progress=self.log.info, stage="all", **restore,
        )
        return _summary(runner.run(until_caught_up=True))

    def maintain(self, *, dry_run: bool = False, with_spark: bool = True) -> dict[str, Any]:
        """Apply the pipeline's retention rules (:func:`checkpoint_lib.maintenance.maintain`): safe
        while the pipeline runs. ``with_spark=False``: the control plane only (no JVM). Returns the
        report as a JSON-able dict (what the operator pushes to XCom)."""
        if with_spark and self.launcher == "spark-submit":
            self._submit("maintain.py", [self.pipeline, "--warehouse", self.warehouse, *(["--dry-run"] if dry_run else [])])
            return {"pipeline": self.pipeline, "dry_run": dry_run, "launcher": "spark-submit"}
        from checkpoint_lib.files import files_at
        from checkpoint_lib.maintenance import maintain

        root = checkpoint_root(self.warehouse, self.pipeline)
        data_plane = any(files_at(root).is_dir(root / d) for d in DATA_PLANE)  # a local folder or an s3:// prefix
        spark = self.spark() if with_spark and data_plane else None  # no JVM for a pipeline that never ran
        report = maintain(self.warehouse, self.pipeline, spark, dry_run=dry_run)
        self.log.info("%s", report.describe())
        return json.loads(json.dumps(report.to_dict(), default=str))

    def _submit(self, job: str, args: Sequence[str]) -> None:
        """spark-submit a ``jobs/`` entry point, streaming its output into the task log."""
        from checkpoint_lib.spark.jars import ensure_jars

        spark_submit = shutil.which("spark-submit") or str(Path(sys.executable).with_name("spark-submit"))
        argv = build_submit_argv(job, list(args), master=self.spark_master, spark_submit=spark_submit,
                                 jars=[str(j) for j in ensure_jars()])
        env = submit_env(self.spark_master)
        self.log.info("running %s", " ".join(argv))
        self._child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        assert self._child.stdout is not None
        for line in self._child.stdout:
            self.log.info("%s", line.decode(errors="replace").rstrip())
        code = self._child.wait()
        self._child = None
        if code != 0:
            raise RuntimeError(f"{job} exited with {code} (see the lines above)")

    def kill(self) -> None:
        """Stop a running spark-submit child (its whole process group). For ``on_kill``."""
        child = self._child
        if child is not None and child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)

    # --- pausing -------------------------------------------------------------------------------

    def paused(self) -> dict[str, Any] | None:
        return self.control().paused()

    def pause(self, by: str, reason: str) -> bool:
        return self.control().pause(by, reason)

    def unpause(self, by: str) -> bool:
        return self.control().unpause(by)

    def set_dags_paused(self, dag_ids: Sequence[str], paused: bool) -> list[str]:
        """Pause (or unpause) DAGs through Airflow's REST API; returns the DAGs whose state this
        call changed. Without the ``ckpt_airflow_api`` connection: logs why and returns []."""
        import httpx

        try:
            conn = self.get_connection(API_CONN_ID)
        except Exception:
            self.log.warning("connection %r is not configured: DAGs %s stay %s in Airflow (the pipeline's "
                             "pause flag still stops checkpoint_lib tasks)", API_CONN_ID, list(dag_ids),
                             "unpaused" if paused else "as they are")
            return []
        base = (conn.host or "").rstrip("/")
        if not base.startswith("http"):
            base = f"http://{base}:{conn.port or 8080}"
        with httpx.Client(base_url=base, timeout=30) as client:
            token = client.post("/auth/token", json={"username": conn.login, "password": conn.password})
            token.raise_for_status()
            headers = {"Authorization": f"Bearer {token.json()['access_token']}"}
            changed = []
            for dag_id in dag_ids:
                got = client.get(f"/api/v2/dags/{dag_id}", headers=headers)
                if got.status_code == 404:
                    continue
                got.raise_for_status()
                if bool(got.json().get("is_paused")) == paused:
                    continue
                client.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": paused}, headers=headers).raise_for_status()
                changed.append(dag_id)
        return changed


def graph_group(graph: Any, group: str) -> str:
    """``group`` if it is a process group of ``graph``'s job plan that runs (:func:`checkpoint_lib.graph.plan`
    in :meth:`Layout.of_stage <checkpoint_lib.graph.Layout.of_stage>`: ``all``, every vertex in one
    process, or a group of the per-vertex layout); else ValueError naming the plan's groups."""
    from checkpoint_lib.graph import Layout, plan

    groups = [g.name for g in plan(graph, Layout.of_stage(group)).groups]
    if group not in groups:
        raise ValueError(f"graph {graph.name} has no process group {group!r} in its job plan (groups: all, or "
                         f"each of {', '.join(groups)} as its own process)")
    return group


def _run_config():
    """The checkpoint policy of a run from Airflow: no timer (each run ends with its checkpoint)."""
    from checkpoint_lib.core.decider import CheckpointConfig

    return CheckpointConfig(interval=0, max_concurrent=1, timeout=3600, retained=5)


def _summary(summary: Any) -> dict[str, Any]:
    """A RunSummary as a JSON-able dict (what operators push to XCom)."""
    return json.loads(json.dumps({
        "epoch": summary.epoch, "restored": summary.restored, "completed": list(summary.completed),
        "aborted": [list(a) for a in summary.aborted], "rows_in": summary.rows_in, "final": summary.final,
        "steps": summary.steps, "seconds": round(summary.seconds, 3),
    }))

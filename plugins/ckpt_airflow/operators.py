"""Operators of checkpoint_lib: each a few lines that call :class:`~ckpt_airflow.hooks.CheckpointHook`.

Every operator takes ``pipeline`` and the hook settings (``warehouse``, ``ckpt_conn_id``,
``spark_master``, ``launcher``) through :class:`CheckpointBaseOperator`, and says in its task
log what it did and why. Skips (``AirflowSkipException``) mean "nothing to do now, by design":
the pipeline is paused by a recovery, or the checkpoint policy postponed a request.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from checkpoint_lib.core.decider import DEFAULT_ROWS_PER_STEP
from ckpt_airflow.assets import annotate
from ckpt_airflow.hooks import CheckpointHook


def request_id_for(run_id: str) -> str:
    """A request id from a DAG run id: the same run (and its retries) always asks once."""
    return re.sub(r"[^A-Za-z0-9_.:+-]", "_", run_id).lstrip("._-")[:200] or "run"


class CheckpointBaseOperator(BaseOperator):
    """Shared hook settings; ``skip_when_paused`` makes the task skip while a recovery holds the
    pipeline's pause flag."""

    template_fields: Sequence[str] = ("pipeline",)
    skip_when_paused = True

    def __init__(self, *, pipeline: str, warehouse: str | None = None, ckpt_conn_id: str | None = None,
                 spark_master: str | None = None, launcher: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.warehouse = warehouse
        self.ckpt_conn_id = ckpt_conn_id
        self.spark_master = spark_master
        self.launcher = launcher
        self._hook: CheckpointHook | None = None

    @property
    def hook(self) -> CheckpointHook:
        if self._hook is None:
            self._hook = CheckpointHook(self.pipeline, warehouse=self.warehouse, ckpt_conn_id=self.ckpt_conn_id,
                                        spark_master=self.spark_master, launcher=self.launcher)
        return self._hook

    def check_not_paused(self) -> None:
        flag = self.hook.paused()
        if flag is not None:
            raise AirflowSkipException(
                f"pipeline {self.pipeline} is paused by {flag.get('by')} ({flag.get('reason')}): skipping"
            )

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.kill()


class RunStageOperator(CheckpointBaseOperator):
    """Run one stage (``source``, ``keyed`` or ``all``; of a dataflow graph: a process group of its
    job plan, today ``all``) until caught up. A stage whose previous run died recovers first (new
    epoch, restore the latest completed checkpoint); the summary (epoch, checkpoints completed,
    rows read) goes to XCom."""

    template_fields: Sequence[str] = ("pipeline", "stage", "mode")

    def __init__(self, *, stage: str, mode: str = "aligned", rows_per_checkpoint: int = DEFAULT_ROWS_PER_STEP,
                 max_steps: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.stage, self.mode = stage, mode
        self.rows_per_checkpoint, self.max_steps = rows_per_checkpoint, max_steps

    def execute(self, context: Any) -> dict[str, Any]:
        self.check_not_paused()
        summary = self.hook.run_stage(self.stage, mode=self.mode, rows_per_checkpoint=self.rows_per_checkpoint,
                                      max_steps=self.max_steps)
        self.log.info("%s stage of %s: %s", self.stage, self.pipeline, summary)
        annotate(context, self.outlets, self.hook.warehouse, completed=summary.get("completed"))
        return summary


class TriggerCheckpointOperator(CheckpointBaseOperator):
    """Ask for a checkpoint: a durable request the pipeline's next source step honours. Admitted
    or postponed by the checkpoint policy (``min_pause`` seconds after the last checkpoint ended,
    at most ``max_concurrent`` requests waiting; one made while a checkpoint is in flight waits behind
    it); postponed skips the rest of the run. Idempotent per DAG
    run: a retry finds the request it already made. Returns the request id."""

    def __init__(self, *, min_pause: float = 0.0, max_concurrent: int = 1, **kwargs: Any):
        super().__init__(**kwargs)
        self.min_pause, self.max_concurrent = min_pause, max_concurrent

    def execute(self, context: Any) -> str:
        self.check_not_paused()
        request_id = request_id_for(context["run_id"])
        outcome = self.hook.request_checkpoint(request_id, min_pause=self.min_pause,
                                               max_concurrent=self.max_concurrent, requested_by=context["dag"].dag_id)
        if outcome.request is None:
            raise AirflowSkipException(f"checkpoint postponed: {outcome.postponed} (not before {outcome.not_before})")
        state = "requested" if outcome.created else f"already {outcome.request.state} (a retry)"
        self.log.info("checkpoint of %s %s as request %s", self.pipeline, state, request_id)
        return request_id


class CommitCheckpointOperator(CheckpointBaseOperator):
    """Commit phase: notify-complete -> two-phase commit of every sink's transactions the checkpoint
    owns. A no-op when they are committed already (the usual case: the stage that completed the
    checkpoint committed them); skipped when the checkpoint's epoch was fenced by a recovery
    (the recovery re-committed or rolled back what it owned)."""

    template_fields: Sequence[str] = ("pipeline", "checkpoint_id")
    skip_when_paused = False

    def __init__(self, *, checkpoint_id: Any, **kwargs: Any):
        super().__init__(**kwargs)
        self.checkpoint_id = checkpoint_id

    def execute(self, context: Any) -> dict[str, Any]:
        from checkpoint_lib.core.errors import FencedError

        try:
            outcome = self.hook.commit(int(self.checkpoint_id))
        except FencedError as exc:
            raise AirflowSkipException(f"not committed: {exc}") from None
        self.log.info("%s", outcome.describe())
        annotate(context, self.outlets, self.hook.warehouse, checkpoint_id=outcome.checkpoint_id)
        return {"checkpoint_id": outcome.checkpoint_id, "committed": outcome.committed, "noop": outcome.noop}


class AbortCheckpointOperator(CheckpointBaseOperator):
    """Abort phase: cancel the request if no source step honoured it, else mark its checkpoint
    aborted with ``reason`` (a completed checkpoint is never aborted: logged instead)."""

    template_fields: Sequence[str] = ("pipeline", "request_id", "message")
    skip_when_paused = False

    def __init__(self, *, request_id: str, reason: str = "expired", message: str = "", **kwargs: Any):
        super().__init__(**kwargs)
        self.request_id, self.reason, self.message = request_id, reason, message

    def execute(self, context: Any) -> dict[str, Any]:
        if not self.request_id or self.request_id == "None":
            raise AirflowSkipException("no checkpoint was requested: nothing to abort")
        outcome = self.hook.abort(request_id=self.request_id, reason=self.reason,
                                  message=self.message or f"aborted by {context['run_id']}")
        self.log.info("abort of request %s: %s (checkpoint %s) %s", self.request_id, outcome.status,
                      outcome.checkpoint_id, outcome.message)
        return {"aborted": outcome.aborted, "status": outcome.status, "checkpoint_id": outcome.checkpoint_id}


class ValidateRecoveryParamsOperator(CheckpointBaseOperator):
    """Check a recovery's parameters before anything is touched: the checkpoint id ('latest' or a
    retained completed checkpoint), the mode, ``allow_non_restored_state``. Fails at once (no retry)
    with a clear message. Logs the recovery plan (what ``ckpt recover --dry-run`` prints) and returns
    the normalised parameters (a dataflow graph's plan too: every sink, keyed operator and source)."""

    template_fields: Sequence[str] = ("pipeline", "checkpoint_id", "mode", "dry_run", "allow_non_restored_state")
    skip_when_paused = False

    def __init__(self, *, checkpoint_id: Any = "latest", mode: str = "aligned", dry_run: Any = False,
                 allow_non_restored_state: Any = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.checkpoint_id, self.mode, self.dry_run = checkpoint_id, mode, dry_run
        self.allow_non_restored_state = allow_non_restored_state

    def execute(self, context: Any) -> dict[str, Any]:
        from checkpoint_lib.core.errors import UnknownCheckpointError
        from checkpoint_lib.submit import MODES

        dry_run = _flag("dry_run", self.dry_run)
        allow = _flag("allow_non_restored_state", self.allow_non_restored_state)
        try:
            cid = self.hook.control().resolve_checkpoint(self.checkpoint_id)
        except (ValueError, UnknownCheckpointError) as exc:
            raise AirflowFailException(f"invalid checkpoint_id: {exc}") from None
        if self.mode not in MODES:
            raise AirflowFailException(f"invalid mode {str(self.mode)[:40]!r}: one of {', '.join(MODES)}")
        params = {"checkpoint_id": cid, "mode": self.mode, "dry_run": dry_run, "allow_non_restored_state": allow}
        params["plan"] = self.hook.recovery_plan(cid)
        self.log.info("recovery plan for %s:\n%s", self.pipeline, params["plan"])
        if dry_run:
            self.log.info("dry run: nothing was changed")
        return params


def _flag(name: str, value: Any) -> bool:
    """A boolean parameter as a form or a conf gives it (``True``, ``"true"``, ``"1"``...);
    anything else fails the task at once."""
    if value not in (True, False, "True", "False", "true", "false", "1", "0"):
        raise AirflowFailException(f"invalid {name} {str(value)[:40]!r}: true or false")
    return value in (True, "True", "true", "1")


class PausePipelineOperator(CheckpointBaseOperator):
    """Take the pipeline's pause flag for this run (fails if another recovery holds it) and pause
    ``dag_ids`` in Airflow (through the REST API when configured). Returns the DAGs it paused."""

    template_fields: Sequence[str] = ("pipeline",)
    skip_when_paused = False

    def __init__(self, *, dag_ids: Sequence[str], **kwargs: Any):
        super().__init__(**kwargs)
        self.dag_ids = list(dag_ids)

    def execute(self, context: Any) -> list[str]:
        if not self.hook.pause(context["run_id"], f"recovery by {context['dag'].dag_id}"):
            raise AirflowFailException(f"pipeline {self.pipeline} is held by {self.hook.paused()}: not recovering")
        changed = self.hook.set_dags_paused(self.dag_ids, True)
        self.log.info("pipeline %s paused (flag held by %s); Airflow DAGs paused: %s",
                      self.pipeline, context["run_id"], changed or "none")
        return changed


class UnpausePipelineOperator(CheckpointBaseOperator):
    """Release the pause flag this run holds and unpause the DAGs its pause task paused (only
    those). Meant to run with ``trigger_rule="all_done"``: a failed recovery still unpauses."""

    template_fields: Sequence[str] = ("pipeline", "paused_dag_ids")
    skip_when_paused = False

    def __init__(self, *, paused_dag_ids: Any = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.paused_dag_ids = paused_dag_ids

    def execute(self, context: Any) -> None:
        dag_ids = self.paused_dag_ids if isinstance(self.paused_dag_ids, list) else []
        released = self.hook.unpause(context["run_id"])
        changed = self.hook.set_dags_paused(dag_ids, False) if dag_ids else []
        self.log.info("pipeline %s: pause flag %s; Airflow DAGs unpaused: %s", self.pipeline,
                      "released" if released else "held by someone else (left alone)", changed or "none")


class RecoverPipelineOperator(CheckpointBaseOperator):
    """Recover: fence the old attempt, restore the checkpoint (None: latest), re-commit what it
    owns and abort the rest, replay until caught up. Returns the run summary."""

    template_fields: Sequence[str] = ("pipeline", "params_in")
    skip_when_paused = False

    def __init__(self, *, params_in: Any, rows_per_checkpoint: int = DEFAULT_ROWS_PER_STEP, **kwargs: Any):
        super().__init__(**kwargs)
        self.params_in, self.rows_per_checkpoint = params_in, rows_per_checkpoint

    def execute(self, context: Any) -> dict[str, Any]:
        p = self.params_in
        if not isinstance(p, dict):
            raise AirflowFailException(f"recover needs the validated parameters, got {p!r}")
        summary = self.hook.recover(p["checkpoint_id"], mode=p["mode"], rows_per_checkpoint=self.rows_per_checkpoint,
                                    allow_non_restored_state=bool(p.get("allow_non_restored_state", False)))
        self.log.info("recovered %s: %s", self.pipeline, summary)
        annotate(context, self.outlets, self.hook.warehouse, restored=summary.get("restored"),
                 completed=summary.get("completed"))
        return summary


class ValidateRestoreOperator(CheckpointBaseOperator):
    """Consistency checks after a restore: ``checkpoint_lib.quality.validate_restore(spark,
    pipeline, warehouse, checkpoint_id)`` (``checkpoint_id`` None: the latest completed checkpoint)
    and fails the task when the result is not a success. The pipeline is either kind the registry
    declares (:func:`checkpoint_lib.pipelines.declared`): a linear pipeline runs its own suite, or
    the generic one; a dataflow graph runs the after-restore suite it declares (``Graph.quality``),
    and one that declares none is skipped before Spark starts (the task shows as skipped, with the
    reason in its log), never passed."""

    template_fields: Sequence[str] = ("pipeline", "checkpoint_id")
    skip_when_paused = False

    def __init__(self, *, checkpoint_id: Any = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.checkpoint_id = checkpoint_id

    def execute(self, context: Any) -> Any:
        from checkpoint_lib.control import parse_checkpoint_id
        from checkpoint_lib.pipelines import declared, is_graph
        from checkpoint_lib.quality import validate_restore
        from checkpoint_lib.quality.spec import NoGraphSuite, graph_spec

        cid = parse_checkpoint_id(self.checkpoint_id)
        found = declared(self.pipeline)  # a linear pipeline, or a dataflow graph
        if is_graph(found):
            try:
                graph_spec(found)
            except NoGraphSuite as exc:  # as `ckpt recover` of such a graph: said, not passed
                raise AirflowSkipException(f"restore validation of {self.pipeline} skipped: {exc}") from None
        result = validate_restore(self.hook.spark(), self.pipeline, self.hook.warehouse, cid, raise_on_failure=False)
        if result is False or (hasattr(result, "success") and not result.success):
            raise AirflowFailException(f"restore validation of {self.pipeline} failed: {result}")
        self.log.info("restore validation of %s passed: %s", self.pipeline, result)
        return None if result is None else str(result)


class MaintainPipelineOperator(CheckpointBaseOperator):
    """Apply the pipeline's retention rules (``ckpt maintain``): delete what no retained checkpoint
    or savepoint needs, safe while the pipeline runs. Skipped while a recovery holds the pipeline
    (nothing is lost by waiting a day). ``dry_run`` only reports; ``with_spark=False`` runs the
    control-plane rules alone (no JVM). Returns the report (a dict)."""

    template_fields: Sequence[str] = ("pipeline", "dry_run")

    def __init__(self, *, dry_run: Any = False, with_spark: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.dry_run, self.with_spark = dry_run, with_spark

    def execute(self, context: Any) -> dict[str, Any]:
        self.check_not_paused()
        if self.dry_run not in (True, False, "True", "False", "true", "false"):
            raise AirflowFailException(f"invalid dry_run {str(self.dry_run)[:40]!r}: true or false")
        report = self.hook.maintain(dry_run=self.dry_run in (True, "True", "true"), with_spark=self.with_spark)
        rules = report.get("rules", [])
        skipped = [f"{r['rule']} {r['target']}: {r['skipped']}" for r in rules if r.get("skipped")]
        self.log.info("maintenance of %s: %s %s by %d rules; skipped: %s", self.pipeline,
                      "would delete" if report.get("dry_run") else "deleted",
                      sum(r.get("deleted", 0) for r in rules), len(rules), skipped or "none")
        return report

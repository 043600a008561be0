"""Failure callbacks: tell the operator on call what failed, whether Airflow retries it, and what
checkpoint_lib does about it (most failures heal themselves at the next run)."""

from __future__ import annotations

import logging
from typing import Any, Mapping

log = logging.getLogger("checkpoint_lib.airflow")

HINTS: Mapping[str, str] = {
    "source": "the next run of this stage resumes, or recovers the whole pipeline from the latest completed "
              "checkpoint if this process died; nothing is lost or duplicated",
    "keyed": "the next run of this stage resumes, or recovers the whole pipeline from the latest completed "
             "checkpoint if this process died; nothing is lost or duplicated",
    "trigger": "no checkpoint was requested; the next scheduled snapshot asks again",
    "wait_for_acks": "the checkpoint did not complete in time or was declined: the abort task records it, and "
                     "the next checkpoint covers its data",
    "commit": "commits are idempotent (stamped per checkpoint): a retry, or the next recovery, finishes it",
    "abort": "the checkpoint stays pending until it expires or a recovery aborts it",
    "recover": "the pipeline stays fenced at the new epoch; run the recover DAG again (recovery is idempotent)",
    "validate_restore": "the restore is recorded as failed in the validations table; see the Data Docs",
    "validate_params": "nothing was touched: fix the parameters and trigger again",
}


def failure_summary(dag_id: str, task_id: str, try_number: int, max_tries: int, error: BaseException | None) -> str:
    """One readable line: what failed, whether it will be retried, what happens next. Pure."""
    retry = "will be retried" if try_number <= max_tries else "no retries left"
    hint = HINTS.get(task_id, "see the task log above")
    what = f"{type(error).__name__}: {error}" if error is not None else "failed"
    return f"checkpoint_lib: {dag_id}.{task_id} try {try_number} ({retry}): {what}. Next: {hint}."


def log_failure(context: Mapping[str, Any]) -> None:
    """``on_failure_callback`` / ``on_retry_callback`` of every checkpoint_lib task."""
    ti = context.get("ti") or context.get("task_instance")
    if ti is None:
        return
    log.error(failure_summary(ti.dag_id, ti.task_id, int(getattr(ti, "try_number", 1) or 1),
                              int(getattr(ti, "max_tries", 0) or 0), context.get("exception")))

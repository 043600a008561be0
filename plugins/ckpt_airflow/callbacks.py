"""Failure notifications: tell the operator on call what failed, whether Airflow retries it, and
what checkpoint_lib does about it (most failures heal themselves at the next run).

:class:`FailureNotifier` is an Airflow notifier (``BaseNotifier``): it logs that line, then hands
the task's context, with the line under ``checkpoint_lib_summary``, to the notifiers it was given
(Slack, e-mail, PagerDuty: any ``BaseNotifier`` or callable). The DAG factory builds one per
pipeline from the ``notifiers`` setting (``"module:attr"`` names); :data:`log_failure` is the one
with none.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Callable, Mapping, Sequence

from airflow.sdk import BaseNotifier

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


class FailureNotifier(BaseNotifier):
    """``on_failure_callback`` / ``on_retry_callback`` of every checkpoint_lib task."""

    def __init__(self, then: Sequence[Callable[[Mapping[str, Any]], Any]] = ()):
        super().__init__()
        self.then = list(then)

    def notify(self, context: Mapping[str, Any]) -> None:
        ti = context.get("ti") or context.get("task_instance")
        if ti is None:
            return
        line = failure_summary(ti.dag_id, ti.task_id, int(getattr(ti, "try_number", 1) or 1),
                               int(getattr(ti, "max_tries", 0) or 0), context.get("exception"))
        log.error(line)
        for notifier in self.then:
            notifier({**context, "checkpoint_lib_summary": line})


def resolve_notifier(name: str) -> Callable[[Mapping[str, Any]], Any]:
    """``"module:attr"``: a notifier instance or callable, or a class built with no arguments."""
    module, _, attr = name.partition(":")
    if not module or not attr:
        raise ValueError(f"notifier {name!r}: expected 'module:attr'")
    found = getattr(importlib.import_module(module), attr)
    return found() if isinstance(found, type) else found


log_failure = FailureNotifier()
"""The failure notifier with no further notifiers: the line in the task log."""

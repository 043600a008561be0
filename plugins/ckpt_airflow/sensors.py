"""``CheckpointAcksSensor``: wait for every ack of a requested checkpoint, deferrably.

``deferrable=True`` (the default) frees the worker slot: the wait happens in the triggerer
(:class:`~ckpt_airflow.triggers.CheckpointAcksTrigger`). Succeeds with the checkpoint id when
it completed; fails (no retry: a new request is the next scheduled run's job) when it was
aborted or declined, or when ``ack_timeout`` seconds passed first, so that the abort phase runs.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Sequence

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException

from checkpoint_lib.core.types import CheckpointStatus
from ckpt_airflow.hooks import CheckpointHook
from ckpt_airflow.triggers import CheckpointAcksTrigger


class CheckpointAcksSensor(BaseSensorOperator):
    """:param request_id: the trigger task's request (templated: ``{{ ti.xcom_pull(...) }}``)
    :param ack_timeout: seconds from the first poke until the checkpoint counts as expired
    """

    template_fields: Sequence[str] = ("pipeline", "request_id")

    def __init__(self, *, pipeline: str, request_id: str, ack_timeout: float = 600.0, warehouse: str | None = None,
                 ckpt_conn_id: str | None = None, deferrable: bool = True, poke_interval: float = 5.0,
                 **kwargs: Any):
        super().__init__(poke_interval=poke_interval, timeout=ack_timeout + 60, mode="reschedule" if not deferrable
                         else "poke", **kwargs)
        self.pipeline, self.request_id, self.ack_timeout = pipeline, request_id, ack_timeout
        self.warehouse, self.ckpt_conn_id, self.deferrable = warehouse, ckpt_conn_id, deferrable

    def _hook(self) -> CheckpointHook:
        return CheckpointHook(self.pipeline, warehouse=self.warehouse, ckpt_conn_id=self.ckpt_conn_id)

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        hook = self._hook()
        progress = hook.progress(request_id=self.request_id)
        if progress.done:
            return self.execute_complete(context, {"event": "done", **progress.to_dict()})
        self.defer(
            trigger=CheckpointAcksTrigger(
                warehouse=hook.warehouse, pipeline=self.pipeline, request_id=self.request_id,
                deadline=time.time() + self.ack_timeout, poll_interval=self.poke_interval,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.ack_timeout + 60),
        )

    def poke(self, context: Any) -> bool:
        progress = self._hook().progress(request_id=self.request_id)
        if not progress.done:
            self.log.info("checkpoint %s: %s", progress.checkpoint_id, progress.status)
            return False
        self.execute_complete(context, {"event": "done", **progress.to_dict()})
        return True

    def execute_complete(self, context: Any, event: dict[str, Any]) -> int:
        """Resumed from the trigger: the checkpoint id on completion, else a clear failure."""
        cid, status = event.get("checkpoint_id"), event.get("status")
        acks = f"{event.get('acks_received')}/{event.get('acks_expected') or '?'} acks"
        if event.get("event") == "timeout":
            raise AirflowFailException(
                f"checkpoint {cid or '(never triggered: no source step ran)'} of {self.pipeline} did not complete "
                f"within {self.ack_timeout:.0f} s (status {status}, {acks}): aborting it"
            )
        if status == CheckpointStatus.COMPLETED:
            self.log.info("checkpoint %s of %s completed (%s)", cid, self.pipeline, acks)
            return int(cid)
        raise AirflowFailException(
            f"checkpoint {cid} of {self.pipeline} was {status}"
            f" ({event.get('failure_reason') or ''} {event.get('message') or ''}".rstrip() + ")"
        )

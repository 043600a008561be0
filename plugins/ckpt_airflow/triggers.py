"""``CheckpointAcksTrigger``: waits in the triggerer until a requested checkpoint is decided.

It polls the checkpoint store (delta-rs, off the event loop) every ``poll_interval`` seconds and
fires exactly one event, a :class:`~checkpoint_lib.control.CheckpointProgress` as a dict plus
``event``: ``"done"`` (status completed, aborted, discarded or cancelled) or ``"timeout"`` (the
deadline passed first). Everything it needs is in its constructor arguments, which
:meth:`serialize` returns unchanged (a round-trip test keeps the two in step).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

CLASSPATH = "ckpt_airflow.triggers.CheckpointAcksTrigger"


class CheckpointAcksTrigger(BaseTrigger):
    """Wait for all acks of the checkpoint that answers ``request_id`` (or of ``checkpoint_id``).

    :param warehouse: absolute warehouse root (resolved by the sensor, never in the triggerer)
    :param pipeline: pipeline name
    :param request_id: the request (from the trigger-checkpoint task); or give ``checkpoint_id``
    :param checkpoint_id: a checkpoint id to wait for instead of a request
    :param deadline: Unix time after which the trigger fires ``timeout``
    :param poll_interval: seconds between reads of the store
    """

    def __init__(
        self,
        warehouse: str,
        pipeline: str,
        deadline: float,
        request_id: str | None = None,
        checkpoint_id: int | None = None,
        poll_interval: float = 5.0,
    ):
        super().__init__()
        if (request_id is None) == (checkpoint_id is None):
            raise ValueError("give exactly one of request_id and checkpoint_id")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval}")
        self.warehouse = warehouse
        self.pipeline = pipeline
        self.deadline = float(deadline)
        self.request_id = request_id
        self.checkpoint_id = checkpoint_id
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {
            "warehouse": self.warehouse,
            "pipeline": self.pipeline,
            "deadline": self.deadline,
            "request_id": self.request_id,
            "checkpoint_id": self.checkpoint_id,
            "poll_interval": self.poll_interval,
        }

    def _hook(self):
        from ckpt_airflow.hooks import CheckpointHook

        return CheckpointHook(self.pipeline, warehouse=self.warehouse)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self._hook()
        last = None
        while True:
            progress = await hook.aprogress(request_id=self.request_id, checkpoint_id=self.checkpoint_id)
            if progress.done:
                yield TriggerEvent({"event": "done", **progress.to_dict()})
                return
            if progress != last:
                self.log.info("checkpoint %s: %s, %s/%s acks", progress.checkpoint_id or "(not yet triggered)",
                              progress.status, progress.acks_received, progress.acks_expected or "?")
                last = progress
            if time.time() >= self.deadline:
                yield TriggerEvent({"event": "timeout", **progress.to_dict()})
                return
            await asyncio.sleep(min(self.poll_interval, max(0.0, self.deadline - time.time()) + 0.01))

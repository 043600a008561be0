"""Runtime control of a pipeline from outside its processes: what an orchestrator (Airflow) calls.

A running pipeline is a set of stage processes that coordinate through the checkpoint store
(``<warehouse>/_checkpoints/<pipeline>``). This module lets a scheduler steer it without being one
of those processes, and without a JVM unless a sink commit actually has work to do:

- **request a checkpoint** (:meth:`PipelineControl.request_checkpoint`): a durable request file the
  next source-stage step honours as a forced trigger (it writes the checkpoint id it became). The
  request is admitted or postponed by the core's pure policy (:func:`checkpoint_lib.core.decider.decide`)
  with the caller's min pause and max concurrent checkpoints.
- **watch it** (:meth:`PipelineControl.progress`): request -> checkpoint id -> status and acks.
- **commit it** (:meth:`PipelineControl.commit`): re-commit the pre-committed sink transactions a
  completed checkpoint owns. Normally the stage process that wrote the last ack has committed
  already; then this is a no-op read through delta-rs. Refused (:class:`FencedError`) when the
  checkpoint belongs to a fenced (zombie) epoch: the recovery that fenced it owns its sinks.
- **abort it** (:meth:`PipelineControl.abort`): cancel a request nobody honoured yet, or write the
  ``aborted`` row of a pending checkpoint with a reason (a completed checkpoint is never aborted).
- **pause / unpause** (:meth:`PipelineControl.pause`): a pipeline-level flag that orchestrator
  tasks honour (a recovery owns the pipeline while it holds the flag).

>>> control = PipelineControl("/data/warehouse", "payments")
>>> outcome = control.request_checkpoint("scheduled__2026-01-01T00:00:00", min_pause=60)
>>> control.progress(request_id=outcome.request.request_id).status    # 'requested' until honoured
>>> control.commit(7)                                                   # no-op if already committed

Requests on disk (``<root>/requests/``), crash-safe without locks:
``<id>.request`` and ``<id>.outcome`` are each created complete-or-not-at-all with
``link(tmp, final)``, which fails if the name exists. So a request is written once, and exactly one
of "honoured as checkpoint c" (the source stage) and "cancelled" (an abort) wins a race. Request ids
are orchestrator run ids, so a retried task finds its own request instead of making a second one.
Local filesystems only (like :class:`~checkpoint_lib.delta.reservations.LocalReservations`).

Every name and id that reaches a path is validated first (:func:`validate_pipeline_name`,
:func:`parse_checkpoint_id`, :func:`validate_request_id`): nothing here reads or writes outside
``<warehouse>/_checkpoints/<pipeline>`` and the pipeline's own tables.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checkpoint_requests import (
    REQUEST_ID,
    REQUEST_KINDS,
    CheckpointRequests,
    Request,
    has_open_requests,
    honour_requests,
    validate_request_id,
)
from .commit_phase import CommitOutcome, CommitPhase
from .core.decider import CheckpointConfig, Verdict, decide
from .core.errors import CheckpointError, FailureReason, UnknownCheckpointError
from .core.types import CheckpointStatus
from .files import fsync_dir, read_json, write_once
from .layout import check_pipeline_name as validate_pipeline_name
from .layout import checkpoint_root, parse_checkpoint_id, pause_flag, warehouse_location

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .delta.store import DeltaCheckpointStore
    from .pipeline import Pipeline

__all__ = [
    "AbortOutcome", "CheckpointProgress", "CheckpointRequests", "CommitOutcome", "CommitPhase", "PipelineControl",
    "REQUEST_ID", "REQUEST_KINDS", "Request", "RequestOutcome", "has_open_requests", "honour_requests",
    "parse_checkpoint_id", "validate_pipeline_name", "validate_request_id",
]

DONE_STATUSES = frozenset({
    CheckpointStatus.COMPLETED, CheckpointStatus.ABORTED, CheckpointStatus.DISCARDED, "cancelled"})


def expected_acks(pipeline: "Pipeline") -> int:
    """How many subtasks acknowledge each checkpoint: sources, operator subtasks, sink subtasks."""
    return pipeline.source_parallelism + pipeline.keyed_parallelism * (1 + len(pipeline.sinks))


def expected_graph_acks(graph: Any) -> int:
    """How many subtasks of a dataflow graph acknowledge each checkpoint: every vertex's subtasks
    and every sink's (a sink's subtasks are its vertex's)."""
    parallelism = {v.id: v.parallelism for v in graph.vertices}
    return sum(parallelism.values()) + sum(parallelism[s.vertex] for s in graph.sinks)


# --- outcomes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestOutcome:
    """``request`` when admitted; otherwise ``postponed`` says why (a :class:`FailureReason` value)."""

    request: Request | None
    created: bool = False
    postponed: str | None = None
    not_before: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"request": self.request.to_dict() if self.request else None, "created": self.created,
                "postponed": self.postponed, "not_before": self.not_before}


@dataclass(frozen=True)
class CheckpointProgress:
    """Where a requested checkpoint stands, for a sensor: JSON-able through :meth:`to_dict`."""

    status: str
    """'requested' (no source step honoured it yet), 'pending', 'completed', 'aborted',
    'discarded', 'cancelled', or 'unknown' (honoured, but its pending row is not written yet)."""
    checkpoint_id: int | None = None
    request_id: str | None = None
    epoch: int | None = None
    acks_received: int = 0
    acks_expected: int | None = None
    failure_reason: str | None = None
    message: str | None = None

    @property
    def done(self) -> bool:
        return self.status in DONE_STATUSES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AbortOutcome:
    aborted: bool
    status: str
    """The checkpoint's (or the request's) status after the call."""
    checkpoint_id: int | None = None
    request_id: str | None = None
    message: str = ""


# --- the control API ---------------------------------------------------------------------------


class PipelineControl:
    """Control of one pipeline's checkpoints from outside its stage processes.

    ``warehouse``: the warehouse root; ``pipeline``: a registered pipeline name. The constructor
    validates names and does no I/O; the store is opened on first use (a reader: retention is the
    writers' business).
    """

    def __init__(self, warehouse: str | os.PathLike[str], pipeline: str, *, store: "DeltaCheckpointStore | None" = None):
        self.warehouse = warehouse_location(warehouse)
        self.pipeline_name = validate_pipeline_name(pipeline)
        self.root = checkpoint_root(self.warehouse, pipeline)
        self.requests = CheckpointRequests(self.root)
        self._store = store

    def __repr__(self) -> str:
        return f"PipelineControl({self.warehouse!r}, {self.pipeline_name!r})"

    @property
    def store(self) -> "DeltaCheckpointStore":
        if self._store is None:
            from .delta.store import DeltaCheckpointStore

            self._store = DeltaCheckpointStore.open(self.root)
        return self._store

    def pipeline(self) -> "Pipeline":
        from .pipelines import get

        return get(self.pipeline_name)

    # --- requesting a checkpoint -----------------------------------------------------------------

    def source_running(self) -> bool:
        """Whether a session of the current epoch that plans source steps started and has not
        ended (:meth:`stepping_stages`): a running pipeline (or one whose process died, which only
        a recovery can tell apart)."""
        from .delta.sessions import END, START

        stages = self.stepping_stages()
        epoch = self.store.epochs.current()
        events: dict[tuple[str, int], set[str]] = {}
        for r in self.store.sessions.of_epoch(epoch):
            if r["stage"] in stages:
                events.setdefault((r["stage"], r["session"]), set()).add(r["event"])
        return any(START in ev and END not in ev for ev in events.values())

    def stepping_stages(self) -> set[str]:
        """The session stages whose processes plan source steps (and so answer requests): the
        process group holding the sources in each layout the pipeline runs in
        (:func:`checkpoint_lib.graph.plan`): ``all`` (one process), then a linear pipeline's
        ``source`` stage (it is its lowered graph) or a graph's per-vertex sources' group."""
        from .graph import Layout, from_pipeline, plan
        from .pipelines import declared, is_graph

        found = declared(self.pipeline_name)
        graph, other = (found, Layout.PER_VERTEX) if is_graph(found) else (from_pipeline(found), Layout.STAGES)
        return {g.name for layout in (Layout.CHAINED, other) for g in plan(graph, layout).groups if g.plans_steps}

    def savepoint_from_running(
        self, request_id: str, *, timeout: float, poll: float = 0.5, requested_by: str = "",
    ) -> tuple[int | None, str]:
        """Ask the running pipeline's next source step for a savepoint (Flink's ``savepoint`` on a
        running job: nothing stops, nothing is replayed) and wait up to ``timeout`` seconds for a
        step to take it, then as long again for it to complete. Returns ``(savepoint id, state)``:
        ``completed``, ``injected`` (taken, not complete yet: the keyed stage completes it when it
        runs), or ``(None, "unanswered")`` when no step took it (the process is gone, not merely
        slow: the request is cancelled, race-free against a late honour, and the caller takes the
        savepoint itself). Raises :class:`CheckpointError` if the savepoint was aborted."""
        request, _ = self.requests.create(request_id, requested_by, kind="savepoint")
        deadline = time.monotonic() + timeout
        while request.state == "requested" and time.monotonic() < deadline:
            time.sleep(poll)
            request = self.requests.get(request_id) or request
        if request.state == "requested":
            request = self.requests.cancel(request_id, f"no source step took it within {timeout:g} s")
        if request.state == "cancelled":
            return None, "unanswered"
        checkpoint_id = int(request.checkpoint_id)  # type: ignore[arg-type]
        deadline = time.monotonic() + timeout
        while True:
            row = self.store.checkpoints.status(checkpoint_id)
            status = None if row is None else row["status"]
            if status == CheckpointStatus.COMPLETED:
                return checkpoint_id, CheckpointStatus.COMPLETED
            if status in (CheckpointStatus.ABORTED, CheckpointStatus.DISCARDED):
                raise CheckpointError(f"savepoint {checkpoint_id} was {status}: {row.get('message') or ''}".rstrip(": "))
            if time.monotonic() >= deadline:
                return checkpoint_id, "injected"
            time.sleep(poll)

    def request_checkpoint(
        self,
        request_id: str,
        *,
        min_pause: float = 0.0,
        max_concurrent: int = 1,
        requested_by: str = "",
        now: float | None = None,
    ) -> RequestOutcome:
        """Ask the next source step for a checkpoint, if the policy admits one now.

        Idempotent per ``request_id``: a retry returns the existing request whatever the policy
        says now. Otherwise the core's decider is asked with ``min_pause`` (seconds since the last
        checkpoint of the pipeline ended, whoever triggered it) and ``max_concurrent`` (requests
        waiting for a barrier). A checkpoint in flight does not postpone a request: the request
        waits behind it and the next source step's barrier answers it, as Flink queues a trigger
        request while its maximum of concurrent checkpoints is in flight (a run that ends every
        run with a checkpoint, as the run DAG's does, would otherwise starve the snapshot DAG).
        Postponed: nothing is written.
        """
        validate_request_id(request_id)
        existing = self.requests.get(request_id)
        if existing is not None:
            return RequestOutcome(existing, created=False)
        when = time.time() if now is None else now
        config = CheckpointConfig(interval=0.0, min_pause=min_pause, max_concurrent=max_concurrent)
        decision = decide(
            config, when, forced=False, all_tasks_running=True, pending_periodic=len(self.requests.open()),
            last_trigger_time=None, last_completion_time=self._last_end(),
        )
        if decision.verdict is not Verdict.EXECUTE:
            reason = decision.reason.value if decision.reason else "postponed"
            return RequestOutcome(None, postponed=reason, not_before=decision.not_before)
        request, created = self.requests.create(request_id, requested_by, now=when)
        return RequestOutcome(request, created=created)

    def _last_end(self) -> float | None:
        """When the pipeline's last checkpoint ended (completed or aborted), None before any."""
        ends = [r["completion_time"] or r["recorded_at"] for r in self.store.checkpoints.history()
                if r["status"] in (CheckpointStatus.COMPLETED, CheckpointStatus.ABORTED)]
        return max(ends, default=None)

    # --- watching one ---------------------------------------------------------------------------

    def progress(self, *, request_id: str | None = None, checkpoint_id: int | None = None) -> CheckpointProgress:
        """Status and acks of a checkpoint, by the request that asked for it or by its id."""
        if (request_id is None) == (checkpoint_id is None):
            raise ValueError("give exactly one of request_id and checkpoint_id")
        if request_id is not None:
            request = self.requests.get(request_id)
            if request is None:
                raise UnknownCheckpointError(f"no checkpoint request {request_id!r} for {self.pipeline_name}")
            if request.cancelled is not None:
                return CheckpointProgress("cancelled", request_id=request_id, message=request.cancelled)
            if request.checkpoint_id is None:
                return CheckpointProgress("requested", request_id=request_id)
            checkpoint_id = request.checkpoint_id
        cid = parse_checkpoint_id(checkpoint_id)
        assert cid is not None
        row = self.store.checkpoints.status(cid)
        expected = self._expected_acks()
        if row is None:
            return CheckpointProgress("unknown", cid, request_id, acks_expected=expected)
        received = expected if row["status"] in (CheckpointStatus.COMPLETED, CheckpointStatus.DISCARDED) else 0
        if row["status"] == CheckpointStatus.PENDING:
            received = len(self.store.acks.pending(cid, row["epoch"]))
        return CheckpointProgress(
            row["status"], cid, request_id, row["epoch"], received, expected,
            row["failure_reason"], row["message"],
        )

    def _expected_acks(self) -> int | None:
        from .pipelines import declared, is_graph

        try:
            found = declared(self.pipeline_name)
            return expected_graph_acks(found) if is_graph(found) else expected_acks(found)
        except Exception:  # informative only: the store's status decides completion
            return None

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The store's history (newest first) with ``duration_ms``; JSON-able."""
        from .history import with_durations

        rows = self.store.checkpoints.history()
        return with_durations(rows[:limit] if limit else rows)

    def acks(self, checkpoint_id: Any) -> list[dict[str, Any]]:
        """Per-subtask acks of a completed checkpoint, or the acks recorded so far of a pending one."""
        cid = parse_checkpoint_id(checkpoint_id)
        if cid is None:
            latest = self.store.checkpoints.latest()
            if latest is None:
                raise UnknownCheckpointError(f"{self.pipeline_name} has no completed checkpoint")
            cid = latest.checkpoint_id
        row = self.store.checkpoints.status(cid)
        if row is None:
            raise UnknownCheckpointError(f"checkpoint {cid} of {self.pipeline_name} does not exist")
        if row["status"] != CheckpointStatus.PENDING:
            return self.store.checkpoints.acks(cid)
        out = []
        for subtask, (ack, when) in sorted(self.store.acks.pending(cid, row["epoch"]).items()):
            out.append({"subtask": str(subtask), "operator": subtask.operator, "index": subtask.index,
                        **asdict(ack), "state": dict(ack.state), "ack_time": when})
        return out

    def resolve_checkpoint(self, checkpoint_id: Any) -> int | None:
        """A user-given id checked against the retained completed checkpoints: the id, or None for
        'latest' (None when there is none either). ``UnknownCheckpointError`` for an id that is not
        retained; ``ValueError`` for malformed input (:func:`parse_checkpoint_id`)."""
        cid = parse_checkpoint_id(checkpoint_id)
        if cid is None:
            return None
        self.store.checkpoints.get(cid)  # raises UnknownCheckpointError listing the retained ids
        return cid

    # --- committing -------------------------------------------------------------------------------

    def commit(self, checkpoint_id: Any, spark: "SparkSession | None" = None) -> CommitOutcome:
        """Commit phase of a completed checkpoint (:meth:`CommitPhase.commit`)."""
        return self.commit_phase.commit(checkpoint_id, spark)

    def all_committed(self, checkpoint_id: int | str) -> bool:
        """Whether its sink transactions all committed (:meth:`CommitPhase.all_committed`)."""
        return self.commit_phase.all_committed(checkpoint_id)

    @property
    def commit_phase(self) -> CommitPhase:
        return CommitPhase(self.store, self.pipeline_name, self.warehouse, self.root)

    # --- aborting ---------------------------------------------------------------------------------

    def abort(
        self,
        *,
        checkpoint_id: Any = None,
        request_id: str | None = None,
        reason: FailureReason | str = FailureReason.USER_ABORT,
        message: str = "",
    ) -> AbortOutcome:
        """Abort phase: cancel the request if no source step honoured it yet, else write the
        ``aborted`` row of its (pending) checkpoint with ``reason`` and ``message``.

        Never aborts a completed checkpoint (completion is durable and recovery may use it): then
        ``aborted`` is False and ``status`` says 'completed'. Already aborted: a no-op.
        """
        reason = FailureReason(reason)
        if (request_id is None) == (checkpoint_id is None):
            raise ValueError("give exactly one of request_id and checkpoint_id")
        if request_id is not None:
            request = self.requests.cancel(request_id, f"{reason.value}: {message}".rstrip(": "))
            if request.state == "cancelled":
                return AbortOutcome(True, "cancelled", None, request_id, request.cancelled or "")
            checkpoint_id = request.checkpoint_id
        cid = parse_checkpoint_id(checkpoint_id)
        if cid is None:
            raise ValueError("abort needs a checkpoint id")
        row = self.store.checkpoints.status(cid)
        epoch = int(row["epoch"]) if row is not None else self.store.epochs.current()
        try:
            self.store.checkpoints.record_aborted(cid, reason, message, epoch)
        except ValueError:  # completed (or discarded) first: that wins
            status = (self.store.checkpoints.status(cid) or {}).get("status", "unknown")
            return AbortOutcome(False, status, cid, request_id, f"checkpoint {cid} is {status}: not aborted")
        return AbortOutcome(True, CheckpointStatus.ABORTED, cid, request_id, message)

    # --- pausing ----------------------------------------------------------------------------------

    @property
    def _pause_path(self) -> Path:
        return pause_flag(self.root)

    def paused(self) -> dict[str, Any] | None:
        """The pause flag (``by``, ``reason``, ``since``), or None when the pipeline runs freely."""
        return read_json(self._pause_path)

    def pause(self, by: str, reason: str) -> bool:
        """Take the pipeline's pause flag for ``by`` (e.g. a recovery run id). True if taken (or
        already held by ``by``); False if someone else holds it."""
        if write_once(self._pause_path, {"by": by, "reason": reason, "since": time.time()}):
            return True
        return (self.paused() or {}).get("by") == by

    def unpause(self, by: str, *, force: bool = False) -> bool:
        """Release the flag if ``by`` holds it (or ``force``). Idempotent; True if it is now free."""
        current = self.paused()
        if current is None:
            return True
        if current.get("by") != by and not force:
            return False
        self._pause_path.unlink(missing_ok=True)
        fsync_dir(self._pause_path.parent)
        return True

"""The "checkpoint now" request files of a pipeline (``<warehouse>/_checkpoints/<p>/requests``):
written by whoever asks (the snapshot DAG, ``ckpt savepoint``, the REST plugin) and answered by the
running pipeline's next source step. Each file is written once, whole (a ``link`` of a fsynced
temporary file on a filesystem, a conditional put on an object store), so a request and its outcome
are never half-written and two writers race safely: exactly one outcome (honoured or cancelled) wins.

Shared by :mod:`checkpoint_lib.control` (the asking side) and the runner (the answering side),
so neither imports the other. Pure standard library (files through :mod:`checkpoint_lib.files`, on
a local warehouse or an object store alike).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from .core.coordinator import FailJob, TriggerCheckpoint
from .core.errors import UnknownCheckpointError
from .core.types import CheckpointKind
from .files import files_at
from .layout import requests_folder
from .objectstore import ObjectUri

REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,199}$")


def validate_request_id(request_id: Any) -> str:
    """A request id safe as a file name: 1-200 of ``A-Z a-z 0-9 _ . : + -``, no ``..``."""
    if not isinstance(request_id, str) or not REQUEST_ID.match(request_id) or ".." in request_id:
        raise ValueError(f"request id {str(request_id)[:80]!r} must be 1-200 of A-Z a-z 0-9 _ . : + - (no '..')")
    return request_id


@dataclass(frozen=True)
class Request:
    """A durable "checkpoint now" request and, once decided, what became of it."""

    request_id: str
    requested_at: float
    requested_by: str = ""
    checkpoint_id: int | None = None
    """The checkpoint that honoured it (set by the source stage)."""
    epoch: int | None = None
    honoured_at: float | None = None
    cancelled: str | None = None
    """Why it was cancelled before any source step honoured it."""
    kind: str = "checkpoint"
    """``checkpoint``, or ``savepoint`` (``ckpt savepoint`` on a running pipeline): answered by a
    savepoint, which also answers every checkpoint request waiting with it."""

    @property
    def state(self) -> str:
        """'requested', 'honoured' or 'cancelled'."""
        if self.cancelled is not None:
            return "cancelled"
        return "requested" if self.checkpoint_id is None else "honoured"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "state": self.state}


REQUEST_KINDS = ("checkpoint", "savepoint")


class CheckpointRequests:
    """The request files of one pipeline (``<root>/requests``), on a local warehouse or an object
    store. No I/O in the constructor."""

    def __init__(self, root: str | os.PathLike[str]):
        self.directory = requests_folder(root)
        self._files = files_at(self.directory)

    def _paths(self, request_id: str) -> tuple[Path | ObjectUri, Path | ObjectUri]:
        rid = validate_request_id(request_id)
        return self.directory / f"{rid}.request", self.directory / f"{rid}.outcome"

    def create(self, request_id: str, requested_by: str = "", now: float | None = None,
               kind: str = "checkpoint") -> tuple[Request, bool]:
        """Write the request (idempotent: an existing one is returned). True if this call made it."""
        if kind not in REQUEST_KINDS:
            raise ValueError(f"a request asks for one of {REQUEST_KINDS}, not {kind!r}")
        req, _ = self._paths(request_id)
        when = time.time() if now is None else now
        made = self._files.write_once(req, {"request_id": request_id, "requested_at": when,
                                            "requested_by": requested_by, "kind": kind})
        request = self.get(request_id)
        assert request is not None
        return request, made

    def get(self, request_id: str) -> Request | None:
        """The request with its outcome, or None if it was never made."""
        req, out = self._paths(request_id)
        doc = self._files.read_json(req)
        if doc is None:
            return None
        outcome = self._files.read_json(out) or {}
        return Request(
            request_id=doc["request_id"], requested_at=float(doc["requested_at"]),
            requested_by=doc.get("requested_by", ""), checkpoint_id=outcome.get("checkpoint_id"),
            epoch=outcome.get("epoch"), honoured_at=outcome.get("honoured_at"),
            cancelled=outcome.get("cancelled"), kind=doc.get("kind", "checkpoint"),
        )

    def all(self) -> list[Request]:
        """Every request, oldest first."""
        ids = [n[: -len(".request")] for n in self._files.names(self.directory) if n.endswith(".request")]
        requests = [r for r in (self.get(i) for i in ids if REQUEST_ID.match(i)) if r is not None]
        return sorted(requests, key=lambda r: (r.requested_at, r.request_id))

    def open(self) -> list[Request]:
        """Requests no source step honoured and nobody cancelled yet, oldest first. One directory
        listing; only the open requests' files are read (the source stage calls this every step)."""
        names = set(self._files.names(self.directory))
        ids = [n[: -len(".request")] for n in names if n.endswith(".request")]
        waiting = [i for i in ids if f"{i}.outcome" not in names and REQUEST_ID.match(i)]
        requests = [r for r in (self.get(i) for i in waiting) if r is not None and r.state == "requested"]
        return sorted(requests, key=lambda r: (r.requested_at, r.request_id))

    def honour(self, requests: list[Request], checkpoint_id: int, epoch: int) -> list[Request]:
        """Record that ``checkpoint_id`` (triggered by a source step of ``epoch``) answers these
        requests; returns those this call decided (a request cancelled meanwhile is not)."""
        won = []
        for r in requests:
            _, out = self._paths(r.request_id)
            doc = {"checkpoint_id": int(checkpoint_id), "epoch": int(epoch), "honoured_at": time.time()}
            if self._files.write_once(out, doc):
                won.append(r)
        return won

    def cancel(self, request_id: str, reason: str) -> Request:
        """Cancel a request nobody honoured; returns it as it now stands (it may have been
        honoured first, then ``checkpoint_id`` is set and the caller must abort that instead)."""
        _, out = self._paths(request_id)
        if self.get(request_id) is None:
            raise UnknownCheckpointError(f"no checkpoint request {request_id!r}")
        self._files.write_once(out, {"cancelled": reason or "cancelled"})
        request = self.get(request_id)
        assert request is not None
        return request


def honour_requests(root: str | os.PathLike[str], trigger_checkpoint: Any, epoch: int) -> list[Request]:
    """For the source stage: record that the checkpoint now being triggered answers every open
    request of the pipeline at ``root``. ``trigger_checkpoint`` is its id. Returns what it honoured."""
    requests = CheckpointRequests(root)
    open_requests = requests.open()
    return requests.honour(open_requests, int(trigger_checkpoint), epoch) if open_requests else []


def has_open_requests(root: str | os.PathLike[str]) -> bool:
    """Whether a "checkpoint now" request waits for the next source step (one directory listing)."""
    return bool(CheckpointRequests(root).open())


def next_trigger(requests: CheckpointRequests, coordinator: Any, *, moved: bool, epoch: int,
                 fence: Callable[[], None], progress: Callable[[str], None]) -> tuple[list[Any], Any]:
    """The barrier a source step sends, if any, and the coordinator's other effects: the answering
    side of the requests, one definition for every runner (the linear source stage, the graph
    runner). ``moved``: the step reads something new (only then may a periodic checkpoint be
    triggered, :meth:`~checkpoint_lib.core.coordinator.CheckpointCoordinator.tick`; without, pending
    ones only expire). Returns ``(effects without the trigger, TriggerCheckpoint or None)``.

    Open requests are answered by this step's barrier: a savepoint request by a savepoint, triggered
    in place of the periodic checkpoint (so a pipeline checkpointing every step still takes it at its
    next step), which answers the checkpoint requests waiting with it too; checkpoint requests alone
    by the periodic checkpoint, else by a forced one. The requests record the checkpoint id (fenced
    first) before the barrier is written; a crash in between leaves an id that never completes,
    which the requester sees time out and aborts."""
    waiting = requests.open()
    savepoint = any(r.kind == "savepoint" for r in waiting)
    effects = coordinator.tick() if moved and not savepoint else coordinator.expire()
    trigger = next((e for e in effects if isinstance(e, TriggerCheckpoint)), None)
    effects = [e for e in effects if e is not trigger]
    if not waiting or any(isinstance(e, FailJob) for e in effects):
        return effects, trigger
    if trigger is None:
        trigger = coordinator.trigger(CheckpointKind.SAVEPOINT if savepoint else CheckpointKind.CHECKPOINT)
    fence()
    honoured = requests.honour(waiting, trigger.checkpoint_id, epoch)
    if honoured:
        progress(f"{trigger.barrier.kind.value} {trigger.checkpoint_id} answers requests "
                 f"{[r.request_id for r in honoured]}")
    return effects, trigger

"""What a validation run returns (and raises): plain data, no GX objects."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.errors import CheckpointError

RESTORE, CHECKPOINT = "restore", "checkpoint"
KINDS = (RESTORE, CHECKPOINT)


@dataclass(frozen=True)
class ExpectationOutcome:
    """One expectation on one view: what GX said, flattened for humans and the validations table."""

    view: str
    expectation: str
    target: str
    success: bool
    observed: Any = None
    unexpected_count: int | None = None
    element_count: int | None = None
    error: str | None = None
    notes: str | None = None

    def line(self) -> str:
        mark = "ok  " if self.success else "FAIL"
        bits = [f"{mark} {self.view}: {self.expectation}({self.target})"]
        if self.error:
            bits.append(f"raised {self.error}")
        if self.unexpected_count:
            of = f" of {self.element_count}" if self.element_count is not None else ""
            bits.append(f"{self.unexpected_count}{of} rows unexpected")
        elif self.observed is not None and not self.success:
            bits.append(f"observed {_short(self.observed)}")
        if not self.success and self.notes:
            bits.append(f"-- {self.notes}")
        return "; ".join(bits)


@dataclass
class QualityResult:
    """The outcome of one suite (``kind``: restore or checkpoint) on one checkpoint."""

    pipeline: str
    kind: str
    checkpoint_id: int | None
    epoch: int | None
    restored_checkpoint_id: int | None
    run_name: str
    data_docs: str
    outcomes: list[ExpectationOutcome] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    started_at: float = 0.0
    finished_at: float = 0.0
    validation_id: str = ""
    error: str | None = None
    restore_known: bool = False
    """What the validated epoch restored was read (``restored_checkpoint_id`` None then means it
    started from scratch); a restore validation that failed before that says nothing about it."""

    @property
    def success(self) -> bool:
        """True only when every expectation ran and passed (and there was at least one)."""
        return self.error is None and bool(self.outcomes) and all(o.success for o in self.outcomes)

    @property
    def failed(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if not o.success]

    def headline(self) -> str:
        what = f"{self.kind} validation of {self.pipeline} checkpoint {self.checkpoint_id}"
        if self.kind == RESTORE and self.restore_known:
            what += f" (epoch {self.epoch} restored {_restored(self.restored_checkpoint_id)})"
        if self.error:
            return f"{what}: ERROR {self.error}"
        status = "PASSED" if self.success else "FAILED"
        return f"{what}: {status} ({len(self.outcomes) - len(self.failed)}/{len(self.outcomes)} expectations)"

    def summary(self, verbose: bool = False) -> str:
        """The headline, then every failed expectation (every one with ``verbose``), notes, and
        where the Data Docs are. What ``ckpt validate`` prints and what the error carries."""
        lines = [self.headline()]
        shown = self.outcomes if verbose else self.failed
        lines += [f"  {o.line()}" for o in shown]
        lines += [f"  note: {n}" for n in self.notes]
        if self.data_docs:
            lines.append(f"  Data Docs: {self.data_docs}")
        return "\n".join(lines)

    def details_json(self) -> str:
        return json.dumps(
            {"outcomes": [asdict(o) for o in self.outcomes], "metrics": self.metrics, "notes": self.notes},
            default=str, sort_keys=True,
        )


class QualityCheckError(CheckpointError):
    """A validation could not run (missing table, unknown checkpoint...): recorded as an error."""

    def __init__(self, message: str, result: QualityResult | None = None):
        super().__init__(message)
        self.result = result


class QualityCheckFailed(QualityCheckError):
    """A validation ran and at least one expectation failed. ``str()`` is the readable summary;
    ``.result`` has every outcome."""


def _restored(cid: int | None) -> str:
    return "nothing (started from scratch)" if cid is None else f"checkpoint {cid}"


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 120 else text[:117] + "..."

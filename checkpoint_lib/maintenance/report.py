"""The time windows of maintenance (:class:`RetentionPolicy`) and what it says it did
(:class:`RuleOutcome` per rule and target, :class:`MaintenanceReport` for a run)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from ..core.retention import Needs
from ..history import format_table, human_bytes

ROWS, FILES, MARKERS, REQUESTS, RUNS = "rows", "files", "markers", "requests", "runs"
"""The units a rule counts in."""


@dataclass(frozen=True)
class RetentionPolicy:
    """The time windows of the rules (everything else is decided by what checkpoints need)."""

    request_days: float = 7.0
    """Honoured or cancelled checkpoint requests made longer ago are deleted (a retried Airflow
    task finds its own request by run id well within it)."""
    result_days: float = 7.0
    """Validation rows and GX runs that name no checkpoint (a validation that failed before it
    knew one) are deleted after this long."""
    file_retention_hours: float = 168.0
    """A file some commit removed stays this long in every table (Delta's default, 7 days): a
    reader of an older snapshot, or a writer whose files are not committed yet, may still use it."""
    pinned_margin_hours: float = 24.0
    """The state tables' VACUUM window starts this long before the commit of the oldest pinned
    version (transactions that began before that commit, clock skew between hosts)."""
    control_log_hours: float = 48.0
    """The control tables' Delta commit files are kept this long (Delta's default is 30 days, and
    every table load lists them all); nothing reads a control table's history."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 or math.isnan(value):
                raise ValueError(f"RetentionPolicy.{name} must be a number >= 0, got {value!r}")


@dataclass
class RuleOutcome:
    """What one rule did to one target (or would do, in a dry run)."""

    rule: str
    target: str
    """Relative to the warehouse."""
    unit: str
    deleted: int = 0
    kept: int | None = None
    bytes_freed: int = 0
    keeps: str = ""
    """What it keeps, and why that is all anyone needs."""
    skipped: str | None = None
    """Why the rule did nothing (it could not be sure, or had nothing to work on)."""
    retries: int = 0
    """Rewrites: how often a concurrent commit refused ours, so it read and decided again."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MaintenanceReport:
    pipeline: str
    warehouse: str
    dry_run: bool
    started_at: float
    finished_at: float | None = None
    needs: Needs | None = None
    oldest_pinned_state: dict[str, Any] = field(default_factory=dict)
    """Per state table: the oldest pinned version, its commit time and the VACUUM window (hours)."""
    bytes_before: int = 0
    bytes_after: int = 0
    rules: list[RuleOutcome] = field(default_factory=list)

    @property
    def deleted(self) -> int:
        return sum(r.deleted for r in self.rules)

    @property
    def skipped(self) -> list[RuleOutcome]:
        return [r for r in self.rules if r.skipped]

    def rule(self, rule: str, target: str | None = None) -> RuleOutcome:
        """The outcome of ``rule`` (on ``target``: a path relative to the warehouse)."""
        for r in self.rules:
            if r.rule == rule and (target is None or r.target == target):
                return r
        raise KeyError(f"no outcome of rule {rule!r}{'' if target is None else f' on {target!r}'}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline, "warehouse": self.warehouse, "dry_run": self.dry_run,
            "started_at": self.started_at, "finished_at": self.finished_at,
            "needs": None if self.needs is None else self.needs.to_dict(),
            "oldest_pinned_state": self.oldest_pinned_state, "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after, "rules": [r.to_dict() for r in self.rules],
        }

    def describe(self) -> str:
        """A readable summary: what the checkpoints need, then one line per rule."""
        n = self.needs
        verb = "would delete" if self.dry_run else "deleted"
        lines = [f"maintenance of {self.pipeline} in {self.warehouse}" + (" (DRY RUN: nothing deleted)" if self.dry_run else "")]
        if n is not None:
            lines.append(
                f"retained {_ids(n.retained)} (savepoints {_ids(n.savepoints)}), pending {_ids(n.pending)}, "
                f"unreadable {_ids(n.corrupt)}, restored by the newest restore: {n.restored}, owed rollback: "
                f"{n.owed_rollback}, largest id {n.max_id}; ids below {n.floor} that none of these need are dropped"
            )
        for table, pin in sorted(self.oldest_pinned_state.items()):
            lines.append(f"state {table}: {pin.get('note', '')}")
        rows = [{"rule": r.rule, "target": r.target, verb: r.deleted, "kept": r.kept, "unit": r.unit,
                 "freed": human_bytes(r.bytes_freed) if r.bytes_freed else "",
                 "note": r.skipped and f"SKIPPED: {r.skipped}" or r.keeps} for r in self.rules]
        lines.append(format_table(rows, ["rule", "target", verb, "kept", "unit", "freed", "note"]))
        lines.append(f"pipeline directories: {human_bytes(self.bytes_before)} before, {human_bytes(self.bytes_after)} after")
        return "\n".join(lines)


def _ids(values: Sequence[int]) -> str:
    values = list(values)
    if len(values) > 8:
        return f"[{values[0]}..{values[-1]}] ({len(values)})"
    return str(values)

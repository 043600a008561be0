"""What every rule of one maintenance run shares (:class:`Context`: the store, the files, the
windows, the report) and reads first (:func:`read_needs`), and small helpers on paths."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..core.retention import Needs, Retention
from ..files import Files, Location, files_at
from ..layout import below
from ..objectstore import is_remote
from .report import MaintenanceReport, RetentionPolicy, RuleOutcome

if TYPE_CHECKING:
    from ..delta.store import DeltaCheckpointStore

log = logging.getLogger(__name__)


def read_needs(store: "DeltaCheckpointStore", view: Any = None, sessions: Sequence[Mapping[str, Any]] | None = None,
               *, from_sessions: Needs | None = None) -> Needs:
    """What the checkpoints of ``store`` need, from ``view`` (a
    :class:`~checkpoint_lib.delta.checkpoint_table.CheckpointsView`; default: a fresh read) and the
    ``sessions`` rows (default: a fresh read; or the restores copied ``from_sessions``)."""
    restores = from_sessions.restores if from_sessions is not None else store.sessions.restores(sessions)
    return store.checkpoints.needs(restores, view)


@dataclass
class Context:
    """One maintenance run, as every rule sees it."""

    store: "DeltaCheckpointStore"
    files: Files
    """The files of the checkpoint root (local, or on the object store); ``quality`` is always local."""
    warehouse: Location
    root: Location
    quality: Path
    policy: RetentionPolicy
    now: float
    wall: float
    dry_run: bool
    report: MaintenanceReport

    @property
    def needs(self) -> Needs:
        assert self.report.needs is not None
        return self.report.needs

    def retention(self) -> Retention:
        """What a pruned store is told (a new one per decision: it reads the latest checkpoints
        when a store first asks; the restores are those read as the run began)."""
        checkpoints = self.store.checkpoints

        def latest() -> tuple[Needs, Mapping[int, str]]:
            view = checkpoints.table.view()
            return checkpoints.needs(self.needs.restores, view), view.statuses

        return Retention(self.needs.restores, latest, now=self.now, result_days=self.policy.result_days)

    def add(self, outcome: RuleOutcome) -> RuleOutcome:
        self.report.rules.append(outcome)
        if outcome.skipped:
            log.info("maintenance %s on %s skipped: %s", outcome.rule, outcome.target, outcome.skipped)
        return outcome

    def rel(self, path: Location | str) -> str:
        return rel(path, self.warehouse)

    def hours_back_to(self, cutoff: float) -> float:
        """The retention of a VACUUM that deletes only files removed before ``cutoff`` (wall-clock
        seconds), in hours before now on the clock."""
        return max(0.0, (self.wall - cutoff) / 3600.0)

    @property
    def file_cutoff(self) -> float:
        """Files removed before this instant may go: always measured on the clock (files and Delta
        commits carry wall-clock times), never on a simulated ``now``."""
        return self.wall - self.policy.file_retention_hours * 3600


def rel(path: Location | str, warehouse: Location | str) -> str:
    """``path`` relative to the warehouse (as given when it lies elsewhere: GX's working copy of a
    remote warehouse)."""
    if is_remote(str(path)) or is_remote(str(warehouse)):
        try:
            return below(path, warehouse)
        except ValueError:
            return str(path)
    for base in (Path(warehouse), Path(warehouse).resolve()):  # quality_root resolves symbolic links
        try:
            return str(Path(path).relative_to(base))
        except ValueError:
            continue
    return str(path)


def relative_parts(path: Location, base: Location) -> list[str]:
    """The segments of ``path`` below ``base`` (both a Path or both an object-store URI)."""
    return below(path, base).split("/")


def delta_tables(files: Files, directory: Location) -> list[Location]:
    """The Delta tables directly under ``directory`` (sorted by name)."""
    return [directory / name for name in files.names(directory) if files.is_dir(directory / name / "_delta_log")]


def du(path: Location) -> int:
    """The bytes of every file under ``path`` (one listing on an object store)."""
    return sum(stat.size for _, stat in files_at(path).walk_entries(path))

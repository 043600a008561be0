"""What every role of a running pipeline process shares (:class:`RunContext`), and its summary.

The roles (the source stage, the keyed stage, completion, recovery) each own their state; they
share only this: the pipeline wired to its tables, the Spark session, the checkpoint store, the
attempt (epoch) this process writes as, the coordinator, the kill points, the progress log, the
metrics, the run's summary and the DataFrames persisted for the current step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from pyspark.sql import DataFrame, SparkSession

from ..delta.store import DeltaCheckpointStore
from ..killpoints import KillPoints
from ..metrics import PipelineMetrics
from ..pipeline import Pipeline
from .topology import Topology


@dataclass
class RunSummary:
    epoch: int
    restored: int | None
    completed: list[int] = field(default_factory=list)
    aborted: list[tuple[int, str]] = field(default_factory=list)
    rows_in: int = 0
    final: int | None = None
    steps: int = 0
    seconds: float = 0.0


@dataclass
class RunContext:
    pipeline: Pipeline
    topology: Topology
    spark: SparkSession
    store: DeltaCheckpointStore
    kills: KillPoints
    progress: Callable[[str], None]
    metrics: PipelineMetrics
    """What the process reports to a metrics daemon (:mod:`checkpoint_lib.metrics`; off by default)."""
    summary: RunSummary = field(default_factory=lambda: RunSummary(0, None))
    epoch: int = 0
    """The attempt this process writes as (set when it opens)."""
    coordinator: Any = None
    """The :class:`~checkpoint_lib.core.coordinator.CheckpointCoordinator` (set when it opens)."""
    _cache: "StepCache" = field(default_factory=lambda: StepCache())

    def reached(self, phase: str) -> None:
        """A kill point (:mod:`checkpoint_lib.killpoints`)."""
        self.kills.reached(phase)

    def fence(self) -> None:
        """Refuse to write once a newer attempt began (FencedError): the early, cheap check before
        a data-plane write. It is not the fence: a process may stall between this check and its
        write. The fence is inside each write's commit (see the recovery's data-plane fence)."""
        self.store.epochs.check(self.epoch)

    def cached(self, df: DataFrame) -> DataFrame:
        return self._cache.cached(df)

    def uncache(self) -> None:
        self._cache.uncache()


class StepCache:
    """DataFrames persisted (memory, spilling to disk) for one step: for a DataFrame of immutable
    inputs that several writes read, so it is computed once. Only ever a cache."""

    def __init__(self) -> None:
        self._held: list[DataFrame] = []

    def cached(self, df: DataFrame) -> DataFrame:
        """``df`` persisted until :meth:`uncache`."""
        from pyspark import StorageLevel

        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        self._held.append(df)
        return df

    def uncache(self) -> None:
        while self._held:
            self._held.pop().unpersist()

"""What a run reports (:class:`RunSummary`), and the DataFrames a step computes once for several writes (:class:`StepCache`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame


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

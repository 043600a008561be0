"""The work a contender does, counted rather than timed: Spark jobs and Delta commits, in all and
per step.

- Spark jobs: the next job id Spark hands out, read before and after the run (job ids are
  consecutive from 0 across job groups, so the difference is the number of jobs started, however
  short, a streaming query's included);
- Delta commits: the versions every Delta table under the contender's output folder gained during
  the run (a table the run created counts its version 0), found by listing the ``_delta_log``
  folders: sinks, state, channel log and control tables alike.

The counts do not depend on the machine: they say where a step's fixed cost can come from, and the
bench prints them beside the times.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

_COMMIT = re.compile(r"^(\d{20})\.json$")


def spark_jobs(spark: Any) -> int:
    """How many Spark jobs this session has started so far, in every job group: the DAG
    scheduler's next job id (the status tracker lists one group at a time, and Structured Streaming
    runs each query's jobs in a group of its own)."""
    return int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())


def delta_versions(root: str) -> dict[str, int]:
    """Every Delta table under the local folder ``root``: its newest version (by its log's commit
    files). An object-store root has no local tables: nothing is counted there."""
    found: dict[str, int] = {}
    if not os.path.isdir(root):
        return found
    for folder, dirs, files in os.walk(root):
        if os.path.basename(folder) != "_delta_log":
            continue
        dirs.clear()
        versions = [int(m.group(1)) for f in files if (m := _COMMIT.match(f))]
        if versions:
            found[str(Path(folder).parent)] = max(versions)
    return found


class Work:
    """Counts one contender's run: ``with Work(spark, out) as work: run(...)``, then
    :meth:`figures` with the run's number of steps."""

    def __init__(self, spark: Any, root: str):
        self.spark, self.root = spark, root
        self.jobs = self.commits = 0

    def __enter__(self) -> "Work":
        self._jobs = spark_jobs(self.spark)
        self._versions = delta_versions(self.root)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.jobs = spark_jobs(self.spark) - self._jobs
        after = delta_versions(self.root)
        self.commits = sum(v - self._versions.get(t, -1) for t, v in after.items())

    def figures(self, steps: int) -> dict[str, Any]:
        """The counts and their share per step (``steps`` at least 1)."""
        steps = max(1, int(steps))
        return {"spark_jobs": self.jobs, "delta_commits": self.commits,
                "jobs_per_step": self.jobs / steps, "commits_per_step": self.commits / steps}

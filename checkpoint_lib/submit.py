"""The child processes checkpoint_lib starts, built in one place (pure: no Spark, no Airflow).

- ``spark-submit`` of a ``jobs/`` entry point: :func:`build_submit_argv`, :func:`stage_args` and
  :func:`submit_env`, used by the Airflow hook's ``spark-submit`` launcher and ``bench/cluster.py``;
  tests pin the argv.
- ``ckpt run`` as a child of this interpreter, with the runner's fault switches (``CKPT_KILL_AT``,
  ``CKPT_PHASE_TRACE``): :func:`ckpt_run_argv` and :func:`ckpt_run_env`, used by the crash and chaos
  tests and ``bench/recovery.py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping, Sequence

from .core.decider import DEFAULT_ROWS_PER_STEP
from .core.types import MODES
from .layout import check_name
from .pipelines import ref_of

REPO_ROOT = Path(__file__).resolve().parents[1]
JOBS_DIR = Path(__file__).resolve().parent / "jobs"
"""The ``spark-submit`` entry points, inside the package (a checkout's ``jobs/`` links here)."""
STAGES = ("source", "keyed", "all")


def build_submit_argv(
    job: str,
    args: Sequence[str],
    *,
    master: str,
    spark_submit: str = "spark-submit",
    conf: Mapping[str, str] | None = None,
    jars: Sequence[str] = (),
    name: str | None = None,
    driver_memory: str | None = None,
    executor_memory: str | None = None,
) -> list[str]:
    """The exact ``spark-submit`` argv of a ``jobs/`` entry point.

    >>> build_submit_argv("run_stage.py", ["payments", "--stage", "source"], master="spark://m:7077")[:5]
    ['spark-submit', '--master', 'spark://m:7077', '--name', 'ckpt-run_stage']
    """
    argv = [spark_submit, "--master", master, "--name", name or f"ckpt-{Path(job).stem}"]
    if driver_memory:
        argv += ["--driver-memory", driver_memory]
    if executor_memory:
        argv += ["--executor-memory", executor_memory]
    if jars:
        argv += ["--jars", ",".join(jars)]
    for key, value in sorted((conf or {}).items()):
        argv += ["--conf", f"{key}={value}"]
    return [*argv, str(JOBS_DIR / job), *args]


def stage_args(
    pipeline: str, warehouse: str, *, stage: str, mode: str = "aligned", rows_per_checkpoint: int = DEFAULT_ROWS_PER_STEP,
    max_steps: int | None = None,
) -> list[str]:
    """The CLI arguments of ``ckpt run`` (and ``jobs/run_stage.py``) for one stage, run until caught up.
    A pipeline this process loaded by reference is passed by its reference (:func:`ref_of`)."""
    if stage not in STAGES:  # a graph's process group, or a mistake
        from .pipelines import declared, is_graph

        if not is_graph(declared(pipeline)):
            raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
        check_name("stage", stage)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    args = [ref_of(pipeline), "--warehouse", warehouse, "--stage", stage, "--mode", mode,
            "--rows-per-checkpoint", str(int(rows_per_checkpoint)), "--until-caught-up"]
    if max_steps is not None:
        args += ["--max-steps", str(int(max_steps))]
    return args


def submit_env(master: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a ``spark-submit`` child: the master for ``get_spark()``, this checkout on
    ``PYTHONPATH``, and Spark and Python from this interpreter (not whatever ``python3`` is first
    on ``PATH``). What ``base`` (default: ``os.environ``) already sets for SPARK_HOME and
    PYSPARK_PYTHON wins."""
    base = dict(os.environ if base is None else base)
    return {
        **base,
        "CKPT_SPARK_MASTER": master,
        "PYTHONPATH": _python_path(base),
        "SPARK_HOME": base.get("SPARK_HOME") or str(spark_home()),
        "PYSPARK_PYTHON": base.get("PYSPARK_PYTHON") or sys.executable,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}",
    }


def spark_home() -> Path:
    """The Spark distribution inside the pyspark install (``bin/spark-submit``, ``bin/spark-class``)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")  # located, not imported: no JVM, no py4j
    if spec is None or spec.origin is None:
        raise RuntimeError("pyspark is not installed: spark-submit needs SPARK_HOME")
    return Path(spec.origin).resolve().parent


def _python_path(env: Mapping[str, str]) -> str:
    """This checkout first, then what ``env`` already had."""
    return os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)


def ckpt_run_argv(pipeline: str, warehouse: str | os.PathLike, *options: str) -> list[str]:
    """``ckpt run`` of ``pipeline`` as a child process of this interpreter."""
    return [sys.executable, "-m", "checkpoint_lib.cli", "run", ref_of(pipeline), "--warehouse", str(warehouse), *options]


def ckpt_run_env(master: str, *, kill_at: str | None = None, trace: str | os.PathLike | None = None,
                 base: Mapping[str, str] | None = None, pause_at: str | None = None) -> dict[str, str]:
    """The environment of a ``ckpt run`` child process (crash tests, chaos runs, the recovery
    benchmark): its Spark master, no Spark UI, this checkout first on ``PYTHONPATH``, and the fault
    switches of :mod:`checkpoint_lib.spark.runner` only when given, never inherited from ``base``
    (default ``os.environ``): ``kill_at`` (``CKPT_KILL_AT``, ``phase:n``), ``trace``
    (``CKPT_PHASE_TRACE``, the file the kill points passed are appended to), ``pause_at``
    (``CKPT_PAUSE_AT``, ``phase:n``: SIGSTOP there, a stalled zombie until SIGCONT)."""
    env = dict(os.environ if base is None else base)
    env.pop("CKPT_KILL_AT", None)
    env.pop("CKPT_PHASE_TRACE", None)
    env.pop("CKPT_PAUSE_AT", None)
    env.update({"CKPT_SPARK_MASTER": master, "CKPT_SPARK_UI": "0", "PYTHONPATH": _python_path(env)})
    if kill_at:
        env["CKPT_KILL_AT"] = kill_at
    if trace is not None:
        env["CKPT_PHASE_TRACE"] = str(trace)
    if pause_at:
        env["CKPT_PAUSE_AT"] = pause_at
    return env

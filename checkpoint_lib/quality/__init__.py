"""Data quality of record: Great Expectations suites after every restore and per checkpoint.

The suites live in ``expectations/`` (JSON, one file per suite, GX's own expectation types plus the
custom ones of :mod:`checkpoint_lib.quality.gx_expectations`). They are checked against *computed
views*: small Spark DataFrames that join what a checkpoint promised with what the tables hold
(``events``: every record once in the event sink; ``keys``: sink, state and source agree
per key; ``conservation``: state + channel state = source; ...). Views are built in Spark from the
warehouse (:mod:`~checkpoint_lib.quality.views`), validated by GX Checkpoints in a file context
under ``<warehouse>/_quality/<pipeline>/`` whose Data Docs land in
``<warehouse>/_quality/<pipeline>/data_docs/index.html``, and every outcome is appended to the
``validations`` Delta table of the pipeline's checkpoint root (:mod:`~checkpoint_lib.quality.records`).

Engines are imported lazily: importing this package costs nothing.

>>> from checkpoint_lib.quality import validate_restore
>>> result = validate_restore(spark, "payments", "warehouse")   # raises QualityCheckFailed on failure
>>> print(result.summary())
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .paths import data_docs_index, quality_root, report_path
from .result import QualityCheckError, QualityCheckFailed, QualityResult

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession


def validate_restore(
    spark: "SparkSession", pipeline_name: str, warehouse: str, checkpoint_id: int | None = None,
    *, raise_on_failure: bool = True, progress: Any = None, session: Any = None,
) -> QualityResult:
    """Run the after-restore suite; see :func:`checkpoint_lib.quality.validate.validate_restore`."""
    from .validate import validate_restore as run

    return run(spark, pipeline_name, warehouse, checkpoint_id, raise_on_failure=raise_on_failure, progress=progress,
               session=session)


def validate_checkpoint(
    spark: "SparkSession", pipeline_name: str, warehouse: str, checkpoint_id: int | None = None,
    *, raise_on_failure: bool = True, progress: Any = None, session: Any = None,
) -> QualityResult:
    """Run the per-checkpoint suite; see :func:`checkpoint_lib.quality.validate.validate_checkpoint`."""
    from .validate import validate_checkpoint as run

    return run(spark, pipeline_name, warehouse, checkpoint_id, raise_on_failure=raise_on_failure, progress=progress,
               session=session)


def validate_before_commit(
    spark: "SparkSession", pipeline_name: str, warehouse: str, store: Any, checkpoint_id: int,
    progress: Any = None, *, epoch: int | None = None, kill_point: Any = None,
) -> QualityResult | None:
    """Validate and record the verdict (the commit gate) as epoch ``epoch``; see
    :func:`checkpoint_lib.quality.validate.validate_before_commit`."""
    from .validate import validate_before_commit as run

    return run(spark, pipeline_name, warehouse, store, checkpoint_id, progress or (lambda line: None),
               epoch=epoch, kill_point=kill_point)


def write_report(pipeline_name: str, warehouse: str, out: str | None = None) -> Any:
    """Write the self-contained HTML report; see :func:`checkpoint_lib.quality.report.write_report`."""
    from .report import write_report as write

    return write(pipeline_name, warehouse, out)


__all__ = [
    "QualityCheckError", "QualityCheckFailed", "QualityResult", "data_docs_index", "quality_root",
    "report_path", "validate_before_commit", "validate_checkpoint", "validate_restore", "write_report",
]

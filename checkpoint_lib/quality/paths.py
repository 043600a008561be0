"""Where quality artefacts live, with the input checks that keep every read inside the warehouse.

Layout for pipeline ``p`` in warehouse ``W``::

    W/_quality/p/gx/               the GX file context (suites, validation definitions, results)
    W/_quality/p/data_docs/        GX Data Docs (index.html): the Checkpoints page links it
    W/_quality/p/report.html       ``ckpt report`` (default output)
    W/_checkpoints/p/validations/  Delta table: one row per validation run (records.py)
"""

from __future__ import annotations

import os
from pathlib import Path

from ..layout import check_pipeline_name, checkpoint_root

__all__ = ["check_checkpoint_id", "check_pipeline_name", "checkpoint_root", "data_docs_index", "inside", "quality_root",
           "report_path", "warehouse_root"]


def check_checkpoint_id(value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"checkpoint id must be a whole number >= 1, got {value!r}")
    return value


def warehouse_root(warehouse: str | os.PathLike) -> Path:
    """The absolute warehouse path; it must exist (nothing is validated in a typo'd directory)."""
    root = Path(warehouse).expanduser().resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"warehouse {str(warehouse)!r} does not exist ({root})")
    return root


def inside(root: Path, relative: str) -> Path:
    """``root/relative``, refusing anything that would resolve outside ``root``."""
    path = (root / relative).resolve()
    if path != root and root not in path.parents:
        raise ValueError(f"{relative!r} points outside the warehouse {root}")
    return path


def quality_root(warehouse: str | os.PathLike, pipeline_name: str) -> Path:
    """``W/_quality/<pipeline>``: the GX project root of the pipeline."""
    return Path(warehouse).expanduser().resolve() / "_quality" / check_pipeline_name(pipeline_name)


def data_docs_index(warehouse: str | os.PathLike, pipeline_name: str) -> Path:
    """``W/_quality/<pipeline>/data_docs/index.html`` (exists once a validation ran)."""
    return quality_root(warehouse, pipeline_name) / "data_docs" / "index.html"


def report_path(warehouse: str | os.PathLike, pipeline_name: str) -> Path:
    """Default output of ``ckpt report``: ``W/_quality/<pipeline>/report.html``."""
    return quality_root(warehouse, pipeline_name) / "report.html"


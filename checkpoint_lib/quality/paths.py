"""Where quality artefacts live, with the input checks that keep every read inside the warehouse.

Layout for pipeline ``p`` in warehouse ``W``::

    W/_quality/p/gx/               the GX file context (suites, validation definitions, results)
    W/_quality/p/data_docs/        GX Data Docs (index.html): the Checkpoints page links it
    W/_quality/p/report.html       ``ckpt report`` (default output)
    W/_checkpoints/p/validations/  Delta table: one row per validation run (records.py)
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..layout import below, check_pipeline_name, checkpoint_root, warehouse_location
from ..objectstore import ObjectUri, is_remote

__all__ = ["check_checkpoint_id", "check_pipeline_name", "checkpoint_root", "data_docs_index", "inside", "quality_root",
           "publish_data_docs", "report_path", "warehouse_root"]


def check_checkpoint_id(value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"checkpoint id must be a whole number >= 1, got {value!r}")
    return value


def warehouse_root(warehouse: str | os.PathLike) -> Path | ObjectUri:
    """The absolute warehouse path; it must exist (nothing is validated in a typo'd directory). On
    an object store, the URI (a prefix always "exists": :func:`open_store <checkpoint_lib.quality.views.open_store>`
    refuses a warehouse without the pipeline's checkpoint store)."""
    if is_remote(str(warehouse)):
        return ObjectUri(warehouse_location(warehouse))
    root = Path(warehouse).expanduser().resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"warehouse {str(warehouse)!r} does not exist ({root})")
    return root


def inside(root: Path | ObjectUri, relative: str) -> Path | ObjectUri:
    """``root/relative``, refusing anything that would resolve outside ``root``."""
    if isinstance(root, ObjectUri):
        if any(part in ("", ".", "..") for part in relative.strip("/").split("/")):
            raise ValueError(f"{relative!r} points outside the warehouse {root}")
        return root / relative
    path = (root / relative).resolve()
    if path != root and root not in path.parents:
        raise ValueError(f"{relative!r} points outside the warehouse {root}")
    return path


def quality_root(warehouse: str | os.PathLike, pipeline_name: str) -> Path:
    """``W/_quality/<pipeline>``: the GX project root of the pipeline. GX works on a local folder:
    for a warehouse on an object store that is this machine's working copy (under the user's cache,
    one per warehouse), and :func:`publish_data_docs` copies the Data Docs into the warehouse."""
    name = check_pipeline_name(pipeline_name)
    if is_remote(str(warehouse)):
        uri = warehouse_location(warehouse)
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
        return cache / "checkpoint_lib" / "quality" / hashlib.sha256(uri.encode()).hexdigest()[:16] / name
    return Path(warehouse).expanduser().resolve() / "_quality" / name


def data_docs_index(warehouse: str | os.PathLike, pipeline_name: str) -> Path | ObjectUri:
    """``W/_quality/<pipeline>/data_docs/index.html`` (exists once a validation ran)."""
    if is_remote(str(warehouse)):
        return ObjectUri(warehouse_location(warehouse)) / "_quality" / check_pipeline_name(pipeline_name) / "data_docs" / "index.html"
    return quality_root(warehouse, pipeline_name) / "data_docs" / "index.html"


def publish_data_docs(warehouse: str | os.PathLike, pipeline_name: str) -> None:
    """For a warehouse on an object store: make ``W/_quality/<pipeline>/data_docs/`` a copy of the
    Data Docs GX built in :func:`quality_root`: pages first, ``index.html`` next (so the index never
    links a page not there yet), then the pages the local copy no longer has are deleted (a run
    ``ckpt maintain`` dropped: the new index no longer links them). Nothing to do for a local
    warehouse, where GX writes in place."""
    if not is_remote(str(warehouse)):
        return
    from ..files import files_at

    local = quality_root(warehouse, pipeline_name) / "data_docs"
    target = data_docs_index(warehouse, pipeline_name).parent
    files = files_at(target)
    pages = {p.relative_to(local).as_posix(): p for p in local.rglob("*") if p.is_file()}
    for name in sorted(pages, key=lambda n: n == "index.html"):
        files.put(target / name, pages[name].read_bytes())
    for published in list(files.walk(target)):
        if below(published, target) not in pages:
            files.delete(published)


def report_path(warehouse: str | os.PathLike, pipeline_name: str) -> Path:
    """Default output of ``ckpt report``: ``W/_quality/<pipeline>/report.html``."""
    return quality_root(warehouse, pipeline_name) / "report.html"


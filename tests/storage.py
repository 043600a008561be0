"""What the tests write beside checkpoint_lib's own files, on a local disk or an object store alike:
the files Spark would leave (Parquet, markers), written whole."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from checkpoint_lib.layout import location
from checkpoint_lib.objectstore import store_at


def put(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` at ``path`` (its folders made on a disk)."""
    where = location(path)
    if isinstance(where, Path):
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_bytes(data)
        return
    import obstore

    parts = urlsplit(where)
    obstore.put(store_at(f"{parts.scheme}://{parts.netloc}", None), parts.path.strip("/"), data)

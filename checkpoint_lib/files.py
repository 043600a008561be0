"""Small files written durably: once, whole or not at all, and fsynced with their directory. The
one implementation for the request files, the pause flag, the checkpoint-id reservation markers and
maintenance's deletions. Pure standard library.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Mapping


def write_once(path: Path, doc: Mapping[str, Any]) -> bool:
    """Create ``path`` with ``doc`` as JSON, complete or not at all; False if it already exists.

    Written to a unique temporary file, fsynced, then ``link``ed to ``path`` (atomic, and refused
    if ``path`` exists), then the directory is fsynced: a crash leaves either no file or all of it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    with open(tmp, "x", encoding="utf-8") as fh:
        json.dump(dict(doc), fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True


def fsync_dir(directory: Path) -> None:
    """Make ``directory``'s entries (a file created, linked or removed in it) durable."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # pragma: no cover - some filesystems refuse fsync on directories
        if exc.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None

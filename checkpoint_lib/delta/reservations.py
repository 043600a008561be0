"""Create-if-absent markers: the one primitive that makes checkpoint ids unique under races.

Two Delta appends never conflict: delta-rs (checked with deltalake 1.6.6, four processes appending
concurrently) rebases a blind append onto whatever committed first and both land. So "1 + the
largest id in the table" is not unique under a race, and a pending row cannot reserve an id.
Uniqueness comes from creating ``root/_ids/<id>`` with ``O_CREAT | O_EXCL``: exactly one creator
succeeds, atomically, on a local or POSIX filesystem, and the marker survives a crash the instant
it exists (the directory is fsynced before the id is returned, so also a power loss). An object
store needs the equivalent conditional put (``If-None-Match: *`` on S3, GCS's
``ifGenerationMatch=0``, Azure's ``If-None-Match``): :mod:`checkpoint_lib.objectstore` is that
:class:`Reservations` for an ``s3://``, ``gs://`` or ``az://`` root.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Protocol, Union

from ..files import fsync_dir
from ..layout import reservation_markers


class Reservations(Protocol):
    """Create-if-absent markers: the one primitive that makes ids and epochs unique under races."""

    def claim(self, namespace: str, number: int) -> bool:
        """Atomically create marker ``number``; True iff this call created it. Durable on return."""
        ...

    def exists(self, namespace: str, number: int) -> bool:
        ...


class LocalReservations:
    """Markers as files ``<directory>/_<namespace>/<number:020d>`` created with ``O_EXCL``."""

    def __init__(self, directory: Union[str, Path]):
        self.directory = Path(directory)
        self._made: set[str] = set()

    def _path(self, namespace: str, number: int) -> Path:
        return Path(reservation_markers(self.directory, namespace)) / f"{number:020d}"

    def claim(self, namespace: str, number: int) -> bool:
        path = self._path(namespace, number)
        if namespace not in self._made:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._made.add(namespace)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            # Informative only (who took it, when): an empty marker reserves just as well.
            os.write(fd, f"{socket.gethostname()}:{os.getpid()} {time.time():.6f}\n".encode())
        finally:
            os.close(fd)
        fsync_dir(path.parent)
        return True

    def exists(self, namespace: str, number: int) -> bool:
        return self._path(namespace, number).exists()


def reserve_from(reservations: Reservations, namespace: str, start: int) -> int:
    number = start
    while not reservations.claim(namespace, number):
        number += 1
    return number

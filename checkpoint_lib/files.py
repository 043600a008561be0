"""Small files written durably: once, whole or not at all. The one implementation for the request
files, the pause flag, the checkpoint-id reservation markers, the sink transactions' control files,
the Delta log reads of the data plane and maintenance's deletions.

The warehouse lives on a local filesystem or on an object store (``s3://``, ``gs://``, ``az://``):
:func:`files_at` gives the :class:`Files` of a location, :class:`LocalFiles` or :class:`ObjectFiles`,
and every caller writes the same code for both. Paths are what :func:`checkpoint_lib.layout.location`
makes (a :class:`~pathlib.Path` or an :class:`~checkpoint_lib.objectstore.ObjectUri`, both joined
with ``/``), or a ``str`` / ``os.PathLike`` it accepts. ::

    files = files_at(root)
    files.write_once(root / "requests" / "r1.request", {"requested_by": "dag"})  # False: it exists
    files.names(root / "requests")                                              # ["r1.request"]

Folders: a filesystem has them, an object store only has keys with ``/`` in them, so a folder
"exists" there exactly while a file is under it. What both implementations promise:

- :meth:`Files.names` of a missing folder (or of a file) is ``[]``, never FileNotFoundError: an
  object store cannot tell an empty folder from an absent one, so no caller may rely on the difference;
- a sub-folder holding no file may be listed on a filesystem and never is on an object store (some
  S3-compatible servers, SeaweedFS among them, keep a folder emptied by deletions in their
  delimiter listings: names come from the objects themselves, never from those prefixes);
- writing a file creates its folders; :meth:`Files.delete_tree` removes a folder and all under it.

Standard library, and ``obstore`` once a remote location is used.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping, Protocol, Union
from urllib.parse import urlsplit

from .layout import location
from .objectstore import ObjectUri, create_once, store_at, verify_conditional_put

Location = Union[Path, ObjectUri]
"""A file or folder in a warehouse, as :func:`checkpoint_lib.layout.location` makes it."""
PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class FileStat:
    size: int
    """Bytes."""
    modification_time: int
    """Milliseconds since the epoch (what a Delta add action records). Object stores report whole
    seconds (the HTTP ``Last-Modified`` header)."""


class Files(Protocol):
    """Files under a warehouse location: the few operations the data plane's control files need.

    Every method takes a full location (not one relative to a root). Reads of a missing file raise
    :class:`FileNotFoundError` (except :meth:`read_json`, which answers None); deletions of a
    missing file or folder do nothing."""

    def write_once(self, path: PathLike, doc: Mapping[str, Any]) -> bool:
        """Create ``path`` with ``doc`` as JSON, complete or not at all; False if it already exists
        (then it is left as it was). Of racing writers exactly one gets True."""
        ...

    def read_bytes(self, path: PathLike) -> bytes:
        ...

    def put(self, path: PathLike, data: bytes) -> None:
        """Write ``path`` whole, replacing what was there (readers see the old or the new bytes,
        never a mix): for published copies such as the Data Docs, never for a decision."""
        ...

    def names(self, folder: PathLike) -> list[str]:
        """The names directly under ``folder``, files and sub-folders, sorted; ``[]`` if it is missing
        or not a folder."""
        ...

    def is_dir(self, path: PathLike) -> bool:
        ...

    def entries(self, folder: PathLike) -> list[tuple[str, FileStat]]:
        """The files directly under ``folder`` (not its sub-folders) with their size and time,
        sorted by name, from one listing; ``[]`` if it is missing."""
        ...

    def exists(self, path: PathLike) -> bool:
        """Whether ``path`` is a file or a folder."""
        ...

    def delete(self, path: PathLike) -> None:
        """Delete the file ``path`` (if it is there). Not made durable on a filesystem: a deletion a
        crash undoes is redone by the next deleter, as every deletion here is idempotent."""
        ...

    def delete_tree(self, folder: PathLike) -> None:
        """Delete ``folder`` and everything under it (if it is there)."""
        ...

    def walk(self, folder: PathLike) -> Iterator[Location]:
        """Every file under ``folder``, at any depth (none if it is missing)."""
        ...

    def walk_entries(self, folder: PathLike) -> Iterator[tuple[Location, FileStat]]:
        """Every file under ``folder``, at any depth, with its size and time: what :meth:`walk`
        gives, from the same listing on an object store (no request per file)."""
        ...

    def stat(self, path: PathLike) -> FileStat:
        ...

    def open(self, path: PathLike) -> BinaryIO:
        """``path`` opened for reading, seekable (what pyarrow reads a Parquet footer from); a
        context manager that closes it."""
        ...

    def read_text(self, path: PathLike) -> str:
        return self.read_bytes(path).decode("utf-8")

    def read_json(self, path: PathLike) -> dict[str, Any] | None:
        """The JSON document at ``path``; None if there is none."""
        try:
            return json.loads(self.read_bytes(path))
        except FileNotFoundError:
            return None


def _encode(doc: Mapping[str, Any]) -> bytes:
    """The one serialization of a written-once document (keys sorted: equal documents, equal bytes)."""
    return json.dumps(dict(doc), sort_keys=True).encode("utf-8")


def _temporary(path: Path) -> Path:
    """A name beside ``path`` no other writer (process, host) uses: where a file is written before
    it is linked or renamed to ``path``."""
    return path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.{time.monotonic_ns()}.tmp")


def _local_stat(st: os.stat_result) -> FileStat:
    return FileStat(size=st.st_size, modification_time=int(st.st_mtime * 1000))


class LocalFiles(Files):
    """A POSIX filesystem. A file written once is durable when :meth:`write_once` returns: written
    to a unique temporary file, fsynced, ``link``ed to its name (atomic, and refused if the name
    exists), and its directory fsynced; a crash leaves either no file or all of it."""

    @staticmethod
    def _path(path: PathLike) -> Path:
        where = location(path)
        if not isinstance(where, Path):
            raise ValueError(f"{path} is on an object store: use files_at({str(path)!r})")
        return where

    def write_once(self, path: PathLike, doc: Mapping[str, Any]) -> bool:
        path = self._path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temporary(path)
        with open(tmp, "xb") as fh:
            fh.write(_encode(doc))
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

    def read_bytes(self, path: PathLike) -> bytes:
        return self._path(path).read_bytes()

    def put(self, path: PathLike, data: bytes) -> None:
        path = self._path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temporary(path)
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def names(self, folder: PathLike) -> list[str]:
        try:
            return sorted(os.listdir(self._path(folder)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def is_dir(self, path: PathLike) -> bool:
        return self._path(path).is_dir()

    def entries(self, folder: PathLike) -> list[tuple[str, FileStat]]:
        out = []
        try:
            with os.scandir(self._path(folder)) as listing:
                for entry in listing:
                    try:
                        if not entry.is_file():
                            continue
                        st = entry.stat()
                    except FileNotFoundError:  # removed since the listing
                        continue
                    out.append((entry.name, _local_stat(st)))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(out, key=lambda e: e[0])

    def exists(self, path: PathLike) -> bool:
        return self._path(path).exists()

    def delete(self, path: PathLike) -> None:
        self._path(path).unlink(missing_ok=True)

    def delete_tree(self, folder: PathLike) -> None:
        shutil.rmtree(self._path(folder), ignore_errors=True)

    def walk(self, folder: PathLike) -> Iterator[Path]:
        for root, _dirs, names in os.walk(self._path(folder)):
            for name in names:
                yield Path(root, name)

    def walk_entries(self, folder: PathLike) -> Iterator[tuple[Path, FileStat]]:
        for path in self.walk(folder):
            try:
                st = os.stat(path)
            except FileNotFoundError:  # removed since the listing
                continue
            yield path, _local_stat(st)

    def stat(self, path: PathLike) -> FileStat:
        st = os.stat(self._path(path))
        return _local_stat(st)

    def open(self, path: PathLike) -> BinaryIO:
        return open(self._path(path), "rb")


class ObjectFiles(Files):
    """An object store, through ``obstore``: one store per bucket (container) and environment,
    built on first use and kept, so a call costs its requests and not a new client. Create-if-absent
    is a conditional put, relied on only once :func:`~checkpoint_lib.objectstore.verify_conditional_put`
    found the bucket honours it. Settings (endpoint, keys, region) come from the environment, as for
    delta-rs and the checkpoint store."""

    ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_")
    """The variables a store reads when it is built: a store is kept per their values, so a changed
    environment (another endpoint, rotated keys) gets a new one."""

    def __init__(self) -> None:
        self._stores: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        self._lock = threading.Lock()

    def _at(self, path: PathLike) -> tuple[Any, str, str]:
        """(store, key, bucket URI) of ``path``: ``s3://b/x/y`` -> (the store of ``s3://b``, ``x/y``, ``s3://b``)."""
        uri = ObjectUri(str(path))
        parts = urlsplit(uri)
        bucket = f"{parts.scheme}://{parts.netloc}"
        env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(self.ENV_PREFIXES)))
        with self._lock:
            store = self._stores.get((bucket, env))
            if store is None:
                store = self._stores[(bucket, env)] = store_at(bucket, None)
        return store, parts.path.strip("/"), bucket

    def write_once(self, path: PathLike, doc: Mapping[str, Any]) -> bool:
        store, key, bucket = self._at(path)
        verify_conditional_put(bucket)
        return create_once(store, key, _encode(doc), str(path))

    def read_bytes(self, path: PathLike) -> bytes:
        import obstore

        store, key, _ = self._at(path)
        return bytes(obstore.get(store, key).bytes())

    def put(self, path: PathLike, data: bytes) -> None:
        import obstore

        store, key, _ = self._at(path)
        obstore.put(store, key, data)  # a single PUT: atomic

    def _listing(self, folder: PathLike) -> Iterator[tuple[str, dict[str, Any]]]:
        """(bucket URI, obstore's metadata: ``path`` (the key), ``size``, ``last_modified``) of
        every object under ``folder``."""
        import obstore

        store, key, bucket = self._at(folder)
        for chunk in obstore.list(store, key or None, chunk_size=1000):
            for meta in chunk:
                yield bucket, meta

    def _objects(self, folder: PathLike) -> Iterator[tuple[str, str]]:
        """(bucket URI, key) of every object under ``folder``."""
        for bucket, meta in self._listing(folder):
            yield bucket, meta["path"]

    def names(self, folder: PathLike) -> list[str]:
        # From the objects under the folder, not a delimiter listing: see the module docstring.
        _, prefix, _ = self._at(folder)
        skip = len(prefix) + 1 if prefix else 0
        return sorted({key[skip:].split("/", 1)[0] for _, key in self._objects(folder)})

    def is_dir(self, path: PathLike) -> bool:
        return next(self._objects(path), None) is not None

    def entries(self, folder: PathLike) -> list[tuple[str, FileStat]]:
        _, prefix, _ = self._at(folder)
        skip = len(prefix) + 1 if prefix else 0
        out = []
        for _, meta in self._listing(folder):
            name = meta["path"][skip:]
            if "/" not in name:
                out.append((name, _file_stat(meta)))
        return sorted(out, key=lambda e: e[0])

    def exists(self, path: PathLike) -> bool:
        try:
            self.stat(path)
        except FileNotFoundError:
            return self.is_dir(path)
        return True

    def delete(self, path: PathLike) -> None:
        import obstore

        store, key, _ = self._at(path)
        try:
            obstore.delete(store, key)
        except FileNotFoundError:  # GCS and Azure refuse to delete what is not there; S3 does not
            pass

    def delete_tree(self, folder: PathLike) -> None:
        import obstore

        store, _, _ = self._at(folder)
        keys = [key for _, key in self._objects(folder)]
        if keys:
            try:
                obstore.delete(store, keys)
            except FileNotFoundError:  # a racing deleter was first
                pass

    def walk(self, folder: PathLike) -> Iterator[ObjectUri]:
        for bucket, key in self._objects(folder):
            yield ObjectUri(f"{bucket}/{key}")

    def walk_entries(self, folder: PathLike) -> Iterator[tuple[ObjectUri, FileStat]]:
        for bucket, meta in self._listing(folder):
            yield ObjectUri(f"{bucket}/{meta['path']}"), _file_stat(meta)

    def stat(self, path: PathLike) -> FileStat:
        import obstore

        store, key, _ = self._at(path)
        return _file_stat(obstore.head(store, key))

    def open(self, path: PathLike) -> BinaryIO:
        import obstore

        store, key, _ = self._at(path)
        return io.BufferedReader(_ObjectReader(obstore.open_reader(store, key)))


def _file_stat(meta: Mapping[str, Any]) -> FileStat:
    """The size and time of an object from obstore's metadata (of a listing or a HEAD)."""
    return FileStat(size=int(meta["size"]), modification_time=int(meta["last_modified"].timestamp() * 1000))


class _ObjectReader(io.RawIOBase):
    """obstore's reader as a Python binary file: it has ``read``/``seek``/``tell`` but no ``closed``
    and no ``readinto``, which pyarrow (and ``io``) expect of a file object."""

    def __init__(self, reader: Any):
        self._reader = reader

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._reader.seek(offset, whence)

    def tell(self) -> int:
        return self._reader.tell()

    def readinto(self, buffer: Any) -> int:
        data = memoryview(self._reader.read(len(buffer)))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._reader.close()
        super().close()


_LOCAL = LocalFiles()
_OBJECTS = ObjectFiles()


def files_at(path: PathLike) -> Files:
    """The :class:`Files` of ``path``'s storage: :class:`ObjectFiles` for an object-store URI,
    :class:`LocalFiles` for anything else. No I/O."""
    return _OBJECTS if isinstance(location(path), ObjectUri) else _LOCAL


def write_once(path: PathLike, doc: Mapping[str, Any]) -> bool:
    """:meth:`Files.write_once` on ``path``'s storage."""
    return files_at(path).write_once(path, doc)


def read_json(path: PathLike) -> dict[str, Any] | None:
    """:meth:`Files.read_json` on ``path``'s storage."""
    return files_at(path).read_json(path)


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

"""The warehouse on object storage (S3, GCS, Azure): which locations are remote, and the one
primitive the control plane needs from a store besides Delta's own commits: **create if absent**.

Checkpoint ids and epochs are unique because exactly one creator of a marker succeeds. On a POSIX
filesystem that is ``O_CREAT | O_EXCL`` (:class:`checkpoint_lib.delta.reservations.LocalReservations`);
on an object store it is a conditional put, the primitive all three clouds offer: S3's and Azure's
``If-None-Match: *``, GCS's ``ifGenerationMatch=0``. :class:`ObjectStoreReservations` creates the
markers with it (through ``obstore``, the Python face of the ``object_store`` crate delta-rs commits
through, reading the same ``AWS_*`` / ``GOOGLE_*`` / ``AZURE_*`` settings from the environment).

A store that accepts the header and ignores it (some S3-compatible servers, or S3 behind a proxy
that drops it) would let two attempts both own an id: :func:`verify_conditional_put` creates a
probe object twice before the first marker is claimed, and refuses the store with
:class:`ConditionalPutUnsupported` unless the second create is refused. Nothing is ever written
to a store that failed it.

Imports no engine; ``obstore`` is imported when a remote location is first used.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from typing import Any, Mapping
from urllib.parse import urlsplit

REMOTE_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure"}
"""URI schemes of object stores, and the cloud each belongs to."""


class ConditionalPutUnsupported(RuntimeError):
    """The object store cannot create an object only if it is absent: ids and epochs cannot be
    made unique on it, so the warehouse must not live there."""


def cloud_of(location: str) -> str | None:
    """``"s3"``, ``"gcs"`` or ``"azure"`` for an object-store URI; None for a local path or ``file://``."""
    scheme = urlsplit(str(location)).scheme.lower()
    return REMOTE_SCHEMES.get(scheme)


def is_remote(location: str) -> bool:
    return cloud_of(location) is not None


class ObjectUri(str):
    """A location on an object store (``s3://bucket/a/b``), joined like a :class:`pathlib.Path`
    (``uri / "state" / "op"``) without losing its ``//``, which a Path would collapse."""

    def __new__(cls, value: str) -> "ObjectUri":
        text = str(value)
        if not is_remote(text):
            raise ValueError(f"{text!r} is not an object-store URI (s3://, gs://, az://)")
        return super().__new__(cls, text.rstrip("/"))

    def __truediv__(self, part: object) -> "ObjectUri":
        return ObjectUri(f"{self}/{str(part).strip('/')}")

    @property
    def name(self) -> str:
        return self.rsplit("/", 1)[-1]

    @property
    def parent(self) -> "ObjectUri":
        head = self.rsplit("/", 1)[0]
        return self if head.endswith(":/") else ObjectUri(head)


def store_at(location: str, options: Mapping[str, str] | None) -> Any:
    """An obstore store scoped to ``location`` (bucket and prefix). ``options`` are object_store
    settings (``aws_endpoint``, ``aws_allow_http``...); obstore reads the rest, ``AWS_ALLOW_HTTP``
    included, from the environment."""
    from obstore.store import from_url

    config: dict[str, Any] = {}
    client: dict[str, Any] = {}
    for key, value in (options or {}).items():
        name = key.lower()
        if name.endswith("allow_http"):
            client["allow_http"] = str(value).lower() in ("1", "true", "yes")
        else:
            config[name] = value
    url = str(location).replace("s3a://", "s3://", 1)
    kwargs: dict[str, Any] = {"client_options": client} if client else {}
    if config:
        kwargs["config"] = config
    return from_url(url, **kwargs)


def create_once(store: Any, path: str, data: bytes, location: str) -> bool:
    """Create ``path`` (under ``location``) iff absent: True if this call created it."""
    import obstore
    from obstore.exceptions import AlreadyExistsError

    try:
        obstore.put(store, path, data, mode="create")
    except AlreadyExistsError:
        return False
    except Exception as exc:  # noqa: BLE001 - obstore's "not implemented" when conditional put is off
        if "conditional put" in str(exc).lower() or "not yet implemented" in str(exc).lower():
            first = str(exc).strip().splitlines()[0]
            raise ConditionalPutUnsupported(_refusal(location, f"the client refuses it ({first})")) from exc
        raise
    return True


def _refusal(location: Any, why: str) -> str:
    return (f"{location}: this object store does not honour create-if-absent (conditional put): {why}. "
            "Checkpoint ids and epochs would not be unique there, so checkpoint_lib will not write to it. "
            "On S3 and S3-compatible servers use one that enforces If-None-Match: * (AWS S3 does since "
            "2024-08; MinIO, SeaweedFS and Ceph RGW recent versions do), and do not set "
            "aws_conditional_put=disabled; see docs/object-storage.md.")


def env_from_connection(conn_type: str, login: str | None, password: str | None,
                        extra: dict[str, Any] | None) -> dict[str, str]:
    """The standard variables delta-rs, obstore and Spark's S3A read, from an Airflow connection to
    the warehouse's object store (pure: the caller reads the connection):

    - ``aws``: login = access key id, password = secret key; extra ``region_name``,
      ``endpoint_url`` (an S3-compatible server; ``http://`` also sets ``AWS_ALLOW_HTTP``),
      ``aws_session_token``;
    - ``google_cloud_platform``: extra ``key_path`` (a service-account key file);
    - ``wasb`` / ``azure``: login = storage account name, password = account key.
    """
    extra = {k.removeprefix(f"extra__{conn_type}__"): v for k, v in (extra or {}).items() if v not in (None, "")}
    env: dict[str, str] = {}
    if conn_type == "aws":
        pairs = {"AWS_ACCESS_KEY_ID": login, "AWS_SECRET_ACCESS_KEY": password,
                 "AWS_SESSION_TOKEN": extra.get("aws_session_token"), "AWS_REGION": extra.get("region_name"),
                 "AWS_ENDPOINT_URL": extra.get("endpoint_url")}
        env = {k: str(v) for k, v in pairs.items() if v}
        if env.get("AWS_ENDPOINT_URL", "").startswith("http://"):
            env["AWS_ALLOW_HTTP"] = "true"
    elif conn_type == "google_cloud_platform":
        if extra.get("key_path"):
            env["GOOGLE_SERVICE_ACCOUNT"] = str(extra["key_path"])
    elif conn_type in ("wasb", "azure"):
        env = {k: str(v) for k, v in {"AZURE_STORAGE_ACCOUNT_NAME": login, "AZURE_STORAGE_ACCOUNT_KEY": password}.items() if v}
    else:
        raise ValueError(f"a connection of type {conn_type!r} does not configure an object store "
                         "(aws, google_cloud_platform or wasb)")
    return env


_verified: set[str] = set()
_verify_lock = threading.Lock()


def verify_conditional_put(location: str, options: Mapping[str, str] | None = None) -> None:
    """Create a probe object under ``location`` twice: the second create must be refused. Checked
    once per location and process; :class:`ConditionalPutUnsupported` when the store overwrote."""
    with _verify_lock:
        if location in _verified:
            return
        store = store_at(location, options)
        probe = f"_conditional_put_probe/{uuid.uuid4().hex}"
        if not create_once(store, probe, b"first", location):
            raise ConditionalPutUnsupported(_refusal(location, "a new probe object was reported as existing"))
        if create_once(store, probe, b"second", location):
            raise ConditionalPutUnsupported(_refusal(location, "a second create of the same object succeeded"))
        import obstore

        obstore.delete(store, probe)
        _verified.add(location)


class ObjectStoreReservations:
    """Markers as objects ``<location>/_<namespace>/<number:020d>`` created with a conditional put:
    exactly one creator succeeds, and the marker is durable once the store acknowledged it (the
    :class:`~checkpoint_lib.delta.reservations.Reservations` protocol)."""

    def __init__(self, location: str, options: Mapping[str, str] | None = None):
        self.location = str(location).rstrip("/")
        self.options = dict(options) if options else None
        self._store: Any = None

    def _path(self, namespace: str, number: int) -> str:
        return f"_{namespace}/{number:020d}"

    def _ready(self) -> Any:
        if self._store is None:
            verify_conditional_put(self.location, self.options)
            self._store = store_at(self.location, self.options)
        return self._store

    def claim(self, namespace: str, number: int) -> bool:
        # Informative only (who took it, when): an empty marker reserves just as well.
        who = f"{socket.gethostname()}:{os.getpid()} {time.time():.6f}\n".encode()
        return create_once(self._ready(), self._path(namespace, number), who, self.location)

    def exists(self, namespace: str, number: int) -> bool:
        import obstore

        try:
            obstore.head(self._ready(), self._path(namespace, number))
        except FileNotFoundError:
            return False
        return True

    def __repr__(self) -> str:
        return f"ObjectStoreReservations({self.location!r})"

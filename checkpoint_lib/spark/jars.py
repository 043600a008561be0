"""Delta Lake jars on local disk, so Spark sessions start offline.

``delta.configure_spark_with_delta_pip`` only sets ``spark.jars.packages``, which makes Ivy
resolve ``io.delta:delta-spark_<spark>_<scala>:<version>`` from the network at every session
start. We instead download the jars once (``make setup``, or ``ckpt setup``) into
:func:`jar_dir` and hand them to Spark through ``spark.jars`` (see
:mod:`checkpoint_lib.spark.session`). The download is plain HTTPS from Maven Central (or the
mirror ``$CKPT_MAVEN_REPO`` names), each jar checked against its pinned SHA-256 before it is
put in place: no Maven, no resolver, the same bytes on every machine.

Which jars
----------
:data:`ARTIFACTS` is the runtime closure of ``io.delta:delta-spark_4.2_2.13`` as Maven resolves
it, minus every artifact that pyspark 4.2.0 already ships in ``pyspark/jars`` (in a newer
version: scala-library, jackson core/databind/annotations, hadoop-client, parquet,
RoaringBitmap, snappy, zstd, log4j, slf4j...) and minus those artifacts' own dependencies.
``jackson-datatype-jdk8`` is not in pyspark, so it is pinned to pyspark's Jackson version
(2.21.2) rather than the 2.13.5 Maven picks, to keep one Jackson line on the classpath.

Version note: the delta-spark *Python* package is 4.4.1, but Maven Central has no 4.4.1 jars
(the newest ``io.delta:delta-spark_4.2_2.13`` and ``io.delta:delta-storage`` are 4.4.0). The
Python code of delta-spark 4.4.0 and 4.4.1 is identical apart from ``__version__``, so the
4.4.0 jars are the right ones. Bump :data:`DELTA_JAR_VERSION` when 4.4.1 jars appear.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..history import human_bytes

__all__ = [
    "ARTIFACTS",
    "DELTA_JAR_VERSION",
    "JAR_DIR_ENV",
    "MAVEN_REPO_ENV",
    "SPARK_MINOR_VERSION",
    "Artifact",
    "JarFetchError",
    "MissingJarsError",
    "ensure_jars",
    "fetch_jars",
    "jar_dir",
    "jar_paths",
    "maven_repo",
    "missing_jars",
    "required_jars",
    "setup_main",
]

JAR_DIR_ENV = "CKPT_JAR_DIR"
"""Environment variable that overrides :func:`jar_dir`."""

SPARK_MINOR_VERSION = "4.2"
"""The Spark line these jars are built for (pyspark must be 4.2.x)."""

DELTA_JAR_VERSION = "4.4.0"
"""Version of the io.delta jars (see the module docstring for why not 4.4.1)."""

MAVEN_REPO_ENV = "CKPT_MAVEN_REPO"
"""Environment variable naming a Maven repository (a mirror, a proxy) to download from."""

DEFAULT_MAVEN_REPO = "https://repo1.maven.org/maven2"

_REPO_ROOT = Path(__file__).resolve().parents[2]
_TMP_PREFIX = ".fetch-"
_LOCK_NAME = ".fetch.lock"


@dataclass(frozen=True)
class Artifact:
    """A Maven artifact packaged as a plain ``.jar`` (no classifier), with the SHA-256 of the
    bytes Maven Central serves (checked against Central's own ``.sha1`` when pinned)."""

    group: str
    name: str
    version: str
    sha256: str

    @property
    def coordinate(self) -> str:
        """``group:name:version``."""
        return f"{self.group}:{self.name}:{self.version}"

    @property
    def file_name(self) -> str:
        """The file name Maven gives the jar: ``name-version.jar``."""
        return f"{self.name}-{self.version}.jar"

    @property
    def repo_path(self) -> str:
        """Where a Maven repository keeps the jar, relative to its root."""
        return f"{self.group.replace('.', '/')}/{self.name}/{self.version}/{self.file_name}"


ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("io.delta", f"delta-spark_{SPARK_MINOR_VERSION}_2.13", DELTA_JAR_VERSION,
             "27d4fd8b1f879535c573ed1c718177d6a27f24d3e626ba02e216369725721ead"),
    Artifact("io.delta", "delta-storage", DELTA_JAR_VERSION,
             "c46735481fa8e326b0957be02b4420cbcab4b325bb08009b7f2045a95133f1cc"),
    Artifact("io.delta", "delta-kernel-api", DELTA_JAR_VERSION,
             "ee9b5a14ac3b7efdff4d61a58478fe8eb0e5a3fbca43889dca7290795fe79a11"),
    Artifact("io.delta", "delta-kernel-defaults", DELTA_JAR_VERSION,
             "225c975199e4718b38ee5b7e6da7f19e9585024262b2cec2656b32151a856b0b"),
    Artifact("io.delta", "delta-kernel-unitycatalog", DELTA_JAR_VERSION,
             "cea22dfb4ac562b3cd27bf652697750e8336009d73fb06631363aaaad5345ffa"),
    Artifact("io.unitycatalog", "unitycatalog-client", "0.6.0",
             "48257499a86b801a3e2372cec55ac226ca1c1c7eabe5c118e7302f29a1fdbc19"),
    Artifact("io.unitycatalog", "unitycatalog-hadoop", "0.6.0",
             "c47b63c961c87102b9e1d63809a0915ba4c86b7652f57c8d39ca3a05b441a150"),
    Artifact("com.fasterxml.jackson.datatype", "jackson-datatype-jdk8", "2.21.2",
             "e581bbf3fc5622d16b57366dd41e10fc56921fb202879de2ef487f87dd9b30e7"),
)
"""Every jar Delta Lake needs on top of pyspark 4.2.0's own jars."""


class MissingJarsError(RuntimeError):
    """Raised when Delta Lake jars are missing; the message says how to fetch them."""

    def __init__(self, directory: Path, missing: list[str]) -> None:
        self.directory = directory
        self.missing = list(missing)
        listing = "\n".join(f"  {name}" for name in self.missing)
        super().__init__(
            f"Delta Lake jars are missing from {directory}:\n{listing}\n"
            "Fix: run `make setup` in the checkout (or `ckpt setup`); it downloads them once "
            f"over HTTPS. Set {JAR_DIR_ENV} to keep the jars in another folder."
        )


class JarFetchError(RuntimeError):
    """Raised when a jar cannot be downloaded, or its bytes are not the pinned ones."""


def jar_dir() -> Path:
    """Return the folder holding the jars: ``$CKPT_JAR_DIR``; else, run from a checkout (an
    editable install), ``<checkout>/.cache/jars``; else (an installed wheel) the user's cache,
    ``$XDG_CACHE_HOME/checkpoint_lib/jars`` (``~/.cache/checkpoint_lib/jars``).

    The result is absolute, as ``spark.jars`` needs.
    """
    override = os.environ.get(JAR_DIR_ENV)
    if override:
        return Path(override).expanduser().resolve()
    if (_REPO_ROOT / "pyproject.toml").is_file() and (_REPO_ROOT / "checkpoint_lib").is_dir():
        return _REPO_ROOT / ".cache" / "jars"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser().resolve() / "checkpoint_lib" / "jars"


def maven_repo() -> str:
    """The Maven repository the jars come from: ``$CKPT_MAVEN_REPO``, else Maven Central."""
    return (os.environ.get(MAVEN_REPO_ENV) or DEFAULT_MAVEN_REPO).rstrip("/")


def required_jars() -> list[str]:
    """Return the file names of every required jar, Delta Lake's own first."""
    return [artifact.file_name for artifact in ARTIFACTS]


def jar_paths(directory: Path | None = None) -> list[Path]:
    """Return the absolute paths the required jars have (or will have) in ``directory``."""
    directory = directory or jar_dir()
    return [directory / name for name in required_jars()]


def missing_jars(directory: Path | None = None) -> list[str]:
    """Return the file names of the required jars that are not in ``directory`` yet."""
    return [path.name for path in jar_paths(directory) if not path.is_file()]


def ensure_jars(directory: Path | None = None) -> list[Path]:
    """Return the paths of all required jars, or raise :class:`MissingJarsError`.

    Never downloads anything: sessions must start offline and fast.
    """
    directory = directory or jar_dir()
    missing = missing_jars(directory)
    if missing:
        raise MissingJarsError(directory, missing)
    return jar_paths(directory)


def fetch_jars(
    directory: Path | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> list[Path]:
    """Download the missing jars into ``directory``; return the ones downloaded.

    Idempotent: jars already present are skipped. Each jar is downloaded into a private
    temporary folder inside ``directory``, checked against its pinned SHA-256, then renamed into
    place, so an interrupted run (even ``kill -9``) never leaves a partial or foreign jar under
    its final name. A lock file serialises concurrent runs, and every run first deletes the
    temporary folders of killed ones.

    Raises :class:`JarFetchError` if a download fails or its checksum differs.
    """
    directory = directory or jar_dir()
    directory.mkdir(parents=True, exist_ok=True)
    fetched: list[Path] = []
    with _fetch_lock(directory):
        _remove_stale_temp_dirs(directory)
        for artifact in ARTIFACTS:
            target = directory / artifact.file_name
            if target.is_file():
                continue
            if progress:
                progress(f"downloading {artifact.coordinate}")
            _download(artifact, target)
            fetched.append(target)
    return fetched


def setup_main() -> int:
    """Fetch the jars and print what was done; return a process exit code.

    This is what ``make setup`` and ``ckpt setup`` run.
    """
    directory = jar_dir()
    print(f"Delta {DELTA_JAR_VERSION} jars for Spark {SPARK_MINOR_VERSION} in {directory}")
    try:
        fetched = {path.name for path in fetch_jars(directory, progress=_indent_print)}
    except JarFetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in jar_paths(directory):
        status = "downloaded" if path.name in fetched else "present"
        print(f"  {status:<10}  {path.name}  ({human_bytes(path.stat().st_size)})")
    print(f"{len(ARTIFACTS)} jars ready, {len(fetched)} downloaded.")
    return 0


def _indent_print(message: str) -> None:
    print(f"  {message}", flush=True)


@contextlib.contextmanager
def _fetch_lock(directory: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``directory/.fetch.lock`` (released when this process
    closes it or dies)."""
    with open(directory / _LOCK_NAME, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _remove_stale_temp_dirs(directory: Path) -> None:
    """Delete temporary folders of killed runs; only call while holding the fetch lock."""
    for leftover in directory.glob(f"{_TMP_PREFIX}*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _download(artifact: Artifact, target: Path) -> None:
    """Download one artifact, check its SHA-256, fsync it and atomically rename it to ``target``."""
    url = f"{maven_repo()}/{artifact.repo_path}"
    tmp = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=target.parent))
    try:
        part = tmp / artifact.file_name
        digest, size = hashlib.sha256(), 0
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(part, "wb") as out:
                while chunk := response.read(1 << 20):
                    digest.update(chunk)
                    size += out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
                announced = response.headers.get("Content-Length")
                if announced is not None and size != int(announced):  # a read never says it was cut short
                    raise http.client.IncompleteRead(b"", int(announced) - size)
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            raise JarFetchError(
                f"could not download {url}: {exc}\nFix: check the network (an HTTPS proxy is read from "
                f"HTTPS_PROXY), or set {MAVEN_REPO_ENV} to a Maven mirror you can reach, or copy "
                f"{artifact.file_name} into {target.parent} by hand; then run `make setup` again."
            ) from exc
        if digest.hexdigest() != artifact.sha256:
            raise JarFetchError(
                f"{url} is not the pinned {artifact.file_name} (SHA-256 {digest.hexdigest()}, expected "
                f"{artifact.sha256}): refused, nothing installed. A mirror serving other bytes, or a "
                "proxy rewriting them, is the usual cause."
            )
        os.replace(part, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

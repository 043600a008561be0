"""Delta Lake jars on local disk, so Spark sessions start offline.

``delta.configure_spark_with_delta_pip`` only sets ``spark.jars.packages``, which makes Ivy
resolve ``io.delta:delta-spark_<spark>_<scala>:<version>`` from the network at every session
start. We instead download the jars once (``make setup``, or ``ckpt setup``) into
:func:`jar_dir` and hand them to Spark through ``spark.jars`` (see
:mod:`checkpoint_lib.spark.session`).

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
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ARTIFACTS",
    "DELTA_JAR_VERSION",
    "JAR_DIR_ENV",
    "SPARK_MINOR_VERSION",
    "Artifact",
    "JarFetchError",
    "MissingJarsError",
    "ensure_jars",
    "fetch_jars",
    "jar_dir",
    "jar_paths",
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

# Pinned so the download does not depend on the default plugin version of the local Maven.
_MVN_COPY_GOAL = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy"
_REPO_ROOT = Path(__file__).resolve().parents[2]
_TMP_PREFIX = ".fetch-"
_LOCK_NAME = ".fetch.lock"


@dataclass(frozen=True)
class Artifact:
    """A Maven artifact packaged as a plain ``.jar`` (no classifier)."""

    group: str
    name: str
    version: str

    @property
    def coordinate(self) -> str:
        """``group:name:version``, as Maven's ``-Dartifact`` expects."""
        return f"{self.group}:{self.name}:{self.version}"

    @property
    def file_name(self) -> str:
        """The file name Maven gives the jar: ``name-version.jar``."""
        return f"{self.name}-{self.version}.jar"


ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("io.delta", f"delta-spark_{SPARK_MINOR_VERSION}_2.13", DELTA_JAR_VERSION),
    Artifact("io.delta", "delta-storage", DELTA_JAR_VERSION),
    Artifact("io.delta", "delta-kernel-api", DELTA_JAR_VERSION),
    Artifact("io.delta", "delta-kernel-defaults", DELTA_JAR_VERSION),
    Artifact("io.delta", "delta-kernel-unitycatalog", DELTA_JAR_VERSION),
    Artifact("io.unitycatalog", "unitycatalog-client", "0.6.0"),
    Artifact("io.unitycatalog", "unitycatalog-hadoop", "0.6.0"),
    Artifact("com.fasterxml.jackson.datatype", "jackson-datatype-jdk8", "2.21.2"),
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
            f"with Maven. Set {JAR_DIR_ENV} to keep the jars in another folder."
        )


class JarFetchError(RuntimeError):
    """Raised when Maven cannot download a jar."""


def jar_dir() -> Path:
    """Return the folder holding the jars: ``$CKPT_JAR_DIR``, else ``<repo>/.cache/jars``.

    The result is absolute, as ``spark.jars`` needs. ``<repo>`` is the checkout this module
    lives in; a non-editable install should set ``CKPT_JAR_DIR``.
    """
    override = os.environ.get(JAR_DIR_ENV)
    if override:
        return Path(override).expanduser().resolve()
    return _REPO_ROOT / ".cache" / "jars"


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
    """Download the missing jars into ``directory`` with Maven; return the ones downloaded.

    Idempotent: jars already present are skipped, and when none is missing Maven is not even
    looked for. Each jar is downloaded into a private temporary folder inside ``directory``
    and then renamed into place, so an interrupted run (even ``kill -9``) never leaves a
    partial jar under its final name. A lock file serialises concurrent runs; Maven inherits
    the lock, so a Maven orphaned by a killed run still holds it until it exits. That makes
    it safe to delete the temporary folders of killed runs, which every run does first.

    Raises :class:`JarFetchError` if Maven is not installed or a download fails.
    """
    directory = directory or jar_dir()
    directory.mkdir(parents=True, exist_ok=True)
    fetched: list[Path] = []
    with _fetch_lock(directory) as lock_fd:
        _remove_stale_temp_dirs(directory)
        todo = [a for a in ARTIFACTS if not (directory / a.file_name).is_file()]
        if not todo:
            return fetched
        mvn = shutil.which("mvn")
        if mvn is None:
            raise JarFetchError(
                "Maven (`mvn`) is needed to download the Delta Lake jars but is not on PATH; "
                "install it (Debian: `apt-get install maven`) and run `make setup` again."
            )
        for artifact in todo:
            if progress:
                progress(f"downloading {artifact.coordinate}")
            target = directory / artifact.file_name
            _download(mvn, artifact, target, lock_fd)
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
        print(f"  {status:<10}  {path.name}  ({_human_size(path.stat().st_size)})")
    print(f"{len(ARTIFACTS)} jars ready, {len(fetched)} downloaded.")
    return 0


def _human_size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"


def _indent_print(message: str) -> None:
    print(f"  {message}", flush=True)


@contextlib.contextmanager
def _fetch_lock(directory: Path) -> Iterator[int]:
    """Hold an exclusive ``flock`` on ``directory/.fetch.lock``; yield its file descriptor.

    The lock lasts until every process holding the descriptor has closed it or died.
    """
    with open(directory / _LOCK_NAME, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield handle.fileno()


def _remove_stale_temp_dirs(directory: Path) -> None:
    """Delete temporary folders of killed runs; only call while holding the fetch lock."""
    for leftover in directory.glob(f"{_TMP_PREFIX}*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _download(mvn: str, artifact: Artifact, target: Path, lock_fd: int) -> None:
    """Download one artifact with Maven and atomically rename it to ``target``.

    ``lock_fd`` (the fetch lock) is passed on to Maven so the lock outlives this process if it
    is killed while Maven still writes into the temporary folder.
    """
    tmp = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=target.parent))
    try:
        command = [
            mvn,
            "-q",
            "-B",
            "--strict-checksums",
            _MVN_COPY_GOAL,
            f"-Dartifact={artifact.coordinate}",
            f"-DoutputDirectory={tmp}",
        ]
        # Run inside the empty temporary folder so no pom.xml in the caller's cwd is used.
        result = subprocess.run(
            command, cwd=tmp, capture_output=True, text=True, check=False, pass_fds=(lock_fd,)
        )
        downloaded = tmp / artifact.file_name
        if result.returncode != 0 or not downloaded.is_file():
            output = (result.stdout + result.stderr).strip()
            tail = "\n".join(output.splitlines()[-15:])
            raise JarFetchError(
                f"Maven could not download {artifact.coordinate} "
                f"(exit code {result.returncode}):\n{tail}"
            )
        if not zipfile.is_zipfile(downloaded):
            raise JarFetchError(f"Maven returned a corrupt jar for {artifact.coordinate}")
        with open(downloaded, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(downloaded, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

"""The driver JVM's class archive (the JDK's class-data sharing, CDS): the classes a Spark driver
with Delta Lake loads, mapped from one file at start instead of read, parsed and verified from
the jars again by every process. On a 2-core machine that is about 3 of the 6 seconds a Spark
session takes to start, in every ``ckpt`` command, Airflow task and test process.

Set-up builds it (:func:`build`, from ``setup_main``): a training process
(:mod:`~checkpoint_lib.spark.jvm_training`) starts a driver with ``-XX:ArchiveClassesAtExit``, runs
the kinds of work our jobs run, and the JVM writes the classes it loaded when it exits. :func:`java_options` gives every later driver
``-XX:SharedArchiveFile`` when the archive of this JVM, Spark and jar set exists (its name holds
their digest, so a changed JDK or pin is simply a missing archive until set-up runs again); the
JVM also checks the archive against itself and ignores one that does not match. An archive is an
optimisation only: none, or one refused, is a slower start, never an error.

``CKPT_JVM_ARCHIVE=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .switches import switched_on

ARCHIVE_ENV = "CKPT_JVM_ARCHIVE"
_PREFIX = "driver-classes-"
_QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")  # a refused archive is a slower start, not a warning
TRAINING = "checkpoint_lib.spark.jvm_training"
"""The training run's module (run as a process: it starts a driver of its own)."""


def enabled() -> bool:
    return switched_on(ARCHIVE_ENV)


def _java() -> Path | None:
    """The java spark-submit runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def _spark_jars() -> list[Path]:
    import pyspark

    return sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))


def archive_path(jars: Sequence[Path], directory: Path) -> Path | None:
    """Where, in the jar folder ``directory``, the archive of this JVM, pyspark and ``jars`` (the
    session's ``spark.jars``) lives; None when no java is found. The name is a digest of what the
    archive depends on."""
    java = _java()
    if java is None:
        return None
    digest = hashlib.sha256()
    for path in (java, *_spark_jars(), *sorted(Path(j) for j in jars)):
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_size}\0{int(stat.st_mtime)}\n".encode())
    return directory / f"{_PREFIX}{digest.hexdigest()[:16]}.jsa"


def quoted(option: str) -> str:
    """One JVM option in ``extraJavaOptions``, which Spark splits on whitespace unless quoted."""
    return f'"{option}"' if any(c.isspace() for c in option) else option


def java_options(jars: Sequence[Path], directory: Path) -> list[str]:
    """The driver's options that map the archive, or none when there is no archive to map."""
    if not enabled():
        return []
    try:
        path = archive_path(jars, directory)
    except OSError:
        return []
    if path is None or not path.is_file():
        return []
    return [quoted(f"-XX:SharedArchiveFile={path}"), *_QUIET]


def build(jars: Sequence[Path], directory: Path, timeout: float = 600.0) -> tuple[Path | None, str]:
    """Make the archive for ``jars`` unless it exists: ``(path or None, what happened)``.

    The training JVM writes a file of its own (named by this process) and only a complete one is
    renamed into place, atomically, so a crash or two set-ups at once never leave a partial
    archive where a driver would map it. Archives of other JDKs, Sparks or jar sets are removed."""
    path = archive_path(jars, directory)
    if path is None:
        return None, "no java found"
    if path.is_file():
        return path, "present"
    started = time.monotonic()
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    env = {**os.environ, ARCHIVE_ENV: "0"}  # the training driver maps no archive: it writes one
    try:
        done = subprocess.run([sys.executable, "-m", TRAINING, str(partial)], env=env, timeout=timeout,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except subprocess.TimeoutExpired:
        partial.unlink(missing_ok=True)
        return None, f"the training run took over {timeout:.0f} s"
    if done.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
        partial.unlink(missing_ok=True)
        tail = (done.stderr or "").strip().splitlines()[-1:] or ["no archive written"]
        return None, f"the training run failed ({tail[0][:200]})"
    os.replace(partial, path)
    for other in path.parent.glob(f"{_PREFIX}*.jsa"):
        if other != path:
            other.unlink(missing_ok=True)
    return path, f"built in {time.monotonic() - started:.0f} s"

"""``ckpt doctor``: is this machine ready to run pipelines? One line per check, OK or the fix.

Each check is a function returning a :class:`Check`; :func:`diagnose` runs them in order (Java,
the Delta jars, the warehouse, the master, then a Spark session with a Delta round trip, and
Airflow). A check never creates or changes anything the user owns: the warehouse is probed with a
temporary file it removes, and the Spark check writes its table in a temporary folder.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

from .objectstore import is_remote

MIN_JAVA = 17
"""Spark 4 runs on Java 17 and 21."""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        fix = f"\n       fix: {self.fix}" if self.fix else ""
        return f"{'OK  ' if self.ok else 'FAIL'}  {self.name:<9}  {self.detail}{fix}"


def java() -> Check:
    """The Java that Spark will start: ``$JAVA_HOME/bin/java``, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    path = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    fix = f"install a Java {MIN_JAVA} or 21 runtime (Debian: apt-get install openjdk-17-jre-headless) " \
          "and put it on PATH or set JAVA_HOME"
    if not path or not os.access(path, os.X_OK):
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on PATH"
        return Check("java", False, where, fix)
    try:
        out = subprocess.run([path, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("java", False, f"{path} did not run: {exc}", fix)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        return Check("java", False, f"{path} -version said nothing recognisable", fix)
    major = int(m.group(2)) if m.group(1) == "1" else int(m.group(1))  # "1.8" is Java 8
    if major < MIN_JAVA:
        return Check("java", False, f"Java {major} at {path}: Spark 4 needs {MIN_JAVA} or newer", fix)
    return Check("java", True, f"Java {major} ({path})")


def jars() -> Check:
    """Every jar present (Delta's and S3A's), with the bytes its pinned SHA-256 names; whether the
    S3 log store was built."""
    from .spark import jars as delta_jars

    directory = delta_jars.jar_dir()
    fix = "run `make setup` (or `ckpt setup`)"
    missing = delta_jars.missing_jars(directory)
    if missing:
        return Check("jars", False, f"{len(missing)} of {len(delta_jars.ARTIFACTS)} missing from {directory}: "
                     f"{', '.join(missing)}", fix)
    foreign = [a.file_name for a in delta_jars.ARTIFACTS
               if hashlib.sha256((directory / a.file_name).read_bytes()).hexdigest() != a.sha256]
    if foreign:
        return Check("jars", False, f"not the pinned bytes (SHA-256): {', '.join(foreign)} in {directory}",
                     f"delete {'them' if len(foreign) > 1 else 'it'} and {fix}")
    logstore = ("the S3 log store built" if delta_jars.logstore_jar(directory).is_file()
                else "no S3 log store (no JDK at set-up: s3:// warehouses are refused)")
    from .spark import jvm_archive

    archive = jvm_archive.java_options(delta_jars.ensure_jars(directory), directory)
    classes = ("the driver's class archive built" if archive else
               "no driver class archive (Spark starts a few seconds slower: `ckpt setup` builds it)"
               if jvm_archive.enabled() else "the driver's class archive turned off")
    return Check("jars", True, f"{len(delta_jars.ARTIFACTS)} jars (Delta {delta_jars.DELTA_JAR_VERSION}, S3A) in "
                 f"{directory}, {logstore}, {classes}")


def warehouse(path: str) -> Check:
    """The warehouse can be written: probed with a temporary file; a missing one needs a
    writable parent (``ckpt run`` creates it), and is not created here. On an object store: the
    store honours conditional puts (a probe object created twice, then deleted) and, for ``s3://``,
    the conditional Delta log store was built."""
    if is_remote(path):
        return _remote_warehouse(path)
    target = Path(path).expanduser().absolute()
    if target.exists() and not target.is_dir():
        return Check("warehouse", False, f"{target} is a file, not a folder", "choose another --warehouse")
    probe = target
    while not probe.exists():
        probe = probe.parent
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".ckpt-doctor-"):
            pass
    except OSError as exc:
        return Check("warehouse", False, f"{probe} is not writable: {exc.strerror or exc}",
                     f"give this user write access to {probe}, or choose another --warehouse")
    if probe != target:
        return Check("warehouse", True, f"{target} does not exist yet; `ckpt run` creates it (in {probe}, writable)")
    return Check("warehouse", True, f"{target} is writable")


def _remote_warehouse(uri: str) -> Check:
    from .objectstore import ConditionalPutUnsupported, cloud_of, verify_conditional_put
    from .spark.jars import LogStoreMissingError, require_logstore

    try:
        verify_conditional_put(uri.rstrip("/"))
    except ConditionalPutUnsupported as exc:
        return Check("warehouse", False, str(exc), "use a store that enforces If-None-Match: * (docs/object-storage.md)")
    except Exception as exc:  # noqa: BLE001 - unreachable, no credentials, no such bucket
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Check("warehouse", False, f"{uri}: {first}",
                     "check AWS_ENDPOINT_URL / AWS_REGION and the keys (or the ckpt_storage connection), and that the bucket exists")
    if cloud_of(uri) == "s3":
        try:
            require_logstore()
        except LogStoreMissingError as exc:
            return Check("warehouse", False, str(exc), "install a JDK and run `make setup` (or `ckpt setup`)")
    return Check("warehouse", True, f"{uri} is reachable and honours conditional puts")


def master(url: str) -> Check:
    """A ``spark://`` master answers on its port; ``local`` needs nothing; others are not probed."""
    if url.startswith("local"):
        return Check("master", True, f"{url} (in this process)")
    if not url.startswith("spark://"):
        return Check("master", True, f"{url}: not probed (only local and spark:// masters are)")
    hosts = [h.strip() for h in url.removeprefix("spark://").split(",")]
    for host in hosts:
        parsed = urlparse(f"spark://{host}")
        try:
            with socket.create_connection((parsed.hostname, parsed.port or 7077), timeout=3):
                return Check("master", True, f"{url} answers ({host})")
        except OSError:
            continue
    return Check("master", False, f"nothing answers at {url}",
                 "start the master (docker compose up spark-master, or sbin/start-master.sh), or pass "
                 "the right --master / CKPT_SPARK_MASTER")


def spark(url: str) -> Check:
    """A Spark session starts with Delta, and writes and reads a one-row Delta table."""
    started = time.monotonic()
    try:
        from .spark.session import get_spark

        session = get_spark(master=url, app_name="ckpt-doctor", ui=False)
        with tempfile.TemporaryDirectory(prefix="ckpt-doctor-") as tmp:
            session.range(1).write.format("delta").save(f"{tmp}/t")
            rows = session.read.format("delta").load(f"{tmp}/t").count()
    except Exception as exc:  # noqa: BLE001 - every failure is the answer here
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Check("spark", False, f"{type(exc).__name__}: {first[:300]}",
                     "fix the checks above first; then run again with --debug for Spark's own output")
    if rows != 1:
        return Check("spark", False, f"a Delta table written with 1 row read back {rows}", "report this as a bug")
    return Check("spark", True, f"session on {url} with Delta, a table written and read in "
                 f"{time.monotonic() - started:.1f} s")


def airflow() -> Check:
    """apache-airflow is installed, and where its home is (the DAGs come from this checkout)."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        airflow_version = version("apache-airflow")
    except PackageNotFoundError:
        return Check("airflow", False, "apache-airflow is not installed",
                     "pip install 'checkpoint_lib[airflow]' (make setup installs it)")
    home = Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow")
    state = "exists" if home.is_dir() else "not created yet (`airflow db migrate` creates it)"
    return Check("airflow", True, f"apache-airflow {airflow_version}; AIRFLOW_HOME {home} {state}")


def postgres(environ: dict[str, str] | None = None, now: float | None = None) -> Check | None:
    """The PostgreSQL connections of the environment (``AIRFLOW_CONN_<ID>``, as PostgreSQL sinks
    read them): each reachable, and no sink's prepared transaction older than
    :data:`~checkpoint_lib.spark.postgres_sink.STALE_PREPARED_S` (a pipeline stopped between a
    prepare and its commit holds the rows' locks). None when no such connection is configured."""
    env = os.environ if environ is None else environ
    connections = {k[len("AIRFLOW_CONN_"):].lower(): v for k, v in env.items()
                   if k.startswith("AIRFLOW_CONN_") and v.strip().startswith(("postgres://", "postgresql://"))}
    if not connections:
        return None
    from .spark.postgres_sink import PostgresConfigurationError, held_message, held_prepares, where

    held, problems = [], []
    for name, uri in sorted(connections.items()):
        try:
            held += held_prepares(uri, where(uri, name), now=now)
        except PostgresConfigurationError as exc:
            problems.append(str(exc))
    if problems:
        return Check("postgres", False, "; ".join(problems), "check the connection's host, port, user and password")
    if held:
        held.sort(key=lambda h: -h.age_s)
        pipelines = sorted({h.pipeline for h in held})
        return Check("postgres", False, held_message(held),
                     f"run pipeline(s) {', '.join(pipelines)} (a run's recovery commits what its checkpoint owns "
                     "and rolls back the rest)")
    return Check("postgres", True, f"{len(connections)} PostgreSQL connection(s) reachable, no stale prepared "
                                   "transaction")


def diagnose(warehouse_path: str, master_url: str, *, with_spark: bool = True,
             progress: Callable[[Check], None] | None = None) -> list[Check]:
    """Every check, in order; Spark is started only when Java and the jars are fine."""
    checks: list[Check] = []

    def run(check: Check) -> None:
        checks.append(check)
        if progress:
            progress(check)

    for probe in (java, jars):
        run(probe())
    run(warehouse(warehouse_path))
    run(master(master_url))
    if with_spark:
        if all(c.ok for c in checks if c.name in ("java", "jars", "master")):
            run(spark(master_url))
        else:
            run(Check("spark", False, "not started: a check above failed", "fix the checks above first"))
    run(airflow())
    database = postgres()
    if database is not None:
        run(database)
    return checks


def to_json(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]

"""One shared SparkSession per process, with Delta Lake, started offline from local jars.

Use :func:`get_spark` everywhere instead of ``SparkSession.builder``: the first call starts the
session (a few seconds), later calls return the same one. The Delta jars come from
:func:`checkpoint_lib.spark.jars.ensure_jars` through ``spark.jars``, so no network is needed;
a missing jar raises :class:`~checkpoint_lib.spark.jars.MissingJarsError` telling you to run
``make setup``, instead of Spark's ``DATA_SOURCE_NOT_FOUND ... delta``.

Environment variables (arguments win over them):

``CKPT_SPARK_MASTER``        master URL (``local[2]``, ``spark://host:7077``); default ``local[*]``
``CKPT_SPARK_UI``            ``0`` (or ``false``/``no``/``off``) disables the Spark UI
``CKPT_SHUFFLE_PARTITIONS``  ``spark.sql.shuffle.partitions``; default 8
``CKPT_DRIVER_MEMORY``       ``spark.driver.memory``; default ``2g``
``CKPT_SPARK_LOG``           ``quiet`` (default): Spark's known noise at ERROR (``log4j2-quiet.properties``);
                             ``spark`` (``ckpt --debug``): Spark's own default log profile
``CKPT_JVM_ARCHIVE``         ``0`` starts the driver without its class archive (:mod:`~checkpoint_lib.spark.jvm_archive`)

pyspark is imported only when a session is started.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from checkpoint_lib.objectstore import cloud_of
from checkpoint_lib.spark import jvm_archive
from checkpoint_lib.spark.jars import LOGSTORE_CLASS, SPARK_MINOR_VERSION, ensure_jars, jar_dir, require_logstore
from checkpoint_lib.spark.switches import switched_on

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["get_spark", "resolve_master", "s3a_conf", "session_conf", "stop_spark", "use_warehouse"]

MASTER_ENV = "CKPT_SPARK_MASTER"
UI_ENV = "CKPT_SPARK_UI"
SHUFFLE_PARTITIONS_ENV = "CKPT_SHUFFLE_PARTITIONS"
DRIVER_MEMORY_ENV = "CKPT_DRIVER_MEMORY"
LOG_ENV = "CKPT_SPARK_LOG"
QUIET_LOG_CONFIG = Path(__file__).with_name("log4j2-quiet.properties")

DEFAULT_MASTER = "local[*]"
DEFAULT_SHUFFLE_PARTITIONS = 8
# Delta rebuilds a table's state (its log replayed into the list of live files) in a Spark job
# with 50 partitions by default, on every new version a command reads. Our tables' logs hold
# thousands of actions, not millions: 2 partitions replay them in one wave of tasks. Measured on a
# 2,000-row MERGE target, 2 instead of 8 takes a MERGE from 2.2-2.9 s to 1.5-2.1 s.
SNAPSHOT_PARTITIONS = 2
DEFAULT_DRIVER_MEMORY = "2g"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"

SHORT_LIVED_JIT = "-XX:TieredStopAtLevel=1"
"""The driver of a command that runs seconds on small data (``ckpt validate`` of a warehouse
whose tables the driver reads) compiles with C1 only: C2's optimising compiles take CPU from the
command on 2 cores and pay off only in long runs. On the demo's warehouse, 3 of 29 s."""

_lock = threading.RLock()
_session: SparkSession | None = None


def resolve_master(master: str | None = None) -> str:
    """Return ``master``, else ``$CKPT_SPARK_MASTER``, else ``local[*]``."""
    return master or os.environ.get(MASTER_ENV) or DEFAULT_MASTER


def catalog_dir() -> Path:
    """Where Spark's catalog keeps its (unused) managed tables: a folder per user in the system's
    temporary directory, never the current folder (Spark's default, ``./spark-warehouse``)."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"checkpoint_lib-{os.getuid() if hasattr(os, 'getuid') else 'user'}" / \
        "spark-warehouse"


def session_conf(
    master: str,
    app_name: str = "checkpoint_lib",
    ui: bool | None = None,
    extra_conf: Mapping[str, str] | None = None,
    jars: Sequence[Path] = (),
    short_lived: bool = False,
) -> dict[str, str]:
    """Return the Spark configuration :func:`get_spark` starts a session with.

    Pure: reads the environment and looks for the driver's class archive
    (:mod:`~checkpoint_lib.spark.jvm_archive`) but starts nothing and does not check the jars.
    Entries of ``extra_conf`` override the defaults, except ``spark.jars`` and
    ``spark.driver.extraJavaOptions``, which are appended to ours rather than replacing them.
    ``short_lived``: see :data:`SHORT_LIVED_JIT`.
    """
    local = master.startswith("local")
    conf = {
        "spark.master": master,
        "spark.app.name": app_name,
        # Delta Lake from jars on local disk: offline, nothing resolved at start-up.
        "spark.jars": ",".join(str(Path(jar).resolve()) for jar in jars),
        "spark.sql.extensions": DELTA_EXTENSION,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
        # Should someone add spark.jars.packages, keep Ivy's cache out of the home directory.
        "spark.jars.ivy": str(jar_dir() / ".ivy"),
        "spark.ui.enabled": _bool_conf(_ui_enabled(ui)),
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": os.environ.get(DRIVER_MEMORY_ENV) or DEFAULT_DRIVER_MEMORY,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(_shuffle_partitions()),
        "spark.databricks.delta.snapshotPartitions": str(SNAPSHOT_PARTITIONS),
        # What we cache is one step's rows, read by the writes of that step and then dropped:
        # compressing it (dictionary and run-length encoders, which gather statistics over every
        # value) cost a sixth of a 1M-row step's CPU, for memory we have.
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # Every table of ours is a path; Spark's catalog would still make `spark-warehouse/` in the
        # current folder of whoever ran a command. Its folder lives in the temporary directory.
        "spark.sql.warehouse.dir": str(catalog_dir()),
        # Delta 4 refuses to read (or RESTORE) a version older than the table's
        # deletedFileRetentionDuration (7 days by default), VACUUMed or not. A rollback to a
        # checkpoint or savepoint, and the quality suites after a restore, read sinks and sources
        # as that checkpoint left them, which for a weekly pipeline is older than that. A version
        # whose files a VACUUM did delete still fails to read (missing file), so nothing is read wrong.
        "spark.databricks.delta.vacuum.enforceTimeTravelWithinDeletedFileRetentionDuration": "false",
        # A Python UDF is Arrow-evaluated by default since Spark 4.0, and in pyspark 4.2.0 (the
        # newest delta-spark 4.4 takes) the columnar Arrow runner, which evaluates a UDF over a file
        # scan, hangs its task forever (SPARK-58241, fixed after 4.2.0): a user's map() filtering
        # landing rows with a Python UDF would never finish. Pickled UDFs by default; a UDF declared
        # with useArrow=True still chooses Arrow.
        "spark.sql.execution.pythonUDF.arrow.enabled": "false",
    }
    if any(Path(jar).name.startswith("hadoop-aws-") for jar in jars):
        # s3:// paths through the S3A connector (as on EMR), so a warehouse URI is the same string
        # for Spark, delta-rs and obstore; Delta commits there with a conditional put.
        conf["spark.hadoop.fs.s3.impl"] = "org.apache.hadoop.fs.s3a.S3AFileSystem"
        conf["spark.hadoop.fs.AbstractFileSystem.s3.impl"] = "org.apache.hadoop.fs.s3a.S3A"
    if any(Path(jar).name.startswith("checkpoint-lib-s3-logstore-") for jar in jars):
        conf["spark.delta.logStore.s3.impl"] = LOGSTORE_CLASS
        conf["spark.delta.logStore.s3a.impl"] = LOGSTORE_CLASS
    if local:
        # A local driver never needs to be reached from elsewhere; binding to loopback avoids
        # failures on hosts whose name does not resolve.
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    java = []
    if (os.environ.get(LOG_ENV) or "quiet") == "quiet":  # read when this process starts the driver's JVM
        java.append(f"-Dlog4j2.configurationFile={QUIET_LOG_CONFIG.as_uri()}")
    java += jvm_archive.java_options(jars, jar_dir())
    if short_lived:
        java.append(SHORT_LIVED_JIT)
    if java:
        conf["spark.driver.extraJavaOptions"] = " ".join(java)
    for key, value in (extra_conf or {}).items():
        if key in ("spark.jars", "spark.driver.extraJavaOptions") and conf.get(key):
            conf[key] = f"{conf[key]}{',' if key == 'spark.jars' else ' '}{value}"
        else:
            conf[key] = str(value)
    return conf


def get_spark(
    master: str | None = None,
    app_name: str = "checkpoint_lib",
    ui: bool | None = None,
    extra_conf: Mapping[str, str] | None = None,
    short_lived: bool = False,
) -> SparkSession:
    """Return the process-wide SparkSession with Delta Lake, starting it on first use.

    ``master`` defaults to ``$CKPT_SPARK_MASTER``, then ``local[*]``; ``spark://host:port``
    works as well. ``ui`` ``None`` means "enabled unless ``CKPT_SPARK_UI=0``".

    Once a session runs, later calls return it: asking explicitly for another master raises
    :class:`RuntimeError` (call :func:`stop_spark` first), and ``extra_conf`` entries are set
    on it when Spark allows changing them at run time (:class:`ValueError` otherwise).
    ``short_lived`` (:data:`SHORT_LIVED_JIT`) applies only when this call starts the JVM.

    Raises :class:`~checkpoint_lib.spark.jars.MissingJarsError` when the Delta jars have not
    been fetched (``make setup``).
    """
    global _session
    with _lock:
        if _session is not None and _is_running(_session):
            running = _session.sparkContext.master
            if master is not None and master != running:
                raise RuntimeError(
                    f"a Spark session with master {running!r} is already running; "
                    f"call stop_spark() before asking for {master!r}"
                )
            _apply_runtime_conf(_session, extra_conf or {})
            return _session

        jars = ensure_jars()
        conf = session_conf(resolve_master(master), app_name, ui, extra_conf, jars, short_lived)

        import pyspark
        from pyspark.sql import SparkSession

        if not pyspark.__version__.startswith(f"{SPARK_MINOR_VERSION}."):
            raise RuntimeError(
                f"the Delta jars are built for Spark {SPARK_MINOR_VERSION}, but pyspark "
                f"{pyspark.__version__} is installed; run `make setup` to restore the pins"
            )
        # Python workers default to `python3` on PATH, which may lack this environment's
        # packages; use this interpreter unless the caller chose one.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = SparkSession.Builder()  # a fresh builder: SparkSession.builder is shared
        for key, value in conf.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        extensions = session.sparkContext.getConf().get("spark.sql.extensions", "")
        if DELTA_EXTENSION not in extensions:
            raise RuntimeError(
                "a SparkSession without Delta Lake was already running in this process "
                "(started outside checkpoint_lib.spark.session); stop it before get_spark()"
            )
        _session = session
        return session


def s3a_conf(env: Mapping[str, str]) -> dict[str, str]:
    """The Hadoop settings of S3A from the standard variables delta-rs and obstore read (pure):
    ``AWS_ENDPOINT_URL`` (an S3-compatible server: path-style requests, TLS only for https),
    ``AWS_REGION``, and the keys ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (+
    ``AWS_SESSION_TOKEN``). Without keys S3A's default chain applies (profile, instance role)."""
    conf: dict[str, str] = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        conf["fs.s3a.endpoint"] = endpoint
        conf["fs.s3a.connection.ssl.enabled"] = "false" if endpoint.startswith("http://") else "true"
        virtual = env.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "false").lower() in ("1", "true", "yes")
        conf["fs.s3a.path.style.access"] = "false" if virtual else "true"
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        conf["fs.s3a.endpoint.region"] = region
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        conf["fs.s3a.access.key"] = env["AWS_ACCESS_KEY_ID"]
        conf["fs.s3a.secret.key"] = env["AWS_SECRET_ACCESS_KEY"]
        if env.get("AWS_SESSION_TOKEN"):
            conf["fs.s3a.session.token"] = env["AWS_SESSION_TOKEN"]
            conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        else:
            conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    return conf


def use_warehouse(spark: SparkSession, warehouse: str) -> None:
    """Make ``spark`` able to work in ``warehouse``: nothing for a local one; for ``s3://`` the S3A
    settings of this process's environment (read now, so credentials a caller exported after the
    JVM started count) and a refusal unless Delta commits there with a conditional put. Other
    clouds hold the control plane only, for now."""
    cloud = cloud_of(warehouse)
    if cloud is None:
        return
    if cloud != "s3":
        raise NotImplementedError(
            f"{warehouse}: Spark's data plane runs on s3:// (S3 and S3-compatible stores) so far; on "
            f"{cloud} only the control plane (ckpt history, the store) does. See docs/object-storage.md.")
    logstore = spark.sparkContext.getConf().get("spark.delta.logStore.s3.impl", None)
    if logstore != LOGSTORE_CLASS:
        require_logstore()  # names the fix when set-up could not build it
        raise RuntimeError(
            f"{warehouse}: this Spark session was started without {LOGSTORE_CLASS} (it was started "
            "before set-up built it, or outside checkpoint_lib.spark.session); Delta's stock S3 log store "
            "would let two writers overwrite each other's commit. Start it with get_spark().")
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3a_conf(os.environ).items():
        hadoop.set(key, value)


def stop_spark() -> None:
    """Stop the shared session, if any; the next :func:`get_spark` starts a new one."""
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None


def _is_running(session: SparkSession) -> bool:
    """False once the session's SparkContext was stopped (pyspark then drops its JVM handle)."""
    return getattr(session.sparkContext, "_jsc", None) is not None


def _apply_runtime_conf(session: SparkSession, conf: Mapping[str, str]) -> None:
    for key, value in conf.items():
        value = str(value)
        if session.conf.get(key, None) == value:
            continue
        if not session.conf.isModifiable(key):
            raise ValueError(
                f"{key} cannot change on the running Spark session; "
                "call stop_spark() first, then get_spark() with the new setting"
            )
        session.conf.set(key, value)


def _ui_enabled(ui: bool | None) -> bool:
    if ui is not None:
        return ui
    return switched_on(UI_ENV)


def _shuffle_partitions() -> int:
    raw = os.environ.get(SHUFFLE_PARTITIONS_ENV)
    if not raw:
        return DEFAULT_SHUFFLE_PARTITIONS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{SHUFFLE_PARTITIONS_ENV} must be a positive integer, got {raw!r}")
    return value


def _bool_conf(value: bool) -> str:
    return "true" if value else "false"

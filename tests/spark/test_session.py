"""Tests of the Delta jar cache and the shared SparkSession.

Only the tests marked ``spark`` start a JVM. The jar tests download over real HTTP: from a Maven
repository layout served on 127.0.0.1 (good, tampered, truncated and missing jars), and one small
pinned jar from Maven Central itself.
"""

from __future__ import annotations

import hashlib
import http.server
import socket
import threading
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from checkpoint_lib.spark import jars
from checkpoint_lib.spark.jars import MissingJarsError, ensure_jars, fetch_jars, required_jars
from checkpoint_lib.spark.session import get_spark, session_conf


@pytest.fixture
def empty_jar_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "jars"
    monkeypatch.setenv(jars.JAR_DIR_ENV, str(directory))
    return directory


class Repo:
    """A Maven repository on 127.0.0.1: each test artifact a tiny real jar at its repository path.
    ``tampered`` names are served with other bytes, ``truncated`` ones cut short (the connection
    closes before the announced length); ``requests`` records every path asked for."""

    def __init__(self, root: Path, artifacts: list[jars.Artifact]):
        self.root, self.requests = root, []
        self.tampered: set[str] = set()
        self.truncated: set[str] = set()
        self.artifacts = []
        for a in artifacts:
            path = root / a.repo_path
            path.parent.mkdir(parents=True)
            with zipfile.ZipFile(path, "w") as jar:
                jar.writestr("META-INF/MANIFEST.MF", f"Manifest-Version: 1.0\nName: {a.name}\n")
            self.artifacts.append(replace(a, sha256=hashlib.sha256(path.read_bytes()).hexdigest()))
        repo = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the http.server API)
                repo.requests.append(self.path)
                file = repo.root / self.path.removeprefix("/maven2/")
                if not file.is_file():
                    self.send_error(404)
                    return
                body = file.read_bytes()
                name = file.name
                if name in repo.tampered:
                    body = body[:-1] + bytes([body[-1] ^ 1])
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2] if name in repo.truncated else body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/maven2"


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, empty_jar_dir: Path):
    artifacts = [jars.Artifact("org.example", "alpha", "1.0", ""), jars.Artifact("org.example", "beta", "2.1", ""),
                 jars.Artifact("com.example.deep", "gamma", "0.1", "")]
    r = Repo(tmp_path / "repo", artifacts)
    monkeypatch.setattr(jars, "ARTIFACTS", tuple(r.artifacts))
    monkeypatch.setenv(jars.MAVEN_REPO_ENV, r.url + "/")
    yield r
    r.server.shutdown()


def test_required_jars_names_delta_spark() -> None:
    names = required_jars()
    assert names[0] == f"delta-spark_4.2_2.13-{jars.DELTA_JAR_VERSION}.jar"
    assert f"delta-storage-{jars.DELTA_JAR_VERSION}.jar" in names
    assert len(set(names)) == len(names)
    assert all(len(a.sha256) == 64 for a in jars.ARTIFACTS)


def test_jar_dir_follows_env(empty_jar_dir: Path) -> None:
    assert jars.jar_dir() == empty_jar_dir
    assert jars.jar_paths() == [empty_jar_dir / name for name in required_jars()]


def test_jar_dir_is_the_checkouts_cache_or_else_the_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(jars.JAR_DIR_ENV, raising=False)
    assert jars.jar_dir() == Path(jars.__file__).resolve().parents[2] / ".cache" / "jars"  # this checkout
    monkeypatch.setattr(jars, "_REPO_ROOT", tmp_path / "site-packages")  # an installed wheel: no checkout
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jars.jar_dir() == tmp_path / "xdg" / "checkpoint_lib" / "jars"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert jars.jar_dir() == tmp_path / "home" / ".cache" / "checkpoint_lib" / "jars"


def test_ensure_jars_with_empty_dir_names_the_fix(empty_jar_dir: Path) -> None:
    with pytest.raises(MissingJarsError) as info:
        ensure_jars()
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert "make setup" in message and "ckpt setup" in message
    assert all(name in message for name in required_jars())
    assert info.value.missing == required_jars()


def test_fetch_jars_downloads_missing_then_is_idempotent(repo: Repo, empty_jar_dir: Path) -> None:
    fetched = fetch_jars()
    assert [path.name for path in fetched] == required_jars() == ["alpha-1.0.jar", "beta-2.1.jar", "gamma-0.1.jar"]
    assert repo.requests == ["/maven2/org/example/alpha/1.0/alpha-1.0.jar", "/maven2/org/example/beta/2.1/beta-2.1.jar",
                             "/maven2/com/example/deep/gamma/0.1/gamma-0.1.jar"]
    assert ensure_jars() == [empty_jar_dir / name for name in required_jars()]
    assert all(zipfile.is_zipfile(p) for p in ensure_jars())
    assert not list(empty_jar_dir.glob(".fetch-*"))

    assert fetch_jars() == []
    assert len(repo.requests) == 3


def test_fetch_jars_skips_present_jars(repo: Repo, empty_jar_dir: Path) -> None:
    empty_jar_dir.mkdir()
    (empty_jar_dir / "alpha-1.0.jar").write_bytes(b"kept as is")
    assert [p.name for p in fetch_jars()] == ["beta-2.1.jar", "gamma-0.1.jar"]
    assert (empty_jar_dir / "alpha-1.0.jar").read_bytes() == b"kept as is"


def test_a_jar_with_other_bytes_than_pinned_is_refused_and_not_installed(repo: Repo, empty_jar_dir: Path) -> None:
    repo.tampered.add("beta-2.1.jar")
    with pytest.raises(jars.JarFetchError, match="is not the pinned beta-2.1.jar"):
        fetch_jars()
    assert jars.missing_jars() == ["beta-2.1.jar", "gamma-0.1.jar"]  # alpha came first and is fine
    assert not list(empty_jar_dir.glob(".fetch-*"))
    repo.tampered.clear()  # the mirror is fixed: the next run completes
    assert [p.name for p in fetch_jars()] == ["beta-2.1.jar", "gamma-0.1.jar"]


def test_a_download_cut_short_leaves_no_partial_jar_and_a_killed_runs_leftovers_go(repo: Repo,
                                                                                  empty_jar_dir: Path) -> None:
    repo.truncated.add("alpha-1.0.jar")
    with pytest.raises(jars.JarFetchError, match="could not download .*alpha-1.0.jar"):
        fetch_jars()
    assert jars.missing_jars() == required_jars()
    # a kill -9 mid-download skips the clean-up; the next run removes the leftover folder
    (empty_jar_dir / ".fetch-leftover").mkdir()
    (empty_jar_dir / ".fetch-leftover" / "alpha-1.0.jar").write_bytes(b"PK\x03\x04 half a jar")
    repo.truncated.clear()
    fetch_jars()
    assert not list(empty_jar_dir.glob(".fetch-*")) and not jars.missing_jars()


def test_an_unreachable_repository_names_the_fixes(empty_jar_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(jars.MAVEN_REPO_ENV, f"http://127.0.0.1:{port}/maven2")
    with pytest.raises(jars.JarFetchError, match=f"could not download http://127.0.0.1:{port}/maven2/io/delta/") as info:
        fetch_jars()
    assert jars.MAVEN_REPO_ENV in str(info.value) and "by hand" in str(info.value)
    assert jars.missing_jars() == required_jars()


def test_the_pinned_checksum_is_what_maven_central_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real repository: the smallest pinned jar, downloaded and checked (``make setup`` on a
    fresh clone downloads and checks every one of them)."""
    monkeypatch.delenv(jars.MAVEN_REPO_ENV, raising=False)
    smallest = next(a for a in jars.ARTIFACTS if a.name == "jackson-datatype-jdk8")
    monkeypatch.setattr(jars, "ARTIFACTS", (smallest,))
    assert [p.name for p in fetch_jars(tmp_path)] == [smallest.file_name]
    assert hashlib.sha256((tmp_path / smallest.file_name).read_bytes()).hexdigest() == smallest.sha256


def test_session_conf_defaults_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_SPARK_UI", "0")
    monkeypatch.setenv("CKPT_SHUFFLE_PARTITIONS", "3")
    monkeypatch.delenv("CKPT_DRIVER_MEMORY", raising=False)
    conf = session_conf(
        "spark://127.0.0.1:7077",
        jars=[Path("/j/a.jar"), Path("/j/b.jar")],
        extra_conf={"spark.jars": "/x/c.jar"},
    )
    assert conf["spark.master"] == "spark://127.0.0.1:7077"
    assert conf["spark.jars"] == "/j/a.jar,/j/b.jar,/x/c.jar"
    assert "spark.jars.packages" not in conf
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.ui.enabled"] == "false"
    assert conf["spark.sql.shuffle.partitions"] == "3"
    assert conf["spark.driver.memory"] == "2g"
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert session_conf("local[1]", ui=True)["spark.ui.enabled"] == "true"


def test_session_conf_rejects_bad_partition_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_SHUFFLE_PARTITIONS", "many")
    with pytest.raises(ValueError, match="CKPT_SHUFFLE_PARTITIONS"):
        session_conf("local[1]")


@pytest.mark.spark
def test_a_python_udf_filtering_a_delta_table_finishes(spark, tmp_path: Path) -> None:
    """A map() that filters landing rows with a Python UDF: Arrow-evaluated over a file scan it hung
    its task forever on pyspark 4.2.0 (SPARK-58241); the session evaluates UDFs pickled by default."""
    import threading

    from pyspark.sql import functions as F

    path = str(tmp_path / "t")
    spark.range(4).write.format("delta").save(path)
    keep = F.udf(lambda x: x, "long")  # useArrow left to the session, as users write it
    counted: list[int] = []
    job = threading.Thread(target=lambda: counted.append(
        spark.read.format("delta").load(path).where(keep(F.col("id")) <= 1).count()), daemon=True)
    job.start()
    job.join(180)
    assert counted == [2], "a Python UDF in a filter over a Delta scan did not finish in 180 s"
    assert spark.conf.get("spark.sql.execution.pythonUDF.arrow.enabled") == "false"


@pytest.mark.spark
def test_delta_round_trip_and_history(spark, tmp_path: Path) -> None:
    path = str(tmp_path / "table")
    rows = [(1, "a"), (2, "b"), (3, "c")]
    spark.createDataFrame(rows, "id INT, name STRING").write.format("delta").save(path)

    back = spark.read.format("delta").load(path)
    assert sorted((r.id, r.name) for r in back.collect()) == rows

    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    assert [(h.version, h.operation) for h in history] == [(0, "WRITE")]
    assert (tmp_path / "table" / "_delta_log" / "00000000000000000000.json").is_file()


@pytest.mark.spark
def test_session_is_shared_and_configured(spark) -> None:
    assert get_spark() is spark
    assert spark.sparkContext.master == "local[2]"
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.catalog.spark_catalog").endswith("DeltaCatalog")
    assert spark.sparkContext.getConf().get("spark.ui.enabled") == "false"
    with pytest.raises(RuntimeError, match="stop_spark"):
        get_spark(master="local[1]")


def test_s3a_settings_come_from_the_standard_variables() -> None:
    from checkpoint_lib.spark.session import s3a_conf

    assert s3a_conf({}) == {}
    conf = s3a_conf({"AWS_ENDPOINT_URL": "http://127.0.0.1:8333", "AWS_REGION": "eu-west-1",
                     "AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret"})
    assert conf == {"fs.s3a.endpoint": "http://127.0.0.1:8333", "fs.s3a.connection.ssl.enabled": "false",
                    "fs.s3a.path.style.access": "true", "fs.s3a.endpoint.region": "eu-west-1",
                    "fs.s3a.access.key": "id", "fs.s3a.secret.key": "secret",
                    "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"}
    temporary = s3a_conf({"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t",
                          "AWS_ENDPOINT_URL": "https://s3.example", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true"})
    assert temporary["fs.s3a.session.token"] == "t" and temporary["fs.s3a.connection.ssl.enabled"] == "true"
    assert temporary["fs.s3a.path.style.access"] == "false"
    assert temporary["fs.s3a.aws.credentials.provider"].endswith("TemporaryAWSCredentialsProvider")


def test_a_session_maps_s3_to_s3a_and_commits_there_with_the_conditional_log_store(tmp_path: Path) -> None:
    from checkpoint_lib.spark.session import session_conf

    plain = session_conf("local[1]", jars=[tmp_path / "delta-spark_4.2_2.13-4.4.0.jar"])
    assert "spark.hadoop.fs.s3.impl" not in plain and "spark.delta.logStore.s3.impl" not in plain
    conf = session_conf("local[1]", jars=[tmp_path / "hadoop-aws-3.5.0.jar", jars.logstore_jar(tmp_path)])
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert conf["spark.delta.logStore.s3.impl"] == conf["spark.delta.logStore.s3a.impl"] == jars.LOGSTORE_CLASS


def test_the_log_store_is_built_once_by_javac_and_its_absence_is_named(tmp_path: Path, monkeypatch) -> None:
    real = Path(__file__).resolve().parents[2] / ".cache" / "jars"
    (tmp_path / f"delta-storage-{jars.DELTA_JAR_VERSION}.jar").symlink_to(real / f"delta-storage-{jars.DELTA_JAR_VERSION}.jar")
    with pytest.raises(jars.LogStoreMissingError, match="install a JDK"):
        jars.require_logstore(tmp_path)
    built = jars.build_logstore(tmp_path)
    assert built == jars.logstore_jar(tmp_path) == jars.require_logstore(tmp_path)
    with zipfile.ZipFile(built) as jar:
        assert "io/checkpointlib/delta/S3ConditionalLogStore.class" in jar.namelist()
    assert jars.build_logstore(tmp_path) == built and not list(tmp_path.glob(".fetch-*"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    built.unlink()
    assert jars.build_logstore(tmp_path) is None  # no JDK: set-up says so, and s3:// is refused


def test_a_driver_maps_the_class_archive_only_when_it_is_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's options name the class archive of this JVM, pyspark and jar set when set-up built
    it, none otherwise (no archive, or ``CKPT_JVM_ARCHIVE=0``), quoted when its folder has a space;
    a short-lived command also compiles with C1 only."""
    from checkpoint_lib.spark import jvm_archive
    from checkpoint_lib.spark.session import SHORT_LIVED_JIT

    directory = tmp_path / "a jar dir"
    directory.mkdir()
    monkeypatch.setenv(jars.JAR_DIR_ENV, str(directory))
    monkeypatch.delenv(jvm_archive.ARCHIVE_ENV, raising=False)
    jar = directory / "x.jar"
    jar.write_bytes(b"jar")

    def options(**kw) -> str:
        return session_conf("local[1]", jars=[jar], **kw).get("spark.driver.extraJavaOptions", "")

    assert "SharedArchiveFile" not in options()
    path = jvm_archive.archive_path([jar], directory)
    assert path is not None and path.parent == directory
    path.write_bytes(b"archive")
    assert f'"-XX:SharedArchiveFile={path}"' in options()
    assert SHORT_LIVED_JIT not in options() and SHORT_LIVED_JIT in options(short_lived=True)
    jar.write_bytes(b"another jar")  # another jar set: another archive, not this one
    assert jvm_archive.archive_path([jar], directory) != path and "SharedArchiveFile" not in options()
    monkeypatch.setenv(jvm_archive.ARCHIVE_ENV, "0")
    assert "SharedArchiveFile" not in options()


def test_a_failed_training_run_leaves_no_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A training run that fails (or writes nothing) leaves neither an archive nor its partial file:
    a driver never maps half an archive."""
    import subprocess

    from checkpoint_lib.spark import jvm_archive

    monkeypatch.setenv(jars.JAR_DIR_ENV, str(tmp_path))
    jar = tmp_path / "x.jar"
    jar.write_bytes(b"jar")

    def failing(args, **kwargs):
        Path(args[-1]).write_bytes(b"half an archive")
        return subprocess.CompletedProcess(args, 1, "", "Traceback ...\nRuntimeError: killed")

    monkeypatch.setattr(jvm_archive.subprocess, "run", failing)
    path, said = jvm_archive.build([jar], tmp_path)
    assert path is None and "RuntimeError: killed" in said
    assert not list(tmp_path.glob("*.jsa")) and not list(tmp_path.glob("*partial*"))


@pytest.mark.spark
def test_the_running_driver_maps_the_archive_set_up_built(spark) -> None:
    """Set-up (``make setup``, before every test run) built the archive of this session's JVM and
    jars, and the driver JVM has it mapped (its ``/proc/<pid>/maps``): the archive is in use, not
    only named."""
    from checkpoint_lib.spark import jvm_archive

    path = jvm_archive.archive_path(ensure_jars(), jars.jar_dir())
    assert path is not None and path.is_file(), "set-up did not build the driver's class archive"
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    assert str(path.resolve()) in Path(f"/proc/{pid}/maps").read_text()  # the file the JVM mapped (its real path)


QUIET_LOG_PROBE = """
import pyarrow as pa
from checkpoint_lib.spark.session import get_spark
spark = get_spark(master="local[1]", ui=False)
frame = spark.createDataFrame(pa.table({"s": ["x" * 100] * 100_000}))
assert frame.cache().count() == 100_000
frame.cache()  # again (a validation loads one table at two equal versions)
try:
    spark.range(1).rdd.map(lambda _: 1 // 0).collect()
except Exception as exc:
    assert "ZeroDivisionError" in str(exc)
else:
    raise AssertionError("the task did not fail")
"""


@pytest.mark.spark
def test_the_quiet_log_drops_the_note_on_a_local_tables_large_tasks_and_keeps_a_failed_tasks(tmp_path) -> None:
    """A validation's small tables, read by delta-rs, become local DataFrames whose tasks carry their
    rows (``quality/context.py::_driver_read``), and Spark warned "contains a task of very large
    size" for every stage over them (eight lines in ``make demo``), and "Asked to cache already
    cached data" for a table loaded at two equal versions: intended, so not shown; a failing
    task's warning from the same logger still is. A driver of its own (the log profile is
    the JVM's, read at its start)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "CKPT_SPARK_LOG"}
    proc = subprocess.run([sys.executable, "-c", QUIET_LOG_PROBE], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "task of very large size" not in proc.stderr and "already cached" not in proc.stderr
    assert "Lost task" in proc.stderr, proc.stderr[-3000:]

"""Delta Lake and S3A jars on local disk, so Spark sessions start offline.

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

:data:`S3A_ARTIFACTS` is Spark's S3A connector for a warehouse on ``s3://``: ``hadoop-aws`` of
pyspark's Hadoop (3.5.0) and its runtime closure resolved the same way, with the AWS SDK v2 as the
modules S3A loads rather than the 654 MiB ``bundle`` hadoop-aws's pom names.
:func:`build_logstore` compiles the conditional-put Delta log store for S3 next to them
(``javac``: set-up notes its absence, and an ``s3://`` warehouse is then refused).

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
    "DELTA_ARTIFACTS",
    "LOGSTORE_CLASS",
    "S3A_ARTIFACTS",
    "LogStoreMissingError",
    "build_logstore",
    "logstore_jar",
    "require_logstore",
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


DELTA_ARTIFACTS: tuple[Artifact, ...] = (
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

S3A_ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("org.apache.hadoop", "hadoop-aws", "3.5.0",
             "66bd9eefb938b1a1657487324b63c13df2d8b17164a1dd24e0ef37b905bc5baa"),
    Artifact("software.amazon.awssdk", "s3", "2.35.4",
             "f23532c5223be9b0bfec0d72837ed09ed34dbdf8022818ba145b20076a78b4bc"),
    Artifact("software.amazon.awssdk", "sts", "2.35.4",
             "8d0f7816d3f96e3f00249f5d054d926e939a104bcf9ef57676ee0b16c59684d2"),
    Artifact("software.amazon.awssdk", "s3-transfer-manager", "2.35.4",
             "0eec78870b3d0abc509a847072cf963cb2ae6e360dc6161a9449b3398c470476"),
    Artifact("software.amazon.awssdk", "apache-client", "2.35.4",
             "6eade21b482724ed0a4613eaa95d20e47e7a81304bd28538ac427fece94a7740"),
    Artifact("software.amazon.awssdk", "netty-nio-client", "2.35.4",
             "b82f8b33e5c85273a47da45ede884d7ccb31c9c2f69e6910a76c5c48fa1275dc"),
    Artifact("software.amazon.s3.analyticsaccelerator", "analyticsaccelerator-s3", "1.3.1",
             "4959a9747cbb479c73c3ffbcd479bee5b014f8b2880994585a8693fb9d24675e"),
    Artifact("software.amazon.awssdk", "aws-xml-protocol", "2.35.4",
             "4f59176da2522c357b1993e4a890fde529f12f365795ef86269bde4a3984cd0d"),
    Artifact("software.amazon.awssdk", "protocol-core", "2.35.4",
             "f2532eca6ba2142fe4821d5decb03c83a3e15dc8bfae2240e7f2efa75f9868b5"),
    Artifact("software.amazon.awssdk", "arns", "2.35.4",
             "c63cc29f76a8527e9e10b621703163df541dc5cb315508dc2898518602c75380"),
    Artifact("software.amazon.awssdk", "profiles", "2.35.4",
             "0f4ef7ca72ccd80dd49ebeaf7f3ce60a7d7a00da59a91aeeae6e91052bbacbd8"),
    Artifact("software.amazon.awssdk", "crt-core", "2.35.4",
             "2c6aaa17bf9ccbb9d962dded4351e73decb197e3c5519970e0dae17e05d3df62"),
    Artifact("software.amazon.awssdk", "http-auth", "2.35.4",
             "3ec933a06e751a05e195eb3589209e23c44e1897263b6fcae34ef4cc63cd4491"),
    Artifact("software.amazon.awssdk", "identity-spi", "2.35.4",
             "188d73db7d4e2361654bc3c5a1b3eaeb445d0500fb012cc46c5d67975adf97bf"),
    Artifact("software.amazon.awssdk", "http-auth-spi", "2.35.4",
             "4495463406bb98eb136f2c3f3604ed5f08ec9974ebc3f34f2121b20679f61d5c"),
    Artifact("software.amazon.awssdk", "http-auth-aws", "2.35.4",
             "c4acb92fdec90bfd9b67bfab8e41b69cd152c03cacc10281a8ab464791856e01"),
    Artifact("software.amazon.awssdk", "checksums", "2.35.4",
             "94464af4374d08ecf33ca06ed4d03e1615529e547726e26b56abacefbeee7948"),
    Artifact("software.amazon.awssdk", "checksums-spi", "2.35.4",
             "88b5af85ac2d3c862be8856be4e683ab31932e4a5a3c1c45af864d2671ac7cec"),
    Artifact("software.amazon.awssdk", "retries-spi", "2.35.4",
             "668638751d059c527ddd41ffa4dcebe36a7c14860ed56776df09b861c14dc7dd"),
    Artifact("software.amazon.awssdk", "aws-query-protocol", "2.35.4",
             "9b4cf9b78977cc9f5b4ceae9c435dedbde6a055a0f8d9e053eaca945715e2a9f"),
    Artifact("software.amazon.awssdk", "sdk-core", "2.35.4",
             "fa559a4ce598852f3519c8f3b36250f583b0858a7611eedc4a81997778c617f4"),
    Artifact("software.amazon.awssdk", "utils", "2.35.4",
             "642aeef536a071668f0b772f05f9d21573abf6955e7b6fb5fdb893760cca10e8"),
    Artifact("software.amazon.awssdk", "annotations", "2.35.4",
             "6f36bd87155d1dd85d6efbdd29e532e3759a022211feb71affebee1aa34f04b8"),
    Artifact("software.amazon.awssdk", "regions", "2.35.4",
             "77eae87b34ce96ecdf916a9bc06684dbeafcb6d38ef0513285fa5d5d6d41f5ca"),
    Artifact("software.amazon.awssdk", "aws-core", "2.35.4",
             "fdb5fc8f1a48d97fa7d04d3460fb42f6973c7b1bbe1b9d317871ef0162bcb623"),
    Artifact("software.amazon.awssdk", "json-utils", "2.35.4",
             "80d67a6bb3e7eb49c7d4b6e4ba4c1463ed7da0192b795158328602dc131c5ecc"),
    Artifact("software.amazon.awssdk", "auth", "2.35.4",
             "6b601323004833fb4a857ffc95db4795e0e6320eb93e64b1246c655c9ff04994"),
    Artifact("software.amazon.awssdk", "http-client-spi", "2.35.4",
             "728be89b2a07b595edb0adee3a2cbbbdd4cb1f4caddde0d08c3979fe2620dedb"),
    Artifact("software.amazon.awssdk", "metrics-spi", "2.35.4",
             "c2a4ee90a21081317e2e6eba0c414d05d3d518aed2f86b1c1710a7367b450487"),
    Artifact("org.reactivestreams", "reactive-streams", "1.0.4",
             "f75ca597789b3dac58f61857b9ac2e1034a68fa672db35055a8fb4509e325f28"),
    Artifact("software.amazon.awssdk", "endpoints-spi", "2.35.4",
             "ef02441bda916959b8341290b49c68cc35538e1ad6f8629b75d8334dc6653e00"),
    Artifact("software.amazon.awssdk", "retries", "2.35.4",
             "f99fb2f8c66d7e859955b3542d3af8f9de8f23a21d5e3250f0f2c5f18487e469"),
    Artifact("software.amazon.eventstream", "eventstream", "1.0.1",
             "0c37d8e696117f02c302191b8110b0d0eb20fa412fce34c3a269ec73c16ce822"),
    Artifact("software.amazon.awssdk", "utils-lite", "2.35.4",
             "e004806def5e22ec98edc48a133ff3317166255e1ba29d93d129e9fdfa64a7be"),
    Artifact("software.amazon.awssdk", "third-party-jackson-core", "2.35.4",
             "32f4252c6c2df8f3a4aff885e6dc77024ad6b4cb48455d07b461ec30c41643ea"),
    Artifact("software.amazon.awssdk", "http-auth-aws-eventstream", "2.35.4",
             "709107552f302be3fa9e05969a3779f5c0f07fb809e6fa1fa571a6f0c61326dd"),
)
"""Spark's S3A connector for pyspark 4.2.0's Hadoop 3.5.0 (a warehouse on ``s3://``): ``hadoop-aws``
3.5.0 and the AWS SDK v2 2.35.4 modules it loads, resolved like :data:`DELTA_ARTIFACTS` (12.3 MiB),
instead of the SDK's 654 MiB ``bundle`` that hadoop-aws's pom names."""

ARTIFACTS: tuple[Artifact, ...] = DELTA_ARTIFACTS + S3A_ARTIFACTS
"""Every jar set-up downloads."""

POSTGRES_JDBC_ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("org.postgresql", "postgresql", "42.7.14",
             "73914527305a40cce504b0d3d90b23caf565136912d607ae8ae7c5895512332c"),
)
"""PostgreSQL's JDBC driver (its pom's runtime dependency, checker-qual, is annotations only), for
the benchmark's plain Spark JDBC write (``bench/postgres.py``), which fetches it
(``fetch_jars(artifacts=POSTGRES_JDBC_ARTIFACTS)``) and adds it to its own session. Not in
:data:`ARTIFACTS`: the PostgreSQL sink writes through psycopg2, so no session needs it."""

LOGSTORE_SOURCE = Path(__file__).with_name("S3ConditionalLogStore.java")
LOGSTORE_CLASS = "io.checkpointlib.delta.S3ConditionalLogStore"
"""Delta's log store for S3 that commits with a conditional put (:func:`build_logstore`)."""


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
    """Return the paths of all required jars (and of the S3 log store when it was built), or raise
    :class:`MissingJarsError`.

    Never downloads anything: sessions must start offline and fast.
    """
    directory = directory or jar_dir()
    missing = missing_jars(directory)
    if missing:
        raise MissingJarsError(directory, missing)
    logstore = logstore_jar(directory)
    return jar_paths(directory) + ([logstore] if logstore.is_file() else [])


class LogStoreMissingError(RuntimeError):
    """The warehouse is on S3 but the conditional-put Delta log store was not built (set-up found
    no JDK): Spark's stock S3 log store would let two writers overwrite each other's commit."""


def logstore_jar(directory: Path | None = None) -> Path:
    """Where set-up puts the compiled log store; named by its source's hash, so an edited source
    is built again."""
    digest = hashlib.sha256(LOGSTORE_SOURCE.read_bytes()).hexdigest()[:12]
    return (directory or jar_dir()) / f"checkpoint-lib-s3-logstore-{digest}.jar"


def require_logstore(directory: Path | None = None) -> Path:
    """The built log store, or :class:`LogStoreMissingError` saying how to build it."""
    jar = logstore_jar(directory)
    if not jar.is_file():
        raise LogStoreMissingError(
            f"a warehouse on S3 needs {LOGSTORE_CLASS} (Delta commits with If-None-Match: *), and "
            f"{jar} is not built. Fix: install a JDK 17+ (javac; e.g. `apt install openjdk-17-jdk-headless`) "
            "and run `make setup` (or `ckpt setup`) again. Delta's stock S3 log store is not used "
            "instead: two writers of one table could overwrite each other's commit.")
    return jar


def build_logstore(directory: Path | None = None) -> Path | None:
    """Compile :data:`LOGSTORE_CLASS` with ``javac`` against pyspark's Hadoop API and Delta's
    storage jar into :func:`logstore_jar` (a temporary file renamed into place). Returns the jar,
    or None when there is no JDK; idempotent."""
    directory = directory or jar_dir()
    target = logstore_jar(directory)
    if target.is_file():
        return target
    java_home = os.environ.get("JAVA_HOME")
    javac = str(Path(java_home, "bin", "javac")) if java_home and Path(java_home, "bin", "javac").is_file() \
        else shutil.which("javac")
    if javac is None:
        return None
    import subprocess
    import zipfile

    import pyspark

    spark_jars = Path(pyspark.__file__).parent / "jars"
    classpath = [*sorted(spark_jars.glob("hadoop-client-api-*.jar")), directory / f"delta-storage-{DELTA_JAR_VERSION}.jar"]
    with _fetch_lock(directory):
        tmp = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=directory))
        try:
            classes = tmp / "classes"
            done = subprocess.run([javac, "--release", "17", "-nowarn", "-cp", os.pathsep.join(map(str, classpath)),
                                   "-d", str(classes), str(LOGSTORE_SOURCE)], capture_output=True, text=True)
            if done.returncode != 0:
                raise LogStoreMissingError(f"javac could not build {LOGSTORE_SOURCE.name}:\n{done.stderr[-2000:]}")
            part = tmp / target.name
            with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as jar:
                jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n\n")
                for cls in sorted(classes.rglob("*.class")):
                    jar.write(cls, cls.relative_to(classes).as_posix())
            with open(part, "rb") as fh:
                os.fsync(fh.fileno())
            for stale in directory.glob("checkpoint-lib-s3-logstore-*.jar"):
                stale.unlink()
            os.replace(part, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def fetch_jars(
    directory: Path | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    artifacts: tuple[Artifact, ...] | None = None,
) -> list[Path]:
    """Download the missing jars of ``artifacts`` (default :data:`ARTIFACTS`) into ``directory``;
    return the ones downloaded.

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
        for artifact in ARTIFACTS if artifacts is None else artifacts:
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
    print(f"Delta {DELTA_JAR_VERSION} and S3A jars for Spark {SPARK_MINOR_VERSION} in {directory}")
    try:
        fetched = {path.name for path in fetch_jars(directory, progress=_indent_print)}
    except JarFetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in jar_paths(directory):
        status = "downloaded" if path.name in fetched else "present"
        print(f"  {status:<10}  {path.name}  ({human_bytes(path.stat().st_size)})")
    print(f"{len(ARTIFACTS)} jars ready, {len(fetched)} downloaded.")
    try:
        built = build_logstore(directory)
    except LogStoreMissingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if built is None:
        print("  note: no JDK (javac) found, so the S3 log store was not built: a warehouse on s3:// will be "
              "refused until a JDK 17+ is installed and set-up runs again (local warehouses need none).")
    else:
        print(f"  S3 log store {LOGSTORE_CLASS} in {built.name}")
    from . import jvm_archive

    if jvm_archive.enabled():  # after the log store: the archive is of the session's whole jar set
        archive, said = jvm_archive.build(ensure_jars(directory), directory)
        where = f" ({archive.name}, {human_bytes(archive.stat().st_size)})" if archive is not None else ""
        print(f"  driver class archive: {said}{where}" + ("" if archive is not None else
              "; Spark starts without it, a few seconds slower"))
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

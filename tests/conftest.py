"""Shared pytest fixtures.

Spark is started only by tests that request the ``spark`` fixture, once per test run, so the
pure-core tests never import pyspark or pay the JVM start-up.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# `make test` runs the tests in pytest-xdist workers, whose __main__ module has neither a spec nor a
# file. pyspark.sql.connect (which great_expectations imports) takes such a __main__ for its own
# doctest run and, without the Spark Connect client's packages, calls sys.exit(0) on import. A worker's
# __main__ named like any script's keeps it from that. The name is a real, empty file: a process
# multiprocessing spawns from a worker runs its parent's main script first, and failed on a made-up name.
_main = sys.modules.get("__main__")
if _main is not None and getattr(_main, "__spec__", None) is None and not hasattr(_main, "__file__"):
    _main.__file__ = os.path.join(os.path.dirname(os.path.abspath(__file__)), "xdist_worker_main.py")

# The tests' data is tiny: two shuffle partitions (one per core) instead of the default eight make a
# Delta MERGE about a third cheaper, and every Spark test here is a chain of small MERGEs. Set in the
# environment, so the `ckpt` processes and Airflow tasks the tests start inherit it.
os.environ.setdefault("CKPT_SHUFFLE_PARTITIONS", "2")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The shared local[2] SparkSession with Delta Lake (UI off), stopped at the end of the run.

    Fails with :class:`checkpoint_lib.spark.jars.MissingJarsError` ("run `make setup`") when
    the Delta jars have not been fetched.
    """
    from checkpoint_lib.spark.session import get_spark, stop_spark

    session = get_spark(master="local[2]", ui=False)
    yield session
    stop_spark()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3-compatible server (SeaweedFS, tests/s3server.py) on 127.0.0.1 for the whole run,
    started the first time a test asks for it."""
    from s3server import SeaweedServer

    server = SeaweedServer(tmp_path_factory.mktemp("seaweed")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL server (tests/pg_server.py) on 127.0.0.1 for the whole run, with
    ``max_prepared_transactions`` set, started the first time a test asks for it."""
    from pg_server import PostgresServer

    server = PostgresServer().start()
    yield server
    server.close()


@pytest.fixture
def s3(s3_server, request):
    """This test's warehouse prefix on the S3 server, ``s3://warehouse/<test>-<random>``, with the
    standard AWS variables (endpoint, keys, region) set the way a user sets them (by a patcher of
    its own: a test's ``monkeypatch.undo()`` leaves them set)."""
    import secrets

    with pytest.MonkeyPatch.context() as env:
        for key, value in s3_server.env().items():
            env.setenv(key, value)
        name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
        yield f"s3://warehouse/{name}-{secrets.token_hex(4)}"


@pytest.fixture(params=["posix", pytest.param("s3", marks=pytest.mark.objectstore)])
def storage_root(request, tmp_path):
    """A folder of the test's own on a local disk (``posix``) and on the S3 server (``s3``), as
    :func:`checkpoint_lib.layout.location` gives them (a Path, an ObjectUri): a test that takes it
    runs on both, and must see the same outcomes."""
    from checkpoint_lib.layout import location

    return location(request.getfixturevalue("s3")) if request.param == "s3" else tmp_path

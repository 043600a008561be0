"""Shared pytest fixtures.

Spark is started only by tests that request the ``spark`` fixture, once per test run, so the
pure-core tests never import pyspark or pay the JVM start-up.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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

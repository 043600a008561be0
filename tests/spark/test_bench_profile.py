"""bench/profile_step.py's instrumentation: every wrapped method's calls, seconds and the Spark jobs
it started (inclusive of the methods it calls), against a real Spark session."""

from __future__ import annotations

import pytest

from bench.profile_step import instrument, print_figures

pytestmark = pytest.mark.spark


class Roles:
    def __init__(self, spark):
        self.spark = spark

    def outer(self) -> None:
        self.inner()
        self.spark.range(3).collect()

    def inner(self) -> None:
        self.spark.range(5).collect()
        self.spark.range(7).collect()

    def control(self) -> int:
        return 1


def test_each_method_counts_the_spark_jobs_it_started_inclusive_of_what_it_calls(spark, capsys):
    figures = instrument(spark, [(__name__, "Roles", ["outer", "inner", "control"])])
    roles = Roles(spark)
    roles.outer()
    roles.control()
    roles.control()
    calls = {key: (n, jobs) for key, (n, _seconds, jobs) in figures.items()}
    assert calls == {"Roles.outer": (1, 3), "Roles.inner": (1, 2), "Roles.control": (2, 0)}
    print_figures(figures)
    table = capsys.readouterr().out
    assert "| Spark jobs | jobs per call |" in table and "| `Roles.outer` | 1 |" in table

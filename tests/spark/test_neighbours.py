"""The lakehouse-neighbours matrix (tests/neighbours.py): every maintenance or foreign operation
on either side of the payments pipeline, at every moment that matters, ends exactly once or with
the clear refusal :func:`neighbours.expected` names. ``make neighbours`` runs the same cells and
rewrites the matrix in docs/reliability.md.

The slow tier runs every cell (CI time). CI's tier of the matrix: the neighbours' cases of
tests/spark/test_lakehouse.py (a chain of two pipelines across a crash in each, OPTIMIZE and
VACUUM beside a run, a sink RESTOREd by someone else, sources with deletion vectors) and
tests/spark/test_sink_configuration.py (pre-created sinks, deletion vectors on a sink)."""

from __future__ import annotations

import os

import pytest

import neighbours as nb

pytestmark = pytest.mark.spark
RESULTS = os.environ.get("CKPT_NEIGHBOURS_RESULTS")
CI_CELLS: set[str] = set()
"""None (CI time): the module docstring names CI's tier of the matrix."""


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory):
    """The cells of one moment share their beginning (a copy of the warehouse, at one path)."""
    return {"base": tmp_path_factory.mktemp("neighbours"), "copies": {}}


@pytest.mark.parametrize("cell", [
    pytest.param(c, id=c.id, marks=() if c.id in CI_CELLS else pytest.mark.slow) for c in nb.CELLS
])
def test_a_neighbours_operation_ends_exactly_once_or_clearly_refused(spark, prefixes, cell):
    outcome = nb.run_cell(spark, prefixes["base"] / "w", cell, prefixes["copies"])
    if RESULTS:
        nb.record(RESULTS, outcome)
    assert outcome.result != "FAILED", outcome.detail
    assert nb.as_expected(outcome), f"expected {nb.expected(cell)}, got {outcome.result}: {outcome.detail}"

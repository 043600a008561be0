"""The benchmark sections on ours alone (bench/recovery.py, bench/state_growth.py, bench/cluster.py):
their tables, their markers in docs/benchmarks.md and their size checks. No Spark: the sections
themselves run in ``make bench-quick``."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench import cluster, recovery, state_growth
from bench.compare import SECTIONS, write_section

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"


def test_every_section_has_its_markers_in_the_docs_and_a_table(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text(DOCS.read_text())
    tables = {
        "recovery": recovery.render_recovery([{
            "kill_pct": 50, "versions_replayed": 5, "rows_replayed": 500_000, "restore_s": 4.25, "replay_s": 61.0,
            "recovery_s": 65.25, "us_per_row": 122.0}]),
        "state": state_growth.render_state([{
            "state_rows": 1_000_000, "events": 50_000, "median_checkpoint_ms": 9000.0, "max_checkpoint_ms": 9500.0,
            "median_state_bytes": 30 * 2**20, "median_written_bytes": 3 * 2**20, "bootstrap_s": 40.0}]),
        "cluster": cluster.render_cluster([{
            "events": 5_000_000, "workers": 2, "cores": 1, "submit_s": 700.0, "seconds": 650.0,
            "events_per_s": 7692.3, "local_s": None}]),
    }
    for name, body in tables.items():
        write_section(doc, name, body)
    text = doc.read_text()
    assert "| 50% (5 of 10 versions) | 500,000 | 4.2 | 61.0 | 122 | 65.2 | yes |" in text
    assert "| 1,000,000 | 50,000 | 9000 | 9500 | 30.0 MiB | 3.0 MiB | 0.10 | 40.0 |" in text
    assert "| 5,000,000 | 2 x 1 | 700.0 | 650.0 | 7,692 |  | yes |" in text
    write_section(doc, "recovery", tables["recovery"])  # written again: replaced, not added
    assert doc.read_text() == text


def test_sections_refuse_sizes_they_cannot_measure():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accounts", type=int, default=10)
    for section in SECTIONS:
        section.add_arguments(ap)
    assert recovery.kill_points(ap.parse_args([])) == [10, 50, 90]
    with pytest.raises(ValueError, match="multiples of 10"):
        recovery.kill_points(ap.parse_args(["--recovery-kills", "25"]))
    with pytest.raises(ValueError, match="below --state-events"):
        state_growth.state_sizes(ap.parse_args(["--state-sizes", "1000", "--state-events", "5000"]))
    assert all(set(section.QUICK) <= set(vars(ap.parse_args([]))) for section in SECTIONS)


def test_quick_sets_small_sizes_for_every_section_but_keeps_what_is_given():
    from bench.compare import parse_args

    args, sizes, skew_size = parse_args(["--quick", "--state-events", "1000"])
    assert sizes == [100_000] == [skew_size]
    assert (args.recovery_interval, args.state_sizes, args.cluster_size) == (2_000, "10000,50000", 20_000)
    assert args.state_events == 1000
    args, sizes, _ = parse_args(["--sizes", "", "--skip-state"])
    assert sizes == [] and args.skip_state and args.cluster_size == 5_000_000


def test_generated_account_numbers_are_wide_enough_never_to_collide():
    """Spark's lpad cuts a longer string to the width: 6 digits held 10^6 accounts, no more."""
    from checkpoint_lib.pipelines.payments import account_digits

    assert account_digits(1_000) == 6 and account_digits(1_000_000) == 6
    assert account_digits(1_000_001) == 7 and account_digits(5_000_000) == 7
    assert account_digits(10**7 + 1) == 8

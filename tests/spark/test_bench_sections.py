"""The benchmark sections (bench/recovery.py, bench/state_growth.py, bench/cluster.py, bench/postgres.py...):
their tables, their markers in docs/benchmarks.md and their size checks. No Spark: the sections
themselves run in ``make bench-quick``."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench import cluster, enrichment_bench, object_store, recovery, state_growth
from bench import postgres as postgres_bench
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
        "enrichment": enrichment_bench.render_enrichment([
            {"events": 1_000_000, "rows_per_checkpoint": 100_000, "accounts": 10_000, "contender": c, "seconds": s,
             **extra} for c, s, extra in (
                (enrichment_bench.OURS, 150.0, {"checkpoints": 11, "median_checkpoint_ms": 9000.0}),
                (enrichment_bench.FLOOR, 10.0, {}), (enrichment_bench.EXPERT, 200.0, {}))]),
        "object-store": object_store.render_object_store([{
            "events": 1_000_000, "where": "S3 (SeaweedFS on 127.0.0.1)", "seconds": 120.0, "checkpoints": 10,
            "median_checkpoint_ms": 9000.0, "events_per_s": 8333.3, "vs_disk": 1.5}]),
        "postgres": postgres_bench.render_postgres([
            {"events": 1_000_000, "rows_per_checkpoint": 100_000, "accounts": 10_000, "contender": c, "seconds": s,
             "sittings": [s + 1, s, s - 1], "rows_written": 1_009_000, "wal_bytes": w * 2**20, **extra}
            for c, s, w, extra in (
                (postgres_bench.COPY, 5.0, 100, {}), (postgres_bench.JDBC, 20.0, 180, {"spark_jobs": 6}),
                (postgres_bench.OURS, 160.0, 400, {"checkpoints": 11, "spark_jobs": 400, "sink_stage_seconds": 30.0,
                                                   "sink_commit_seconds": 10.25}))]),
    }
    for name, body in tables.items():
        write_section(doc, name, body)
    text = doc.read_text()
    assert "| 50% (5 of 10 versions) | 500,000 | 4.2 | 61.0 | 122 | 65.2 | yes |" in text
    assert "| 1,000,000 | 50,000 | 9000 | 9500 | 30.0 MiB | 3.0 MiB | 0.10 | 40.0 |" in text
    assert "| 5,000,000 | 2 x 1 | 700.0 | 650.0 | 7,692 |  | yes |" in text
    assert "| 1,000,000 | S3 (SeaweedFS on 127.0.0.1) | 120.0 | 8,333 | 10 | 9,000 | 1.50 | yes |" in text
    into_pg = text.split("<!-- bench:postgres -->")[1].split("<!-- /bench:postgres -->")[0].strip().splitlines()
    assert into_pg[2:] == [  # ours first, each with its ratios to the JDBC write and to COPY
        f"| {postgres_bench.OURS} | 1,000,000 | 1,009,000 | 161.0, 160.0, 159.0 | 160.0 | 6,250 | 8.00 | 32.00 | 11 "
        "| 40.2 | 400 | 400 | yes |",
        f"| {postgres_bench.JDBC} | 1,000,000 | 1,009,000 | 21.0, 20.0, 19.0 | 20.0 | 50,000 | 1.00 | 4.00 |  |  "
        "| 180 | 6 | yes |",
        f"| {postgres_bench.COPY} | 1,000,000 | 1,009,000 | 6.0, 5.0, 4.0 | 5.0 | 200,000 | 0.25 | 1.00 |  |  "
        "| 100 |  | yes |"]
    enriched = text.split("<!-- bench:enrichment -->")[1].split("<!-- /bench:enrichment -->")[0].strip().splitlines()
    assert [line.split(" | ")[0] for line in enriched[2:]] == [  # the floor first, then the expert peer, ours
        f"| {enrichment_bench.FLOOR}", f"| {enrichment_bench.EXPERT}", f"| {enrichment_bench.OURS}"]
    assert enriched[2].startswith(f"| {enrichment_bench.FLOOR} | 1,000,000 | 10.0 | 100,000 | 1.00 | 0.05 |")
    assert enriched[4] == f"| {enrichment_bench.OURS} | 1,000,000 | 150.0 | 6,667 | 15.00 | 0.75 | 11 | 9000 " \
        "|  |  |  | yes |"
    write_section(doc, "recovery", tables["recovery"])  # written again: replaced, not added
    assert doc.read_text() == text
    write_section(doc, "throughput-250000", "| a new interval |")  # no markers yet: added at the end
    write_section(doc, "throughput-250000", "| measured again |")
    assert doc.read_text() == f"{text.rstrip()}\n\n<!-- bench:throughput-250000 -->\n| measured again |\n" \
        "<!-- /bench:throughput-250000 -->\n"


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
    with pytest.raises(ValueError, match="at least 1"):
        enrichment_bench.check_sizes(ap.parse_args(["--enrichment-rows-per-checkpoint", "0"]))
    with pytest.raises(ValueError, match="at least 1"):
        postgres_bench.check_sizes(ap.parse_args(["--postgres-repeat", "0"]))
    assert all(set(section.QUICK) <= set(vars(ap.parse_args([]))) for section in SECTIONS)


def test_quick_sets_small_sizes_for_every_section_but_keeps_what_is_given():
    from bench.compare import parse_args

    args, sizes, skew_size = parse_args(["--quick", "--state-events", "1000"])
    assert sizes == [100_000] == [skew_size]
    assert (args.recovery_interval, args.state_sizes, args.cluster_size) == (2_000, "10000,50000", 20_000)
    assert args.object_store_size == 20_000
    assert (args.enrichment_size, args.enrichment_rows_per_checkpoint) == (20_000, 5_000)
    assert (args.postgres_size, args.postgres_rows_per_checkpoint, args.postgres_repeat) == (100_000, 25_000, 1)
    assert postgres_bench.runs(args)  # in the quick run too
    assert not args.skip_enrichment  # on by default
    assert args.state_events == 1000
    assert args.results == ""  # a quick run keeps its figures out of bench/results.jsonl
    args, sizes, _ = parse_args(["--sizes", "", "--skip-state"])
    assert sizes == [] and args.skip_state and args.cluster_size == 5_000_000
    assert args.object_store_size == 1_000_000 and not args.skip_object_store
    assert (args.enrichment_size, args.enrichment_rows_per_checkpoint) == (1_000_000, 100_000)
    assert (args.postgres_size, args.postgres_rows_per_checkpoint, args.postgres_repeat) == (1_000_000, 100_000, 3)
    assert postgres_bench.runs(args) and not postgres_bench.runs(parse_args(["--skip-postgres"])[0])
    assert not postgres_bench.runs(parse_args(["--contenders", "floor,expert"])[0])  # it compares ours with the others


def test_generated_account_numbers_are_wide_enough_never_to_collide():
    """Spark's lpad cuts a longer string to the width: 6 digits held 10^6 accounts, no more."""
    from checkpoint_lib.pipelines.payments import account_digits

    assert account_digits(1_000) == 6 and account_digits(1_000_000) == 6
    assert account_digits(1_000_001) == 7 and account_digits(5_000_000) == 7
    assert account_digits(10**7 + 1) == 8


# --- the results log: runs that stop and go on, tables made of several runs ---------------------

def _row(events, contender, seconds, **extra):
    return {"events": events, "rows_per_checkpoint": 100_000, "accounts": 10_000, "contender": contender,
            "seconds": seconds, **extra}


def test_the_results_log_keeps_every_row_and_survives_a_torn_append(tmp_path):
    from bench.results import ResultsLog

    log = ResultsLog(tmp_path / "r.jsonl", commit="abc1234", machine="m", command="c")
    log.append("throughput", _row(1_000_000, "floor (plain Spark batch)", 5.0))
    with open(log.path, "a") as f:  # a process killed inside its write
        f.write('{"section": "throughput", "events": 5000')
    log.append("throughput", _row(1_000_000, "ours, aligned", 150.0))
    rows = ResultsLog(log.path).rows("throughput")
    assert [r["contender"] for r in rows] == ["floor (plain Spark batch)", "ours, aligned"]
    assert rows[1]["commit"] == "abc1234" and rows[1]["machine"] == "m" and rows[1]["measured_at"]
    assert log.find("throughput", (1_000_000, 100_000, 10_000), "ours, aligned")["seconds"] == 150.0
    assert log.find("throughput", (5_000_000, 100_000, 10_000), "ours, aligned") is None
    assert log.rows("state") == []


def test_resume_runs_nothing_when_the_log_holds_every_contender(tmp_path, monkeypatch):
    from bench import compare
    from bench.compare import EXPERT, FLOOR, PEER, parse_args, throughput
    from bench.results import ResultsLog

    class WouldRun(Exception):
        pass

    def generate_landing(*_a, **_k):
        raise WouldRun
    monkeypatch.setattr(compare, "generate_landing", generate_landing)

    log = ResultsLog(tmp_path / "r.jsonl", commit="abc1234")
    for c, s in [(FLOOR, 5.0), (EXPERT, 60.0), (PEER, 180.0), ("ours, aligned", 150.0)]:
        log.append("throughput", _row(1_000_000, c, s))
    args, _, _ = parse_args(["--sizes", "1000000", "--modes", "aligned", "--resume"])
    rows = throughput(None, str(tmp_path), 1_000_000, args, lambda m: None, log)
    assert [r["contender"] for r in rows] == [FLOOR, EXPERT, PEER, "ours, aligned"]
    args, _, _ = parse_args(["--sizes", "1000000", "--modes", "aligned,unaligned", "--resume"])
    with pytest.raises(WouldRun):  # unaligned is missing: it runs
        throughput(None, str(tmp_path), 1_000_000, args, lambda m: None, log)


def test_tables_combine_runs_and_compare_each_size_with_its_own_floor(tmp_path):
    from bench.compare import FLOOR, logged_throughput, parse_args, render_throughput, throughput_sections, with_ratios
    from bench.results import ResultsLog

    first = ResultsLog(tmp_path / "r.jsonl", commit="aaa1111", machine="2 cores", command="bench --sizes 5000000")
    first.append("throughput", _row(5_000_000, FLOOR, 30.0))
    first.append("throughput", _row(5_000_000, "ours, aligned", 600.0, checkpoints=51, median_checkpoint_ms=9000.0,
                                    interval_s_first_tenth=11.0, interval_s_last_tenth=12.5))
    first.append("throughput", _row(5_000_000, "ours, checkpointing off", 500.0, checkpoints=2))
    second = ResultsLog(tmp_path / "r.jsonl", commit="bbb2222", machine="2 cores", command="bench --sizes 1000000")
    second.append("throughput", _row(1_000_000, "ours, aligned", 160.0, checkpoints=11))
    second.append("throughput", _row(1_000_000, FLOOR, 8.0))
    second.append("throughput", _row(1_000_000, FLOOR, 6.0))  # measured again: the latest counts
    second.append("throughput", {**_row(1_000_000, FLOOR, 1.0), "accounts": 5})  # another table
    assert {r["events"] for r in logged_throughput(second, 100_000, 10_000, since="9999")} == set()
    assert {r["events"] for r in logged_throughput(second, 100_000, 10_000, since="2000-01-01")} == {1_000_000, 5_000_000}
    rows = with_ratios(logged_throughput(second, 100_000, 10_000))
    assert [(r["events"], r["contender"]) for r in rows] == [
        (1_000_000, FLOOR), (1_000_000, "ours, aligned"),
        (5_000_000, FLOOR), (5_000_000, "ours, checkpointing off"), (5_000_000, "ours, aligned")]
    assert [round(r["ratio"], 2) for r in rows] == [1.0, 26.67, 1.0, 16.67, 20.0]
    text = render_throughput(rows)
    assert "| ours, aligned | 5,000,000 | 600.0 | 8,333 | 20.00 | 51 | 9000 |" in text and "aaa1111 |" in text
    args, _, _ = parse_args([])
    sections = throughput_sections(rows, args)
    assert set(sections) == {"throughput-100000", "overhead-100000"}  # one pair of tables per interval
    assert "`bench --sizes 5000000` at aaa1111" in sections["throughput-100000"]
    assert "`bench --sizes 1000000` at bbb2222" in sections["throughput-100000"]
    assert "| 5,000,000 | aligned | 51 | 600.0 | 500.0 | 1.20 | 11.0 | 12.5 |" in sections["overhead-100000"]
    with pytest.raises(ValueError, match="no floor row"):
        with_ratios([_row(20_000_000, "ours, aligned", 3000.0)])


def test_interval_trend_compares_the_first_and_last_tenth_of_a_run():
    from bench.ours import interval_trend

    # 21 completions, 20 gaps: 10 s each for the first 18, then 14 s and 16 s
    times = [0.0]
    for gap in [10.0] * 18 + [14.0, 16.0]:
        times.append(times[-1] + gap)
    trend = interval_trend(list(reversed(times)))  # the history is newest first: order is not assumed
    assert trend == {"interval_s_first_tenth": 10.0, "interval_s_last_tenth": 15.0}
    assert interval_trend([5.0, 1.0]) == {}  # checkpointing off: a first and a final checkpoint only


def test_the_cluster_section_reads_the_summary_line_ckpt_run_prints():
    from bench.cluster import _RUN_LINE

    m = _RUN_LINE.search("epoch 1: read 20,000 rows in 52.8 s (378 rows/s), 2 checkpoints completed, 0 aborted")
    assert m is not None and (int(m.group(1).replace(",", "")), float(m.group(2))) == (20_000, 52.8)


def test_the_tables_of_a_quick_run_render_without_a_results_log():
    """make bench-quick keeps its figures out of the log, so its rows carry no date, commit or
    command: the tables still render, saying so (it stopped at the end with an IndexError)."""
    from bench.compare import parse_args, throughput_sections, with_ratios

    args, _, _ = parse_args(["--quick"])
    rows = with_ratios([_row(100_000, "floor (plain Spark batch)", 3.1), _row(100_000, "ours, aligned", 25.0)])
    sections = throughput_sections(rows, args)
    text = "\n".join(sections.values())
    assert "(not recorded)" in text and "8.06" in text


def test_a_quick_run_stamps_its_rows_with_its_command_and_commit_and_logs_nothing(tmp_path, monkeypatch):
    """make bench-quick logs nothing, yet its tables say what measured them, like a logged run's
    (they said "(not recorded) at unknown")."""
    from bench.compare import parse_args, throughput_sections, with_ratios
    from bench.results import ResultsLog

    monkeypatch.chdir(tmp_path)
    quick = ResultsLog(None, commit="abc1234", machine="2 cores", command="python bench/compare.py --quick")
    rows = [quick.append("throughput", _row(100_000, "floor (plain Spark batch)", 3.1)),
            quick.append("throughput", _row(100_000, "ours, aligned", 25.0))]
    assert quick.rows() == [] and list(tmp_path.iterdir()) == []
    args, _, _ = parse_args(["--quick"])
    text = "\n".join(throughput_sections(with_ratios(rows), args).values())
    assert "`python bench/compare.py --quick` at abc1234, 20" in text and "Measured on 2 cores" in text
    assert "(not recorded)" not in text and "8.06" in text

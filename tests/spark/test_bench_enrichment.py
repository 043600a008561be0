"""The enrichment section's contenders (bench/enrichment_floor.py, bench/enrichment_peer.py) must
produce what the independent verifier expects (``enrichment_data.expected_enrichment`` compared
with ``compare_rows``), the peer also incrementally and with a replayed micro-batch skipped by
Delta's idempotent-write stamps; the Spark comparison the bench checks them with must catch a wrong
contender."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from bench.enrichment_bench import diff_outputs, expected_problems
from bench.enrichment_floor import OUTPUTS, run_enrichment_floor
from checkpoint_lib.delta.log import latest_version
from checkpoint_lib.pipelines.enrichment_data import PAYMENTS_PATH, expected_enrichment, generate

pytestmark = [pytest.mark.spark]


def land(w: Path, rows: int, seed: int, rounds: int, commits: int = 1) -> None:
    generate(None, str(w), rows, rounds=rounds, accounts=25, seed=seed, bad_fraction=0.05, duplicate_fraction=0.1,
             commits_per_round=commits)


def versions(out: Path) -> dict[str, int | None]:
    return {name: latest_version(out / path) for name, path in OUTPUTS.items()}


@pytest.mark.slow  # CI tier: make bench-quick checks every contender's outputs before its time counts
def test_floor_and_expert_peer_produce_the_verifiers_outputs(spark, tmp_path):
    from bench.enrichment_peer import AccountsHistory, batch_writer, create_outputs, run_enrichment_peer

    w, floor, peer, ckpt = tmp_path / "w", tmp_path / "floor", tmp_path / "peer", str(tmp_path / "ckpt")
    land(w, 300, seed=7, rounds=2)  # a version each, repeats of round 0 in round 1
    want = expected_enrichment(str(w))
    assert len(want["duplicates"]) and len(want["rejected"]) and len(want["dead_letters"])  # every case is there
    assert {"unknown account", "closed account"} <= set(want["rejected"]["reason"])

    run_enrichment_floor(spark, str(w), str(floor))
    assert expected_problems(str(w), str(floor)) == []

    first = run_enrichment_peer(spark, str(w), str(peer), checkpoint_location=ckpt)
    assert first["batches"] == latest_version(w / PAYMENTS_PATH) + 1  # a micro-batch per landed version
    assert expected_problems(str(w), str(peer)) == []
    assert diff_outputs(spark, str(floor), str(peer)) == []

    land(w, 200, seed=8, rounds=1)  # more changes and payments land: the same query goes on
    more = run_enrichment_peer(spark, str(w), str(peer), checkpoint_location=ckpt)
    assert more["batches"] == 1 and more["rows"] == 200
    assert expected_problems(str(w), str(peer)) == []
    run_enrichment_floor(spark, str(w), str(floor))  # the floor again, over everything landed
    assert expected_problems(str(w), str(floor)) == []

    # the last micro-batch replayed (a crash before its offset commit): every write skips it
    query_id = json.loads((Path(ckpt) / "metadata").read_text())["id"]
    started = threading.Event()
    started.set()
    accounts = AccountsHistory(str(w / "landing/enrichment/accounts"))
    write = batch_writer(create_outputs(spark, str(peer)), accounts, {"id": query_id}, started)
    landing = str(w / PAYMENTS_PATH)
    last = latest_version(landing)
    replayed = spark.read.format("delta").option("versionAsOf", last).load(landing).exceptAll(
        spark.read.format("delta").option("versionAsOf", last - 1).load(landing))  # the last version's rows
    before = versions(peer)
    batch_id = max(int(p.name) for p in (Path(ckpt) / "commits").iterdir() if p.name.isdigit())
    write(replayed, batch_id)
    assert versions(peer) == before
    accounts.close()
    assert expected_problems(str(w), str(peer)) == []

    # the bench's Spark comparison catches a wrong contender
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    DeltaTable.forPath(spark, str(peer / OUTPUTS["region_totals"])).update(
        F.col("region") == F.lit("eu-west"), {"total_cents": F.col("total_cents") + 1})
    problems = diff_outputs(spark, str(floor), str(peer))
    assert problems == [f"{OUTPUTS['region_totals']}: 1 rows missing, 1 rows extra"], problems
    assert any("region_totals" in p and "wrong total_cents" in p for p in expected_problems(str(w), str(peer)))


@pytest.mark.slow  # CI tier: make bench-quick runs the section; the test above checks the floor and the peer
def test_the_section_checks_every_contender_and_gives_ratios_to_the_floor_and_the_expert_peer(spark, tmp_path):
    import argparse

    from bench import enrichment_bench

    args = argparse.Namespace(enrichment_size=1_200, enrichment_rows_per_checkpoint=400, accounts=30,
                              contenders="floor,expert,ours", warm_up=False, keep=False)
    rows = enrichment_bench.enrichment(spark, str(tmp_path), args, lambda _m: None)
    assert [r["contender"] for r in rows] == list(enrichment_bench.ORDER)
    floor, expert, ours = rows
    assert expert["batches"] == 3 and ours["checkpoints"] >= 3 and ours["steps"] >= 3
    table = enrichment_bench.render_enrichment(rows)
    assert table.count("| yes |") == 3 and f"| {floor['events']:,} |" in table

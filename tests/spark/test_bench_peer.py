"""The benchmark's Structured Streaming peer (bench/peer.py) must produce what the library does:
checked against the independent pandas computation, on a first run, an idle rerun, an incremental
run, and a replayed micro-batch (which Delta's idempotent-write stamps must skip)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pandas as pd
import pytest

from bench.peer import STEP_SCHEMA, _batch_writer, run_peer
from checkpoint_lib.delta.log import latest_version
from checkpoint_lib.pipelines.payments import generate
from checkpoint_lib.verify import expected_payments, landing_in_offset_order, read_delta

# slow: a benchmark contender, several minutes on 2 cores; every bench run also checks its outputs
pytestmark = [pytest.mark.spark, pytest.mark.slow]
ROWS = 600
TABLES = ("gold/ledger", "gold/balances", "dlq/payments")


def generate_version(spark, w: Path, seed: int) -> None:
    generate(spark, str(w), ROWS, bad_fraction=0.05, accounts=20, seed=seed, files=2)


def assert_outputs_expected(w: Path, out: Path, spark=None) -> None:
    """The outputs under ``out`` equal the pandas computation; with ``spark`` they are read through
    Spark (a table with deletion vectors, which delta-rs cannot read)."""
    def read(path: Path):
        return read_delta(path) if spark is None else spark.read.format("delta").load(str(path)).toPandas()

    want_ledger, want_balances, bad = expected_payments(landing_in_offset_order(str(w)))
    ledger = read(out / "gold" / "ledger").astype({"amount_cents": "int64", "balance_after_cents": "int64"})
    pd.testing.assert_frame_equal(
        ledger.sort_values("event_id").reset_index(drop=True),
        want_ledger.sort_values("event_id").reset_index(drop=True),
        check_dtype=False,
    )
    balances = read(out / "gold" / "balances").astype({"balance_cents": "int64", "event_count": "int64"})
    pd.testing.assert_frame_equal(
        balances.sort_values("account").reset_index(drop=True),
        want_balances.sort_values("account").reset_index(drop=True),
        check_dtype=False,
    )
    dlq = read(out / "dlq" / "payments")
    assert len(bad) > 0 and len(dlq) == len(bad)
    assert set(dlq["event_id"]) == set(bad["event_id"])


def table_versions(out: Path) -> dict[str, int | None]:
    return {t: latest_version(out / t) for t in TABLES}


def test_peer_matches_expected_runs_incrementally_and_skips_replays(spark, tmp_path):
    w, out, ckpt = tmp_path / "w", tmp_path / "out", str(tmp_path / "ckpt")
    landing = str(w / "landing" / "payments")
    for seed in range(3):
        generate_version(spark, w, seed)

    first = run_peer(spark, landing, str(out), files_per_batch=2, checkpoint_location=ckpt)
    assert first["batches"] == 3 and first["rows"] == 3 * ROWS
    assert spark.conf.get("spark.sql.streaming.stateStore.providerClass", None) is None  # restored
    offsets = json.loads((Path(ckpt) / "offsets" / "0").read_text().splitlines()[1])
    assert offsets["conf"]["spark.sql.streaming.stateStore.providerClass"].endswith("RocksDBStateStoreProvider")
    assert_outputs_expected(w, out)

    before = table_versions(out)
    idle = run_peer(spark, landing, str(out), files_per_batch=2, checkpoint_location=ckpt)
    assert idle["batches"] == 0 and idle["rows"] == 0
    assert table_versions(out) == before

    generate_version(spark, w, 3)
    more = run_peer(spark, landing, str(out), files_per_batch=2, checkpoint_location=ckpt)
    assert more["batches"] == 1 and more["rows"] == ROWS
    assert_outputs_expected(w, out)

    # A crash after the writes but before the offset commit replays the last batch: with its
    # (query id, batch id) stamp every table, the MERGE included, must skip it.
    query_id = json.loads((Path(ckpt) / "metadata").read_text())["id"]
    started = threading.Event()
    started.set()
    write = _batch_writer({"ledger": str(out / TABLES[0]), "balances": str(out / TABLES[1]),
                           "dlq": str(out / TABLES[2])}, {"id": query_id}, started)
    foreign = spark.createDataFrame(
        [("x-1", "acct-000001", 5, "5", "t", None, 999, 999), ("x-2", None, None, "5", "t", "null or empty account", None, None)],
        STEP_SCHEMA,
    )
    before = table_versions(out)
    write(foreign, 3)
    assert table_versions(out) == before
    assert_outputs_expected(w, out)
    write(foreign, 4)  # the same writes under a new batch id do land: the skip above was the stamp
    assert all(latest_version(out / t) == before[t] + 1 for t in TABLES)


def test_expert_peer_matches_expected_runs_incrementally_and_skips_replays(spark, tmp_path):
    """The expert form (bench/expert_peer.py: foreachBatch, a window from the balances of the touched
    accounts, ledger then MERGE): the same outputs, and a replayed batch changes nothing."""
    from bench.expert_peer import batch_writer, run_expert_peer

    w, out, ckpt = tmp_path / "w", tmp_path / "out", str(tmp_path / "ckpt")
    landing = str(w / "landing" / "payments")
    for seed in range(3):
        generate_version(spark, w, seed)
    first = run_expert_peer(spark, landing, str(out), files_per_batch=2, checkpoint_location=ckpt)
    assert first["batches"] == 3 and first["rows"] == 3 * ROWS
    assert_outputs_expected(w, out, spark)

    generate_version(spark, w, 3)
    more = run_expert_peer(spark, landing, str(out), files_per_batch=2, checkpoint_location=ckpt)
    assert more["batches"] == 1 and more["rows"] == ROWS
    assert_outputs_expected(w, out, spark)

    # the last batch replayed (a crash before its offset commit): every write skips it by its stamp
    query_id = json.loads((Path(ckpt) / "metadata").read_text())["id"]
    started = threading.Event()
    started.set()
    write = batch_writer({"ledger": str(out / TABLES[0]), "balances": str(out / TABLES[1]),
                          "dlq": str(out / TABLES[2])}, {"id": query_id}, started)
    replayed = spark.read.format("delta").option("versionAsOf", latest_version(landing)).load(landing) \
        .where("event_id like 'b3-%'")
    before = table_versions(out)
    write(replayed, 3)
    assert table_versions(out) == before
    assert_outputs_expected(w, out, spark)

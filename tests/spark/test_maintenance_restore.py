"""checkpoint_lib.maintenance on a real pipeline (Spark + Delta, small data): after many checkpoints
(unaligned, with records in flight, state compactions, a savepoint) and a maintenance that deletes
everything its rules allow, the oldest retained checkpoint (the savepoint) still restores exactly;
what the rules dropped is gone; a dry run deleted nothing. The delta-rs rules, races included, are
tested in tests/delta/test_maintenance.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from checkpoint_lib.core.decider import CheckpointConfig
from checkpoint_lib.core.types import CheckpointKind
from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.maintenance import RetentionPolicy, maintain
from checkpoint_lib.pipelines import get
from checkpoint_lib.pipelines.payments import generate
from checkpoint_lib.spark.runner import PipelineRunner
from checkpoint_lib.verify import check_payments

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # 5 min: the rules themselves are tested in tests/delta
ROWS = 200
# everything the rules allow: no grace for removed files, the state window from the pinned commit
EAGER = RetentionPolicy(file_retention_hours=0.0, pinned_margin_hours=0.0, request_days=0.0)


def runner(spark, w, **kw) -> PipelineRunner:
    kw.setdefault("mode", "unaligned")
    kw.setdefault("lagging_sources", 1)  # records in flight: unaligned checkpoints log channel state
    return PipelineRunner(get("payments"), str(w), spark, rows_per_checkpoint=ROWS, state_compact_every=2,
                          config=CheckpointConfig(interval=0, max_concurrent=1, timeout=3600, retained=2), **kw)


def files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def age(spark, table: Path, version: int, *, before: float, since: float) -> None:
    """Make the history of a Delta table look old, as a run of hours ago would have left it:
    commits below ``version`` ``before`` hours older, the others ``since`` hours older (Delta stamps
    commits and removed files with the clock, and VACUUM keeps whole hours: a test cannot wait).
    Every time in the JSON commits moves (commit, file added, file removed); the log checkpoints
    and checksums, which repeat them, are dropped (Delta rebuilds the table from the commits)."""
    log = table / "_delta_log"
    for f in list(log.iterdir()):
        if f.name.endswith(".crc") or ".checkpoint." in f.name or f.name == "_last_checkpoint":
            f.unlink()
    times = {("commitInfo", "timestamp"), ("add", "modificationTime"), ("remove", "deletionTimestamp"),
             ("txn", "lastUpdated")}
    for f in sorted(log.glob("*.json")):
        shift = 3600 * (before if int(f.stem) < version else since)
        actions = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        for a in actions:
            for kind, key in times:
                if kind in a and isinstance(a[kind].get(key), int):
                    a[kind][key] -= int(shift * 1000)
        f.write_text("".join(json.dumps(a) + "\n" for a in actions))
        stat = f.stat()
        os.utime(f, (stat.st_atime - shift, stat.st_mtime - shift))
    for f in table.glob("*.parquet"):
        stat = f.stat()
        os.utime(f, (stat.st_atime - 3600 * before, stat.st_mtime - 3600 * before))
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # Spark must read the commits again


def test_after_maintenance_the_oldest_retained_checkpoint_still_restores_exactly(spark, tmp_path):
    w = tmp_path
    for seed in (1, 2, 3):
        generate(spark, str(w), ROWS, bad_fraction=0.02, accounts=30, seed=seed)
    first = runner(spark, w).run()
    savepoint = runner(spark, w).run(max_steps=0, final_kind=CheckpointKind.SAVEPOINT).final
    for seed in (4, 5):
        generate(spark, str(w), ROWS, bad_fraction=0.02, accounts=30, seed=seed)
    second = runner(spark, w).run()
    root = w / "_checkpoints" / "payments"
    store = DeltaCheckpointStore(root)
    retained = [c.checkpoint_id for c in store.all()]
    assert retained[0] == savepoint and len(retained) == 3, retained
    assert len(first.completed) + len(second.completed) >= 5
    cs = root / "channel_state"
    in_flight = {r.checkpoint_id for r in spark.read.format("delta").load(str(cs)).select("checkpoint_id").distinct().collect()}
    assert in_flight - set(retained), "the runs logged channel state of checkpoints no longer retained"

    # the state table's history as if the first run was 6 hours ago and the rest 2 hours ago: what
    # only versions before the savepoint's used is outside any window the savepoint allows
    pinned = min(a.state["table_version"] for sid, a in store.get(savepoint).acks.items() if sid.operator == "balance")
    state_table = root / "state" / "balance"
    age(spark, state_table, pinned, before=6.0, since=2.0)
    assert spark.read.format("delta").option("versionAsOf", pinned).load(str(state_table)).count() >= 0

    # a dry run: decides everything, deletes nothing
    before = files(w)
    dry = maintain(w, "payments", spark, dry_run=True, policy=EAGER)
    assert files(w) == before
    state = "_checkpoints/payments/state/balance"
    assert dry.rule("vacuum", state).deleted > 0 and dry.rule("channel_state rows").deleted > 0
    assert dry.rule("checkpoints rows").deleted > 0 and dry.rule("id markers").deleted > 0

    report = maintain(w, "payments", spark, policy=EAGER)
    print(report.describe())
    needs = report.needs
    assert needs.retained == retained and needs.floor == retained[1]
    for rule, target in [("vacuum", state), ("vacuum", "_checkpoints/payments/channels/source_balance"),
                         ("channel_state rows", None),
                         ("checkpoints rows", None), ("id markers", None), ("requests", None)]:
        assert report.rule(rule, target).deleted == dry.rule(rule, target).deleted, (rule, target)
    assert not [r for r in report.rules if r.skipped]
    pin = report.oldest_pinned_state["balance"]
    assert pin["pinned_by"] == savepoint and pin["oldest_version"] == pinned  # the oldest pinned version
    assert 2.0 < pin["retain_hours"] < 2.5  # back to its commit (2 h ago), not to the older ones (6 h)

    # what went is gone
    reader = DeltaCheckpointStore(root)
    assert {h["checkpoint_id"] for h in reader.history()} <= set(needs.protected) | set(range(needs.floor, needs.max_id + 1))
    assert min(int(n) for n in os.listdir(root / "_ids")) == needs.floor
    left = {r.checkpoint_id for r in spark.read.format("delta").load(str(cs)).select("checkpoint_id").distinct().collect()}
    assert not {c for c in left if needs.droppable(c)} and left & set(retained) == in_flight & set(retained)
    gone = set(before) - set(files(w))
    assert any("/state/balance/" in f for f in gone) and any("/channels/" in f for f in gone)
    assert report.bytes_after < report.bytes_before
    # an older version nothing pins is gone for good; every version from the savepoint's on reads
    from deltalake import DeltaTable

    def complete(version: int) -> bool:
        return all(os.path.exists(u.removeprefix("file://")) for u in DeltaTable(str(state_table), version=version).file_uris())

    latest = DeltaTable(str(state_table)).version()
    assert all(complete(v) for v in range(pinned, latest + 1))
    lost = [v for v in range(pinned) if not complete(v)]
    assert lost, "the VACUUM took nothing the savepoint does not need"
    with pytest.raises(Exception, match="does not exist|FileNotFound|FILE_NOT_EXIST"):
        spark.read.format("delta").option("versionAsOf", lost[-1]).load(str(state_table)).select("balance_cents").collect()
    assert spark.read.format("delta").option("versionAsOf", pinned).load(str(state_table)).select("balance_cents").collect()

    # every retained checkpoint still restores: the oldest (the savepoint) replays exactly once
    older = runner(spark, w, restore_checkpoint=savepoint).run()
    assert older.restored == savepoint
    check = check_payments(str(w))
    assert check.ok, check.summary()
    assert check.ledger_rows == check.valid_rows

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
    for f in table.rglob("*.parquet"):  # the state's runs too, written into the table's ckpt/ folders
        if any(part.startswith("_") for part in f.relative_to(table).parts):
            continue
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
    retained = [c.checkpoint_id for c in store.checkpoints.all()]
    assert retained[0] == savepoint and len(retained) == 3, retained
    assert len(first.completed) + len(second.completed) >= 5
    cs = root / "edge_state" / "source_balance"  # the channel state of the edge source -> balance
    in_flight = {r.checkpoint_id for r in spark.read.format("delta").load(str(cs)).select("checkpoint_id").distinct().collect()}
    assert in_flight - set(retained), "the runs logged channel state of checkpoints no longer retained"

    # the state table's history as if the first run was 6 hours ago and the rest 2 hours ago: what
    # only versions before the savepoint's used is outside any window the savepoint allows
    pinned = min(a.state["table_version"] for sid, a in store.checkpoints.get(savepoint).acks.items() if sid.operator == "balance")
    state_table = root / "state" / "balance"
    pinned_rows = spark.read.format("delta").option("versionAsOf", pinned).load(str(state_table)).count()
    age(spark, state_table, pinned, before=6.0, since=2.0)
    # only times moved: the pinned version still reads, the same rows
    assert spark.read.format("delta").option("versionAsOf", pinned).load(str(state_table)).count() == pinned_rows > 0

    # a dry run: decides everything, deletes nothing
    before = files(w)
    dry = maintain(w, "payments", spark, dry_run=True, policy=EAGER)
    assert files(w) == before
    state = "_checkpoints/payments/state/balance"
    edge_state = "_checkpoints/payments/edge_state/source_balance"
    assert dry.rule("vacuum", state).deleted > 0 and dry.rule("channel_state rows", edge_state).deleted > 0
    assert dry.rule("checkpoints rows").deleted > 0 and dry.rule("id markers").deleted > 0

    report = maintain(w, "payments", spark, policy=EAGER)
    print(report.describe())
    needs = report.needs
    assert needs.retained == retained and needs.floor == retained[1]
    for rule, target in [("vacuum", state), ("vacuum", "_checkpoints/payments/channels/source_balance"),
                         ("channel_state rows", edge_state),
                         ("checkpoints rows", None), ("id markers", None), ("requests", None)]:
        assert report.rule(rule, target).deleted == dry.rule(rule, target).deleted, (rule, target)
    # the one rule that skips: age() dropped the state table's log checkpoints, so its log has no
    # start below the pinned version to truncate to (the rule itself: the object-store test below)
    # the files the DELETE of old channel state removed go in the same run (a dry run deletes no row)
    assert report.rule("vacuum", edge_state).deleted > 0 == dry.rule("vacuum", edge_state).deleted
    assert [(r.rule, r.target) for r in report.rules if r.skipped] == [("delta log", f"{state}/_delta_log")]
    assert f"no log checkpoint at or before version {pinned}" in report.rule("delta log", f"{state}/_delta_log").skipped
    pin = report.oldest_pinned_state["balance"]
    assert pin["pinned_by"] == savepoint and pin["oldest_version"] == pinned  # the oldest pinned version
    assert 2.0 < pin["retain_hours"] < 2.5  # back to its commit (2 h ago), not to the older ones (6 h)

    # what went is gone
    reader = DeltaCheckpointStore(root)
    assert {h["checkpoint_id"] for h in reader.checkpoints.history()} <= set(needs.protected) | set(range(needs.floor, needs.max_id + 1))
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


@pytest.mark.objectstore
def test_the_data_plane_rules_on_an_object_store_warehouse(spark, s3, tmp_path, monkeypatch):
    """The Spark rules with the warehouse on S3 (S3A; obstore lists and deletes): the channel state
    of dropped ids is deleted, a channel log's removed files are VACUUMed, the state table's window
    reaches back to the commit of its oldest pinned version, its log goes below the log checkpoint
    at or before it; a dry run names the same files and deletes nothing."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    from history import completed

    from checkpoint_lib.files import files_at
    from checkpoint_lib.layout import location
    from checkpoint_lib.spark.session import use_warehouse

    monkeypatch.chdir(tmp_path)  # nothing may land in a local folder named "s3:"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    use_warehouse(spark, s3)
    root = location(s3) / "_checkpoints" / "payments"
    store = DeltaCheckpointStore.open(root, retained=2)
    epoch = store.epochs.begin()
    store.sessions.record_restored(epoch, None, {})
    for cid in range(1, 6):  # checkpoint c pins version c of the state table: 4 and 5 retained
        store.checkpoints.record_pending(cid, epoch=epoch, trigger_time=1_790_000_000.0 + cid)
        store.checkpoints.add(completed(cid, 1_790_000_000.0 + cid), epoch=epoch)
    state, log, cs = root / "state" / "balance", root / "channels" / "source_balance", root / "channel_state"
    for v in range(7):  # one overwrite per version: each removes the files of the one before
        spark.createDataFrame([(v % 3, v)], "key_group int, balance_cents long").write.format("delta") \
            .mode("overwrite").save(str(state))
        if v == 2:
            DeltaTable(str(state)).create_checkpoint()
    for v in range(3):
        spark.createDataFrame([(v, "x")], "seq long, payload string").write.format("delta").mode("overwrite").save(str(log))
    edge_state = root / "edge_state" / "source_balance"  # a cut edge's channel state (the old table: cs)
    for table in (cs, edge_state):
        write_deltalake(str(table), pa.table({"checkpoint_id": pa.array([1, 2, 3, 4, 5, 5], pa.int64())}))
    files = files_at(root)

    def everything() -> dict[str, tuple[int, int]]:
        return {str(p): (st.size, st.modification_time) for p, st in files.walk_entries(root)}

    before = everything()
    dry = maintain(s3, "payments", spark, dry_run=True, policy=EAGER)
    assert everything() == before
    report = maintain(s3, "payments", spark, policy=EAGER)
    print(report.describe())
    assert not [r for r in report.rules if r.skipped]
    channels = "_checkpoints/payments/channels/source_balance"
    assert report.rule("vacuum", channels).deleted == dry.rule("vacuum", channels).deleted > 0
    assert {n for n in files.names(log) if n.endswith(".parquet")} == \
        {u.rsplit("/", 1)[-1] for u in DeltaTable(str(log)).file_uris()}
    for table, target in [(cs, "_checkpoints/payments/channel_state"),
                          (edge_state, "_checkpoints/payments/edge_state/source_balance")]:
        assert report.rule("channel_state rows", target).deleted == dry.rule("channel_state rows", target).deleted == 3
        left = spark.read.format("delta").load(str(table)).select("checkpoint_id").collect()
        assert sorted(r.checkpoint_id for r in left) == [4, 5, 5]
    pin = report.oldest_pinned_state["balance"]
    assert (pin["pinned_by"], pin["oldest_version"]) == (4, 4) and pin["retain_hours"] < 0.5
    assert report.rule("vacuum", "_checkpoints/payments/state/balance").deleted == 0  # all removed within the window
    state_log = "_checkpoints/payments/state/balance/_delta_log"
    assert report.rule("delta log", state_log).deleted == dry.rule("delta log", state_log).deleted > 0
    assert min(int(n[:20]) for n in files.names(state / "_delta_log") if n[:20].isdigit()) == 2
    assert spark.read.format("delta").option("versionAsOf", 4).load(str(state)).collect()[0].balance_cents == 4
    assert report.bytes_after < report.bytes_before
    assert not (tmp_path / "s3:").exists()

"""checkpoint_lib.maintenance, the delta-rs parts (no Spark): every rule keeps what the retained
checkpoints, savepoints, an owed rollback, the newest restore and the live sessions need, drops the
rest, a dry run deletes nothing, and a write that lands while a rule rewrites a table is never lost.
Each test runs with the warehouse on a local folder and on a real S3-compatible server (SeaweedFS,
tests/s3server.py): the same outcomes. The data-plane rules (channel state, VACUUM of the Spark
tables) are in tests/spark/test_maintenance_restore.py.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from storage import put

from checkpoint_lib import maintenance
from checkpoint_lib.control import CheckpointRequests
from checkpoint_lib.core.checkpoints import CompletedCheckpoint
from checkpoint_lib.core.errors import FailureReason
from checkpoint_lib.core.retention import PrunedStore, Retention
from checkpoint_lib.core.types import CheckpointKind, SubtaskAck, SubtaskId
from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.files import files_at
from checkpoint_lib.layout import location
from checkpoint_lib.maintenance import RetentionPolicy, maintain, sessions_to_keep
from checkpoint_lib.quality.paths import quality_root
from checkpoint_lib.quality.records import ValidationLog
from checkpoint_lib.quality.result import QualityResult

DAY = 86400.0
T0 = 1_800_000_000.0  # the simulated clock: one checkpoint an hour from here
SRC, OP = SubtaskId("source", 0), SubtaskId("balance", 0)
NOW_POLICY = RetentionPolicy(file_retention_hours=0.0, pinned_margin_hours=0.0, control_log_hours=0.0)


def completed(cid: int, kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> CompletedCheckpoint:
    acks = {SRC: SubtaskAck(state={"version": cid, "barrier_seq": cid}),
            OP: SubtaskAck(state={"table_version": 10 + cid, "key_groups": [0, 127], "cursor": cid})}
    t = T0 + 3600 * cid
    return CompletedCheckpoint(cid, kind, t, t + 1, acks, {s: t + 1 for s in acks})


@pytest.fixture
def warehouse(storage_root, tmp_path, monkeypatch):
    """A warehouse on a local folder (``posix``) and on the S3 server (``s3``); GX's working copy of
    a remote warehouse (quality_root: under the user's cache) inside the test's own folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return storage_root


class Pipeline:
    """Drives one pipeline's control plane as the runner and the snapshot DAG do."""

    def __init__(self, warehouse, retained: int = 3):
        self.warehouse = location(warehouse)
        self.root = self.warehouse / "_checkpoints" / "payments"
        self.files = files_at(self.root)
        self.store = DeltaCheckpointStore.open(self.root, retained=retained)
        self.requests = CheckpointRequests(self.root)
        self.epoch = self.store.epochs.begin()
        self.store.sessions.record_restored(self.epoch, None, {"source": {}, "keyed": {}})
        self.sessions = {"source": 0, "keyed": 0}

    def run(self, kind: CheckpointKind = CheckpointKind.CHECKPOINT, *, abort: bool = False,
            complete: bool = True) -> int:
        """One hourly run: a request, both stages' sessions, a checkpoint (completed, aborted or
        left pending), validation rows."""
        store = self.store
        cid = store.ids.peek()
        t = T0 + 3600 * cid
        self.requests.create(f"run-{cid}", "payments_snapshot", now=t)
        for stage in ("source", "keyed"):
            self.sessions[stage] = store.sessions.begin(self.epoch, stage, after=self.sessions[stage])
        assert store.ids.get_and_increment() == cid
        self.requests.honour(self.requests.open(), cid, self.epoch)
        store.checkpoints.record_pending(cid, kind, t, self.epoch)
        c = completed(cid, kind)
        store.acks.record(cid, {SRC: c.acks[SRC]}, self.epoch, t)
        if abort:
            store.checkpoints.record_aborted(cid, FailureReason.DECLINED, "declined", self.epoch)
        elif complete:
            store.acks.record(cid, {OP: c.acks[OP]}, self.epoch, t + 1)
            store.checkpoints.add(c, epoch=self.epoch)
            ValidationLog(self.root).record(QualityResult(
                pipeline="payments", kind="checkpoint", checkpoint_id=cid, epoch=self.epoch,
                restored_checkpoint_id=None, run_name=f"payments-checkpoint-c{cid}-e{self.epoch}-x",
                data_docs="", started_at=t, finished_at=t + 1, validation_id=f"v{cid}"))
        for stage in ("source", "keyed"):
            store.sessions.end(self.epoch, stage, self.sessions[stage], {"at": cid})
        return cid


def gx_run(warehouse, cid: int | None, when: float, view: str = "subtasks") -> list[Path]:
    """A fake GX result and its Data Docs page, laid out as GX 1.x writes them (in the warehouse's
    ``_quality/payments``, or a remote warehouse's working copy on this machine)."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(when))
    name = f"payments-checkpoint-c{cid}-e1-{stamp}Z" if cid is not None else f"payments-checkpoint-error-{stamp}Z"
    q = quality_root(warehouse, "payments")
    out = []
    for base, suffix in ((q / "gx" / "uncommitted" / "validations", ".json"), (q / "data_docs" / "validations", ".html")):
        f = base / "payments" / "per_checkpoint" / view / name / f"{stamp}.000000Z" / f"warehouse-x{suffix}"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("{}")
        out.append(f)
    return out


def files_under(*roots) -> dict[str, tuple[int, int]]:
    """Every file under ``roots`` (local folders or object-store prefixes), with its size and time."""
    return {str(p): (st.size, st.modification_time) for r in roots for p, st in files_at(r).walk_entries(r)}


def everything(p: "Pipeline") -> dict[str, tuple[int, int]]:
    """Every file of the pipeline: the warehouse, and GX's working copy when it is elsewhere."""
    return files_under(p.warehouse, quality_root(p.warehouse, "payments"))


def resume_points(store: DeltaCheckpointStore, epoch: int) -> dict:
    """What PipelineRunner._resume_points reads: per stage, live sessions and the last end's point."""
    rows = store.sessions.of_epoch(epoch)
    out = {"restored": [r["checkpoint_id"] for r in rows if r["event"] == "restored"][:1]}
    for stage in ("source", "keyed"):
        mine = [r for r in rows if r["stage"] == stage]
        started = {r["session"] for r in mine if r["event"] == "start"}
        ended = {r["session"]: r for r in mine if r["event"] == "end"}
        out[stage] = (sorted(started - set(ended)), max(ended, default=0),
                      ended[max(ended)]["resume_json"] if ended else None, max(started, default=0))
    return out


def build_world(warehouse) -> Pipeline:
    p = Pipeline(warehouse)
    savepoint = None
    for i in range(14):
        if i == 2:
            savepoint = p.run(CheckpointKind.SAVEPOINT)
        elif i == 5:
            p.run(abort=True)
        else:
            p.run()
    p.savepoint = savepoint
    p.run(complete=False)  # a checkpoint in flight (pending, its source ack recorded)
    return p


def copy_tree(source, target) -> None:
    """Every file under ``source`` to the same place under ``target`` (a local folder: with its
    times; an object-store prefix: server-side copies)."""
    if isinstance(source, Path):
        shutil.copytree(source, target, dirs_exist_ok=True)
        return
    import obstore

    from checkpoint_lib.objectstore import store_at

    files = list(files_at(source).walk(source))
    assert files, source
    bucket = f"s3://{urlsplit(source).netloc}"
    store = store_at(bucket, None)
    key = lambda uri: urlsplit(uri).path.strip("/")  # noqa: E731
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda f: obstore.copy(store, key(f), key(target / f[len(source) + 1:])), files))


@pytest.fixture(scope="module")
def world_templates():
    """One world per kind of storage, built the first time a test of this module asks for it (on
    S3 a world is ~15 s of small commits); every test gets its own copy."""
    return {}


@pytest.fixture
def world(warehouse, world_templates, tmp_path_factory):
    """15 hourly runs of the pipeline: 12 completed checkpoints, a savepoint (run 3), an aborted
    one (run 6), and one in flight (pending, its source ack recorded). Built once per storage in
    a place of its own, then copied to this test's warehouse (the tests change it)."""
    kind = "posix" if isinstance(warehouse, Path) else "s3"
    if kind not in world_templates:
        place = tmp_path_factory.mktemp("world") if kind == "posix" else warehouse.parent / f"{warehouse.name}-world"
        world_templates[kind] = build_world(place)
    template = world_templates[kind]
    copy_tree(template.warehouse, warehouse)
    p = Pipeline.__new__(Pipeline)
    p.warehouse = location(warehouse)
    p.root = p.warehouse / "_checkpoints" / "payments"
    p.files = files_at(p.root)
    p.store = DeltaCheckpointStore.open(p.root, retained=3)
    p.requests = CheckpointRequests(p.root)
    p.epoch, p.sessions, p.savepoint = template.epoch, dict(template.sessions), template.savepoint
    return p


@pytest.mark.parametrize("storage_root", ["posix", pytest.param("s3", marks=[pytest.mark.objectstore, pytest.mark.slow])],
                         indirect=True)  # on S3 over a minute; CI tier: the dry run, the rewrite race and the other state log on S3
def test_every_rule_keeps_what_is_needed_and_drops_the_rest(world):
    p, store = world, world.store
    # a request still open, GX runs old and new, a request decided long ago
    p.requests.create("open-one", now=T0)
    for cid in (1, p.savepoint, 4, 12, 13):
        gx_run(p.warehouse, cid, T0 + 3600 * cid)
    gx_run(p.warehouse, None, T0)  # a validation that failed before it knew its checkpoint
    reader = DeltaCheckpointStore(p.root)
    before = {
        "all": [c.checkpoint_id for c in reader.checkpoints.all()], "latest": reader.checkpoints.latest().checkpoint_id,
        "plan": reader.recovery_plan().describe(), "owed": reader.sessions.owed_rollback(),
        "fences": {t: reader.epochs.fence(t) for t in ("checkpoints", "acks", "sessions")},
        "resume": resume_points(reader, p.epoch), "pending": [r["checkpoint_id"] for r in reader.checkpoints.pending()],
        "pending_acks": reader.acks.pending(reader.checkpoints.pending()[0]["checkpoint_id"], p.epoch),
        "max": max(h["checkpoint_id"] for h in reader.checkpoints.history()),
    }
    retained = before["all"]
    assert p.savepoint in retained and len(retained) == 4  # three checkpoints and the savepoint

    fresh, stale = p.requests.directory / ".r.request.host.1.2.tmp", p.requests.directory / ".r.request.host.1.1.tmp"
    put(fresh, b"{}")  # a request being written right now: its link is next
    local = isinstance(p.root, Path)  # an object store's times cannot be set (nor are temporary files written there)
    if local:
        put(stale, b"{}")  # one whose writer was killed a month ago
        os.utime(stale, (time.time() - 30 * DAY, time.time() - 30 * DAY))
    now = T0 + 3600 * 15 + 30 * DAY  # a month later: every decided request is old
    report = maintain(p.warehouse, "payments", now=now, policy=NOW_POLICY)
    needs = report.needs
    assert needs.retained == retained and needs.floor == min(c for c in retained if c != p.savepoint)
    assert needs.savepoints == [p.savepoint] and needs.pending == before["pending"]

    reader = DeltaCheckpointStore(p.root)
    kept_ids = {h["checkpoint_id"] for h in reader.checkpoints.history()}
    assert kept_ids == {*retained, *before["pending"]} | {i for i in range(needs.floor, before["max"] + 1)}
    assert p.savepoint in kept_ids and 1 not in kept_ids and 6 not in kept_ids  # the aborted one went
    # everything a recovery, a resume, a rollback and the id counter read is unchanged
    assert [c.checkpoint_id for c in reader.checkpoints.all()] == before["all"]
    assert reader.checkpoints.latest().checkpoint_id == before["latest"]
    assert reader.recovery_plan().describe() == before["plan"] and reader.sessions.owed_rollback() == before["owed"]
    assert {t: reader.epochs.fence(t) for t in ("checkpoints", "acks", "sessions")} == before["fences"]
    assert resume_points(reader, p.epoch) == before["resume"]
    assert [r["checkpoint_id"] for r in reader.checkpoints.pending()] == before["pending"]
    assert reader.acks.pending(before["pending"][0], p.epoch) == before["pending_acks"]
    assert reader.checkpoints.get(p.savepoint).kind is CheckpointKind.SAVEPOINT
    acks_left = set(DeltaTable(str(p.root / "acks")).to_pyarrow_table()["checkpoint_id"].to_pylist())
    assert acks_left == set(before["pending"])  # a completed row repeats its acks
    sessions = DeltaTable(str(p.root / "sessions")).to_pyarrow_table().to_pylist()
    assert len(sessions) == 1 + 2 * 2  # the restored row and each stage's last session
    # markers: only below the floor went; the counter never goes back
    markers = sorted(int(n) for n in p.files.names(p.root / "_ids"))
    assert markers == list(range(needs.floor, before["max"] + 1))
    assert store.ids.get_and_increment() == before["max"] + 1
    # requests: decided and old ones went, the open one stays
    left = {r.request_id: r.state for r in p.requests.all()}
    assert left == {"open-one": "requested"}
    assert p.files.exists(fresh) and not p.files.exists(stale)  # ages of files go by the clock, not by now
    # validations: rows of dropped ids went; retained ones and the newest stay
    vals = {r["checkpoint_id"] for r in ValidationLog(p.root).rows()}
    assert p.savepoint in vals and 1 not in vals and vals <= kept_ids
    # GX runs: results and pages of dropped ids (and the old error run) went, the rest stay
    q = quality_root(p.warehouse, "payments")
    runs = {d.name for d in (q / "gx/uncommitted/validations/payments/per_checkpoint/subtasks").iterdir()}
    pages = {d.name for d in (q / "data_docs/validations/payments/per_checkpoint/subtasks").iterdir()}
    assert runs == pages and {n.split("-e1-")[0] for n in runs} == {
        f"payments-checkpoint-c{c}" for c in (p.savepoint, 12, 13)}
    assert report.rule("gx results").deleted == report.rule("data docs pages").deleted == 3
    # the control tables' removed files are gone: what remains is what the log references
    for name in ("checkpoints", "acks", "sessions", "validations"):
        dt = DeltaTable(str(p.root / name))
        on_disk = {n for n in p.files.names(p.root / name) if n.endswith(".parquet")}
        assert on_disk == {Path(u).name for u in dt.file_uris()}, name
    # the control tables' logs start at their latest log checkpoint; the fences are in it
    log_dir = p.root / "checkpoints" / "_delta_log"
    assert report.rule("delta log", "_checkpoints/payments/checkpoints/_delta_log").deleted > 0
    assert not p.files.exists(log_dir / f"{0:020d}.json")
    config = DeltaTable(str(p.root / "checkpoints")).metadata().configuration
    assert config["delta.logRetentionDuration"] == config["delta.deletedFileRetentionDuration"] == "interval 0 minutes"
    # the data-plane rules said why they did nothing
    assert all(r.skipped for r in report.rules if r.rule in ("channel_state rows",))
    assert report.bytes_after < report.bytes_before
    assert "DRY RUN" not in report.describe() and "checkpoints rows" in report.describe()

    # and the pipeline goes on: a second maintenance after more checkpoints keeps the same promises
    store.checkpoints.record_aborted(before["pending"][0], FailureReason.EXPIRED, "late", p.epoch)
    for _ in range(4):
        p.run()
    again = maintain(p.warehouse, "payments", now=now + DAY, policy=NOW_POLICY)
    reader = DeltaCheckpointStore(p.root)
    assert [c.checkpoint_id for c in reader.checkpoints.all()] == again.needs.retained
    assert p.savepoint in again.needs.retained and min(reader.checkpoints.history(), key=lambda h: h["checkpoint_id"])[
        "checkpoint_id"] == p.savepoint


def test_a_dry_run_deletes_nothing(world):
    p = world
    for cid in (1, 3, 13):
        gx_run(p.warehouse, cid, T0 + 3600 * cid)
    before = everything(p)
    report = maintain(p.warehouse, "payments", dry_run=True, now=T0 + 60 * DAY, policy=NOW_POLICY)
    assert everything(p) == before
    assert report.dry_run and "DRY RUN" in report.describe()
    for rule in ("checkpoints rows", "acks rows", "sessions rows", "id markers", "requests", "gx results", "delta log"):
        assert report.rule(rule).deleted > 0, rule
    assert report.rule("vacuum", "_checkpoints/payments/checkpoints").deleted > 0  # the compactions' leftovers
    real = maintain(p.warehouse, "payments", now=T0 + 60 * DAY, policy=NOW_POLICY)
    for rule in ("checkpoints rows", "acks rows", "sessions rows", "id markers", "requests", "gx results"):
        assert real.rule(rule).deleted == report.rule(rule).deleted, rule


def state_table(p: Pipeline, versions: int, log_checkpoints_at: tuple[int, ...]):
    """The keyed operator's state table as Delta lays it out (one commit per flush, a log
    checkpoint now and then), every log file an hour old on a disk (on an object store, as old as
    it is: the rules' window is 0 here)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    table = p.root / "state" / OP.operator
    for v in range(versions):
        write_deltalake(str(table), pa.table({"key_group": [v % 128], "balance_cents": [v]}), mode="append")
        if v in log_checkpoints_at:
            DeltaTable(str(table)).create_checkpoint()
    if isinstance(table, Path):
        for f in (table / "_delta_log").iterdir():
            os.utime(f, (time.time() - 3600, time.time() - 3600))
    return table


@pytest.mark.parametrize("storage_root", ["posix", pytest.param("s3", marks=[pytest.mark.objectstore, pytest.mark.slow])],
                         indirect=True)  # on S3 a minute; CI tier: the posix run, and the state log left alone on S3 below
def test_a_state_tables_log_is_cleaned_below_the_oldest_pinned_version_and_every_pinned_one_stays(world):
    """The state table keeps a 100-year log retention (time travel to a savepoint), so Delta never
    cleans its log: maintenance deletes what lies below the newest log checkpoint at or before the
    oldest pinned version, and every retained checkpoint's and the savepoint's version still reads."""
    p = world
    table = state_table(p, 31, log_checkpoints_at=(10, 20, 30))
    pinned = maintenance.pinned_state_versions(p.store, maintenance.read_needs(DeltaCheckpointStore(p.root)),
                                               OP.operator)
    assert min(pinned.values()) == 10 + p.savepoint == 13  # checkpoint c pins version 10 + c
    before = {v: DeltaTable(str(table), version=v).to_pyarrow_table().num_rows for v in (*pinned.values(), 30)}

    dry = maintain(p.warehouse, "payments", dry_run=True, now=T0 + 60 * DAY, policy=NOW_POLICY)
    target = "_checkpoints/payments/state/balance/_delta_log"
    assert dry.rule("delta log", target).deleted == 10 and p.files.exists(table / "_delta_log" / f"{0:020d}.json")
    report = maintain(p.warehouse, "payments", now=T0 + 60 * DAY, policy=NOW_POLICY)
    outcome = report.rule("delta log", target)
    assert outcome.deleted == 10 and "log checkpoint of version 10" in outcome.keeps
    left = sorted(int(n[:20]) for n in p.files.names(table / "_delta_log") if n[:20].isdigit())
    assert left[0] == 10  # versions 0-9 went; the checkpoint of 10 and the commits after it stay
    assert {v: DeltaTable(str(table), version=v).to_pyarrow_table().num_rows for v in before} == before
    with pytest.raises(TableNotFoundError, match="No files in log segment"):
        DeltaTable(str(table), version=9)  # below what anything pins: no longer reproducible
    again = maintain(p.warehouse, "payments", now=T0 + 61 * DAY, policy=NOW_POLICY)
    assert again.rule("delta log", target).deleted == 0  # the savepoint still pins version 13


def test_a_state_log_without_a_log_checkpoint_below_the_oldest_pinned_version_is_left_alone(world):
    table = state_table(world, 31, log_checkpoints_at=(20, 30))
    before = files_under(table / "_delta_log")
    report = maintain(world.warehouse, "payments", now=T0 + 60 * DAY, policy=NOW_POLICY)
    assert "no log checkpoint at or before version 13" in report.rule("delta log", "_checkpoints/payments/state/balance/_delta_log").skipped
    assert files_under(table / "_delta_log") == before


@pytest.mark.race
def test_a_write_landing_during_a_rewrite_is_never_lost(world, monkeypatch):
    """Each rewrite decided on snapshot v; another process commits v+1 before the overwrite: the
    overwrite is refused, the rule reads again and decides again, and the write survives."""
    p = world
    other = DeltaCheckpointStore(p.root, retained=3)  # another process of the pipeline
    pending = other.checkpoints.pending()[0]["checkpoint_id"]
    raced: dict[str, int] = {}

    def race(table: str) -> None:
        raced[table] = raced.get(table, 0) + 1
        if raced[table] > 1:
            return
        if table == "checkpoints":
            new = other.ids.get_and_increment()
            other.checkpoints.record_pending(new, trigger_time=T0, epoch=p.epoch)
            raced["new_id"] = new
        elif table == "acks":
            other.acks.record(pending, {OP: completed(pending).acks[OP]}, p.epoch)
        elif table == "sessions":
            raced["session"] = other.sessions.begin(p.epoch, "source", after=p.sessions["source"])
        elif table == "validations":
            ValidationLog(p.root).record(QualityResult(
                pipeline="payments", kind="restore", checkpoint_id=1, epoch=p.epoch, restored_checkpoint_id=None,
                run_name="payments-restore-c1-e1-raced", data_docs="", started_at=T0, finished_at=T0,
                validation_id="raced"))

    real_rewrite = maintenance.rewrite

    def racing_rewrite(load, read, decide, **kwargs):
        """maintenance's rewrite, with ``race(table)`` between its decision and its commit."""
        loaded = {}

        def load_and_keep():
            loaded["dt"] = load()
            return loaded["dt"]

        def before_commit():
            race(loaded["dt"].table_uri.rstrip("/").rsplit("/", 1)[-1])

        return real_rewrite(load_and_keep, read, decide, before_commit=before_commit, **kwargs)

    monkeypatch.setattr(maintenance, "rewrite", racing_rewrite)
    report = maintain(p.warehouse, "payments", now=T0 + 60 * DAY, policy=NOW_POLICY)
    assert {t: n for t, n in raced.items() if t in ("checkpoints", "acks", "sessions", "validations")} == {
        "checkpoints": 2, "acks": 2, "sessions": 2, "validations": 2}  # refused once, then landed
    reader = DeltaCheckpointStore(p.root)
    assert reader.checkpoints.status(raced["new_id"])["status"] == "pending"
    assert OP in reader.acks.pending(pending, p.epoch) and SRC in reader.acks.pending(pending, p.epoch)
    live = [r for r in reader.sessions.of_epoch(p.epoch) if r["stage"] == "source" and r["session"] == raced["session"]]
    assert [r["event"] for r in live] == ["start"]  # the live session the racing start began
    assert reader.sessions.begin(p.epoch, "source", after=p.sessions["source"]) is None  # still live: no second one
    assert "raced" in {r["validation_id"] for r in ValidationLog(p.root).rows()}  # the newest restore row
    assert report.rule("checkpoints rows").deleted > 0 and report.rule("sessions rows").deleted > 0
    assert all(report.rule(f"{t} rows").retries == 1 for t in ("checkpoints", "acks", "sessions", "validations"))


@pytest.mark.race
@pytest.mark.parametrize("storage_root", ["posix", pytest.param("s3", marks=[pytest.mark.objectstore, pytest.mark.slow])],
                         indirect=True)  # on S3 a minute: CI pins the race deterministically (the test above)
def test_maintenance_racing_a_running_pipeline_loses_nothing(warehouse):
    """A pipeline thread keeps checkpointing (requests, sessions, pending, acks, completion,
    validation rows) while maintenance runs again and again: every checkpoint the pipeline
    completed is there unless it was below the floor, every status is the one the pipeline wrote,
    and the sessions still resume where the last run ended."""
    p = Pipeline(warehouse)
    for _ in range(3):
        p.run()
    done: dict[int, str] = {}
    errors: list[BaseException] = []
    stop = threading.Event()

    def pipeline() -> None:
        try:
            i = 0
            while not stop.is_set() and i < 40:
                abort = i % 7 == 3
                cid = p.run(abort=abort)
                done[cid] = "aborted" if abort else "completed"
                i += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    worker = threading.Thread(target=pipeline)
    worker.start()
    reports = []
    try:
        while worker.is_alive() and len(reports) < 25:
            reports.append(maintain(warehouse, "payments", now=T0 + 400 * DAY,
                                    policy=RetentionPolicy(file_retention_hours=1.0)))
    finally:
        stop.set()
        worker.join()
    assert not errors, errors
    assert len(reports) >= 2
    print("maintenance runs:", len(reports), "rewrites refused by a concurrent commit:",
          sum(r.retries for rep in reports for r in rep.rules))
    final = maintain(warehouse, "payments", now=T0 + 400 * DAY, policy=RetentionPolicy(file_retention_hours=1.0))
    reader = DeltaCheckpointStore(p.root)
    statuses = {h["checkpoint_id"]: h["status"] for h in reader.checkpoints.history()}
    floor = final.needs.floor
    for cid, status in done.items():
        if cid >= floor:
            assert statuses.get(cid) in (status, "discarded"), (cid, status, statuses.get(cid))
    retained = [c.checkpoint_id for c in DeltaCheckpointStore(p.root, retained=3).checkpoints.all()]
    assert retained == sorted(c for c, s in done.items() if s == "completed")[-3:]
    points = resume_points(reader, p.epoch)
    assert points["source"][0] == [] and json.loads(points["source"][2]) == {"at": max(done)}
    assert reader.ids.get_and_increment() == max(done) + 1


@pytest.mark.parametrize("storage_root", ["posix", pytest.param("s3", marks=[pytest.mark.objectstore, pytest.mark.slow])],
                         indirect=True)  # on S3 a minute; CI tier: the posix run (the rules are storage-blind; the stores' S3 paths run above)
def test_an_owed_rollback_and_the_newest_restore_keep_what_they_read(warehouse):
    p = Pipeline(warehouse)
    for _ in range(8):
        p.run()
    store = p.store
    # epoch 2 restored checkpoint 6 (older than the latest: 7 and 8 discarded), then ran on
    epoch = store.epochs.begin()
    store.sessions.record_rollback(epoch, 6)
    store.checkpoints.mark_discarded([store.checkpoints.get(7), store.checkpoints.get(8)], "rolled back", epoch=epoch)
    store.sessions.record_restored(epoch, 6, {"source": {}, "keyed": {}})
    p.epoch, p.sessions = epoch, {"source": 0, "keyed": 0}
    for _ in range(5):
        p.run()
    # epoch 3 began a rollback to checkpoint 12 and died before it finished restoring: owed
    dead = store.epochs.begin()
    store.sessions.record_rollback(dead, 12)
    before_plan = DeltaCheckpointStore(p.root).recovery_plan().describe()
    report = maintain(warehouse, "payments", now=T0 + 60 * DAY, policy=NOW_POLICY)
    assert report.needs.owed_rollback == 12 and report.needs.restored == 6 and 6 < report.needs.floor
    reader = DeltaCheckpointStore(p.root)
    assert reader.sessions.owed_rollback() == 12 and reader.recovery_plan().describe() == before_plan
    assert reader.checkpoints.acks(6)  # the after-restore suite reads the restored checkpoint's acks
    assert 5 not in {h["checkpoint_id"] for h in reader.checkpoints.history()}
    rows = DeltaTable(str(p.root / "sessions")).to_pyarrow_table().to_pylist()
    assert {r["epoch"] for r in rows} == {epoch, dead}  # epoch 1 finished long ago
    assert any(r["event"] == "rollback" and r["epoch"] == dead for r in rows)


@pytest.mark.parametrize("storage_root", ["posix"], indirect=True)  # the rules on S3: the tests above
def test_each_pruned_store_says_which_rows_it_keeps_and_maintenance_keeps_exactly_those(world):
    p = world
    reader = DeltaCheckpointStore(p.root)
    needs = maintenance.read_needs(reader)
    retention = Retention(needs.restores, lambda: (needs, reader.checkpoints.table.view().statuses),
                          now=T0 + 60 * DAY, result_days=NOW_POLICY.result_days)
    stores = [reader.acks, reader.checkpoints, reader.sessions, ValidationLog(p.root)]
    assert all(isinstance(store, PrunedStore) for store in stores)
    kept = {}
    for store in stores:
        snapshot = store.load()
        rows = store.rows_at(snapshot)
        kept[store.name] = (len(rows), store.rows_to_keep(snapshot, rows, retention))
    assert {r["checkpoint_id"] for r in kept["acks"][1]} == set(needs.pending)
    assert {r["checkpoint_id"] for r in kept["checkpoints"][1]} == {
        i for i in needs.protected | set(range(needs.floor, needs.max_id + 1)) if i}
    assert kept["sessions"][1] == sessions_to_keep(reader.sessions.table.rows())

    report = maintain(p.warehouse, "payments", now=T0 + 60 * DAY, policy=NOW_POLICY)
    for store in stores:
        total, keep = kept[store.name]
        outcome = report.rule(f"{store.name} rows")
        assert (outcome.deleted, outcome.kept) == (total - len(keep), len(keep)), store.name
        assert outcome.keeps == store.keeps(retention) and outcome.deleted > 0
        assert sorted(map(str, store.rows_at(store.load()))) == sorted(map(str, keep)), store.name


def test_sessions_to_keep_keeps_what_resuming_reads():
    def row(epoch, stage, session, event):
        return {"epoch": epoch, "stage": stage, "session": session, "event": event, "recorded_at": float(session)}

    rows = [row(1, "*", 0, "restored"), row(1, "source", 1, "start"), row(1, "source", 1, "end"),
            row(2, "*", 0, "restored")]
    rows += [row(2, "source", s, e) for s in range(1, 6) for e in ("start", "end")]
    rows += [row(2, "keyed", s, e) for s in range(1, 4) for e in ("start", "end")] + [row(2, "keyed", 4, "start")]
    kept = {(r["epoch"], r["stage"], r["session"], r["event"]) for r in sessions_to_keep(rows)}
    assert kept == {(2, "*", 0, "restored"), (2, "source", 5, "start"), (2, "source", 5, "end"),
                    (2, "keyed", 3, "start"), (2, "keyed", 3, "end"), (2, "keyed", 4, "start")}
    assert sessions_to_keep(rows[1:3]) == rows[1:3]  # no epoch finished restoring: everything stays


def test_a_pipeline_that_never_ran_is_left_alone(warehouse):
    report = maintain(warehouse, "payments")
    assert files_under(warehouse) == {}  # nothing created (not even a probe of the store)
    assert report.rules[0].skipped and "never ran" in report.rules[0].skipped
    with pytest.raises(ValueError, match="pipeline name"):
        maintain(warehouse, "../etc")
    with pytest.raises(ValueError, match="must be a number"):
        RetentionPolicy(request_days=-1)

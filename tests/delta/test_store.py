"""DeltaCheckpointStore: the core store contract on Delta tables, plus what only a durable store has
(restarts, crashes, races between processes, epochs, history, corrupt rows). No Spark here.

``tests/delta`` deliberately has no ``__init__.py``: as a package it would be importable as the
top-level name ``delta`` and shadow delta-spark's ``delta`` package for the whole test run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from checkpoint_lib.core.checkpoints import CompletedCheckpoint
from checkpoint_lib.core.clock import ManualClock
from checkpoint_lib.core.errors import FailureReason, FencedError, UnknownCheckpointError
from checkpoint_lib.core.types import CheckpointKind, SubtaskAck, SubtaskId
from checkpoint_lib.delta.checkpoint_table import CHECKPOINTS_SCHEMA, CorruptCheckpointWarning
from checkpoint_lib.delta.control_table import CorruptControlTableError
from checkpoint_lib.delta.store import DeltaCheckpointStore

# The shared contract lives in tests/core, which (like every test directory here) is not a package.
# pytest's default "prepend" import mode puts tests/core on sys.path to import it as
# ``test_store_contract``; do the same, so both files share one module object.
_CORE_TESTS = str(Path(__file__).resolve().parents[1] / "core")
if _CORE_TESTS not in sys.path:
    sys.path.insert(0, _CORE_TESTS)
from test_store_contract import (  # noqa: E402
    AckStoreContract, CompletedCheckpointStoreContract, EpochStoreContract, SessionStoreContract,
    ValidationVerdictsContract, checkpoint, ids,
)

REPO = Path(__file__).resolve().parents[2]


class TestDeltaStoreContract(CompletedCheckpointStoreContract):
    """The Delta store passes exactly the contract the in-memory store passes."""

    @pytest.fixture(autouse=True)
    def _tmp(self, tmp_path):
        self.tmp_path = tmp_path
        self.made = 0

    def _fresh_root(self) -> Path:
        self.made += 1
        return self.tmp_path / f"store{self.made}"

    def make_store(self, retained: int):
        return DeltaCheckpointStore(self._fresh_root(), retained).checkpoints

    def make_counter(self):
        return DeltaCheckpointStore(self._fresh_root()).ids


class TestDeltaRoleStoreContracts(EpochStoreContract, AckStoreContract, SessionStoreContract,
                                  ValidationVerdictsContract):
    """Every role store of the Delta control plane passes its role's contract."""

    @pytest.fixture(autouse=True)
    def _tmp(self, tmp_path):
        self.tmp_path = tmp_path
        self.made = 0

    def make_control(self):
        self.made += 1
        return DeltaCheckpointStore(self.tmp_path / f"control{self.made}", retained=3)


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "_checkpoints" / "pipeline"


def statuses(store: DeltaCheckpointStore) -> dict[int, str]:
    return {h["checkpoint_id"]: h["status"] for h in store.checkpoints.history()}


# --- construction ---------------------------------------------------------------------------------


def test_constructor_does_no_io(root):
    store = DeltaCheckpointStore(root)
    assert not root.exists()
    assert store.ids.peek() == 1 and store.checkpoints.latest() is None and store.checkpoints.history() == []
    assert not root.exists()


def test_open_creates_both_tables(root):
    DeltaCheckpointStore.open(root)
    assert pa.schema(DeltaTable(str(root / "checkpoints")).schema().to_arrow()) == CHECKPOINTS_SCHEMA
    assert DeltaTable(str(root / "epochs")).version() == 0


def test_rejects_retained_below_one(root):
    with pytest.raises(ValueError, match="^retained must be >= 1$"):
        DeltaCheckpointStore(root, retained=0)


def test_imports_without_spark():
    code = "import sys, checkpoint_lib.delta.store; assert 'pyspark' not in sys.modules, 'pyspark'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# --- ids survive restarts and crashes -------------------------------------------------------------


def test_ids_survive_a_new_store_instance(root):
    first = DeltaCheckpointStore(root)
    assert [first.ids.get_and_increment() for _ in range(3)] == [1, 2, 3]
    first.checkpoints.add(checkpoint(2))
    again = DeltaCheckpointStore(root)
    assert again.ids.peek() == 4
    assert again.ids.get_and_increment() == 4
    assert again.checkpoints.latest().checkpoint_id == 2


def test_pending_and_aborted_ids_are_never_reused_after_a_crash(root):
    dead = DeltaCheckpointStore(root)
    one, two, three = (dead.ids.get_and_increment() for _ in range(3))
    dead.checkpoints.record_pending(one, CheckpointKind.CHECKPOINT, 10.0, epoch=1)
    dead.checkpoints.record_pending(two, CheckpointKind.SAVEPOINT, 11.0, epoch=1)
    dead.checkpoints.record_aborted(two, FailureReason.EXPIRED, "timed out", epoch=1)
    # ``three`` was reserved and then the process died before writing any row.
    del dead
    restarted = DeltaCheckpointStore(root)
    assert restarted.ids.peek() == 4
    assert restarted.ids.get_and_increment() == 4
    assert statuses(restarted) == {1: "pending", 2: "aborted"}


def test_ids_in_the_table_are_not_reused_even_without_their_markers(root):
    store = DeltaCheckpointStore(root)
    store.checkpoints.add(checkpoint(7))  # an id the counter never handed out
    for marker in (root / "_ids").iterdir():
        marker.unlink()
    assert DeltaCheckpointStore(root).ids.get_and_increment() == 8  # 1 + max id in the table


def test_an_added_id_is_reserved_so_a_stale_counter_skips_it(root):
    counter = DeltaCheckpointStore(root)
    assert counter.ids.get_and_increment() == 1
    DeltaCheckpointStore(root).checkpoints.add(checkpoint(2))
    assert counter.ids.get_and_increment() == 3


_RACER = textwrap.dedent(
    """
    import json, os, sys, time
    from checkpoint_lib.core.types import CheckpointKind
    from checkpoint_lib.delta.store import DeltaCheckpointStore
    root, go, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = DeltaCheckpointStore(root)
    while not os.path.exists(go):
        time.sleep(0.001)
    got = []
    for _ in range(n):
        i = store.ids.get_and_increment()
        got.append(i)
        store.checkpoints.record_pending(i, CheckpointKind.CHECKPOINT, time.time(), 0)
    print(json.dumps(got))
    """
)


@pytest.mark.race
def test_concurrent_get_and_increment_from_two_processes_gives_distinct_ids(root, tmp_path):
    go = tmp_path / "go"
    n = 12
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(root), str(go), str(n)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    time.sleep(0.5)  # let both import and wait at the start line
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    a, b = results
    assert len(a) == len(b) == n
    assert a == sorted(a) and b == sorted(b)  # strictly increasing within each process
    assert not set(a) & set(b), (a, b)
    assert sorted(statuses(DeltaCheckpointStore(root))) == sorted(a + b)
    assert DeltaCheckpointStore(root).ids.get_and_increment() > max(a + b)


def test_concurrent_get_and_increment_from_threads_and_instances(root):
    stores = [DeltaCheckpointStore(root) for _ in range(4)]
    got: list[list[int]] = [[] for _ in stores]

    def take(k: int) -> None:
        for _ in range(8):
            got[k].append(stores[k].ids.get_and_increment())

    threads = [threading.Thread(target=take, args=(k,)) for k in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [i for g in got for i in g]
    assert len(flat) == len(set(flat)) == 32


@pytest.mark.crash
def test_sigkill_at_any_point_leaves_a_readable_store_and_no_reused_id(root):
    """A writer loops reserve -> pending -> complete; kill -9 it at random points, restart."""
    code = textwrap.dedent(
        """
        import sys, time
        from checkpoint_lib.core.checkpoints import CompletedCheckpoint
        from checkpoint_lib.core.types import CheckpointKind, SubtaskAck, SubtaskId
        from checkpoint_lib.delta.store import DeltaCheckpointStore
        store = DeltaCheckpointStore(sys.argv[1], retained=2)
        src = SubtaskId("src", 0)
        while True:
            i = store.ids.get_and_increment()
            store.checkpoints.record_pending(i, CheckpointKind.CHECKPOINT, float(i), 0)
            store.checkpoints.add(CompletedCheckpoint(i, CheckpointKind.CHECKPOINT, float(i), i + 0.5,
                                          {src: SubtaskAck(state={"offset": i})}, {src: i + 0.25}))
        """
    )
    seen_max = 0

    def markers_now() -> int:
        return len(list((root / "_ids").iterdir())) if (root / "_ids").exists() else 0

    for delay in (0.0, 0.2, 0.45):
        before = markers_now()
        p = subprocess.Popen([sys.executable, "-c", code, str(root)], cwd=REPO)
        deadline = time.monotonic() + 60  # the writer's imports take a while on a busy machine
        while markers_now() <= before and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(delay)  # then kill it somewhere in its loop: reserve -> pending -> complete
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        store = DeltaCheckpointStore(root, retained=2)
        kept = store.checkpoints.all()
        assert len([c for c in kept if not c.is_savepoint]) <= 2
        for c in kept:
            assert c.acks[SubtaskId("src", 0)].state == {"offset": c.checkpoint_id}
        markers = [int(m.name) for m in (root / "_ids").iterdir()] if (root / "_ids").exists() else [0]
        nxt = store.ids.peek()
        assert nxt > max(markers) and nxt > seen_max
        seen_max = max(markers)
    assert seen_max > 0


# --- epochs ---------------------------------------------------------------------------------------


def test_epochs_increase_and_fence_older_writers(root):
    old = DeltaCheckpointStore(root)
    assert old.epochs.current() == 0
    assert old.epochs.begin("host-a:1", "start") == 1
    old.epochs.check(1)
    old.checkpoints.add(checkpoint(1), epoch=1)
    new = DeltaCheckpointStore(root)
    assert new.epochs.begin("host-b:2", "recovery") == 2
    assert old.epochs.current() == new.epochs.current() == 2
    with pytest.raises(FencedError, match="epoch 1 is fenced: epoch 2 has taken over"):
        old.epochs.check(1)
    with pytest.raises(FencedError):
        old.checkpoints.add(checkpoint(2), epoch=1)  # the zombie cannot complete a checkpoint
    assert ids(new.checkpoints.all()) == [1]
    new.checkpoints.add(checkpoint(2), epoch=2)
    assert [h["epoch"] for h in new.checkpoints.history()] == [2, 1]
    assert [(e["epoch"], e["owner"], e["reason"]) for e in new.epochs.all()] == [
        (2, "host-b:2", "recovery"),
        (1, "host-a:1", "start"),
    ]


@pytest.mark.race
def test_concurrent_begin_epoch_is_unique_and_old_reservation_markers_do_not_matter(root):
    stores = [DeltaCheckpointStore(root) for _ in range(4)]
    got: list[int] = []
    fenced: list[FencedError] = []

    def begin(s):
        try:
            got.append(s.epochs.begin())
        except FencedError as exc:  # overtaken by a newer epoch before it could fence: never an owner
            fenced.append(exc)

    threads = [threading.Thread(target=begin, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) + len(fenced) == 4 and len(set(got)) == len(got)
    rows = sorted(e["epoch"] for e in stores[0].epochs.all())
    assert rows == [1, 2, 3, 4]  # every starter committed a distinct epoch row
    assert max(got) == 4  # the newest always owns its epoch, and it fenced every table
    assert all(stores[0].epochs.fence(name) == 4 for name in ("checkpoints", "acks", "sessions"))
    # a marker file of the old reservation scheme (a process that died before its row): epochs are
    # unique because each is committed on top of the snapshot it follows, so it is simply ignored
    (root / "_epochs").mkdir(exist_ok=True)
    (root / "_epochs" / f"{5:020d}").touch()
    assert DeltaCheckpointStore(root).epochs.current() == 4
    assert DeltaCheckpointStore(root).epochs.begin() == 5


# --- history and acks -----------------------------------------------------------------------------


def test_history_and_acks_round_trip_every_ack_field(root):
    clock = ManualClock(1000.0)
    store = DeltaCheckpointStore(root, clock=clock)
    keyed = SubtaskId("keyed[x]", 3)  # brackets in an operator name survive the "op[i]" key
    src = SubtaskId("src", 0)
    state = {"table": "s3://w/t", "version": 12, "groups": [[0, 63], [64, 127]], "meta": {"a": None, "b": 1.25, "c": True}}
    c = CompletedCheckpoint(
        checkpoint_id=store.ids.get_and_increment(),
        kind=CheckpointKind.SAVEPOINT,
        trigger_time=100.0,
        completion_time=103.75,
        acks={
            keyed: SubtaskAck(state=state, state_size_bytes=4096, channel_state_rows=7,
                              channel_state_bytes=512, alignment_ms=12.5, unaligned=True, duration_ms=88.25),
            src: SubtaskAck(state={"offset": 42}, state_size_bytes=8, duration_ms=1.0),
        },
        ack_times={keyed: 103.75, src: 101.5},
    )
    store.checkpoints.record_pending(c.checkpoint_id, c.kind, c.trigger_time, epoch=0)
    clock.advance(5)
    assert store.checkpoints.add(c) == []
    assert DeltaCheckpointStore(root).checkpoints.get(c.checkpoint_id) == c
    [h] = DeltaCheckpointStore(root).checkpoints.history()
    assert {k: v for k, v in h.items() if k != "acks_json"} == {
        "checkpoint_id": 1,
        "kind": "savepoint",
        "status": "completed",
        "trigger_time": 100.0,
        "completion_time": 103.75,
        "epoch": 0,
        "failure_reason": None,
        "message": None,
        "state_bytes": 4104,
        "channel_state_rows": 7,
        "channel_state_bytes": 512,
        "alignment_ms": 12.5,
        "unaligned": True,
        "recorded_at": 1005.0,
        "validated_at": None,
        "retained": True,
        "corrupt": False,
        "discarded_in_epoch": None,  # never discarded
    }
    assert json.loads(h["acks_json"])["acks"]["keyed[x][3]"]["state"] == state
    assert store.checkpoints.acks(1) == [
        {"subtask": "keyed[x][3]", "operator": "keyed[x]", "index": 3, "state": state,
         "state_size_bytes": 4096, "channel_state_rows": 7, "channel_state_bytes": 512,
         "alignment_ms": 12.5, "unaligned": True, "duration_ms": 88.25, "ack_time": 103.75},
        {"subtask": "src[0]", "operator": "src", "index": 0, "state": {"offset": 42},
         "state_size_bytes": 8, "channel_state_rows": 0, "channel_state_bytes": 0,
         "alignment_ms": 0.0, "unaligned": False, "duration_ms": 1.0, "ack_time": 101.5},
    ]


def test_history_is_latest_status_per_id_newest_first(root):
    store = DeltaCheckpointStore(root, clock=ManualClock(50.0))
    for i in (1, 2, 3):
        store.checkpoints.record_pending(i, CheckpointKind.CHECKPOINT, float(i), epoch=4)
    store.checkpoints.add(checkpoint(1))
    store.checkpoints.record_aborted(2, FailureReason.DECLINED, "declined by sink[0]: disk full", epoch=4)
    history = store.checkpoints.history()
    assert [(h["checkpoint_id"], h["status"]) for h in history] == [(3, "pending"), (2, "aborted"), (1, "completed")]
    aborted = history[1]
    assert (aborted["failure_reason"], aborted["message"], aborted["trigger_time"], aborted["epoch"]) == (
        "declined", "declined by sink[0]: disk full", 2.0, 4)
    assert store.checkpoints.acks(2) == [] and store.checkpoints.acks(3) == []
    with pytest.raises(UnknownCheckpointError, match=r"\b9\b"):
        store.checkpoints.acks(9)


def test_status_transitions_are_forward_only(root):
    store = DeltaCheckpointStore(root)
    store.checkpoints.add(checkpoint(1))
    with pytest.raises(ValueError, match="checkpoint 1 is already completed"):
        store.checkpoints.record_aborted(1, FailureReason.EXPIRED)
    with pytest.raises(ValueError, match="checkpoint 1 is already completed"):
        store.checkpoints.record_pending(1, CheckpointKind.CHECKPOINT, 1.0)
    store.checkpoints.record_aborted(2, FailureReason.EXPIRED)
    store.checkpoints.record_aborted(2, FailureReason.EXPIRED)  # again: a no-op
    with pytest.raises(ValueError, match="checkpoint 2 was aborted"):
        store.checkpoints.add(checkpoint(2))
    assert statuses(store) == {2: "aborted", 1: "completed"}
    assert len(DeltaTable(str(root / "checkpoints")).to_pyarrow_table()) == 2


def test_state_that_does_not_survive_json_is_refused(root):
    store = DeltaCheckpointStore(root)
    src = SubtaskId("src", 0)
    bad = CompletedCheckpoint(1, CheckpointKind.CHECKPOINT, 1.0, 2.0, {src: SubtaskAck(state={"k": (1, 2)})})
    with pytest.raises(ValueError, match=r"ack of src\[0\] does not survive JSON"):
        store.checkpoints.add(bad)
    opaque = CompletedCheckpoint(1, CheckpointKind.CHECKPOINT, 1.0, 2.0, {src: SubtaskAck(state={"k": object()})})
    with pytest.raises(ValueError, match="checkpoint 1: acks are not JSON-serialisable"):
        store.checkpoints.add(opaque)
    assert store.checkpoints.history() == []


# --- corrupt rows ---------------------------------------------------------------------------------


def _append_raw(root: Path, **overrides) -> None:
    row = {
        "checkpoint_id": 3, "kind": "checkpoint", "status": "completed", "trigger_time": 30.0,
        "completion_time": 31.5, "epoch": 0, "failure_reason": None, "message": None,
        "acks_json": '{"version": 1, "acks": {"src[0]": {"state": {', "state_bytes": 0,
        "channel_state_rows": 0, "channel_state_bytes": 0, "alignment_ms": 0.0,
        "unaligned": False, "recorded_at": 99.0,
    }
    row.update(overrides)
    write_deltalake(str(root / "checkpoints"), pa.Table.from_pylist([row], schema=CHECKPOINTS_SCHEMA), mode="append")


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"acks_json": '{"version": 1, "acks": {"src": {}}, "ack_times": {}}'},
        {"acks_json": '{"version": 1, "acks": {"src[0]": {"state": {}, "unaligned": "yes"}}, "ack_times": {}}'},
        {"kind": "snapshot"},
        {"acks_json": None},
    ],
    ids=["truncated-json", "bad-subtask", "bad-field", "bad-kind", "no-acks"],
)
def test_corrupt_completed_row_is_skipped_with_a_warning_and_latest_falls_back(root, overrides):
    store = DeltaCheckpointStore(root, retained=2)
    store.checkpoints.add(checkpoint(1))
    store.checkpoints.add(checkpoint(2))
    _append_raw(root, **overrides)
    with pytest.warns(CorruptCheckpointWarning, match="checkpoint 3 has a corrupt row"):
        assert store.checkpoints.latest() == checkpoint(2)
    with pytest.warns(CorruptCheckpointWarning):
        assert ids(store.checkpoints.all()) == [1, 2]  # the corrupt one does not count toward retention
    with pytest.warns(CorruptCheckpointWarning), pytest.raises(UnknownCheckpointError, match=r"\b3\b"):
        store.checkpoints.get(3)
    with pytest.warns(CorruptCheckpointWarning):
        assert {h["checkpoint_id"]: h["corrupt"] for h in store.checkpoints.history()} == {3: True, 2: False, 1: False}
    assert store.ids.get_and_increment() == 4  # a corrupt row's id is still used (ids are not decoded)
    with pytest.warns(CorruptCheckpointWarning), pytest.raises(ValueError, match="already stored"):
        store.checkpoints.add(checkpoint(3))


def _topology_checkpoint(checkpoint_id: int, *, sink_current: bool = True, key_groups=((0, 63), (64, 127))):
    """A checkpoint shaped like a real pipeline's: source acks, keyed operator acks with their key
    group ranges, and a 2PC sink ack with its transaction snapshot."""
    txn = {"seq": 1, "txn_id": "p.ledger-0-0", "epoch": 1, "checkpoint_id": None}
    sink_state = {"twophase": {"pending": [], "next_seq": 2, **({"current": txn} if sink_current else {})}}
    acks = {SubtaskId("source", 0): SubtaskAck(state={"version": 3, "barrier_seq": 7})}
    for i, groups in enumerate(key_groups):
        acks[SubtaskId("balance", i)] = SubtaskAck(state={"table_version": 5, "key_groups": list(groups)})
    acks[SubtaskId("sink_ledger", 0)] = SubtaskAck(state=sink_state)
    return CompletedCheckpoint(checkpoint_id, CheckpointKind.CHECKPOINT, 10.0 * checkpoint_id,
                               10.0 * checkpoint_id + 1, acks, {s: 1.0 for s in acks})


def _rewrite_acks(root: Path, checkpoint_id: int, edit) -> None:
    """Replace the completed row of ``checkpoint_id`` by one whose acks_json went through ``edit``
    (valid JSON: what a hand edit or a buggy tool leaves)."""
    dt = DeltaTable(str(root / "checkpoints"))
    rows = dt.to_pyarrow_table().to_pylist()
    for row in rows:
        if row["checkpoint_id"] == checkpoint_id and row["status"] == "completed":
            doc = json.loads(row["acks_json"])
            edit(doc)
            row["acks_json"] = json.dumps(doc, sort_keys=True)
    write_deltalake(str(root / "checkpoints"), pa.Table.from_pylist(rows, schema=CHECKPOINTS_SCHEMA), mode="overwrite")


def _keep_only_sources(doc):
    doc["acks"] = {k: v for k, v in doc["acks"].items() if k.startswith("source")}
    doc["ack_times"] = {k: v for k, v in doc["ack_times"].items() if k.startswith("source")}


@pytest.mark.parametrize(
    "damage",
    ["edited-to-keep-only-source-acks", "sink-without-current", "key-groups-with-a-gap", "key-groups-overlap"],
)
def test_an_incomplete_but_well_formed_completed_row_is_not_restorable(root, damage):
    """Issue: a latest checkpoint whose acks_json kept only the source acks (valid JSON) was restored
    with no keyed state and no sinks, wiping state. Such a row must count as unreadable: skipped
    (recovery falls back, rolling the sinks back below it), never restored."""
    store = DeltaCheckpointStore(root, retained=3)
    store.checkpoints.add(_topology_checkpoint(1))
    store.checkpoints.add(_topology_checkpoint(2))
    if damage == "edited-to-keep-only-source-acks":
        _rewrite_acks(root, 2, _keep_only_sources)  # the digest no longer matches
    else:
        # a row of the format before digests, damaged: the structure alone gives it away
        def edit(doc):
            doc.pop("digest")
            if damage == "sink-without-current":
                del doc["acks"]["sink_ledger[0]"]["state"]["twophase"]["current"]
            else:
                doc["acks"]["balance[1]"]["state"]["key_groups"] = [65, 127] if "gap" in damage else [60, 127]
        _rewrite_acks(root, 2, edit)
    reader = DeltaCheckpointStore(root, retained=3)
    with pytest.warns(CorruptCheckpointWarning, match="checkpoint 2 has a corrupt row"):
        assert reader.checkpoints.latest().checkpoint_id == 1
    with pytest.warns(CorruptCheckpointWarning):
        assert reader.checkpoints.unreadable() == [2]
    with pytest.warns(CorruptCheckpointWarning):
        plan = reader.recovery_plan()
    assert plan.checkpoint_id == 1 and plan.rollback_after == 1


def test_a_genuine_topology_row_round_trips_with_its_digest(root):
    store = DeltaCheckpointStore(root, retained=3)
    store.checkpoints.add(_topology_checkpoint(1))
    with pytest.raises(ValueError, match="sink transactions are missing"):
        store.checkpoints.add(_topology_checkpoint(2, sink_current=False))  # never completes what cannot restore
    with pytest.raises(ValueError, match="gap or overlap"):
        store.checkpoints.add(_topology_checkpoint(2, key_groups=((0, 63), (65, 127))))
    assert DeltaCheckpointStore(root).checkpoints.latest() == _topology_checkpoint(1)
    assert "digest" in json.loads(store.checkpoints.table.rows()[0]["acks_json"])


def test_unreadable_completed_rows_are_listed_and_can_be_discarded(root):
    store = DeltaCheckpointStore(root, retained=2)
    store.checkpoints.add(checkpoint(1))
    store.checkpoints.add(checkpoint(2))
    _append_raw(root, kind="snapshot")
    with pytest.warns(CorruptCheckpointWarning):
        assert store.checkpoints.unreadable() == [3]
    with pytest.warns(CorruptCheckpointWarning):
        store.checkpoints.discard_unreadable([2, 3], "rolled back")  # 2 is readable: left alone
    assert store.checkpoints.unreadable() == []  # no warning any more: the discarded row states its status
    statuses = {h["checkpoint_id"]: (h["status"], h["corrupt"], h["message"]) for h in store.checkpoints.history()}
    assert statuses == {3: ("discarded", False, "rolled back"), 2: ("completed", False, None), 1: ("completed", False, None)}
    store.checkpoints.discard_unreadable([3])  # idempotent: nothing unreadable left to discard
    assert len([h for h in store.checkpoints.history() if h["checkpoint_id"] == 3]) == 1
    assert ids(store.checkpoints.all()) == [1, 2] and store.ids.get_and_increment() == 4


def test_recovery_plan_rolls_back_below_unreadable_checkpoints_and_finishes_owed_rollbacks(root):
    store = DeltaCheckpointStore(root, retained=3)
    store.checkpoints.add(checkpoint(1))
    store.checkpoints.add(checkpoint(2))
    plan = store.recovery_plan()
    assert (plan.checkpoint_id, plan.rollback_after, plan.new_epoch) == (2, None, 1)
    _append_raw(root, kind="snapshot")  # checkpoint 3 completed, its row unreadable
    with pytest.warns(CorruptCheckpointWarning):
        plan = store.recovery_plan()
    assert (plan.checkpoint_id, plan.rollback_after) == (2, 2)
    epoch = store.epochs.begin("test")
    store.sessions.record_rollback(epoch, 1)  # an epoch began rolling back to 1, then died
    with pytest.warns(CorruptCheckpointWarning):
        plan = store.recovery_plan()  # the owed rollback names the checkpoint
    assert (plan.checkpoint_id, plan.rollback_after, plan.new_epoch) == (1, 1, epoch + 1)
    store.checkpoints.discard_unreadable([3], epoch=epoch)
    store.checkpoints.mark_discarded([checkpoint(2)], epoch=epoch)
    plan = store.recovery_plan()  # nothing above 1 any more, still owed
    assert (plan.checkpoint_id, plan.rollback_after) == (1, 1)
    assert "roll sinks back to what checkpoint 1 committed" in plan.describe()


def test_row_with_an_unknown_status_is_ignored_with_a_warning(root):
    store = DeltaCheckpointStore(root)
    store.checkpoints.add(checkpoint(1))
    _append_raw(root, checkpoint_id=1, status="resurrected", acks_json=None)
    with pytest.warns(CorruptCheckpointWarning, match="unknown status"):
        assert store.checkpoints.latest() == checkpoint(1)


# --- retention ------------------------------------------------------------------------------------


def test_retention_marks_evicted_checkpoints_discarded(root):
    store = DeltaCheckpointStore(root, retained=1)
    store.checkpoints.add(checkpoint(1))
    store.checkpoints.add(checkpoint(2, savepoint=True))
    assert ids(store.checkpoints.add(checkpoint(3))) == [1]
    assert statuses(store) == {3: "completed", 2: "completed", 1: "discarded"}
    assert ids(DeltaCheckpointStore(root, retained=1).checkpoints.all()) == [2, 3]
    # the discarded row keeps the checkpoint's acks for the history
    assert store.checkpoints.acks(1)[0]["state"] == {"version": 1}
    assert store.checkpoints.pending_discards() == []
    with pytest.raises(ValueError, match="checkpoint 1 is already stored"):
        store.checkpoints.add(checkpoint(1))


def test_lost_discard_commit_is_recovered_on_read(root, monkeypatch):
    store = DeltaCheckpointStore(root, retained=1)
    store.checkpoints.add(checkpoint(1))

    def crash(_checkpoints, epoch=None):
        raise OSError("killed between the two commits")

    monkeypatch.setattr(store.checkpoints, "mark_discarded", crash)
    assert ids(store.checkpoints.add(checkpoint(2))) == [1]  # durable, so add succeeds and reports the eviction
    restarted = DeltaCheckpointStore(root, retained=1)
    assert ids(restarted.checkpoints.all()) == [2] and restarted.checkpoints.latest().checkpoint_id == 2
    with pytest.raises(UnknownCheckpointError):
        restarted.checkpoints.get(1)
    assert [(h["checkpoint_id"], h["status"], h["retained"]) for h in restarted.checkpoints.history()] == [
        (2, "completed", True),
        (1, "completed", False),
    ]
    assert ids(restarted.checkpoints.pending_discards()) == [1]
    restarted.checkpoints.mark_discarded(restarted.checkpoints.pending_discards())
    assert restarted.checkpoints.pending_discards() == [] and statuses(restarted)[1] == "discarded"


def test_crash_before_the_completed_commit_leaves_the_previous_checkpoint(root, monkeypatch):
    store = DeltaCheckpointStore(root)
    store.checkpoints.add(checkpoint(1))
    i = store.ids.get_and_increment()
    monkeypatch.setattr(store.checkpoints.table, "commit", lambda *a, **k: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError):
        store.checkpoints.add(checkpoint(i))
    restarted = DeltaCheckpointStore(root)
    assert restarted.checkpoints.latest() == checkpoint(1)
    assert restarted.ids.get_and_increment() == i + 1


# --- maintenance ----------------------------------------------------------------------------------


def test_table_is_compacted_automatically(root):
    store = DeltaCheckpointStore(root, retained=2, compact_after_files=5)
    for i in range(1, 9):
        store.checkpoints.add(checkpoint(i))
    files = DeltaTable(str(root / "checkpoints")).file_uris()
    assert len(files) < 5
    assert ids(store.checkpoints.all()) == [7, 8]
    assert statuses(store) == {i: ("completed" if i > 6 else "discarded") for i in range(1, 9)}


def test_a_reader_sees_exactly_what_the_writer_retained(tmp_path):
    """A reader does not impose a retention of its own: it sees the writer's decisions."""
    from checkpoint_lib.core.checkpoints import CompletedCheckpoint
    from checkpoint_lib.core.types import CheckpointKind, SubtaskAck, SubtaskId

    writer = DeltaCheckpointStore.open(tmp_path / "root", retained=5)
    for _ in range(7):
        cid = writer.ids.get_and_increment()
        writer.checkpoints.add(CompletedCheckpoint(cid, CheckpointKind.CHECKPOINT, 1.0, 2.0, {SubtaskId("src", 0): SubtaskAck()}))
    reader = DeltaCheckpointStore.open(tmp_path / "root")
    assert [c.checkpoint_id for c in reader.checkpoints.all()] == [3, 4, 5, 6, 7]
    assert [c.checkpoint_id for c in writer.checkpoints.all()] == [3, 4, 5, 6, 7]


# --- acks of pending checkpoints, sessions, rollback intents -----------------------------------


def test_acks_of_a_pending_checkpoint_are_durable_per_epoch_and_fenced(root):
    store = DeltaCheckpointStore.open(root)
    epoch = store.epochs.begin("a")
    store.checkpoints.record_pending(1, epoch=epoch)
    ack = SubtaskAck(state={"version": 3, "next_seq": 4}, alignment_ms=1.5)
    store.acks.record(1, {SubtaskId("source", 0): ack, SubtaskId("source", 1): ack}, epoch, ack_time=9.0)
    other = DeltaCheckpointStore.open(root)  # another process
    got = other.acks.pending(1, epoch)
    assert got == {SubtaskId("source", 0): (ack, 9.0), SubtaskId("source", 1): (ack, 9.0)}
    assert other.acks.pending(1, epoch + 1) == {}
    assert [r["checkpoint_id"] for r in other.checkpoints.pending()] == [1]
    other.epochs.begin("b")
    with pytest.raises(FencedError):
        store.acks.record(1, {SubtaskId("source", 0): ack}, epoch)


def test_compaction_prunes_acks_of_finished_checkpoints_only(root):
    store = DeltaCheckpointStore.open(root)
    epoch = store.epochs.begin("a")
    for cid in (1, 2):
        store.checkpoints.record_pending(cid, epoch=epoch)
        store.acks.record(cid, {SubtaskId("s", 0): SubtaskAck()}, epoch)
    store.checkpoints.record_aborted(1, FailureReason.EXPIRED, epoch=epoch)
    store.compact()
    assert store.acks.pending(1, epoch) == {} and len(store.acks.pending(2, epoch)) == 1


def test_sessions_start_once_end_with_a_resume_point_and_are_fenced(root):
    store = DeltaCheckpointStore.open(root)
    epoch = store.epochs.begin("a")
    store.sessions.record_restored(epoch, None, {"source": {"offset": -1}})
    assert store.sessions.begin(epoch, "source") == 1
    store.sessions.end(epoch, "source", 1, {"offset": 4})
    assert store.sessions.begin(epoch, "source") == 2
    events = [(r["stage"], r["session"], r["event"]) for r in store.sessions.of_epoch(epoch)]
    assert events == [("*", 0, "restored"), ("source", 1, "start"), ("source", 1, "end"), ("source", 2, "start")]
    assert json.loads(store.sessions.of_epoch(epoch)[2]["resume_json"]) == {"offset": 4}
    # the stage's session 2 is live: nobody else starts one (races: test_store_races.py)
    assert store.sessions.begin(epoch, "source") is None
    assert store.sessions.begin(epoch, "keyed") == 1
    with pytest.raises(ValueError, match="bad stage"):
        store.sessions.begin(epoch, "../x")
    store.epochs.begin("b")
    with pytest.raises(FencedError):
        store.sessions.end(epoch, "source", 2, {})


def test_a_process_group_the_restore_gave_no_point_must_recover(root):
    """An epoch restored for the chained layout's one group (``all``) has no point for the stages
    layout's groups (``source``, ``keyed``), and the other way round: those recover (a new layout),
    never read another group's point or fail on a missing one."""
    from checkpoint_lib.delta.sessions import resume_of

    store = DeltaCheckpointStore.open(root)
    epoch = store.epochs.begin("a")
    store.sessions.record_restored(epoch, 2, {"all": {"offsets": {"source": 4}}})
    rows = store.sessions.of_epoch(epoch)
    assert resume_of(rows, "all").point == {"offsets": {"source": 4}}
    for group in ("source", "keyed"):
        resume = resume_of(rows, group)
        assert resume.point is None and resume.why == "layout"


def test_a_rollback_is_owed_until_an_epoch_at_or_after_it_finishes_restoring(root):
    store = DeltaCheckpointStore.open(root)
    first = store.epochs.begin("a")
    assert store.sessions.owed_rollback() is None
    store.sessions.record_rollback(first, 3)
    assert store.sessions.owed_rollback() == 3  # the process died before it restored
    second = store.epochs.begin("b")
    store.sessions.record_rollback(second, 3)
    store.sessions.record_restored(second, 3, {})
    assert store.sessions.owed_rollback() is None


@pytest.mark.parametrize("damage", ["data file", "commit file"])
def test_a_damaged_control_table_file_is_refused_naming_the_file(root, damage):
    """Truncated by the disk or a tool (a kill never leaves this: Delta shows a file only whole):
    every read refuses with a message naming the file, and nothing is decided on it."""
    store = DeltaCheckpointStore(root, retained=2)
    for i in (1, 2):
        store.checkpoints.add(checkpoint(i))
    if damage == "data file":
        victim = max((root / "checkpoints").glob("*.parquet"), key=lambda f: f.stat().st_mtime)
        victim.write_bytes(victim.read_bytes()[:50])
    else:
        victim = max((root / "checkpoints" / "_delta_log").glob("*.json"))
        text = victim.read_text()
        victim.write_text(text[: len(text) // 2])
    reader = DeltaCheckpointStore(root)
    for read in (reader.checkpoints.latest, reader.check_readable, lambda: reader.recovery_plan(None, current_epoch=0)):
        with pytest.raises(CorruptControlTableError, match=f"{damage} {victim} is damaged") as err:
            read()
        assert "Nothing was written" in str(err.value)

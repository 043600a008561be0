"""The control plane under races: every check a write depends on is part of the write's own commit.

Each test interleaves a second writer *between* a writer's check and its commit, deterministically:
the store's commit function is wrapped so that the rival's write lands on the table right before the
first writer's commit is attempted. A fence read before a write is not a fence; these tests fail for
any store that checks, then appends.
No Spark here: real Delta tables through delta-rs, real files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from checkpoint_lib.core.errors import CheckpointAbortedError, FailureReason, FencedError
from checkpoint_lib.core.types import SubtaskAck, SubtaskId
from checkpoint_lib.delta import checkpoint_table as checkpoint_table_module
from checkpoint_lib.delta import control_table as control_table_module
from checkpoint_lib.delta.store import DeltaCheckpointStore

_CORE_TESTS = str(Path(__file__).resolve().parents[1] / "core")
if _CORE_TESTS not in sys.path:
    sys.path.insert(0, _CORE_TESTS)
from test_store_contract import checkpoint, ids  # noqa: E402


@pytest.fixture(params=["posix", "s3"])
def root(request, tmp_path):
    """The control plane on a local folder, and on a real S3-compatible server (conditional puts
    and delta-rs's conditional commits instead of O_EXCL and rename): the same races, the same outcomes."""
    if request.param == "s3":
        return request.getfixturevalue("s3") + "/_checkpoints/pipeline"
    return tmp_path / "_checkpoints" / "pipeline"


def interleave(monkeypatch, table: str, rival):
    """Run ``rival()`` once, right before the next commit to control table ``table`` is attempted
    (after the writer read and checked everything it reads). Returns a list that records it ran."""
    real = control_table_module.write_deltalake
    ran: list[bool] = []

    def write(target, *args, **kwargs):
        uri = target.table_uri if hasattr(target, "table_uri") else str(target)
        if not ran and uri.rstrip("/").endswith(f"/{table}"):
            ran.append(True)
            rival()
        return real(target, *args, **kwargs)

    monkeypatch.setattr(control_table_module, "write_deltalake", write)
    return ran


def statuses_in_order(store: DeltaCheckpointStore) -> list[str]:
    rows = store.checkpoints.table.rows()
    return [r["status"] for r in sorted(rows, key=lambda r: r["recorded_at"])]


def _zombie_and_successor(root):
    zombie = DeltaCheckpointStore.open(root, retained=3)
    epoch = zombie.epochs.begin("zombie")
    successor = DeltaCheckpointStore.open(root, retained=3)
    return zombie, epoch, successor


# --- item 5: a fence must be part of the write ----------------------------------------------------

WRITES = {
    "add": ("checkpoints", lambda s, e: s.checkpoints.add(checkpoint(1), epoch=e)),
    "record_pending": ("checkpoints", lambda s, e: s.checkpoints.record_pending(1, epoch=e)),
    "record_acks": ("acks", lambda s, e: s.acks.record(1, {SubtaskId("source", 0): SubtaskAck()}, e)),
    "record_restored": ("sessions", lambda s, e: s.sessions.record_restored(e, None, {"source": {}})),
    "record_rollback": ("sessions", lambda s, e: s.sessions.record_rollback(e, 1)),
    "end_session": ("sessions", lambda s, e: s.sessions.end(e, "source", 1, {"offset": 9})),
    "mark_discarded": ("checkpoints", lambda s, e: s.checkpoints.mark_discarded([checkpoint(1)], "zombie", epoch=e)),
}


@pytest.mark.race
@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_write_checked_before_a_newer_epoch_began_never_lands(root, monkeypatch, write):
    table, do = WRITES[write]
    zombie, epoch, successor = _zombie_and_successor(root)
    if write in ("end_session",):
        zombie.sessions.record_restored(epoch, None, {"source": {}})
        assert zombie.sessions.begin(epoch, "source") == 1
    if write == "mark_discarded":
        zombie.checkpoints.add(checkpoint(1), epoch=epoch)
    before = len(DeltaCheckpointStore(root).table(table).rows())
    ran = interleave(monkeypatch, table, lambda: successor.epochs.begin("successor"))
    with pytest.raises(FencedError):
        do(zombie, epoch)
    assert ran, f"{write} never committed to {table}"
    monkeypatch.undo()
    rows = DeltaCheckpointStore(root).table(table).rows()
    assert len(rows) == before, f"the zombie's {write} landed after epoch {epoch + 1} began: {rows[before:]}"


def test_begin_epoch_fences_every_control_table_before_it_returns(root):
    zombie, epoch, successor = _zombie_and_successor(root)
    newer = successor.epochs.begin("successor")
    for name in ("checkpoints", "acks", "sessions"):
        assert successor.epochs.fence(name) == newer
    with pytest.raises(FencedError):
        zombie.checkpoints.record_pending(5, epoch=epoch)


@pytest.mark.race
def test_a_starter_that_lost_the_epoch_race_is_fenced_not_a_second_owner(root, monkeypatch):
    slow = DeltaCheckpointStore.open(root)
    fast = DeltaCheckpointStore.open(root)
    # ``fast`` begins its epoch while ``slow`` is between reading the epochs table and writing its row
    began: list[int] = []
    interleave(monkeypatch, "epochs", lambda: began.append(fast.epochs.begin("fast")))
    got = slow.epochs.begin("slow")
    monkeypatch.undo()
    assert sorted(e["epoch"] for e in fast.epochs.all()) == [1, 2]
    assert got == 2 and began == [1]
    with pytest.raises(FencedError):
        fast.checkpoints.record_pending(1, epoch=1)


# --- item 3 and 6: one live session of a stage per epoch; orphan markers heal -------------------


def test_a_stage_has_at_most_one_live_session_per_epoch(root):
    store = DeltaCheckpointStore.open(root)
    epoch = store.epochs.begin("a")
    store.sessions.record_restored(epoch, None, {"source": {}})
    assert store.sessions.begin(epoch, "source", after=0) == 1
    other = DeltaCheckpointStore.open(root)
    assert other.sessions.begin(epoch, "source", after=0) is None  # session 1 is live
    assert other.sessions.begin(epoch, "source") is None
    store.sessions.end(epoch, "source", 1, {"offset": 4})
    assert other.sessions.begin(epoch, "source", after=0) is None  # it resumed from a stale point
    assert other.sessions.begin(epoch, "source", after=1) == 2


@pytest.mark.race
def test_racing_starters_of_one_stage_get_exactly_one_session(root, monkeypatch):
    store = DeltaCheckpointStore.open(root)
    epoch = store.epochs.begin("a")
    store.sessions.record_restored(epoch, None, {"source": {}})
    rival = DeltaCheckpointStore.open(root)
    won: list = []
    interleave(monkeypatch, "sessions", lambda: won.append(rival.sessions.begin(epoch, "source", after=0)))
    mine = store.sessions.begin(epoch, "source", after=0)
    monkeypatch.undo()
    assert won == [1] and mine is None
    starts = [r for r in store.sessions.of_epoch(epoch) if r["event"] == "start"]
    assert [(r["stage"], r["session"]) for r in starts] == [("source", 1)]


def test_an_orphan_session_marker_does_not_stall_the_stage(tmp_path):
    """A process killed after claiming the old marker file and before writing its start row."""
    root = tmp_path / "_checkpoints" / "pipeline"  # the old markers were files
    store = DeltaCheckpointStore.open(root)
    epoch = store.epochs.begin("a")
    store.sessions.record_restored(epoch, None, {"source": {}})
    for n in (1, 2):
        marker = root / "_sessions" / f"e{epoch}" / "source" / f"{n:020d}"
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    assert store.sessions.begin(epoch, "source", after=0) == 1


def test_a_session_is_ended_once_and_only_by_a_live_session(root):
    store = DeltaCheckpointStore.open(root)
    epoch = store.epochs.begin("a")
    store.sessions.record_restored(epoch, None, {"source": {}})
    assert store.sessions.begin(epoch, "source", after=0) == 1
    store.sessions.end(epoch, "source", 1, {"offset": 1})
    with pytest.raises(ValueError, match="not live"):
        store.sessions.end(epoch, "source", 1, {"offset": 2})
    with pytest.raises(ValueError, match="not live"):
        store.sessions.end(epoch, "source", 7, {"offset": 2})


# --- item 7: abort racing completion: exactly one wins ----------------------------------------------


@pytest.mark.race
def test_completion_loses_cleanly_to_an_abort_that_landed_first(root, monkeypatch):
    store = DeltaCheckpointStore.open(root, retained=3)
    epoch = store.epochs.begin("stage")
    store.checkpoints.record_pending(1, epoch=epoch)
    dag = DeltaCheckpointStore.open(root)
    interleave(monkeypatch, "checkpoints", lambda: dag.checkpoints.record_aborted(1, FailureReason.EXPIRED, "ack timeout", epoch))
    with pytest.raises(CheckpointAbortedError, match="expired"):
        store.checkpoints.add(checkpoint(1), epoch=epoch)
    monkeypatch.undo()
    assert store.checkpoints.status(1)["status"] == "aborted"
    assert ids(store.checkpoints.all()) == []
    assert statuses_in_order(store) == ["pending", "aborted"]


@pytest.mark.race
def test_an_abort_loses_cleanly_to_a_completion_that_landed_first(root, monkeypatch):
    store = DeltaCheckpointStore.open(root, retained=3)
    epoch = store.epochs.begin("stage")
    store.checkpoints.record_pending(1, epoch=epoch)
    dag = DeltaCheckpointStore.open(root)
    interleave(monkeypatch, "checkpoints", lambda: store.checkpoints.add(checkpoint(1), epoch=epoch))
    with pytest.raises(ValueError, match="already completed"):
        dag.checkpoints.record_aborted(1, FailureReason.EXPIRED, "ack timeout", epoch)
    monkeypatch.undo()
    assert store.checkpoints.status(1)["status"] == "completed"
    assert statuses_in_order(store) == ["pending", "completed"]


# --- the per-checkpoint validation's verdict (item 2): exactly one stands -----------------------


def test_a_passed_validation_is_the_commit_gate_and_survives_a_reopen(root):
    store = DeltaCheckpointStore.open(root, retained=3)
    epoch = store.epochs.begin("stage")
    store.checkpoints.add(checkpoint(1), epoch=epoch)
    assert not store.verdicts.validated(1)
    assert store.verdicts.record(1, True, "per_checkpoint suite passed", epoch=epoch)
    assert store.verdicts.record(1, True, epoch=epoch)  # the same verdict again: idempotent, nothing written
    reader = DeltaCheckpointStore.open(root)
    assert reader.verdicts.validated(1) and ids(reader.checkpoints.all()) == [1]
    assert reader.checkpoints.latest() == checkpoint(1)  # the validated copy does not change what is restored
    [h] = reader.checkpoints.history()
    assert h["status"] == "completed" and h["validated_at"] is not None
    assert statuses_in_order(reader) == ["completed", "completed"]


def test_a_failed_validation_discards_and_a_late_pass_cannot_revive_it(root):
    store = DeltaCheckpointStore.open(root, retained=3)
    epoch = store.epochs.begin("stage")
    store.checkpoints.add(checkpoint(1), epoch=epoch)
    store.checkpoints.add(checkpoint(2), epoch=epoch)
    assert store.verdicts.record(2, False, "failed its per-checkpoint validation: conservation", epoch=epoch)
    assert ids(store.checkpoints.all()) == [1] and store.checkpoints.status(2)["status"] == "discarded"
    assert store.verdicts.record(2, True, epoch=epoch) is False  # the other verdict won: must not commit
    assert not store.verdicts.validated(2)


@pytest.mark.race
def test_racing_verdicts_exactly_one_stands(root, monkeypatch):
    """A validation that errored (discard) racing one that passed: whichever lands first stands,
    the other learns it lost and writes nothing."""
    store = DeltaCheckpointStore.open(root, retained=3)
    epoch = store.epochs.begin("stage")
    store.checkpoints.add(checkpoint(1), epoch=epoch)
    dag = DeltaCheckpointStore.open(root)
    interleave(monkeypatch, "checkpoints", lambda: dag.verdicts.record(1, True))
    assert store.verdicts.record(1, False, "validation could not run", epoch=epoch) is False
    monkeypatch.undo()
    assert store.verdicts.validated(1) and store.checkpoints.status(1)["status"] == "completed"
    assert statuses_in_order(store) == ["completed", "completed"]


@pytest.mark.race
def test_a_zombie_cannot_record_a_verdict_after_a_newer_epoch_began(root, monkeypatch):
    zombie, epoch, successor = _zombie_and_successor(root)
    zombie.checkpoints.add(checkpoint(1), epoch=epoch)
    interleave(monkeypatch, "checkpoints", lambda: successor.epochs.begin("recover"))
    with pytest.raises(FencedError):
        zombie.verdicts.record(1, False, "late", epoch=epoch)
    monkeypatch.undo()
    assert ids(successor.checkpoints.all()) == [1]


def test_a_checkpoint_table_of_an_older_version_gains_the_column_on_its_next_write(root):
    import pyarrow as pa

    old = pa.schema([f for f in checkpoint_table_module.CHECKPOINTS_SCHEMA if f.name != "validated_at"])
    store = DeltaCheckpointStore.open(root, retained=3)
    DeltaTable.create(store.checkpoints.table.uri, old, mode="overwrite")
    store.checkpoints.add(checkpoint(1))
    assert store.verdicts.record(1, True) and store.verdicts.validated(1)
    assert "validated_at" in store.checkpoints.table.load().schema().to_arrow().names

"""Contract tests for CheckpointIdCounter and CompletedCheckpointStore.

``CompletedCheckpointStoreContract`` is implementation-agnostic: it only uses the protocol methods
(``add``, ``all``, ``latest``, ``get``; ``get_and_increment``, ``peek``). A durable implementation
(the Delta store in the adapters) subclasses it and implements ``make_store`` and ``make_counter``::

    class TestDeltaStore(CompletedCheckpointStoreContract):
        def make_store(self, retained): ...
        def make_counter(self): ...

Stored checkpoints must round-trip: what ``get``/``all``/``latest`` return equals what was added
(the states used here are JSON-like, so a serialising store can honour that).
"""

from __future__ import annotations

import abc

import pytest

from checkpoint_lib.core.checkpoints import CompletedCheckpoint
from checkpoint_lib.core.errors import UnknownCheckpointError
from checkpoint_lib.core.stores import (
    InMemoryCheckpointIdCounter,
    InMemoryCompletedCheckpointStore,
    apply_retention,
)
from checkpoint_lib.core.types import CheckpointKind, SubtaskAck, SubtaskId

SRC = SubtaskId("src", 0)
SINK = SubtaskId("sink", 0)


def checkpoint(checkpoint_id: int, *, savepoint: bool = False, completed: float | None = None) -> CompletedCheckpoint:
    """A completed checkpoint with recognisable, JSON-like state."""
    trigger = float(checkpoint_id * 10)
    return CompletedCheckpoint(
        checkpoint_id=checkpoint_id,
        kind=CheckpointKind.SAVEPOINT if savepoint else CheckpointKind.CHECKPOINT,
        trigger_time=trigger,
        completion_time=trigger + 1.5 if completed is None else completed,
        acks={
            SRC: SubtaskAck(state={"offset": checkpoint_id * 100}, state_size_bytes=8),
            SINK: SubtaskAck(state={"version": checkpoint_id}, channel_state_rows=2, channel_state_bytes=64),
        },
        ack_times={SRC: trigger + 0.5, SINK: trigger + 1.5},
    )


def ids(checkpoints) -> list[int]:
    return [c.checkpoint_id for c in checkpoints]


class CompletedCheckpointStoreContract(abc.ABC):
    """Behaviour every CompletedCheckpointStore + CheckpointIdCounter pair must have."""

    @abc.abstractmethod
    def make_store(self, retained: int):
        """A fresh, empty store keeping ``retained`` regular checkpoints."""

    @abc.abstractmethod
    def make_counter(self):
        """A fresh checkpoint id counter."""

    # --- empty store ----------------------------------------------------------------------------

    def test_empty_store(self):
        store = self.make_store(3)
        assert list(store.all()) == []
        assert store.latest() is None

    def test_get_unknown_id_on_empty_store_raises(self):
        with pytest.raises(UnknownCheckpointError, match=r"\b7\b"):
            self.make_store(3).get(7)

    # --- add / all / latest / get ---------------------------------------------------------------

    def test_add_returns_nothing_evicted_below_retention(self):
        store = self.make_store(3)
        assert list(store.add(checkpoint(1))) == []
        assert list(store.add(checkpoint(2))) == []

    def test_all_is_ordered_by_id_oldest_first(self):
        store = self.make_store(5)
        for i in (1, 2, 3):
            store.add(checkpoint(i))
        assert ids(store.all()) == [1, 2, 3]

    def test_latest_is_highest_id(self):
        store = self.make_store(3)
        store.add(checkpoint(1))
        store.add(checkpoint(2))
        assert store.latest().checkpoint_id == 2

    def test_get_returns_stored_checkpoint(self):
        store = self.make_store(3)
        store.add(checkpoint(1))
        store.add(checkpoint(2))
        assert store.get(1).checkpoint_id == 1
        assert store.get(2).checkpoint_id == 2

    def test_stored_checkpoint_round_trips(self):
        store = self.make_store(3)
        original = checkpoint(4, completed=44.25)
        store.add(original)
        restored = store.get(4)
        assert restored == original
        assert restored.acks[SRC].state["offset"] == 400
        assert restored.acks[SINK].channel_state_rows == 2
        assert restored.ack_times[SINK] == 41.5
        assert store.latest() == original
        assert list(store.all()) == [original]

    def test_savepoint_kind_round_trips(self):
        store = self.make_store(3)
        store.add(checkpoint(1, savepoint=True))
        assert store.get(1).kind is CheckpointKind.SAVEPOINT
        assert store.get(1).is_savepoint

    def test_get_unknown_id_raises_unknown_checkpoint_error(self):
        store = self.make_store(3)
        store.add(checkpoint(1))
        store.add(checkpoint(3))
        with pytest.raises(UnknownCheckpointError, match=r"\b2\b"):
            store.get(2)

    def test_unknown_checkpoint_error_is_a_lookup_error(self):
        store = self.make_store(3)
        with pytest.raises(LookupError):
            store.get(1)

    # --- duplicates -------------------------------------------------------------------------------

    def test_duplicate_id_is_rejected_and_store_unchanged(self):
        store = self.make_store(3)
        store.add(checkpoint(1))
        store.add(checkpoint(2))
        with pytest.raises(ValueError, match=r"\b2\b"):
            store.add(checkpoint(2, completed=99.0))
        assert ids(store.all()) == [1, 2]
        assert store.get(2).completion_time == 21.5

    def test_duplicate_of_a_savepoint_is_rejected(self):
        store = self.make_store(3)
        store.add(checkpoint(1, savepoint=True))
        with pytest.raises(ValueError):
            store.add(checkpoint(1))
        assert store.get(1).is_savepoint

    # --- ordering -------------------------------------------------------------------------------

    def test_savepoint_completing_after_newer_checkpoint_keeps_id_order(self):
        store = self.make_store(3)
        store.add(checkpoint(2))
        store.add(checkpoint(1, savepoint=True))
        assert ids(store.all()) == [1, 2]
        assert store.latest().checkpoint_id == 2
        assert store.get(1).is_savepoint

    # --- retention ------------------------------------------------------------------------------

    def test_retention_evicts_oldest_regular_checkpoint(self):
        store = self.make_store(2)
        store.add(checkpoint(1))
        store.add(checkpoint(2))
        evicted = store.add(checkpoint(3))
        assert ids(evicted) == [1]
        assert evicted[0] == checkpoint(1)
        assert ids(store.all()) == [2, 3]

    def test_evicted_checkpoint_is_unknown(self):
        store = self.make_store(1)
        store.add(checkpoint(1))
        store.add(checkpoint(2))
        with pytest.raises(UnknownCheckpointError, match=r"\b1\b"):
            store.get(1)
        assert store.latest().checkpoint_id == 2

    def test_retention_one_keeps_only_latest(self):
        store = self.make_store(1)
        evicted = [ids(store.add(checkpoint(i))) for i in (1, 2, 3)]
        assert evicted == [[], [1], [2]]
        assert ids(store.all()) == [3]

    def test_retention_never_evicts_savepoints(self):
        store = self.make_store(2)
        store.add(checkpoint(1, savepoint=True))
        store.add(checkpoint(2))
        store.add(checkpoint(3, savepoint=True))
        store.add(checkpoint(4))
        evicted = store.add(checkpoint(5))
        assert ids(evicted) == [2]
        assert ids(store.all()) == [1, 3, 4, 5]
        assert [c.is_savepoint for c in store.all()] == [True, True, False, False]

    def test_savepoints_do_not_count_toward_retention(self):
        store = self.make_store(2)
        store.add(checkpoint(1))
        for i in (2, 3, 4):
            assert list(store.add(checkpoint(i, savepoint=True))) == []
        assert list(store.add(checkpoint(5))) == []
        assert ids(store.all()) == [1, 2, 3, 4, 5]
        assert ids(store.add(checkpoint(6))) == [1]

    def test_latest_may_be_a_savepoint(self):
        store = self.make_store(2)
        store.add(checkpoint(1))
        store.add(checkpoint(2, savepoint=True))
        assert store.latest().checkpoint_id == 2
        assert store.latest().is_savepoint

    # --- counter --------------------------------------------------------------------------------

    def test_counter_starts_at_one(self):
        assert self.make_counter().peek() == 1

    def test_counter_peek_does_not_advance(self):
        counter = self.make_counter()
        assert counter.peek() == counter.peek() == 1
        assert counter.get_and_increment() == 1

    def test_counter_get_and_increment_is_strictly_increasing(self):
        counter = self.make_counter()
        handed_out = [counter.get_and_increment() for _ in range(5)]
        assert handed_out == [1, 2, 3, 4, 5]
        assert counter.peek() == 6

    def test_counter_peek_announces_next_id(self):
        counter = self.make_counter()
        for _ in range(3):
            expected = counter.peek()
            assert counter.get_and_increment() == expected
            assert counter.peek() == expected + 1


class TestInMemoryStore(CompletedCheckpointStoreContract):
    def make_store(self, retained: int):
        return InMemoryCompletedCheckpointStore(retained)

    def make_counter(self):
        return InMemoryCheckpointIdCounter()


# --- in-memory specifics (not part of the contract) -------------------------------------------------


def test_in_memory_counter_rejects_start_below_one():
    with pytest.raises(ValueError, match="^checkpoint ids start at 1$"):
        InMemoryCheckpointIdCounter(0)


def test_in_memory_counter_custom_start():
    counter = InMemoryCheckpointIdCounter(7)
    assert (counter.peek(), counter.get_and_increment(), counter.peek()) == (7, 7, 8)


def test_in_memory_store_rejects_retained_below_one():
    with pytest.raises(ValueError, match="^retained must be >= 1$"):
        InMemoryCompletedCheckpointStore(0)


def test_in_memory_store_duplicate_message():
    store = InMemoryCompletedCheckpointStore()
    store.add(checkpoint(3))
    with pytest.raises(ValueError, match="^checkpoint 3 is already stored$"):
        store.add(checkpoint(3))


def test_in_memory_store_unknown_message_lists_retained():
    store = InMemoryCompletedCheckpointStore()
    store.add(checkpoint(1))
    store.add(checkpoint(2))
    with pytest.raises(
        UnknownCheckpointError, match=r"^checkpoint 9 is not a retained completed checkpoint \(retained: \[1, 2\]\)$"
    ):
        store.get(9)


def test_apply_retention_splits_kept_and_evicted():
    cps = [checkpoint(1), checkpoint(2, savepoint=True), checkpoint(3), checkpoint(4)]
    kept, evicted = apply_retention(cps, 1)
    assert (ids(kept), ids(evicted)) == ([2, 4], [1, 3])


def test_apply_retention_rejects_retained_below_one():
    with pytest.raises(ValueError, match="^retained must be >= 1$"):
        apply_retention([], 0)


# --- the durable control plane's other roles -------------------------------------------------------
# Each suite builds its stores with ``make_control()``: an object whose ``epochs``, ``acks``,
# ``sessions``, ``checkpoints`` and ``verdicts`` attributes are the role stores of ONE fresh, empty
# control plane (they share their storage, as a pipeline's do). No in-memory implementation: these
# roles exist only where they are durable; the Delta stores run every suite on a local folder and
# on an object store.


class ControlPlaneContract(abc.ABC):
    @abc.abstractmethod
    def make_control(self):
        """A fresh, empty control plane (its role stores as attributes)."""


class EpochStoreContract(ControlPlaneContract):
    """Behaviour of every :class:`~checkpoint_lib.core.stores.EpochStore`."""

    def test_epochs_start_at_zero_and_increase(self):
        epochs = self.make_control().epochs
        assert epochs.current() == 0 and epochs.all() == []
        assert epochs.begin("host:1", "start") == 1
        assert epochs.begin("host:2", "recover") == 2
        assert epochs.current() == 2
        assert [(e["epoch"], e["owner"], e["reason"]) for e in epochs.all()] == [(2, "host:2", "recover"),
                                                                              (1, "host:1", "start")]

    def test_an_older_epoch_is_fenced_the_current_one_is_not(self):
        from checkpoint_lib.core.errors import FencedError

        epochs = self.make_control().epochs
        first, second = epochs.begin(), epochs.begin()
        epochs.check(second)
        with pytest.raises(FencedError, match=f"epoch {first} is fenced: epoch {second} has taken over"):
            epochs.check(first)

    def test_beginning_an_epoch_fences_the_writes_of_older_ones(self):
        from checkpoint_lib.core.errors import FencedError

        control = self.make_control()
        old = control.epochs.begin()
        control.acks.record(1, {SRC: SubtaskAck()}, old)
        control.epochs.begin()
        with pytest.raises(FencedError):
            control.acks.record(1, {SINK: SubtaskAck()}, old)
        with pytest.raises(FencedError):
            control.sessions.record_restored(old, None, {})
        assert list(control.acks.pending(1, old)) == [SRC]


class AckStoreContract(ControlPlaneContract):
    """Behaviour of every :class:`~checkpoint_lib.core.stores.AckStore`."""

    def test_acks_of_a_pending_checkpoint_read_back_per_epoch(self):
        control = self.make_control()
        epoch = control.epochs.begin()
        control.acks.record(1, {SRC: SubtaskAck(state={"version": 3}, state_size_bytes=8)}, epoch, 10.0)
        control.acks.record(1, {SINK: SubtaskAck(state={"txn": "a"}, channel_state_rows=2)}, epoch, 11.0)
        control.acks.record(2, {SRC: SubtaskAck(state={"version": 4})}, epoch, 12.0)
        assert control.acks.pending(1, epoch) == {
            SRC: (SubtaskAck(state={"version": 3}, state_size_bytes=8), 10.0),
            SINK: (SubtaskAck(state={"txn": "a"}, channel_state_rows=2), 11.0),
        }
        assert control.acks.pending(1, epoch + 1) == {} and control.acks.pending(3, epoch) == {}

    def test_the_first_ack_of_a_subtask_stands(self):
        control = self.make_control()
        epoch = control.epochs.begin()
        control.acks.record(1, {SRC: SubtaskAck(state={"version": 3})}, epoch, 10.0)
        control.acks.record(1, {SRC: SubtaskAck(state={"version": 9})}, epoch, 20.0)  # a replayed ack
        assert control.acks.pending(1, epoch) == {SRC: (SubtaskAck(state={"version": 3}), 10.0)}

    def test_an_ack_that_is_not_json_is_refused(self):
        control = self.make_control()
        with pytest.raises(ValueError, match="not JSON"):
            control.acks.record(1, {SRC: SubtaskAck(state={"when": object()})}, control.epochs.begin())
        assert control.acks.pending(1, 1) == {}


class SessionStoreContract(ControlPlaneContract):
    """Behaviour of every :class:`~checkpoint_lib.core.stores.SessionStore`."""

    def test_a_stage_has_one_live_session_and_resumes_from_the_last_end(self):
        sessions = self.make_control().sessions
        assert sessions.begin(1, "source") == 1
        assert sessions.begin(1, "source") is None  # live
        assert sessions.begin(1, "keyed") == 1  # another stage: its own sessions
        sessions.end(1, "source", 1, {"offset": 7})
        assert sessions.begin(1, "source", after=0) is None  # a stale resume point
        assert sessions.begin(1, "source", after=1) == 2
        assert sessions.begin(2, "source") == 1  # a new epoch starts over
        rows = [(r["stage"], r["session"], r["event"]) for r in sessions.of_epoch(1)]
        assert rows == [("source", 1, "start"), ("keyed", 1, "start"), ("source", 1, "end"), ("source", 2, "start")]
        assert [r for r in sessions.of_epoch(1) if r["event"] == "end"][0]["resume_json"] == '{"offset": 7}'

    def test_only_a_live_session_ends(self):
        sessions = self.make_control().sessions
        with pytest.raises(ValueError, match="not live"):
            sessions.end(1, "source", 1, {})
        number = sessions.begin(1, "source")
        sessions.end(1, "source", number, {})
        with pytest.raises(ValueError, match="not live"):
            sessions.end(1, "source", number, {})

    def test_a_bad_stage_name_is_refused(self):
        with pytest.raises(ValueError, match="bad stage name"):
            self.make_control().sessions.begin(1, "Source Stage")

    def test_a_rollback_is_owed_until_an_epoch_at_or_after_it_restores(self):
        sessions = self.make_control().sessions
        assert sessions.owed_rollback() is None
        sessions.record_rollback(2, 5)
        sessions.record_restored(1, 4, {})  # an older epoch's restore does not settle it
        assert sessions.owed_rollback() == 5
        sessions.record_restored(2, 5, {"source": {"offset": 1}})
        assert sessions.owed_rollback() is None
        [restored] = [r for r in sessions.of_epoch(2) if r["event"] == "restored"]
        assert (restored["stage"], restored["checkpoint_id"]) == ("*", 5)


class ValidationVerdictsContract(ControlPlaneContract):
    """Behaviour of every :class:`~checkpoint_lib.core.stores.ValidationVerdicts`."""

    def test_a_pass_stands_and_a_later_failure_does_not_undo_it(self):
        control = self.make_control()
        control.checkpoints.add(checkpoint(1))
        assert not control.verdicts.validated(1)
        assert control.verdicts.record(1, True, "passed")
        assert control.verdicts.record(1, True)  # the same verdict again
        assert control.verdicts.record(1, False, "late failure") is False
        assert control.verdicts.validated(1) and ids(control.checkpoints.all()) == [1]

    def test_a_failure_discards_and_a_later_pass_cannot_revive_it(self):
        control = self.make_control()
        control.checkpoints.add(checkpoint(1))
        control.checkpoints.add(checkpoint(2))
        assert control.verdicts.record(2, False, "conservation failed")
        assert ids(control.checkpoints.all()) == [1] and not control.verdicts.validated(2)
        assert control.verdicts.record(2, True) is False
        assert control.checkpoints.latest().checkpoint_id == 1

    def test_only_a_completed_checkpoint_gets_a_verdict(self):
        with pytest.raises(UnknownCheckpointError):
            self.make_control().verdicts.record(7, True)

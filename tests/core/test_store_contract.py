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

"""Unit tests for checkpoint_lib.core.twophase: pool, sink bookkeeping, recovery."""

from __future__ import annotations

import json

import pytest

from checkpoint_lib.core.errors import CommitError, IllegalTransitionError
from checkpoint_lib.core.twophase import (
    SinkRecovery,
    SinkSnapshot,
    Transaction,
    TransactionIdPool,
    TwoPhaseCommitSink,
    commit_all,
    commit_up_to,
    recover,
)


def make_sink(size: int = 8, epoch: int = 1, prefix: str = "out", subtask: int = 0) -> TwoPhaseCommitSink:
    return TwoPhaseCommitSink(TransactionIdPool(prefix, subtask, size), epoch)


def txn(seq: int, slot: int | None = None, epoch: int = 1, checkpoint_id: int | None = None) -> Transaction:
    slot = seq if slot is None else slot
    return Transaction(seq, f"out-0-{slot}", epoch, checkpoint_id)


class Recorder:
    """A commit callback that records what it committed and fails for chosen checkpoint ids."""

    def __init__(self, fail_for: tuple[int, ...] = ()):
        self.fail_for = set(fail_for)
        self.calls: list[int] = []

    def __call__(self, transaction: Transaction) -> None:
        self.calls.append(transaction.checkpoint_id)
        if transaction.checkpoint_id in self.fail_for:
            raise OSError(f"commit of {transaction.checkpoint_id} failed")


# --- TransactionIdPool -------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["", "a b", "a/b", "a\\b", "a\tb", "a\nb"])
def test_pool_rejects_bad_prefix(prefix):
    with pytest.raises(ValueError, match="^transaction id prefix must be a non-empty word, got "):
        TransactionIdPool(prefix, 0)


@pytest.mark.parametrize("size", [1, 0, -1])
def test_pool_rejects_size_below_two(size):
    with pytest.raises(
        ValueError, match=rf"^the pool needs at least 2 ids \(current \+ one pending\), got {size}$"
    ):
        TransactionIdPool("out", 0, size)


def test_pool_ids():
    assert TransactionIdPool("out", 3, 3).ids() == ["out-3-0", "out-3-1", "out-3-2"]
    assert len(TransactionIdPool("out", 0).ids()) == 8


def test_pool_acquire_natural_slot():
    pool = TransactionIdPool("out", 1, 4)
    assert pool.acquire(0, []) == "out-1-0"
    assert pool.acquire(2, []) == "out-1-2"
    assert pool.acquire(6, []) == "out-1-2"  # wraps around


def test_pool_acquire_skips_ids_in_use():
    pool = TransactionIdPool("out", 0, 4)
    assert pool.acquire(1, ["out-0-1"]) == "out-0-2"
    assert pool.acquire(3, ["out-0-3", "out-0-0"]) == "out-0-1"


def test_pool_acquire_accepts_any_iterable():
    pool = TransactionIdPool("out", 0, 3)
    assert pool.acquire(0, (t for t in ["out-0-0", "out-0-1"])) == "out-0-2"


def test_pool_acquire_raises_when_exhausted():
    pool = TransactionIdPool("out", 2, 2)
    with pytest.raises(IllegalTransitionError, match=r"^all 2 transaction ids of out-2 are in use"):
        pool.acquire(5, ["out-2-0", "out-2-1"])


# --- TwoPhaseCommitSink: pre-commit -----------------------------------------------------------------


def test_new_sink_has_an_open_current_transaction_and_nothing_pending():
    sink = make_sink(epoch=4)
    assert sink.current == Transaction(0, "out-0-0", 4, None)
    assert sink.pending == {}
    assert sink.snapshot() == SinkSnapshot(Transaction(0, "out-0-0", 4), (), 1)


def test_pre_commit_moves_current_to_pending_and_begins_a_new_one():
    sink = make_sink()
    before = sink.current
    result = sink.pre_commit(7)
    assert result.transaction == Transaction(before.seq, before.txn_id, before.epoch, 7)
    assert sink.pending == {7: result.transaction}
    assert sink.current == Transaction(1, "out-0-1", 1, None)
    assert sink.current.txn_id != result.transaction.txn_id
    assert result.snapshot == SinkSnapshot(sink.current, (result.transaction,), 2)
    assert result.snapshot == sink.snapshot()


def test_pre_commit_new_current_never_reuses_a_pending_pool_id():
    sink = make_sink(size=3)
    sink.pre_commit(1)  # seq 0 -> slot 0 pending
    sink.pre_commit(2)  # seq 1 -> slot 1 pending
    assert sink.current.txn_id == "out-0-2"
    sink.commit_up_to(1, Recorder())  # frees slot 0
    sink.pre_commit(3)  # seq 2 (slot 2) pending; seq 3's natural slot 0 is free
    assert sink.current == Transaction(3, "out-0-0", 1)
    in_use = [t.txn_id for t in sink.pending.values()]
    assert sink.current.txn_id not in in_use
    assert sorted(in_use) == ["out-0-1", "out-0-2"]


def test_snapshot_lists_pending_oldest_first():
    sink = make_sink()
    for c in (2, 5, 9):
        sink.pre_commit(c)
    assert [t.checkpoint_id for t in sink.snapshot().pending] == [2, 5, 9]
    assert sink.snapshot().next_seq == 4


@pytest.mark.parametrize("second", [3, 2])
def test_out_of_order_pre_commit_raises(second):
    sink = make_sink()
    sink.pre_commit(3)
    current = sink.current
    with pytest.raises(IllegalTransitionError, match=rf"^pre-commit for checkpoint {second} after checkpoint 3$"):
        sink.pre_commit(second)
    assert list(sink.pending) == [3]
    assert sink.current == current


def test_out_of_order_pre_commit_raises_after_commit_too():
    sink = make_sink()
    sink.pre_commit(3)
    sink.commit_up_to(3, Recorder())
    with pytest.raises(IllegalTransitionError, match=r"^pre-commit for checkpoint 3 after checkpoint 3$"):
        sink.pre_commit(3)
    assert sink.pending == {}


def test_pre_commit_with_exhausted_pool_raises_and_leaves_sink_unchanged():
    sink = make_sink(size=2)
    sink.pre_commit(1)
    before = (dict(sink.pending), sink.current, sink.snapshot())
    with pytest.raises(IllegalTransitionError, match="are in use"):
        sink.pre_commit(2)
    assert (dict(sink.pending), sink.current, sink.snapshot()) == before
    # once checkpoint 1 is committed, the pool has room again
    sink.commit_up_to(1, Recorder())
    assert sink.pre_commit(2).transaction == Transaction(1, "out-0-1", 1, 2)
    assert sink.current == Transaction(2, "out-0-0", 1)


# --- TwoPhaseCommitSink: commit ---------------------------------------------------------------------


def test_committable_lists_pending_up_to_id_oldest_first():
    sink = make_sink()
    for c in (1, 2, 4):
        sink.pre_commit(c)
    assert [t.checkpoint_id for t in sink.committable(3)] == [1, 2]
    assert sink.committable(0) == []


def test_commit_up_to_commits_all_older_oldest_first():
    sink = make_sink()
    for c in (1, 2, 3):
        sink.pre_commit(c)
    recorder = Recorder()
    done = sink.commit_up_to(2, recorder)
    assert recorder.calls == [1, 2]
    assert [t.checkpoint_id for t in done] == [1, 2]
    assert list(sink.pending) == [3]


def test_late_or_skipped_notification_commits_everything_subsumed():
    sink = make_sink()
    for c in (3, 4, 5):
        sink.pre_commit(c)
    recorder = Recorder()
    sink.commit_up_to(5, recorder)
    assert recorder.calls == [3, 4, 5]
    assert sink.pending == {}


def test_commit_up_to_with_nothing_committable_does_nothing():
    sink = make_sink()
    sink.pre_commit(5)
    recorder = Recorder()
    assert sink.commit_up_to(4, recorder) == []
    assert recorder.calls == []
    assert list(sink.pending) == [5]


def test_repeated_notification_does_not_commit_again():
    sink = make_sink()
    sink.pre_commit(1)
    recorder = Recorder()
    sink.commit_up_to(1, recorder)
    sink.commit_up_to(1, recorder)
    assert recorder.calls == [1]


def test_commit_failure_tries_all_and_reports_first():
    sink = make_sink()
    for c in (1, 2, 3, 4):
        sink.pre_commit(c)
    failing = {c: sink.pending[c] for c in (2, 4)}
    recorder = Recorder(fail_for=(2, 4))
    with pytest.raises(CommitError, match=r"^2 of 4 commits failed; first: out-0-1\.e1\.s1: OSError\('commit of 2 failed'\)$") as info:
        sink.commit_up_to(4, recorder)
    assert recorder.calls == [1, 2, 3, 4]
    assert [(t.checkpoint_id, str(e)) for t, e in info.value.errors] == [
        (2, "commit of 2 failed"),
        (4, "commit of 4 failed"),
    ]
    assert isinstance(info.value.__cause__, OSError)
    assert sink.pending == failing  # successful ones left, failed ones still pending


def test_failed_commit_is_retried_by_next_notification():
    sink = make_sink()
    sink.pre_commit(1)
    sink.pre_commit(2)
    with pytest.raises(CommitError):
        sink.commit_up_to(1, Recorder(fail_for=(1,)))
    recorder = Recorder()
    sink.commit_up_to(2, recorder)
    assert recorder.calls == [1, 2]
    assert sink.pending == {}


def test_commit_all_without_pending_dict():
    recorder = Recorder()
    transactions = [txn(0, checkpoint_id=1), txn(1, checkpoint_id=2)]
    assert commit_all(transactions, recorder) == transactions
    assert recorder.calls == [1, 2]


# --- serialisation ----------------------------------------------------------------------------------


def test_transaction_handle():
    assert Transaction(12, "out-0-4", 3, 9).handle == "out-0-4.e3.s12"


@pytest.mark.parametrize("checkpoint_id", [None, 7])
def test_transaction_round_trip(checkpoint_id):
    t = Transaction(5, "out-1-5", 2, checkpoint_id)
    d = t.to_dict()
    assert d == {"seq": 5, "txn_id": "out-1-5", "epoch": 2, "checkpoint_id": checkpoint_id}
    assert Transaction.from_dict(json.loads(json.dumps(d))) == t


def test_sink_snapshot_round_trip_through_json():
    sink = make_sink(epoch=2)
    for c in (1, 2):
        sink.pre_commit(c)
    snapshot = sink.snapshot()
    encoded = json.dumps(snapshot.to_dict())
    decoded = SinkSnapshot.from_dict(json.loads(encoded))
    assert decoded == snapshot
    assert isinstance(decoded.pending, tuple)
    assert json.loads(encoded) == {
        "current": {"seq": 2, "txn_id": "out-0-2", "epoch": 2, "checkpoint_id": None},
        "pending": [
            {"seq": 0, "txn_id": "out-0-0", "epoch": 2, "checkpoint_id": 1},
            {"seq": 1, "txn_id": "out-0-1", "epoch": 2, "checkpoint_id": 2},
        ],
        "next_seq": 3,
    }


# --- recover ---------------------------------------------------------------------------------------------


def test_recover_recommits_pending_and_aborts_current():
    snapshot = SinkSnapshot(txn(2), (txn(0, checkpoint_id=1), txn(1, checkpoint_id=2)), 3)
    plan = recover(snapshot, [])
    assert plan == SinkRecovery(recommit=snapshot.pending, abort=(txn(2),))


def test_recover_aborts_open_transactions_not_owned():
    snapshot = SinkSnapshot(txn(2), (txn(1, checkpoint_id=2),), 3)
    # staged leftovers: the owned pending one, the snapshot's current, a newer one of the same
    # epoch (pre-committed for a checkpoint that never completed) and one of an older epoch
    open_txns = [txn(1), txn(2), txn(3, checkpoint_id=3), txn(0, epoch=0)]
    plan = recover(snapshot, open_txns)
    assert plan.recommit == (txn(1, checkpoint_id=2),)
    assert plan.abort == (txn(0, epoch=0), txn(2), txn(3, checkpoint_id=3))


def test_recover_never_lists_a_transaction_twice():
    snapshot = SinkSnapshot(txn(2), (txn(1, checkpoint_id=2),), 3)
    plan = recover(snapshot, [txn(2), txn(2), txn(4), txn(4), txn(1, checkpoint_id=2)])
    handles = [t.handle for t in (*plan.recommit, *plan.abort)]
    assert len(handles) == len(set(handles))
    assert [t.handle for t in plan.abort] == ["out-0-2.e1.s2", "out-0-4.e1.s4"]
    assert [t.handle for t in plan.recommit] == ["out-0-1.e1.s1"]


def test_recover_without_snapshot_aborts_everything_open():
    plan = recover(None, [txn(3), txn(1)])
    assert plan == SinkRecovery(recommit=(), abort=(txn(1), txn(3)))


def test_recover_with_nothing_open_and_no_snapshot():
    assert recover(None, []) == SinkRecovery((), ())


# --- restored --------------------------------------------------------------------------------------------


def test_restored_sink_continues_sequence_numbers_in_the_new_epoch():
    old = make_sink(epoch=1)
    for c in (1, 2):
        old.pre_commit(c)
    snapshot = old.snapshot()  # next_seq 3
    restored = TwoPhaseCommitSink.restored(snapshot, TransactionIdPool("out", 0, 8), epoch=2)
    assert restored.pending == {}
    assert restored.current == Transaction(3, "out-0-3", 2)
    assert restored.current.handle not in {t.handle for t in (snapshot.current, *snapshot.pending)}
    assert restored.pre_commit(3).transaction.seq == 3
    assert restored.current.seq == 4


def test_a_sink_resumed_in_a_later_process_continues_exactly_where_it_stopped():
    pool = TransactionIdPool("p.ledger", 0, size=4)
    sink = TwoPhaseCommitSink(pool, epoch=3)
    sink.pre_commit(1)
    sink.pre_commit(2)
    state = json.loads(json.dumps(sink.resume_state()))  # it travels as JSON
    again = TwoPhaseCommitSink.resumed(state, pool)
    assert again.current == sink.current and again.pending == sink.pending and again.epoch == 3
    assert again.snapshot() == sink.snapshot()
    with pytest.raises(IllegalTransitionError):
        again.pre_commit(2)  # the last pre-committed checkpoint is remembered
    assert again.pre_commit(3).transaction.handle == sink.pre_commit(3).transaction.handle


def test_commit_up_to_commits_each_sink_once_with_all_its_subtasks_and_tries_every_sink():
    """The rule production's completion and the simulator share: per sink ONE commit call with the
    pending transactions <= c of every subtask, oldest first; a failing sink keeps its transactions
    pending, the others commit, and the first failure is raised after the last sink."""
    ledger = [make_sink(prefix="ledger", subtask=i) for i in range(2)]
    balances = [make_sink(prefix="balances", subtask=i) for i in range(2)]
    audit = [make_sink(prefix="audit", subtask=0)]
    for c in (1, 2, 3):
        for book in ledger + balances + audit:
            book.pre_commit(c)
    calls: list[tuple[str, list[tuple[int, str]]]] = []
    after: list[str] = []

    def commit(name: str, txns: list[Transaction]) -> None:
        calls.append((name, [(t.checkpoint_id, t.txn_id) for t in txns]))
        if name == "balances":
            raise OSError("balances is down")

    with pytest.raises(CommitError, match=r"^4 of 10 commits failed; first: balances-0-0\.e1\.s0: OSError\('balances is down'\)$"):
        commit_up_to({"ledger": ledger, "balances": balances, "audit": audit}, 2, commit,
                     after=lambda name, txns: after.append(name))
    assert [name for name, _ in calls] == ["ledger", "balances", "audit"] and after == ["ledger", "audit"]
    assert calls[0][1] == [(1, "ledger-0-0"), (1, "ledger-1-0"), (2, "ledger-0-1"), (2, "ledger-1-1")]
    assert [list(b.pending) for b in ledger + audit] == [[3], [3], [3]]
    assert [list(b.pending) for b in balances] == [[1, 2, 3], [1, 2, 3]]  # a retry commits them again

    done = commit_up_to({"ledger": ledger, "balances": balances, "audit": audit}, 3,
                        lambda name, txns: calls.append((name, [])))
    assert {name: [t.checkpoint_id for t in txns] for name, txns in done.items()} == {
        "ledger": [3, 3], "balances": [1, 1, 2, 2, 3, 3], "audit": [3]}
    assert all(b.pending == {} for b in ledger + balances + audit)


def test_a_kill_after_a_sink_committed_propagates_at_once():
    """``after`` runs outside the failure handling: a kill point there stops the commit of the
    next sinks (a recovery re-commits what the checkpoint owns)."""
    first, second = [make_sink(prefix="a")], [make_sink(prefix="b")]
    for book in first + second:
        book.pre_commit(1)
    committed: list[str] = []

    def killed(name: str, txns: list[Transaction]) -> None:
        raise RuntimeError("killed at sink_commit:1")

    with pytest.raises(RuntimeError, match="killed"):
        commit_up_to({"a": first, "b": second}, 1, lambda name, txns: committed.append(name), after=killed)
    assert committed == ["a"] and first[0].pending == {} and list(second[0].pending) == [1]


def test_a_handle_reads_back_as_its_transaction_and_anything_else_is_refused():
    t = Transaction(7, "payments.ledger-2-0", 3)
    assert Transaction.from_handle(t.handle) == t
    with pytest.raises(ValueError, match="not a transaction handle"):
        Transaction.from_handle("payments.ledger-2-0.e3")

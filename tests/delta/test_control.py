"""``checkpoint_lib.control``: the runtime control API an orchestrator calls. Delta store + files,
no JVM: validation, durable requests and their races (on a local folder and on a real S3-compatible
server), the request policy (min pause, max concurrent), progress, abort, the idempotent and fenced
commit phase, the pause flag."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction as DeltaTxn, write_deltalake

from checkpoint_lib.control import (
    CheckpointRequests,
    PipelineControl,
    has_open_requests,
    honour_requests,
    parse_checkpoint_id,
    validate_pipeline_name,
    validate_request_id,
)
from checkpoint_lib.core.checkpoints import CompletedCheckpoint
from checkpoint_lib.core.errors import CheckpointError, FailureReason, FencedError, UnknownCheckpointError
from checkpoint_lib.core.recovery import SINK_STATE_KEY
from checkpoint_lib.core.twophase import SinkSnapshot, Transaction
from checkpoint_lib.core.types import CheckpointKind, SubtaskAck, SubtaskId, sink_operator
from checkpoint_lib.files import files_at


# --- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value, want", [(None, None), ("", None), ("latest", None), (" LATEST ", None),
                                         ("7", 7), (7, 7), (" 12 ", 12)])
def test_parse_checkpoint_id_accepts(value, want):
    assert parse_checkpoint_id(value) == want


@pytest.mark.parametrize(
    "value, message",
    [
        ("../../etc/passwd", "looks like a path"),
        ("/tmp/x", "looks like a path"),
        ("..", "looks like a path"),
        ("abc", "is not a number"),
        ("7.5", "is not a number"),
        ("-3", "is not a number"),
        ("٣", "is not a number"),  # a non-ASCII digit
        ("1" * 19, "too long"),
        ("9" * 5000, "too long"),
        (0, ">= 1"),
        ("0", ">= 1"),
        (True, "positive whole number"),
        (3.0, "positive whole number"),
    ],
)
def test_parse_checkpoint_id_refuses_with_a_clear_message(value, message):
    with pytest.raises(ValueError, match=message):
        parse_checkpoint_id(value)


@pytest.mark.parametrize("name", ["../x", "Payments", "a/b", "", "x" * 64, None, "pay ments"])
def test_pipeline_names_are_validated(name):
    with pytest.raises(ValueError, match="pipeline name"):
        validate_pipeline_name(name)
    with pytest.raises(ValueError):
        PipelineControl("/tmp/w", name)


@pytest.mark.parametrize("rid", ["../x", "a/b", "", ".hidden", "a..b", "x" * 201, "a b"])
def test_request_ids_are_validated(rid):
    with pytest.raises(ValueError, match="request id"):
        validate_request_id(rid)


def test_constructor_does_no_io(tmp_path):
    PipelineControl(tmp_path / "w", "payments")
    assert not (tmp_path / "w").exists()


# --- requests ---------------------------------------------------------------------------------------


@pytest.mark.race
def test_request_is_idempotent_and_honoured_once(storage_root):
    requests = CheckpointRequests(storage_root)
    assert requests.open() == [] and requests.all() == [] and not has_open_requests(storage_root)
    first, made = requests.create("run-1", "dag")
    again, made_again = requests.create("run-1", "someone else")
    assert made and not made_again and again == first and first.state == "requested"
    assert [r.request_id for r in requests.open()] == ["run-1"]
    assert has_open_requests(storage_root)
    assert [r.request_id for r in honour_requests(storage_root, 5, epoch=2)] == ["run-1"]
    assert honour_requests(storage_root, 6, epoch=2) == []  # nothing open any more
    got = requests.get("run-1")
    assert (got.state, got.checkpoint_id, got.epoch) == ("honoured", 5, 2)
    assert not has_open_requests(storage_root) and requests.all() == [got]
    # one file per request and outcome, no temporary file left
    assert files_at(storage_root).names(storage_root / "requests") == ["run-1.outcome", "run-1.request"]


@pytest.mark.race
def test_cancel_and_honour_race_has_exactly_one_winner(storage_root):
    for i in range(20):
        requests = CheckpointRequests(storage_root / str(i))
        requests.create("r")
        results = {}
        barrier = threading.Barrier(2)

        def honour():
            barrier.wait()
            results["honour"] = requests.honour(requests.open() or [requests.get("r")], 3, 1)

        def cancel():
            barrier.wait()
            results["cancel"] = requests.cancel("r", "expired")

        threads = [threading.Thread(target=honour), threading.Thread(target=cancel)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        final = requests.get("r")
        assert final.state in ("honoured", "cancelled")
        assert (final.state == "honoured") == bool(results["honour"])
        assert results["cancel"] == final


def test_cancel_of_an_unknown_request(storage_root):
    with pytest.raises(UnknownCheckpointError):
        CheckpointRequests(storage_root).cancel("nope", "x")


# --- the policy, progress, abort -------------------------------------------------------------------


def _completed(cid: int, when: float, sinks: dict | None = None) -> CompletedCheckpoint:
    acks = {SubtaskId("source", 0): SubtaskAck(state={"version": cid})}
    for name, txns in (sinks or {}).items():
        snap = SinkSnapshot(Transaction(99, f"p.{name}-0-9", 1), tuple(txns), 100)
        acks[SubtaskId(sink_operator(name), 0)] = SubtaskAck(state={SINK_STATE_KEY: snap.to_dict()})
    return CompletedCheckpoint(cid, CheckpointKind.CHECKPOINT, when - 1, when, acks, {s: when for s in acks})


@pytest.fixture
def control(tmp_path) -> PipelineControl:
    return PipelineControl(tmp_path / "w", "payments")


def test_request_policy_min_pause_and_max_concurrent(control):
    store = control.store
    store.epochs.begin()
    cid = store.ids.get_and_increment()
    store.checkpoints.record_pending(cid, trigger_time=100.0, epoch=1)
    # one pending checkpoint of the current epoch: a request waits behind it (as Flink queues a trigger
    # request), so a run that ends with a checkpoint never starves the snapshot DAG
    assert control.request_checkpoint("a", max_concurrent=1, now=200.0).created
    # a request waiting already: max_concurrent=1 postpones (nothing written), 2 admits
    out = control.request_checkpoint("b", max_concurrent=1, now=200.0)
    assert out.request is None and out.postponed == "too_many_concurrent_checkpoints"
    assert control.requests.get("b") is None
    assert control.request_checkpoint("b", max_concurrent=2, now=200.0).created
    assert control.request_checkpoint("d", max_concurrent=2, now=200.0).postponed == "too_many_concurrent_checkpoints"
    # complete the pending one (its end at 300): min pause 60 postpones until 360
    store.checkpoints.add(_completed(cid, 300.0), epoch=1)
    honour_requests(control.root, 42, 1)
    early = control.request_checkpoint("c", min_pause=60, now=330.0)
    assert early.postponed == "minimum_time_between_checkpoints" and early.not_before == 360.0
    assert control.request_checkpoint("c", min_pause=60, now=361.0).created
    # a retry of an admitted request returns it whatever the policy says now
    again = control.request_checkpoint("c", min_pause=10_000, now=362.0)
    assert again.request.request_id == "c" and not again.created


def test_pending_of_a_fenced_epoch_does_not_count(control):
    store = control.store
    store.epochs.begin()
    store.checkpoints.record_pending(store.ids.get_and_increment(), trigger_time=1.0, epoch=1)
    store.epochs.begin()  # epoch 2: the old pending checkpoint can never complete
    assert control.request_checkpoint("x", max_concurrent=1, now=10.0).created


def test_progress_through_a_checkpoint_life(control):
    control.request_checkpoint("r", now=1.0)
    assert control.progress(request_id="r").status == "requested"
    store = control.store
    store.epochs.begin()
    cid = store.ids.get_and_increment()
    honour_requests(control.root, cid, 1)
    assert control.progress(request_id="r").status == "unknown"  # honoured, pending row not yet written
    store.checkpoints.record_pending(cid, trigger_time=2.0, epoch=1)
    store.acks.record(cid, {SubtaskId("source", 0): SubtaskAck(state={"version": 1})}, epoch=1)
    p = control.progress(request_id="r")
    assert (p.status, p.checkpoint_id, p.acks_received, p.done) == ("pending", cid, 1, False)
    assert p.acks_expected == 2 + 3 * 3  # payments: 2 sources, 3 keyed, 2 sinks x 3
    assert control.acks(cid)[0]["subtask"] == "source[0]"
    store.checkpoints.add(_completed(cid, 3.0), epoch=1)
    done = control.progress(checkpoint_id=cid)
    assert done.status == "completed" and done.done and done.to_dict()["checkpoint_id"] == cid
    with pytest.raises(UnknownCheckpointError):
        control.progress(request_id="never")
    with pytest.raises(ValueError):
        control.progress()


def test_abort_cancels_an_unhonoured_request(control):
    control.request_checkpoint("r")
    out = control.abort(request_id="r", reason=FailureReason.EXPIRED, message="no source step within 60 s")
    assert out.aborted and out.status == "cancelled"
    assert control.progress(request_id="r").status == "cancelled"
    assert honour_requests(control.root, 9, 1) == []  # a later source step does not honour it


def test_abort_a_pending_checkpoint_but_never_a_completed_one(control):
    store = control.store
    store.epochs.begin()
    a, b = store.ids.get_and_increment(), store.ids.get_and_increment()
    store.checkpoints.record_pending(a, trigger_time=1.0, epoch=1)
    assert control.request_checkpoint("r", max_concurrent=2).created
    honour_requests(control.root, a, 1)
    out = control.abort(request_id="r", reason="expired", message="timeout")
    assert (out.aborted, out.status, out.checkpoint_id) == (True, "aborted", a)
    row = store.checkpoints.status(a)
    assert (row["status"], row["failure_reason"], row["message"]) == ("aborted", "expired", "timeout")
    assert control.abort(checkpoint_id=a).aborted  # again: a no-op, still aborted
    store.checkpoints.add(_completed(b, 5.0), epoch=1)
    refused = control.abort(checkpoint_id=b)
    assert (refused.aborted, refused.status) == (False, "completed")
    assert store.checkpoints.status(b)["status"] == "completed"


# --- commit -----------------------------------------------------------------------------------------


def _stamp(path: Path, app_id: str, version: int) -> None:
    """A sink target holding the Delta idempotent-write stamp (app_id, version), as Spark writes it."""
    data = pa.table({"account": ["a"]})
    write_deltalake(str(path), data, mode="append",
                    commit_properties=CommitProperties(app_transactions=[DeltaTxn(app_id, version)]))


def test_commit_is_a_noop_when_the_sinks_hold_the_stamps(control):
    store = control.store
    store.epochs.begin()
    cid = store.ids.get_and_increment()
    ledger = [Transaction(0, "payments.ledger-0-0", 1, cid)]
    balances = [Transaction(0, "payments.balances-0-0", 1, cid)]
    store.checkpoints.add(_completed(cid, 5.0, {"ledger": ledger, "balances": balances}), epoch=1)
    w = Path(control.warehouse)
    _stamp(w / "gold" / "ledger", "checkpoint_lib/payments/ledger/e1", cid)
    assert not control.all_committed(cid)  # the balances' transaction has not committed
    _stamp(w / "gold" / "balances", "checkpoint_lib/payments/balances/e1", cid)
    assert control.all_committed(cid)  # what the Airflow hook asks before it starts Spark
    started = time.monotonic()
    out = control.commit(cid)
    assert out.noop and time.monotonic() - started < 10  # no Spark session was started
    assert out.already_committed == {"ledger": [ledger[0].handle], "balances": [balances[0].handle]}
    assert "already committed" in out.describe()


def test_commit_refusals(control):
    store = control.store
    store.epochs.begin()
    pending, aborted, done = (store.ids.get_and_increment() for _ in range(3))
    store.checkpoints.record_pending(pending, trigger_time=1.0, epoch=1)
    store.checkpoints.record_aborted(aborted, FailureReason.DECLINED, "no", 1)
    store.checkpoints.add(_completed(done, 5.0), epoch=1)
    with pytest.raises(UnknownCheckpointError):
        control.commit(999)
    with pytest.raises(CheckpointError, match="is pending"):
        control.commit(pending)
    with pytest.raises(CheckpointError, match="is aborted"):
        control.commit(aborted)
    with pytest.raises(ValueError, match="path"):
        control.commit("../1")
    store.epochs.begin()  # a recovery began epoch 2: checkpoint `done` belongs to a zombie attempt
    with pytest.raises(FencedError):
        control.commit(done)


def test_resolve_checkpoint(control):
    store = control.store
    store.epochs.begin()
    cid = store.ids.get_and_increment()
    store.checkpoints.add(_completed(cid, 5.0), epoch=1)
    assert control.resolve_checkpoint("latest") is None
    assert control.resolve_checkpoint(str(cid)) == cid
    with pytest.raises(UnknownCheckpointError, match="retained"):
        control.resolve_checkpoint("12345")


def test_pause_flag_is_owned(control):
    assert control.paused() is None
    assert control.pause("recover-1", "recovery")
    assert control.pause("recover-1", "again")  # re-entrant for its owner
    assert not control.pause("recover-2", "recovery")
    assert control.paused()["by"] == "recover-1"
    assert not control.unpause("recover-2")
    assert control.unpause("recover-1") and control.paused() is None
    assert control.unpause("anyone")  # idempotent


# --- a savepoint of a running pipeline ------------------------------------------------------------


def test_a_running_pipeline_takes_a_requested_savepoint_without_stopping(control):
    """``ckpt savepoint`` on a running pipeline asks its next source step (as Flink's savepoint of
    a running job) and waits for the savepoint to complete; nothing begins a new epoch."""
    store = control.store
    epoch = store.epochs.begin()
    store.sessions.record_restored(epoch, None, {})
    assert not control.source_running()
    session = store.sessions.begin(epoch, "source")
    assert control.source_running()

    def running_source_step():  # what the runner's next step does with the open request
        while not control.requests.open():
            time.sleep(0.01)
        (request,) = control.requests.open()
        assert request.kind == "savepoint"
        cid = store.ids.get_and_increment()
        honour_requests(control.root, cid, epoch)
        store.checkpoints.record_pending(cid, trigger_time=1.0, epoch=epoch, kind=CheckpointKind.SAVEPOINT)
        c = _completed(cid, 2.0)
        store.checkpoints.add(CompletedCheckpoint(cid, CheckpointKind.SAVEPOINT, 1.0, 2.0, c.acks, c.ack_times), epoch=epoch)

    step = threading.Thread(target=running_source_step)
    step.start()
    cid, state = control.savepoint_from_running("sp-1", timeout=30, poll=0.02)
    step.join()
    assert state == "completed" and store.checkpoints.latest().kind is CheckpointKind.SAVEPOINT and store.checkpoints.latest().checkpoint_id == cid
    assert store.epochs.current() == epoch
    store.sessions.end(epoch, "source", session, {})
    assert not control.source_running()


def test_a_savepoint_request_nobody_takes_is_cancelled_for_the_caller_to_take_it(control):
    """The source's process died without ending its session: no step answers. The request is
    cancelled (a late honour would win the race instead, and be waited for), and the caller
    recovers and takes the savepoint itself."""
    store = control.store
    epoch = store.epochs.begin()
    store.sessions.begin(epoch, "source")
    assert control.savepoint_from_running("sp-2", timeout=0.2, poll=0.05) == (None, "unanswered")
    request = control.requests.get("sp-2")
    assert request.state == "cancelled" and request.kind == "savepoint" and not control.requests.open()
    with pytest.raises(ValueError, match="one of"):
        control.requests.create("sp-3", kind="full")


# --- the answering side: which barrier a source step sends ------------------------------------------


def _coordinator(interval: float = 0.0):
    from checkpoint_lib.core.clock import ManualClock
    from checkpoint_lib.core.coordinator import CheckpointCoordinator
    from checkpoint_lib.core.decider import CheckpointConfig
    from checkpoint_lib.core.stores import InMemoryCheckpointIdCounter, InMemoryCompletedCheckpointStore

    src = SubtaskId("source", 0)
    c = CheckpointCoordinator(CheckpointConfig(interval=interval, max_concurrent=1, timeout=100), [src], [src],
                              InMemoryCheckpointIdCounter(), InMemoryCompletedCheckpointStore(5), ManualClock())
    c.all_running()
    return c


def _next(tmp_path, coordinator, moved: bool):
    from checkpoint_lib.checkpoint_requests import next_trigger

    fenced, said = [], []
    effects, trigger = next_trigger(CheckpointRequests(tmp_path), coordinator, moved=moved, epoch=3,
                                    fence=lambda: fenced.append(1), progress=said.append)
    return effects, trigger, bool(fenced), said


def test_a_step_with_nothing_asked_sends_the_periodic_barrier_only_when_it_moved(tmp_path):
    c = _coordinator()
    assert _next(tmp_path, c, moved=False)[1] is None
    _, trigger, fenced, _ = _next(tmp_path, c, moved=True)
    assert trigger.barrier.kind is CheckpointKind.CHECKPOINT and not fenced


def test_a_checkpoint_request_is_answered_by_the_periodic_barrier_or_a_forced_one(tmp_path):
    c = _coordinator(interval=3600)  # no periodic one due after the first
    requests = CheckpointRequests(tmp_path)
    requests.create("a")
    _, first, fenced, said = _next(tmp_path, c, moved=True)  # the periodic one (the first is due) answers it
    assert first.barrier.kind is CheckpointKind.CHECKPOINT and fenced and "answers requests ['a']" in said[0]
    assert requests.get("a").checkpoint_id == first.checkpoint_id and requests.get("a").epoch == 3
    c.abort(first.checkpoint_id, FailureReason.EXPIRED)
    requests.create("b")
    _, forced, _, _ = _next(tmp_path, c, moved=False)  # nothing new, none due: a forced one
    assert forced.checkpoint_id > first.checkpoint_id and requests.get("b").checkpoint_id == forced.checkpoint_id


def test_a_savepoint_request_replaces_the_periodic_barrier_of_a_step_that_checkpoints_every_step(tmp_path):
    """A pipeline checkpointing every step (interval 0) still takes a savepoint at its next step
    (before, the periodic checkpoint went first every step and the request waited until the
    pipeline caught up, or timed out, and ``ckpt savepoint`` then recovered, fencing the running
    pipeline); the checkpoint request waiting with it is answered by it too."""
    c = _coordinator(interval=0)
    requests = CheckpointRequests(tmp_path)
    requests.create("cp")
    requests.create("sp", kind="savepoint")
    effects, trigger, _, _ = _next(tmp_path, c, moved=True)
    assert trigger.barrier.kind is CheckpointKind.SAVEPOINT
    assert requests.get("sp").checkpoint_id == requests.get("cp").checkpoint_id == trigger.checkpoint_id
    assert not [e for e in effects if type(e).__name__ == "TriggerCheckpoint"]
    assert c.status_of(trigger.checkpoint_id) == "pending"
    assert [p for p in c.pending] == [trigger.checkpoint_id]  # no periodic checkpoint beside it


def test_a_running_graph_is_seen_by_the_process_group_that_plans_its_steps(tmp_path):
    """A dataflow graph's one process records its session as its process group (``all``): that is
    what a savepoint request asks (a session of the linear ``source`` stage would be another's)."""
    control = PipelineControl(tmp_path / "w", "enrichment")
    assert control.stepping_stages() == {"all", "sources"}  # one process, or the per-vertex layout's sources
    # a linear pipeline runs on the graph runtime: one process records ``all``, separate stages ``source``
    assert PipelineControl(tmp_path / "w", "payments").stepping_stages() == {"all", "source"}
    store = control.store
    epoch = store.epochs.begin()
    store.sessions.record_restored(epoch, None, {})
    store.sessions.begin(epoch, "source")
    assert not control.source_running()
    session = store.sessions.begin(epoch, "all")
    assert control.source_running()
    store.sessions.end(epoch, "all", session, {})
    assert not control.source_running()
    # payments 2, accounts 1, tag 2, dedup 2, totals 1; the sinks at tag, dedup and totals: 2 + 2 + 1
    assert control._expected_acks() == 8 + 5

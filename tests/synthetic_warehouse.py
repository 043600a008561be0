"""A payments warehouse written with delta-rs alone (no Spark), laid out as a run leaves it, for
the inspecting commands' fast tests: a landing table of 2 versions, the keyed state table with
the version each checkpoint pinned, both sinks with one stamped commit per checkpoint, and the
store's completed checkpoints 1, 2 and 3 (3 is the final one of a run: no new data) with their
acks (source offsets, key groups and state versions, the sinks' transactions).

The same shape as ``test_inspect_commands.py``'s Spark run (2 versions of ``ROWS`` payments,
``ACCOUNTS`` accounts), so one set of tests reads both. What it cannot imitate is Spark's own
files (deletion vectors in the state table): the Spark-built warehouse covers those."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from checkpoint_lib.core.checkpoints import CompletedCheckpoint
from checkpoint_lib.core.recovery import SINK_STATE_KEY
from checkpoint_lib.core.types import CheckpointKind, SubtaskAck, SubtaskId, sink_operator
from checkpoint_lib.delta.store import DeltaCheckpointStore

ROWS, ACCOUNTS, SPANS = 200, 12, ((0, 42), (43, 85), (86, 127))
T0 = 1_790_000_000.0


def _account(i: int) -> str:
    return f"acct-{i % ACCOUNTS:06d}"


def _key_group(account: str) -> int:
    return (int(account[-6:]) * 37) % 128  # any fixed spread over the 128 key groups


def _subtask(key_group: int) -> int:
    return next(i for i, (lo, hi) in enumerate(SPANS) if lo <= key_group <= hi)


def _stamp(pipeline: str, sink: str, epoch: int, checkpoint_id: int) -> CommitProperties:
    return CommitProperties(app_transactions=[Transaction(f"checkpoint_lib/{pipeline}/{sink}/stamp",
                                                          epoch << 32 | checkpoint_id)])


def _snapshot(sink: str, subtask: int, checkpoint_id: int) -> dict:
    """A sink subtask's ack: it owns the transaction of this checkpoint, the next one is open."""
    seq = checkpoint_id - 1
    txn = lambda s, c: {"checkpoint_id": c, "epoch": 1, "seq": s, "txn_id": f"payments.{sink}-{subtask}-{s}"}  # noqa: E731
    return {"current": txn(seq + 1, None), "next_seq": seq + 2, "pending": [txn(seq, checkpoint_id)]}


def synthetic_warehouse(w: Path) -> Path:
    """Write the warehouse into ``w``; returns ``w``."""
    landing, ledger, balances = w / "landing" / "payments", w / "gold" / "ledger", w / "gold" / "balances"
    state = w / "_checkpoints" / "payments" / "state" / "balance"
    store = DeltaCheckpointStore.open(w / "_checkpoints" / "payments")
    epoch = store.epochs.begin("test", "synthetic")
    totals: dict[str, tuple[int, int]] = {}
    write_deltalake(state, pa.table({"key_group": pa.array([], pa.int32()), "account": pa.array([], pa.string()),
                                     "balance_cents": pa.array([], pa.int64()),
                                     "event_count": pa.array([], pa.int64())}))  # version 0: created
    for version in (0, 1):  # a landing version per checkpoint, read and committed by checkpoint version + 1
        ids = range(version * ROWS, (version + 1) * ROWS)
        payments = pa.table({"event_id": [f"e{i}" for i in ids], "account": [_account(i) for i in ids],
                             "amount_cents": [100 + i for i in ids],
                             "ts": pa.array([int(T0) + i for i in ids], pa.int64()).cast(pa.timestamp("us", "UTC"))})
        write_deltalake(landing, payments, mode="append")
        running = []
        for i in ids:
            before, count = totals.get(_account(i), (0, 0))
            totals[_account(i)] = (before + 100 + i, count + 1)
            running.append(before + 100 + i)
        cid = version + 1
        write_deltalake(ledger, payments.select(["event_id", "account", "amount_cents"]).append_column(
            "balance_after_cents", pa.array(running, pa.int64())), mode="append",
            commit_properties=_stamp("payments", "ledger", epoch, cid))
        rows = pa.table({"account": list(totals), "balance_cents": [b for b, _ in totals.values()],
                         "event_count": [n for _, n in totals.values()]})
        write_deltalake(balances, rows, mode="overwrite", commit_properties=_stamp("payments", "balances", epoch, cid))
        write_deltalake(state, rows.add_column(0, "key_group", pa.array([_key_group(a) for a in totals], pa.int32())),
                        mode="overwrite")  # version cid: the state after checkpoint cid's step
    for cid in (1, 2, 3):  # 3: the run's final checkpoint, no new data (empty stamped commits)
        if cid == 3:
            for sink, table in (("ledger", ledger), ("balances", balances)):
                write_deltalake(table, pa.Table.from_pylist([], schema=_schema(table)), mode="append",
                                commit_properties=_stamp("payments", sink, epoch, cid))
        acks = {SubtaskId("source", i): SubtaskAck(state={"version": min(cid - 1, 1), "next_seq": 0, "barrier_seq": -1})
                for i in range(2)}
        for i, (lo, hi) in enumerate(SPANS):
            acks[SubtaskId("balance", i)] = SubtaskAck(
                state={"table_version": min(cid, 2), "key_groups": [lo, hi], "cursor": -1}, state_size_bytes=500 + i)
            for sink in ("ledger", "balances"):
                acks[SubtaskId(sink_operator(sink), i)] = SubtaskAck(state={SINK_STATE_KEY: _snapshot(sink, i, cid)})
        store.checkpoints.record_pending(cid, epoch=epoch, trigger_time=T0 + 10 * cid)
        store.checkpoints.add(CompletedCheckpoint(cid, CheckpointKind.CHECKPOINT, T0 + 10 * cid, T0 + 10 * cid + 2, acks,
                                      {s: T0 + 10 * cid + 1 for s in acks}), epoch=epoch)
    return w


def _schema(table: Path) -> pa.Schema:
    from deltalake import DeltaTable

    return pa.schema(DeltaTable(str(table)).schema().to_arrow())

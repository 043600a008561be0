"""A payments warehouse written with delta-rs alone (no Spark), laid out as a run leaves it, for
the inspecting commands' fast tests: a landing table of 2 versions, the keyed state table with
the version each checkpoint pinned, both sinks with one stamped commit per checkpoint, and the
store's completed checkpoints 1, 2 and 3 (3 is the final one of a run: no new data) with their
acks (source offsets, key groups and state versions, the sinks' transactions).

The same shape as ``test_inspect_commands.py``'s Spark run (2 versions of ``ROWS`` payments,
``ACCOUNTS`` accounts), so one set of tests reads both. What it cannot imitate is Spark's own
files (deletion vectors in the state table): the Spark-built warehouse covers those.

:func:`synthetic_graph_warehouse` does the same for the ``enrichment`` dataflow graph: two sources,
three keyed operators with their state tables, a sink at each operator."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from checkpoint_lib.core.checkpoints import CompletedCheckpoint
from checkpoint_lib.core.keygroups import range_for_subtask
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


# --- a dataflow graph: enrichment -------------------------------------------------------------------

GRAPH_STATE = {  # operator uid -> (key column, its state columns as Arrow types)
    "tag": ("account", {"region": pa.string(), "status": pa.string(), "updated_at": pa.timestamp("us", "UTC")}),
    "dedup": ("event_id", {"seen": pa.bool_()}),
    "totals": ("region", {"total_cents": pa.int64(), "payment_count": pa.int64()}),
}
GRAPH_KEYS = {  # operator uid -> per checkpoint (1, 2): the keys its state holds
    "tag": ([f"acct-{i}" for i in range(4)], [f"acct-{i}" for i in range(6)]),
    "dedup": ([f"e{i}" for i in range(10)], [f"e{i}" for i in range(20)]),
    "totals": (["north", "south"], ["east", "north", "south"]),
}


def _graph_state_row(uid: str, key: str, cid: int) -> dict:
    n = int("".join(c for c in key if c.isdigit()) or len(key))
    if uid == "tag":
        return {"region": "north" if n % 2 else "south", "status": "open",
                "updated_at": datetime.fromtimestamp(T0 + n, timezone.utc)}
    if uid == "dedup":
        return {"seen": True}
    return {"total_cents": 1000 * cid + n, "payment_count": cid + n}


def synthetic_graph_warehouse(w: Path) -> Path:
    """The control tables and state tables a run of the ``enrichment`` graph leaves (written with
    delta-rs alone): sources ``payments`` (2 subtasks) and ``accounts`` (1); keyed operators
    ``tag`` (two-input, 2), ``dedup`` (2) and ``totals`` (1), each with its state table at
    ``state/<uid>`` (version 0 created, version c the state after checkpoint c's step: the keys of
    :data:`GRAPH_KEYS`); sinks ``rejected`` (at tag), ``tagged`` (at dedup), ``region_totals`` (at
    totals); completed checkpoints 1 and 2 with every figure an ack has (``graph_acks``). No source
    or sink table: the inspecting commands read the control and state tables only."""
    root = w / "_checkpoints" / "enrichment"
    store = DeltaCheckpointStore.open(root)
    epoch = store.epochs.begin("test", "synthetic graph")
    for uid, (key, columns) in GRAPH_STATE.items():
        schema = pa.schema([("key_group", pa.int32()), (key, pa.string()), *columns.items()])
        write_deltalake(root / "state" / uid, pa.Table.from_pylist([], schema=schema))  # version 0
        for cid in (1, 2):
            rows = [{"key_group": (sum(map(ord, k)) * 37) % 128, key: k, **_graph_state_row(uid, k, cid)}
                    for k in GRAPH_KEYS[uid][cid - 1]]
            write_deltalake(root / "state" / uid, pa.Table.from_pylist(rows, schema=schema), mode="overwrite")
    for cid in (1, 2):
        acks = graph_acks(cid)
        store.checkpoints.record_pending(cid, epoch=epoch, trigger_time=T0 + 10 * cid)
        store.checkpoints.add(CompletedCheckpoint(cid, CheckpointKind.CHECKPOINT, T0 + 10 * cid, T0 + 10 * cid + 2, acks,
                                                  {s: T0 + 10 * cid + 1 for s in acks}), epoch=epoch)
    return w


def graph_acks(cid: int) -> dict[SubtaskId, SubtaskAck]:
    """Checkpoint ``cid``'s acks of the enrichment graph: sources at offsets ``cid`` (payments) and
    ``cid + 10`` (accounts); every operator subtask pins its state table's version ``cid``, with
    sizes and timings that differ per subtask (``tag[1]`` is the slowest, with the longest
    alignment; ``dedup[1]`` snapshotted unaligned with 4 records of channel state at checkpoint 2);
    each sink subtask owns its transaction of ``cid``."""
    acks: dict[SubtaskId, SubtaskAck] = {}
    for source, parallelism, offset in (("payments", 2, cid), ("accounts", 1, cid + 10)):
        for i in range(parallelism):
            acks[SubtaskId(source, i)] = SubtaskAck(state={"version": offset, "next_seq": 0, "barrier_seq": -1},
                                                    duration_ms=1.0 + i)
    for uid, parallelism, sink in (("tag", 2, "rejected"), ("dedup", 2, "tagged"), ("totals", 1, "region_totals")):
        for i in range(parallelism):
            span = range_for_subtask(i, parallelism, 128)
            unaligned = uid == "dedup" and i == 1 and cid == 2
            acks[SubtaskId(uid, i)] = SubtaskAck(
                state={"table_version": cid, "key_groups": span.to_list(), "cursor": -1},
                state_size_bytes=100 * cid + 10 * i, alignment_ms=3.5 if (uid, i) == ("tag", 1) else 0.5,
                duration_ms=41.0 if (uid, i) == ("tag", 1) else 5.0 + i, unaligned=unaligned,
                channel_state_rows=4 if unaligned else 0, channel_state_bytes=256 if unaligned else 0)
            acks[SubtaskId(sink_operator(sink), i)] = SubtaskAck(state={SINK_STATE_KEY: _graph_snapshot(sink, i, cid)})
    return acks


def _graph_snapshot(sink: str, subtask: int, cid: int) -> dict:
    txn = lambda s, c: {"checkpoint_id": c, "epoch": 1, "seq": s, "txn_id": f"enrichment.{sink}-{subtask}-{s}"}  # noqa: E731
    return {"current": txn(cid, None), "next_seq": cid + 1, "pending": [txn(cid - 1, cid)]}

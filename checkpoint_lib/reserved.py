"""The column names the library keeps for itself: the one definition. Pure: imports no engine.

Most of our bookkeeping lives where no column of a pipeline can meet it: the channel logs, the
channel-state table and the dead letters keep a record (or a bad source row) in one struct column,
:data:`RECORD`, beside their own columns. A few names must stay reserved because records carry
them through user code (a ``map()`` keeps the offsets and ``sender``, an operator sees
``sink_subtask``), or because a sink's staged rows carry them beside the sink's columns; every
temporary column of a step starts with :data:`PREFIX`. A declaration that uses one of them is
refused at once (:func:`check_columns`), with a message naming the column and what it is for.
"""

from __future__ import annotations

from typing import Iterable

from .layout import KEY_GROUP

OFFSET_COLUMNS = ("src_version", "src_file", "src_row")
"""Every record's source offset: the landing version, file and row it came from."""
OFFSET_FIELDS = tuple(zip(OFFSET_COLUMNS, ("long", "string", "long")))
"""Every record's source offset (:data:`OFFSET_COLUMNS`) with its type."""
SENDER, RECEIVER = "sender", "receiver"
SINK_SUBTASK = "sink_subtask"
"""The column of a record naming the operator subtask that received it (read-only to operators)."""
HANDLE_COLUMN, TXN_SEQ, FLUSH = "txn_handle", "txn_seq", "flush"
"""A sink's staged rows: the transaction that stages them, its sequence number and the flush
(what orders an upsert sink's rows of one key)."""

RECORD = "record"
"""The struct column holding the record (or the bad source row) in the channel logs, the
channel-state table and the dead letters; their own columns are beside it."""

PREFIX = "_ckpt_"
"""Every temporary column of ours starts with it (:func:`temporary`)."""

ERROR_COLUMN = PREFIX + "error"
"""The reason a source row is bad (null: good), from a source's reader to the dead letters."""

RECORD_COLUMNS: dict[str, str] = {
    "src_version": "the source offset of every record (the landing version it came from)",
    "src_file": "the source offset of every record (the landing file it came from)",
    "src_row": "the source offset of every record (its row in the landing file)",
    SENDER: "the source subtask that read a record (a map() must keep it)",
    RECEIVER: "the operator subtask a record is routed to",
    KEY_GROUP: "the key group a record is routed by",
    SINK_SUBTASK: "the operator subtask that received a record (operators read it, sinks stage by it)",
}
"""Reserved in a source's, a bootstrap table's and a ``map()``'s columns (so in every record)."""

SINK_COLUMNS: dict[str, str] = {
    SINK_SUBTASK: RECORD_COLUMNS[SINK_SUBTASK],
    HANDLE_COLUMN: "the sink transaction a staged row belongs to",
    TXN_SEQ: "the order of an upsert sink's staged rows (the transaction's sequence number)",
    FLUSH: "the order of an upsert sink's staged rows (the flush that staged them)",
}
"""Reserved in a sink's columns."""

STATE_RUN = PREFIX + "run"
"""In a keyed state table: the run (the flush's table version) that wrote the row; of a key's
rows the newest run's holds its state (:func:`~checkpoint_lib.spark.state.live`)."""
STATE_GONE = PREFIX + "gone"
"""In a keyed state table: the row says its run deleted the key's state (a tombstone)."""
STATE_COLUMNS: dict[str, str] = {
    KEY_GROUP: "the key group of every row of keyed state",
    STATE_RUN: "the flush that wrote a row of keyed state",
    STATE_GONE: "a row of keyed state that deletes its key",
}
"""Reserved in an operator's state columns (besides its key and ``_delete``/``_ttl_written``)."""


class ReservedColumnError(ValueError):
    """A declaration uses a column name the library keeps for itself."""


def temporary(name: str) -> str:
    """The name of one of our temporary columns (``_ckpt_<name>``): no declared column has it."""
    return PREFIX + name


def reserved_use(name: str, reserved: dict[str, str]) -> str | None:
    """What the library uses column ``name`` for, when it is reserved among ``reserved``."""
    if name in reserved:
        return reserved[name]
    if name.startswith(PREFIX):
        return f"the library's temporary columns (every name starting with {PREFIX!r})"
    return None


def check_columns(names: Iterable[str], where: str, reserved: dict[str, str] = RECORD_COLUMNS,
                  fix: str = "rename it") -> None:
    """Refuse the first of ``names`` (the columns of ``where``) the library keeps for itself,
    saying what it is used for and ``fix``."""
    for name in names:
        use = reserved_use(name, reserved)
        if use is not None:
            raise ReservedColumnError(
                f"{where}: column {name!r} is reserved: checkpoint_lib uses it for {use}. {fix[0].upper()}{fix[1:]} "
                "(reserved names: checkpoint_lib.reserved, the README's \"Reserved column names\")"
            )

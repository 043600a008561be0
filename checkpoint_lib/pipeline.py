"""Declaring a pipeline: a fluent builder that does nothing until it is run.

>>> payments = (
...     Pipeline("payments")
...     .source(DeltaSource("landing/payments", schema=PAYMENTS_SCHEMA, validate=payment_errors), parallelism=2)
...     .key_by("account", parallelism=3)
...     .process(RunningBalance(), uid="balance")
...     .sink("ledger", DeltaSink("gold/ledger", LEDGER_SCHEMA))
...     .sink("balances", DeltaSink("gold/balances", BALANCES_SCHEMA, mode="upsert", keys=["account"]))
...     .dead_letters("dlq/payments")
... )

Paths are relative to the warehouse root given at run time. The graph has two stages joined by a
persisted Delta channel log, so they can run as separate processes on separate cadences:

- the **source stage**: the source subtasks, then any ``map()`` transformations (fused: forward,
  no channel), then a partitioner that routes each record to a subtask of the next operator:
  ``key_by(key)`` (hash by key group: keyed state), ``rebalance()`` (spread evenly, by a hash of
  the record's source offset, so a replay routes it the same way), ``broadcast()`` (every subtask
  gets every record) or ``forward()`` (subtask i to subtask i; same parallelism);
- the **operator stage**: the operator after the channel (keyed and stateful after ``key_by``,
  stateless after the others) and its sinks, fused.
 Operators have stable ``uid``s: a snapshot is matched to operators by uid, not by position.
This module imports no engine: operators receive Spark DataFrames only when they run.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Mapping, Protocol, Sequence

from .core.keygroups import DEFAULT_MAX_PARALLELISM, check_parallelism
from .core.types import sink_operator
from .layout import check_name as _check_name
from .reserved import SINK_COLUMNS, SINK_SUBTASK, STATE_COLUMNS, check_columns  # noqa: F401 (SINK_SUBTASK: part of this API)
from .schema import as_dict, columns

_REL_PATH = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$")


def check_relative_path(value: str) -> str:
    """A warehouse-relative path: no absolute paths, no '..', nothing a shell or SQL would read."""
    if not isinstance(value, str) or not _REL_PATH.match(value) or ".." in value.split("/") or "//" in value:
        raise ValueError(f"path {value!r} must be relative to the warehouse, without '..'")
    return value.rstrip("/")


def same_table(a: str, b: str) -> bool:
    """Whether two warehouse-relative paths name one table (``gold/./out`` is ``gold/out``)."""
    return posixpath.normpath(a) == posixpath.normpath(b)


@dataclass(frozen=True)
class DeltaSource:
    """An append-only Delta table read incrementally by version; offsets are table versions.

    ``schema`` lists the columns the pipeline needs with their types, in the one schema notation of
    :mod:`checkpoint_lib.schema` (``"event_id string, amount_cents long"``, a StructType, or a
    mapping). Extra columns in the table are ignored; a missing or re-typed column stops the
    run before anything is written. ``validate(df)`` returns a Column with the reason a row is bad
    (null when it is good): bad rows go to the dead-letter table with that reason and their offset.
    """

    path: str
    schema: Mapping[str, str]
    validate: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        check_relative_path(self.path)
        object.__setattr__(self, "schema", as_dict(self.schema, f"source {self.path}"))


CHANGE_COLUMN = "change"
"""The column a :class:`ChangeFeedSource` adds to its records: ``"insert"``, ``"update"`` or ``"delete"``."""

CHANGES = ("insert", "update", "delete")
"""The values of :data:`CHANGE_COLUMN`."""


@dataclass(frozen=True)
class ChangeFeedSource:
    """A Delta table read through its change data feed: every row it inserted, updated or deleted,
    in commit order; offsets are table versions, as for :class:`DeltaSource`. It is what a table
    that is updated in place (a dimension table) is read as: the second input of an enrichment.

    The table must record its changes (``delta.enableChangeDataFeed = true``) from the first
    version the pipeline reads: a version written without it is refused with the way out.
    ``schema`` is declared as for :class:`DeltaSource` (the table may have more columns, which are
    ignored); a value that does not convert to its declared type goes to the dead letters with
    the reason, as does a row ``validate(df)`` refuses. The records carry the declared columns and
    :data:`CHANGE_COLUMN` (a string): ``"insert"``, ``"update"`` (the row after the update; the
    row before it is not read) or ``"delete"`` (the deleted row's values). So after construction
    ``schema`` is the records' columns, the declared ones then ``change``; :attr:`declared` is
    the declared ones alone. A declared column named ``change`` is refused.

    Within one commit a key changes once (a MERGE, an UPDATE, a DELETE), except when a commit
    deletes rows and inserts them again (an overwrite): its deletes come first. An operator orders
    a key's changes by their offset (``order_by = ("src_version", "src_file", "src_row")``).

    >>> ChangeFeedSource("dims/customers", "id string, tier string").schema
    {'id': 'string', 'tier': 'string', 'change': 'string'}
    """

    path: str
    schema: Mapping[str, str]
    validate: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        check_relative_path(self.path)
        declared = as_dict(self.schema, f"source {self.path}")
        if CHANGE_COLUMN in declared:
            raise ValueError(
                f"source {self.path}: column {CHANGE_COLUMN!r} is what a ChangeFeedSource adds to its records (the "
                f"kind of change: {', '.join(CHANGES)}); leave it out of the declared schema, or rename that column in "
                "the table"
            )
        object.__setattr__(self, "schema", {**declared, CHANGE_COLUMN: "string"})

    @property
    def declared(self) -> dict[str, str]:
        """The declared columns (the table's columns the records carry), without :data:`CHANGE_COLUMN`."""
        return {c: t for c, t in self.schema.items() if c != CHANGE_COLUMN}


@dataclass(frozen=True)
class FolderSource:
    """A landing folder of files (``json`` lines, ``csv`` or ``parquet``) that upstream systems drop
    files into. Files are registered in a manifest (a Delta table under the checkpoint root) the
    first time a source step lists the folder; the manifest version is the offset, so the folder
    is replayed exactly like a Delta table (see :mod:`checkpoint_lib.spark.landing`). Writers must
    make a file appear complete: write ``name.tmp`` (or ``_name``, ``.name``) and rename it.

    Every line yields one row: a line that does not parse, or a value of the wrong type, goes to the
    dead-letter table with the reason (then ``validate`` runs on the parsed rows, as for Delta).
    """

    path: str
    schema: Mapping[str, str]
    format: str = "json"
    options: Mapping[str, str] = field(default_factory=dict)
    validate: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        check_relative_path(self.path)
        object.__setattr__(self, "schema", as_dict(self.schema, f"source {self.path}"))
        if self.format not in ("json", "csv", "parquet"):
            raise ValueError(f"folder format must be json, csv or parquet, got {self.format!r}")


@dataclass(frozen=True)
class DeltaSink:
    """A two-phase-commit Delta sink of ``schema`` (:mod:`checkpoint_lib.schema` notation). An
    ``append`` sink adds the rows of every committed checkpoint; an ``upsert`` sink MERGEs them by
    ``keys`` (a later row of a key replaces an earlier one). An existing table must have the
    declared columns (it may have more, nullable ones: they read NULL in the pipeline's rows);
    ``merge_schema=True`` adds declared columns it lacks (nullable) before the first write, as
    Delta's ``mergeSchema`` does, instead of refusing."""

    path: str
    schema: tuple[tuple[str, str], ...]
    mode: str = "append"
    keys: tuple[str, ...] = ()
    merge_schema: bool = False

    def __post_init__(self) -> None:
        check_relative_path(self.path)
        if self.mode not in ("append", "upsert"):
            raise ValueError(f"sink mode must be 'append' or 'upsert', got {self.mode!r}")
        if self.mode == "upsert" and not self.keys:
            raise ValueError("an upsert sink needs keys, e.g. keys=('account',)")
        object.__setattr__(self, "schema", columns(self.schema, f"sink {self.path}"))

    @property
    def target(self) -> str:
        """What the sink writes, as the commands show it: its table's path in the warehouse."""
        return self.path
        object.__setattr__(self, "keys", tuple(self.keys))


@dataclass(frozen=True)
class PostgresSink:
    """A two-phase-commit sink into a PostgreSQL table ``table`` (``name`` or ``schema.name``) of
    ``schema`` (:mod:`checkpoint_lib.schema` notation), created if missing: each subtask's rows of
    a checkpoint are written in one transaction and ``PREPARE TRANSACTION``-ed at the barrier (rows
    of the checkpoint's earlier flushes wait in a staging table, invisible to readers), and
    ``COMMIT PREPARED`` once the checkpoint completes (the writer: ``spark/postgres_sink.py``). An
    ``append`` sink inserts them; an ``upsert`` sink inserts or updates by ``keys`` (a later row of
    a key replaces an earlier one), the table's primary key or a unique index on them.

    The server and the credentials are never in the pipeline: ``connection`` names them, as an
    Airflow connection id (the environment variable ``AIRFLOW_CONN_<ID>``, a ``postgresql://`` URI,
    as Airflow reads it). The server needs ``max_prepared_transactions`` of at least the subtasks of
    the pipeline's PostgreSQL sinks on it times (pending checkpoints + 1), whatever the flushes per
    checkpoint (each subtask: one prepared transaction per pending checkpoint, and one an older
    attempt may still prepare); the limit is the server's, shared with every other pipeline on it."""

    table: str
    schema: tuple[tuple[str, str], ...]
    mode: str = "append"
    keys: tuple[str, ...] = ()
    connection: str = "ckpt_postgres"

    def __post_init__(self) -> None:
        parts = self.table.split(".")
        if len(parts) > 2 or not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) for p in parts):
            raise ValueError(f"a PostgreSQL sink's table is 'name' or 'schema.name' (letters, digits and _), "
                             f"got {self.table!r}")
        if self.mode not in ("append", "upsert"):
            raise ValueError(f"sink mode must be 'append' or 'upsert', got {self.mode!r}")
        if self.mode == "upsert" and not self.keys:
            raise ValueError("an upsert sink needs keys, e.g. keys=('account',)")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.connection):
            raise ValueError(f"a connection id is a word (letters, digits and _), got {self.connection!r}")
        object.__setattr__(self, "schema", columns(self.schema, f"sink {self.table}"))
        object.__setattr__(self, "keys", tuple(self.keys))
        missing = [k for k in self.keys if k not in dict(self.schema)]
        if missing:
            raise ValueError(f"sink {self.table}: keys {missing} are not among its columns")

    @property
    def target(self) -> str:
        """What the sink writes, as the commands show it (never the connection's credentials)."""
        return f"postgresql:{self.connection}/{self.table}"


def sink_target(spec: Any) -> str:
    """What a sink declaration writes, as the commands show it: the one definition (a Delta
    table's path in the warehouse, a PostgreSQL table, a user's kind by its ``target`` or
    ``path``, else its type)."""
    return getattr(spec, "target", None) or getattr(spec, "path", None) or type(spec).__name__


@dataclass(frozen=True)
class Bootstrap:
    """Records read once, before anything else, when a pipeline starts from scratch (no completed
    checkpoint): e.g. opening balances. The table's latest version is read in the first source
    step, ``to_records(df)`` turns its rows into records of the pipeline's record schema (it gets
    the table's ``schema`` columns plus the offset columns and ``sender``, and must keep those),
    and they enter the channel before the first records of the source. Later appends to the table
    are not read: restoring any completed checkpoint restores what the bootstrap put into state."""

    path: str
    schema: Mapping[str, str]
    to_records: Callable[[Any], Any]

    def __post_init__(self) -> None:
        check_relative_path(self.path)
        object.__setattr__(self, "schema", as_dict(self.schema, f"bootstrap table {self.path}"))


FEEDBACK = "feedback"
"""The name under which an iterating keyed operator returns the records it sends to itself."""


DELETE = "_delete"
"""In the state a ``state_update = "replace"`` operator returns: a row with ``_delete`` true removes
the key's state (its other columns are ignored)."""

STATE_UPDATES = ("add", "replace")

TTL_COLUMN = "_ttl_written"
"""The hidden state column of an operator with a :class:`StateTtl`: the event time of the newest
record that wrote the key's state."""


@dataclass(frozen=True)
class StateTtl:
    """Keyed state that expires, as Flink's ``StateTtlConfig`` (update on create and write, never
    return expired), but in **event time**, so a replay after a crash expires exactly what the
    failure-free run expired.

    ``time_column`` is a timestamp column of the records. A key's state is *written* at the newest
    ``time_column`` of the records that wrote it. In a flush, the state of a key is *expired*
    when it was written more than ``ttl`` before the key's earliest record in that flush: the
    operator then sees no state for the key (as for a new key), additive state starts again from
    the returned values, and a replaced row holds what the operator returned.

    Cleanup: every flush deletes the rows written more than ``ttl + cleanup_lateness`` before the
    newest write of the operator (default lateness: ``ttl``), so idle keys do not grow the state
    forever. A record more than ``cleanup_lateness`` behind the newest one is *late*: it may find
    the old state of its key already cleaned up.

    Outliers: the newest write is a maximum, so one record with a timestamp far in the future would
    clean up every key. With ``max_ahead`` (a bound, e.g. a day), a source row whose
    ``time_column`` is more than ``max_ahead`` after the reference (the newest median event time
    of a source step so far, this step's included) is a dead letter, with the reason, before it
    reaches the operator. Choose it above a step's spread of event times after its median (a
    backfill step spans its whole range) and above the longest quiet period of the source. It
    needs ``time_column`` among the source's columns; off by default.
    """

    ttl: timedelta | float
    time_column: str
    cleanup_lateness: timedelta | float | None = None
    max_ahead: timedelta | float | None = None

    def __post_init__(self) -> None:
        as_delta = (lambda v: v if isinstance(v, timedelta) else timedelta(seconds=float(v)))
        object.__setattr__(self, "ttl", as_delta(self.ttl))
        lateness = self.ttl if self.cleanup_lateness is None else as_delta(self.cleanup_lateness)
        object.__setattr__(self, "cleanup_lateness", lateness)
        if self.max_ahead is not None:
            object.__setattr__(self, "max_ahead", as_delta(self.max_ahead))
        if self.ttl <= timedelta(0) or lateness < timedelta(0) or (self.max_ahead is not None
                                                                     and self.max_ahead <= timedelta(0)):
            raise ValueError(f"state TTL and max_ahead must be positive and its cleanup lateness not negative: {self}")
        if not isinstance(self.time_column, str) or not self.time_column:
            raise ValueError("StateTtl needs the records' time_column")

    @property
    def ttl_seconds(self) -> int:
        return int(self.ttl.total_seconds())

    @property
    def cleanup_seconds(self) -> int:
        """How long after a key's last write its row is cleaned up, past the newest write."""
        return int((self.ttl + self.cleanup_lateness).total_seconds())


def check_state_ttl(ttl: Any, uid: str, state: Sequence[tuple[str, str]]) -> StateTtl | None:
    """An operator's ``state_ttl`` (None: none) checked against its ``state`` columns, before any
    record schema is known: the one definition of these checks, for linear pipelines and graphs."""
    if ttl is None:
        return None
    if not isinstance(ttl, StateTtl):
        raise TypeError(f"operator {uid!r} state_ttl must be a StateTtl, got {ttl!r}")
    if not state:
        raise ValueError(f"operator {uid!r} has a state_ttl but no state_schema")
    if any(name == TTL_COLUMN for name, _ in state):
        raise ValueError(f"operator {uid!r} state_schema must not list {TTL_COLUMN!r}")
    return ttl


def stored_state_columns(state: Sequence[tuple[str, str]], ttl: StateTtl | None) -> tuple[tuple[str, str], ...]:
    """The columns of a keyed operator's state table besides the key and key group: its ``state``
    columns, and :data:`TTL_COLUMN` when its state expires (``ttl``): one definition for linear
    pipelines and graphs."""
    return tuple(state) + (((TTL_COLUMN, "timestamp"),) if ttl is not None else ())


def is_timestamp(kind: str | None) -> bool:
    """Whether a declared column type ``kind`` (None: no such column) is a timestamp: what an event
    time column (a state TTL's, a source's :class:`~checkpoint_lib.graph.model.AheadBound`) must be."""
    return kind is not None and kind.lower() in ("timestamp", "timestamp_ntz")


def check_ttl_time_column(ttl: StateTtl, uid: str, kind: str | None, where: str) -> None:
    """``kind`` (the type of ``ttl.time_column`` in ``where``; None: no such column) must be a timestamp."""
    if not is_timestamp(kind):
        raise ValueError(f"operator {uid!r} state_ttl time_column {ttl.time_column!r} must be a timestamp "
                         f"column of {where}, got {kind!r}")


class Operator(Protocol):
    """A stateless operator (after ``rebalance()``, ``broadcast()`` or ``forward()``): ``apply``
    gets the records of one flush (the record columns, the source offset ``src_version``,
    ``src_file``, ``src_row``, and :data:`SINK_SUBTASK`, the index of the subtask, read-only) and
    returns one DataFrame per sink. Like a Flink operator it runs as
    one instance per subtask: ``apply`` is called once per subtask with that subtask's records, and
    the rows it returns are staged by that subtask's transaction (nothing to carry for it)."""

    def apply(self, records: Any) -> Mapping[str, Any]: ...


PARTITIONINGS = ("hash", "rebalance", "broadcast", "forward")


class KeyedOperator(Protocol):
    """A keyed, stateful operator (after ``key_by(key)``).

    - ``state_schema``: its state columns besides the key (:mod:`checkpoint_lib.schema` notation);
    - ``state_update`` (optional, default ``"add"``): how the state it returns is applied.
      ``"replace"``: each row is the key's new state (a row with :data:`DELETE` true removes it);
      keys it returns no row for keep theirs. ``"add"``: each row's values are added to the key's
      (sums and counts; the fast path of additive state);
    - ``order_by``: the columns that order a key's records (usually the source offset);
    - ``state_ttl`` (optional): a :class:`StateTtl`: the key's state expires in event time;
    - ``apply(records, state, key)`` gets the records of one flush (the record columns, the source
      offset ``src_version``, ``src_file``, ``src_row``, and :data:`SINK_SUBTASK`) and the state
      before them (the key and the state columns; keys without state have no row), and returns
      ``(state, outputs)``: the state rows of the keys it changed (at most one per key: the key and
      the state columns) and one DataFrame per sink. A sink row is staged by the subtask that owns
      the key it carries; rows without the key column must keep the records' :data:`SINK_SUBTASK`
      (records sent back through a cycle keep it: it is their channel's sender).

    Key groups, channels, senders and transactions are the runner's: an operator never sees them.
    """

    state_schema: Any
    order_by: tuple[str, ...]

    def apply(self, records: Any, state: Any, key: str) -> tuple[Any, Mapping[str, Any]]: ...


@dataclass
class Pipeline:
    name: str
    source_spec: DeltaSource | FolderSource | ChangeFeedSource | None = None
    source_parallelism: int = 1
    key: str | None = None
    keyed_parallelism: int = 1
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    operator: KeyedOperator | None = None
    operator_uid: str | None = None
    sinks: dict[str, DeltaSink] = field(default_factory=dict)
    dlq_path: str | None = None
    feedback: bool = False
    """The keyed operator sends records to itself (a cycle, :meth:`iterate`): aligned and
    at-least-once modes must refuse it."""
    bootstrap_spec: Bootstrap | None = None
    validate_checkpoints: bool = False
    """Run the per-checkpoint quality suite (GX) on every completed checkpoint before its commit
    (the runner's ``validate_checkpoints`` overrides it)."""
    partitioning: str | None = None
    """How records go from the source stage to the operator: one of :data:`PARTITIONINGS`."""
    transforms: list[tuple[Callable[[Any], Any], dict[str, str]]] = field(default_factory=list)
    """``map()`` steps fused into the source stage, each with the schema of its output."""
    generator_fn: Callable[..., int] | None = None
    """What ``ckpt generate`` runs (:meth:`generator`)."""
    quality_spec: Any = None
    """The roles the quality suites read (:meth:`quality`), a ``QualitySpec``."""
    parallelism_origin: str | None = None
    """Where the parallelism comes from when it is not the declared one (:meth:`with_parallelism`'s
    ``origin``, e.g. the CLI's ``--parallelism 4``): what a rescale's message names."""

    def __post_init__(self) -> None:
        _check_name("pipeline name", self.name)

    def source(self, source: DeltaSource | FolderSource | ChangeFeedSource, parallelism: int = 1) -> "Pipeline":
        check_parallelism(parallelism, self.max_parallelism)
        check_columns(source.schema, f"pipeline {self.name!r}: source {source.path}",
                      fix="leave it out of the source's schema or rename it in the source table")
        self.source_spec, self.source_parallelism = source, parallelism
        return self

    @property
    def record_schema(self) -> dict[str, str]:
        """The columns records carry into the channel: the source's, or the last ``map()``'s."""
        if self.transforms:
            return dict(self.transforms[-1][1])
        return dict(self.source_spec.schema) if self.source_spec is not None else {}

    def map(self, fn: Callable[[Any], Any], schema: Mapping[str, str] | None = None) -> "Pipeline":
        """A row-wise DataFrame transformation (select, withColumn, filter, explode...) fused into
        the source stage, after validation. ``schema`` lists the columns (name -> type) it
        outputs when they differ from its input's. It must keep the offset columns (``src_*``)
        and ``sender`` it is given and must not aggregate or reorder rows across offsets: a
        record's offset is how recovery knows it was processed.

        >>> Pipeline("p").source(DeltaSource("in", {"a": "long"})).map(
        ...     lambda df: df.withColumn("b", df.a * 2), schema={"a": "long", "b": "long"})  # doctest: +ELLIPSIS
        Pipeline(...)
        """
        if self.source_spec is None:
            raise ValueError("map() needs a source() first")
        if self.partitioning is not None:
            raise ValueError("map() must come before the partitioner (key_by/rebalance/broadcast/forward)")
        if not callable(fn):
            raise TypeError(f"map() needs a function DataFrame -> DataFrame, got {fn!r}")
        out = as_dict(schema, "map() schema") if schema is not None else self.record_schema
        check_columns(out, f"pipeline {self.name!r}: map() output", fix="name the map()'s output column otherwise")
        self.transforms.append((fn, out))
        return self

    def _partition(self, how: str, parallelism: int) -> None:
        check_parallelism(parallelism, self.max_parallelism)
        if self.source_spec is None:
            raise ValueError(f"{how}() needs a source() first")
        if self.partitioning is not None:
            raise ValueError(f"the records are already partitioned ({self.partitioning}): one partitioner per pipeline")
        self.partitioning, self.keyed_parallelism = how, parallelism

    def key_by(self, key: str, parallelism: int = 1) -> "Pipeline":
        """Hash-partition by ``key`` (its key group) to a keyed, stateful operator."""
        check_columns([key], f"pipeline {self.name!r}: key_by()", fix="key by a record column of another name")
        if self.source_spec is not None and key not in self.record_schema:
            raise ValueError(f"key {key!r} is not a column of the records ({sorted(self.record_schema)})")
        self._partition("hash", parallelism)
        self.key = key
        return self

    def rebalance(self, parallelism: int = 1) -> "Pipeline":
        """Spread records evenly over ``parallelism`` subtasks of a stateless operator (by a hash
        of each record's source offset: deterministic, so a replay sends it to the same subtask)."""
        self._partition("rebalance", parallelism)
        return self

    def broadcast(self, parallelism: int = 1) -> "Pipeline":
        """Send every record to each of ``parallelism`` subtasks of a stateless operator."""
        self._partition("broadcast", parallelism)
        return self

    def forward(self) -> "Pipeline":
        """Source subtask i sends to operator subtask i (same parallelism, no shuffle of records
        between subtasks)."""
        self._partition("forward", self.source_parallelism)
        return self

    def process(self, operator: KeyedOperator | Operator, uid: str) -> "Pipeline":
        """The operator after the channel: a :class:`KeyedOperator` after ``key_by()``, a
        stateless :class:`Operator` after ``rebalance()``, ``broadcast()`` or ``forward()``."""
        if self.partitioning is None:
            raise ValueError("process() needs a partitioner first: key_by(), rebalance(), broadcast() or forward()")
        if self.key is None and getattr(operator, "state_schema", ()):
            raise ValueError(
                f"operator {uid!r} has keyed state ({operator.state_schema}): keyed state is partitioned "
                f"by key, so use key_by() instead of {self.partitioning}()"
            )
        if not callable(getattr(operator, "apply", None)):
            raise TypeError(f"operator {uid!r} needs an apply() method (see KeyedOperator and Operator)")
        if self.key is not None:
            state = columns(getattr(operator, "state_schema", None) or (), f"operator {uid!r} state_schema")
            check_columns([name for name, _ in state], f"operator {uid!r} state_schema", STATE_COLUMNS,
                          fix="name the state column otherwise")
            if any(name in (self.key, DELETE) for name, _ in state):
                raise ValueError(f"operator {uid!r} state_schema must not list the key {self.key!r} or {DELETE!r}")
            update = getattr(operator, "state_update", "add")
            if update not in STATE_UPDATES:
                raise ValueError(f"operator {uid!r} state_update must be one of {STATE_UPDATES}, got {update!r}")
            ttl = check_state_ttl(getattr(operator, "state_ttl", None), uid, state)
            if ttl is not None:
                check_ttl_time_column(ttl, uid, self.record_schema.get(ttl.time_column), "the records")
                if ttl.max_ahead is not None and ttl.time_column not in self.source_spec.schema:
                    raise ValueError(f"operator {uid!r} state_ttl max_ahead needs time_column {ttl.time_column!r} among "
                                     "the source's columns (bad rows become dead letters before any map())")
        self.operator, self.operator_uid = operator, _check_name("operator uid", uid)
        return self

    @property
    def state_columns(self) -> tuple[tuple[str, str], ...]:
        """The keyed operator's state columns (besides the key), normalized; () when stateless."""
        if self.key is None or self.operator is None:
            return ()
        return columns(self.operator.state_schema, f"operator {self.operator_uid!r} state_schema")

    @property
    def state_update(self) -> str:
        """``"add"`` or ``"replace"``: how the keyed operator's returned state is applied."""
        return getattr(self.operator, "state_update", "add")

    @property
    def state_ttl(self) -> StateTtl | None:
        """The keyed operator's :class:`StateTtl` (None: its state never expires)."""
        return getattr(self.operator, "state_ttl", None) if self.state_columns else None

    @property
    def stored_state_columns(self) -> tuple[tuple[str, str], ...]:
        """The columns of the state table besides the key and key group: the operator's, and
        :data:`TTL_COLUMN` when its state expires."""
        return stored_state_columns(self.state_columns, self.state_ttl)

    def iterate(self) -> "Pipeline":
        """Close a cycle: the keyed operator also returns, under :data:`FEEDBACK`, records (of the
        record schema, keeping the offset columns) that go back into its own input, routed by
        the key like the records from the source. Checkpoints of a cycle must be unaligned (or
        aligned with a timeout): the barrier on the feedback edge comes only after the snapshot,
        so in-flight feedback records are logged as channel state, as Chandy-Lamport does."""
        if self.operator is None or not self.keyed:
            raise ValueError("iterate() needs a keyed operator first: key_by(...).process(...)")
        self.feedback = True
        return self

    def bootstrap(self, bootstrap: Bootstrap) -> "Pipeline":
        """Records read once when the pipeline starts from scratch (see :class:`Bootstrap`)."""
        if self.source_spec is None:
            raise ValueError("bootstrap() needs a source() first")
        check_columns(bootstrap.schema, f"pipeline {self.name!r}: bootstrap table {bootstrap.path}",
                      fix="leave it out of the bootstrap's schema or rename it in that table")
        self.bootstrap_spec = bootstrap
        return self

    def validated_per_checkpoint(self, on: bool = True) -> "Pipeline":
        """Check every completed checkpoint with the per-checkpoint GX suite before it commits
        (conservation over state + channel state, n >= m per channel, acks complete). A failure
        marks the checkpoint discarded, commits nothing of it and stops the run with the summary;
        the next start recovers from the last checkpoint that passed."""
        self.validate_checkpoints = on
        return self

    def generator(self, fn: Callable[..., int]) -> "Pipeline":
        """How ``ckpt generate`` appends sample input: ``fn(spark, warehouse, rows, *, bad_fraction,
        seed, **options)`` writes ``rows`` new source rows (about ``bad_fraction`` of them bad) and
        returns the source table's new version; ``options`` are the ``--option KEY=VALUE`` of the
        command line (values parsed as Python literals when they are ones, e.g. ``accounts=25``)."""
        if not callable(fn):
            raise TypeError(f"generator() needs a function, got {fn!r}")
        self.generator_fn = fn
        return self

    def quality(self, spec: Any) -> "Pipeline":
        """The roles of this pipeline's tables and columns for the quality suites
        (:class:`checkpoint_lib.quality.spec.QualitySpec`): ``ckpt validate``, the recover DAG's
        consistency checks and the per-checkpoint suite run on it."""
        if getattr(spec, "pipeline", None) != self.name:
            raise ValueError(f"quality(): the spec is for pipeline {getattr(spec, 'pipeline', None)!r}, not {self.name!r}")
        self.quality_spec = spec
        return self

    def with_parallelism(self, source: int | None = None, operator: int | None = None,
                         origin: str = "with_parallelism()") -> "Pipeline":
        """A copy with other parallelism (None keeps the declared one). Restoring a checkpoint
        taken at another parallelism rescales: keyed state is split by key group (up to
        ``max_parallelism`` subtasks). ``forward()`` keeps both sides equal. The CLI's
        ``--parallelism`` / ``--source-parallelism`` use it; ``origin`` is what a rescale's
        message names as where the parallelism came from."""
        import dataclasses

        source = self.source_parallelism if source is None else source
        operator = self.keyed_parallelism if operator is None else operator
        if self.partitioning == "forward":
            if source != self.source_parallelism and operator == self.keyed_parallelism:
                operator = source
            elif operator != self.keyed_parallelism and source == self.source_parallelism:
                source = operator
        for n in (source, operator):
            check_parallelism(n, self.max_parallelism)
        copy = dataclasses.replace(self, sinks=dict(self.sinks), transforms=list(self.transforms))
        copy.source_parallelism, copy.keyed_parallelism = source, operator
        if (source, operator) != (self.source_parallelism, self.keyed_parallelism):
            copy.parallelism_origin = origin
        return copy

    @property
    def keyed(self) -> bool:
        """True when the operator is keyed (hash partitioning) and has state."""
        return self.key is not None

    def sink(self, name: str, sink: "DeltaSink | PostgresSink") -> "Pipeline":
        _check_name("sink name", name)
        check_columns([c for c, _ in sink.schema], f"pipeline {self.name!r}: sink {name!r} ({sink_target(sink)})",
                      SINK_COLUMNS, fix="name the sink's column otherwise")
        if name in self.sinks:
            raise ValueError(f"sink {name!r} is declared twice")
        path = getattr(sink, "path", None)
        for other, declared in self.sinks.items():
            theirs = getattr(declared, "path", None)
            if (same_table(theirs, path) if path is not None and theirs is not None
                    else sink_target(declared) == sink_target(sink)):
                raise ValueError(f"sinks {other!r} and {name!r} both write {sink_target(declared)}: a table is the target "
                                 "of one sink (each sink rolls its table back on its own)")
        if self.dlq_path is not None and path is not None and same_table(self.dlq_path, path):
            raise ValueError(f"the dead letters and sink {name!r} both write {path}")
        self.sinks[name] = sink
        return self

    def dead_letters(self, path: str) -> "Pipeline":
        path = check_relative_path(path)
        for name, sink in self.sinks.items():
            if getattr(sink, "path", None) is not None and same_table(sink.path, path):
                raise ValueError(f"the dead letters and sink {name!r} both write {sink.path}")
        self.dlq_path = path
        return self

    def validate(self) -> "Pipeline":
        """Check the declaration is complete; returns self."""
        missing = [
            what
            for what, value in (
                ("source()", self.source_spec), ("key_by() or another partitioner", self.partitioning),
                ("process()", self.operator),
                ("dead_letters()", self.dlq_path),
            )
            if value is None
        ]
        if not self.sinks:
            missing.append("sink()")
        if missing:
            raise ValueError(f"pipeline {self.name!r} is incomplete: missing {', '.join(missing)}")
        if self.partitioning == "forward" and self.keyed_parallelism != self.source_parallelism:
            raise ValueError(
                f"forward() needs the same parallelism on both sides: the source has "
                f"{self.source_parallelism}, the operator {self.keyed_parallelism}"
            )
        if self.key is not None and self.key not in self.record_schema:
            raise ValueError(f"key {self.key!r} is not a column of the records ({sorted(self.record_schema)})")
        # a declaration built without the fluent methods is checked here
        check_columns(self.record_schema, f"pipeline {self.name!r}: records")
        for name, sink in self.sinks.items():
            check_columns([c for c, _ in sink.schema], f"pipeline {self.name!r}: sink {name!r} ({sink_target(sink)})",
                          SINK_COLUMNS)
        for name, sink in self.sinks.items():
            if getattr(sink, "path", None) is not None and same_table(sink.path, self.source_spec.path):
                raise ValueError(f"sink {name!r} writes {sink.path}, the pipeline's own source: a pipeline that reads its "
                                 "output is a cycle; use iterate() for a feedback edge")
        return self

    def operator_ids(self) -> dict[str, int]:
        """Stable operator ids with their parallelism: what a snapshot must match."""
        ids = {"source": self.source_parallelism, self.operator_uid or "keyed": self.keyed_parallelism}
        ids.update({sink_operator(name): self.keyed_parallelism for name in self.sinks})
        return ids

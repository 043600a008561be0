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

Paths are relative to the warehouse root given at run time. The source stage and the keyed stage
are joined by a persisted Delta channel log (hash-partitioned by key, all-to-all), so they can run
as separate processes on separate cadences; the keyed operator and its sinks are fused into one
stage. Operators have stable ``uid``s: a snapshot is matched to operators by uid, not by position.
This module imports no engine: operators receive Spark DataFrames only when they run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from .core.keygroups import DEFAULT_MAX_PARALLELISM, check_parallelism

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_REL_PATH = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$")


def _check_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(f"{kind} {value!r} must match {_NAME.pattern} (lower-case letters, digits, _)")
    return value


def check_relative_path(value: str) -> str:
    """A warehouse-relative path: no absolute paths, no '..', nothing a shell or SQL would read."""
    if not isinstance(value, str) or not _REL_PATH.match(value) or ".." in value.split("/") or "//" in value:
        raise ValueError(f"path {value!r} must be relative to the warehouse, without '..'")
    return value.rstrip("/")


@dataclass(frozen=True)
class DeltaSource:
    """An append-only Delta table read incrementally by version; offsets are table versions.

    ``schema`` maps each column the pipeline needs to its Delta type name ("string", "long",
    "timestamp"...). Extra columns in the table are ignored; a missing or re-typed column stops the
    run before anything is written. ``validate(df)`` returns a Column with the reason a row is bad
    (null when it is good): bad rows go to the dead-letter table with that reason and their offset.
    """

    path: str
    schema: Mapping[str, str]
    validate: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        check_relative_path(self.path)
        if not self.schema:
            raise ValueError("a source needs a schema (column -> Delta type)")


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
        if not self.schema:
            raise ValueError("a source needs a schema (column -> type)")
        if self.format not in ("json", "csv", "parquet"):
            raise ValueError(f"folder format must be json, csv or parquet, got {self.format!r}")


@dataclass(frozen=True)
class DeltaSink:
    """A two-phase-commit Delta sink. ``schema`` is a list of (column, Spark SQL type) pairs."""

    path: str
    schema: tuple[tuple[str, str], ...]
    mode: str = "append"
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_relative_path(self.path)
        if self.mode not in ("append", "upsert"):
            raise ValueError(f"sink mode must be 'append' or 'upsert', got {self.mode!r}")
        if self.mode == "upsert" and not self.keys:
            raise ValueError("an upsert sink needs keys, e.g. keys=('account',)")
        object.__setattr__(self, "schema", tuple(tuple(c) for c in self.schema))
        object.__setattr__(self, "keys", tuple(self.keys))


class KeyedOperator(Protocol):
    """A keyed, stateful operator. ``state_schema`` lists its state columns (besides the key);
    ``apply`` gets the records of one flush (ordered by ``order_by``) and the state before them, and
    returns the state deltas and one DataFrame per sink (with a ``sink_subtask`` column)."""

    state_schema: tuple[tuple[str, str], ...]
    order_by: tuple[str, ...]

    def apply(self, records: Any, state: Any, key: str) -> tuple[Any, Mapping[str, Any]]: ...


@dataclass
class Pipeline:
    name: str
    source_spec: DeltaSource | FolderSource | None = None
    source_parallelism: int = 1
    key: str | None = None
    keyed_parallelism: int = 1
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    operator: KeyedOperator | None = None
    operator_uid: str | None = None
    sinks: dict[str, DeltaSink] = field(default_factory=dict)
    dlq_path: str | None = None
    feedback: bool = False
    """The keyed operator sends records to itself (a cycle): aligned mode must refuse it."""

    def __post_init__(self) -> None:
        _check_name("pipeline name", self.name)

    def source(self, source: DeltaSource | FolderSource, parallelism: int = 1) -> "Pipeline":
        check_parallelism(parallelism, self.max_parallelism)
        self.source_spec, self.source_parallelism = source, parallelism
        return self

    def key_by(self, key: str, parallelism: int = 1) -> "Pipeline":
        check_parallelism(parallelism, self.max_parallelism)
        if self.source_spec is None:
            raise ValueError("key_by() needs a source() first")
        if key not in self.source_spec.schema:
            raise ValueError(f"key {key!r} is not a column of the source ({sorted(self.source_spec.schema)})")
        self.key, self.keyed_parallelism = key, parallelism
        return self

    def process(self, operator: KeyedOperator, uid: str) -> "Pipeline":
        if self.key is None:
            raise ValueError("process() needs key_by() first: keyed state is partitioned by key")
        self.operator, self.operator_uid = operator, _check_name("operator uid", uid)
        return self

    def sink(self, name: str, sink: DeltaSink) -> "Pipeline":
        _check_name("sink name", name)
        if name in self.sinks:
            raise ValueError(f"sink {name!r} is declared twice")
        self.sinks[name] = sink
        return self

    def dead_letters(self, path: str) -> "Pipeline":
        self.dlq_path = check_relative_path(path)
        return self

    def validate(self) -> "Pipeline":
        """Check the declaration is complete; returns self."""
        missing = [
            what
            for what, value in (
                ("source()", self.source_spec), ("key_by()", self.key), ("process()", self.operator),
                ("dead_letters()", self.dlq_path),
            )
            if value is None
        ]
        if not self.sinks:
            missing.append("sink()")
        if missing:
            raise ValueError(f"pipeline {self.name!r} is incomplete: missing {', '.join(missing)}")
        return self

    def operator_ids(self) -> dict[str, int]:
        """Stable operator ids with their parallelism: what a snapshot must match."""
        ids = {"source": self.source_parallelism, self.operator_uid or "keyed": self.keyed_parallelism}
        ids.update({f"sink_{name}": self.keyed_parallelism for name in self.sinks})
        return ids

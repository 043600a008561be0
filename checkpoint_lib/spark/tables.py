"""Small Delta helpers shared by the Spark adapters."""

from __future__ import annotations

import logging
import os
import random
import time
from typing import Callable, TypeVar

from pyspark.sql import Column, SparkSession
from pyspark.sql import types as T

from ..delta.log import is_delta_table

log = logging.getLogger(__name__)
R = TypeVar("R")
CONFLICT_ATTEMPTS = 6


class ConcurrentWriterError(RuntimeError):
    """Another writer kept changing a table we write (OPTIMIZE, a foreign append or MERGE) and every
    attempt of ours conflicted with it. Nothing of the last attempt was committed."""


def conflict_types() -> tuple[type, ...]:
    """Delta's optimistic-concurrency conflicts, as PySpark raises them. Delta throws them before
    the commit file is written: the losing transaction committed nothing, so trying it again on the
    new snapshot is safe."""
    from delta.exceptions import (
        ConcurrentAppendException, ConcurrentDeleteDeleteException, ConcurrentDeleteReadException,
        ConcurrentTransactionException, ConcurrentWriteException, DeltaConcurrentModificationException,
        MetadataChangedException, ProtocolChangedException,
    )

    return (ConcurrentAppendException, ConcurrentDeleteDeleteException, ConcurrentDeleteReadException,
            ConcurrentTransactionException, ConcurrentWriteException, DeltaConcurrentModificationException,
            MetadataChangedException, ProtocolChangedException)


def retry_conflicts(write: Callable[[], R], what: str, *, before_retry: Callable[[], None] | None = None,
                    attempts: int | None = None) -> R:
    """Run ``write`` (one Delta transaction, planned afresh on every call), again after a Delta
    conflict, with jittered backoff (0.2 s doubling). ``before_retry`` runs before every retry (the
    epoch fence: a zombie must not win by retrying). After ``attempts`` (default
    :data:`CONFLICT_ATTEMPTS`) conflicts raise :class:`ConcurrentWriterError`, which names
    ``what`` and the concurrent writer's conflict."""
    conflicts = conflict_types()
    attempts = CONFLICT_ATTEMPTS if attempts is None else attempts
    for attempt in range(1, attempts + 1):
        if attempt > 1 and before_retry is not None:
            before_retry()
        try:
            return write()
        except conflicts as exc:
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            if attempt == attempts:
                raise ConcurrentWriterError(
                    f"{what}: {attempts} attempts conflicted with a concurrent writer of the table "
                    f"({type(exc).__name__}: {first}). Nothing of the last attempt was committed; running "
                    "again retries it (our writes are idempotent or restored on recovery). Schedule OPTIMIZE "
                    "and other writers of this table outside the pipeline's commits."
                ) from exc
            message = f"{what}: conflict with a concurrent writer ({type(exc).__name__}), attempt {attempt} of {attempts}"
            log.warning(message)
            time.sleep(0.2 * 2 ** (attempt - 1) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def create_if_missing(
    spark: SparkSession, path: str, schema: T.StructType, partition_by: list[str] | None = None,
    properties: dict[str, str] | None = None,
) -> None:
    """Create an empty Delta table at ``path`` unless one exists, with the table ``properties``
    (``delta.*`` settings) given. Idempotent and race-safe: two creators racing both end with the
    table (the loser's commit of version 0 fails). An existing table keeps its own properties."""
    if is_delta_table(path):
        return
    os.makedirs(os.path.dirname(path.rstrip("/")) or ".", exist_ok=True)
    from delta.tables import DeltaTable

    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
    if partition_by:
        builder = builder.partitionedBy(*partition_by)
    for key, value in (properties or {}).items():
        builder = builder.property(key, value)
    try:
        builder.execute()
    except Exception:
        if not is_delta_table(path):
            raise


def delete_where(spark: SparkSession, path: str, condition: Column) -> None:
    """DELETE (idempotent: deleting what is gone deletes nothing). No-op on a missing table."""
    if not is_delta_table(path):
        return
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, path).delete(condition)


def version(spark: SparkSession, path: str) -> int:
    from ..delta.log import latest_version

    v = latest_version(path)
    if v is None:
        raise FileNotFoundError(f"no Delta table at {path}")
    return v

"""Two-phase-commit sinks into Delta tables (the I/O half of ``core.twophase``). Each record is
written once.

- **write**: at a flush Spark writes the open transactions' rows as Parquet files, once
  (:mod:`checkpoint_lib.delta.pending`): an ``append`` sink writes them inside the target table's
  folder (``<target>/ckpt/``), where no commit refers to them yet, so no reader sees them; an
  ``upsert`` sink writes them beside the checkpoint data (``_checkpoints/<p>/transactions/<sink>``).
  Each transaction's control folder there lists what it wrote (a manifest per write).
- **pre-commit** (at the barrier): nothing left to write, the files are complete; the core moves
  the transaction to pending and the snapshot records it.
- **commit** (a global committer, as Flink's Sink V2 and Iceberg's committer): when checkpoint
  ``c`` completes, every subtask's transactions up to ``c`` go into the target in ONE Delta commit
  stamped with Delta's idempotent-write transaction ``(txnAppId = <pipeline>/<sink>/stamp,
  txnVersion = writer epoch << 32 | c)``: an ``append`` sink adds the very files it wrote (a
  delta-rs commit of add actions, with their statistics: no data is read or copied), an ``upsert``
  sink MERGEs the changed keys' latest rows. The stamp lands atomically with the data, checkpoint
  ids grow across epochs and commits are cumulative, so "committed" is exactly "the stamp's
  checkpoint reached its checkpoint": a repeated commit is a no-op, nothing is committed twice.
- **abort**: the transaction's files are deleted (never a file the table refers to).

The fence is inside the commit. An append commit is a compare-and-swap placed exactly on the
snapshot it checked (delta-rs, no retries): a stamp of a newer epoch on that snapshot refuses it
(:class:`~checkpoint_lib.core.errors.FencedError`), and a fence landing after the check takes the
version, so the commit fails, reads again and is refused. A MERGE is stamped through Spark, which
skips a write whose version is not above the table's, and one racing the fence conflicts on the
application id and is skipped on retry. A recovery (epoch F) first raises every sink's stamp to ``F
<< 32 | its checkpoint`` (:meth:`fence`); the zombie reads the stamp after its write and stops.
Tables stamped before this scheme (one application id per epoch, ``.../e<epoch>``) are still read.

Every kind of sink is behind :class:`SinkWriter`, what the runtime (the keyed stage, completion,
recovery, control, the Airflow hook) calls on a sink; :func:`pipeline_sinks` builds each from its
declaration by the kind it was registered as (:func:`register_sink`): a new kind of sink is its
declaration, its writer and one ``register_sink`` call, in one file.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Callable, Iterable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ..core.twophase import Transaction
from ..delta.log import files_added_since_epoch, is_delta_table
from ..delta.pending import PendingFiles, add_actions
from ..files import files_at
from ..reserved import FLUSH, HANDLE_COLUMN, SINK_SUBTASK, TXN_SEQ, temporary
from ..killpoints import KillPoints
from ..layout import PENDING_FOLDER, app_prefix, pipeline_of, sink_transactions, stamp_prefix  # noqa: F401 - re-exported
from ..pipeline import DeltaSink, Pipeline, check_relative_path, sink_target
from . import tables
from .sink_kinds import (  # noqa: F401 - re-exported: a sink kind's names, where users import them
    RollbackUnavailableError,
    SinkConfigurationError,
    SinkSite,
    SinkWriter,
    register_sink,
    sink_writer,
)

_ORDER_COLUMNS = [T.StructField(TXN_SEQ, T.LongType(), False), T.StructField(FLUSH, T.LongType(), False)]
"""Written with an upsert sink's rows: the latest row of a key wins at the commit."""
_COMMIT_ATTEMPTS = 20


def declared_sinks(pipeline: Any) -> dict[str, Any]:
    """Sink name -> its declaration, of a linear pipeline or of a dataflow graph (its sinks at every vertex)."""
    if isinstance(pipeline, Pipeline):
        return dict(pipeline.sinks)
    return {s.name: s.spec for s in pipeline.sinks}


def pipeline_sinks(
    spark: SparkSession | None, pipeline: Any, warehouse: str, root: str,
    check_epoch: Callable[[int], None] | None = None, kill_points: KillPoints | None = None,
    pending_checkpoints: int = 1,
) -> dict[str, SinkWriter]:
    """The sinks of ``pipeline`` (a linear pipeline or a dataflow graph; warehouse ``warehouse``,
    checkpoint root ``root``; up to ``pending_checkpoints`` checkpoints pending at once): the one
    construction, for both runners and for :class:`~checkpoint_lib.control.PipelineControl`. With
    ``spark=None`` only the control-plane reads work (the commit stamps, the rollback version)."""
    declared = declared_sinks(pipeline)
    every = tuple((name, s, _parallelism(pipeline, name)) for name, s in declared.items())
    return {
        name: sink_writer(s, SinkSite(spark, name, _location(warehouse, s), str(sink_transactions(root, name)),
                                      app_prefix(pipeline.name), check_epoch, _parallelism(pipeline, name),
                                      kill_points, pending_checkpoints, every))
        for name, s in declared.items()
    }


def _parallelism(pipeline: Any, sink: str) -> int:
    """The subtasks of sink ``sink``: its operator's (a linear pipeline's keyed operator, a graph's vertex)."""
    if isinstance(pipeline, Pipeline):
        return pipeline.keyed_parallelism
    return next(pipeline.vertex(s.vertex).parallelism for s in pipeline.sinks if s.name == sink)


def _location(warehouse: str, declaration: Any) -> str:
    """A sink's table in the warehouse (a Delta sink's, or a user's kind with a ``path``); a sink
    outside it (PostgreSQL) by what it writes."""
    path = getattr(declaration, "path", None)
    return f"{warehouse}/{check_relative_path(path)}" if path is not None else sink_target(declaration)


def _delta_sink(s: DeltaSink, site: SinkSite) -> "DeltaTwoPhaseSink":
    return DeltaTwoPhaseSink(
        site.spark, site.name, site.location, site.transactions,
        tables.struct_type(s.schema) if site.spark is not None else None, app_prefix=site.app_prefix,
        mode=s.mode, keys=s.keys, check_epoch=site.check_epoch, merge_schema=s.merge_schema,
    )


TXN_RETENTION = "delta.setTransactionRetentionDuration"
SINK_TABLE_PROPERTIES = {"delta.logRetentionDuration": "interval 365 days"}
"""Set on the sink tables the pipeline creates: a rollback to a savepoint walks the target's log
back to the savepoint's commit and RESTOREs that version, so the log is kept a year (Delta's
default is 30 days). A table the user created keeps its own setting."""


class SinkTableRewoundError(SinkConfigurationError):
    """Someone else RESTOREd a sink's table to a version holding less than its stamp says is
    committed: writing on would lose the rows in between for good."""


class DeltaTwoPhaseSink:
    """One logical sink (e.g. ``ledger``) of a pipeline; every subtask of it shares the tables."""

    def __init__(
        self,
        spark: SparkSession,
        name: str,
        target: str,
        transactions: str,
        schema: T.StructType,
        *,
        app_prefix: str,
        mode: str = "append",
        keys: Iterable[str] = (),
        check_epoch: Callable[[int], None] | None = None,
        merge_schema: bool = False,
    ):
        if mode not in ("append", "upsert"):
            raise ValueError(f"sink mode must be 'append' or 'upsert', got {mode!r}")
        self.keys = list(keys)
        if mode == "upsert" and not self.keys:
            raise ValueError("an upsert sink needs keys")
        self.spark = spark
        self.name = name
        self.target = target
        self.transactions = transactions
        self.schema = schema
        if mode == "append":  # the files go into the table's folder; the bookkeeping beside the checkpoints
            self.pending = PendingFiles(f"{transactions}/txns", f"{target}/{PENDING_FOLDER}", table_root=target)
        else:
            self.pending = PendingFiles(f"{transactions}/txns", f"{transactions}/files")
        self.mode = mode
        self.app_prefix = app_prefix
        self.check_epoch = check_epoch
        self.merge_schema = merge_schema

    def create(self) -> None:
        """Create the target (with :data:`SINK_TABLE_PROPERTIES`) if missing, and refuse a target
        configured against what the commit protocol needs (:meth:`check_configuration`)."""
        tables.create_if_missing(self.spark, self.target, self.schema, properties=SINK_TABLE_PROPERTIES)
        self.check_configuration()

    def check_configuration(self) -> None:
        """What we own on a sink table is its commit stamps (Delta application transactions): they
        say what is committed, and they are the fence. A table with
        ``delta.setTransactionRetentionDuration`` set lets Delta drop them, after which a committed
        checkpoint reads as uncommitted and is committed again: refused, clearly, before any write."""
        from deltalake import DeltaTable

        if not is_delta_table(self.target):
            return
        dt = DeltaTable(self.target)
        configuration = dt.metadata().configuration
        if self.mode == "append":
            self._check_files_can_be_added(dt)
        if configuration.get(TXN_RETENTION):
            raise SinkConfigurationError(
                f"sink {self.name}: {self.target} sets {TXN_RETENTION}={configuration[TXN_RETENTION]!r}. Delta "
                "would then expire the commit stamps exactly-once depends on (what is committed, and the fence "
                f"against older attempts), and a committed checkpoint would be committed again. Unset it: "
                f"ALTER TABLE delta.`{self.target}` UNSET TBLPROPERTIES ('{TXN_RETENTION}')"
            )
        self._check_columns(dt)

    def _check_columns(self, dt) -> None:
        """The target's columns against the declared ones, by name and type, before anything is
        written: an append sink's commit of bare add actions skips Delta's schema check, so a
        declared column the table lacks or types differently would be lost or misread in every
        committed row. Refused with both schemas named. A nullable column the table has beyond the
        declared ones (another writer's, or added by ALTER TABLE) reads NULL in the pipeline's rows,
        as in a Spark append that lacks it: accepted; a NOT NULL one is refused. Declared columns the
        table lacks are added to it (nullable, one ALTER TABLE) when the sink says
        ``merge_schema=True``; nullability may differ (a NOT NULL declared column is checked as rows
        are written)."""
        if self.schema is None:
            return
        fields = json.loads(dt.schema().to_json())["fields"]
        have = {f["name"]: f["type"] for f in fields}
        want = {f.name: f.dataType.jsonValue() for f in self.schema.fields}
        retyped = [n for n in want if n in have and have[n] != want[n]]
        lacking = [n for n in want if n not in have]
        required = [f["name"] for f in fields if f["name"] not in want and not f.get("nullable", True)]
        if not retyped and not required and not lacking:
            return
        if not retyped and not required and self.merge_schema:
            self._add_columns(lacking)
            return

        def show(columns: dict) -> str:
            return ", ".join(f"{n} {t if isinstance(t, str) else t.get('type', t)}" for n, t in columns.items())

        problems = ([f"it lacks {lacking}"] if lacking else []) + (
            [f"it types {retyped} otherwise"] if retyped else []) + (
            [f"its NOT NULL columns {required} are not written by the sink"] if required else [])
        hint = (" To add the declared columns to the table (nullable), declare the sink with merge_schema=True."
                if lacking and not retyped and not required else "")
        raise SinkConfigurationError(
            f"sink {self.name}: {self.target} exists with columns ({show(have)}) but the sink declares "
            f"({show(want)}): {'; '.join(problems)}. Nothing was written. Declare the table's columns in the sink, "
            f"or write to a new table.{hint}"
        )

    def _add_columns(self, names: list[str]) -> None:
        """Add the declared columns ``names`` to the target, nullable, in one ALTER TABLE; a racing
        attempt that added them first is fine (idempotent)."""
        from deltalake import DeltaTable

        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in self.schema.fields if f.name in names)
        try:
            self.spark.sql(f"ALTER TABLE delta.`{self.target}` ADD COLUMNS ({columns})").collect()
        except Exception:
            have = {f["name"] for f in json.loads(DeltaTable(self.target).schema().to_json())["fields"]}
            if not set(names) <= have:
                raise

    @staticmethod
    def _file_commit_problems(dt) -> list[str]:
        """Why a commit of add actions by delta-rs cannot write table ``dt`` (empty: it can):
        :func:`~checkpoint_lib.spark.tables.files_commit_problem` (a partitioned table, column
        mapping, a writer feature such a commit cannot honour: CHECK constraints, generated
        columns, ...)."""
        problem = tables.files_commit_problem(dt)
        return [] if problem is None else [problem]

    def _check_files_can_be_added(self, dt) -> None:
        """An append sink's commit adds the files it wrote with delta-rs (:meth:`_file_commit_problems`)."""
        problems = self._file_commit_problems(dt)
        if problems:
            raise SinkConfigurationError(
                f"sink {self.name}: {self.target} cannot take an append sink's files: {'; '.join(problems)}. "
                "Write to a plain Delta table (no partitioning, deletion vectors, column mapping or constraints)."
            )

    # writing ---------------------------------------------------------------------------------

    def stage(self, rows: DataFrame, handles: dict[int, Transaction], flush: int) -> None:
        """Write ``rows`` (the target's columns plus ``sink_subtask``) into each subtask's open
        transaction ``handles[subtask]``: one Spark job writes every transaction's files, once."""
        if not handles:
            return
        # the sink's columns only: whatever else the operator's rows carry never meets ours
        ours = [c for c in self.schema.fieldNames() if c in rows.columns]
        # Each row's transaction (a lookup, tables.looked_up); a row of a subtask without an open
        # transaction here fails the write, never dropped.
        df, txn = tables.looked_up(rows.select(SINK_SUBTASK, *ours), F.col(SINK_SUBTASK),
                                   {s: (t.handle, t.seq) for s, t in handles.items()}, "int", T.StructType(
                                       [T.StructField(HANDLE_COLUMN, T.StringType()), T.StructField(TXN_SEQ, T.LongType())]))
        txn = F.when(txn.isNotNull(), txn).otherwise(F.raise_error(F.concat(
            F.lit(f"sink {self.name}: a row of subtask "), F.col(SINK_SUBTASK).cast("string"),
            F.lit(f", which has no open transaction in this flush (subtasks {sorted(handles)})"))))
        found = temporary("txn")
        staged = df.withColumn(found, txn).select(
            SINK_SUBTASK, *ours, F.col(found)[HANDLE_COLUMN].alias(HANDLE_COLUMN), F.col(found)[TXN_SEQ].alias(TXN_SEQ))
        columns = self._target_columns(staged)
        if self.mode == "upsert":
            columns += [F.col(TXN_SEQ), F.lit(flush).cast("long").alias(FLUSH)]
        write_dir = self.pending.begin_write(handles.values())
        staged.select(HANDLE_COLUMN, *columns).write.partitionBy(HANDLE_COLUMN).parquet(write_dir)
        self.pending.seal_write(write_dir, handles.values())

    def _target_columns(self, rows: DataFrame) -> list:
        """The target's columns of ``rows``, as the table stores them: a column the target declares NOT
        NULL fails the job on a null (what Delta's own write checks), a narrower number is widened,
        and a missing column or another type is refused before anything is written."""
        have = {f.name: f.dataType for f in rows.schema.fields}
        widen = {(T.IntegerType(), T.LongType()), (T.ShortType(), T.LongType()), (T.ByteType(), T.LongType()),
                 (T.ShortType(), T.IntegerType()), (T.ByteType(), T.IntegerType()), (T.FloatType(), T.DoubleType())}
        problems, columns = [], []
        for f in self.schema.fields:
            if f.name not in have:
                problems.append(f"column {f.name!r} is missing")
                continue
            col = F.col(f.name)
            if have[f.name] != f.dataType:
                if (have[f.name], f.dataType) not in widen:
                    problems.append(f"column {f.name!r} is {have[f.name].simpleString()}, the table's is "
                                    f"{f.dataType.simpleString()}")
                    continue
                col = col.cast(f.dataType)
            if not f.nullable:
                col = F.when(col.isNull(), F.raise_error(F.lit(
                    f"sink {self.name}: NOT NULL column {f.name} of {self.target} got a null"))).otherwise(col)
            columns.append(col.alias(f.name))
        if problems:
            raise ValueError(f"sink {self.name}: the operator's rows do not fit {self.target}: {'; '.join(problems)}")
        return columns

    # committing ----------------------------------------------------------------------------

    @property
    def app_id(self) -> str:
        """Delta's idempotent-write application id of this sink's commits (every epoch's)."""
        return f"{self.app_prefix}/{self.name}/stamp"

    def legacy_app_id(self, epoch: int) -> str:
        """The application id of one epoch's commits before the fence was part of the stamp."""
        return f"{self.app_prefix}/{self.name}/e{epoch}"

    def stamp(self) -> tuple[int, int]:
        """``(epoch, checkpoint)`` of the target's latest stamp (``(-1, -1)``: none)."""
        return tables.split_version(tables.stamp_of(self.target, self.app_id))

    def _committed(self, epochs: Iterable[int]) -> dict[int, int]:
        """Per epoch of a transaction, the highest checkpoint of it the target holds (-1: none), from
        one read of the table: the stamp, or for a table stamped by the older scheme (one
        application id per epoch) that epoch's stamp."""
        from deltalake import DeltaTable

        epochs = set(epochs)
        if not is_delta_table(self.target):
            return {e: -1 for e in epochs}
        dt = DeltaTable(self.target)
        committed = tables.split_version(dt.transaction_version(self.app_id))[1]
        out = {}
        for e in epochs:
            legacy = dt.transaction_version(self.legacy_app_id(e))
            out[e] = max(committed, -1 if legacy is None else int(legacy))
        return out

    def committed_checkpoint(self, epoch: int | None = None) -> int:
        """The highest checkpoint whose transactions (of ``epoch``, for a table stamped by the older
        scheme) the target holds (-1: none)."""
        return self._committed([epoch if epoch is not None else -1])[epoch if epoch is not None else -1]

    def uncommitted(self, txns: Iterable[Transaction]) -> list[Transaction]:
        """``txns`` the target does not hold yet (one read of the table)."""
        txns = list(txns)
        committed = self._committed(t.epoch for t in txns)
        return [t for t in txns if t.checkpoint_id is None or committed[t.epoch] < t.checkpoint_id]

    def is_committed(self, txn: Transaction) -> bool:
        return txn.checkpoint_id is not None and not self.uncommitted([txn])

    def lost(self, txns: Iterable[Transaction]) -> str | None:
        """Why the uncommitted ones of ``txns`` can never be committed (files they wrote are gone),
        or None."""
        gone = self.pending.lost(self.uncommitted(txns))
        if not gone:
            return None
        return (f"sink {self.name}: {len(gone)} files its transactions wrote are gone before their commit "
                f"(e.g. {gone[0]}; a VACUUM of {self.target} with a retention shorter than the pipeline's downtime?)")

    def fence(self, epoch: int) -> None:
        """Recovery by ``epoch``, before it reads or rolls back anything: from this commit on, every
        commit of an older epoch to this sink is refused inside its own Delta commit. Idempotent;
        :class:`~checkpoint_lib.core.errors.FencedError` if a newer epoch fenced it first. The stamp
        keeps the checkpoint the table holds (``epoch << 32 | that checkpoint``), read on the very
        snapshot the fence commits on: a delta-rs compare-and-swap (milliseconds) when the table
        allows it, else a stamped empty Spark append (a racing commit conflicts on the stamp)."""
        from deltalake import DeltaTable

        self.create()
        if self._file_commit_problems(DeltaTable(self.target)):
            tables.raise_fence(self.spark, self.target, self.app_id, epoch)
            return

        def decide(have: int) -> int | None:  # our epoch's stamp already: fenced; else keep its checkpoint
            have_epoch, have_cid = tables.split_version(None if have < 0 else have)
            return None if have_epoch == epoch else tables.fenced_version(epoch, max(have_cid, 0))

        self._stamped_commit([], epoch, decide)

    def commit(self, txns: list[Transaction], checkpoint_id: int, writer_epoch: int) -> list[Transaction]:
        """Commit ``txns`` (every subtask's, all pre-committed at checkpoints <= ``checkpoint_id``):
        one Delta commit per checkpoint they belong to (normally one), stamped ``(app_id,
        writer_epoch << 32 | that checkpoint)``. Commits are cumulative and in checkpoint order, so
        a transaction is committed exactly when the stamp reached its checkpoint:
        those are skipped, which makes a repeated commit (a retry, a recovery, a late notification)
        a no-op. A writer of an older epoch than the table's fence is refused by Delta inside the
        commit (:class:`~checkpoint_lib.core.errors.FencedError`, nothing landed). Returns what this
        call committed."""
        if self.check_epoch is not None:
            self.check_epoch(writer_epoch)  # the early, cheap refusal; the fence is in the commit
        return tables.retry_conflicts(
            lambda: self._commit_once(txns, checkpoint_id, writer_epoch),
            f"sink {self.name}: commit of checkpoint {checkpoint_id} to {self.target}",
            before_retry=None if self.check_epoch is None else lambda: self.check_epoch(writer_epoch),
        )

    def _commit_once(self, txns: list[Transaction], checkpoint_id: int, writer_epoch: int) -> list[Transaction]:
        """What ``txns`` the target does not hold yet (re-read on every attempt: after a conflict,
        the stamp says whether a retry has anything left to do), as one Delta commit per checkpoint,
        oldest first, each stamped with its own checkpoint. A late notification that commits
        several checkpoints at once so still leaves a version holding exactly what each of them
        committed: a rollback to one of them RESTOREs that version and keeps its rows (one commit of
        them all would be undone whole, and the stamp, which RESTORE keeps, would call them
        committed)."""
        todo = self.uncommitted(txns)
        if todo:
            self.check_not_rewound()
        by_checkpoint: dict[int, list[Transaction]] = defaultdict(list)
        for t in todo:
            by_checkpoint[checkpoint_id if t.checkpoint_id is None else t.checkpoint_id].append(t)
        for cid in sorted(by_checkpoint):
            self._commit_checkpoint(by_checkpoint[cid], tables.fenced_version(writer_epoch, cid))
            tables.check_not_fenced(self.target, self.app_id, writer_epoch)
        return todo

    @property
    def rollback_tag(self) -> str:
        """The commit info ``userMetadata`` of this sink's own rollbacks (a RESTORE the pipeline ran)."""
        return f"{self.app_id} rollback"

    def check_not_rewound(self) -> None:
        """Refuse to commit on a table someone else RESTOREd to a version holding an older
        checkpoint than its stamp says is committed (:class:`SinkTableRewoundError`): a RESTORE
        keeps the stamps, so the commit would land on top of the older rows and the rows of the
        checkpoints in between would be gone for good while the pipeline's state counts them.
        Reads the newest commits of the log (normally two). A RESTORE racing the commit itself
        (between this check and the commit) is caught at the next commit."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        from ..delta.log import restore_since_stamp

        try:
            dt = DeltaTable(self.target)
        except TableNotFoundError:
            return
        stamped = tables.split_version(dt.transaction_version(self.app_id))[1]
        if stamped < 0:
            return
        restore = restore_since_stamp(self.target, self.app_id, stamped, self.rollback_tag, latest=dt.version())
        if restore is None:
            return
        if restore.restored is not None:
            dt.load_as_version(restore.restored)
        elif restore.timestamp is not None:
            dt.load_as_version(restore.timestamp)
        else:
            return
        holds = tables.split_version(dt.transaction_version(self.app_id))[1]
        if holds >= stamped:
            return
        to = (f"version {restore.restored}" if restore.restored is not None else f"its state at {restore.timestamp}")
        keep = (f"restore checkpoint {holds} or an older retained one (ckpt recover {pipeline_of(self.app_prefix)} "
                f"--checkpoint {holds}: the sinks are rolled back to it and the replay writes the rest again)"
                if holds >= 1 else "start the pipeline over into new tables")
        raise SinkTableRewoundError(
            f"sink {self.name}: {self.target} was RESTOREd to {to} by version {restore.version}, which holds "
            f"{f'what checkpoint {holds} committed' if holds >= 1 else 'nothing the pipeline committed'}, while "
            f"checkpoint {stamped} is committed to it: the "
            f"rows of the checkpoints in between are gone from it and the pipeline's state counts them. Nothing was "
            f"written. Either undo the RESTORE (RESTORE TABLE delta.`{self.target}` TO VERSION AS OF "
            f"{restore.version - 1}), or {keep}."
        )

    def _commit_checkpoint(self, txns: list[Transaction], version: int) -> None:
        files = self.pending.files(txns)
        if self.mode == "append":
            self._add_files(files, version)
        elif files:
            staged_schema = T.StructType(list(self.schema.fields) + _ORDER_COLUMNS)
            self._merge(self.spark.read.schema(staged_schema).parquet(*[f.path for f in files]), self.app_id, version)
        else:  # nothing staged: the stamp alone, without a MERGE
            self._stamp(version)

    def _stamp(self, version: int) -> None:
        """Commit the stamp ``version`` alone: a delta-rs commit when the table allows, else an empty
        stamped Spark append (both refused for a fenced epoch)."""
        from deltalake import DeltaTable

        if not self._file_commit_problems(DeltaTable(self.target)):
            self._add_files([], version)
        else:
            epoch, cid = tables.split_version(version)
            tables.raise_fence(self.spark, self.target, self.app_id, epoch, cid)

    def _add_files(self, files: list, version: int) -> None:
        """ONE delta-rs commit adding ``files`` to the target with the stamp ``version``, placed
        exactly on the snapshot whose stamp it checked: a newer epoch's stamp refuses it, an equal
        or higher one of ours means it landed already (a retry)."""
        self._stamped_commit(add_actions(files), tables.split_version(version)[0], lambda have: None if have >= version else version)

    def _stamped_commit(self, actions: list, epoch: int, decide) -> None:
        tables.stamped_commit(self.target, self.app_id, actions, decide, epoch=epoch, attempts=_COMMIT_ATTEMPTS,
                              what=f"sink {self.name}")

    def _merge(self, staged: DataFrame, app: str, version: int) -> None:
        from delta.tables import DeltaTable

        latest = Window.partitionBy(*self.keys).orderBy(F.col(TXN_SEQ).desc(), F.col(FLUSH).desc())
        rows = (
            staged.withColumn(temporary("rank"), F.row_number().over(latest)).where(F.col(temporary("rank")) == 1)
            .select(*self.schema.fieldNames())
        )
        cond = " AND ".join(f"t.`{k}` = s.`{k}`" for k in self.keys)
        declared = {f"`{c}`": f"s.`{c}`" for c in self.schema.fieldNames()}  # a column beyond them is kept
        with tables.stamped(self.spark, app, version):
            (
                DeltaTable.forPath(self.spark, self.target).alias("t")
                .merge(rows.alias("s"), cond)
                .whenMatchedUpdate(set=declared)
                .whenNotMatchedInsert(values=declared)
                .execute()
            )

    def rollback_version(self, checkpoint_id: int) -> int | None:
        """The version :meth:`rollback_to` restores: the one before the first commit stamped above
        ``checkpoint_id`` (-1: before our first commit, which created the table; None: nothing after
        it was committed). Raises :class:`RollbackUnavailableError` when that version cannot be
        restored any more (its commits fell out of the log retention, or its files were vacuumed):
        a recovery asks before it writes anything."""
        from deltalake import DeltaTable

        from ..delta.log import MissingLogError, version_before_txn_above

        if not is_delta_table(self.target):
            return None
        # (app_prefix/name/ == stamp_prefix(pipeline, name): app_prefix is "checkpoint_lib/<pipeline>")
        try:
            version = version_before_txn_above(self.target, f"{self.app_prefix}/{self.name}/", checkpoint_id)
        except MissingLogError as exc:
            raise self._unavailable(checkpoint_id, f"a commit on the way back to it is gone: {exc}") from None
        if version is None or version < 0:
            return version
        try:
            files = DeltaTable(self.target, version=version).file_uris()
        except Exception as exc:  # noqa: BLE001 - delta-rs cannot rebuild that version
            raise self._unavailable(checkpoint_id, f"version {version} cannot be read ({str(exc).splitlines()[0]})") from None
        missing = [f for f in files if not files_at(f).exists(f.removeprefix("file://"))]
        if missing:
            raise self._unavailable(checkpoint_id, f"version {version} lost {len(missing)} data files to VACUUM "
                                                   f"(e.g. {missing[0]})")
        return version

    def _unavailable(self, checkpoint_id: int, why: str) -> RollbackUnavailableError:
        return RollbackUnavailableError(
            f"sink {self.name}: {self.target} cannot be rolled back to what checkpoint {checkpoint_id} committed: "
            f"{why}. Nothing was written. Restore a newer checkpoint (ckpt recover --checkpoint N), or, to keep "
            "older savepoints restorable, keep the table's history longer (delta.logRetentionDuration and "
            "delta.deletedFileRetentionDuration; tables the pipeline creates keep a year of log)"
        )

    def rollback_to(self, checkpoint_id: int) -> int | None:
        """Make the target hold exactly what it held when checkpoint ``checkpoint_id`` was the
        latest committed to it (Delta RESTORE to :meth:`rollback_version`); returns that version,
        or None when nothing after it was committed. Idempotent until the sink commits again.
        Writes of others to the target after that version are undone too: the target belongs to
        the pipeline."""
        from delta.tables import DeltaTable

        version = self.rollback_version(checkpoint_id)
        if version is None:
            return None
        with tables.session_confs(self.spark, {"spark.databricks.delta.commitInfo.userMetadata": self.rollback_tag}):
            if version < 0:  # our first commit created the table: before it, the table held nothing
                DeltaTable.forPath(self.spark, self.target).delete()
            else:
                DeltaTable.forPath(self.spark, self.target).restoreToVersion(version)
        return version

    # aborting, cleaning up and recovery ----------------------------------------------------

    def discard(self, txns: Iterable[Transaction]) -> None:
        """After ``txns`` committed: forget them (an upsert sink also deletes the files it MERGEd;
        an append sink's files are the table's now). Idempotent."""
        self.pending.forget(txns, delete_data=self.mode == "upsert")

    def abort(self, txns: Iterable[Transaction]) -> None:
        """Delete what ``txns`` wrote and forget them, except files a version of the table refers
        to: a transaction committed before a crash kept its bookkeeping from being forgotten, and
        an OPTIMIZE since may have taken its files out of the current snapshot while the versions
        that committed them (time travel, a rollback to a retained checkpoint, incremental readers)
        still reference them. So the log since the oldest epoch among ``txns`` decides
        (:func:`~checkpoint_lib.delta.log.files_added_since_epoch`); when a commit of it is gone,
        nothing is deleted (files nobody references are VACUUM's). Idempotent."""
        txns = list(txns)
        if not txns:
            return
        if self.mode == "upsert":
            self.pending.forget(txns, delete_data=True)
            return
        referenced = files_added_since_epoch(self.target, self.app_id, min(t.epoch for t in txns))
        files = {t.handle: [f.path for f in self.pending.files([t], missing_ok=True)] for t in txns}
        kept = [t for t in txns if referenced is None or any(p in referenced for p in files[t.handle])]
        self.pending.forget(kept, delete_data=False)
        self.pending.forget([t for t in txns if t not in kept], delete_data=True)

    def open_transactions(self) -> list[Transaction]:
        """Every transaction that wrote something and was not forgotten, of every epoch (committed
        ones whose clean-up a crash interrupted included): recovery re-commits those the restored
        checkpoint owns (a no-op for committed ones) and aborts the rest."""
        return self.pending.transactions()


register_sink(DeltaSink, _delta_sink)

from . import postgres_sink  # noqa: E402,F401 - registers the PostgreSQL sink (after the Delta sink)

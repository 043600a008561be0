"""A new kind of source or sink is one file: its declaration, its reader
(checkpoint_lib.spark.sources.SourceReader) or writer (checkpoint_lib.spark.sinks.SinkWriter) and
one register call, all in this test module, run by the unchanged runtime with checkpoints, dead
letters and a recovery after a kill between completion and commit, exactly once."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Mapping

import pytest
from in_process_kills import raise_at

from checkpoint_lib.delta.log import AddedFile, plan_steps
from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.pipeline import DeltaSink, Pipeline
from checkpoint_lib.pipelines.payments import BALANCES_SCHEMA, LEDGER_SCHEMA, SOURCE_SCHEMA, RunningBalance, payment_errors
from checkpoint_lib.spark.runner import PipelineRunner
from checkpoint_lib.spark.sinks import SinkSite, pipeline_sinks, register_sink, sink_writer
from checkpoint_lib.spark.sources import SourceSite, register_source, source_reader
from checkpoint_lib.verify import read_delta

pytestmark = pytest.mark.spark


@dataclass(frozen=True)
class BatchSource:
    """Rows handed over in numbered batches, as a queue's offsets would be: batch n is version n."""

    path: str
    schema: Mapping[str, str]
    batches: tuple[tuple[tuple, ...], ...]
    validate: Callable[[Any], Any] | None = None


class BatchReader:
    caches_step = False
    writes_on_discover = False

    def __init__(self, spec: BatchSource, site: SourceSite):
        self.spec, self.site = spec, site

    def latest(self) -> int | None:
        return len(self.spec.batches) - 1 if self.spec.batches else None

    def discover(self) -> int | None:
        return self.latest()

    def _files(self, after: int, upto: int) -> list[AddedFile]:
        return [AddedFile(v, f"batch-{v}", len(self.spec.batches[v]), 0) for v in range(after + 1, upto + 1)]

    def pending_rows(self, after: int, upto: int) -> int:
        return sum(f.rows for f in self._files(after, upto))

    def next_step(self, after: int, upto: int, rows_per_step: int) -> list[AddedFile]:
        steps = plan_steps(self._files(after, upto), rows_per_step)
        return steps[0] if steps else []

    def missing(self, step: list[AddedFile]) -> list[str]:
        return []

    def read(self, step: list[AddedFile], senders: int):
        rows = [(*row, f.version, f.path, i, n % senders, None)
                for n, f in enumerate(step) for i, row in enumerate(self.spec.batches[f.version])]
        columns = ", ".join(f"{c} {t}" for c, t in self.spec.schema.items())
        return self.site.spark.createDataFrame(
            rows, f"{columns}, src_version long, src_file string, src_row long, sender int, _ckpt_error string")


register_source(BatchSource, BatchReader)


class AuditedSink(DeltaSink):
    """An append sink into Delta whose commits are also reported, by checkpoint (a kind built on
    the Delta one: a subclass of its declaration, its own writer)."""


COMMITS: dict[str, list[int]] = {}  # target -> the checkpoints committed, in order


class AuditedWriter:
    def __init__(self, spec: AuditedSink, site: SinkSite):
        self.name, self.location = site.name, site.location
        self.delta = sink_writer(DeltaSink(spec.path, spec.schema, spec.mode, spec.keys), site)  # the Delta kind's

    def commit(self, txns, checkpoint_id, writer_epoch):
        committed = self.delta.commit(txns, checkpoint_id, writer_epoch)
        if committed:
            COMMITS.setdefault(self.location, []).append(checkpoint_id)
        return committed

    # the rest of SinkWriter as the Delta sink does it (nothing else: the runtime needs no more)
    def create(self):
        self.delta.create()

    def stage(self, rows, handles, flush):
        self.delta.stage(rows, handles, flush)

    def abort(self, txns):
        self.delta.abort(txns)

    def discard(self, txns):
        self.delta.discard(txns)

    def fence(self, epoch):
        self.delta.fence(epoch)

    def uncommitted(self, txns):
        return self.delta.uncommitted(txns)

    def is_committed(self, txn):
        return self.delta.is_committed(txn)

    def lost(self, txns):
        return self.delta.lost(txns)

    def rollback_version(self, checkpoint_id):
        return self.delta.rollback_version(checkpoint_id)

    def rollback_to(self, checkpoint_id):
        return self.delta.rollback_to(checkpoint_id)

    def open_transactions(self):
        return self.delta.open_transactions()


register_sink(AuditedSink, AuditedWriter)

T0 = datetime(2026, 1, 1)


def batch(prefix: str, n: int) -> tuple[tuple, ...]:
    return tuple((f"{prefix}-{i}", f"a{i % 5}", (i * 37) % 1000 - 400, T0) for i in range(n))


def pipeline(batches) -> Pipeline:
    return (
        Pipeline("batches")
        .source(BatchSource("queue/payments", SOURCE_SCHEMA, batches, validate=payment_errors), parallelism=2)
        .key_by("account", parallelism=2)
        .process(RunningBalance(), uid="balance")
        .sink("ledger", AuditedSink("gold/ledger", LEDGER_SCHEMA))
        .sink("balances", DeltaSink("gold/balances", BALANCES_SCHEMA, mode="upsert", keys=("account",)))
        .dead_letters("dlq/payments")
    )


@pytest.mark.slow  # ~40 s; CI tier: a kind's registration and refusal in this file's other tests
def test_a_source_kind_and_a_sink_kind_made_in_one_file_run_exactly_once_through_a_recovery(spark, tmp_path):
    bad = (("x-1", None, 5, T0),)  # no account: a dead letter with its offset
    first = (batch("b0", 30), batch("b1", 20) + bad, batch("b2", 25))
    doomed = PipelineRunner(pipeline(first), str(tmp_path), spark, rows_per_checkpoint=40)
    doomed.ctx.kills.reached = raise_at("commit", 2)  # the second checkpoint completed, its sinks not committed
    with pytest.raises(RuntimeError, match="killed"):
        doomed.run()
    crashed_at = DeltaCheckpointStore.open(f"{tmp_path}/_checkpoints/batches").checkpoints.latest().checkpoint_id
    # a new batch, read by a new process: a recovery from the completed checkpoint, which it commits
    everything = first + (batch("b3", 15),)
    summary = PipelineRunner(pipeline(everything), str(tmp_path), spark, rows_per_checkpoint=40).run()
    assert (summary.epoch, summary.restored) == (2, crashed_at)
    # the ledger went through its own writer: the completed-but-uncommitted checkpoint is committed
    # by the recovery, then the new run's, each once
    audit = COMMITS[f"{tmp_path}/gold/ledger"]
    assert audit == sorted(set(audit)) and crashed_at in audit and audit[-1] == summary.final
    assert type(pipeline_sinks(spark, pipeline(everything), str(tmp_path), f"{tmp_path}/_checkpoints/batches")["ledger"]) \
        is AuditedWriter

    good = [r for b in everything for r in b if r[1] is not None]
    ledger = read_delta(f"{tmp_path}/gold/ledger")
    assert sorted(ledger["event_id"]) == sorted(r[0] for r in good)
    balances = {r.account: (r.balance_cents, r.event_count) for r in read_delta(f"{tmp_path}/gold/balances").itertuples()}
    want: dict[str, tuple[int, int]] = {}
    for _, account, cents, _ in good:
        total, count = want.get(account, (0, 0))
        want[account] = (total + cents, count + 1)
    assert balances == want
    dlq = read_delta(f"{tmp_path}/dlq/payments")
    assert list(zip(dlq["record"].map(lambda r: r["event_id"]), dlq["src_file"], dlq["src_version"], dlq["src_row"], dlq["error"])) == [
        ("x-1", "batch-1", 1, 20, "null or empty account")]


def test_a_source_or_sink_of_no_registered_kind_is_refused_by_name(spark, tmp_path):
    class Unknown:
        path, schema = "x", {"a": "long"}

    def known(error) -> list[str]:  # the kinds the message names, in its order
        return re.search(r"\(known: ([^;]*);", str(error.value)).group(1).split(", ")

    site = SourceSite(spark, f"{tmp_path}/x", f"{tmp_path}/_checkpoints/p", "p", print)
    with pytest.raises(TypeError, match=r"pipeline 'p': no reader for a source of type Unknown \(known: ") as err:
        source_reader(Unknown(), site)
    # in name order whichever module registered first (the PostgreSQL sink's tests import it before spark/sinks.py)
    assert {"DeltaSource", "FolderSource", "ChangeFeedSource", "BatchSource"} <= set(known(err))
    assert known(err) == sorted(known(err))
    with pytest.raises(TypeError, match=r"sink 'out': no writer for a sink of type Unknown \(known: ") as err:
        sink_writer(Unknown(), SinkSite(spark, "out", f"{tmp_path}/x", f"{tmp_path}/t", "checkpoint_lib/p"))
    assert {"DeltaSink", "PostgresSink", "AuditedSink"} <= set(known(err))
    assert known(err) == sorted(known(err))

"""Running a suite end to end: pick the checkpoint, build the views in Spark, validate them with
GX, record the outcome durably, and raise if anything failed.

``validate_restore``: the ``after_restore`` suite on checkpoint ``checkpoint_id`` (default: the
latest completed one, which is what the sinks hold after ``ckpt recover``), plus the latest restore
(``restored_state``: the state table right after it vs the snapshot it restored). For a dataflow
graph, the suite and the views it declares (:class:`~.spec.GraphQualitySpec`: ``Graph.quality``)
at that checkpoint, in the same project, records and Data Docs.
``validate_checkpoint``: the ``per_checkpoint`` suite on one completed checkpoint.
Both take ``progress(step, view)``, told ``("computed", view)`` and then ``("validated", view)``
for each view (the CLI's bar).

Suites run by one command share a :class:`ValidationSession` (keyword ``session``): each Delta
table (and version) is loaded once for all of them, one GX project serves them, and the Data Docs
are built once, by :meth:`ValidationSession.publish` after the last suite (without a session, each
call is its own session and publishes its Data Docs itself, as before).

Both record a row in ``W/_checkpoints/<pipeline>/validations`` (passed / failed / error) *before*
returning or raising, and raise :class:`QualityCheckFailed` (a failed expectation) or
:class:`QualityCheckError` (the validation could not run) unless ``raise_on_failure=False``. An
empty result (no expectation evaluated) counts as failed: nothing passes silently.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone
from typing import Any, Callable

from pyspark.sql import SparkSession

from . import views as V
from .context import Context, Tables
from .paths import (check_checkpoint_id, check_pipeline_name, data_docs_index, publish_data_docs, quality_root,
                    warehouse_root)
from .records import ValidationLog
from .result import CHECKPOINT, RESTORE, QualityCheckError, QualityCheckFailed, QualityResult
from .spec import GraphQualitySpec, NoGraphSuite, get_spec, graph_spec

SUITES = {RESTORE: "after_restore", CHECKPOINT: "per_checkpoint"}


class ValidationSession:
    """What the suites of one command share: the Delta tables they read (:class:`~.context.Tables`:
    one load per table and version), one GX project per pipeline and warehouse, and one Data Docs
    build (:meth:`publish`, after the last suite: every suite's pages and the index)."""

    def __init__(self, spark: SparkSession):
        self.spark = spark
        self.tables = Tables(spark)
        self._projects: dict[tuple[str, str], tuple[Any, Any]] = {}  # (root, pipeline) -> (warehouse, project)

    def project(self, warehouse: Any, pipeline_name: str) -> Any:
        """The GX project of ``pipeline_name`` in ``warehouse`` (made once per session)."""
        from .gx_project import GxProject

        key = (str(warehouse), pipeline_name)
        if key not in self._projects:
            self._projects[key] = (warehouse, GxProject(quality_root(warehouse, pipeline_name), pipeline_name))
        return self._projects[key][1]

    def publish(self) -> None:
        """Build the Data Docs of every suite run so far (once per project) and publish them."""
        for (_, pipeline_name), (warehouse, project) in self._projects.items():
            project.build_docs()
            publish_data_docs(warehouse, pipeline_name)

    def close(self) -> None:
        """Release what the session holds in Spark (its cached tables)."""
        self.tables.release()


def _context(spark: SparkSession, pipeline_name: str, warehouse: str, tables: Tables | None = None) -> Context:
    from ..pipelines import declared, is_graph

    check_pipeline_name(pipeline_name)
    root = warehouse_root(warehouse)
    pipeline = declared(pipeline_name)  # a linear pipeline, or a dataflow graph with its own suite
    spec = graph_spec(pipeline) if is_graph(pipeline) else get_spec(pipeline_name)
    return Context(spark, pipeline, spec, root, V.open_store(root, pipeline_name), tables=tables)


def _is_graph(ctx: Context) -> bool:
    return isinstance(ctx.spec, GraphQualitySpec)


def _run(
    kind: str, spark: SparkSession, pipeline_name: str, warehouse: str, checkpoint_id: int | None,
    build: Callable[[Context, V.CheckpointFacts], tuple[dict[str, Any], V.RestoreFacts | None, list[str]]],
    raise_on_failure: bool, progress: Callable[[str, str], None] | None = None,
    session: ValidationSession | None = None,
) -> QualityResult:
    check_checkpoint_id(checkpoint_id)
    own = session is None  # a suite on its own publishes its Data Docs itself
    if session is None:
        session = ValidationSession(spark)
    ctx = _context(spark, pipeline_name, warehouse, session.tables)
    graph = _is_graph(ctx)
    if graph and kind != RESTORE:
        raise NoGraphSuite(f"{pipeline_name} is a dataflow graph: it has an after-restore suite only so far "
                           f"(ckpt validate {pipeline_name} --suite restore)")
    ctx.progress = progress
    log = ValidationLog(ctx.root)
    started = time.time()
    stamp = datetime.fromtimestamp(started, timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    result = QualityResult(
        pipeline=pipeline_name, kind=kind, checkpoint_id=checkpoint_id, epoch=None, restored_checkpoint_id=None,
        run_name="", data_docs=str(data_docs_index(ctx.warehouse, pipeline_name)), started_at=started,
        validation_id=uuid.uuid4().hex,
    )
    try:
        facts = V.graph_facts(ctx, checkpoint_id) if graph else V.checkpoint_facts(ctx, checkpoint_id)
        result.checkpoint_id, result.epoch = facts.checkpoint_id, facts.epoch
        views, restore, notes = build(ctx, facts)
        if restore is not None:
            result.epoch, result.restored_checkpoint_id = restore.epoch, restore.checkpoint_id
            result.restore_known = True
        result.notes += notes
        result.run_name = f"{pipeline_name}-{kind}-c{facts.checkpoint_id}-e{result.epoch}-{stamp}"
        project = session.project(ctx.warehouse, pipeline_name)
        result.outcomes = project.run(suite_for(kind, ctx.spec, getattr(ctx.pipeline, "key", None)), views,
                                      result.run_name, progress=progress, build_docs=False)
        if own:
            session.publish()
        result.metrics = _graph_metrics(ctx.spec, views) if graph else _metrics(views)
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        result.run_name = result.run_name or f"{pipeline_name}-{kind}-error-{stamp}"
        result.finished_at = time.time()
        log.record(result)
        raise QualityCheckError(result.summary(), result) from exc
    finally:
        ctx.release()
        if own:
            session.close()
    result.finished_at = time.time()
    if not result.outcomes:
        result.notes.append("no expectation was evaluated: counted as failed")
    log.record(result)
    if not result.success and raise_on_failure:
        raise QualityCheckFailed(result.summary(), result)
    return result


def suite_for(kind: str, spec: Any, key: str | None = None) -> Any:
    """The suite a validation of ``kind`` runs for a pipeline of quality ``spec`` (and ``key``
    column): the shipped JSON suite in the pipeline's own words, plus (after a restore) the
    pipeline's own expectations on its sinks; a dataflow graph's own suite
    (:class:`~.spec.GraphQualitySpec`), after a restore only."""
    from .gx_project import SuiteSpec

    if isinstance(spec, GraphQualitySpec):
        if kind != RESTORE:
            raise NoGraphSuite(f"a dataflow graph has an after-restore suite only so far, not a {kind} suite")
        return SuiteSpec.load(spec.suite).in_words(spec.words)
    suite = SuiteSpec.load(SUITES[kind]).in_words(spec.words(key))
    if kind == RESTORE:
        own = spec.sink_expectations()
        if own:
            suite = suite.with_expectations({V.sink_view(name): exps for name, exps in own.items()})
    return suite


def _metrics(views: dict[str, Any]) -> dict[str, Any]:
    """Small aggregates for the record and the report (one row each: fine on the driver), from the
    collected views without Spark, or from the Spark ones."""
    import pandas as pd

    out: dict[str, Any] = {}
    if "totals" in views:
        totals = views["totals"]
        if isinstance(totals, pd.DataFrame):
            first = totals.head(1).to_dict("records")  # no row: as Spark's first(), an error
            out.update({k: None if pd.isna(v) else int(v) for k, v in first[0].items()})
        else:
            out.update(totals.first().asDict())
    if "restored_state" in views:
        restored = views["restored_state"]
        if isinstance(restored, pd.DataFrame):
            out["restored_state_keys"] = int(restored["in_restored"].astype("boolean").fillna(False).sum())
        else:
            out["restored_state_keys"] = restored.where("in_restored").count()
    if "channel_state" in views:
        segments = views["channel_state"]
        out["channel_state_segments"] = len(segments) if isinstance(segments, pd.DataFrame) else segments.count()
    return out


def _graph_metrics(spec: GraphQualitySpec, views: dict[str, Any]) -> dict[str, Any]:
    """What a graph's spec records of its views (``GraphQualitySpec.metrics``), as plain numbers."""
    if spec.metrics is None:
        return {}
    return {k: None if v is None else int(v) for k, v in dict(spec.metrics(views)).items()}


def _restore_build(ctx: Context, facts: Any):
    restore = V.latest_restore(ctx)
    notes = []
    if _is_graph(ctx):  # the graph's own views, at the checkpoint; the restore is recorded with them
        return dict(ctx.spec.views(ctx, facts)), restore, notes
    if restore is None:
        notes.append("no restore recorded yet: restored_state not checked")
    return V.restore_views(ctx, facts, restore), restore, notes


def _checkpoint_build(ctx: Context, facts: V.CheckpointFacts):
    return V.checkpoint_views(ctx, facts), None, []


def validate_restore(
    spark: SparkSession, pipeline_name: str, warehouse: str, checkpoint_id: int | None = None,
    *, raise_on_failure: bool = True, progress: Callable[[str, str], None] | None = None,
    session: ValidationSession | None = None,
) -> QualityResult:
    """The after-restore suite: exactly-once outputs at ``checkpoint_id`` (default latest), nothing
    lost, and the latest restore equal to its snapshot. Recorded; raises on failure. With
    ``session``, its Data Docs wait for :meth:`ValidationSession.publish`."""
    return _run(RESTORE, spark, pipeline_name, warehouse, checkpoint_id, _restore_build, raise_on_failure, progress,
                session)


def validate_checkpoint(
    spark: SparkSession, pipeline_name: str, warehouse: str, checkpoint_id: int | None = None,
    *, raise_on_failure: bool = True, progress: Callable[[str, str], None] | None = None,
    session: ValidationSession | None = None,
) -> QualityResult:
    """The per-checkpoint suite: every subtask acked with sizes, channel state consistent with the
    barrier positions, conservation over state + channel state. Recorded; raises on failure. With
    ``session``, its Data Docs wait for :meth:`ValidationSession.publish`."""
    return _run(CHECKPOINT, spark, pipeline_name, warehouse, checkpoint_id, _checkpoint_build, raise_on_failure,
                progress, session)


def validate_before_commit(
    spark: SparkSession, pipeline_name: str, warehouse: str, store: Any, checkpoint_id: int,
    progress: Callable[[str], None] = lambda line: None, *, epoch: int | None = None,
    kill_point: Callable[[str], None] | None = None,
) -> QualityResult | None:
    """The per-checkpoint suite on completed checkpoint ``checkpoint_id`` and its verdict recorded in
    ``store`` (a :class:`~checkpoint_lib.delta.store.DeltaCheckpointStore`, its ``verdicts``), the gate every commit of
    a validating pipeline passes: the runner after completion, the snapshot DAG's commit task and a
    recovery all call this for a checkpoint not validated yet, as epoch ``epoch`` (fenced by it;
    None: unfenced). The verdict is a compare-and-swap, so
    attempts validating the same checkpoint at once agree on one outcome:

    - passed, and it stands: returns the result (the caller may commit);
    - failed (or could not run), and it stands: ``checkpoint_id`` is discarded, raises the
      :class:`QualityCheckError`; nothing may commit it;
    - failed here but another attempt recorded a pass first: returns None (it stays validated);
    - passed here but another attempt discarded it first: raises :class:`QualityCheckFailed`.
    """
    if kill_point is not None:
        kill_point("validate")
    try:
        result = validate_checkpoint(spark, pipeline_name, warehouse, checkpoint_id)
    except QualityCheckError as exc:
        if store.verdicts.record(checkpoint_id, False, f"failed its per-checkpoint validation: {str(exc)[:500]}",
                                 epoch=epoch):
            progress(f"checkpoint {checkpoint_id} FAILED validation: discarded, not committed")
            raise
        progress(f"checkpoint {checkpoint_id} failed validation here, but another attempt had validated it: it stands")
        return None
    if not store.verdicts.record(checkpoint_id, True, result.headline()[:500], epoch=epoch):
        raise QualityCheckFailed(
            f"checkpoint {checkpoint_id} passed validation here, but another attempt's validation failed "
            "first and discarded it: it is never committed", result,
        )
    progress(result.headline())
    return result

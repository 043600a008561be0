"""What the generic suites need to know about a pipeline: which tables and columns play which role.

The suites in ``expectations/`` are written against *standard views* (``events``, ``keys``,
``conservation``...), never against a pipeline's own column names. A :class:`QualitySpec` maps a
pipeline onto those views, so the same suites check every pipeline that declares one
(``Pipeline.quality(QualitySpec(...))``, where the pipeline is built).

Aggregates must be *additive* (sums and counts): the conservation check adds them up across keys,
across operator state and channel state, and compares them with the same aggregate over the source.

A dataflow graph declares a :class:`GraphQualitySpec` instead (``Graph.quality(...)``): its own
suite file and the function that builds the views that suite checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence


@dataclass(frozen=True)
class QualitySpec:
    """Roles of a pipeline's tables and columns.

    - ``event_sink`` / ``event_id`` / ``event_columns``: the append sink with one row per valid
      source record (its id column, and the columns that must equal the source's);
    - ``key_sink``: the upsert sink with one row per key holding the ``aggregates`` (optional);
    - ``aggregates``: state (and key sink) column -> a function returning the Spark aggregate that
      recomputes it from source-like records (``lambda: F.sum("amount_cents")``); additive only;
    - ``dead_letter_offset``: the dead-letter columns that identify a source row;
    - ``source_records(ctx, records)``: the records the aggregates run over, from the records up to
      the checkpoint (the valid source rows through the pipeline's ``map()`` steps, what the
      operator got; default: those records) - e.g. a transfer is a debit of its account and a
      credit of its counterparty, and opening balances come from another table;
    - ``channel_records(channel, full)``: what logged in-flight records add to the state, in the
      same form (default: the records themselves). ``full=False``: what replaying them applies at
      once (the restored state); ``full=True``: all they lead to (what the pipeline converges to,
      e.g. a replayed debit also credits ``dst`` through the feedback edge).
    - ``distinct_events``: the source may repeat an event id (upstream retries) and the pipeline
      passes each id on once: the event sink must hold every distinct valid id exactly once.
    - ``expectations``: the pipeline's own invariants, GX-native: sink name -> a list of GX
      expectations (``gx.expectations.ExpectColumnValuesToBeBetween(column="orders", min_value=1)``)
      its table must meet at the validated checkpoint (the after-restore suite, view
      ``sink_<name>``, in the same Data Docs). A function returning that mapping defers importing GX
      to the validation.
    """

    pipeline: str
    event_sink: str | None
    event_id: str | None
    event_columns: tuple[str, ...] = ()
    key_sink: str | None = None
    aggregates: Mapping[str, Callable[[], Any]] = field(default_factory=dict)
    dead_letter_offset: tuple[str, ...] = ("src_version", "src_file", "src_row")
    source_records: Callable[[Any, Any], Any] | None = None
    channel_records: Callable[[Any, bool], Any] | None = None
    distinct_events: bool = False
    expectations: Mapping[str, Sequence[Any]] | Callable[[], Mapping[str, Sequence[Any]]] = field(default_factory=dict)

    def words(self, key: str | None) -> dict[str, str]:
        """The pipeline's own names for the roles the suites' notes speak of (a role the spec
        leaves out keeps a generic word); ``key`` is the pipeline's key column."""
        return {
            "event_sink": repr(self.event_sink) if self.event_sink else "(no event sink)",
            "event_id": self.event_id or "event id",
            "event_columns": ", ".join(self.event_columns) or "the values",
            "key_sink": repr(self.key_sink) if self.key_sink else "(no key sink)",
            "key": key or "key",
            "aggregates": ", ".join(self.aggregates) or "the aggregates",
        }

    def sink_expectations(self) -> dict[str, list[Any]]:
        """:attr:`expectations` (called first when it is a function), sink name -> GX expectations."""
        found = self.expectations() if callable(self.expectations) else self.expectations
        return {name: list(exps) for name, exps in (found or {}).items()}


@dataclass(frozen=True)
class GraphQualitySpec:
    """A dataflow graph's after-restore suite (``Graph.quality(...)``): a graph has no standard
    roles to map (its sinks, operators and sources are its own), so it brings its views with it.

    - ``suite``: the name of a JSON suite in ``expectations/`` (``<suite>.json``, the format of
      ``after_restore.json``: per view, its expectations);
    - ``views(ctx, facts)``: the views that suite checks, one per name it lists, built in Spark
      for the checkpoint validated (a :class:`~checkpoint_lib.quality.context.Context`, whose
      ``pipeline`` is the graph, and the checkpoint's
      :class:`~checkpoint_lib.quality.views.GraphFacts`: its acks, each source's offset), each
      through ``ctx.materialize(df, name)``; :mod:`checkpoint_lib.quality.views` reads a sink as
      the checkpoint committed it, an operator's state as the checkpoint pinned it, a source's
      rows (with offsets), dead letters and change feed up to its offset;
    - ``words``: the ``{role}`` placeholders of the suite's notes, filled in (as
      :meth:`QualitySpec.words`);
    - ``metrics(views)``: small numbers recorded with the outcome (the report shows
      ``dead_letters``, ``valid_rows`` and ``sink_rows``), from the computed views (pandas or
      Spark DataFrames).

    ``views`` and ``metrics`` are called at validation only, so a module that declares the graph
    imports no engine for them.
    """

    suite: str
    views: Callable[[Any, Any], Mapping[str, Any]]
    words: Mapping[str, str] = field(default_factory=dict)
    metrics: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None


def count_rows() -> Any:
    """The aggregate of ``QualitySpec.aggregates`` that counts records (as a long)."""
    from pyspark.sql import functions as F

    return F.count(F.lit(1)).cast("long")


def sum_of(column: str) -> Callable[[], Any]:
    """The aggregate of ``QualitySpec.aggregates`` that sums ``column`` (as a long)."""

    def total() -> Any:
        from pyspark.sql import functions as F

        return F.sum(column).cast("long")

    return total


def get_spec(pipeline_name: str) -> QualitySpec | GraphQualitySpec:
    """The spec the pipeline declares (:meth:`Pipeline.quality`), or the generic one every pipeline
    gets: no event sink and no aggregates, so the suites check what needs no roles - nothing lost
    (valid + dead-lettered = source rows, each bad row dead-lettered once), the restored state
    equal to its snapshot, every subtask acknowledged, and the cut consistent (n >= m). A dataflow
    graph's is the :class:`GraphQualitySpec` it declares (``Graph.quality``); one that declares
    none is refused (:class:`NoGraphSuite`): no generic suite fits every graph."""
    from ..pipelines import declared, is_graph

    found = declared(pipeline_name)
    if is_graph(found):
        return graph_spec(found)
    spec = found.quality_spec
    return spec if spec is not None else QualitySpec(pipeline=pipeline_name, event_sink=None, event_id=None)


class NoGraphSuite(ValueError):
    """A dataflow graph that declares no quality suite was asked to be validated."""


def graph_spec(graph: Any) -> GraphQualitySpec:
    """The quality suite dataflow graph ``graph`` declares (``Graph.quality``), or
    :class:`NoGraphSuite` saying how to declare one."""
    spec = getattr(graph, "quality", None)
    if spec is None:
        raise NoGraphSuite(
            f"{graph.name} is a dataflow graph that declares no quality suite: declare one with "
            "Graph.quality(GraphQualitySpec(suite, views)) (the enrichment graph's is an example: "
            "checkpoint_lib/pipelines/enrichment_quality.py)")
    return spec

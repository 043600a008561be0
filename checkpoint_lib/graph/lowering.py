"""Today's linear :class:`~checkpoint_lib.pipeline.Pipeline` as a dataflow graph of two vertices:
the source vertex (its ``map()`` steps fused into it, as the runtime fuses them; its bootstrap;
the dead letters; a state TTL's ``max_ahead`` as its :class:`~.model.AheadBound`) -> one edge with the pipeline's partitioning and key -> the operator vertex and
its sinks, plus, for ``iterate()`` (``transfers``), the feedback edge of the operator's
:data:`~checkpoint_lib.pipeline.FEEDBACK` output back into itself, keyed like its input.

The ids are the ones a pipeline's snapshots already use (``Pipeline.operator_ids()``): the source
vertex is :data:`SOURCE`, the operator its uid, each sink ``sink_<name>``."""

from __future__ import annotations

import dataclasses

from ..pipeline import FEEDBACK, Pipeline
from .builder import Graph, PartitionedStream, Stream
from .model import AheadBound, StreamGraph

SOURCE = "source"
"""The source vertex of a linear pipeline: the operator id its snapshots give the source subtasks."""


def _partitioned(records: Stream, pipeline: Pipeline) -> PartitionedStream:
    how, parallelism = pipeline.partitioning, pipeline.keyed_parallelism
    if how == "hash":
        return records.key_by(pipeline.key, parallelism=parallelism)
    if how == "forward":
        return records.forward()
    return records.rebalance(parallelism) if how == "rebalance" else records.broadcast(parallelism)


def from_pipeline(pipeline: Pipeline) -> StreamGraph:
    """``pipeline`` (validated first: an incomplete one raises its own message) as a validated
    :class:`~.model.StreamGraph`."""
    pipeline.validate()
    g = Graph(pipeline.name, max_parallelism=pipeline.max_parallelism)
    ttl = pipeline.state_ttl
    ahead = AheadBound(ttl.time_column, ttl.max_ahead) if ttl is not None and ttl.max_ahead is not None else None
    records = g.source(SOURCE, pipeline.source_spec, parallelism=pipeline.source_parallelism,
                       bootstrap=pipeline.bootstrap_spec, ahead=ahead)
    for fn, schema in pipeline.transforms:
        records.map(fn, schema)
    operator = _partitioned(records, pipeline).process(pipeline.operator, uid=pipeline.operator_uid)
    if pipeline.feedback:
        operator.output(FEEDBACK).key_by(pipeline.key).iterate(into=operator)
    for name, sink in pipeline.sinks.items():
        operator.sink(name, sink)
    records.dead_letters(pipeline.dlq_path)
    if pipeline.generator_fn is not None:
        g.generator(pipeline.generator_fn)
    built = g.build()
    # the dead letters keep the stamp a linear pipeline's appends always carried (a replay after an
    # upgrade filters on it: no bad row twice)
    return dataclasses.replace(built, dead_letters=tuple(dataclasses.replace(d, stamp="dlq")
                                                         for d in built.dead_letters))

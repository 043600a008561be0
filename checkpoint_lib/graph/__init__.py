"""Dataflow graphs: the model, a builder in Flink's style, validation, the lowering of today's
linear pipelines, the plan of how a graph runs (chains, cuts, process groups), and drawings (text,
Graphviz dot, JSON). Pure: imports no engine.

A graph declares what a pipeline of several operators is: named sources, operators with stable
uids (stateless, keyed, or two-input keyed), edges with a partitioning, sinks and dead letters at
any vertex, cycles only through ``iterate()``. The Spark runtime
(:class:`checkpoint_lib.spark.graph_runner.GraphRunner`) runs graphs; a linear
:class:`~checkpoint_lib.pipeline.Pipeline` is a graph of two vertices (:func:`from_pipeline`) and
runs the same way; ``ckpt graph P`` draws either.

One role a module: ``model.py`` (the immutable :class:`StreamGraph` and its parts),
``builder.py`` (:class:`Graph`, the fluent builder, and its streams), ``validation.py``
(:func:`validate`, :class:`GraphError`: every rule), ``lowering.py`` (:func:`from_pipeline`),
``jobgraph.py`` (:func:`plan`: the declared graph as the runtime executes it, Flink's
``JobGraph``: which edges are chained in-process and which are cut by a channel log, and why, in
which process groups), ``render.py`` (:func:`to_text`, :func:`to_dot`, :func:`to_dict`,
:func:`to_svg`; the first two also draw a plan), ``details.py`` (a checkpoint per vertex of its
graph: :func:`~.details.checkpoint_details`).
"""

from .builder import ConnectedStreams, Graph, KeyedStream, PartitionedStream, Stream
from .jobgraph import (ALL, KEYED_STAGE, SOURCE_STAGE, SOURCES, Chain, ChannelMap, CutReason, Input, JobEdge, JobGraph, Layout, PlanError,
                       ProcessGroup, plan)
from .lowering import SOURCE, from_pipeline
from .model import (MAIN, RECORDS, AheadBound, DeadLetters, Edge, MapStep, OperatorKind, OperatorVertex, Partitioning,
                    SourceVertex, StreamGraph, Vertex, VertexSink)
from .render import shape, to_dict, to_dot, to_svg, to_text
from .validation import GraphError, problems, validate

__all__ = ["ALL", "AheadBound", "SOURCES", "Chain", "ChannelMap", "ConnectedStreams", "CutReason", "DeadLetters", "Edge", "Graph", "GraphError", "Input",
           "JobEdge", "JobGraph", "KEYED_STAGE", "KeyedStream", "Layout", "MAIN", "MapStep", "OperatorKind",
           "OperatorVertex", "PartitionedStream", "Partitioning", "PlanError", "ProcessGroup", "RECORDS", "SOURCE",
           "SOURCE_STAGE", "SourceVertex", "Stream", "StreamGraph", "Vertex", "VertexSink", "from_pipeline", "plan",
           "problems", "shape", "to_dict", "to_dot", "to_svg", "to_text", "validate"]

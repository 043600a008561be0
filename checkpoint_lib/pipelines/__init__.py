"""Where pipelines are found: the one registry the CLI, the jobs, the DAG factory, the Checkpoints
page, the quality suites and ``ckpt generate`` read. Pure: imports no engine.

A pipeline is found

- by **name**, from the entry point group :data:`GROUP` of the installed packages; checkpoint_lib
  registers its own pipelines (``payments``, ``transfers``) that way, in its ``pyproject.toml``,
  exactly as a user's package does::

      [project.entry-points."checkpoint_lib.pipelines"]
      orders = "mypkg.flows:orders"

- or by **reference** ``module:attr`` (``ckpt run mypkg.flows:orders``), with nothing installed:
  the module is imported (``ckpt`` puts the current directory on ``sys.path`` first, like
  ``python -m``), and the pipeline is then known by its name for the rest of the process. Child
  processes (spark-submit, ``ckpt run`` children) are given :func:`ref_of` the name.

What an entry point or a reference points at is a :class:`~checkpoint_lib.pipeline.Pipeline`, a
dataflow graph (a :class:`~checkpoint_lib.graph.Graph` builder or its built
:class:`~checkpoint_lib.graph.StreamGraph`), or a function of no arguments returning one (built
when asked, so listing names imports nothing). Its ``name`` is the pipeline's name everywhere
(``_checkpoints/<name>``, ``<name>_run``...); an entry point's name must equal it.

:func:`declared` gives either kind, for the commands that take both (:data:`GRAPH_COMMANDS`);
:func:`load` (:func:`get`) gives a linear pipeline and refuses a graph, saying which commands take
one; :func:`graph_of` gives either as a graph (a linear pipeline's two vertices).
"""

from __future__ import annotations

import importlib
import re
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from ..layout import check_name
from ..pipeline import Pipeline

GROUP = "checkpoint_lib.pipelines"
"""The entry point group pipelines are registered in."""

GRAPH_COMMANDS = ("run", "recover", "savepoint", "validate", "generate", "graph", "pipelines", "checkpoints", "state",
                  "report", "maintain")
"""The ``ckpt`` commands that take a dataflow graph (the others take linear pipelines only so far)."""

_REFERENCE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")

_loaded: dict[str, str] = {}
"""Pipelines this process loaded by reference: name -> ``module:attr``."""


class UnknownPipeline(ValueError):
    """No pipeline of that name is registered, or a reference does not lead to one."""


def is_reference(text: str) -> bool:
    """True for ``module:attr`` (a reference), False for a name."""
    return ":" in text


def _registered() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=GROUP):
        other = found.get(ep.name)
        if other is not None and other.value != ep.value:
            raise UnknownPipeline(
                f"pipeline {ep.name!r} is registered twice, as {other.value} and as {ep.value} "
                f"(entry point group {GROUP}): uninstall one")
        found[ep.name] = ep
    return found


def names() -> list[str]:
    """Every pipeline this process can find by name, linear pipelines and graphs: the registered
    ones and those loaded by reference. Imports no pipeline."""
    return sorted(set(_registered()) | set(_loaded))


def _declared(obj: Any) -> Any:
    """What a reference or entry point declares: the object, or what the function it names returns."""
    from ..graph import Graph, StreamGraph

    if callable(obj) and not isinstance(obj, (Pipeline, Graph, StreamGraph)):
        obj = obj()
    return obj


def _as_declared(obj: Any, where: str) -> Any:
    """A linear pipeline (a copy: the caller may rescale it, and a module-level Pipeline is shared)
    or a built graph (a :class:`~checkpoint_lib.graph.StreamGraph`, immutable), not yet validated."""
    from ..graph import Graph, StreamGraph

    obj = _declared(obj)
    if isinstance(obj, Graph):
        return obj.build()
    if isinstance(obj, StreamGraph):
        return obj
    if not isinstance(obj, Pipeline):
        raise UnknownPipeline(f"{where} is {type(obj).__name__}, not a Pipeline or a dataflow graph (Graph, "
                              "StreamGraph), nor a function returning one")
    return obj.with_parallelism()


def _validated(obj: Any) -> Any:
    from ..graph import StreamGraph, validate

    return validate(obj) if isinstance(obj, StreamGraph) else obj.validate()


def is_graph(obj: Any) -> bool:
    """Whether ``obj`` (what :func:`declared` returned) is a dataflow graph, not a linear pipeline."""
    from ..graph import StreamGraph

    return isinstance(obj, StreamGraph)


def graph_refusal(ref: str, name: str) -> str:
    """The one sentence that says a command takes linear pipelines only, and which ones take graphs."""
    what = ref if ref == name else f"{ref} ({name!r})"
    return (f"{what} is a dataflow graph: {', '.join(f'ckpt {c}' for c in GRAPH_COMMANDS)} take it; this command "
            "takes a linear pipeline (checkpoint_lib.pipeline.Pipeline: one source, one operator, its sinks) only so far")


def graph_of(ref: str) -> Any:
    """The dataflow graph (a validated :class:`~checkpoint_lib.graph.StreamGraph`) of a pipeline
    name or reference: a linear pipeline's two vertices (:func:`~checkpoint_lib.graph.from_pipeline`),
    or the graph it declares (a :class:`~checkpoint_lib.graph.Graph` builder, a ``StreamGraph``, or
    a function returning one). A graph drawn by reference is only drawn: its name is not taken for
    the process (a linear pipeline's is, as :func:`load` takes it)."""
    from ..graph import from_pipeline

    obj = _validated(_as_declared(_resolve(ref), ref)) if is_reference(ref) else declared(ref)
    return obj if is_graph(obj) else from_pipeline(load(ref) if is_reference(ref) else obj)


def graph_or_why(ref: str) -> tuple[Any, str | None]:
    """:func:`graph_of` ``ref``, or None and why not (an unknown pipeline, or one whose module or
    declaration fails): for the readers that show what they can without it (``ckpt checkpoints
    show``, the Checkpoints page)."""
    try:
        return graph_of(ref), None
    except Exception as exc:  # noqa: BLE001 - a user's module may raise anything; the reader goes on
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return None, text if isinstance(exc, (UnknownPipeline, ValueError)) and text else \
            f"{type(exc).__name__}{': ' + text if text else ''}"


def _resolve(ref: str) -> Any:
    """The object a ``module:attr`` reference names (imported)."""
    if not _REFERENCE.match(ref):
        raise UnknownPipeline(f"{ref!r} is not a pipeline reference: write module:attr, e.g. mypkg.flows:orders")
    module_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise UnknownPipeline(
                f"cannot import {module_name!r} for pipeline {ref!r}: install its package, or run from the "
                f"folder that holds it, or put that folder on PYTHONPATH") from exc
        raise
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UnknownPipeline(f"{module_name} has no attribute {attr!r} (pipeline {ref!r})") from None
    return obj


def declared(ref: str) -> Any:
    """What a name or a ``module:attr`` reference declares, validated: a linear
    :class:`~checkpoint_lib.pipeline.Pipeline` (a copy) or a dataflow graph (a
    :class:`~checkpoint_lib.graph.StreamGraph`), for the commands that take both
    (:data:`GRAPH_COMMANDS`). A reference makes its name known to this process (:func:`names`,
    :func:`ref_of`)."""
    if is_reference(ref):
        obj = _validated(_as_declared(_resolve(ref), ref))
        ep = _registered().get(obj.name)
        if ep is not None and ep.value != ref:
            raise UnknownPipeline(
                f"{ref} is pipeline {obj.name!r}, but that name is registered as {ep.value} "
                f"(entry point group {GROUP}): two pipelines cannot share a name")
        previous = _loaded.setdefault(obj.name, ref)
        if previous != ref:
            raise UnknownPipeline(f"{ref} and {previous} are both pipeline {obj.name!r}: two pipelines cannot share a name")
        return obj
    name = check_name("pipeline name", ref)
    if name in _loaded:
        return _validated(_as_declared(_resolve(_loaded[name]), _loaded[name]))
    ep = _registered().get(name)
    if ep is None:
        known = ", ".join(names()) or "none"
        raise UnknownPipeline(
            f"unknown pipeline {name!r}; registered: {known}. Register it under the entry point group "
            f"{GROUP} of its package, or pass it as module:attr (e.g. mypkg.flows:{name})")
    obj = _as_declared(ep.load(), f"entry point {name} = {ep.value}")
    if obj.name != name:
        raise UnknownPipeline(f"entry point {name} = {ep.value} is pipeline {obj.name!r}: the names must match")
    return _validated(obj)


def load(ref: str) -> Pipeline:
    """The linear pipeline a name or a ``module:attr`` reference leads to, validated; a dataflow
    graph is refused, naming the commands that take one (:data:`GRAPH_COMMANDS`:
    :func:`declared`). A reference makes its pipeline's name known to this process (:func:`names`,
    :func:`ref_of`)."""
    obj = declared(ref)
    if is_graph(obj):
        raise UnknownPipeline(graph_refusal(ref, obj.name))
    return obj


get = load
"""The pipeline of a name (or reference): what every caller that has a pipeline name uses."""


def name_of(ref: str) -> str:
    """The pipeline name of a name or reference, a linear pipeline's or a graph's (a reference is
    imported, a name only checked)."""
    return declared(ref).name if is_reference(ref) else check_name("pipeline name", ref)


def ref_of(name: str) -> str:
    """How another process finds pipeline ``name``: its reference when this process loaded it by
    one, else the name (registered)."""
    return _loaded.get(name, name)

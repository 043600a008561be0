"""The gold sinks as Airflow Assets, for data-aware scheduling: a downstream DAG with
``schedule=sink_assets("payments")`` (or one of them) runs when a checkpoint's commit lands.

An asset is named ``<pipeline>.<sink>`` with the URI ``x-checkpoint-lib://<pipeline>/<sink path>``
(the warehouse is resolved at run time, so it is not part of it); a sink outside the warehouse (a
PostgreSQL table) has its target there instead, quoted (``postgresql%3A<connection>/<table>``). The tasks that commit a
checkpoint - the snapshot DAG's ``commit``, the run DAG's ``keyed`` stage (a graph's: the task of
each process group, with that group's sinks), the recover DAG's ``recover`` - have the pipeline's
sinks as outlets, and each asset event carries the checkpoint
committed and the table's location in its ``extra``.
"""

from __future__ import annotations

from typing import Any, Iterable
from urllib.parse import quote

from airflow.sdk import Asset

SCHEME = "x-checkpoint-lib"
OUTSIDE = "target"
"""The key of a sink asset's own ``extra`` holding where a sink outside the warehouse writes."""


def sink_asset(pipeline: str, sink: str, path: str | None, target: str | None = None) -> Asset:
    """The asset of ``sink``: a table at ``path`` in the warehouse, or (``path`` None) ``target``."""
    where = path.strip("/") if path is not None else quote(target or sink, safe="/")
    return Asset(name=f"{pipeline}.{sink}", uri=f"{SCHEME}://{pipeline}/{where}", group="checkpoint_lib",
                 extra={} if path is not None else {OUTSIDE: target})


def sink_assets(pipeline: str, sinks: Iterable[str] | None = None) -> list[Asset]:
    """Every sink of the registered ``pipeline`` (a linear pipeline or a dataflow graph), as an
    asset; ``sinks``: only those (e.g. a graph's process group's)."""
    from checkpoint_lib.pipeline import sink_target
    from checkpoint_lib.pipelines import declared, is_graph

    found = declared(pipeline)
    specs = {s.name: s.spec for s in found.sinks} if is_graph(found) else dict(found.sinks)
    wanted = specs if sinks is None else list(sinks)
    return [sink_asset(pipeline, name, getattr(specs[name], "path", None), sink_target(specs[name])) for name in wanted]


def annotate(context: Any, outlets: Iterable[Any], warehouse: str, **extra: Any) -> None:
    """Put ``extra`` (and where each table lives) on the asset events this task emits."""
    events = context.get("outlet_events") if hasattr(context, "get") else None
    if events is None:
        return
    for outlet in outlets:
        if isinstance(outlet, Asset) and outlet.uri.startswith(f"{SCHEME}://"):
            outside = (outlet.extra or {}).get(OUTSIDE)
            path = outlet.uri.split("://", 1)[1].split("/", 1)[1]
            events[outlet].extra = {**extra, "table": outside or f"{warehouse.rstrip('/')}/{path}"}

"""The Checkpoints page: a FastAPI app the api-server mounts at ``/checkpoints`` (see
``plugins/ckpt_plugin.py``), shown in Airflow's navigation as an external view.

- ``GET /checkpoints/`` : the page (server-rendered HTML): pipelines, the chosen one's job graph
  (boxes and arrows, an inline SVG drawn here: :func:`checkpoint_lib.graph.to_svg`; a linear
  pipeline's two vertices, or a dataflow graph's), charts (checkpoint duration, state size,
  channel-state size, alignment time, with its recoveries and aborted checkpoints: the HTML
  report's charts) and history (id, kind, status, trigger time, duration, state size,
  channel-state size, alignment time, aligned/unaligned, failure reason, who requested it, linked
  to the DAG run that did); one checkpoint (``?pipeline=payments&checkpoint=7``) per vertex, as
  Flink's checkpoint details (:func:`checkpoint_lib.graph.details.checkpoint_details`, what ``ckpt
  checkpoints show`` prints; its figures also in the graph's boxes) and per subtask; links to the
  pipeline's DAGs and to the latest data-quality report. It follows Airflow's light or dark theme
  (the one script on the page reads it from the frame around it; unframed, the browser's
  preference decides). A pipeline whose graph cannot be loaded (its module fails) shows why in the
  graph's place, and its checkpoints per operator id.
- ``GET /checkpoints/api/pipelines``, ``.../api/{pipeline}/checkpoints``,
  ``.../api/{pipeline}/checkpoints/{id}/acks``, ``.../api/{pipeline}/checkpoints/{id}/vertices``:
  the same as JSON.
- ``GET /checkpoints/quality/{pipeline}/{path}``: files of the pipeline's GX Data Docs
  (``<warehouse>/_quality/<pipeline>/data_docs/``), nothing outside it.
- ``GET /checkpoints/recover/{pipeline}/{id}``: "recover to this checkpoint", the one action: a page
  saying what the recover DAG will do, with its form (barrier mode, dry run) filled in for that
  checkpoint; its ``POST`` triggers ``<pipeline>_recover`` with that conf and sends the browser to
  the new DAG run. (Airflow 3's own trigger form takes no values from its URL, so the page cannot
  link to it pre-filled.)

Who sees what: every route requires an authenticated Airflow user (the UI's session cookie or a
bearer token, checked by Airflow's own ``get_user``), and a pipeline is shown only to a user whom the
configured auth manager lets **read every one of its DAGs** (``<p>_run``, ``<p>_snapshot``,
``<p>_recover``, a dataflow graph's too; :func:`can_read_pipeline`). The page shows what all three write (checkpoints come
from the run and snapshot DAGs, the data-quality report from the recover DAG), so a user who may not
read one of them sees nothing of the pipeline. The index lists only such pipelines; any other
pipeline answers 403 with no data, before it is even looked up, so a user without access cannot tell
a registered pipeline from an unknown one (as Airflow's own ``/api/v2/dags/{dag_id}`` does: 403
first, 404 only for a user allowed to read that name).

Acting: the recover action additionally needs what Airflow's own "trigger DAG run" endpoint needs,
``is_authorized_dag(POST, RUN)`` on ``<pipeline>_recover`` (the link shows only for such users), only
for a completed checkpoint; the POST must come from a page of this server (its ``Origin``, else its
``Referer``, names this host: a page elsewhere cannot make a logged-in browser trigger a recovery),
and it is written to Airflow's audit log like a trigger from the UI.

Read-only otherwise: a GET never creates anything under the warehouse. The checkpoint store is read through
:func:`_read_only_store` (never ``DeltaCheckpointStore.open``, which creates the store's directory
and tables): a pipeline that never ran, or a warehouse that does not exist, shows an empty history
and answers 404 for a checkpoint. Pipeline names must be registered and well formed and ids are
parsed as numbers before any path is built; resolved paths are checked to stay inside the warehouse.
The app serves no OpenAPI schema or docs pages (they would bypass the user check).
"""

from __future__ import annotations

import html
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote, urlsplit

from fastapi import Depends, FastAPI, Form, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from airflow.api_fastapi.core_api.security import GetUserDep, get_user

from checkpoint_lib.control import PipelineControl, checkpoint_root, parse_checkpoint_id, validate_pipeline_name
from checkpoint_lib.core.errors import UnknownCheckpointError
from checkpoint_lib.core.types import MODES, CheckpointStatus
from checkpoint_lib.graph import to_svg
from checkpoint_lib.graph.details import COLUMNS as VERTEX_COLUMNS
from checkpoint_lib.graph.details import LEFT as VERTEX_TEXT_COLUMNS
from checkpoint_lib.graph.details import VertexDetails, checkpoint_details, display_rows
from checkpoint_lib.graph.render import sink_node
from checkpoint_lib.history import human_bytes
from checkpoint_lib.quality.report import CHART_CSS, DARK, LIGHT, charts_html, collect

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser

    from checkpoint_lib.delta.store import DeltaCheckpointStore

COLUMNS = [
    ("checkpoint_id", "id"), ("kind", "kind"), ("status", "status"), ("trigger_time", "triggered (UTC)"),
    ("duration_ms", "duration ms"), ("state_bytes", "state size"), ("channel_state_bytes", "channel-state size"),
    ("channel_state_rows", "channel-state rows"), ("alignment_ms", "alignment ms"), ("unaligned", "aligned?"),
    ("failure_reason", "failure reason"), ("message", "message"), ("requested_by", "requested by"),
]
ACK_COLUMNS = ["subtask", "state_size_bytes", "channel_state_rows", "channel_state_bytes", "alignment_ms",
               "unaligned", "duration_ms", "ack_time"]

DAG_KINDS = ("run", "snapshot", "recover")
"""The DAGs whose data the page shows (``<pipeline>_<kind>``; ``dag_factory.DAG_KINDS`` adds
``maintenance``, which writes nothing shown here)."""

app = FastAPI(title="checkpoint_lib: Checkpoints", dependencies=[Depends(get_user)],
              openapi_url=None, docs_url=None, redoc_url=None)


def _warehouse() -> str:
    from ckpt_airflow.hooks import resolve_warehouse

    try:
        return resolve_warehouse()
    except RuntimeError as exc:
        raise HTTPException(status_code=503, detail=str(exc)) from None


def _pipelines() -> list[str]:
    from checkpoint_lib.pipelines import names

    return names()


# --- who may read which pipeline ---------------------------------------------------------------


def pipeline_dag_ids(pipeline: str) -> list[str]:
    """``<pipeline>_run``, ``<pipeline>_snapshot``, ``<pipeline>_recover`` (a linear pipeline's and a
    dataflow graph's alike). A name that is not registered is asked for all three too: a user who
    may not read them gets the same 403 whether it exists or not."""
    return [f"{pipeline}_{kind}" for kind in DAG_KINDS]


def _is_registered_graph(pipeline: str) -> bool:
    from checkpoint_lib.pipelines import declared, is_graph, names

    if pipeline not in names():
        return False
    try:
        return is_graph(declared(pipeline))
    except Exception:  # a broken declaration: asked like a linear pipeline, shown as it can be
        return False


def _readable(user: "BaseUser", pipelines: list[str]) -> list[str]:
    """The ``pipelines`` whose every DAG the auth manager lets ``user`` read (GET), in order.

    Asked exactly as Airflow's own DAG endpoints ask (``requires_access_dag``): ``is_authorized_dag``
    with the DAG's id and its team (multi-team deployments), in one ``batch_is_authorized_dag`` per
    pipeline. A DAG that is not (yet) in the database is asked by its id with no team."""
    from airflow.api_fastapi.app import get_auth_manager

    if not pipelines:
        return []
    details = _dag_details([d for p in pipelines for d in pipeline_dag_ids(p)])
    auth_manager = get_auth_manager()
    return [
        p for p in pipelines
        if auth_manager.batch_is_authorized_dag(
            [{"method": "GET", "details": details[d]} for d in pipeline_dag_ids(p)], user=user,
        )
    ]


def _dag_details(dag_ids: list[str]) -> dict[str, Any]:
    """What the auth manager is asked about each DAG, as Airflow's own DAG endpoints ask: its id and
    its team (multi-team deployments; none for a DAG not in the database yet). One query for all."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
    from airflow.models.dag import DagModel

    teams = DagModel.get_dag_id_to_team_name_mapping(dag_ids)
    return {d: DagDetails(id=d, team_name=teams.get(d)) for d in dag_ids}


def can_read_pipeline(user: "BaseUser", pipeline: str) -> bool:
    """Whether ``user`` may see ``pipeline`` here: read access to all of its DAGs."""
    return _readable(user, [pipeline]) == [pipeline]


def recover_dag_id(pipeline: str) -> str:
    return f"{pipeline}_recover"


def can_trigger_recovery(user: "BaseUser", pipeline: str) -> bool:
    """Whether ``user`` may start ``<pipeline>_recover``: what Airflow's trigger endpoint asks
    (``requires_access_dag(method="POST", access_entity=DagAccessEntity.RUN)``)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity

    dag_id = recover_dag_id(pipeline)
    return get_auth_manager().is_authorized_dag(method="POST", access_entity=DagAccessEntity.RUN,
                                                details=_dag_details([dag_id])[dag_id], user=user)


def _pipeline(pipeline: str, user: "BaseUser") -> str:
    """``pipeline`` if well formed (else 400), readable by ``user`` (else 403, asked before the
    registry so the answer says nothing about pipelines the user may not read) and registered
    (else 404)."""
    try:
        validate_pipeline_name(pipeline)
    except ValueError as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    if not can_read_pipeline(user, pipeline):
        raise HTTPException(status_code=403, detail="Forbidden")
    if pipeline not in _pipelines():
        raise HTTPException(status_code=404, detail=f"unknown pipeline {pipeline!r}")
    return pipeline


# --- reading, never writing -------------------------------------------------------------------


def _read_only_store(root: Path) -> "DeltaCheckpointStore":
    """The pipeline's checkpoint store for reading only: the constructor does no I/O and its
    readers never create anything (a missing table reads as empty). Never
    ``DeltaCheckpointStore.open``: that creates the directory and every table, and a page view
    must not create a store (``tests/airflow/test_checkpoints_page.py`` checks every route)."""
    from checkpoint_lib.delta.store import DeltaCheckpointStore

    return DeltaCheckpointStore(root)


def _control(pipeline: str) -> PipelineControl:
    """A read-only :class:`PipelineControl` of an authorized, registered ``pipeline``."""
    warehouse = _warehouse()
    return PipelineControl(warehouse, pipeline, store=_read_only_store(checkpoint_root(warehouse, pipeline)))


def _checkpoint_id(value: str) -> int:
    try:
        cid = parse_checkpoint_id(value)
    except ValueError as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    if cid is None:
        raise HTTPException(status_code=400, detail="give a checkpoint number")
    return cid


def _history(control: PipelineControl, limit: int) -> list[dict[str, Any]]:
    """The history rows, each with who asked for it (``requested_by``) and, for a request of one
    of the pipeline's DAGs, the DAG run (``dag_run``: the request id is the run id)."""
    if not control.root.is_dir():
        return []  # never run (or no warehouse yet): an empty history
    requests = {r.checkpoint_id: r for r in control.requests.all() if r.checkpoint_id is not None}
    dags = set(pipeline_dag_ids(control.pipeline_name))
    rows = []
    for r in control.history(limit):
        row = {k: r.get(k) for k, _ in COLUMNS}
        request = requests.get(r.get("checkpoint_id"))
        row["requested_by"] = request.requested_by if request else None
        row["dag_run"] = request.request_id if request and request.requested_by in dags else None
        rows.append(row)
    return rows


def _all_acks(control: PipelineControl, cid: int) -> list[dict[str, Any]]:
    """Every field of checkpoint ``cid``'s acks (404: no such checkpoint)."""
    if not control.root.is_dir():
        raise HTTPException(status_code=404, detail=f"{control.pipeline_name} has no checkpoints yet")
    try:
        return control.acks(cid)
    except UnknownCheckpointError as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from None


def _acks(control: PipelineControl, cid: int) -> list[dict[str, Any]]:
    return _ack_rows(_all_acks(control, cid))


def _ack_rows(acks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The acks as the page and its JSON show them per subtask (:data:`ACK_COLUMNS`)."""
    return [{k: a.get(k) for k in ACK_COLUMNS} for a in acks]


def _graph(pipeline: str) -> tuple[Any, str | None]:
    """The job graph of a registered ``pipeline`` (a linear pipeline's two vertices, or its
    dataflow graph), or None and why it cannot be loaded (its module or declaration fails): the
    page then shows why, and the checkpoints per operator id."""
    from checkpoint_lib.pipelines import graph_or_why

    return graph_or_why(pipeline)


def _held_prepares(pipeline: str, graph: Any) -> str:
    """A warning when a PostgreSQL sink of ``pipeline`` has a prepared transaction held for long
    (its rows' locks stay until a run commits or rolls it back), or cannot be checked; else ''."""
    if graph is None:
        return ""
    from checkpoint_lib.pipeline import PostgresSink
    from checkpoint_lib.spark.postgres_sink import (PostgresConfigurationError, connection_uri, held_message,
                                                    held_prepares, where)

    connections = {s.spec.connection for s in graph.sinks if isinstance(s.spec, PostgresSink)}
    held, problems = [], []
    for name in sorted(connections):
        try:
            uri = connection_uri(name, "of this pipeline")
            held += held_prepares(uri, where(uri, name), pipelines=[pipeline])
        except PostgresConfigurationError as exc:
            problems.append(str(exc))
    lines = [f"PostgreSQL: {p}" for p in problems]
    if held:
        lines.append(held_message(held) + f". Run {pipeline}: its recovery commits what its checkpoint owns and "
                                          "rolls back the rest.")
    return "".join(f'<p class="warning">{html.escape(line)}</p>' for line in lines)


def _quality_dir(pipeline: str) -> Path:
    """The Data Docs this page serves: in the warehouse, or, for one on an object store, in this
    machine's GX working copy (checkpoint_lib.quality.paths.quality_root)."""
    from checkpoint_lib.quality.paths import quality_root

    return quality_root(_warehouse(), pipeline) / "data_docs"


# --- JSON --------------------------------------------------------------------------------------


@app.get("/api/pipelines")
def api_pipelines(user: GetUserDep) -> list[str]:
    """The registered pipelines this user may read."""
    return _readable(user, _pipelines())


@app.get("/api/{pipeline}/checkpoints")
def api_history(pipeline: str, user: GetUserDep, limit: int = Query(100, ge=1, le=1000)) -> list[dict[str, Any]]:
    return _history(_control(_pipeline(pipeline, user)), limit)


@app.get("/api/{pipeline}/checkpoints/{checkpoint_id}/acks")
def api_acks(pipeline: str, checkpoint_id: str, user: GetUserDep) -> list[dict[str, Any]]:
    control = _control(_pipeline(pipeline, user))
    return _acks(control, _checkpoint_id(checkpoint_id))


@app.get("/api/{pipeline}/checkpoints/{checkpoint_id}/vertices")
def api_vertices(pipeline: str, checkpoint_id: str, user: GetUserDep) -> list[dict[str, Any]]:
    """The checkpoint per vertex of the pipeline's graph: the ``vertices`` of ``ckpt checkpoints
    show -o json`` (:meth:`~checkpoint_lib.graph.details.VertexDetails.to_dict`)."""
    control = _control(_pipeline(pipeline, user))
    cid = _checkpoint_id(checkpoint_id)
    graph, _ = _graph(control.pipeline_name)
    return [v.to_dict() for v in checkpoint_details(graph, _all_acks(control, cid))]


# --- files of the data-quality report -------------------------------------------------------


@app.get("/quality/{pipeline}/{path:path}")
def quality_file(pipeline: str, path: str, user: GetUserDep) -> FileResponse:
    root = _quality_dir(_pipeline(pipeline, user))
    target = (root / (path or "index.html")).resolve()
    if not target.is_relative_to(root.resolve()) or not target.is_file():
        raise HTTPException(status_code=404, detail="no such file in the data-quality report")
    return FileResponse(target)


# --- the page --------------------------------------------------------------------------------


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return ""
    if key in ("trigger_time", "ack_time") and isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    if key == "unaligned":
        return "unaligned" if value else "aligned"
    if key.endswith("_bytes") and isinstance(value, (int, float)):
        return human_bytes(value)
    if isinstance(value, float):
        return f"{value:,.1f}"
    return html.escape(str(value))


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str]], links=None) -> str:
    """``links``: column -> (row -> (href, target) or None), for the cells that link somewhere."""
    if not rows:
        return "<p><em>none yet</em></p>"
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title in columns)
    body = []
    for r in rows:
        cells = []
        for key, _ in columns:
            text = _fmt(key, r.get(key))
            if links and key in links and (target := links[key](r)):
                href, frame = target
                text = f'<a href="{html.escape(href)}" target="{frame}">{text}</a>'
            cells.append(f'<td class="{html.escape(key)}">{text}</td>')
        body.append(f'<tr class="status-{html.escape(str(r.get("status", "")))}">{"".join(cells)}</tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


STYLE = f"""
:root{{{LIGHT} --bad:#fff5f5; --wait:#fffff0; --link:#2563eb}}
:root[data-theme=dark]{{{DARK} --bad:#3b2226; --wait:#3a3622; --link:#7aa2f7}}
@media (prefers-color-scheme: dark){{:root:not([data-theme=light]){{{DARK} --bad:#3b2226; --wait:#3a3622; --link:#7aa2f7}}}}
body{{font-family:system-ui,sans-serif;margin:1.5rem;color:var(--fg);background:var(--bg)}}
a{{color:var(--link)}}
table{{border-collapse:collapse;font-size:.9rem}}th,td{{border:1px solid var(--border);padding:.25rem .5rem;text-align:right}}
th{{background:var(--head)}}tr.status-aborted td{{background:var(--bad)}}tr.status-pending td{{background:var(--wait)}}
nav a{{margin-right:1rem}}.dags a{{margin-right:.75rem}}p.warning{{background:var(--bad);padding:.5rem}}
.graph{{overflow-x:auto;max-width:100%}}.jobgraph{{color:var(--axis)}}.jobgraph text{{fill:var(--fg)}}
.jobgraph text.label{{fill:var(--muted)}}.jobgraph g rect{{fill:var(--head);stroke:var(--border)}}
.jobgraph g.sink rect{{fill:var(--card)}}.jobgraph g.source rect{{stroke:var(--axis)}}
table.vertices td.left,table.vertices th.left{{text-align:left}}table.vertices tr.sink td.vertex{{padding-left:1.5rem}}
table.vertices tr.sink td{{color:var(--muted)}}
td.recover,td.state_bytes,td.channel_state_bytes,td.state_size_bytes,td.trigger_time{{white-space:nowrap}}
{CHART_CSS}
"""
# Airflow's UI marks its theme on its root element; the page, framed by it, takes the same. Unframed
# (or another origin), the browser's preference decides through the CSS above.
THEME_SCRIPT = """<script>try{if(window.parent!==window){var r=window.parent.document.documentElement;
var dark=r.classList.contains('dark')||r.getAttribute('data-theme')==='dark'||r.style.colorScheme==='dark';
document.documentElement.setAttribute('data-theme',dark?'dark':'light');}}catch(e){}</script>"""


def _charts(pipeline: str) -> str:
    """The HTML report's four charts of the pipeline's history (nothing before its first run)."""
    try:
        data = collect(pipeline, _warehouse())
    except FileNotFoundError:  # never ran here: no store, nothing to draw (and nothing is created)
        return ""
    return f'<div class="grid4">{charts_html(data)}</div>'


def _notes(vertices: list[VertexDetails]) -> dict[str, str]:
    """What a checkpoint's breakdown adds to the graph's boxes: subtasks acknowledged and state
    size per vertex, and per sink the transactions the checkpoint owns."""
    notes = {}
    for v in vertices:
        if not v.in_graph:
            continue
        acked = f"{v.figures.subtasks}/{v.parallelism} acked"
        notes[v.id] = f"{acked}, {human_bytes(v.figures.state_size_bytes)}" if v.kind != "source" else \
            f"{acked}, offset {v.offset}"
        for s in v.sinks:
            notes[sink_node(s)] = f"{s.figures.subtasks}/{s.parallelism} acked, owns {s.transactions} txn"
    return notes


def _graph_html(pipeline: str, graph: Any, problem: str | None, vertices: list[VertexDetails] | None) -> str:
    """The job graph, drawn (with the chosen checkpoint's figures in its boxes), or why it is not."""
    if graph is None:
        return f"<p><em>The job graph of {html.escape(pipeline)} cannot be drawn: {html.escape(problem or '')}</em></p>"
    return f'<div class="graph">{to_svg(graph, _notes(vertices) if vertices is not None else None)}</div>'


def _vertices_table(vertices: list[VertexDetails]) -> str:
    """The checkpoint per vertex (:func:`~checkpoint_lib.graph.details.display_rows`), each
    vertex's sinks under it."""
    if not vertices:
        return "<p><em>none yet</em></p>"
    head = "".join(f'<th class="{"left" if c in VERTEX_TEXT_COLUMNS else ""}">{html.escape(c)}</th>'
                   for c in VERTEX_COLUMNS)
    body = []
    for r in display_rows(vertices):
        cells = "".join(f'<td class="{"vertex " if c == "vertex" else ""}{"left" if c in VERTEX_TEXT_COLUMNS else ""}">'
                        f"{html.escape(r[c])}</td>" for c in VERTEX_COLUMNS)
        body.append(f'<tr class="{"sink" if r["level"] == "1" else "vertex"}">{cells}</tr>')
    return f'<table class="vertices"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def pipeline_of_dag(dag_id: str) -> str | None:
    """The registered pipeline ``dag_id`` is one of the DAGs of (``<pipeline>_<kind>``), or None."""
    from ckpt_airflow.dag_factory import DAG_KINDS as ALL_KINDS

    for p in _pipelines():
        if dag_id in (f"{p}_{kind}" for kind in ALL_KINDS):
            return p
    return None


@app.get("/", response_class=HTMLResponse)
def page(user: GetUserDep, pipeline: str | None = None, checkpoint: str | None = None,
         dag_id: str | None = Query(None, max_length=250)) -> str:
    foreign = None
    if dag_id and not pipeline:  # the tab on a DAG's page: that DAG's pipeline
        pipeline = pipeline_of_dag(dag_id)
        if pipeline is None:
            foreign = dag_id
    pipelines = _readable(user, _pipelines())
    if pipeline:
        pipeline = _pipeline(pipeline, user)
    elif foreign is None:  # the first this user may read
        pipeline = pipelines[0] if pipelines else None
    nav = "".join(f'<a href="?pipeline={p}">{p}</a>' for p in pipelines)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>Checkpoints</title>{THEME_SCRIPT}"
             f"<style>{STYLE}</style></head><body><h1>Checkpoints</h1><nav>{nav}</nav>"]
    if foreign is not None:
        parts.append(f"<p><em>{html.escape(foreign)} is not a DAG of a checkpoint_lib pipeline.</em></p>")
    elif pipeline is None:
        parts.append("<p><em>No pipeline whose DAGs you may read.</em></p>")
    else:
        control = _control(pipeline)
        parts.append(f"<h2>{html.escape(pipeline)}</h2>")
        dags = "".join(f'<a href="/dags/{html.escape(d)}" target="_top">{html.escape(d)}</a>'
                       for d in pipeline_dag_ids(pipeline))
        parts.append(f'<p class="dags">DAGs: {dags}</p>')
        graph, problem = _graph(pipeline)
        cid = _checkpoint_id(checkpoint) if checkpoint is not None else None
        acks = _all_acks(control, cid) if cid is not None else []
        vertices = checkpoint_details(graph, acks) if cid is not None else None  # per vertex of the graph
        parts.append(f"<h3>Job graph{f' at checkpoint {cid}' if cid is not None else ''}</h3>")
        parts.append(_held_prepares(pipeline, graph))
        parts.append(_graph_html(pipeline, graph, problem, vertices))
        parts.append(_charts(pipeline))
        docs = _quality_dir(pipeline) / "index.html"
        if docs.is_file():
            parts.append(f'<p><a href="quality/{pipeline}/index.html">Latest data-quality report</a></p>')
        else:
            parts.append("<p><em>No data-quality report yet.</em></p>")
        if cid is not None:
            parts.append(f"<h3>Checkpoint {cid} per vertex</h3>")
            parts.append(_vertices_table(vertices or []))
            parts.append(f"<h3>Checkpoint {cid}: acknowledgements per subtask</h3>")
            parts.append(_table(_ack_rows(acks), [(k, k.replace("_", " ")) for k in ACK_COLUMNS]))
        parts.append("<h3>History</h3>")
        history, columns = _history(control, 200), COLUMNS
        links = {
            "checkpoint_id": lambda r: (f"?pipeline={pipeline}&checkpoint={int(r['checkpoint_id'])}", "_self"),
            "requested_by": lambda r: (f"/dags/{r['requested_by']}/runs/{quote(r['dag_run'], safe=':+')}", "_top")
            if r.get("dag_run") else None,
        }
        if can_trigger_recovery(user, pipeline):
            for r in history:
                r["recover"] = "recover to this" if r.get("status") == CheckpointStatus.COMPLETED else None
            columns = [*COLUMNS, ("recover", "")]
            links["recover"] = lambda r: (f"recover/{pipeline}/{int(r['checkpoint_id'])}", "_self") \
                if r.get("recover") else None
        parts.append(_table(history, columns, links=links))
    parts.append("</body></html>")
    return "".join(parts)


# --- the one action: recover to a checkpoint -----------------------------------------------------


def _completed(control: PipelineControl, cid: int) -> dict[str, Any]:
    """The history row of completed checkpoint ``cid`` (404 if it is not one)."""
    row = control.store.checkpoints.status(cid) if control.root.is_dir() else None
    if row is None or row.get("status") != CheckpointStatus.COMPLETED:
        state = "unknown" if row is None else row.get("status")
        raise HTTPException(status_code=404, detail=f"checkpoint {cid} of {control.pipeline_name} is {state}, "
                                                    "not a completed checkpoint to recover to")
    return row


def _recover_target(pipeline: str, checkpoint_id: str, user: "BaseUser") -> tuple[PipelineControl, int, dict[str, Any]]:
    """The checks every recover route makes, in this order: readable pipeline (403/404), a user who
    may trigger its recover DAG (403), a number (400) naming a completed checkpoint (404)."""
    pipeline = _pipeline(pipeline, user)
    if not can_trigger_recovery(user, pipeline):
        raise HTTPException(status_code=403, detail="Forbidden")
    control = _control(pipeline)
    cid = _checkpoint_id(checkpoint_id)
    return control, cid, _completed(control, cid)


def _recover_dag(dag_id: str) -> Any:
    """The recover DAG as the scheduler will run it (its latest serialized version), or None."""
    from airflow.models.dagbag import DBDagBag
    from airflow.utils.session import create_session

    with create_session() as session:
        return DBDagBag().get_latest_version_of_dag(dag_id, session=session)


def _default_mode(dag: Any) -> str:
    try:
        mode = dag.params["mode"]
    except (KeyError, TypeError):
        mode = None
    return mode if mode in MODES else MODES[0]


def _takes_mode(dag: Any) -> bool:
    """Whether the recover DAG takes a barrier mode (a linear pipeline's does)."""
    try:
        return "mode" in dag.params
    except TypeError:
        return False


def _same_origin(request: Request) -> bool:
    """Whether the browser says this request comes from a page of this server: ``Origin`` (every
    browser sends it on a form POST), else ``Referer``; neither is refused."""
    host = request.headers.get("x-forwarded-host") or request.headers.get("host")
    for header in ("origin", "referer"):
        value = request.headers.get(header)
        if value:
            return bool(host) and urlsplit(value).netloc == host
    return False


@app.get("/recover/{pipeline}/{checkpoint_id}", response_class=HTMLResponse)
def recover_form(pipeline: str, checkpoint_id: str, user: GetUserDep) -> str:
    control, cid, row = _recover_target(pipeline, checkpoint_id, user)
    pipeline, dag_id = control.pipeline_name, recover_dag_id(control.pipeline_name)
    dag = _recover_dag(dag_id)
    when = _fmt("trigger_time", row.get("trigger_time"))
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>Recover {html.escape(pipeline)}</title>"
             f"{THEME_SCRIPT}<style>{STYLE}</style></head><body>",
             f"<p><a href='../../?pipeline={pipeline}'>← Checkpoints of {html.escape(pipeline)}</a></p>",
             f"<h1>Recover {html.escape(pipeline)} to checkpoint {cid}</h1>",
             f"<p>Checkpoint {cid} completed in epoch {html.escape(str(row.get('epoch')))}"
             f"{f', triggered {when} UTC' if when else ''}.</p>"]
    if dag is None:
        parts.append(f"<p><strong>{dag_id} is not in Airflow yet</strong> (the dag-processor has not parsed the "
                     "DAGs folder): nothing can be triggered.</p></body></html>")
        return "".join(parts)
    if not _takes_mode(dag):  # a dataflow graph's recover DAG: every edge chained, no barrier mode
        parts.append(
            f"<p>This starts a run of <a href='/dags/{dag_id}' target='_top'>{dag_id}</a> with checkpoint id {cid}. "
            "It pauses the graph's DAGs, starts a new epoch that restores every operator's state of checkpoint "
            f"{cid}, commits what the checkpoint's sinks pre-committed and aborts what later attempts left, replays "
            "every source from the checkpoint's offsets and unpauses the DAGs.</p>"
            "<form method='post' target='_top'>"
            "<p><label><input type='checkbox' name='dry_run' value='true'> Dry run: only print the recovery plan "
            "(in the run's log)</label></p>"
            f"<p><button type='submit'>Recover {html.escape(pipeline)} to checkpoint {cid}</button></p></form>"
            "</body></html>")
        return "".join(parts)
    default = _default_mode(dag)
    options = "".join(f"<option{' selected' if m == default else ''}>{m}</option>" for m in MODES)
    parts.append(
        f"<p>This starts a run of <a href='/dags/{dag_id}' target='_top'>{dag_id}</a> with checkpoint id {cid}. "
        "It pauses the pipeline's DAGs, starts a new epoch that restores the operators' state and channel state "
        f"of checkpoint {cid}, commits what the checkpoint's sinks pre-committed and aborts what later "
        "attempts left, replays the sources from the checkpoint's offsets, validates the outputs (Great "
        "Expectations) and unpauses the DAGs. Output committed after the checkpoint is not undone: a replay "
        "reproduces it exactly once.</p>"
        f"<form method='post' target='_top'><p><label>Barrier mode after recovery "
        f"<select name='mode'>{options}</select></label></p>"
        "<p><label><input type='checkbox' name='dry_run' value='true'> Dry run: only print the recovery plan "
        "(in the run's log)</label></p>"
        f"<p><button type='submit'>Recover {html.escape(pipeline)} to checkpoint {cid}</button></p></form>"
        "</body></html>")
    return "".join(parts)


@app.post("/recover/{pipeline}/{checkpoint_id}")
def recover(pipeline: str, checkpoint_id: str, request: Request, user: GetUserDep,
            mode: Annotated[str, Form()] = "", dry_run: Annotated[str, Form()] = "false") -> RedirectResponse:
    """Trigger ``<pipeline>_recover`` for this checkpoint; 303 to the new DAG run in Airflow's UI."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.exceptions import DagNotFound, DagRunAlreadyExists
    from airflow.models.log import Log
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunTriggeredByType

    if not _same_origin(request):
        raise HTTPException(status_code=403, detail="a recovery is started from the Checkpoints page of this server")
    control, cid, _ = _recover_target(pipeline, checkpoint_id, user)
    dag_id = recover_dag_id(control.pipeline_name)
    if mode and mode not in MODES:
        raise HTTPException(status_code=400, detail=f"mode must be one of {', '.join(MODES)}")
    if dry_run not in ("true", "false"):
        raise HTTPException(status_code=400, detail="dry_run must be true or false")
    conf: dict[str, Any] = {"checkpoint_id": str(cid), "dry_run": dry_run == "true"}
    if mode and _is_registered_graph(control.pipeline_name):
        raise HTTPException(status_code=400, detail=f"{control.pipeline_name} is a dataflow graph: its recovery takes "
                                                    "no barrier mode (every checkpoint of a graph is aligned)")
    if mode:
        conf["mode"] = mode
    try:
        with create_session() as session:
            run = trigger_dag(dag_id, triggered_by=DagRunTriggeredByType.UI, triggering_user_name=user.get_name(),
                              conf=conf, note=f"Checkpoints page: recover to checkpoint {cid}", session=session)
            if run is None:
                raise DagNotFound(dag_id)
            run_id = run.run_id
            session.add(Log(event="checkpoints_page_recover", owner=user.get_name(),
                            owner_display_name=user.get_name(), dag_id=dag_id, run_id=run_id,
                            extra=json.dumps({"method": "POST", **conf})))
    except DagNotFound:
        raise HTTPException(status_code=404, detail=f"{dag_id} is not in Airflow yet (the dag-processor has "
                                                    "not parsed it)") from None
    except DagRunAlreadyExists as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from None
    except ValueError as exc:  # a conf the DAG's params refuse, or manual runs not allowed
        raise HTTPException(status_code=400, detail=str(exc)) from None
    return RedirectResponse(f"/dags/{dag_id}/runs/{quote(run_id, safe=':+')}", status_code=303)

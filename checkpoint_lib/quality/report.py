"""``ckpt report``: one self-contained HTML file per pipeline (inline SVG, no scripts, no CDN).

What it shows, all read from the warehouse's metadata (delta-rs, no Spark, no GX):

- the checkpoint history as four charts (duration, state size, channel-state size, alignment time
  per checkpoint id), with every recovery marked by a dashed line labelled with its epoch and the
  checkpoint it restored, and aborted checkpoints as red marks on the axis;
- the latest validation results (``validations`` table) per kind, with their summaries;
- the restore log: one row per epoch (when, why, what it restored, the source offset and the rows
  the after-restore validation counted).
"""

from __future__ import annotations

import html
import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from ..core.acks import SourceAckState
from ..core.types import CheckpointStatus
from ..files import files_at
from ..layout import control_table, location
from .paths import check_pipeline_name, checkpoint_root, data_docs_index, report_path, warehouse_root
from .records import ValidationLog

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 560, 220, 64, 16, 28, 36


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _when(ts: float | None) -> str:
    return "" if not ts else datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _fmt(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v / 1e6:.1f}M"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.1f}k"
    if v == int(v):
        return f"{v:.0f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def svg_chart(title: str, unit: str, points: Sequence[tuple[int, float]], markers: Sequence[tuple[float, str]] = (),
              aborted: Sequence[int] = ()) -> str:
    """A line chart of ``points`` (checkpoint id, value) with vertical ``markers`` (x, label).
    Each point is a ``<circle class="pt">`` (tests count them); empty data says so in the chart."""
    xs = [p[0] for p in points] + [m[0] for m in markers] + list(aborted)
    x0, x1 = (min(xs), max(xs)) if xs else (0, 1)
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    y1 = max([p[1] for p in points] + [0]) or 1.0
    y1 *= 1.1
    sx = lambda x: PAD_L + (x - x0) * (W - PAD_L - PAD_R) / (x1 - x0)  # noqa: E731
    sy = lambda y: H - PAD_B - y * (H - PAD_T - PAD_B) / y1  # noqa: E731
    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" aria-label="{_esc(title)}">',
           f'<text x="{PAD_L}" y="16" class="title">{_esc(title)} ({_esc(unit)})</text>',
           f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}" class="axis"/>',
           f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{H - PAD_B}" class="axis"/>']
    for frac in (0.0, 0.5, 1.0):
        y = y1 / 1.1 * frac
        out.append(f'<text x="{PAD_L - 6}" y="{sy(y) + 4:.1f}" class="tick" text-anchor="end">{_fmt(y)}</text>')
        out.append(f'<line x1="{PAD_L}" y1="{sy(y):.1f}" x2="{W - PAD_R}" y2="{sy(y):.1f}" class="grid"/>')
    ticks = sorted({p[0] for p in points})
    step = max(1, len(ticks) // 10)
    for x in ticks[::step]:
        out.append(f'<text x="{sx(x):.1f}" y="{H - PAD_B + 14}" class="tick" text-anchor="middle">{x}</text>')
    out.append(f'<text x="{(W + PAD_L) / 2:.0f}" y="{H - 4}" class="tick" text-anchor="middle">checkpoint id</text>')
    for x, label in markers:
        right = sx(x) > W * 0.6  # keep the label inside the chart
        lx, anchor = (sx(x) - 3, "end") if right else (sx(x) + 3, "start")
        out.append(f'<line x1="{sx(x):.1f}" y1="{PAD_T}" x2="{sx(x):.1f}" y2="{H - PAD_B}" class="recovery"/>'
                   f'<text x="{lx:.1f}" y="{PAD_T + 10}" class="recovery-label" text-anchor="{anchor}">{_esc(label)}</text>')
    for x in aborted:
        out.append(f'<path class="aborted" d="M{sx(x) - 4:.1f},{H - PAD_B - 4} l8,8 m0,-8 l-8,8"><title>checkpoint {x} aborted</title></path>')
    if points:
        path = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(points))
        out.append(f'<path d="{path}" class="line"/>')
        for x, y in points:
            out.append(f'<circle class="pt" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5"><title>checkpoint {x}: {_fmt(y)} {_esc(unit)}</title></circle>')
    else:
        out.append(f'<text x="{W / 2:.0f}" y="{H / 2:.0f}" class="empty" text-anchor="middle">no completed checkpoints</text>')
    out.append("</svg>")
    return "".join(out)


def collect(pipeline_name: str, warehouse: str) -> dict[str, Any]:
    """Everything the report shows, as plain data (tests and other pages can reuse it)."""
    from ..delta.sessions import RESTORED
    from ..delta.store import DeltaCheckpointStore
    from ..history import with_durations

    check_pipeline_name(pipeline_name)
    root = warehouse_root(warehouse)
    croot = checkpoint_root(root, pipeline_name)
    if not files_at(croot).is_dir(control_table(croot, "checkpoints")):
        raise FileNotFoundError(f"pipeline {pipeline_name!r} has no checkpoint store in {root} (run it first)")
    store = DeltaCheckpointStore(croot)
    history = sorted(with_durations(store.checkpoints.history()), key=lambda r: r["checkpoint_id"])
    completed = [r for r in history if r["status"] in (CheckpointStatus.COMPLETED, CheckpointStatus.DISCARDED)
                 and r.get("completion_time")]
    validations = ValidationLog(croot).rows()
    restores = []
    for e in sorted(store.epochs.all(), key=lambda e: e["epoch"]):
        restored = [r for r in store.sessions.of_epoch(e["epoch"]) if r["event"] == RESTORED]
        cid = restored[0]["checkpoint_id"] if restored else None
        offset = None
        if cid is not None:
            try:
                offset = next((SourceAckState.from_state(a["state"]).version
                               for a in store.checkpoints.acks(cid) if a["operator"] == "source"), None)
            except Exception:  # an unknown id: show the row without the offset
                offset = None
        check = next((v for v in validations if v["kind"] == "restore" and v["epoch"] == e["epoch"]), None)
        metrics = json.loads(check["details_json"]).get("metrics", {}) if check and check.get("details_json") else {}
        restores.append({
            "epoch": e["epoch"], "started_at": e["started_at"], "reason": e["reason"], "owner": e["owner"],
            "finished": bool(restored), "restored_checkpoint": cid, "source_offset": offset,
            "restored_state_keys": metrics.get("restored_state_keys"), "valid_rows": metrics.get("valid_rows"),
            "dead_letters": metrics.get("dead_letters"), "sink_rows": metrics.get("sink_rows"),
            "validation": check["status"] if check else None,
        })
    return {"pipeline": pipeline_name, "warehouse": str(root), "history": history, "completed": completed,
            "validations": validations, "restores": restores,
            "data_docs": str(data_docs_index(root, pipeline_name)), "generated_at": datetime.now(timezone.utc).timestamp()}


CHART_CSS = f"""
.grid4 {{ display: grid; grid-template-columns: repeat(auto-fill, {W + 2}px); gap: 12px; }}
.card {{ border: 1px solid var(--border); border-radius: 6px; background: var(--card); }}
svg .title {{ font-weight: 600; font-size: 13px; fill: var(--fg); }} svg .tick {{ font-size: 10px; fill: var(--muted); }}
svg .axis {{ stroke: var(--axis); }} svg .grid {{ stroke: var(--gridline); }}
svg .line {{ fill: none; stroke: #2563eb; stroke-width: 2; }} svg .pt {{ fill: #2563eb; }}
svg .recovery {{ stroke: #d97706; stroke-width: 2; stroke-dasharray: 5 3; }}
svg .recovery-label {{ font-size: 10px; fill: #b45309; }} svg .aborted {{ stroke: #dc2626; stroke-width: 2; }}
svg .empty {{ fill: #9aa5b1; }}
"""
"""The charts' look, from CSS variables a page sets for its light or dark theme (:data:`LIGHT`)."""
LIGHT = "--fg: #1d2733; --muted: #5a6878; --bg: #fff; --card: #fbfcfe; --border: #d5dde6; --axis: #7a8898; --gridline: #e6ebf0; --head: #eef2f6;"
DARK = "--fg: #e2e8f0; --muted: #a0aec0; --bg: #1a202c; --card: #222b3a; --border: #3b475a; --axis: #718096; --gridline: #2d3748; --head: #2d3748;"


def charts_html(data: dict[str, Any]) -> str:
    """The four history charts of :func:`collect`'s data (duration, state size, channel-state
    size, alignment), with a marker at every recovery and a cross at every aborted checkpoint."""
    done = data["completed"]
    aborted = [r["checkpoint_id"] for r in data["history"] if r["status"] == CheckpointStatus.ABORTED]
    markers = []
    for r in data["restores"]:
        if r["epoch"] == 1 and r["restored_checkpoint"] is None:
            continue  # the first start, not a recovery
        # The first checkpoint triggered after the recovery began (row epochs are no guide:
        # retention's "discarded" rows carry the epoch that discarded them).
        later = [c["checkpoint_id"] for c in done if c["trigger_time"] >= r["started_at"]]
        x = (min(later) - 0.5) if later else ((r["restored_checkpoint"] or 0) + 0.5)
        markers.append((x, f"recovery: epoch {r['epoch']} restored {r['restored_checkpoint'] or 'nothing'}"))
    series = [
        ("Checkpoint duration", "ms", [(c["checkpoint_id"], float(c["duration_ms"] or 0)) for c in done]),
        ("State size", "bytes", [(c["checkpoint_id"], float(c["state_bytes"] or 0)) for c in done]),
        ("Channel-state size", "bytes", [(c["checkpoint_id"], float(c["channel_state_bytes"] or 0)) for c in done]),
        ("Alignment time", "ms", [(c["checkpoint_id"], float(c["alignment_ms"] or 0)) for c in done]),
    ]
    return "".join(f'<div class="card">{svg_chart(t, u, p, markers, aborted)}</div>' for t, u, p in series)


def render(data: dict[str, Any]) -> str:
    """The report's HTML (self-contained: inline CSS and SVG, no script)."""
    done = data["completed"]
    aborted = [r["checkpoint_id"] for r in data["history"] if r["status"] == CheckpointStatus.ABORTED]
    charts = charts_html(data)

    latest: dict[str, dict[str, Any]] = {}
    for v in data["validations"]:
        latest.setdefault(v["kind"], v)
    val_rows = "".join(
        f'<tr class="{_esc(v["status"])}"><td>{_esc(v["kind"])}</td><td>{_esc(v["checkpoint_id"])}</td><td>{_esc(v["epoch"])}</td>'
        f'<td class="status">{_esc(v["status"].upper())}</td><td>{v["evaluated"] - v["failed"]}/{v["evaluated"]}</td>'
        f'<td>{_esc(_when(v["finished_at"]))}</td><td><pre>{_esc(v["summary"])}</pre></td></tr>'
        for v in latest.values()
    ) or '<tr><td colspan="7">no validation has run yet (ckpt validate)</td></tr>'
    all_rows = "".join(
        f'<tr class="{_esc(v["status"])}"><td>{_esc(_when(v["finished_at"]))}</td><td>{_esc(v["kind"])}</td>'
        f'<td>{_esc(v["checkpoint_id"])}</td><td>{_esc(v["epoch"])}</td><td class="status">{_esc(v["status"])}</td>'
        f'<td>{_esc(v["run_name"])}</td></tr>'
        for v in data["validations"][:30]
    )
    restore_rows = "".join(
        f'<tr><td>{r["epoch"]}</td><td>{_esc(_when(r["started_at"]))}</td><td>{_esc(r["reason"])}</td>'
        f'<td>{_esc(r["restored_checkpoint"] if r["restored_checkpoint"] is not None else ("nothing" if r["finished"] else "unfinished"))}</td>'
        f'<td>{_esc(r["source_offset"])}</td><td>{_esc(r["restored_state_keys"])}</td><td>{_esc(r["valid_rows"])}</td>'
        f'<td>{_esc(r["dead_letters"])}</td><td>{_esc(r["sink_rows"])}</td><td class="status {_esc(r["validation"] or "")}">{_esc(r["validation"] or "-")}</td></tr>'
        for r in reversed(data["restores"])
    )
    hist_rows = "".join(
        f'<tr class="{_esc(r["status"])}"><td>{r["checkpoint_id"]}</td><td>{_esc(r["kind"])}</td><td>{_esc(r["status"])}</td>'
        f'<td>{r["epoch"]}</td><td>{_esc(r.get("duration_ms"))}</td><td>{_esc(r["state_bytes"])}</td>'
        f'<td>{_esc(r["channel_state_bytes"])}</td><td>{_esc(round(r["alignment_ms"] or 0, 1))}</td><td>{_esc(r["failure_reason"] or "")}</td></tr>'
        for r in reversed(data["history"][-40:])
    )
    crashes = sum(1 for r in data["restores"] if r["epoch"] > 1 or r["restored_checkpoint"] is not None)
    docs = location(data["data_docs"])
    if not files_at(docs).exists(docs):
        docs_link = f"{_esc(docs)} (not built yet: run ckpt validate)"
    elif isinstance(docs, Path):
        docs_link = f'<a href="{_esc(docs.as_uri())}">{_esc(docs)}</a>'
    else:  # on an object store: the URI, for a browser behind the store's own website or console
        docs_link = f"<code>{_esc(docs)}</code>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(data["pipeline"])}: checkpoints and data quality</title>
<style>
:root {{ {LIGHT} }}
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: var(--fg); background: var(--bg); }}
h1 {{ font-size: 22px; margin: 0 0 4px; }} h2 {{ font-size: 17px; margin: 24px 0 8px; }}
.meta {{ color: var(--muted); }} .grid4 {{ max-width: {2 * W + 16}px; }}
{CHART_CSS}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid var(--border); padding: 3px 8px; text-align: left; vertical-align: top; }}
th {{ background: var(--head); }} pre {{ margin: 0; font-size: 12px; white-space: pre-wrap; max-width: 640px; }}
tr.passed .status, .status.passed {{ color: #15803d; font-weight: 600; }}
tr.failed .status, tr.error .status, .status.failed, .status.error {{ color: #b91c1c; font-weight: 600; }}
tr.aborted td {{ color: #b91c1c; }}
</style></head><body>
<h1>Pipeline <code>{_esc(data["pipeline"])}</code>: checkpoints and data quality</h1>
<div class="meta">warehouse {_esc(data["warehouse"])} &middot; generated {_esc(_when(data["generated_at"]))} &middot;
{len(done)} completed checkpoints, {len(aborted)} aborted, {crashes} recover{"y" if crashes == 1 else "ies"} &middot; Great Expectations Data Docs: {docs_link}</div>
<h2>Checkpoint history</h2>
<div class="grid4">{charts}</div>
<h2>Latest validation results</h2>
<table><tr><th>suite</th><th>checkpoint</th><th>epoch</th><th>status</th><th>passed</th><th>when</th><th>summary</th></tr>{val_rows}</table>
<h2>Restore log</h2>
<table><tr><th>epoch</th><th>started</th><th>reason</th><th>restored checkpoint</th><th>source offset (landing version)</th>
<th>restored state keys</th><th>valid rows</th><th>dead letters</th><th>sink rows</th><th>after-restore validation</th></tr>{restore_rows}</table>
<h2>Checkpoints</h2>
<table><tr><th>id</th><th>kind</th><th>status</th><th>epoch</th><th>duration ms</th><th>state bytes</th><th>channel-state bytes</th>
<th>alignment ms</th><th>failure</th></tr>{hist_rows}</table>
<h2>Validation runs</h2>
<table><tr><th>when</th><th>suite</th><th>checkpoint</th><th>epoch</th><th>status</th><th>GX run name</th></tr>{all_rows}</table>
</body></html>
"""


def write_report(pipeline_name: str, warehouse: str, out: str | os.PathLike | None = None) -> Path:
    """Render the report to ``out`` (default ``W/_quality/<pipeline>/report.html``) atomically
    (a temporary file renamed over the target); returns the path."""
    data = collect(pipeline_name, warehouse)
    target = Path(out).expanduser().resolve() if out else report_path(warehouse, pipeline_name)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(render(data))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target

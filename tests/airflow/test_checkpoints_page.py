"""The Checkpoints page and its JSON API (``plugins/ckpt_airflow/ui.py``) through the real api-server
app: Airflow's ``create_app()`` mounts the plugin at ``/checkpoints`` as ``airflow api-server`` does,
users log in at ``/auth/token`` (SimpleAuthManager, users and roles from the config, passwords from
a file) and every request carries the token Airflow issued (a bearer header, or the UI's cookie).
Nothing about authentication or authorization is overridden: what a user sees is what the
configured auth manager says about the pipeline's DAGs.

The rule under test: a user sees pipeline P only with read access to every one of ``P_run``,
``P_snapshot`` and ``P_recover``; any other pipeline answers 403 with no data, whether it is
registered or not. And no GET creates anything under the warehouse.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

from checkpoint_lib.checkpoint_requests import CheckpointRequests
from checkpoint_lib.control import PipelineControl
from checkpoint_lib.delta.store import DeltaCheckpointStore
from checkpoint_lib.pipelines import names
from browser import screenshot
from helpers import AIRFLOW
from history import synthetic_history
from synthetic_warehouse import synthetic_graph_warehouse, synthetic_warehouse

SIMPLE = f"{SimpleAuthManager.__module__}.SimpleAuthManager"
TOKEN_COOKIE = "_token"  # airflow.api_fastapi.auth.managers.base_auth_manager.COOKIE_NAME_JWT_TOKEN


class PerDagAuthManager(SimpleAuthManager):
    """SimpleAuthManager with per-DAG read grants for the users in ``GRANTS`` (SimpleAuthManager's
    roles are all-or-nothing over DAGs, so they cannot tell "some DAGs of a pipeline" from "all")."""

    GRANTS = {
        "payments_reader": {"payments_run", "payments_snapshot", "payments_recover"},
        "payments_run_reader": {"payments_run", "payments_snapshot"},  # not payments_recover
        "enrichment_reader": {"enrichment_run", "enrichment_snapshot", "enrichment_recover"},
        "enrichment_run_reader": {"enrichment_run", "enrichment_snapshot"},  # not enrichment_recover
    }

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        if user.username in self.GRANTS:
            return method == "GET" and details is not None and details.id in self.GRANTS[user.username]
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)


@pytest.fixture(scope="module")
def migrated_db():
    """This session's AIRFLOW_HOME (tests/airflow/conftest.py) with its SQLite database migrated:
    the api-server checks every token against the revoked-token table."""
    if not Path(os.environ["AIRFLOW_HOME"]).name.startswith("ckpt-airflow-home-"):
        pytest.skip("AIRFLOW_HOME is set outside the tests: not migrating a database the tests do not own")
    subprocess.run([AIRFLOW, "db", "migrate"], env=dict(os.environ), check=True, capture_output=True, timeout=300)


class Api:
    """The api-server app with a token per user."""

    def __init__(self, client: TestClient, passwords: dict[str, str]):
        self.client = client
        self.tokens: dict[str, str] = {}
        for user, password in passwords.items():
            r = client.post("/auth/token", json={"username": user, "password": password})
            assert r.status_code == 201, r.text
            self.tokens[user] = r.json()["access_token"]

    def get(self, user: str | None, path: str, *, cookie: bool = False):
        if user is None:
            return self.client.get(path)
        if cookie:
            self.client.cookies.set(TOKEN_COOKIE, self.tokens[user])
            try:
                return self.client.get(path)
            finally:
                self.client.cookies.clear()
        return self.client.get(path, headers={"Authorization": f"Bearer {self.tokens[user]}"})


@contextmanager
def api_server(tmp_path: Path, users: dict[str, str], auth_manager: str = SIMPLE):
    """``users``: name -> role ("" = no role: the user logs in but may read nothing)."""
    from airflow.api_fastapi.app import create_app, purge_cached_app

    passwords = {user: secrets.token_hex(8) for user in users}
    (tmp_path / "passwords.json").write_text(json.dumps(passwords))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW__CORE__AUTH_MANAGER", auth_manager)
        mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", ",".join(f"{u}:{r}" for u, r in users.items()))
        mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(tmp_path / "passwords.json"))
        mp.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
        mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", secrets.token_hex(32))
        purge_cached_app()  # a fresh auth manager of this class and config
        try:
            yield Api(TestClient(create_app(apps="core")), passwords)
        finally:
            purge_cached_app()


def _store_with_a_checkpoint(warehouse: Path) -> int:
    store = PipelineControl(warehouse, "payments").store
    store.epochs.begin()
    cid = store.ids.get_and_increment()
    store.checkpoints.record_pending(cid, trigger_time=1.0, epoch=1)
    docs = warehouse / "_quality" / "payments" / "data_docs"
    docs.mkdir(parents=True)
    (docs / "index.html").write_text("<h1>GX of payments</h1>")
    return cid


def test_only_users_who_may_read_a_pipelines_dags_see_it(tmp_path, monkeypatch, migrated_db):
    warehouse = tmp_path / "warehouse"
    cid = _store_with_a_checkpoint(warehouse)
    monkeypatch.setenv("CKPT_WAREHOUSE", str(warehouse))
    data_routes = ["/checkpoints/?pipeline=payments", f"/checkpoints/?pipeline=payments&checkpoint={cid}",
                   "/checkpoints/api/payments/checkpoints", f"/checkpoints/api/payments/checkpoints/{cid}/acks",
                   "/checkpoints/quality/payments/index.html"]
    with api_server(tmp_path, {"admin": "admin", "viewer": "viewer", "nobody": ""}) as api:
        for path in ["/checkpoints/", "/checkpoints/api/pipelines", *data_routes]:
            assert api.get(None, path).status_code == 401, path
        # Airflow itself agrees on who may read the DAGs (the DAGs need not be parsed for that)
        assert api.get("nobody", "/api/v2/dags/payments_run").status_code == 403
        assert api.get("viewer", "/api/v2/dags/payments_run").status_code == 404

        for user in ("admin", "viewer"):
            # every registered name (a graph's too: its history reads the same control tables)
            assert api.get(user, "/checkpoints/api/pipelines").json() == names()
            assert {"orders", "payments", "transfers"} <= set(names())
            page = api.get(user, "/checkpoints/")
            assert page.status_code == 200 and 'href="?pipeline=transfers"' in page.text
            page = api.get(user, "/checkpoints/?pipeline=payments")
            assert f">{cid}<" in page.text and "data-quality report" in page.text
            assert api.get(user, "/checkpoints/api/payments/checkpoints").json()[0]["checkpoint_id"] == cid
            assert api.get(user, f"/checkpoints/api/payments/checkpoints/{cid}/acks").json() == []  # pending: none yet
            assert api.get(user, "/checkpoints/quality/payments/index.html").text == "<h1>GX of payments</h1>"
            assert api.get(user, "/checkpoints/api/transfers/checkpoints").json() == []
            assert api.get(user, "/checkpoints/api/nope/checkpoints").status_code == 404  # allowed to ask: unknown
        assert api.get("admin", "/checkpoints/?pipeline=payments", cookie=True).status_code == 200

        # a user with no DAG access: an empty index, and 403 with no data for every pipeline
        assert api.get("nobody", "/checkpoints/api/pipelines").json() == []
        page = api.get("nobody", "/checkpoints/")
        assert page.status_code == 200 and "payments" not in page.text and "transfers" not in page.text
        assert "No pipeline whose DAGs you may read" in page.text
        for path in [*data_routes, "/checkpoints/api/transfers/checkpoints", "/checkpoints/?pipeline=transfers",
                     "/checkpoints/api/nope/checkpoints", "/checkpoints/?pipeline=nope"]:
            for cookie in (False, True):
                r = api.get("nobody", path, cookie=cookie)
                assert r.status_code == 403, (path, cookie, r.status_code)
                assert r.json() == {"detail": "Forbidden"}, path  # nothing of the pipeline, not even whether it exists


def test_a_pipeline_a_users_package_registers_shows_with_no_edit_to_checkpoint_lib(tmp_path, monkeypatch,
                                                                                    migrated_db):
    """The page lists what the registry finds: here the entry point a user's installed package
    (tests/fixtures/userpkg) declares, and its checkpoint history shows like a built-in's."""
    from importlib.metadata import EntryPoint

    from checkpoint_lib import pipelines

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "fixtures" / "userpkg"))
    registered = pipelines._registered()
    monkeypatch.setattr(pipelines, "_registered", lambda: {
        **registered, "visits": EntryPoint("visits", "userpkg.flows:visits", pipelines.GROUP)})
    warehouse = tmp_path / "warehouse"
    store = PipelineControl(warehouse, "visits").store
    store.epochs.begin()
    cid = store.ids.get_and_increment()
    store.checkpoints.record_pending(cid, trigger_time=1.0, epoch=1)
    monkeypatch.setenv("CKPT_WAREHOUSE", str(warehouse))
    with api_server(tmp_path, {"admin": "admin"}) as api:
        assert "visits" in api.get("admin", "/checkpoints/api/pipelines").json()
        assert 'href="?pipeline=visits"' in api.get("admin", "/checkpoints/").text
        assert api.get("admin", "/checkpoints/api/visits/checkpoints").json()[0]["checkpoint_id"] == cid


def test_a_pipeline_needs_read_access_to_every_one_of_its_dags(tmp_path, monkeypatch, migrated_db):
    warehouse = tmp_path / "warehouse"
    cid = _store_with_a_checkpoint(warehouse)
    monkeypatch.setenv("CKPT_WAREHOUSE", str(warehouse))
    users = {"payments_reader": "viewer", "payments_run_reader": "viewer", "admin": "admin"}
    with api_server(tmp_path, users, f"{__name__}.PerDagAuthManager") as api:
        assert api.get("admin", "/checkpoints/api/pipelines").json() == names()

        assert api.get("payments_reader", "/checkpoints/api/pipelines").json() == ["payments"]
        page = api.get("payments_reader", "/checkpoints/")
        assert page.status_code == 200 and f">{cid}<" in page.text and "transfers" not in page.text
        assert api.get("payments_reader", "/checkpoints/api/payments/checkpoints").json()[0]["checkpoint_id"] == cid
        assert api.get("payments_reader", "/checkpoints/quality/payments/index.html").status_code == 200
        for path in ("/checkpoints/api/transfers/checkpoints", "/checkpoints/?pipeline=transfers"):
            assert api.get("payments_reader", path).status_code == 403, path

        # reading payments_run and payments_snapshot but not payments_recover is not enough
        assert api.get("payments_run_reader", "/checkpoints/api/pipelines").json() == []
        for path in ("/checkpoints/api/payments/checkpoints", f"/checkpoints/api/payments/checkpoints/{cid}/acks",
                     "/checkpoints/?pipeline=payments", "/checkpoints/quality/payments/index.html"):
            assert api.get("payments_run_reader", path).status_code == 403, path


def test_the_page_draws_the_history_and_follows_airflows_theme(tmp_path, monkeypatch, migrated_db):
    """The report's charts on the page (every completed checkpoint a point, the recovery a marker,
    the aborted checkpoint a cross), links to the pipeline's DAGs in the main window, and the page
    as a user sees it in headless Chromium in Airflow's light and dark themes."""
    warehouse = synthetic_history(tmp_path / "warehouse")
    requests = CheckpointRequests(warehouse / "_checkpoints" / "payments")
    run_id = "scheduled__2026-09-21T14:00:00+00:00"  # the snapshot DAG's run that asked for checkpoint 5
    requests.honour([requests.create(run_id, "payments_snapshot")[0]], 5, 2)
    requests.honour([requests.create("savepoint-1", "ckpt savepoint")[0]], 6, 2)
    monkeypatch.setenv("CKPT_WAREHOUSE", str(warehouse))
    with api_server(tmp_path, {"viewer": "viewer"}) as api:
        page = api.get("viewer", "/checkpoints/?pipeline=payments").text
        rows = {r["checkpoint_id"]: r for r in api.get("viewer", "/checkpoints/api/payments/checkpoints").json()}
    assert (rows[5]["requested_by"], rows[5]["dag_run"]) == ("payments_snapshot", run_id)
    assert (rows[6]["requested_by"], rows[6]["dag_run"]) == ("ckpt savepoint", None)  # not a DAG's: no link
    assert f'<a href="/dags/payments_snapshot/runs/{run_id}" target="_top">payments_snapshot</a>' in page
    assert '<td class="requested_by">ckpt savepoint</td>' in page
    assert page.count('<svg class="chart"') == 4 and page.count('class="pt"') == 4 * 5  # checkpoints 1-3, 5, 6
    assert page.count('class="recovery"') == 4 and page.count('class="aborted"') == 4
    for dag in ("payments_run", "payments_snapshot", "payments_recover"):
        assert f'<a href="/dags/{dag}" target="_top">{dag}</a>' in page
    assert "window.parent.document.documentElement" in page  # the theme of the frame around it
    blue = bytes((0x25, 0x63, 0xEB))  # the plotted lines and points
    for theme, background in (("light", (0xFF, 0xFF, 0xFF)), ("dark", (0x1A, 0x20, 0x2C))):
        framed = tmp_path / f"{theme}.html"  # what the script sets when Airflow's UI is in that theme
        framed.write_text(page.replace("<html>", f'<html data-theme="{theme}">', 1))
        width, bpp, rows = screenshot(framed.as_uri(), tmp_path / f"{theme}.png", 1300, 1000)
        assert rows[4][4 * bpp:4 * bpp + 3] == bytes(background), theme
        pixels = [row[i:i + 3] for row in rows[100:900] for i in range(0, len(row), bpp)]
        assert pixels.count(blue) > 200, f"no plotted points or lines visible in the {theme} theme"


def test_the_page_draws_the_job_graph_and_a_checkpoint_per_vertex(tmp_path, monkeypatch, capsys, migrated_db):
    """The pipeline's job graph drawn on the page (boxes and arrows, an inline SVG drawn by the
    server: a dataflow graph's vertices, or a linear pipeline's two), and a chosen checkpoint per
    vertex (Flink's checkpoint details: what ``ckpt checkpoints show`` prints, from the same
    function), its figures in the graph's boxes too; the same as JSON. A pipeline whose module
    fails says why in the graph's place and shows its checkpoint per operator id."""
    import shutil
    from importlib.metadata import EntryPoint

    from checkpoint_lib import cli, pipelines

    warehouse = synthetic_graph_warehouse(synthetic_warehouse(tmp_path / "warehouse"))
    shutil.copytree(warehouse / "_checkpoints" / "enrichment", warehouse / "_checkpoints" / "broken")
    registered = pipelines._registered()
    monkeypatch.setattr(pipelines, "_registered", lambda: {
        **registered, "broken": EntryPoint("broken", "no_such_module_of_flows:build", pipelines.GROUP)})
    monkeypatch.setenv("CKPT_WAREHOUSE", str(warehouse))
    with api_server(tmp_path, {"viewer": "viewer"}) as api:
        graph_only = api.get("viewer", "/checkpoints/?pipeline=enrichment")
        page = api.get("viewer", "/checkpoints/?pipeline=enrichment&checkpoint=2")
        vertices = api.get("viewer", "/checkpoints/api/enrichment/checkpoints/2/vertices")
        linear = api.get("viewer", "/checkpoints/?pipeline=payments&checkpoint=2").text
        broken = api.get("viewer", "/checkpoints/?pipeline=broken&checkpoint=2")
        broken_json = api.get("viewer", "/checkpoints/api/broken/checkpoints/2/vertices")
        unknown = api.get("viewer", "/checkpoints/api/enrichment/checkpoints/9/vertices")
    assert graph_only.status_code == page.status_code == vertices.status_code == 200
    assert unknown.status_code == 404

    # the job graph: a box per vertex and sink, an arrow per edge and sink, in both pages
    for html_text in (graph_only.text, page.text):
        assert html_text.count('<svg class="jobgraph"') == 1
        for node in ("payments", "accounts", "tag", "dedup", "totals", "sink:rejected", "sink:tagged",
                     "sink:region_totals"):
            assert f'data-node="{node}"' in html_text, node
        assert html_text.count('<path class="edge') == 4 + 3
        assert ">hash(account), input 2</text>" in html_text and ">two-input keyed x2</text>" in html_text
    assert "acked" not in graph_only.text and "per vertex" not in graph_only.text
    assert "<h3>Job graph at checkpoint 2</h3>" in page.text
    assert ">2/2 acked, 410 B</text>" in page.text and ">1/1 acked, offset 12</text>" in page.text
    assert ">2/2 acked, owns 2 txn</text>" in page.text

    # the checkpoint per vertex: a row per vertex, its sinks under it, then per subtask as before
    table = page.text.split("<h3>Checkpoint 2 per vertex</h3>")[1].split("</table>")[0]
    rows = [r.split("</tr>")[0] for r in table.split("<tr class=")[1:]]
    assert [r.split('class="vertex left">')[1].split("<")[0] for r in rows] == [
        "payments", "accounts", "tag", "sink rejected", "dedup", "sink tagged", "totals", "sink region_totals"]
    tag = rows[2]
    for cell in ("two-input keyed", ">2<", "410 B", "3.5 ms", "tag[1] 41.0 ms", "state table version 2, key groups 0..127"):
        assert cell in tag, cell
    assert rows[3].startswith('"sink"') and "owns 2 transactions" in rows[3]
    assert "4 rows, 256 B" in rows[4] and ">yes<" in rows[4] and "offset: version 12" in rows[1]
    assert "Checkpoint 2: acknowledgements per subtask" in page.text.split(table)[1]

    # the same as JSON, from the same function as `ckpt checkpoints show`
    capsys.readouterr()
    assert cli.main(["checkpoints", "show", "enrichment", "2", "--warehouse", str(warehouse), "-o", "json"]) == 0
    assert vertices.json() == json.loads(capsys.readouterr().out)["vertices"]

    # a linear pipeline: its two vertices
    assert 'data-node="source"' in linear and 'data-node="balance"' in linear and 'data-node="sink:ledger"' in linear
    assert ">3/3 acked, 1.5 KiB</text>" in linear

    # a pipeline whose module fails: why, and the checkpoint per operator id
    assert broken.status_code == 200 and '<svg class="jobgraph"' not in broken.text
    assert "The job graph of broken cannot be drawn: ModuleNotFoundError: No module named" in broken.text
    assert "<h3>Checkpoint 2 per vertex</h3>" in broken.text and "sink region_totals" in broken.text
    assert broken_json.status_code == 200 and {v["in_graph"] for v in broken_json.json()} == {False}


def test_the_page_stays_inside_the_warehouse(tmp_path, monkeypatch, migrated_db):
    warehouse = tmp_path / "warehouse"
    _store_with_a_checkpoint(warehouse)
    (warehouse / "secret.txt").write_text("no")
    monkeypatch.setenv("CKPT_WAREHOUSE", str(warehouse))
    with api_server(tmp_path, {"admin": "admin"}) as api:
        def status(path):
            return api.get("admin", "/checkpoints" + path).status_code

        assert status("/quality/payments/..%2F..%2F..%2Fsecret.txt") == 404
        assert status("/api/..%2Fetc/checkpoints") in (400, 404)
        assert status("/api/Payments/checkpoints") == 400
        assert status("/api/nope/checkpoints") == 404
        assert status("/api/payments/checkpoints/..%2F1/acks") in (400, 404)
        assert status("/api/payments/checkpoints/9999999999999999999999/acks") == 400
        assert status("/?pipeline=payments&checkpoint=abc") == 400
        for path in ("/openapi.json", "/docs", "/redoc"):  # FastAPI serves these without the app's dependencies
            assert status(path) == 404, path


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else ["<absent>"]


def test_no_get_creates_anything_under_the_warehouse(tmp_path, monkeypatch, migrated_db):
    from ckpt_airflow.ui import app as ui_app

    get_routes = {r.path for r in ui_app.routes if "GET" in getattr(r, "methods", ()) and getattr(r, "endpoint", None)
                  and r.path not in ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")}
    params = {"{pipeline}": "payments", "{checkpoint_id}": "1", "{path:path}": "index.html"}
    urls = []
    for route in sorted(get_routes):
        url = route
        for name, value in params.items():
            url = url.replace(name, value)
        assert "{" not in url, f"a new route parameter in {route}: give it a value here"
        urls.append("/checkpoints" + url)
    urls += ["/checkpoints/?pipeline=payments", "/checkpoints/?pipeline=payments&checkpoint=1",
             "/checkpoints/?pipeline=transfers&checkpoint=1", "/checkpoints/api/transfers/checkpoints/1/acks",
             "/checkpoints/api/payments/checkpoints?limit=5"]
    assert len(get_routes) == 7, sorted(get_routes)  # the page, pipelines, history, acks, vertices, quality, recover

    empty = tmp_path / "empty"
    empty.mkdir()
    only_checkpoints = tmp_path / "partial"  # a store with only its checkpoints table (no epochs, acks, sessions)
    DeltaCheckpointStore(only_checkpoints / "_checkpoints" / "payments").checkpoints.record_pending(1, trigger_time=1.0, epoch=0)
    warehouses = [empty, tmp_path / "absent", only_checkpoints]
    (tmp_path / "auth").mkdir()
    with api_server(tmp_path / "auth", {"admin": "admin"}) as api:
        for warehouse in warehouses:
            monkeypatch.setenv("CKPT_WAREHOUSE", str(warehouse))
            before = _tree(warehouse)
            for url in urls:
                r = api.get("admin", url)
                assert r.status_code in (200, 404), (warehouse.name, url, r.status_code, r.text[:300])
                assert _tree(warehouse) == before, f"GET {url} wrote under the {warehouse.name} warehouse"
            if warehouse is not only_checkpoints:
                assert api.get("admin", "/checkpoints/api/payments/checkpoints").json() == []
                assert api.get("admin", "/checkpoints/api/payments/checkpoints/1/acks").status_code == 404
                page = api.get("admin", "/checkpoints/?pipeline=payments")
                assert page.status_code == 200 and "none yet" in page.text and "No data-quality report" in page.text
            else:
                assert [r["checkpoint_id"] for r in api.get("admin", "/checkpoints/api/payments/checkpoints").json()] == [1]


def _post(api: Api, user: str, path: str, data: dict[str, str], **headers: str):
    return api.client.post(path, data=data, follow_redirects=False,
                           headers={"Authorization": f"Bearer {api.tokens[user]}", **headers})


def test_recover_to_a_checkpoint_triggers_the_recover_dag(tmp_path, monkeypatch, migrated_db):
    """The page's one action, through the real api-server and a real DAG run: the link only for users
    who may trigger the recover DAG and only on completed checkpoints, a form filled in for the
    checkpoint, a POST accepted only from this server's pages, and a queued run of
    ``payments_recover`` whose conf names the checkpoint (validated by the DAG's own params),
    attributed to the user and written to the audit log."""
    from airflow.models.dagrun import DagRun
    from airflow.models.log import Log
    from airflow.utils.session import create_session

    env = dict(os.environ)
    subprocess.run([AIRFLOW, "dags", "reserialize"], env=env, check=True, capture_output=True, timeout=300)
    warehouse = synthetic_history(tmp_path / "warehouse")  # payments: 1-3, 5, 6 completed, 4 aborted
    monkeypatch.setenv("CKPT_WAREHOUSE", str(warehouse))
    same = {"Origin": "http://testserver"}
    with api_server(tmp_path, {"admin": "admin", "operator": "user", "viewer": "viewer"}) as api:
        page = api.get("operator", "/checkpoints/?pipeline=payments").text
        for cid in (1, 2, 3, 5, 6):
            assert f'<a href="recover/payments/{cid}" target="_self">recover to this</a>' in page, cid
        assert 'href="recover/payments/4"' not in page  # aborted: nothing to recover to
        assert "recover/payments" not in api.get("viewer", "/checkpoints/?pipeline=payments").text

        form = api.get("operator", "/checkpoints/recover/payments/5")
        assert form.status_code == 200 and "Recover payments to checkpoint 5" in form.text
        assert "<option selected>aligned</option>" in form.text  # the recover DAG's default for payments
        assert "<form method='post' target='_top'>" in form.text
        assert api.get("viewer", "/checkpoints/recover/payments/5").status_code == 403
        assert api.get("operator", "/checkpoints/recover/payments/4").status_code == 404
        assert api.get("operator", "/checkpoints/recover/payments/99").status_code == 404
        assert api.get("operator", "/checkpoints/recover/payments/x").status_code == 400
        assert api.get("operator", "/checkpoints/recover/transfers/1").status_code == 404  # never ran
        assert api.client.get("/checkpoints/recover/payments/5").status_code == 401

        data = {"mode": "unaligned", "dry_run": "true"}
        path = "/checkpoints/recover/payments/5"
        assert _post(api, "operator", path, data).status_code == 403  # no Origin, no Referer
        assert _post(api, "operator", path, data, Origin="http://evil.example").status_code == 403
        assert _post(api, "operator", path, data, Referer="http://evil.example/x").status_code == 403
        assert _post(api, "viewer", path, data, **same).status_code == 403
        assert _post(api, "operator", "/checkpoints/recover/payments/4", data, **same).status_code == 404
        assert _post(api, "operator", path, {"mode": "fast"}, **same).status_code == 400
        assert api.client.post(path, data=data, headers=same).status_code == 401
        with create_session() as session:
            assert session.query(DagRun).filter(DagRun.dag_id == "payments_recover").count() == 0

        r = _post(api, "operator", path, data, Referer="http://testserver/checkpoints/recover/payments/5")
        assert r.status_code == 303, r.text
        location = r.headers["location"]
        assert location.startswith("/dags/payments_recover/runs/manual__"), location
    with create_session() as session:
        runs = session.query(DagRun).filter(DagRun.dag_id == "payments_recover").all()
        assert len(runs) == 1
        run = runs[0]
        assert location == f"/dags/payments_recover/runs/{run.run_id}"
        assert run.conf == {"checkpoint_id": "5", "dry_run": True, "mode": "unaligned"}
        assert (run.state, run.triggering_user_name, str(run.triggered_by)) == ("queued", "operator", "DagRunTriggeredByType.UI")
        logged = session.query(Log).filter(Log.event == "checkpoints_page_recover").all()
        assert [(l.owner, l.dag_id, l.run_id) for l in logged] == [("operator", "payments_recover", run.run_id)]
        assert json.loads(logged[0].extra) == {"method": "POST", "checkpoint_id": "5", "dry_run": True,
                                               "mode": "unaligned"}


def test_each_dag_has_a_checkpoints_tab_showing_its_pipeline(tmp_path, monkeypatch, migrated_db):
    """The plugin's second external view, a tab on every DAG's page, and what the page shows for it:
    the pipeline of any of checkpoint_lib's DAGs (maintenance included), a note for anyone else's
    DAG, and 403 for a pipeline the user may not read, as on the page itself."""
    from ckpt_plugin import CheckpointLibPlugin

    views = {v["destination"]: v for v in CheckpointLibPlugin.external_views}
    assert views["dag"]["href"] == "/checkpoints/?dag_id={DAG_ID}" and views["nav"]["href"] == "/checkpoints/"
    assert len({v["url_route"] for v in CheckpointLibPlugin.external_views}) == 2

    warehouse = tmp_path / "warehouse"
    cid = _store_with_a_checkpoint(warehouse)
    monkeypatch.setenv("CKPT_WAREHOUSE", str(warehouse))
    with api_server(tmp_path, {"viewer": "viewer", "nobody": ""}) as api:
        for dag in ("payments_run", "payments_snapshot", "payments_recover", "payments_maintenance"):
            page = api.get("viewer", f"/checkpoints/?dag_id={dag}").text
            assert "<h2>payments</h2>" in page and f">{cid}<" in page, dag
        transfers = api.get("viewer", "/checkpoints/?dag_id=transfers_run").text
        assert "<h2>transfers</h2>" in transfers and "none yet" in transfers
        other = api.get("viewer", "/checkpoints/?dag_id=someone_elses_dag%3Cb%3E").text
        assert "someone_elses_dag&lt;b&gt; is not a DAG of a checkpoint_lib pipeline" in other
        assert "<h2>" not in other
        assert api.get("nobody", "/checkpoints/?dag_id=payments_run").status_code == 403


def test_a_graph_needs_read_access_to_its_dags(tmp_path, monkeypatch,
                                                                                           migrated_db):
    """A dataflow graph's page needs its run, snapshot and recover DAGs, as a linear pipeline's;
    without the recover DAG nothing of it shows."""
    warehouse = synthetic_graph_warehouse(synthetic_warehouse(tmp_path / "warehouse"))
    monkeypatch.setenv("CKPT_WAREHOUSE", str(warehouse))
    users = {"enrichment_reader": "viewer", "enrichment_run_reader": "viewer"}
    with api_server(tmp_path, users, f"{__name__}.PerDagAuthManager") as api:
        assert api.get("enrichment_reader", "/checkpoints/api/pipelines").json() == ["enrichment"]
        assert api.get("enrichment_reader", "/checkpoints/?pipeline=enrichment").status_code == 200
        assert api.get("enrichment_run_reader", "/checkpoints/api/pipelines").json() == []
        assert api.get("enrichment_run_reader", "/checkpoints/?pipeline=enrichment").status_code == 403


def test_the_page_warns_of_a_postgres_sinks_prepared_transaction_held_for_long(postgres_server, monkeypatch):
    """A pipeline stopped between a prepare and its commit holds its rows' locks in the database:
    the page says so (and that a run of the pipeline ends it), as ``ckpt doctor`` does; a
    connection it cannot use is said too. Against a real server (tests/pg_server.py)."""
    from ckpt_airflow import ui

    from checkpoint_lib.core.twophase import Transaction, TransactionIdPool
    from checkpoint_lib.pipeline import PostgresSink
    from checkpoint_lib.pipelines import graph_of
    from checkpoint_lib.spark import postgres_sink as pg

    graph = graph_of("checkpoint_lib.pipelines.payments_postgres:pipeline")
    monkeypatch.delenv("AIRFLOW_CONN_CKPT_POSTGRES", raising=False)
    assert "AIRFLOW_CONN_CKPT_POSTGRES" in ui._held_prepares("payments_pg", graph)  # no connection: said
    for k, v in postgres_server.env().items():
        monkeypatch.setenv(k, v)
    sink = pg.PostgresTwoPhaseSink(None, "balances_pg", PostgresSink("page_held", "account string, amount long"),
                                   "payments_pg", uri=postgres_server.uri)
    sink.create()
    t = Transaction(0, TransactionIdPool(sink.pool_prefix, 0).acquire(0, ()), 1)
    pg.prepare(sink._spec(), t, 1, iter([("a", 1)]), 1)
    g = sink._gid(t)
    try:
        assert ui._held_prepares("payments_pg", graph) == ""  # prepared just now: a checkpoint in progress
        monkeypatch.setattr(pg, "STALE_PREPARED_S", -1)
        warning = ui._held_prepares("payments_pg", graph)
        assert 'class="warning"' in warning and g in warning and "Run payments_pg" in warning
        assert postgres_server.password not in warning
        assert ui._held_prepares("payments", graph) == ""  # another pipeline's are not its
    finally:
        sink.abort([t])

"""Registers checkpoint_lib with Airflow 3: the Checkpoints page (a FastAPI app mounted at
``/checkpoints`` by the api-server), its entry in the UI's navigation (an external view that
frames it) and a Checkpoints tab on each DAG's page (the pipeline that DAG belongs to). Whoever reaches the page sees only the pipelines whose DAGs Airflow's auth manager
lets them read (``ckpt_airflow/ui.py``). The operators, sensor and trigger need no registration:
they import as
``ckpt_airflow.*`` because Airflow puts this folder on ``sys.path``.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin


from ckpt_airflow.ui import app


class CheckpointLibPlugin(AirflowPlugin):
    name = "checkpoint_lib"
    fastapi_apps = [{"app": app, "url_prefix": "/checkpoints", "name": "Checkpoints"}]
    external_views = [
        {"name": "Checkpoints", "href": "/checkpoints/", "url_route": "checkpoints", "destination": "nav",
         "category": "browse"},
        # a tab on every DAG's page: the pipeline of one of checkpoint_lib's DAGs (others say so)
        {"name": "Checkpoints", "href": "/checkpoints/?dag_id={DAG_ID}", "url_route": "checkpoints-of-dag",
         "destination": "dag"},
    ]

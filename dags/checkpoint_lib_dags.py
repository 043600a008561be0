"""checkpoint_lib's Airflow DAGs: four for every registered pipeline (``<p>_run``, ``<p>_snapshot``,
``<p>_recover``, ``<p>_maintenance``), built by the installed provider's factory
(``ckpt_airflow.dag_factory``). This file is all a deployment's DAGs folder needs."""

from ckpt_airflow.dag_factory import dags_for_every_pipeline

globals().update(dags_for_every_pipeline())

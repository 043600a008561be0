"""checkpoint_lib's Airflow provider: hooks (all I/O), operators, a deferrable sensor and its
trigger, the failure notifier, and the Checkpoints page (``ui``). Installing the package registers
it with Airflow (the ``apache_airflow_provider`` entry point, ``provider.py``: the
``checkpoint_lib`` connection type and its form). The plugin that registers the page with Airflow
is ``plugins/ckpt_plugin.py``; the DAG factory is ``dag_factory.py`` (``dags/checkpoint_lib_dags.py`` puts
its DAGs in a DAGs folder).

Airflow puts ``plugins/`` on ``sys.path``, so this package imports as ``ckpt_airflow`` in the
scheduler, workers, triggerer, dag-processor and api-server alike (``plugins/.airflowignore``
keeps the plugin manager from importing its modules a second time as top-level plugins).
"""

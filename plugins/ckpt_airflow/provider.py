"""The provider's metadata: what ``pip install checkpoint_lib[airflow]`` registers with Airflow
(the ``apache_airflow_provider`` entry point): the ``checkpoint_lib`` connection type and its form,
the hooks, operators, sensor, trigger, notifier and the Checkpoints page's plugin."""

from __future__ import annotations

from typing import Any

PACKAGE = "checkpoint-lib"  # the distribution name, normalised (Airflow checks it against the installed metadata)


def get_provider_info() -> dict[str, Any]:
    from .hooks import CheckpointHook

    modules = lambda *names: [f"ckpt_airflow.{n}" for n in names]  # noqa: E731
    return {
        "package-name": PACKAGE,
        "name": "checkpoint_lib",
        "description": "Exactly-once checkpoints, replay and recovery for Spark pipelines on Delta Lake "
                       "(Flink's checkpoint model): hooks, operators, a deferrable sensor, a notifier, the "
                       "Checkpoints page.",
        "integrations": [{"integration-name": "checkpoint_lib", "tags": ["software"]}],
        "hooks": [{"integration-name": "checkpoint_lib", "python-modules": modules("hooks")}],
        "operators": [{"integration-name": "checkpoint_lib", "python-modules": modules("operators")}],
        "sensors": [{"integration-name": "checkpoint_lib", "python-modules": modules("sensors")}],
        "triggers": [{"integration-name": "checkpoint_lib", "python-modules": modules("triggers")}],
        "notifications": ["ckpt_airflow.callbacks.FailureNotifier"],
        "connection-types": [CheckpointHook.connection_type_info()],
    }

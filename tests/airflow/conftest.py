"""Airflow tests: every test here carries the ``airflow`` marker. An isolated AIRFLOW_HOME is set
before Airflow is imported in this process, so nothing touches ~/airflow."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

_HOME = Path(tempfile.mkdtemp(prefix="ckpt-airflow-home-"))
_REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("AIRFLOW_HOME", str(_HOME))
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(_REPO / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(_REPO / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__PARALLELISM"] = "4"
if str(_REPO / "plugins") not in sys.path:  # as Airflow does: plugins/ is importable (ckpt_airflow)
    sys.path.insert(0, str(_REPO / "plugins"))


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.airflow)

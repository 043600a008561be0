"""Great Expectations imported where PySpark's Spark Connect package would end the process.

PySpark 4.2's ``pyspark.sql.connect`` package (which GX imports for its Spark support) checks its
dependencies when imported; when the main module has neither a spec nor a file (``python -c``, as
a shell step may run our code) it takes itself for its own doctests and, with grpcio-status or
zstandard missing, exits the process with status 0 (``pyspark/sql/connect/utils.py``,
``check_dependencies``). A validation run that way ended half-way with the status of a success."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_MAKE_PROJECT = """
import sys
sys.modules["grpc_status"] = None  # as in an environment without grpcio-status: find_spec says None
from pathlib import Path
from checkpoint_lib.quality.gx_project import GxProject
GxProject(Path(sys.argv[1]), "payments")
print("project made")
"""


def test_a_gx_project_made_under_python_c_fails_clearly_instead_of_exiting_as_a_success(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _MAKE_PROJECT, str(tmp_path / "quality")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert "project made" not in done.stdout  # the import cannot succeed without the dependency
    assert done.returncode != 0, f"exited {done.returncode} as a success: {done.stderr[-2000:]}"
    assert "python -c" in done.stderr and "grpcio-status" in done.stderr, done.stderr[-2000:]

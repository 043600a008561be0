"""The package as a deployment gets it: a wheel built from this checkout, installed into a new
virtual environment, the Airflow provider registered from its entry point, and the payments DAGs
run by ``airflow dags test`` from a DAGs folder holding only the two lines the README gives. Nothing
of the checkout is importable there: no ``PYTHONPATH``, no ``plugins/`` folder, and the test checks
that ``checkpoint_lib`` and ``ckpt_airflow`` load from the new environment.

The wheel goes in with ``--no-deps``: its dependencies (Airflow, Spark, GX: gigabytes) are made
visible through a ``.pth`` line naming this venv's site-packages, which adds the directory and
nothing else (the checkout's editable-install hook there is a ``.pth`` of its own and is not run).
So what is tested is the wheel's own content: packages, package data (the ``jobs/`` entry points,
the suites, the log profile), console script and entry points.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from checkpoint_lib.control import PipelineControl
from checkpoint_lib.verify import check_payments
from helpers import REPO, append_payments
from synthetic_warehouse import synthetic_warehouse
from visits import check_visits

USERPKG = REPO / "tests" / "fixtures" / "userpkg"

DAG_FILE = '''from ckpt_airflow.dag_factory import dags_for_every_pipeline

globals().update(dags_for_every_pipeline())
'''


def _checkout_copy(target: Path) -> Path:
    """The checkout's files as git sees them (tracked, and new ones not ignored), links as links."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src, dst = REPO / name, target / name
        if not src.exists() and not src.is_symlink():  # deleted in the work tree
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
    return target


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("wheel")
    source = _checkout_copy(root / "src")  # setuptools builds in the source tree: not in this checkout
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(source)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = (root / "dist").glob("checkpoint_lib-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("checkpoint_lib/jobs/run_stage.py", "checkpoint_lib/quality/expectations/after_restore.json",
                    "checkpoint_lib/spark/log4j2-quiet.properties", "ckpt_airflow/provider.py",
                    "ckpt_airflow/dag_factory.py"):
        assert shipped in names, f"{shipped} is not in the wheel"
    assert not [n for n in names if n.startswith(("tests/", "bench/", "dags/", "plugins/"))]

    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True, timeout=600)
    # a data team's own package (tests/fixtures/userpkg), built and installed the same way: its
    # pipeline is registered by its entry point, with no edit to checkpoint_lib
    user_source = shutil.copytree(USERPKG, root / "userpkg-src", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                    str(root / "dist"), str(user_source)], check=True, capture_output=True, timeout=600)
    (user_wheel,) = (root / "dist").glob("ckpt_userpkg-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    str(user_wheel)], check=True, capture_output=True, timeout=600)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "zz_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")

    home, dags, warehouse = root / "airflow", root / "dags", root / "warehouse"
    dags.mkdir()
    (dags / "checkpoint_lib_dags.py").write_text(DAG_FILE)
    (root / "no-plugins").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "CKPT_")) and k != "PYTHONPATH"}
    env.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(root / "no-plugins"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False", "CKPT_WAREHOUSE": str(warehouse),
        "CKPT_SPARK_MASTER": "local[2]", "CKPT_SPARK_UI": "0", "CKPT_SHUFFLE_PARTITIONS": "2",
        "CKPT_DRIVER_MEMORY": "1g",
        # the jars this checkout already fetched (an installed wheel keeps them in the user's cache;
        # `ckpt setup` fetches them there: tests/spark/test_session.py covers the default)
        "CKPT_JAR_DIR": str(REPO / ".cache" / "jars"),
        "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
    })
    subprocess.run([str(python), "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True,
                   timeout=300)
    return {"python": python, "venv": venv, "env": env, "warehouse": warehouse, "root": root}


def _run(w, *argv: str, check: bool = True, timeout: float = 900) -> str:
    r = subprocess.run([str(w["python"]), *argv], env=w["env"], capture_output=True, text=True, timeout=timeout,
                       cwd=w["root"])
    out = r.stdout + r.stderr
    if check and r.returncode != 0:
        pytest.fail(f"{' '.join(argv[:4])} failed (rc {r.returncode}):\n{out[-6000:]}")
    return out


@pytest.mark.slow  # ~90 s with its wheel build; CI tier: the provider and DAGs from a checkout (test_provider.py,
# test_dags_e2e.py)
def test_the_wheel_installs_the_library_the_cli_and_the_provider(installed):
    """And a user's package installed beside it registers its pipeline everywhere."""
    w = installed
    where = json.loads(_run(w, "-c", (
        "import json, checkpoint_lib, ckpt_airflow\n"
        "from checkpoint_lib.submit import JOBS_DIR\n"
        "from checkpoint_lib.quality.gx_project import expectations_dir\n"
        "print(json.dumps([checkpoint_lib.__file__, ckpt_airflow.__file__, str(JOBS_DIR / 'run_stage.py'),"
        " str(expectations_dir())]))")).strip().splitlines()[-1])
    for path in where:
        assert Path(path).is_relative_to(w["venv"]) and Path(path).exists(), path
    assert (w["venv"] / "bin" / "ckpt").exists()
    assert "ckpt" in _run(w, "-m", "checkpoint_lib.cli", "--version")
    providers = _run(w, "-m", "airflow", "providers", "list", "-o", "json")
    assert '"checkpoint-lib"' in providers, providers[-2000:]
    _run(w, "-m", "airflow", "dags", "reserialize")  # what the dag-processor does with the DAGs folder
    assert "[]" in _run(w, "-m", "airflow", "dags", "list-import-errors", "-o", "json")
    dags = _run(w, "-m", "airflow", "dags", "list", "-o", "json")
    for dag in ("payments_run", "payments_snapshot", "payments_recover", "payments_maintenance"):
        assert f'"{dag}"' in dags, dags[-2000:]
    # the user's wheel's entry point is all it takes: the CLI lists and loads its pipeline, and the
    # DAG factory builds its four DAGs from the same DAGs folder file
    listed = _run(w, "-m", "checkpoint_lib.cli", "pipelines")
    assert "landing/visits -> last_page -> gold/visit_log, gold/visitors" in listed, listed
    for dag in ("visits_run", "visits_snapshot", "visits_recover", "visits_maintenance"):
        assert f'"{dag}"' in dags, dags[-2000:]


@pytest.mark.slow  # CI time (20 s); CI tier: the installed wheel's DAGs registered above, the recover DAG's dry run
# from a checkout in tests/airflow/test_dags_e2e.py and test_provider.py
def test_the_recover_dag_plans_a_recovery_from_the_wheel(installed, tmp_path):
    """A DAG run of the wheel's operators on a payments warehouse written with delta-rs (no Spark:
    the dry run reads the store and the tables and prints the plan; the slow test below runs Spark
    from the wheel)."""
    w = installed
    env = {**w["env"], "CKPT_WAREHOUSE": str(synthetic_warehouse(tmp_path / "warehouse"))}
    r = subprocess.run([str(w["python"]), "-m", "airflow", "dags", "test", "payments_recover", "-c",
                        json.dumps({"checkpoint_id": "1", "dry_run": True})], env=env, capture_output=True, text=True,
                       timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "state=success" in out and "restore checkpoint 1" in out, out[-4000:]
    assert "200 rows to replay" in out, out[-4000:]


@pytest.mark.slow  # CI tier: the dry run above; Spark from a checkout runs in test_dags_e2e.py
def test_the_payments_dags_run_from_the_wheel(installed):
    """The run DAG (source, then keyed: Spark in the task, the jars, the quiet log profile) takes a
    checkpoint of the landing table, and the recover DAG's dry run plans a recovery to it."""
    w = installed
    append_payments(w["warehouse"], 200, batch=0)
    out = _run(w, "-m", "airflow", "dags", "test", "payments_run")
    assert "state=success" in out, out[-4000:]
    control = PipelineControl(w["warehouse"], "payments")
    latest = control.store.checkpoints.latest()
    assert latest is not None, out[-4000:]
    check = check_payments(str(w["warehouse"]))
    assert check.ok, check.summary()
    out = _run(w, "-m", "airflow", "dags", "test", "payments_recover", "-c",
               json.dumps({"checkpoint_id": str(latest.checkpoint_id), "dry_run": True}))
    assert "state=success" in out and "restore checkpoint" in out, out[-4000:]


@pytest.mark.slow  # CI tier: the registration above, and tests/crash/test_user_pipeline.py from a checkout
def test_a_users_pipeline_from_its_wheel_is_killed_then_recovered_by_its_run_dag(installed):
    """The user's pipeline, installed: ``ckpt generate`` and ``ckpt run`` by name, the run killed -9
    between a checkpoint's completion and its commit, then ``airflow dags test visits_run``
    recovers it and processes the rest: exactly once."""
    w = installed
    warehouse = w["root"] / "visits-warehouse"
    env = {**w["env"], "CKPT_WAREHOUSE": str(warehouse)}
    for seed in (1, 2, 3):
        subprocess.run([str(w["venv"] / "bin" / "ckpt"), "generate", "visits", "--rows", "150", "--bad-fraction",
                        "0.05", "--seed", str(seed), "--warehouse", str(warehouse)], env=env, check=True,
                       capture_output=True, timeout=900)
    crashed = subprocess.run([str(w["venv"] / "bin" / "ckpt"), "run", "visits", "--warehouse", str(warehouse),
                              "--rows-per-checkpoint", "150"], env={**env, "CKPT_KILL_AT": "commit:2"},
                             capture_output=True, text=True, timeout=900)
    assert crashed.returncode == -9, crashed.stdout + crashed.stderr[-3000:]
    r = subprocess.run([str(w["python"]), "-m", "airflow", "dags", "test", "visits_run"], env=env,
                       capture_output=True, text=True, timeout=900, cwd=w["root"])
    assert r.returncode == 0 and "state=success" in r.stdout + r.stderr, (r.stdout + r.stderr)[-4000:]
    check_visits(warehouse)

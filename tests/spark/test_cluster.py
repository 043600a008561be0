"""The distributed path: a Spark standalone cluster (master + 2 workers on 127.0.0.1, started from
the pyspark install as docker-compose's spark services are), ``ckpt run`` as its driver, and one
executor killed with SIGKILL while the run's jobs are running. Spark reruns the lost tasks on the
other executor (and the worker starts a new one); our writes are idempotent Delta commits, so the
outputs stay exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from checkpoint_lib.pipelines.payments import generate
from checkpoint_lib.spark.standalone import StandaloneCluster, executor_pids
from checkpoint_lib.submit import ckpt_run_argv, ckpt_run_env
from checkpoint_lib.verify import check_payments

pytestmark = [pytest.mark.spark, pytest.mark.crash]
ROWS = 3000


@pytest.mark.slow  # CI tier: a standalone cluster of two workers; CI's crash-and-recover is tests/chaos
def test_an_executor_killed_mid_run_on_a_standalone_cluster_changes_nothing(spark, tmp_path):
    for v in range(2):
        generate(spark, str(tmp_path), ROWS, bad_fraction=0.02, accounts=50, seed=40 + v)
    trace = tmp_path / "trace.txt"
    with StandaloneCluster(workers=2, cores=1, memory="1g", workdir=tmp_path / "cluster") as cluster:
        env = {**ckpt_run_env(cluster.master_url, trace=trace), **cluster.client_env(), "CKPT_DRIVER_MEMORY": "1g"}
        cmd = ckpt_run_argv("payments", tmp_path, "--rows-per-checkpoint", str(ROWS))
        run = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        killed = None
        deadline = time.monotonic() + 600
        while killed is None and run.poll() is None and time.monotonic() < deadline:
            reached = trace.read_text().split() if trace.exists() else []
            executors = executor_pids()
            if "flush_stage" in reached and len(executors) == 2:  # the first keyed step is running
                killed = executors[0]
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.2)
        out, err = run.communicate(timeout=900)
        assert killed is not None, f"no executor was killed (the run ended first?):\n{out}\n{err[-3000:]}"
        assert run.returncode == 0, f"{out}\n{err[-5000:]}"
        assert "Lost executor" in err or "ExecutorLostFailure" in err, err[-3000:]
        assert cluster.alive_workers() == 2
    check = check_payments(str(tmp_path))
    assert check.ok, check.summary()
    assert check.valid_rows > 0.95 * 2 * ROWS

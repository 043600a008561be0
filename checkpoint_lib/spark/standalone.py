"""A Spark standalone cluster on this machine, started from the pyspark install (no Spark download).

What docker-compose's ``spark-master`` and ``spark-worker-*`` services run, natively: the Master
and the Workers with ``spark-class``, bound to 127.0.0.1 on free ports. For the cluster tests and
the cluster benchmark; a user's own cluster (standalone, YARN, Kubernetes) is only a master URL
away (``CKPT_SPARK_MASTER``, ``spark-submit --master``; README, "Your own cluster").

>>> with StandaloneCluster(workers=2) as cluster:     # doctest: +SKIP
...     env = {**os.environ, **cluster.client_env()}  # CKPT_SPARK_MASTER=spark://127.0.0.1:port
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ..submit import spark_home

__all__ = ["StandaloneCluster", "executor_pids"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def executor_pids(app_id: str | None = None) -> list[int]:
    """PIDs of the executor JVMs on this machine (of ``app_id``, when given), from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if "CoarseGrainedExecutorBackend" in args and (app_id is None or app_id in args):
            pids.append(int(entry.name))
    return sorted(pids)


class StandaloneCluster:
    """Master + ``workers`` Workers (``cores`` and ``memory`` each) on 127.0.0.1. A context manager:
    started and healthy (every worker registered) on entry, every process stopped on exit."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "2g", workdir: str | Path | None = None,
                 start_timeout: float = 120.0):
        self.workers, self.cores, self.memory = workers, cores, memory
        self.start_timeout = start_timeout
        self._own_dir = workdir is None
        self.dir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="ckpt-spark-"))
        self.port, self.ui_port = _free_port(), _free_port()
        self.procs: list[subprocess.Popen] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def client_env(self) -> dict[str, str]:
        """What a driver (``ckpt run``, a job, a test) needs to use this cluster."""
        return {"CKPT_SPARK_MASTER": self.master_url, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}

    def _env(self) -> dict[str, str]:
        home = spark_home()
        return {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
                "SPARK_LOG_DIR": str(self.dir / "logs"), "SPARK_NO_DAEMONIZE": "1"}

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.dir / f"{name}.log", "w")
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        self.procs.append(subprocess.Popen(cmd, env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))
        log.close()

    def status(self) -> dict:
        """The master's JSON status (workers, their state, running applications)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.loads(r.read())

    def alive_workers(self) -> int:
        try:
            return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")
        except OSError:
            return 0

    def start(self) -> "StandaloneCluster":
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui_port))
        for i in range(self.workers):
            work = self.dir / f"worker-{i}"
            work.mkdir(exist_ok=True)
            self._spawn(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                        "--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(_free_port()),
                        "--work-dir", str(work), self.master_url)
        deadline = time.monotonic() + self.start_timeout
        while self.alive_workers() < self.workers:
            dead = [p.args[1].rsplit(".", 1)[-1] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {f.name}\n{f.read_text()[-1500:]}" for f in sorted(self.dir.glob("*.log")))
                self.stop()
                raise RuntimeError(f"the standalone cluster did not start ({dead or 'timeout'}):\n{logs}")
            time.sleep(1)
        return self

    def stop(self) -> None:
        """Workers first (they stop their executors), then the master; SIGKILL what lingers."""
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self.procs.clear()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "StandaloneCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

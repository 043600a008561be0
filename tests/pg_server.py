"""A real PostgreSQL server for the PostgreSQL sink's tests, started natively on 127.0.0.1 with a
fresh data folder, like the S3 server (tests/s3server.py): PostgreSQL 16 from PyPI's ``pgserver``
package (the dev extra: only its binaries are used), else a system install (``initdb`` on the PATH
or Debian's ``/usr/lib/postgresql/<v>/bin``). Password authentication (scram) on TCP, so a wrong
password is refused as it would be in production, and ``max_prepared_transactions`` set. The tests'
server skips fsync and full-page writes (a crash test kills the postmaster, not the machine); the
benchmark's (``bench/postgres.py``: ``durable=True``) keeps PostgreSQL's defaults, so every commit
and prepare flushes the WAL as a production server does.

PostgreSQL refuses to run as root: as root, the server runs as the unprivileged ``nobody`` user,
which owns its data folder, in a fresh folder under the system's temporary folder (``nobody``
cannot enter pytest's own, which only its owner may).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def bin_dir() -> Path:
    spec = importlib.util.find_spec("pgserver")  # its binaries only: the package itself is not imported
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"
        if (bundled / "initdb").exists():
            return bundled
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if debian:
        return Path(debian[-1]).parent
    raise RuntimeError("no PostgreSQL binaries: the PostgreSQL tests need the pgserver package (run `make setup`)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """``postgres`` on 127.0.0.1:``port``; :attr:`uri` is the sink's connection string (user
    ``ckpt``, a random password, database ``sinks``), :meth:`env` what a process needs to use it as
    the Airflow connection ``connection``."""

    def __init__(self, *, max_prepared: int = 64, durable: bool = False):
        self.bin = bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="ckpt-pg-"))  # (not under pytest's 0700 folders: see above)
        self.data = self.root / "data"
        self.port = _free_port()
        self.password = secrets.token_hex(12)
        self.max_prepared = max_prepared
        self.durable = durable  # fsync and full-page writes on, as PostgreSQL's defaults (the benchmark's server)
        self.proc: subprocess.Popen | None = None
        self._user = "nobody" if os.geteuid() == 0 else None

    @property
    def uri(self) -> str:
        return f"postgresql://ckpt:{self.password}@127.0.0.1:{self.port}/sinks"

    def env(self, connection: str = "ckpt_postgres") -> dict[str, str]:
        return {f"AIRFLOW_CONN_{connection.upper()}": self.uri}

    def _run(self, *argv: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), check=True, capture_output=True, text=True, user=self._user, **kw)

    def _own(self, path: Path) -> None:
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def start(self) -> "PostgresServer":
        os.chmod(self.root, 0o755)
        if not self.data.exists():
            self.data.mkdir()
            self._own(self.data)
            secret = self.root / "pw"
            secret.write_text(self.password)
            os.chmod(secret, 0o644)
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "ckpt", "--auth-local=trust",
                      "--auth-host=scram-sha-256", f"--pwfile={secret}", "-E", "UTF8", "--locale=C")
            secret.unlink()
        self.proc = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port), "-c", "listen_addresses=127.0.0.1",
             "-c", f"unix_socket_directories={self.data}", "-c", f"max_prepared_transactions={self.max_prepared}",
             *(() if self.durable else ("-c", "fsync=off", "-c", "full_page_writes=off"))],
            stdout=subprocess.DEVNULL, stderr=open(self.root / "server.log", "ab"), user=self._user)
        deadline = time.monotonic() + 60
        while True:
            try:
                self._run(str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q")
                break
            except subprocess.CalledProcessError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL did not start: {(self.root / 'server.log').read_text()[-2000:]}")
                time.sleep(0.2)
        self.psql("SELECT 1", database="postgres")
        if not self.psql("SELECT 1 FROM pg_database WHERE datname = 'sinks'", database="postgres"):
            self.psql("CREATE DATABASE sinks", database="postgres")
        return self

    def psql(self, query: str, *, database: str = "sinks") -> str:
        """``query`` through psql on the server's socket (trust): its rows, unaligned."""
        return self._run(str(self.bin / "psql"), "-h", str(self.data), "-p", str(self.port), "-U", "ckpt",
                         "-d", database, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", query).stdout.strip()

    def stop(self, *, fast: bool = True) -> None:
        """Stop the server (``fast``: as an administrator would; else the postmaster killed with
        SIGKILL, as a crash). Prepared transactions survive either way."""
        if self.proc is None:
            return
        if fast:
            self.proc.terminate()
        else:
            self.proc.kill()
        self.proc.wait(timeout=60)
        self.proc = None
        if not fast:  # the children of a killed postmaster exit when they notice
            for _ in range(100):
                if not (self.data / "postmaster.pid").exists() or not _backends_alive(self.data):
                    break
                time.sleep(0.1)

    def restart(self, *, fast: bool = True) -> None:
        self.stop(fast=fast)
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _backends_alive(data: Path) -> bool:
    out = subprocess.run(["pgrep", "-f", f"postgres.*{data}"], capture_output=True, text=True).stdout
    return bool(out.strip())

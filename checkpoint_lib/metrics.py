"""Metrics to alert on, the way Airflow deployments collect theirs: StatsD over UDP.

Per pipeline, under ``<prefix>.<pipeline>.``:

======================================  =======  ====================================================
``checkpoint.duration``                 timer    trigger to completion (ms)
``checkpoint.alignment``                timer    the longest barrier alignment of a subtask (ms)
``checkpoint.state_bytes``              gauge    keyed state the checkpoint pins
``checkpoint.channel_state_bytes``      gauge    records in flight it logged (unaligned), and
``checkpoint.channel_state_rows``       gauge    their rows
``checkpoint.completed``                counter  one per completed checkpoint
``checkpoint.failed``                   counter  one per aborted checkpoint, and
``checkpoint.failed.<reason>``          counter  by reason (expired, declined, ...)
``recovery``                            counter  one per recovery (a new epoch restored), and
``recovery.duration``                   timer    how long its restore took (ms)
======================================  =======  ====================================================

Off unless ``CKPT_METRICS`` names a StatsD daemon: ``statsd://host:port`` (prefix
``checkpoint_lib``) or ``statsd://host:port/prefix``. Airflow's own StatsD settings
(``AIRFLOW__METRICS__STATSD_ON``/``_HOST``/``_PORT``) are used when ``CKPT_METRICS`` is unset, so a
deployment that collects Airflow's metrics collects ours with it. Sending never fails a run: a
metric is one UDP datagram, and an error sending it is dropped.
"""

from __future__ import annotations

import os
import re
import socket
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlparse

if TYPE_CHECKING:
    from .core.checkpoints import CompletedCheckpoint

METRICS_ENV = "CKPT_METRICS"
DEFAULT_PREFIX = "checkpoint_lib"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class Metrics(Protocol):
    def timing(self, name: str, ms: float) -> None: ...

    def gauge(self, name: str, value: float) -> None: ...

    def incr(self, name: str, count: int = 1) -> None: ...


class NoMetrics:
    """Metrics off."""

    def timing(self, name: str, ms: float) -> None:
        pass

    def gauge(self, name: str, value: float) -> None:
        pass

    def incr(self, name: str, count: int = 1) -> None:
        pass


class StatsdMetrics:
    """StatsD lines (``name:value|ms``, ``|g``, ``|c``) as UDP datagrams to ``host:port``."""

    def __init__(self, host: str, port: int, prefix: str = DEFAULT_PREFIX):
        self.address = (host, port)
        self.prefix = prefix.strip(".")
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)

    def _send(self, name: str, value: float, kind: str) -> None:
        line = f"{self.prefix}.{_UNSAFE.sub('_', name)}:{value:g}|{kind}"
        try:
            self._socket.sendto(line.encode(), self.address)
        except OSError:
            pass  # a metric is never worth failing a run for

    def timing(self, name: str, ms: float) -> None:
        self._send(name, round(ms, 3), "ms")

    def gauge(self, name: str, value: float) -> None:
        self._send(name, value, "g")

    def incr(self, name: str, count: int = 1) -> None:
        self._send(name, count, "c")

    def __repr__(self) -> str:
        return f"StatsdMetrics({self.address[0]}:{self.address[1]}, prefix={self.prefix!r})"


def from_env(environ: dict[str, str] | None = None) -> Metrics:
    """The metrics sink configured by ``CKPT_METRICS``, else Airflow's StatsD settings, else none."""
    env = os.environ if environ is None else environ
    url = env.get(METRICS_ENV, "").strip()
    if url:
        parsed = urlparse(url)
        if parsed.scheme != "statsd" or not parsed.hostname or not parsed.port:
            raise ValueError(f"{METRICS_ENV}={url!r}: expected statsd://host:port or statsd://host:port/prefix")
        return StatsdMetrics(parsed.hostname, parsed.port, parsed.path.strip("/") or DEFAULT_PREFIX)
    if env.get("AIRFLOW__METRICS__STATSD_ON", "").lower() in ("true", "1"):
        return StatsdMetrics(env.get("AIRFLOW__METRICS__STATSD_HOST", "localhost"),
                             int(env.get("AIRFLOW__METRICS__STATSD_PORT", "8125")), DEFAULT_PREFIX)
    return NoMetrics()


class PipelineMetrics:
    """The metrics of one pipeline (names under ``<pipeline>.``): what the runtime reports."""

    def __init__(self, pipeline: str, sink: Metrics | None = None):
        self.pipeline = _UNSAFE.sub("_", pipeline)
        self.sink = from_env() if sink is None else sink

    def _name(self, name: str) -> str:
        return f"{self.pipeline}.{name}"

    def checkpoint_completed(self, c: CompletedCheckpoint) -> None:
        self.sink.timing(self._name("checkpoint.duration"), c.duration * 1000)
        self.sink.timing(self._name("checkpoint.alignment"), c.alignment_ms)
        self.sink.gauge(self._name("checkpoint.state_bytes"), c.state_size_bytes)
        self.sink.gauge(self._name("checkpoint.channel_state_bytes"), c.channel_state_bytes)
        self.sink.gauge(self._name("checkpoint.channel_state_rows"),
                        sum(a.channel_state_rows for a in c.acks.values()))
        self.sink.incr(self._name("checkpoint.completed"))

    def checkpoint_failed(self, reason: str) -> None:
        self.sink.incr(self._name("checkpoint.failed"))
        self.sink.incr(self._name(f"checkpoint.failed.{reason}"))

    def recovered(self, seconds: float) -> None:
        self.sink.incr(self._name("recovery"))
        self.sink.timing(self._name("recovery.duration"), seconds * 1000)

"""A StatsD collector on 127.0.0.1 for the tests: what a metrics daemon would receive."""

from __future__ import annotations

import socket


class StatsdCollector:
    """A UDP socket on a free local port; :meth:`received` drains what arrived so far."""

    def __init__(self) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.settimeout(0.5)
        self.port = self.socket.getsockname()[1]
        self.url = f"statsd://127.0.0.1:{self.port}"

    def received(self) -> list[tuple[str, float, str]]:
        """Every metric since the last call: (name, value, kind: ms, g or c), in arrival order."""
        out = []
        while True:
            try:
                data = self.socket.recv(65536)
            except (socket.timeout, BlockingIOError):
                return out
            name, rest = data.decode().split(":", 1)
            value, kind = rest.split("|", 1)
            out.append((name, float(value), kind))

    def close(self) -> None:
        self.socket.close()

    def __enter__(self) -> "StatsdCollector":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

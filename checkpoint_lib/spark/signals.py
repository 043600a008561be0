"""A run loop's clean stop on SIGTERM/SIGINT (the CLI's ``ckpt run``)."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable


@contextmanager
def stop_on_signals(stop: Callable[[], None]):
    """While running, SIGTERM/SIGINT ask for a clean stop (a second one raises KeyboardInterrupt).
    Only the main thread can install handlers; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    asked = []

    def handler(signum, _frame):
        if asked:
            raise KeyboardInterrupt(f"signal {signum} again: stopping at once")
        asked.append(signum)
        stop()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)

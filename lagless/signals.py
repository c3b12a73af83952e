"""SIGINT and SIGTERM as a request to stop, for commands that finish their work in flight."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def stop_requests(enabled: bool = True) -> Iterator[threading.Event]:
    """An event set by SIGINT or SIGTERM while inside; the handlers before are restored on exit.
    Disabled, the event is never set and signals keep their handlers."""
    requested = threading.Event()
    if not enabled:
        yield requested
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda *_: requested.set())
    try:
        yield requested
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

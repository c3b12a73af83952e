"""SIGINT and SIGTERM as a request to stop, for commands that finish their work in flight.

The handler only records the signal: it never raises and never calls into Spark. A handler that
did (Python's default raises KeyboardInterrupt; PySpark's own SIGINT handler calls the JVM to
cancel every job, then raises) runs between two bytecodes of the main thread, which is then
inside a py4j call, halfway through reading the JVM's answer from its socket: the handler's
py4j call reenters that buffered socket ("RuntimeError: reentrant call"), and the interrupted
call leaves its connection half-read for the next one. The main thread looks at the request
when it is between calls instead (importer/job.py).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest(threading.Event):
    """Set by the first SIGINT or SIGTERM; `signals` lists every one received, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.signals: list[int] = []

    def record(self, number: int) -> None:
        self.signals.append(number)
        self.set()

    @property
    def first(self) -> signal.Signals:
        return signal.Signals(self.signals[0])

    @property
    def insisted(self) -> bool:
        """A second signal: stop at once."""
        return len(self.signals) > 1


@contextmanager
def stop_requests(enabled: bool = True) -> Iterator[StopRequest]:
    """A StopRequest set by SIGINT or SIGTERM while inside; the handlers before are restored
    on exit. Disabled (or outside the main thread), it is never set and signals keep their
    handlers."""
    requested = StopRequest()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield requested
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in previous:
        signal.signal(sig, lambda number, _frame: requested.record(number))
    try:
        yield requested
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class StopFile(threading.Event):
    """A stop request another process sees: set by creating a file, seen by its existence.
    The import passes one to Spark's processes (the source's planning and tasks, a Spark
    Connect server's foreachBatch), which no signal reaches: there a wait for a broker that is
    away ends when it appears (retry.py)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)

    def set(self) -> None:
        self.path.touch()

    def is_set(self) -> bool:
        return self.path.exists()

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM outside `stop_requests`, raised as Python raises KeyboardInterrupt
    for SIGINT, so a command stopped before its work began still ends with one line and
    128 + signal."""

    def __init__(self, number: int) -> None:
        super().__init__()
        self.signal_number = number


def _interrupt(number: int, _frame: object) -> None:
    raise Interrupted(number)


def interrupt_on_signals() -> None:
    """SIGINT and SIGTERM raise Interrupted in the main thread, whatever the process
    inherited. Python's default ends the process with no word on SIGTERM, and keeps SIGINT
    ignored where the parent ignored it: a command started in the background of a script
    (`lagless import ... &`) inherits SIGINT ignored, and a Ctrl-C to its process group
    during an import's start-up was lost (the import then ran on: issue 56)."""
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, _interrupt)


@contextmanager
def kept_handlers() -> Iterator[None]:
    """lagless's SIGINT and SIGTERM handlers kept over code that installs its own: PySpark's
    SparkContext sets a SIGINT handler that calls into the JVM (see above) and, where the
    process inherited SIGINT ignored, makes it heard only from then on."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)

"""retry.py: a stop request ends a wait for something that is away (issue 31.3), never an
attempt that answers; a StopFile carries the request to another process."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from lagless.exceptions import Stopped
from lagless.retry import retried
from lagless.signals import StopFile


class Away(Exception):
    pass


def set_later(stop: threading.Event, seconds: float) -> None:
    threading.Timer(seconds, stop.set).start()


def test_a_stop_ends_the_pause_between_attempts() -> None:
    stop = threading.Event()
    tries: list[float] = []

    def attempt() -> None:
        tries.append(time.monotonic())
        raise Away("down")

    set_later(stop, 0.3)
    started = time.monotonic()
    with pytest.raises(Stopped):
        retried(attempt, what="x", budget_s=300, retry_on=(Away,), stop=stop)
    assert time.monotonic() - started < 5 and len(tries) >= 1


def test_a_stop_ends_an_attempt_that_hangs(tmp_path: Path) -> None:
    """A paused broker's request waits for its timeout: the wait is left, the attempt is not
    awaited. A StopFile: set by another process, seen by its file."""
    stop = StopFile(tmp_path / "stop")
    release = threading.Event()

    def hangs() -> None:
        release.wait(30)

    threading.Timer(0.3, lambda: (tmp_path / "stop").touch()).start()
    started = time.monotonic()
    try:
        with pytest.raises(Stopped):
            retried(hangs, what="x", budget_s=300, retry_on=(Away,), stop=stop)
        assert time.monotonic() - started < 5
    finally:
        release.set()
    stop.clear()
    assert not stop.is_set()


def test_an_attempt_that_answers_is_never_cut_short_by_a_stop() -> None:
    stop = threading.Event()
    stop.set()
    assert retried(lambda: 42, what="x", budget_s=300, retry_on=(Away,), stop=stop) == 42


def test_an_error_that_is_not_retried_leaves_as_it_is() -> None:
    def fails() -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        retried(fails, what="x", budget_s=300, retry_on=(Away,), stop=threading.Event())

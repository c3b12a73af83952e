"""Riding out something that is away (a broker, a database): retry with backoff for a budget.

One budget for a whole import (`lagless import --retry-seconds`, DEFAULT_RETRY_S): the driver's
broker calls (kafka/connection.py), the tasks' range reading (source/reader.py, through the
source option retrySeconds) and the PostgreSQL store's writes. Each retry is logged; past the
budget a TransientError names what was away and for how long (exit 75: a rerun resumes).

A commit that another writer beat (an optimistic commit to a Delta log or an Iceberg catalog)
is a different retry: nothing is away, the table moved on. `commit_attempts()` gives the
attempts of every such commit in lagless, COMMIT_ATTEMPTS of them with a short backoff between,
each deciding again on the table as the other writer left it.

A stop request ends the wait (`stop`: the import's StopRequest, or a StopFile in Spark's
processes): the pause between attempts, and an attempt that hangs (a broker paused, whose
request waits for its timeout) are left within STOP_POLL_S, raising Stopped. An attempt that
answers within STOP_POLL_S is never cut short: a stop with the broker there changes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

from lagless.exceptions import Stopped, TransientError

# A rolling broker restart or a database failover takes a minute or two; five leaves room.
DEFAULT_RETRY_S = 300.0
FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 10.0
# How soon a stop request ends a wait.
STOP_POLL_S = 0.2
# Commits lost to other writers in a row before the writer gives up (ConcurrentImport, or a
# maintenance round left to the next), and the pause after the first lost one (doubled, at
# most COMMIT_MAX_PAUSE_S): the writers that beat it are others' batches, seconds apart.
COMMIT_ATTEMPTS = 20
COMMIT_FIRST_PAUSE_S = 0.05
COMMIT_MAX_PAUSE_S = 1.0

T = TypeVar("T")
log = logging.getLogger(__name__)


def away_error(what: str, seconds: float, budget_s: float, reason: str) -> TransientError:
    return TransientError(
        f"{what} was away for {seconds:.0f} s, past the retry budget of {budget_s:.0f} s "
        f"(--retry-seconds): {reason}"
    )


def retried(
    attempt: Callable[[], T],
    *,
    what: str,
    budget_s: float,
    retry_on: tuple[type[BaseException], ...],
    reason: Callable[[BaseException], str] = str,
    stop: threading.Event | None = None,
) -> T:
    """attempt() until it returns, again after each `retry_on` error while the budget lasts;
    a `stop` set while it waits raises Stopped."""
    started = time.monotonic()
    pause = FIRST_PAUSE_S
    tries = 0
    while True:
        try:
            result = attempt() if stop is None else _unless_stopped(attempt, what, stop)
        except retry_on as exc:
            away = time.monotonic() - started
            if away + pause > budget_s:
                log.error("%s: giving up after %.0f s: %s", what, away, reason(exc))
                raise away_error(what, away, budget_s, reason(exc)) from None
            tries += 1
            log.warning(
                "%s is away (%s): retry %d in %.1f s (%.0f s of the %.0f s budget used)",
                what,
                reason(exc),
                tries,
                pause,
                away,
                budget_s,
            )
            _pause(pause, what, stop)
            pause = min(pause * 2, MAX_PAUSE_S)
            continue
        if tries:
            log.info(
                "%s is back after %.1f s and %d retries", what, time.monotonic() - started, tries
            )
        return result


def commit_attempts() -> Iterator[int]:
    """The attempts of a commit that another writer may beat: 0, 1, ... COMMIT_ATTEMPTS - 1,
    with a backoff pause before each attempt after the first. The loop's body decides on the
    table as it is, commits and returns; falling out of the loop is the give-up."""
    for attempt in range(COMMIT_ATTEMPTS):
        if attempt:
            time.sleep(min(COMMIT_MAX_PAUSE_S, COMMIT_FIRST_PAUSE_S * 2 ** (attempt - 1)))
        yield attempt


def stopped_waiting(what: str) -> Stopped:
    log.warning("%s: a stop was asked for; no longer waiting", what)
    return Stopped(0, "a stop request")


def _pause(seconds: float, what: str, stop: threading.Event | None) -> None:
    """Sleep, or until `stop` is set (polled: a StopFile is another process's)."""
    if stop is None:
        time.sleep(seconds)
        return
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if stop.is_set():
            raise stopped_waiting(what)
        time.sleep(min(left, STOP_POLL_S))


def _unless_stopped(attempt: Callable[[], T], what: str, stop: threading.Event) -> T:
    """attempt() in a thread of its own, waited for until it ends or `stop` is set: an attempt
    that hangs is then left to end by itself (its client's timeout) and nobody reads it."""
    outcome: Future[T] = Future()

    def run() -> None:
        try:
            outcome.set_result(attempt())
        except BaseException as exc:
            outcome.set_exception(exc)

    threading.Thread(target=run, name="lagless-attempt", daemon=True).start()
    while True:
        try:
            return outcome.result(timeout=STOP_POLL_S)
        except FutureTimeout:
            if stop.is_set():
                raise stopped_waiting(what) from None

"""Riding out something that is away (a broker, a database): retry with backoff for a budget.

One budget for a whole import (`lagless import --retry-seconds`, DEFAULT_RETRY_S): the driver's
broker calls (kafka/connection.py), the tasks' range reading (source/reader.py, through the
source option retrySeconds) and the PostgreSQL store's writes. Each retry is logged; past the
budget a TransientError names what was away and for how long (exit 75: a rerun resumes).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from lagless.exceptions import TransientError

# A rolling broker restart or a database failover takes a minute or two; five leaves room.
DEFAULT_RETRY_S = 300.0
FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 10.0

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
) -> T:
    """attempt() until it returns, again after each `retry_on` error while the budget lasts."""
    started = time.monotonic()
    pause = FIRST_PAUSE_S
    tries = 0
    while True:
        try:
            result = attempt()
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
            time.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE_S)
            continue
        if tries:
            log.info(
                "%s is back after %.1f s and %d retries", what, time.monotonic() - started, tries
            )
        return result

"""When an import's rounds expire history (importer/maintenance.Schedule): a file out of the
window waits at most a thirtieth of it (at most a minute), whatever --maintain-every says.
The store is a recorder of the calls: what is checked here is only when they come."""

from __future__ import annotations

from lagless.importer.maintenance import EXPIRE_EVERY_S, Schedule
from lagless.sinks.maintenance import Policy, Round


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def tables(self, table: str | None = None) -> list[str]:
        return [table or "orders"]

    def compact(self, table: str, policy: Policy, deadline: float, done: Round) -> None:
        self.calls.append(("compact", table))

    def expire(self, table: str, policy: Policy, done: Round) -> None:
        self.calls.append(("expire", table))


def expiries(window_s: float, every_s: float, seconds: float) -> list[float]:
    """The times of the expiries of an import whose batches end every 0.5 s."""
    store, now = Recorder(), [0.0]
    schedule = Schedule(
        store,  # type: ignore[arg-type]
        lambda: ["orders"],
        Policy(128 * 1024 * 1024, window_s),
        every_s=every_s,
        clock=lambda: now[0],
    )
    times = []
    while now[0] < seconds:
        now[0] += 0.5
        before = len(store.calls)
        schedule.between_batches(["orders"])
        if ("expire", "orders") in store.calls[before:]:
            times.append(now[0])
    return times


def test_a_short_window_expires_every_thirtieth_of_it_between_the_time_based_rounds() -> None:
    times = expiries(window_s=60, every_s=10, seconds=20)
    assert times == [2.0 * n for n in range(1, 11)]  # 10 s rounds would expire every 10 s


def test_a_long_window_expires_every_minute() -> None:
    times = expiries(window_s=3600, every_s=10, seconds=300)
    assert times == [EXPIRE_EVERY_S * n for n in range(1, 6)]

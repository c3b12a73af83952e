"""When an import's rounds expire history (importer/maintenance.Schedule): a file out of the
window waits at most a thirtieth of it (at most a minute), whatever --maintain-every says, or
a batch, for a table that rewrites itself between expiries.
The store is a recorder of the calls: what is checked here is only when they come."""

from __future__ import annotations

from lagless.importer.maintenance import EXPIRE_EVERY_S, Schedule
from lagless.sinks.maintenance import Health, Policy, Round, StoreMaintenance


class Recorder(StoreMaintenance):
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def tables(self, table: str | None = None) -> list[str]:
        return [table or "orders"]

    def compact(self, table: str, policy: Policy, deadline: float, done: Round) -> None:
        self.calls.append(("compact", table))

    def expire(self, table: str, policy: Policy, done: Round) -> None:
        self.calls.append(("expire", table))

    def health(self, table: str, policy: Policy) -> Health | None:
        return None


def expiries(window_s: float, every_s: float, seconds: float) -> list[float]:
    """The times of the expiries of an import whose batches end every 0.5 s."""
    store, now = Recorder(), [0.0]
    schedule = Schedule(
        store,
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


class Churning(Recorder):
    """Each expiry of `orders` removes `removed` bytes of a table of `live` bytes (the store
    knows them, as Delta's expiry does; 0: it does not)."""

    def __init__(self, removed: list[int], live: int) -> None:
        super().__init__()
        self.removed = removed
        self.live = live

    def tables(self, table: str | None = None) -> list[str]:
        return [table or "orders", f"{table or 'orders'}_dlq"]

    def expire(self, table: str, policy: Policy, done: Round) -> None:
        super().expire(table, policy, done)
        if table == "orders":
            done.removed_bytes = self.removed.pop(0) if self.removed else 0
            done.live_bytes = self.live


def expiries_of(store: Churning, written: list[list[str]]) -> list[list[str]]:
    """The tables expired after each batch (batches 0.5 s apart, a 60 s window: expiry due
    every 2 s), each batch writing the tables `written` gives it."""
    now = [0.0]
    schedule = Schedule(
        store,
        lambda: ["orders", "audit"],
        Policy(128 * 1024 * 1024, 60),
        every_s=10,
        clock=lambda: now[0],
    )
    found = []
    for tables in written:
        now[0] += 0.5
        before = len(store.calls)
        schedule.between_batches(tables)
        found.append([t for call, t in store.calls[before:] if call == "expire"])
    return found


def test_a_table_that_rewrites_itself_is_expired_after_each_batch_that_writes_it() -> None:
    """Its first expiry removes its live bytes' worth: from then on, each batch writing it
    expires it (and its `_dlq`); one that writes only another table does not; the other
    table keeps the 2 s cadence."""
    store = Churning(removed=[70, 35, 35, 35, 35, 35], live=35)
    found = expiries_of(store, [["orders"]] * 4 + [["audit"], ["orders"], ["orders"]])
    every_table = ["audit", "audit_dlq", "orders", "orders_dlq"]
    assert found == [
        [],
        [],
        [],
        every_table,
        [],
        ["orders", "orders_dlq"],
        ["orders", "orders_dlq"],
    ]


def test_a_table_whose_expiry_finds_it_calm_again_goes_back_to_the_usual_cadence() -> None:
    store = Churning(removed=[70, 10], live=35)  # the second expiry removes under half
    found = expiries_of(store, [["orders"]] * 8)
    assert [bool(each) for each in found] == [False, False, False, True, True, False, False, True]


def test_expiry_that_does_not_know_the_live_bytes_keeps_the_usual_cadence() -> None:
    store = Churning(removed=[70] * 10, live=0)
    found = expiries_of(store, [["orders"]] * 8)
    assert [bool(each) for each in found] == [False, False, False, True] * 2


class FailingOnce(Churning):
    """The second expiry of `orders` fails (a store away): run_round logs it, returns None."""

    def expire(self, table: str, policy: Policy, done: Round) -> None:
        super().expire(table, policy, done)
        if table == "orders" and self.calls.count(("expire", "orders")) == 2:
            raise OSError("the store is away")


def test_a_failed_expiry_leaves_a_rewriting_table_expired_after_each_batch() -> None:
    store = FailingOnce(removed=[70, 0, 70, 70], live=35)
    found = expiries_of(store, [["orders"]] * 6)
    # 2.0 s marks it; at 2.5 s its expiry fails (the removal told nothing): still followed.
    assert [bool(each) for each in found] == [False, False, False, True, True, True]


class Aside(Recorder):
    """A store whose rounds leave work running beside the batches (Iceberg's folds): `ends`
    is after how many more asks it has ended; None: nothing aside."""

    def __init__(self, ends: int | None) -> None:
        super().__init__()
        self.ends = ends

    def finished_aside(self) -> list[str]:
        if self.ends is None:
            return []
        self.ends -= 1
        return ["orders"] if self.ends <= 0 else []

    def aside_under_way(self) -> bool:
        return self.ends is not None and self.ends > 0

    def settle(self, table: str, done: Round) -> None:
        self.calls.append(("settle", table))
        self.ends = None  # committed: nothing aside until a round starts some


def test_work_left_aside_is_committed_after_the_first_batch_that_finds_it_ended() -> None:
    """Not at the next round, 4 batches or 10 s away: a fold ended waits one batch at most;
    and the import's end waits for the work still under way and commits it, unless a stop
    is asked for meanwhile."""
    store = Aside(ends=2)
    schedule = Schedule(store, lambda: ["orders"], Policy(), every_s=10, clock=lambda: 0.0)

    schedule.between_batches(["orders"])
    assert store.calls == []
    schedule.between_batches(["orders"])
    assert store.calls == [("settle", "orders")]
    schedule.between_batches(["orders"])
    assert store.calls == [("settle", "orders")]  # nothing aside since

    store.ends = 3
    schedule.end(stopped=lambda: False)
    assert store.calls == [("settle", "orders")] * 2

    store.ends = 10**9
    schedule.end(stopped=lambda: True)
    assert store.calls == [("settle", "orders")] * 2

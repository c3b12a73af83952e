"""bench/soak.py's verdict (bench/soak_verdict.py): growth fitted per process life, latency
judged outside the faults' windows, each fault's catching up judged apart."""

from __future__ import annotations

import threading

import pytest

from bench.soak import Visibility
from bench.soak_verdict import (
    RECOVERY_LIMIT_S,
    FaultWindow,
    Histogram,
    Life,
    fault_of,
    fit_growth,
    growth_checks,
    judged_lives,
    latency_checks,
    lives,
)

MIN = 60.0


def samples(*lives: tuple[float, float, float, float]) -> list[dict[str, float]]:
    """A minute's samples of the plain import's driver, one life after another: each (start
    minute, end minute, MiB at its start, MiB an hour it grows)."""
    rows = []
    for number, (start, end, mib, per_hour) in enumerate(lives, 1):
        for minute in range(int(start), int(end)):
            at = minute * MIN
            grown = mib + per_hour * (at - start * MIN) / 3600
            rows.append(
                {"at_s": at, "plain life": number, "plain python MiB": grown, "plain data files": 9}
            )
    return rows


def test_a_flat_series_grows_nothing_and_a_line_its_slope_against_its_start() -> None:
    assert fit_growth([(0, 100), (1800, 100), (3600, 100)]) == pytest.approx(0)
    assert fit_growth([(0, 100), (1800, 105), (3600, 110)]) == pytest.approx(0.10)
    assert fit_growth([(0, 1), (60, 2)]) is None  # too few to fit


def test_a_restart_into_a_larger_flat_process_is_no_growth() -> None:
    """Each life flat, the second larger: fitted across the restart it read as +46% an hour."""
    rows = samples((0, 60, 200, 0), (60, 120, 300, 0))
    across = [(r["at_s"], r["plain python MiB"]) for r in rows if r["at_s"] >= 15 * MIN]
    assert fit_growth(across) > 0.4  # the old rule's false slope
    (check,) = [c for c in growth_checks(rows, 15 * MIN) if c[0].startswith("plain python")]
    what, ok, kind = check
    assert ok and kind == "growth", what
    assert "+0.0% an hour over 15-59 min (life 1 of 2)" in what
    assert "+0.0% an hour over 75-119 min (life 2 of 2)" in what


def test_growth_each_life_hides_across_restarts_is_found() -> None:
    """Each life grows 80 MiB an hour from 200 MiB and is killed before it shows much: across
    the restarts the fit saw a sawtooth of little slope; per life it fails (+36% an hour
    against the 220 MiB each life's fit starts at)."""
    rows = samples((0, 60, 200, 80), (60, 120, 200, 80), (120, 180, 200, 80))
    across = [(r["at_s"], r["plain python MiB"]) for r in rows if r["at_s"] >= 15 * MIN]
    assert fit_growth(across) < 0.10  # what the old rule passed
    (check,) = [c for c in growth_checks(rows, 15 * MIN) if c[0].startswith("plain python")]
    what, ok, _ = check
    assert not ok, what
    assert what.count("+36.4% an hour") == 3 and "(life 3 of 3)" in what


def test_a_tables_figure_is_one_series_whatever_the_process_lives() -> None:
    found = lives(samples((0, 60, 200, 0), (60, 120, 300, 0)), "plain data files", 15 * MIN)
    assert [life.number for life in found] == [1]
    assert found[0].points[0][0] == 15 * MIN and len(found[0].points) == 105


def test_each_life_has_its_warm_up_and_a_short_life_is_left_to_the_long_ones() -> None:
    rows = samples((0, 60, 200, 0), (60, 80, 300, 0))
    found = lives(rows, "plain python MiB", 15 * MIN)
    assert [(life.number, life.points[0][0] / MIN, len(life.points)) for life in found] == [
        (1, 15, 45),
        (2, 75, 5),
    ]
    assert [life.number for life in judged_lives(found)] == [1]  # 5 minutes fit nothing


def test_without_a_life_long_enough_the_longest_is_judged() -> None:
    found = [Life(1, [(0, 1), (60, 1), (120, 1)]), Life(2, [(0, 1), (60, 1), (600, 1)])]
    assert [life.number for life in judged_lives(found)] == [2]
    assert judged_lives([Life(1, [(0, 1), (60, 1)])]) == []  # too few points to fit


def test_a_histograms_quantile_is_within_its_resolution() -> None:
    """Against the rank's exact latency (the one at index int(q * count) in order)."""
    late = [each / 100 for each in range(1, 1001)]  # 0.01 .. 10 s
    counted = Histogram()
    for each in late:
        counted.add(each)
    assert counted.count == 1000
    for q in (0.5, 0.99, 1.0):
        exact = late[min(999, int(q * 1000))]
        assert exact <= counted.quantile(q) <= exact * Histogram.RESOLUTION, q
    assert Histogram().quantile(0.99) == 0.0


def test_a_fault_holds_every_wait_that_overlaps_it_until_the_import_caught_up() -> None:
    fault = FaultWindow("broker_down", started=100.0)
    assert fault.holds(sent=90, seen=101) and not fault.holds(sent=90, seen=99)
    fault.ended = 120.0
    fault.note_caught_up(oldest_unseen=110.0, now=130.0)  # records of the fault still unseen
    assert fault.recovered is None
    fault.note_caught_up(oldest_unseen=121.0, now=135.0)
    assert fault.recovered == 135.0
    fault.note_caught_up(oldest_unseen=None, now=150.0)  # the first catching up counts
    assert fault.recovered == 135.0
    assert fault.holds(sent=134, seen=140) and not fault.holds(sent=136, seen=140)
    later = FaultWindow("store_refuses", started=200.0)
    assert fault_of([fault, later], 134, 140) is fault
    assert fault_of([fault, later], 150, 201) is later
    assert fault_of([fault, later], 150, 160) is None


def test_a_fault_not_yet_ended_has_not_caught_up_even_with_nothing_waiting() -> None:
    fault = FaultWindow("store_refuses", started=100.0)
    fault.note_caught_up(oldest_unseen=None, now=110.0)
    assert fault.recovered is None


def windows(*p99s: float) -> dict[int, Histogram]:
    found = {}
    for number, p99 in enumerate(p99s):
        found[number] = Histogram()
        for _ in range(99):
            found[number].add(p99 / 2)
        found[number].add(p99)
    return found


def test_latency_is_judged_outside_faults_and_each_fault_by_its_catching_up() -> None:
    caught = FaultWindow("broker_down", 1000.0, ended=1020.0, recovered=1060.0, worst_s=65.0)
    checks = latency_checks(windows(1.0, 1.2, 1.4), [caught], run_started=100.0)
    (latency, fault) = checks
    assert latency[1], latency  # p99s of 1.0, 1.2, 1.4 s, each as its bin's top
    assert "windows: 1.01, 1.21, 1.41 s (worst 1.40x the first)" in latency[0], latency
    assert fault == (
        "fault 1 (broker_down) at 15.0 min: caught up 40.0 s after it ended; the worst wait "
        "in its window 65.00 s",
        True,
        "fault",
    )
    slow = latency_checks(windows(1.0, 1.6), [], run_started=0.0)
    assert not slow[0][1]


def test_a_fault_never_caught_up_or_too_late_fails_the_verdict() -> None:
    never = FaultWindow("store_refuses", 1000.0, ended=1030.0)
    late = FaultWindow("broker_down", 2000.0, ended=2020.0, recovered=2021 + RECOVERY_LIMIT_S)
    checks = latency_checks({}, [never, late], run_started=1000.0)
    assert [(c[1], c[2]) for c in checks] == [(False, "fault"), (False, "fault")]
    assert "never caught up" in checks[0][0]
    assert all(c[1] for c in latency_checks({}, [never, late], 1000.0, judge=False))


class Producer:
    """What Visibility's accounting reads of PlainProducer: its lock; no broker."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


def test_visibility_counts_a_wait_in_its_fault_or_else_in_its_window() -> None:
    """Visibility's accounting of what each poll found visible: a record that waited through
    a fault is the fault's, never its 15-minute window's."""
    seen = Visibility("delta:///nowhere", Producer(), None, 1000.0)  # type: ignore[arg-type]
    fault = FaultWindow("broker_down", started=2000.0, ended=2020.0)
    seen.faults.append(fault)
    seen._note([1500.0, 1501.0], now=1502.0, oldest_unseen=1510.0)  # before the fault
    seen._note([1995.0, 2010.0], now=2025.0, oldest_unseen=2015.0)  # behind, in the fault
    seen._note([2019.0], now=2030.0, oldest_unseen=2021.0)  # caught up at this poll
    seen._note([2040.0], now=2041.0, oldest_unseen=None)
    assert fault.recovered == 2030.0 and fault.worst_s == 30.0
    assert {w: h.count for w, h in seen.windows.items()} == {0: 2, 1: 1}
    assert seen.latencies(1500.0, 2100.0) == [2.0, 1.0, 30.0, 15.0, 11.0, 1.0]


def test_a_figure_in_few_of_its_lifes_samples_is_not_judged_and_said_so() -> None:
    """Children that came and went in 3 of a life's 60 samples after its warm-up: a line
    through them read as +305% an hour; a dense series beside them is judged still."""
    rows = samples((0, 90, 200, 80))
    for row, mib in zip(rows[20::25], (1.0, 30.0, 60.0), strict=False):
        row["plain children MiB"] = mib
    checks = {c[0].split(":")[0]: c for c in growth_checks(rows, 15 * MIN)}
    what, ok, kind = checks["plain children MiB"]
    assert ok and kind == "growth"
    assert what == "plain children MiB: judged on too few samples (3 of 56), not judged"
    what, ok, _ = checks["plain python MiB"]
    assert not ok and "an hour over 15-89 min" in what


def test_a_figure_in_half_its_lifes_samples_is_judged() -> None:
    rows = samples((0, 90, 200, 80))
    for row in rows[15::2]:
        row["plain children MiB"] = 10.0 + row["at_s"] / 60
    (check,) = [c for c in growth_checks(rows, 15 * MIN) if c[0].startswith("plain children")]
    what, ok, _ = check
    assert not ok and "% an hour over" in what, what
    found = lives(rows, "plain children MiB", 15 * MIN)
    assert [(len(life.points), life.samples, life.sparse) for life in found] == [(38, 75, False)]

"""The bar's rate (progress/collector.py RecentRate): the last seconds of batches, never the
first batch (Spark's start) once a later one is done; the clock is injected."""

from __future__ import annotations

from lagless.progress.collector import RATE_WINDOW_S, RecentRate


def test_one_batch_counts_from_the_start() -> None:
    rate = RecentRate(started=100.0)
    assert rate.add(105.0, 1_000, 10_000) == (200.0, 2_000.0)


def test_later_batches_leave_out_the_first_which_carries_sparks_start() -> None:
    rate = RecentRate(started=0.0)
    rate.add(8.0, 33_000, 0)  # the first batch: 5 s of start-up in it
    records, _ = rate.add(10.0, 101_000, 0)
    assert records == 68_000 / 2.0


def test_a_long_import_shows_about_the_last_window() -> None:
    rate = RecentRate(started=0.0)
    rate.add(5.0, 1_000, 0)
    done = 1_000
    for second in range(6, 100):  # 1,000 records/s, then 10,000 records/s from second 60
        done += 1_000 if second < 60 else 10_000
        records, _ = rate.add(float(second), done, 0)
    assert records == 10_000.0  # the window holds only the fast batches
    assert len(rate._marks) <= RATE_WINDOW_S + 4  # old marks are dropped

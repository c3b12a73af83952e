"""When a batch's commits run beside the next batch's tasks (importer/batch_writer.py), and
how long the run waits for them."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from lagless.exceptions import Stopped
from lagless.importer.batch_writer import BatchWriter, _StoreWork, commits_beside_tasks
from lagless.signals import StopRequest


def test_a_bulk_import_always_overlaps_its_batches() -> None:
    assert commits_beside_tasks("bulk", 0.0, 0.0, 0.5)
    assert commits_beside_tasks("bulk", 0.1, 10.0, 0.5)


def test_a_continuous_import_overlaps_a_batch_behind_whose_tasks_take_a_third_of_it() -> None:
    assert not commits_beside_tasks("continuous", 0.0, 0.0, 0.5)  # the first batch
    assert not commits_beside_tasks("continuous", 0.3, 0.6, 0.5)  # keeping up: one at a time
    assert commits_beside_tasks("continuous", 1.4, 1.0, 0.5)  # behind, half of it reading
    assert commits_beside_tasks("continuous", 0.5, 1.0, 0.5)  # a third
    # Behind, but the store's commit is most of each batch: little would run beside it.
    assert not commits_beside_tasks("continuous", 0.3, 0.8, 0.5)
    assert not commits_beside_tasks("continuous", 1.4, 1.0, 2.0)  # a slower trigger


def _writer_with_commit_under_way(stop: StopRequest, release: threading.Event) -> BatchWriter:
    """A writer whose last batch's commits wait for `release` (a store away), and nothing else:
    drain reads only these."""

    def commit() -> None:
        release.wait(30)

    writer = BatchWriter.__new__(BatchWriter)
    writer.stop = stop
    writer._store_work = _StoreWork(7, commit)
    writer._store_work.start()
    return writer


def test_the_run_waits_for_the_commit_under_way_after_one_signal() -> None:
    stop, release = StopRequest(), threading.Event()
    stop.record(signal.SIGINT)
    writer = _writer_with_commit_under_way(stop, release)
    threading.Timer(0.5, release.set).start()
    began = time.monotonic()
    writer.drain()
    assert time.monotonic() - began >= 0.4 and writer._store_work is None  # it ended, then


def test_a_second_signal_ends_the_wait_for_a_commit_a_store_away_holds() -> None:
    stop, release = StopRequest(), threading.Event()
    writer = _writer_with_commit_under_way(stop, release)
    threading.Timer(0.3, lambda: (stop.record(signal.SIGINT), stop.record(signal.SIGINT))).start()
    began = time.monotonic()
    writer.drain()
    try:
        assert time.monotonic() - began < 5  # not the commit's 30 s
        assert writer._store_work is not None and writer._store_work.daemon  # left to the exit
    finally:
        release.set()


def test_a_second_signal_stops_the_next_batch_waiting_for_the_commit_before() -> None:
    """Spark's query.stop waits for the batch in flight: one whose call waited for the commit
    before, a store away, held the process for Spark's 60 s stop timeout (seen from the CLI)."""
    stop, release = StopRequest(), threading.Event()
    writer = _writer_with_commit_under_way(stop, release)
    threading.Timer(0.3, lambda: (stop.record(signal.SIGINT), stop.record(signal.SIGINT))).start()
    began = time.monotonic()
    try:
        with pytest.raises(Stopped, match="a second signal"):
            writer._raise_a_store_failure(wait=True)
        assert time.monotonic() - began < 5
    finally:
        release.set()

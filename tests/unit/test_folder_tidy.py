"""A clean run leaves a Parquet table's folder holding its batches only (issue 34.6): no
`_staging/<run>` folder and no `_lagless.lock`; the lock that is removed on release still
lets one holder in at a time."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from lagless.sinks import sink_from_url
from lagless.sinks.ledger import Batch
from lagless.sinks.storage import LocalStorage
from tests.unit.test_ledger_stores import TARGET, commit


def test_a_committed_batch_leaves_no_staging_folder_nor_lock(tmp_path: Path) -> None:
    sink = sink_from_url(f"parquet:///{tmp_path}/lake")
    sink.prepare(TARGET)
    commit(sink, TARGET, Batch(0, {("orders", 0): (0, 10), ("orders", 1): (0, 5)}))
    commit(sink, TARGET, Batch(1, {("orders", 0): (10, 20)}))

    names = sorted(os.listdir(tmp_path / "lake" / TARGET.table))
    assert len(names) == 2 and all(name.startswith("batch=") for name in names), names


def _add_under_lock(path: str, times: int) -> None:
    storage = LocalStorage()
    for _ in range(times):
        with storage.locked(path + ".lock", "", 0):
            count = int(Path(path).read_text() or 0)
            Path(path).write_text(str(count + 1))


def test_the_lock_removed_on_release_still_admits_one_holder_at_a_time(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    counter.write_text("0")
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_add_under_lock, args=(str(counter), 40)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert counter.read_text() == "160"  # no increment lost to two holders at once
    assert not (tmp_path / "count.lock").exists()

"""When a batch's commits run beside the next batch's tasks (importer/batch_writer.py)."""

from __future__ import annotations

from lagless.importer.batch_writer import commits_beside_tasks


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

"""pack_tasks: small batches become few tasks; large ones stay as the split planned them."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lagless.planner.pack import UNKNOWN_RECORD_BYTES, pack_tasks
from lagless.planner.ranges import OffsetRange


def test_a_small_batch_over_many_partitions_is_one_task():
    pieces = [OffsetRange("t", p, 0, 100) for p in range(24)]

    tasks = pack_tasks(pieces, min_task_bytes=1_000_000, bytes_per_record={("t", 0): 100.0})

    assert len(tasks) == 1
    assert tasks[0] == tuple(sorted(pieces))


def test_a_large_batch_keeps_the_split_plan():
    pieces = [OffsetRange("t", p, 0, 100_000) for p in range(4)]

    tasks = pack_tasks(pieces, min_task_bytes=1_000, bytes_per_record={("t", 0): 100.0})

    assert tasks == [(piece,) for piece in pieces]


def test_without_estimates_records_weigh_the_assumed_size():
    pieces = [OffsetRange("t", p, 0, 1_000) for p in range(8)]

    tasks = pack_tasks(pieces, min_task_bytes=2_000 * UNKNOWN_RECORD_BYTES)

    assert len(tasks) == 4


def test_rejects_a_minimum_below_one():
    with pytest.raises(ValueError, match="min_task_bytes"):
        pack_tasks([OffsetRange("t", 0, 0, 1)], min_task_bytes=0)


piece_lists = st.lists(
    st.tuples(st.integers(0, 30), st.integers(0, 5_000)), min_size=0, max_size=40
).map(
    lambda specs: [
        OffsetRange("t", partition, 0, records) for partition, records in dict(specs).items()
    ]
)


@given(
    pieces=piece_lists,
    min_task_bytes=st.integers(1, 2_000_000),
    sizes=st.dictionaries(st.integers(0, 30), st.floats(1, 5_000), max_size=31),
)
def test_pack_properties(pieces, min_task_bytes, sizes):
    bytes_per_record = {("t", p): size for p, size in sizes.items()}

    tasks = pack_tasks(pieces, min_task_bytes, bytes_per_record)

    work = [piece for piece in pieces if piece.records > 0]
    packed = [piece for task in tasks for piece in task]
    assert sorted(packed) == sorted(work)
    assert all(list(task) == sorted(task) for task in tasks)
    if not work:
        assert tasks == []
        return
    known = [Fraction(size) for size in bytes_per_record.values()]

    def size(piece: OffsetRange) -> Fraction:
        if not known:
            return Fraction(UNKNOWN_RECORD_BYTES)
        return (
            Fraction(bytes_per_record[piece.key])
            if piece.key in bytes_per_record
            else (sum(known, Fraction(0)) / len(known))
        )

    def weight(task) -> Fraction:
        return sum((piece.records * size(piece) for piece in task), Fraction(0))

    total = sum(weight((piece,)) for piece in work)
    count = min(len(work), max(1, -(-total // min_task_bytes)))
    assert len(tasks) == count
    if count == len(work):
        assert tasks == [(piece,) for piece in work]
    heaviest = max(weight((piece,)) for piece in work)
    assert all(weight(task) <= total / count + heaviest for task in tasks)
    if count < len(work):
        weights = [weight(task) for task in tasks]
        assert weights == sorted(weights, reverse=True)

"""Split offset ranges into tasks so every task slot stays busy until the backlog is gone.

A Kafka consumer group can give a partition to one thread only: when partitions differ in
backlog, the threads holding the short ones finish early and sit idle while a few others
crawl through the long ones. lagless plans on the driver instead: a long range becomes
several tasks, so Spark can hand a free slot the next piece of whatever work is left.

Pieces are cut at a target size, the remainder of a range last, rather than into equal parts:
cutting a range of 1.1 targets into two halves of 0.55 leaves every slot that got a half idle
for the last 0.45 target, while a full piece plus a 0.1 remainder lets the remainders fill the
slots that got shorter ranges. No single target size suits every shape (seed 000 drains in
1.003x the ideal with pieces of total / slots on 16 slots, but in 1.35x on 24 slots, where
pieces of a third of that give 1.01x), so the planner tries a few and keeps the one whose
largest-first schedule finishes first.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

from lagless.planner.ranges import OffsetRange, record_sizes

# Piece sizes tried: total / slots divided by each of these.
PIECES_PER_SLOT = (1, 2, 3, 4)
# A task has a fixed cost (a Spark task to launch, a Kafka consumer to open), so a finer cut is
# kept only when its schedule finishes more than this much earlier than a coarser one's.
FINER_CUT_MIN_GAIN = 0.01


def plan_tasks(
    ranges: Sequence[OffsetRange],
    slots: int,
    bytes_per_record: Mapping[tuple[str, int], float] | None = None,
    min_task_records: int = 1,
    min_tasks: int = 1,
    max_task_records: int | None = None,
) -> list[OffsetRange]:
    """The tasks that read ranges on slots parallel task slots, largest weight first.

    A range's weight is its records times the estimated bytes of one of its records
    (bytes_per_record; a partition missing there gets the mean of the known ones; without
    it every record weighs 1). For a target weight T = total / slots / n, each range is cut,
    from its start, into pieces of max(min_task_records, ceil(T / bytes of one record))
    records; the last piece holds what is left, and is merged into the piece before it when
    it holds fewer than min_task_records records. n is the smallest of PIECES_PER_SLOT whose
    largest-first list schedule on `slots` slots (each slot taking the next task when free,
    as Spark does; time proportional to weight) ends within FINER_CUT_MIN_GAIN of the best
    of them. So:

    - balance: every piece weighs less than total / slots + min_task_records records of its
      partition, or holds fewer than 2 * min_task_records records; and that schedule ends
      before 1.01 * (1.25 * total / slots + 2 * min_task_records * the largest record);
    - count: there are fewer than 4 * slots + len(non-empty ranges) tasks;
    - the pieces cover every input offset exactly once; empty ranges yield no task.

    Then two caps, Spark's maxRecordsPerPartition and minPartitions (both off by default, when
    the plan is exactly the one above): a task of more than max_task_records records is cut
    into ceil(records / max_task_records) pieces of near-equal size, and while there are fewer
    than min_tasks tasks the heaviest task holding at least 2 records (ties as below) is cut
    into halves. Both overrule min_task_records. So, besides coverage and the balance bound
    above (a cut only makes pieces lighter):

    - no task holds more than max_task_records records;
    - there are at least min(min_tasks, records in all ranges) tasks;
    - count: fewer than max(4 * slots + len(non-empty ranges) + total records /
      max_task_records, min_tasks + 1) tasks;
    - the largest-first schedule ends by total / slots + the heaviest task's weight (list
      scheduling's bound; the tighter bound above is only promised without the caps).

    Ties in weight are ordered by (topic, partition, start), so a plan is reproducible.
    Raises ValueError when slots, min_task_records, min_tasks or max_task_records is below 1,
    when a range ends before it starts, or when two ranges of one partition overlap.
    """
    work = _checked(ranges, slots, min_task_records, min_tasks, max_task_records)
    sizes = record_sizes({r.key for r in work}, bytes_per_record)
    chosen = _best_cut(work, sizes, slots, min_task_records)
    if max_task_records is None and min_tasks == 1:
        return chosen
    return _capped(chosen, sizes, max_task_records, min_tasks)


def _checked(
    ranges: Sequence[OffsetRange],
    slots: int,
    min_task_records: int,
    min_tasks: int,
    max_task_records: int | None,
) -> list[OffsetRange]:
    """plan_tasks' ValueErrors; else the ranges that hold records, sorted."""
    if slots < 1:
        raise ValueError(f"slots must be at least 1, not {slots}")
    if min_task_records < 1:
        raise ValueError(f"min_task_records must be at least 1, not {min_task_records}")
    if min_tasks < 1:
        raise ValueError(f"min_tasks must be at least 1, not {min_tasks}")
    if max_task_records is not None and max_task_records < 1:
        raise ValueError(f"max_task_records must be at least 1, not {max_task_records}")
    for offset_range in ranges:
        if offset_range.start > offset_range.end:
            raise ValueError(f"{offset_range} ends before it starts")
    work = sorted(r for r in ranges if r.records > 0)
    for before, after in itertools.pairwise(work):
        if before.key == after.key and before.end > after.start:
            raise ValueError(f"{before} and {after} overlap")
    return work


def _weight(task: OffsetRange, sizes: Mapping[tuple[str, int], Fraction]) -> Fraction:
    return task.records * sizes[task.key]


def _heaviest_first(
    tasks: list[OffsetRange], sizes: Mapping[tuple[str, int], Fraction]
) -> list[OffsetRange]:
    """Largest weight first, ties by (topic, partition, start): a plan is reproducible."""
    return sorted(tasks, key=lambda t: (-_weight(t, sizes), t.topic, t.partition, t.start))


def _best_cut(
    work: list[OffsetRange],
    sizes: Mapping[tuple[str, int], Fraction],
    slots: int,
    min_task_records: int,
) -> list[OffsetRange]:
    """The cut of the fewest pieces per slot (PIECES_PER_SLOT) whose largest-first schedule
    ends within FINER_CUT_MIN_GAIN of the best of them."""
    total = sum((r.records * sizes[r.key] for r in work), Fraction(0))
    plans: list[tuple[float, list[OffsetRange]]] = []
    for pieces_per_slot in PIECES_PER_SLOT:
        target = total / (slots * pieces_per_slot)
        tasks: list[OffsetRange] = []
        for offset_range in work:
            piece_records = max(min_task_records, math.ceil(target / sizes[offset_range.key]))
            tasks.extend(_cut(offset_range, piece_records, min_task_records))
        tasks = _heaviest_first(tasks, sizes)
        plans.append((_makespan([float(_weight(t, sizes)) for t in tasks], slots), tasks))
    best = min(makespan for makespan, _ in plans)
    return next(tasks for makespan, tasks in plans if makespan <= best * (1 + FINER_CUT_MIN_GAIN))


def _capped(
    chosen: list[OffsetRange],
    sizes: Mapping[tuple[str, int], Fraction],
    max_task_records: int | None,
    min_tasks: int,
) -> list[OffsetRange]:
    """Spark's two caps: tasks of at most max_task_records records, then at least min_tasks
    tasks (the heaviest of 2 records or more cut into halves)."""
    if max_task_records is not None:
        chosen = [piece for task in chosen for piece in _even_cut(task, max_task_records)]
    # Heaviest first (ties by topic, partition, start): heapq pops the smallest key.
    heap = [((-_weight(t, sizes), t.topic, t.partition, t.start), t) for t in chosen]
    heapq.heapify(heap)
    done: list[OffsetRange] = []
    while len(heap) + len(done) < min_tasks and heap:
        _, task = heapq.heappop(heap)
        if task.records < 2:
            done.append(task)
            continue
        for half in _even_cut(task, math.ceil(task.records / 2)):
            key = (-_weight(half, sizes), half.topic, half.partition, half.start)
            heapq.heappush(heap, (key, half))
    return _heaviest_first(done + [task for _, task in heap], sizes)


def _even_cut(task: OffsetRange, max_records: int) -> list[OffsetRange]:
    """task in ceil(records / max_records) pieces whose sizes differ by at most one record."""
    count = math.ceil(task.records / max_records)
    if count <= 1:
        return [task]
    size, extra = divmod(task.records, count)
    pieces = []
    start = task.start
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        pieces.append(OffsetRange(task.topic, task.partition, start, end))
        start = end
    return pieces


def _cut(offset_range: OffsetRange, piece_records: int, min_last: int) -> list[OffsetRange]:
    """Pieces of piece_records records from the start; a last piece below min_last joins the
    one before it."""
    starts = list(range(offset_range.start, offset_range.end, piece_records))
    if len(starts) > 1 and offset_range.end - starts[-1] < min_last:
        starts.pop()
    ends = [*starts[1:], offset_range.end]
    return [
        OffsetRange(offset_range.topic, offset_range.partition, start, end)
        for start, end in zip(starts, ends, strict=True)
    ]


def _makespan(weights: Sequence[float], slots: int) -> float:
    """When the last slot finishes if each task, in order, goes to the slot free first.

    Floats, not fractions: this only ranks cuts, and exact sums of many byte estimates cost
    seconds."""
    free_at = [0.0] * slots
    for task_weight in weights:
        heapq.heappush(free_at, heapq.heappop(free_at) + task_weight)
    return max(free_at)

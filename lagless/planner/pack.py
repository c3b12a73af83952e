"""Pack small pieces into fewer tasks, so a small batch is not paid for in task launches.

A Spark task costs about 50 ms of fixed work on a small machine (launch, serialization, a trip
through a Python worker) whatever it reads. A continuous import's micro-batch of a few thousand
records over 24 partitions would be 24 such tasks, about 1.5 s on two cores, for under a
millisecond of reading; packed into one task that reads its pieces it is 0.4 s.
Large batches are left as the split planned them: packing only happens when the whole batch
weighs less than one task's minimum per piece.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

from lagless.planner.ranges import OffsetRange, record_sizes

# Assumed size of a record when no partition has an estimate (a failed sample): large enough
# that an unknown backlog is never packed into too few tasks.
UNKNOWN_RECORD_BYTES = 1024

Task = tuple[OffsetRange, ...]


def pack_tasks(
    pieces: Sequence[OffsetRange],
    min_task_bytes: int,
    bytes_per_record: Mapping[tuple[str, int], float] | None = None,
) -> list[Task]:
    """Group pieces into n = min(len(pieces), ceil(total / min_task_bytes)) tasks (at least 1).

    A piece weighs its records times the estimated bytes of one of its records
    (bytes_per_record; a partition missing there gets the mean of the known ones; without any
    estimate UNKNOWN_RECORD_BYTES). Pieces go largest first to the lightest task (ties by
    (topic, partition, start), then the lowest task). So:

    - every piece is in exactly one task, and a task lists its pieces by (topic, partition,
      start); empty pieces are dropped;
    - when n equals the number of pieces, each task is one piece in the order given: the
      split's plan stands;
    - every task weighs at most total / n plus its heaviest piece, so under min_task_bytes
      plus the heaviest piece of the batch when pieces were packed;
    - packed tasks come heaviest first, as Spark should start them (the split already orders
      its pieces so).

    Raises ValueError when min_task_bytes is below 1.
    """
    if min_task_bytes < 1:
        raise ValueError(f"min_task_bytes must be at least 1, not {min_task_bytes}")
    work = [piece for piece in pieces if piece.records > 0]
    if not work:
        return []
    keys = {piece.key for piece in work}
    sizes = (
        record_sizes(keys, bytes_per_record)
        if bytes_per_record
        else dict.fromkeys(keys, Fraction(UNKNOWN_RECORD_BYTES))
    )
    weights = [piece.records * sizes[piece.key] for piece in work]
    total = sum(weights, Fraction(0))
    count = min(len(work), max(1, math.ceil(total / min_task_bytes)))
    if count == len(work):
        return [(piece,) for piece in work]

    order = sorted(range(len(work)), key=lambda i: (-weights[i], work[i]))
    lightest: list[tuple[Fraction, int]] = [(Fraction(0), slot) for slot in range(count)]
    members: list[list[OffsetRange]] = [[] for _ in range(count)]
    for index in order:
        weight, slot = heapq.heappop(lightest)
        members[slot].append(work[index])
        heapq.heappush(lightest, (weight + weights[index], slot))
    loads = dict((slot, weight) for weight, slot in lightest)
    ranked = sorted(range(count), key=lambda slot: (-loads[slot], slot))
    return [tuple(sorted(members[slot])) for slot in ranked]


def pack_tasks_per_topic(
    pieces: Sequence[OffsetRange],
    min_task_bytes: int,
    bytes_per_record: Mapping[tuple[str, int], float] | None = None,
) -> list[Task]:
    """pack_tasks for each topic's pieces apart, so that every task reads one topic (a routed
    import's task writes into its topic's table); the tasks of all topics heaviest first,
    as pack_tasks orders its own (ties by their first piece)."""
    topics = sorted({piece.topic for piece in pieces})
    tasks = [
        task
        for topic in topics
        for task in pack_tasks(
            [piece for piece in pieces if piece.topic == topic], min_task_bytes, bytes_per_record
        )
    ]
    sizes = record_sizes({piece.key for task in tasks for piece in task}, bytes_per_record)
    return sorted(tasks, key=lambda task: (-sum(p.records * sizes[p.key] for p in task), task[0]))

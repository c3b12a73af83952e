"""Split offset ranges into tasks so every task slot stays busy until the backlog is gone.

A Kafka consumer group can give a partition to one thread only: when partitions differ in
backlog, the threads holding the short ones finish early and sit idle while a few others
crawl through the long ones. lagless plans on the driver instead: a long range becomes
several tasks, so Spark can hand a free slot the next piece of whatever work is left.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

from lagless.planner.ranges import OffsetRange, record_sizes


def plan_tasks(
    ranges: Sequence[OffsetRange],
    slots: int,
    bytes_per_record: Mapping[tuple[str, int], float] | None = None,
    min_task_records: int = 1,
) -> list[OffsetRange]:
    """The tasks that read ranges on slots parallel task slots, largest weight first.

    A range's weight is its records times the estimated bytes of one of its records
    (bytes_per_record; a partition missing there gets the mean of the known ones; without
    it every record weighs 1). Each range is cut into ceil(weight * slots / total weight)
    contiguous pieces whose sizes differ by at most one record, so:

    - balance: every piece weighs less than total / slots + one record of its partition,
      unless min_task_records stopped the split; then the piece holds fewer than
      2 * min_task_records records (and at least min_task_records, or the whole range);
    - count: there are fewer than slots + len(non-empty ranges) tasks;
    - the pieces cover every input offset exactly once; empty ranges yield no task.

    Ties in weight are ordered by (topic, partition, start), so a plan is reproducible.
    Raises ValueError when slots or min_task_records is below 1, when a range ends before it
    starts, or when two ranges of one partition overlap.
    """
    if slots < 1:
        raise ValueError(f"slots must be at least 1, not {slots}")
    if min_task_records < 1:
        raise ValueError(f"min_task_records must be at least 1, not {min_task_records}")
    for offset_range in ranges:
        if offset_range.start > offset_range.end:
            raise ValueError(f"{offset_range} ends before it starts")
    work = sorted(r for r in ranges if r.records > 0)
    for before, after in itertools.pairwise(work):
        if before.key == after.key and before.end > after.start:
            raise ValueError(f"{before} and {after} overlap")

    sizes = record_sizes({r.key for r in work}, bytes_per_record)
    total = sum((r.records * sizes[r.key] for r in work), Fraction(0))
    tasks: list[OffsetRange] = []
    for offset_range in work:
        for_balance = math.ceil(offset_range.records * sizes[offset_range.key] * slots / total)
        most_allowed = max(1, offset_range.records // min_task_records)
        tasks.extend(offset_range.split(min(for_balance, most_allowed)))
    return sorted(tasks, key=lambda t: (-t.records * sizes[t.key], t.topic, t.partition, t.start))

"""Bytes per record of each partition, from a few records read at the start of its range.

The planner weighs tasks by bytes, so a partition of 800 KB records (seed 002) is split
far finer than one of 100 B records with the same count.
"""

from __future__ import annotations

from collections.abc import Sequence

from lagless.kafka.records import Records
from lagless.planner.ranges import OffsetRange

SAMPLE_RECORDS = 16


def sample_bytes_per_record(
    records: Records, ranges: Sequence[OffsetRange]
) -> dict[tuple[str, int], float]:
    read = records.at(
        {r.key: r.start for r in ranges}, {r.key: min(SAMPLE_RECORDS, r.records) for r in ranges}
    )
    return {
        tp: sum(r.size_bytes for r in records) / len(records)
        for tp, records in read.items()
        if records
    }

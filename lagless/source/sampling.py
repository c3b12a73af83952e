"""Bytes per record of each partition, from a few records read at the start of its range.

The planner weighs tasks by bytes, so a partition of 800 KB records (seed 002) is split
far finer than one of 100 B records with the same count.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from lagless.kafka import TP
from lagless.kafka.records import Records
from lagless.planner.ranges import OffsetRange

SAMPLE_RECORDS = 16
# How long a sample waits for a partition's records (Records.at's default).
SAMPLE_WAIT_S = 3.0

log = logging.getLogger(__name__)


def sample_bytes_per_record(
    records: Records, ranges: Sequence[OffsetRange]
) -> dict[tuple[str, int], float]:
    read = records.at(
        {r.key: r.start for r in ranges},
        {r.key: min(SAMPLE_RECORDS, r.records) for r in ranges},
        timeout_s=SAMPLE_WAIT_S,
    )
    return {
        tp: sum(r.size_bytes for r in records) / len(records)
        for tp, records in read.items()
        if records
    }


def sample_meanwhile(
    records: Records, starts: Mapping[TP, int], ends: Mapping[TP, int]
) -> Callable[[], dict[TP, float]]:
    """Sample the ranges from `starts` to `ends` in a thread of their own (lagless import does
    while Spark starts); the function returned waits for the sizes. A failed read gives none:
    the planner then samples itself."""
    ranges = [
        OffsetRange(t, p, starts[t, p], end) for (t, p), end in ends.items() if (t, p) in starts
    ]
    found: dict[TP, float] = {}

    def sample() -> None:
        try:
            found.update(sample_bytes_per_record(records, [r for r in ranges if r.records > 0]))
        except Exception:  # any: the planner samples these itself, and says what fails
            log.debug("sizes not sampled before the query", exc_info=True)

    thread = threading.Thread(target=sample, name="sample-sizes", daemon=True)
    thread.start()

    def result() -> dict[TP, float]:
        thread.join()
        return found

    return result

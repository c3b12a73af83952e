"""How far behind in time a committed offset is, after kafka-lag-exporter.

Each sample pairs a partition's end offset with the time it was seen; the time the record
at the committed offset was written is read off that table by linear interpolation
(extrapolation with the table's overall rate when the offset is older than the table).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from lagless.lag.offsets import PartitionSample


def interpolated_lag_seconds(history: Sequence[PartitionSample]) -> float | None:
    """Seconds between the latest sample and when its committed offset was the log end.

    None when the samples cannot say: fewer than two distinct end offsets, so no rate.
    """
    latest = history[-1]
    if latest.lag == 0:
        return 0.0
    if history[0].end >= latest.end:  # the end never moved: no table to read (and serve asks
        return None  # this of every lagging partition each round)
    offset = latest.end - latest.lag
    points = _end_offset_table(history)
    if len(points) < 2:
        return None
    for (early_end, early_at), (late_end, late_at) in itertools.pairwise(points):
        if early_end <= offset <= late_end:
            written_at = early_at + (offset - early_end) * (late_at - early_at) / (
                late_end - early_end
            )
            return max(0.0, latest.at - written_at)
    (first_end, first_at), (last_end, last_at) = points[0], points[-1]
    if offset > last_end:
        return 0.0
    records_per_s = (last_end - first_end) / (last_at - first_at)
    return max(0.0, latest.at - (first_at - (first_end - offset) / records_per_s))


def _end_offset_table(history: Sequence[PartitionSample]) -> list[tuple[int, float]]:
    """(end offset, first time seen) for each distinct end offset, in increasing order."""
    table: list[tuple[int, float]] = []
    for sample in history:
        if table and sample.end <= table[-1][0]:
            continue
        table.append((sample.end, sample.at))
    return table

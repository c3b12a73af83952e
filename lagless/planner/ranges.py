"""Offset ranges: the unit the driver plans and an executor reads."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets [start, end) of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def records(self) -> int:
        return self.end - self.start

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)


def record_sizes(
    keys: Iterable[tuple[str, int]],
    bytes_per_record: Mapping[tuple[str, int], float] | None,
) -> dict[tuple[str, int], Fraction]:
    """The estimated size of one record of each partition in keys, as an exact fraction.

    A partition missing from bytes_per_record gets the mean of the known ones. Without any
    estimate every record counts as 1, so weights become plain record counts. Fractions keep
    the planner's bounds exact: no float rounding can push a piece over its bound.
    """
    if not bytes_per_record:
        return dict.fromkeys(keys, Fraction(1))
    for key, size in bytes_per_record.items():
        if not (math.isfinite(size) and size > 0):
            raise ValueError(f"bytes per record of {key} must be a positive number, not {size}")
    known = {key: Fraction(size) for key, size in bytes_per_record.items()}
    mean = sum(known.values(), Fraction(0)) / len(known)
    return {key: known.get(key, mean) for key in keys}

"""Per-batch limits: how far one micro-batch reads, like Spark's maxOffsetsPerTrigger."""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

from lagless.planner.ranges import record_sizes

Key = tuple[str, int]


def limit_batch(
    start: Mapping[Key, int],
    latest: Mapping[Key, int],
    max_records: int | None = None,
    max_bytes: int | None = None,
    bytes_per_record: Mapping[Key, float] | None = None,
) -> dict[Key, int]:
    """The end offset of each partition for one micro-batch that begins at start.

    Every partition reads the same fraction of its backlog (latest - start), the largest
    fraction within both limits, rounded down to whole records; the records that rounding
    left unread within the limits go one each to the partitions with the largest rounded-off
    part (ties by key). So the batch holds exactly min(max_records, backlog) records when only
    max_records is set, and its estimated bytes (records times bytes_per_record, a partition
    missing there counting as the mean of the known ones) never exceed max_bytes, except
    that a batch always reads at least one record when any is available: a single record
    larger than max_bytes cannot stall a query. Without limits the batch reads up to latest.

    Raises ValueError when start and latest name different partitions, when latest is before
    start, when a limit is below 1, or when max_bytes comes without bytes_per_record while
    there is something to read.
    """
    _check(start, latest, max_records, max_bytes)
    backlog = {key: latest[key] - offset for key, offset in start.items()}
    total_records = sum(backlog.values())
    if total_records == 0:
        return dict(latest)
    if max_bytes is not None and not bytes_per_record:
        raise ValueError("max_bytes needs bytes_per_record to estimate the size of a batch")
    sizes = record_sizes(backlog, bytes_per_record if max_bytes is not None else None)
    total_bytes = _bytes(backlog, sizes)
    share = Fraction(1)
    if max_records is not None:
        share = min(share, Fraction(max_records, total_records))
    if max_bytes is not None:
        share = min(share, max_bytes / total_bytes)
    if share == 1:
        return dict(latest)

    quota = {key: share * records for key, records in backlog.items()}
    records_left = max_records or total_records
    bytes_left = max_bytes or total_bytes
    take = _rounded(quota, sizes, records_left, bytes_left)
    if sum(take.values()) == 0:
        take[min(backlog, key=lambda k: (-backlog[k], k))] = 1
    return {key: offset + take[key] for key, offset in start.items()}


def _check(
    start: Mapping[Key, int],
    latest: Mapping[Key, int],
    max_records: int | None,
    max_bytes: int | None,
) -> None:
    """limit_batch's ValueErrors about its arguments."""
    if start.keys() != latest.keys():
        raise ValueError(f"start and latest name different partitions: {start} vs {latest}")
    for key, offset in start.items():
        if latest[key] < offset:
            raise ValueError(f"{key}: latest offset {latest[key]} is before start {offset}")
    for name, limit in (("max_records", max_records), ("max_bytes", max_bytes)):
        if limit is not None and limit < 1:
            raise ValueError(f"{name} must be at least 1, not {limit}")


def _rounded(
    quota: Mapping[Key, Fraction],
    sizes: Mapping[Key, Fraction],
    records_limit: int,
    bytes_limit: Fraction | int,
) -> dict[Key, int]:
    """Each partition's quota rounded down to whole records, then the records that rounding
    left unread within the limits one each to the partitions with the largest rounded-off
    part (ties by key)."""
    take = {key: math.floor(part) for key, part in quota.items()}
    records_left = records_limit - sum(take.values())
    bytes_left = bytes_limit - _bytes(take, sizes)
    for key in sorted(quota, key=lambda k: (take[k] - quota[k], k)):
        if records_left < 1:
            break
        if take[key] < quota[key] and sizes[key] <= bytes_left:
            take[key] += 1
            records_left -= 1
            bytes_left -= sizes[key]
    return take


def _bytes(take: Mapping[Key, int], sizes: Mapping[Key, Fraction]) -> Fraction:
    return sum((records * sizes[key] for key, records in take.items()), Fraction(0))


def rate_limit(start: Mapping[Key, int], latest: Mapping[Key, int], limit: int) -> dict[Key, int]:
    """Spark's maxOffsetsPerTrigger (KafkaMicroBatchStream.rateLimit), offset for offset: each
    partition with a backlog reads limit * its share of the total backlog, rounded down, or
    rounded up when below one so that no partition starves (the batch may then hold a few
    offsets more than limit); never beyond latest."""
    backlog = {key: latest[key] - start[key] for key in latest if latest[key] > start[key]}
    total = sum(backlog.values())
    if total < 1:
        return dict(latest)
    end = dict(latest)
    for key, size in backlog.items():
        prorate = limit * (size / total)
        share = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        end[key] = min(latest[key], start[key] + share)
    return end


def fewest_partitions(
    start: Mapping[Key, int], latest: Mapping[Key, int], count: int
) -> dict[Key, int]:
    """latest for the `count` partitions with the most records left (ties by key), start for
    the others: a query's small first batch reads from few partitions, as each range a task
    starts costs a fetch at a new offset (a quarter second on some brokers), while a few
    partitions bring its rows as soon as all would. The batches after it read them all."""
    if count < 1:
        raise ValueError(f"count must be at least 1, not {count}")
    backlog = {key: latest[key] - offset for key, offset in start.items() if latest[key] > offset}
    chosen = sorted(backlog, key=lambda key: (-backlog[key], key))[:count]
    return {key: latest[key] if key in chosen else offset for key, offset in start.items()}

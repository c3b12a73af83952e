"""A group's lag, partition by partition, from the samples taken so far."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from lagless.lag.offsets import OffsetSource, PartitionSample, RecordInfo
from lagless.lag.status import Status, group_status, partition_status
from lagless.lag.timelag import interpolated_lag_seconds


@dataclass
class History:
    """Samples per partition, oldest first, forgetting those older than keep_s."""

    keep_s: float
    samples: dict[tuple[str, int], list[PartitionSample]] = field(default_factory=dict)

    def add(self, samples: Iterable[PartitionSample]) -> None:
        for sample in samples:
            kept = self.samples.setdefault(sample.key, [])
            kept.append(sample)
            while sample.at - kept[0].at > self.keep_s:
                kept.pop(0)

    def latest(self) -> list[PartitionSample]:
        return [self.samples[key][-1] for key in sorted(self.samples)]


@dataclass(frozen=True)
class LagRow:
    topic: str
    partition: int
    committed: int | None
    end: int
    lag: int
    lag_seconds: float | None
    status: Status

    def as_json(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "committed": self.committed,
            "end": self.end,
            "lag": self.lag,
            "lag_seconds": None if self.lag_seconds is None else round(self.lag_seconds, 3),
            "status": self.status.name,
        }


@dataclass(frozen=True)
class LagReport:
    group: str
    rows: list[LagRow]

    @property
    def total_lag(self) -> int:
        return sum(row.lag for row in self.rows)

    @property
    def status(self) -> Status:
        return group_status(row.status for row in self.rows)

    def as_json(self) -> dict[str, object]:
        return {
            "group": self.group,
            "total_lag": self.total_lag,
            "status": self.status.name,
            "partitions": [row.as_json() for row in self.rows],
        }


def build_report(
    group: str,
    history: History,
    window_s: float,
    records: Mapping[tuple[str, int], RecordInfo] | None = None,
) -> LagReport:
    """Rows for the latest samples. lag_seconds is exact where the committed record is known
    (the sample's time minus the record's timestamp), else interpolated from the samples."""
    rows = []
    for key in sorted(history.samples):
        samples = history.samples[key]
        latest = samples[-1]
        record = (records or {}).get(key)
        if record is not None and record.timestamp_s is not None and latest.lag > 0:
            lag_seconds: float | None = max(0.0, latest.at - record.timestamp_s)
        else:
            lag_seconds = interpolated_lag_seconds(samples)
        rows.append(
            LagRow(
                topic=latest.topic,
                partition=latest.partition,
                committed=latest.committed,
                end=latest.end,
                lag=latest.lag,
                lag_seconds=lag_seconds,
                status=partition_status(samples, window_s),
            )
        )
    return LagReport(group=group, rows=rows)


def collect(
    source: OffsetSource,
    history: History,
    seconds: float,
    interval_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Sample now and then every interval_s until `seconds` have passed."""
    history.add(source.sample())
    for _ in range(round(seconds / interval_s) if interval_s > 0 else 0):
        sleep(interval_s)
        history.add(source.sample())


def committed_records(
    source: OffsetSource,
    history: History,
    cache: dict[tuple[str, int], tuple[int, RecordInfo]] | None = None,
) -> dict[tuple[str, int], RecordInfo]:
    """The record at the committed offset of each lagging partition, for an exact time lag.

    cache (partition -> (offset, record)) keeps what was read, so a record is read once per
    committed offset however often the caller samples; records before the log start are gone
    and not asked for (the read would only wait for its timeout).
    """
    known = {} if cache is None else cache
    lagging = {key: samples[-1] for key, samples in history.samples.items() if samples[-1].lag > 0}
    offsets = {key: sample.end - sample.lag for key, sample in lagging.items()}
    unread = [
        sample
        for key, sample in lagging.items()
        if offsets[key] >= sample.low and known.get(key, (None,))[0] != offsets[key]
    ]
    if unread:
        for key, record in source.record_at(unread).items():
            known[key] = (offsets[key], record)
    for key in [key for key in known if key not in lagging]:
        del known[key]
    return {key: known[key][1] for key in lagging if key in known and known[key][0] == offsets[key]}

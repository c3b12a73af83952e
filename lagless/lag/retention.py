"""Retention risk: how soon the broker deletes records a group has not read yet.

Two independent estimates per lagging partition, both pure:
- by rate: the records between the log start and the committed offset, divided by how fast
  the log start advanced over the samples kept (Kafka deletes whole segments, so on a real
  broker the log start moves in jumps and this rate is coarse over a short history);
- by retention.ms (where DescribeConfigs answers): the record at the committed offset is
  deleted once it is older than retention.ms (at the latest: a segment goes when its newest
  record is that old, so this is the earliest the record can go and the right one to warn on).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lagless.lag.offsets import PartitionSample


@dataclass(slots=True)
class RetentionRisk:
    """Never changed once made (not frozen only for speed: see PartitionLag)."""

    topic: str
    partition: int
    records_left: int
    """Records between the log start and the committed offset; negative: already deleted."""
    log_start_per_s: float
    """How fast the log start advanced over the samples kept (records per second)."""
    seconds_by_rate: float | None
    """Until the log start reaches the committed offset at that rate; None: it does not move."""
    deleted_at: float | None
    """When the committed record is older than retention.ms (its timestamp plus retention.ms):
    a moment, so the margin counts down between samples as the truth does; None: unknown or
    unlimited."""
    as_of: float
    """When the risk was judged (its latest sample): the margins count from it unless told
    another moment."""

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    @property
    def lost(self) -> bool:
        return self.records_left < 0

    def seconds_by_retention(self, now: float | None = None) -> float | None:
        """Until the committed record is older than retention.ms, as of now (default: as_of)."""
        if self.deleted_at is None:
            return None
        return max(0.0, self.deleted_at - (self.as_of if now is None else now))

    def seconds_left(self, now: float | None = None) -> float | None:
        """The sooner of the two estimates; 0 once records were lost."""
        if self.lost:
            return 0.0
        by_retention = self.seconds_by_retention(now)
        known = [s for s in (self.seconds_by_rate, by_retention) if s is not None]
        return min(known, default=None)

    def at_risk(self, warning_s: float, now: float | None = None) -> bool:
        left = self.seconds_left(now)
        return left is not None and left < warning_s


def log_start_rate(samples: Sequence[PartitionSample]) -> float:
    """Records per second the log start advanced from the first sample to the latest."""
    first, latest = samples[0], samples[-1]
    if latest.at <= first.at or latest.low <= first.low:
        return 0.0
    return (latest.low - first.low) / (latest.at - first.at)


def retention_risk(
    samples: Sequence[PartitionSample],
    retention_ms: int | None = None,
    committed_record_at: float | None = None,
    now: float | None = None,
) -> RetentionRisk | None:
    """The risk for one partition from its samples, oldest first; None when it does not lag
    or the group never committed there (it then starts wherever its reset policy says)."""
    latest = samples[-1]
    if latest.lag == 0 or latest.committed is None:
        return None
    records_left = latest.committed - latest.low
    rate = log_start_rate(samples)
    if records_left < 0:
        by_rate: float | None = 0.0
    else:
        # At the log start exactly, nothing is lost yet and nothing will be unless it moves.
        by_rate = records_left / rate if rate > 0 else None
    deleted_at = None
    if retention_ms is not None and committed_record_at is not None:
        deleted_at = committed_record_at + retention_ms / 1000
    return RetentionRisk(
        topic=latest.topic,
        partition=latest.partition,
        records_left=records_left,
        log_start_per_s=rate,
        seconds_by_rate=by_rate,
        deleted_at=deleted_at,
        as_of=latest.at if now is None else now,
    )

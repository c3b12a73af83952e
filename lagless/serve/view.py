"""What the service shows of a group: immutable views built from the samples, no broker calls.

Metrics, the JSON API and the dashboard all read these, so they agree. The time lag is
computed when a view is read (`lag_seconds(now)`), not when it was sampled: a stopped group's
lag keeps growing between samples, as the truth does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lagless.lag.doctor import Examination, Finding, diagnose
from lagless.lag.members import GroupDescription
from lagless.lag.offsets import RecordInfo
from lagless.lag.report import History, build_report
from lagless.lag.retention import RetentionRisk, retention_risk
from lagless.lag.status import Status
from lagless.lag.timelag import interpolated_lag_seconds

EXACT = "exact"
INTERPOLATED = "interpolated"


@dataclass(frozen=True)
class PartitionView:
    topic: str
    partition: int
    committed: int | None
    log_start: int
    end: int
    lag: int
    status: Status
    sampled_at: float
    committed_record_at: float | None
    """Timestamp of the record at the committed offset (the oldest one not read)."""
    interpolated_age_s: float | None
    """The committed offset's age at sampled_at, interpolated from end offsets over time."""
    retention: RetentionRisk | None

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    def lag_seconds(self, now: float) -> tuple[float | None, str | None]:
        """(seconds, method): exact from the committed record's timestamp, else interpolated
        (labelled so), else (None, None)."""
        if self.lag == 0:
            return 0.0, EXACT
        if self.committed_record_at is not None:
            return max(0.0, now - self.committed_record_at), EXACT
        if self.interpolated_age_s is not None:
            return self.interpolated_age_s + max(0.0, now - self.sampled_at), INTERPOLATED
        return None, None


@dataclass(frozen=True)
class SeriesPoint:
    at: float
    total_lag: int
    max_lag_seconds: float | None


@dataclass(frozen=True)
class GroupView:
    group: str
    partitions: tuple[PartitionView, ...]
    status: Status
    state: str | None
    """The broker's group state (Stable, Empty, ...) where DescribeGroups answers."""
    members: int | None
    sampled_at: float | None
    """When the latest successful sample was taken; None before the first."""
    error: str | None
    """Why the latest sample failed; None when it succeeded."""
    findings: tuple[Finding, ...]
    series: tuple[SeriesPoint, ...]
    retention_warning_s: float

    @property
    def total_lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    @property
    def max_lag(self) -> int:
        return max((p.lag for p in self.partitions), default=0)

    def max_lag_seconds(self, now: float) -> float | None:
        known = [s for s, _ in (p.lag_seconds(now) for p in self.partitions) if s is not None]
        return max(known, default=None)


def partition_views(
    history: History,
    window_s: float,
    records: Mapping[tuple[str, int], RecordInfo],
    retention_ms: Mapping[str, int | None] | None,
) -> tuple[list[PartitionView], dict[tuple[str, int], RetentionRisk]]:
    report = build_report("", history, window_s)
    statuses = {(row.topic, row.partition): row.status for row in report.rows}
    views = []
    risks = {}
    for key in sorted(history.samples):
        samples = history.samples[key]
        latest = samples[-1]
        record = records.get(key)
        record_at = None if record is None else record.timestamp_s
        risk = retention_risk(
            samples,
            retention_ms=None if retention_ms is None else retention_ms.get(latest.topic),
            committed_record_at=record_at,
        )
        if risk is not None:
            risks[key] = risk
        views.append(
            PartitionView(
                topic=latest.topic,
                partition=latest.partition,
                committed=latest.committed,
                log_start=latest.low,
                end=latest.end,
                lag=latest.lag,
                status=statuses[key],
                sampled_at=latest.at,
                committed_record_at=record_at if latest.lag > 0 else None,
                interpolated_age_s=interpolated_lag_seconds(samples),
                retention=risk,
            )
        )
    return views, risks


def group_view(
    group: str,
    history: History,
    window_s: float,
    records: Mapping[tuple[str, int], RecordInfo],
    description: GroupDescription | None,
    retention_ms: Mapping[str, int | None] | None,
    retention_warning_s: float,
    series: Sequence[SeriesPoint],
    sampled_at: float | None,
    error: str | None,
) -> GroupView:
    """The view of a group from what its sampler gathered; findings are the doctor's."""
    if not history.samples:
        return GroupView(
            group, (), Status.OK, None, None, sampled_at, error, (), tuple(series),
            retention_warning_s,
        )  # fmt: skip
    partitions, risks = partition_views(history, window_s, records, retention_ms)
    exam = Examination(
        report=build_report(group, history, window_s, records),
        history=history,
        records=records,
        memberships=None if description is None else [description],
        sampled_s=window_s,
        retention=risks,
    )
    return GroupView(
        group=group,
        partitions=tuple(partitions),
        status=exam.report.status,
        state=None if description is None else description.state,
        members=None if description is None else len(description.members),
        sampled_at=sampled_at,
        error=error,
        findings=tuple(diagnose(exam, retention_warning_s=retention_warning_s)),
        series=tuple(series),
        retention_warning_s=retention_warning_s,
    )

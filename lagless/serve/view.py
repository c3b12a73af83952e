"""What the service shows of a group: immutable views built from the samples, no broker calls.

Metrics, the JSON API and the dashboard all read these, so they agree; a view's partitions
and findings are the `lag` report's and the doctor's (lag/report.py, lag/doctor.py), built
once per sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lagless.lag.doctor import Examination, Finding, diagnose
from lagless.lag.members import GroupDescription
from lagless.lag.offsets import RecordInfo
from lagless.lag.report import History, PartitionLag, build_report
from lagless.lag.status import Status, group_status


@dataclass(frozen=True)
class SeriesPoint:
    at: float
    total_lag: int
    max_lag_seconds: float | None
    partition_lags: tuple[tuple[str, int, int], ...] = ()
    """(topic, partition, lag) of each partition at that time."""


@dataclass(frozen=True)
class GroupView:
    group: str
    partitions: tuple[PartitionLag, ...]
    """As of the latest successful sample (kept, flagged by error, while sampling fails)."""
    status: Status
    state: str | None
    """The broker's group state (Stable, Empty, ...) where DescribeGroups answers."""
    members: int | None
    sampled_at: float | None
    """When the latest successful sample was taken; None before the first."""
    error: str | None
    """Why the latest sample failed; None when it succeeded."""
    error_since: float | None
    """When sampling began to fail (the first failure of the current outage)."""
    findings: tuple[Finding, ...]
    series: tuple[SeriesPoint, ...]
    retention_warning_s: float

    @property
    def total_lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    @property
    def max_lag(self) -> int:
        return max((p.lag for p in self.partitions), default=0)

    @property
    def up(self) -> bool:
        """The latest sample succeeded."""
        return self.error is None and self.sampled_at is not None

    def max_lag_seconds(self, now: float) -> float | None:
        known = [s for s, _ in (p.lag_seconds(now) for p in self.partitions) if s is not None]
        return max(known, default=None)


@dataclass(frozen=True)
class Sampled:
    """What a group's sampler gathered so far."""

    history: History
    records: Mapping[tuple[str, int], RecordInfo]
    description: GroupDescription | None
    retention_ms: Mapping[str, int | None] | None
    sampled_at: float | None
    error: str | None
    error_since: float | None


def unknown_finding(group: str, error: str, seen_before: bool) -> Finding:
    """Said instead of the doctor's findings while a group cannot be sampled: those were about
    samples that no longer hold."""
    return Finding(
        "unknown",
        f"group {group} could not be sampled: {error}. Its status is unknown"
        + ("; the lag shown is the last one seen." if seen_before else "."),
        "check that the broker is up and reachable from here (address, network, credentials); "
        "sampling resumes by itself when it answers",
    )


def group_view(
    group: str,
    sampled: Sampled,
    window_s: float,
    retention_warning_s: float,
    series: Sequence[SeriesPoint],
) -> GroupView:
    """The view of a group from what its sampler gathered; findings are the doctor's."""
    report = build_report(
        group,
        sampled.history,
        window_s,
        sampled.records,
        sampled.description,
        sampled.retention_ms,
    )
    description = sampled.description
    up = sampled.error is None and sampled.sampled_at is not None
    if sampled.error is not None:
        findings: tuple[Finding, ...] = (unknown_finding(group, sampled.error, bool(report.rows)),)
    elif sampled.sampled_at is None:
        findings = ()
    else:
        exam = Examination(
            report=report,
            history=sampled.history,
            records=sampled.records,
            memberships=None if description is None else [description],
            sampled_s=window_s,
        )
        findings = tuple(diagnose(exam, retention_warning_s=retention_warning_s))
    return GroupView(
        group=group,
        partitions=report.rows,
        status=group_status((p.status for p in report.rows), sampled=up),
        state=None if description is None else description.state,
        members=None if description is None else len(description.members),
        sampled_at=sampled.sampled_at,
        error=sampled.error,
        error_since=sampled.error_since,
        findings=findings,
        series=tuple(series),
        retention_warning_s=retention_warning_s,
    )

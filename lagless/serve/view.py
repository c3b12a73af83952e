"""What the service shows of a group: immutable views built from the samples, no broker calls.

Metrics, the JSON API and the dashboard all read these, so they agree; a view's partitions
and findings are the `lag` report's and the doctor's (lag/report.py, lag/doctor.py), built
once per sample.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from lagless.lag.doctor import Examination, Finding, diagnose
from lagless.lag.members import GroupDescription
from lagless.lag.offsets import RecordInfo
from lagless.lag.report import History, LagReport, PartitionLag, RunHistory
from lagless.lag.status import Status, group_status

# Points kept of a group's lag over time: 20 minutes at serve's default 2 s interval.
SERIES_POINTS = 600
# Points of the short series beside each group in the list (the dashboard's sparklines).
SPARK_POINTS = 60
_ABSENT = -1
# Cache keys (TIMELESS, ...) of a view hold what does not depend on when it was sampled (its
# metrics lines without the time lags): the sampler carries them to the group's next view when
# its rows, status, state and members are the same ones.
TIMELESS = "timeless"


@dataclass(frozen=True)
class SeriesPoint:
    at: float
    total_lag: int
    max_lag_seconds: float | None
    partition_lags: tuple[tuple[str, int, int], ...] = ()
    """(topic, partition, lag) of each partition at that time."""


class Series:
    """A group's lag over time, its last `points` samples, in flat arrays: a fleet of groups
    keeps 4 or 8 bytes per number rather than an object per point. Appended to by the sampler,
    read by the HTTP threads (under a lock, as copies)."""

    def __init__(self, points: int = SERIES_POINTS) -> None:
        self._points = points
        self._lock = threading.Lock()
        self._at = array("d")
        self._total = array("q")
        self._max_seconds = array("d")  # NaN: unknown
        # -1: not read then. 4 bytes a point ("i"), 8 ("q") from a lag past 2**31 - 1 on:
        # 24,000 partitions keep 58 MB rather than 115 at 600 points.
        self._partitions: dict[tuple[str, int], array[int]] = {}

    def append(
        self,
        at: float,
        total_lag: int,
        max_lag_seconds: float | None,
        lags: Mapping[tuple[str, int], int],
    ) -> None:
        with self._lock:
            for key in lags.keys() - self._partitions.keys():
                self._partitions[key] = array("i", [_ABSENT]) * len(self._at)
            self._at.append(at)
            self._total.append(total_lag)
            self._max_seconds.append(math.nan if max_lag_seconds is None else max_lag_seconds)
            for key, kept in self._partitions.items():
                lag = lags.get(key, _ABSENT)
                try:
                    kept.append(lag)
                except OverflowError:
                    self._partitions[key] = array("q", kept)
                    self._partitions[key].append(lag)
            if len(self._at) > self._points:
                columns: list[array[int] | array[float]] = [
                    self._at,
                    self._total,
                    self._max_seconds,
                ]
                for column in [*columns, *self._partitions.values()]:
                    del column[0]

    def __len__(self) -> int:
        return len(self._at)

    def totals(self, last: int) -> list[int]:
        """The last `last` total lags, oldest first."""
        with self._lock:
            return self._total[-last:].tolist() if last else []

    def points(self) -> list[SeriesPoint]:
        with self._lock:
            lags = {key: kept.tolist() for key, kept in self._partitions.items()}
            return [
                SeriesPoint(
                    at,
                    total,
                    None if math.isnan(seconds) else seconds,
                    tuple((t, p, kept[i]) for (t, p), kept in sorted(lags.items()) if kept[i] >= 0),
                )
                for i, (at, total, seconds) in enumerate(
                    zip(self._at, self._total, self._max_seconds, strict=True)
                )
            ]


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
    examination: Examination | None
    """What the doctor judges, where the latest sample succeeded (see findings)."""
    series: Series
    retention_warning_s: float
    by_lagless: bool = False
    """lagless import commits the group's offsets (its --group)."""
    cache: dict[object, object] = field(default_factory=dict, compare=False, repr=False)
    """What is rendered of this view once (its metrics lines, its findings), kept while it is
    the latest (TIMELESS entries: while its group shows the same)."""

    @property
    def total_lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    @property
    def findings(self) -> tuple[Finding, ...]:
        """The doctor's findings (or why the group could not be sampled), diagnosed when first
        asked and kept: a fleet's views are rebuilt every round, and most are never read
        before the next."""
        found = self.cache.get("findings")
        if found is None:
            if self.error is not None:
                found = (unknown_finding(self.group, self.error, bool(self.partitions)),)
            elif self.examination is None:
                found = ()
            else:
                found = tuple(
                    diagnose(
                        self.examination,
                        retention_warning_s=self.retention_warning_s,
                        now=self.sampled_at,
                    )
                )
            self.cache["findings"] = found
        return cast(tuple[Finding, ...], found)

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

    history: History | RunHistory
    records: Mapping[tuple[str, int], RecordInfo]
    description: GroupDescription | None
    retention_ms: Mapping[str, int | None] | None
    sampled_at: float | None
    error: str | None
    error_since: float | None
    by_lagless: bool = False


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
    report: LagReport,
    sampled: Sampled,
    window_s: float,
    retention_warning_s: float,
    series: Series,
) -> GroupView:
    """The view of a group from its report (build_report's rows) and what its sampler
    gathered; findings are the doctor's."""
    description = sampled.description
    up = sampled.error is None and sampled.sampled_at is not None
    exam = None
    if up:
        # The history goes on changing: the doctor keeps what it reads of it (the samples of
        # a partition that moved back), as of now.
        rewound = {row.key for row in report.rows if row.status is Status.REWIND}
        kept = History(
            sampled.history.keep_s,
            {key: sampled.history.of(key) for key in rewound},
        )
        exam = Examination(
            report=report,
            history=kept,
            records=sampled.records,
            memberships=None if description is None else [description],
            sampled_s=window_s,
            by_lagless=sampled.by_lagless,
        )
    return GroupView(
        group=group,
        partitions=report.rows,
        status=group_status((p.status for p in report.rows), sampled=up),
        state=None if description is None else description.state,
        members=None if description is None else len(description.members),
        sampled_at=sampled.sampled_at,
        error=sampled.error,
        error_since=sampled.error_since,
        examination=exam,
        series=series,
        retention_warning_s=retention_warning_s,
        by_lagless=sampled.by_lagless,
    )


def shows_the_same(view: GroupView, before: GroupView) -> bool:
    """The two views show the same but for when they were sampled: the same row objects (the
    sampler keeps a steady partition's row), status, state and members."""
    return (
        view.up == before.up
        and view.status is before.status
        and view.state == before.state
        and view.members == before.members
        and len(view.partitions) == len(before.partitions)
        and all(a is b for a, b in zip(view.partitions, before.partitions, strict=True))
    )


def carry_timeless(view: GroupView, before: GroupView) -> None:
    """What `before` rendered that does not depend on the time, now `view`'s too: called where
    shows_the_same(view, before)."""
    for key, value in before.cache.items():
        if isinstance(key, tuple) and key and key[0] == TIMELESS:
            view.cache.setdefault(key, value)

"""The JSON API's bodies, shaped after Burrow's v3 responses.

Burrow answers `{"error": false, "message": ..., <payload>}`; a group's status carries
`status`, `totallag`, `maxlag`, `partition_count` and `partitions`, each with `status` and
`current_lag`. lagless adds what Burrow lacks: time lag (and how it was found), the log
start and retention margin, the group state, the doctor's findings (as `doctor --json` prints
them) and a short lag series. A group whose latest sample failed has status UNKNOWN, with
`error` and `error_since`; one with nothing to judge yet, NO_COMMITS.
"""

from __future__ import annotations

from collections.abc import Sequence

from lagless.lag.report import PartitionLag
from lagless.serve.view import SPARK_POINTS, GroupView

# Findings that say nothing is wrong: never a group's top finding on the first screen.
QUIET_FINDINGS = frozenset({"healthy"})


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def partition_json(p: PartitionLag, now: float, warning_s: float) -> dict[str, object]:
    seconds, method = p.lag_seconds(now)
    risk = p.retention
    return {
        "topic": p.topic,
        "partition": p.partition,
        "status": p.status.name,
        "committed": p.committed,
        "end": p.end,
        "log_start": p.log_start,
        "current_lag": p.lag,
        "lag_seconds": _round(seconds),
        "lag_seconds_method": method,
        "retention": None
        if risk is None
        else {
            "records_left": risk.records_left,
            "seconds_by_rate": _round(risk.seconds_by_rate),
            "seconds_by_retention_ms": _round(risk.seconds_by_retention(now)),
            "at_risk": risk.at_risk(warning_s, now),
        },
    }


def group_summary(view: GroupView, now: float) -> dict[str, object]:
    """A group as the dashboard's first screen lists it: its status, lag, a short series of its
    total lag (the sparkline) and its worst finding."""
    top = next((f for f in view.findings if f.kind not in QUIET_FINDINGS), None)
    return {
        "group": view.group,
        "status": view.status.name,
        "state": view.state,
        "members": view.members,
        "totallag": view.total_lag,
        "max_lag_seconds": _round(view.max_lag_seconds(now)),
        "partition_count": len(view.partitions),
        "sampled_at": view.sampled_at,
        "error": view.error,
        "error_since": view.error_since,
        "committed_by": "lagless import" if view.by_lagless else None,
        "totallag_history": view.series.totals(SPARK_POINTS),
        "top_finding": None if top is None else {"kind": top.kind, "text": top.text},
    }


def group_status(view: GroupView, now: float) -> dict[str, object]:
    worst = max(view.partitions, key=lambda p: p.lag, default=None)
    return {
        **group_summary(view, now),
        "maxlag": None if worst is None else partition_json(worst, now, view.retention_warning_s),
        "partitions": [partition_json(p, now, view.retention_warning_s) for p in view.partitions],
        "findings": [finding.as_json() for finding in view.findings],
        "series": [
            {
                "at": point.at,
                "total_lag": point.total_lag,
                "max_lag_seconds": point.max_lag_seconds,
                "partitions": [
                    {"topic": topic, "partition": partition, "lag": lag}
                    for topic, partition, lag in point.partition_lags
                ],
            }
            for point in view.series.points()
        ],
    }


def groups_body(views: Sequence[GroupView], now: float) -> dict[str, object]:
    return {
        "error": False,
        "message": "consumer list returned",
        "now": now,
        "groups": [group_summary(view, now) for view in views],
    }


def group_body(view: GroupView, now: float) -> dict[str, object]:
    return {
        "error": False,
        "message": "consumer status returned",
        "now": now,
        "status": group_status(view, now),
    }


def not_found_body(message: str) -> dict[str, object]:
    return {"error": True, "message": message}

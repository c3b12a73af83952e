"""The views in Prometheus's text exposition format (version 0.0.4), written by hand.

Names follow kafka-lag-exporter's where it has the metric, so its dashboards and alerts keep
working; lagless's own metrics start with lagless_. README.md maps them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from lagless.lag.report import PartitionLag
from lagless.lag.status import Status
from lagless.serve.view import GroupView

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# The states a broker reports for a classic consumer group (confluent_kafka's names), each
# exported as 0 or 1 so an alert can match on the state without a series appearing late.
GROUP_STATES = (
    "UNKNOWN",
    "PREPARING_REBALANCING",
    "COMPLETING_REBALANCING",
    "STABLE",
    "DEAD",
    "EMPTY",
)


def _escape(value: str) -> str:
    if "\\" not in value and '"' not in value and "\n" not in value:
        return value
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: object) -> str:
    return ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())


def _number(value: float) -> str:
    if value != value:
        return "NaN"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


# Every family, in the order exposed: (name, help).
FAMILIES: tuple[tuple[str, str], ...] = (
    ("kafka_consumergroup_group_offset", "Committed offset of the group"),
    ("kafka_consumergroup_group_lag", "Records the group has still to read"),
    (
        "kafka_consumergroup_group_lag_seconds",
        "Age of the oldest record not read: now minus the timestamp of the record at "
        'the committed offset (method="exact"), else interpolated from end offsets '
        'over time (method="interpolated")',
    ),
    ("kafka_consumergroup_group_max_lag", "Largest partition lag of the group"),
    ("kafka_consumergroup_group_max_lag_seconds", "Largest time lag of the group"),
    ("kafka_consumergroup_group_sum_lag", "Total lag of the group"),
    ("kafka_consumergroup_group_topic_sum_lag", "Total lag of the group on a topic"),
    ("kafka_partition_latest_offset", "End offset (high watermark) of the partition"),
    ("kafka_partition_earliest_offset", "Log start offset of the partition"),
    ("kafka_consumergroup_poll_time_ms", "Time the last sampling round took"),
    (
        "lagless_consumergroup_status",
        "1 for the group's status (Burrow's evaluation over the window; UNKNOWN while "
        "its sample fails, NO_COMMITS while it has nothing to judge), 0 for others",
    ),
    (
        "lagless_consumergroup_state",
        "1 for the group state the broker reports (DescribeGroups), 0 for others",
    ),
    ("lagless_consumergroup_members", "Members of the group (DescribeGroups)"),
    (
        "lagless_consumergroup_up",
        "1 when the latest sample of the group succeeded, 0 while the broker fails "
        "(and before the first sample)",
    ),
    (
        "lagless_consumergroup_last_sample_timestamp_seconds",
        "When the latest successful sample of the group was taken",
    ),
    (
        "lagless_consumergroup_retention_margin_records",
        "Records between the log start and the committed offset (negative: deleted "
        "before the group read them)",
    ),
    (
        "lagless_consumergroup_retention_margin_seconds",
        "Time until retention deletes the record at the committed offset, by the log "
        'start\'s rate of advance (basis="rate") or by retention.ms '
        '(basis="retention_ms")',
    ),
    (
        "lagless_consumergroup_retention_at_risk",
        "1 when retention will delete records the group has not read within the warning time",
    ),
)
# Families whose values are computed at each scrape (time lags grow between samples); the
# others are rendered once per view (a sampling round) and kept on it.
TIMED = ("kafka_consumergroup_group_lag_seconds", "kafka_consumergroup_group_max_lag_seconds")
Lines = dict[str, list[str]]


def render(
    views: Sequence[GroupView],
    now: float,
    cluster: str,
    poll_time_ms: float | None = None,
) -> str:
    """Every metric of every group, time lags as of `now`. A view's other lines are written
    at its first scrape and kept with it: 2,000 groups of 12 partitions are 20 MB of text,
    rendered once per sampling round rather than at every scrape."""
    lines: Lines = {name: [] for name, _ in FAMILIES}
    partitions_seen: set[tuple[str, int]] = set()
    for view in views:
        static, partition_lines, group, labelled = _view_lines(view, cluster)
        for name, found in static.items():
            lines[name] += found
        for key, own in partition_lines:
            if key not in partitions_seen:
                partitions_seen.add(key)
                for name, line in own:
                    lines[name].append(line)
        _timed_lines(now, group, labelled, lines)
    if poll_time_ms is not None:
        lines["kafka_consumergroup_poll_time_ms"].append(
            f"kafka_consumergroup_poll_time_ms{{{_labels(cluster_name=cluster)}}} "
            f"{_number(poll_time_ms)}"
        )
    out = []
    for name, text in FAMILIES:
        if lines[name]:
            out += [f"# HELP {name} {text}", f"# TYPE {name} gauge", *lines[name]]
    return "\n".join(out) + "\n"


def prepare(views: Sequence[GroupView], cluster: str) -> None:
    """Write the views' lines now (the sampler calls this after its round, while it would
    wait anyway), so the next scrape only adds the time lags."""
    for view in views:
        _view_lines(view, cluster)


PartitionLines = list[tuple[tuple[str, int], list[tuple[str, str]]]]


ViewLines = tuple[Lines, PartitionLines, str, list[tuple[PartitionLag, str]]]


def _view_lines(view: GroupView, cluster: str) -> ViewLines:
    """(the view's lines by family, the partitions' own lines (each partition's once, whatever
    the groups reading it), each partition with its labels), kept on the view."""
    kept = view.cache.get(("metrics", cluster))
    if kept is None:
        kept = _write_view_lines(view, cluster)
        view.cache[("metrics", cluster)] = kept
    return cast(ViewLines, kept)


def _write_view_lines(view: GroupView, cluster: str) -> ViewLines:
    lines: Lines = {}

    def add(name: str, labels: str, value: float) -> None:
        lines.setdefault(name, []).append(f"{name}{{{labels}}} {_number(value)}")

    group = _labels(cluster_name=cluster, group=view.group)
    add("lagless_consumergroup_up", group, int(view.up))
    for status in Status:
        add(
            "lagless_consumergroup_status", f'{group},status="{status.name}"', status == view.status
        )
    if view.sampled_at is not None:
        add("lagless_consumergroup_last_sample_timestamp_seconds", group, view.sampled_at)
    if view.state is not None:
        states = (*GROUP_STATES, view.state) if view.state not in GROUP_STATES else GROUP_STATES
        for state in states:
            labels = f"{group},{_labels(state=state)}"
            add("lagless_consumergroup_state", labels, int(state == view.state))
    if view.members is not None:
        add("lagless_consumergroup_members", group, view.members)
    partition_lines: PartitionLines = []
    labelled: list[tuple[PartitionLag, str]] = []
    if not view.partitions:
        return lines, partition_lines, group, labelled
    add("kafka_consumergroup_group_max_lag", group, view.max_lag)
    add("kafka_consumergroup_group_sum_lag", group, view.total_lag)
    for topic in sorted({p.topic for p in view.partitions}):
        add(
            "kafka_consumergroup_group_topic_sum_lag",
            f"{group},{_labels(topic=topic)}",
            sum(p.lag for p in view.partitions if p.topic == topic),
        )
    for p in view.partitions:
        where = f'{group},{_labels(topic=p.topic)},partition="{p.partition}"'
        labelled.append((p, where))
        if p.committed is not None:
            add("kafka_consumergroup_group_offset", where, p.committed)
        add("kafka_consumergroup_group_lag", where, p.lag)
        if not p.gone:
            on = f'{_labels(cluster_name=cluster, topic=p.topic)},partition="{p.partition}"'
            partition_lines.append(
                (
                    p.key,
                    [
                        (name, f"{name}{{{on}}} {_number(value)}")
                        for name, value in (
                            ("kafka_partition_latest_offset", p.end),
                            ("kafka_partition_earliest_offset", p.log_start),
                        )
                    ],
                )
            )
        risk = p.retention
        if risk is None:
            continue
        add("lagless_consumergroup_retention_margin_records", where, risk.records_left)
        for basis, left in (
            ("rate", risk.seconds_by_rate),
            ("retention_ms", risk.seconds_by_retention),
        ):
            if left is not None:
                add(
                    "lagless_consumergroup_retention_margin_seconds",
                    f'{where},basis="{basis}"',
                    left,
                )
        add(
            "lagless_consumergroup_retention_at_risk",
            where,
            int(risk.at_risk(view.retention_warning_s)),
        )
    return lines, partition_lines, group, labelled


def _timed_lines(
    now: float, group: str, labelled: list[tuple[PartitionLag, str]], lines: Lines
) -> None:
    """The time lags as of now: the record at the committed offset gets older between
    samples, and a stopped group's lag in seconds keeps growing, as the truth does."""
    most: float | None = None
    for p, where in labelled:
        seconds, method = p.lag_seconds(now)
        if seconds is None:
            continue
        most = seconds if most is None else max(most, seconds)
        lines["kafka_consumergroup_group_lag_seconds"].append(
            f'kafka_consumergroup_group_lag_seconds{{{where},method="{method}"}} {_number(seconds)}'
        )
    if most is not None:
        lines["kafka_consumergroup_group_max_lag_seconds"].append(
            f"kafka_consumergroup_group_max_lag_seconds{{{group}}} {_number(most)}"
        )

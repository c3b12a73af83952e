"""The views in Prometheus's text exposition format (version 0.0.4), written by hand.

Names follow kafka-lag-exporter's where it has the metric, so its dashboards and alerts keep
working; lagless's own metrics start with lagless_. README.md maps them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

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

Labels = tuple[tuple[str, str], ...]


@dataclass
class Family:
    name: str
    help: str
    samples: list[tuple[Labels, float]] = field(default_factory=list)

    def add(self, value: float, **labels: object) -> None:
        self.samples.append((tuple((k, str(v)) for k, v in labels.items()), value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if value != value:
        return "NaN"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _text(families: Iterable[Family]) -> str:
    lines = []
    for family in families:
        lines.append(f"# HELP {family.name} {family.help}")
        lines.append(f"# TYPE {family.name} gauge")
        for labels, value in family.samples:
            shown = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            lines.append(f"{family.name}{{{shown}}} {_number(value)}")
    return "\n".join(lines) + "\n"


def render(
    views: Sequence[GroupView],
    now: float,
    cluster: str,
    poll_time_ms: float | None = None,
) -> str:
    """Every metric of every group, time lags as of `now`."""
    f = {
        name: Family(name, text)
        for name, text in (
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
                "1 when retention will delete records the group has not read within the "
                "warning time",
            ),
        )
    }
    partitions_seen: set[tuple[str, int]] = set()
    for view in views:
        group = {"cluster_name": cluster, "group": view.group}
        f["lagless_consumergroup_up"].add(int(view.up), **group)
        for status in Status:
            f["lagless_consumergroup_status"].add(
                int(status == view.status), **group, status=status.name
            )
        if view.sampled_at is not None:
            f["lagless_consumergroup_last_sample_timestamp_seconds"].add(view.sampled_at, **group)
        if view.state is not None:
            states = (*GROUP_STATES, view.state) if view.state not in GROUP_STATES else GROUP_STATES
            for state in states:
                f["lagless_consumergroup_state"].add(int(state == view.state), **group, state=state)
        if view.members is not None:
            f["lagless_consumergroup_members"].add(view.members, **group)
        if not view.partitions:
            continue
        f["kafka_consumergroup_group_max_lag"].add(view.max_lag, **group)
        f["kafka_consumergroup_group_sum_lag"].add(view.total_lag, **group)
        max_seconds = view.max_lag_seconds(now)
        if max_seconds is not None:
            f["kafka_consumergroup_group_max_lag_seconds"].add(max_seconds, **group)
        for topic in sorted({p.topic for p in view.partitions}):
            f["kafka_consumergroup_group_topic_sum_lag"].add(
                sum(p.lag for p in view.partitions if p.topic == topic), **group, topic=topic
            )
        for p in view.partitions:
            where = {**group, "topic": p.topic, "partition": p.partition}
            if p.committed is not None:
                f["kafka_consumergroup_group_offset"].add(p.committed, **where)
            f["kafka_consumergroup_group_lag"].add(p.lag, **where)
            seconds, method = p.lag_seconds(now)
            if seconds is not None:
                f["kafka_consumergroup_group_lag_seconds"].add(seconds, **where, method=method)
            if p.key not in partitions_seen:
                partitions_seen.add(p.key)
                on = {"cluster_name": cluster, "topic": p.topic, "partition": p.partition}
                f["kafka_partition_latest_offset"].add(p.end, **on)
                f["kafka_partition_earliest_offset"].add(p.log_start, **on)
            risk = p.retention
            if risk is None:
                continue
            f["lagless_consumergroup_retention_margin_records"].add(risk.records_left, **where)
            for basis, left in (
                ("rate", risk.seconds_by_rate),
                ("retention_ms", risk.seconds_by_retention),
            ):
                if left is not None:
                    f["lagless_consumergroup_retention_margin_seconds"].add(
                        left, **where, basis=basis
                    )
            f["lagless_consumergroup_retention_at_risk"].add(
                int(risk.at_risk(view.retention_warning_s)), **where
            )
    if poll_time_ms is not None:
        f["kafka_consumergroup_poll_time_ms"].add(poll_time_ms, cluster_name=cluster)
    return _text(family for family in f.values() if family.samples)

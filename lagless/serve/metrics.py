"""The views in Prometheus's text exposition format (version 0.0.4), written by hand.

Names follow kafka-lag-exporter's where it has the metric, so its dashboards and alerts keep
working; lagless's own metrics start with lagless_. README.md maps them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from lagless.lag.report import EXACT, INTERPOLATED, PartitionLag
from lagless.lag.status import Status
from lagless.serve.view import TIMELESS, GroupView

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
    if type(value) is int:  # the usual case (offsets, lags, counts): exact as they are
        return str(value)
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
# Families whose values are computed at each scrape, from moments kept with the view: a time
# lag (and the time left before retention.ms deletes the committed record) grows between
# samples, as the truth does. The other lines of a view are written once and kept with it, and
# with the next views of its group while what they show does not change; a scrape joins them.
TIMED = (
    "kafka_consumergroup_group_lag_seconds",
    "kafka_consumergroup_group_max_lag_seconds",
    "lagless_consumergroup_retention_margin_seconds",
    "lagless_consumergroup_retention_at_risk",
)
_NEVER = math.inf  # an anchor no moment passes: the value is its base, whatever the time


@dataclass(frozen=True, slots=True)
class Rendered:
    """What a view shows in metrics, written once: its lines by family (UTF-8, each ending
    with a newline), its partitions' own lines, and what its timed lines are computed from."""

    lines: dict[str, bytes]
    partitions: tuple[tuple[tuple[str, int], tuple[bytes, bytes]], ...]
    """(partition, its latest and earliest offset lines): each partition's once, however many
    groups read it."""
    group: str
    """The group's labels."""
    lags: tuple[tuple[str, str, float, float], ...]
    """(partition's labels, method, base, anchor) of each time lag known: base + (now -
    anchor), not below base."""
    margins: tuple[tuple[str, float], ...]
    """(partition's labels, when retention.ms deletes the committed record)."""
    risks: tuple[tuple[str, bool, float | None], ...]
    """(partition's labels, at risk whatever the time, deleted_at): at risk too once
    deleted_at is nearer than the warning."""
    warning_s: float
    risks_text: str
    """The risks' lines until risks_until: none of them turns at risk before (the warning is
    hours, the retention days), so a scrape joins them rather than writing each again."""
    risks_until: float


class Exposition:
    """The metrics text of one round's views. Built in the sampling thread after its round;
    `body(now)` joins the views' kept lines by family and adds the time lags."""

    def __init__(
        self, views: Sequence[GroupView], cluster: str, previous: Exposition | None = None
    ) -> None:
        self.cluster = cluster
        self._rendered = [rendered(view, cluster) for view in views]
        self._partitions: list[bytes] = (
            previous._partitions
            if previous is not None and _same(previous._rendered, self._rendered)
            else _partition_lines(self._rendered)
        )
        stamps = [
            f"lagless_consumergroup_last_sample_timestamp_seconds{{{shown.group}}} "
            f"{_number(view.sampled_at)}\n"
            for view, shown in zip(views, self._rendered, strict=True)
            if view.sampled_at is not None
        ]
        self._stamps = "".join(stamps).encode()

    def body(self, now: float, poll_time_ms: float | None = None) -> bytes:
        """Every metric of every view, time lags as of `now`."""
        timed = self._timed(now)
        if poll_time_ms is not None:
            timed["kafka_consumergroup_poll_time_ms"] = (
                f"kafka_consumergroup_poll_time_ms{{{_labels(cluster_name=self.cluster)}}} "
                f"{_number(poll_time_ms)}\n"
            )
        out: list[bytes] = []
        for name, text in FAMILIES:
            if name == _STAMP:
                kept = [self._stamps]
            elif name == _PARTITIONS[0]:
                kept = self._partitions[0::2]
            elif name == _PARTITIONS[1]:
                kept = self._partitions[1::2]
            else:
                kept = [found for shown in self._rendered if (found := shown.lines.get(name))]
            added = timed.get(name, "")
            if any(kept) or added:
                out.append(f"# HELP {name} {text}\n# TYPE {name} gauge\n".encode())
                out += kept
                out.append(added.encode())
        return b"".join(out)

    def _timed(self, now: float) -> dict[str, str]:
        lags: list[str] = []
        most: list[str] = []
        margins: list[str] = []
        risks: list[str] = []
        for shown in self._rendered:
            if shown.lags:
                values = [base + max(0.0, now - anchor) for _, _, base, anchor in shown.lags]
                lags += [
                    f'kafka_consumergroup_group_lag_seconds{{{where},method="{method}"}} '
                    f"{_number(value)}\n"
                    for (where, method, _, _), value in zip(shown.lags, values, strict=True)
                ]
                most.append(
                    f"kafka_consumergroup_group_max_lag_seconds{{{shown.group}}} "
                    f"{_number(max(values))}\n"
                )
            margins += [
                f'lagless_consumergroup_retention_margin_seconds{{{where},basis="retention_ms"}} '
                f"{_number(max(0.0, at - now))}\n"
                for where, at in shown.margins
            ]
            if now <= shown.risks_until:
                risks.append(shown.risks_text)
            else:
                risks.append(_risk_lines(shown.risks, shown.warning_s, now))
        return {
            "kafka_consumergroup_group_lag_seconds": "".join(lags),
            "kafka_consumergroup_group_max_lag_seconds": "".join(most),
            "lagless_consumergroup_retention_margin_seconds": "".join(margins),
            "lagless_consumergroup_retention_at_risk": "".join(risks),
        }


_STAMP = "lagless_consumergroup_last_sample_timestamp_seconds"
_PARTITIONS = ("kafka_partition_latest_offset", "kafka_partition_earliest_offset")


def _same(before: Sequence[Rendered], now: Sequence[Rendered]) -> bool:
    return len(before) == len(now) and all(a is b for a, b in zip(before, now, strict=True))


def _partition_lines(shown: Sequence[Rendered]) -> list[bytes]:
    """Each partition's latest and earliest offset lines, alternately, each partition once."""
    seen: set[tuple[str, int]] = set()
    lines: list[bytes] = []
    for each in shown:
        for key, (end, start) in each.partitions:
            if key not in seen:
                seen.add(key)
                lines += (end, start)
    return lines


class LatestExposition:
    """The exposition of the latest round's views, swapped in whole: the sampling thread
    builds it after each round (`update`, the sampler's after_round), so a scrape never waits
    on judging, only adds the time lags."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self._latest: Exposition | None = None

    def update(self, views: Sequence[GroupView]) -> None:
        self._latest = Exposition(views, self.cluster, self._latest)

    def get(self) -> Exposition | None:
        return self._latest


def render(
    views: Sequence[GroupView],
    now: float,
    cluster: str,
    poll_time_ms: float | None = None,
) -> str:
    """Every metric of every view, time lags as of `now` (`lag --prometheus`; serve keeps an
    Exposition per round)."""
    return Exposition(views, cluster).body(now, poll_time_ms).decode()


def rendered(view: GroupView, cluster: str) -> Rendered:
    """The view's metrics as written once, kept with it (and carried to the next view of its
    group while what they show does not change: view.TIMELESS)."""
    key = (TIMELESS, "metrics", cluster)
    kept = view.cache.get(key)
    if kept is None:
        kept = _render(view, cluster)
        view.cache[key] = kept
    return cast(Rendered, kept)


def _render(view: GroupView, cluster: str) -> Rendered:
    lines: dict[str, list[str]] = {}

    def add(name: str, labels: str, value: float) -> None:  # one line of the view's own
        lines.setdefault(name, []).append(f"{name}{{{labels}}} {_number(value)}\n")

    group = _labels(cluster_name=cluster, group=view.group)
    add("lagless_consumergroup_up", group, int(view.up))
    for status in Status:
        add(
            "lagless_consumergroup_status", f'{group},status="{status.name}"', status == view.status
        )
    if view.state is not None:
        states = (*GROUP_STATES, view.state) if view.state not in GROUP_STATES else GROUP_STATES
        for state in states:
            labels = f"{group},{_labels(state=state)}"
            add("lagless_consumergroup_state", labels, int(state == view.state))
    if view.members is not None:
        add("lagless_consumergroup_members", group, view.members)
    partition_lines: list[tuple[tuple[str, int], tuple[bytes, bytes]]] = []
    lags: list[tuple[str, str, float, float]] = []
    margins: list[tuple[str, float]] = []
    risks: list[tuple[str, bool, float | None]] = []
    if view.partitions:
        add("kafka_consumergroup_group_max_lag", group, view.max_lag)
        add("kafka_consumergroup_group_sum_lag", group, view.total_lag)
        for topic in sorted({p.topic for p in view.partitions}):
            add(
                "kafka_consumergroup_group_topic_sum_lag",
                f"{group},{_labels(topic=topic)}",
                sum(p.lag for p in view.partitions if p.topic == topic),
            )
    warning_s = view.retention_warning_s
    # Each topic's label written once: a group reads all the partitions of few topics.
    topics = {t: _labels(topic=t) for t in {p.topic for p in view.partitions}}
    cluster_label = _labels(cluster_name=cluster)
    for p in view.partitions:
        topic = topics[p.topic]
        where = f'{group},{topic},partition="{p.partition}"'
        if p.committed is not None:
            add("kafka_consumergroup_group_offset", where, p.committed)
        add("kafka_consumergroup_group_lag", where, p.lag)
        timed = _time_lag(p)
        if timed is not None:
            method, base, anchor = timed
            lags.append((where, method, base, anchor))
        if not p.gone:
            on = f'{cluster_label},{topic},partition="{p.partition}"'
            latest = f"kafka_partition_latest_offset{{{on}}} {_number(p.end)}\n"
            earliest = f"kafka_partition_earliest_offset{{{on}}} {_number(p.log_start)}\n"
            partition_lines.append((p.key, (latest.encode(), earliest.encode())))
        risk = p.retention
        if risk is None:
            continue
        add("lagless_consumergroup_retention_margin_records", where, risk.records_left)
        if risk.seconds_by_rate is not None:
            add(
                "lagless_consumergroup_retention_margin_seconds",
                f'{where},basis="rate"',
                risk.seconds_by_rate,
            )
        if risk.deleted_at is not None:
            margins.append((where, risk.deleted_at))
        # At risk whatever the time: records lost, or the log start's rate alone says so.
        always = risk.lost or (
            risk.seconds_by_rate is not None and risk.seconds_by_rate < warning_s
        )
        risks.append((where, always, risk.deleted_at))
    # Each risk's line is the same until its deleted_at is within the warning.
    risks_until = min((at - warning_s for _, _, at in risks if at is not None), default=_NEVER)
    return Rendered(
        {name: "".join(found).encode() for name, found in lines.items()},
        tuple(partition_lines),
        group,
        tuple(lags),
        tuple(margins),
        tuple(risks),
        warning_s,
        _risk_lines(risks, warning_s, -_NEVER),
        risks_until,
    )


def _risk_lines(
    risks: Sequence[tuple[str, bool, float | None]], warning_s: float, now: float
) -> str:
    return "".join(
        f"lagless_consumergroup_retention_at_risk{{{where}}} "
        + ("1\n" if always or (at is not None and max(0.0, at - now) < warning_s) else "0\n")
        for where, always, at in risks
    )


def _time_lag(p: PartitionLag) -> tuple[str, float, float] | None:
    """(method, base, anchor) of the partition's time lag as PartitionLag.lag_seconds computes
    it, so the value at a moment is base + (that moment - anchor), not below base."""
    if p.lag == 0:
        return EXACT, 0.0, _NEVER
    if p.committed_record_at is not None:
        return EXACT, 0.0, p.committed_record_at
    if p.interpolated_age_s is not None:
        return INTERPOLATED, p.interpolated_age_s, p.sampled_at
    return None

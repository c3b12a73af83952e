"""The doctor: what is wrong with a consumer group, in plain words, each finding with its fix.

`diagnose` is pure: it reads samples, the committed records' sizes and, when the broker can
tell, snapshots of who holds which partition. `examine` gathers those from a broker.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from lagless.exceptions import BadInput
from lagless.lag.members import (
    EAGER_ASSIGNORS,
    GroupDescription,
    MembershipSource,
    assigned_partitions,
    held_partitions,
    rebalancing,
)
from lagless.lag.offsets import OffsetSource, PartitionSample, RecordInfo
from lagless.lag.report import (
    History,
    LagReport,
    PartitionLag,
    build_report,
    committed_records,
    watched_span,
)
from lagless.lag.retention import RetentionRisk
from lagless.lag.status import Status

DEFAULT_FETCH_BYTES = 1024 * 1024  # max.partition.fetch.bytes / fetch.message.max.bytes
# Warn while there is still time to add consumers or raise retention: an hour by default.
DEFAULT_RETENTION_WARNING_S = 3600.0


@dataclass(frozen=True)
class Finding:
    kind: str
    """What was found, one word for programs: stop, stall, rewind, idle-consumers, ..."""
    text: str
    fix: str

    def bullet(self) -> str:
        return f"- {self.text}\n  fix: {self.fix}"

    def as_json(self) -> dict[str, str]:
        return {"kind": self.kind, "text": self.text, "fix": self.fix}


@dataclass(frozen=True)
class Examination:
    """Everything the doctor looked at."""

    report: LagReport
    history: History
    records: Mapping[tuple[str, int], RecordInfo]
    memberships: Sequence[GroupDescription] | None
    """Snapshots of who held which partition, oldest first; None: the broker cannot tell."""
    sampled_s: float
    by_lagless: bool = False
    """lagless import commits the group's offsets (its --group): the fixes speak of it."""

    @property
    def retention(self) -> dict[tuple[str, int], RetentionRisk]:
        return {row.key: row.retention for row in self.report.rows if row.retention is not None}

    @property
    def description(self) -> GroupDescription | None:
        """The latest snapshot of the group's members."""
        return self.memberships[-1] if self.memberships else None


def examine(
    group: str,
    source: OffsetSource,
    membership: MembershipSource,
    seconds: float,
    interval_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> Examination:
    """Sample memberships (while the broker answers) and offsets for `seconds`. The partitions
    members hold are sampled too, so a group that has not committed yet is judged by them.

    Bad input when there is nothing to judge: no commit and no member holding a partition."""
    history = History(keep_s=seconds + interval_s)
    snapshots: list[GroupDescription] | None = []
    rounds = max(1, round(seconds / interval_s))
    for round_number in range(rounds + 1):
        if round_number:
            sleep(interval_s)
        if snapshots is not None:
            snapshot = membership.describe(group)
            snapshots = None if snapshot is None else [*snapshots, snapshot]
            source.follow(assigned_partitions(snapshot))
        history.add(source.sample())
    if not history.samples and not (snapshots and snapshots[-1].members):
        raise BadInput(f"group {group!r} has no committed offsets and no members")
    # Judged over what it watched: `lag --window S` judges over the same S, with the same
    # function, and prints the same word.
    window_s = watched_span(history, seconds)
    records = committed_records(source, history)
    records = {**records, **_sizes_of_lagging(source, history, records)}
    report = build_report(group, history, window_s, records, snapshots[-1] if snapshots else None)
    return Examination(report, history, records, snapshots, seconds, source.by_lagless)


def _sizes_of_lagging(
    source: OffsetSource, history: History, known: Mapping[tuple[str, int], RecordInfo]
) -> dict[tuple[str, int], RecordInfo]:
    unread = [s for s in history.latest() if s.lag > 0 and s.key not in known]
    return source.record_at(unread) if unread else {}


def _count(number: int, noun: str) -> str:
    return f"{number} {noun} is" if number == 1 else f"{number} {noun}s are"


def _name(key: tuple[str, int]) -> str:
    return f"{key[0]}:{key[1]}"


def _names(keys: Sequence[tuple[str, int]], most: int = 8) -> str:
    shown = ", ".join(_name(key) for key in keys[:most])
    return shown + (f" and {len(keys) - most} more" if len(keys) > most else "")


def diagnose(
    exam: Examination,
    fetch_bytes: int = DEFAULT_FETCH_BYTES,
    retention_warning_s: float = DEFAULT_RETENTION_WARNING_S,
    now: float | None = None,
) -> list[Finding]:
    """The findings, worst first; a healthy group gets one finding saying so. Retention's
    margins count from `now` (default: each partition's latest sample)."""
    report = exam.report
    rows = {(row.topic, row.partition): row for row in report.rows}
    by_status = {
        status: sorted(key for key, row in rows.items() if row.status == status)
        for status in Status
    }
    findings: list[Finding] = _retention(exam.retention, retention_warning_s, exam.by_lagless, now)
    findings += _broken_offsets(report.group, rows, by_status, exam.by_lagless)
    for key in by_status[Status.REWIND]:
        findings.append(_rewind(key, exam.history.samples[key]))
    if by_status[Status.STOP]:
        findings += _stop(report.group, by_status[Status.STOP], exam)
    if by_status[Status.STALL]:
        findings.append(_stall(report.group, by_status[Status.STALL], exam))
    if by_status[Status.WARN]:
        keys = by_status[Status.WARN]
        findings.append(
            Finding(
                "lag-growing",
                f"{_names(keys)}: lag grew at every sample — consumers are slower than producers.",
                "add consumers (up to one per partition) or make processing faster",
            )
        )
    findings += _large_records(exam.records, fetch_bytes)
    if not exam.by_lagless:  # an import reads every partition itself: no consumer to balance
        findings += _balance(report, exam.memberships)
    if not exam.by_lagless:  # an import is never a member: there are none to check
        findings += _membership(report, exam.memberships)
    if not findings:
        findings.append(
            Finding(
                "healthy",
                f"group {report.group}: {len(rows)} partitions, total lag {report.total_lag:,}, "
                f"nothing stuck, rewound or falling behind over {exam.sampled_s:g} s.",
                "nothing to do",
            )
        )
    return findings


def _broken_offsets(
    group: str,
    rows: Mapping[tuple[str, int], PartitionLag],
    by_status: Mapping[Status, Sequence[tuple[str, int]]],
    by_lagless: bool,
) -> list[Finding]:
    """Committed offsets past the log's end, or on topics that no longer exist (offsets
    behind the log start are retention's: _retention)."""
    findings = []
    if ahead := by_status[Status.AHEAD]:
        first = rows[ahead[0]]
        reset = (
            "reset the group's offsets to where its consumers should resume, with them "
            f"stopped: `kafka-consumer-groups --reset-offsets --group {group} --topic "
            f"{first.topic} --to-earliest --execute` (or --to-datetime)"
        )
        findings.append(
            Finding(
                "offset-ahead",
                f"{_names(ahead)}: the committed offset is past the log's end (e.g. "
                f"{_name(ahead[0])}: committed {first.committed:,}, the log ends at "
                f"{first.end:,}) — the topic was recreated or truncated. The lag reads 0 but "
                + (
                    "lagless import commits only forward: it will not bring these offsets "
                    "back, and tools reading the group see the wrong position."
                    if by_lagless
                    else "the consumer resets at its next start (auto.offset.reset: re-reading "
                    "everything, or skipping to the end)."
                ),
                reset
                + (
                    "; the import itself resumes from what its table holds, not from the group"
                    if by_lagless
                    else ""
                ),
            )
        )
    if gone := by_status[Status.GONE]:
        topics = sorted({topic for topic, _ in gone})
        findings.append(
            Finding(
                "topic-gone",
                f"{_names(gone)}: group {group} has offsets committed on "
                f"{'a topic' if len(topics) == 1 else 'topics'} that no longer exist "
                f"({', '.join(topics)}) — deleted. If "
                f"{'it is' if len(topics) == 1 else 'they are'} created again, the consumers "
                "resume at these old offsets on the new log.",
                f"deleted for good: `kafka-consumer-groups --delete-offsets --group {group} "
                f"--topic {topics[0]}`; created again: reset the offsets (--reset-offsets "
                "--to-earliest) before "
                + ("the import runs again" if by_lagless else "the consumers start"),
            )
        )
    return findings


def _import_idle(group: str) -> str:
    """Why a group lagless import commits does not move: no import is running (an import is
    never a member, and never stuck on a record: it fails, and says so)."""
    return (
        f"no lagless import is committing group {group} now: a bulk import ends at the log's "
        "end as it found it at its start (records that arrived since wait for its next run), "
        "and a stopped or failed one where it stopped."
    )


# What to do about a group lagless import commits that does not move.
IMPORT_IDLE_FIX = (
    "run the same import again: it resumes from what its table holds (and commits the group "
    "as it goes); `--mode continuous` keeps following the topic"
)


def _stall(group: str, keys: Sequence[tuple[str, int]], exam: Examination) -> Finding:
    """Lag, and the committed offset did not move within the window."""
    if exam.by_lagless:
        return Finding(
            "stall",
            f"{_names(keys)}: lag but the committed offset did not move for "
            f"{exam.sampled_s:g} s — {_import_idle(group)}",
            IMPORT_IDLE_FIX,
        )
    return Finding(
        "stall",
        f"{_names(keys)}: lag but the committed offset stopped moving — the consumer "
        "is stuck on a record, or blocks on another of its partitions.",
        "look at the record at the committed offset (too large? failing?); a consumer "
        "must not wait on an empty partition while another has data",
    )


def _stop(group: str, keys: Sequence[tuple[str, int]], exam: Examination) -> list[Finding]:
    """STOP from who holds the partitions where the broker tells, else from the offsets."""
    fix = (
        IMPORT_IDLE_FIX
        if exam.by_lagless
        else "check that the group's consumers are running and own these partitions; a "
        "consumer that is alive but stuck shows the record it is stuck on in its logs"
    )
    held = held_partitions(exam.description)
    unheld = [key for key in keys if held is not None and key not in held]
    still = [key for key in keys if key not in unheld]
    findings = []
    if unheld and exam.by_lagless:
        # An import is never a member: its group has none, and that is no finding.
        still, unheld = [*unheld, *still], []
    if unheld:
        members = len(exam.description.members) if exam.description else 0
        findings.append(
            Finding(
                "stop",
                f"{_names(unheld)}: lag and no member of group {group} holds them (the group "
                f"has {members} member{'' if members == 1 else 's'}) — nobody reads there.",
                fix,
            )
        )
    if still:
        findings.append(
            Finding(
                "stop",
                f"{_names(still)}: lag but the committed offset did not move for "
                f"{exam.sampled_s:g} s — "
                + (
                    _import_idle(group)
                    if exam.by_lagless
                    else f"no consumer of group {group} is committing there."
                ),
                fix,
            )
        )
    return findings


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _retention(
    risks: Mapping[tuple[str, int], RetentionRisk],
    warning_s: float,
    by_lagless: bool = False,
    now: float | None = None,
) -> list[Finding]:
    """Records lost to retention first (the worst there is), then records about to be."""
    lost = sorted(key for key, risk in risks.items() if risk.lost)
    soon = sorted(
        key for key, risk in risks.items() if not risk.lost and risk.at_risk(warning_s, now)
    )
    findings = []
    if lost:
        deleted = sum(-risks[key].records_left for key in lost)
        findings.append(
            Finding(
                "records-lost",
                f"{_names(lost)}: retention deleted {deleted:,} records the group had not read "
                "yet — the log start is past the committed offset; "
                + (
                    "the import never read them: its table lacks them."
                    if by_lagless
                    else "the consumer will skip them (or fail, with auto.offset.reset=none)."
                ),
                "replay them from a copy if one exists; then raise retention.ms / "
                "retention.bytes or "
                + (
                    "run the import more often (or continuously) so it keeps ahead of retention"
                    if by_lagless
                    else "add consumers so the group keeps ahead of retention"
                ),
            )
        )
    if soon:
        first = min(soon, key=lambda key: risks[key].seconds_left(now) or 0.0)
        risk = risks[first]
        left = risk.seconds_left(now) or 0.0
        by_retention = risk.seconds_by_retention(now)
        basis = (
            "retention.ms"
            if by_retention is not None and by_retention == left
            else f"the log start advancing {risk.log_start_per_s:.3g} records/s"
        )
        findings.append(
            Finding(
                "retention-risk",
                f"{_names(soon)}: retention will delete records the group has not read — "
                f"{_name(first)} has {risk.records_left:,} records between the log start and "
                f"the committed offset, gone in about {_duration(left)} "
                f"at {basis}.",
                "catch up first (add consumers, up to one per partition), or raise "
                "retention.ms / retention.bytes on the topic before the log start passes the "
                "committed offset",
            )
        )
    return findings


def _rewind(key: tuple[str, int], samples: Sequence[PartitionSample]) -> Finding:
    committed = [s.committed for s in samples if s.committed is not None]
    highest = max(committed)
    return Finding(
        "rewind",
        f"{_name(key)}: the committed offset moved backwards from {highest:,} to {committed[-1]:,} "
        f"— an out-of-order commit: a consumer that lost the partition in a "
        f"rebalance committed after its successor; records from {committed[-1]} will be "
        "read again, and the lag shown is not real.",
        "commit only partitions the consumer still owns (check the assignment before "
        "committing, commit in the revoke callback); the cooperative-sticky assignor moves "
        "fewer partitions",
    )


def _large_records(
    records: Mapping[tuple[str, int], RecordInfo], fetch_bytes: int
) -> list[Finding]:
    large = sorted(key for key, record in records.items() if 2 * record.size_bytes > fetch_bytes)
    if not large:
        return []
    biggest = max(records[key].size_bytes for key in large)
    return [
        Finding(
            "large-records",
            f"{_names(large)}: the record at the committed offset is up to {biggest:,} bytes; "
            f"a fetch of {fetch_bytes:,} bytes per partition brings one or two of them, so "
            "these partitions crawl while each fetch waits.",
            f"raise max.partition.fetch.bytes / fetch.message.max.bytes well above {biggest}, "
            "or shorten fetch.max.wait.ms so a consumer does not wait on its other partitions",
        )
    ]


def _balance(report: LagReport, memberships: Sequence[GroupDescription] | None) -> list[Finding]:
    # A partition that never held a record (its end is 0) is neither drained nor lagging; one
    # whose committed offset is broken is judged by _broken_offsets.
    judged = [row for row in report.rows if row.end > 0 and not row.status.broken]
    drained = [row.key for row in judged if row.lag == 0]
    lagging = [row.key for row in judged if row.lag > 0]
    if not drained or not lagging:
        return []
    fix = (
        "give each consumer a share of the remaining records, not of the partitions: one "
        "consumer per partition, consumers that keep fetching from their other partitions "
        "instead of blocking on a drained one, or an import with lagless, which plans by records"
    )
    if not memberships:
        return [
            Finding(
                "drained-and-lagging",
                f"{_count(len(drained), 'partition')} drained while {len(lagging)} lag "
                f"({_names(lagging)}): consumers holding a drained partition next to a busy "
                "one wait on it; which consumer holds which could not be checked.",
                fix,
            )
        ]
    latest = memberships[-1]
    return _mixed_consumers(report, latest, drained, lagging, fix) + _range_piling(latest, lagging)


def _mixed_consumers(
    report: LagReport,
    latest: GroupDescription,
    drained: list[tuple[str, int]],
    lagging: list[tuple[str, int]],
    fix: str,
) -> list[Finding]:
    """Consumers that hold a drained partition next to a lagging one, fewer than partitions."""
    mixed = [
        member
        for member in latest.members
        if any(p in drained for p in member.partitions)
        and any(p in lagging for p in member.partitions)
    ]
    if not mixed or len(latest.members) >= len(report.rows):
        return []
    example = mixed[0]
    return [
        Finding(
            "drained-and-lagging",
            f"{len(mixed)} of {len(latest.members)} consumers hold a drained partition next "
            f"to a lagging one (e.g. {example.client_id or example.member_id}: "
            f"{_names(list(example.partitions))}) with fewer consumers than partitions "
            f"({len(latest.members)} < {len(report.rows)}): each waits on its drained "
            "partition.",
            fix,
        )
    ]


def _range_piling(latest: GroupDescription, lagging: list[tuple[str, int]]) -> list[Finding]:
    """The range assignor's piling: lagging partitions on a few consumers, others idle."""
    lagging_per_member = {
        member.member_id: [p for p in member.partitions if p in lagging]
        for member in latest.members
    }
    piled = [m for m in latest.members if len(lagging_per_member[m.member_id]) >= 2]
    spare = [m for m in latest.members if not lagging_per_member[m.member_id]]
    if latest.assignor != "range" or not piled or not spare:
        return []
    return [
        Finding(
            "range-piling",
            f"the range assignor piled the lagging partitions on {len(piled)} consumers "
            f"while {len(spare)} hold none (e.g. "
            f"{_names(lagging_per_member[piled[0].member_id])} on one consumer).",
            "set partition.assignment.strategy=cooperative-sticky (or roundrobin) so "
            "lagging partitions spread over the consumers",
        )
    ]


def notes(exam: Examination) -> list[str]:
    """What the doctor could not look at: said beside the findings, not as one (nothing is
    wrong with the group for it)."""
    if exam.memberships is not None or exam.by_lagless:
        return []
    return [
        "which consumer holds which partitions, idle consumers, the assignor and rebalances "
        "were not checked: the broker does not answer DescribeGroups (the embedded broker "
        "never does); `kafka-consumer-groups --describe --group "
        f"{exam.report.group}` shows them on a broker that does"
    ]


def _membership(report: LagReport, memberships: Sequence[GroupDescription] | None) -> list[Finding]:
    if not memberships:  # None: not told (notes); []: not sampled
        return []
    latest = memberships[-1]
    return [
        *_rebalancing_or_idle(report, latest),
        *_no_commits(report, latest),
        *_rebalances(memberships),
        *_eager_protocol(latest),
    ]


def _rebalancing_or_idle(report: LagReport, latest: GroupDescription) -> list[Finding]:
    members = len(latest.members)
    if rebalancing(latest):
        return [
            Finding(
                "rebalancing",
                f"the group is rebalancing (state {latest.state}, {members} members holding "
                "no partition yet): no member reads until the new assignment is handed out.",
                "if this lasts or keeps coming back, find why members join and leave "
                "(session.timeout.ms, max.poll.interval.ms); the cooperative-sticky assignor "
                "keeps partitions read during a rebalance",
            )
        ]
    idle = [m for m in latest.members if not m.partitions]
    if not idle:
        return []
    partitions = len(report.rows)
    why = (
        f"more consumers than partitions ({members} > {partitions})"
        if members > partitions
        else f"the assignor gave them none of the {partitions} partitions"
    )
    return [
        Finding(
            "idle-consumers",
            f"{len(idle)} of {members} consumers hold no partition: {why}.",
            "run at most one consumer per partition, or add partitions",
        )
    ]


def _no_commits(report: LagReport, latest: GroupDescription) -> list[Finding]:
    if not latest.members or not report.rows:
        return []
    if any(row.committed is not None for row in report.rows):
        return []
    members = len(latest.members)
    return [
        Finding(
            "no-commits",
            f"group {report.group} has {members} member{'' if members == 1 else 's'} but "
            "has committed no offset yet: a group that rebalances before its first commit "
            "starts over from auto.offset.reset each time.",
            "let members stay long enough to commit (session.timeout.ms, "
            "max.poll.interval.ms), commit soon after the first records, or use static "
            "membership (group.instance.id)",
        )
    ]


def _rebalances(memberships: Sequence[GroupDescription]) -> list[Finding]:
    rebalances = sum(
        1 for before, after in itertools.pairwise(memberships) if before.members != after.members
    )
    if not rebalances:
        return []
    return [
        Finding(
            "rebalances",
            f"the group rebalanced at least {rebalances} times while the doctor watched; "
            "with the eager protocol every rebalance stops all consumers.",
            "find why members leave (session.timeout.ms, max.poll.interval.ms exceeded by "
            "slow processing); static membership (group.instance.id) keeps restarts from "
            "rebalancing",
        )
    ]


def _eager_protocol(latest: GroupDescription) -> list[Finding]:
    if latest.assignor not in EAGER_ASSIGNORS:
        return []
    static = all(m.group_instance_id for m in latest.members)
    return [
        Finding(
            "eager-protocol",
            f"the group uses the {latest.assignor} assignor, an eager protocol: each "
            "rebalance revokes every partition from every consumer (stop-the-world)"
            + ("" if static else ", and its members have no static membership")
            + ".",
            "set partition.assignment.strategy=cooperative-sticky"
            + ("" if static else " and give each consumer a group.instance.id"),
        )
    ]


def render(exam: Examination, findings: Sequence[Finding]) -> str:
    report = exam.report
    head = (
        f"group {report.group}: {len(report.rows)} partitions, total lag {report.total_lag:,}, "
        f"status {report.status.name} (watched {exam.sampled_s:g} s)"
        + (", committed by lagless import" if exam.by_lagless else "")
    )
    said = [f"note: {note}" for note in notes(exam)]
    return "\n".join([head, *(finding.bullet() for finding in findings), *said])

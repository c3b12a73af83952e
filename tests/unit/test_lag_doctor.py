"""The doctor's reasoning over samples and record sizes, on plain values.

The group-membership rules (idle consumers, range piling, the eager protocol, rebalances,
members without commits, a group mid-rebalance) run against live groups on noida-db in
tests/integration/test_doctor_live.py. The one membership snapshot faked here is seed 000's
own: 16 members over 24 partitions of millions of records, the field report's numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

from lagless.lag.doctor import Examination, Finding, diagnose, examine, notes, render
from lagless.lag.members import GroupDescription, GroupMember
from lagless.lag.offsets import PartitionSample, RecordInfo
from lagless.lag.report import History, build_report

SEED_000_LAGS = [9_497_160] * 12 + [5_352_228] * 4 + [0] * 8


def exam_of(
    lags: Sequence[int],
    memberships: Sequence[GroupDescription] | None,
    records: dict[tuple[str, int], RecordInfo] | None = None,
) -> Examination:
    """Two samples a second apart in which every consumer made progress."""
    history = History(keep_s=10)
    for at, moved in ((0.0, 0), (1.0, 100)):
        history.add(
            PartitionSample("t", p, at, 1000 + moved, 0, 1000 + 100 + lag)
            for p, lag in enumerate(lags)
        )
    records = records or {}
    return Examination(build_report("g", history, 1.0, records), history, records, memberships, 1.0)


def member(name: str, *partitions: int, instance: str | None = None) -> GroupMember:
    return GroupMember(name, name, tuple(("t", p) for p in partitions), instance)


def codes(findings: Sequence[Finding]) -> list[str]:
    return [finding.kind for finding in findings]


def test_seed_000_a_consumer_holding_a_drained_and_a_busy_partition() -> None:
    """Seed 000's round-robin at its real size (faked: no broker here holds its 170 M records;
    test_doctor_live.py runs the rule on a live group in small)."""
    members = tuple(member(f"c{i}", *range(i, 24, 16)) for i in range(16))
    found = diagnose(
        exam_of(SEED_000_LAGS, [GroupDescription("g", "roundrobin", "Stable", members)])
    )
    mixed = next(f for f in found if f.kind == "drained-and-lagging")
    assert "8 of 16 consumers hold a drained partition next to a lagging one" in mixed.text
    assert "e.g. c0: t:0, t:16" in mixed.text
    assert "lagless" in mixed.fix
    assert "range-piling" not in codes(found)


def test_without_describe_groups_the_doctor_notes_what_it_could_not_check() -> None:
    """A broker that does not answer DescribeGroups (the embedded one) is nothing wrong with
    the group: a note beside the findings, not a finding."""
    exam = exam_of(SEED_000_LAGS, None)
    found = diagnose(exam)
    assert codes(found) == ["drained-and-lagging"]
    assert "which consumer holds which could not be checked" in found[0].text
    (note,) = notes(exam)
    assert "DescribeGroups" in note and "kafka-consumer-groups --describe --group g" in note
    assert render(exam, found).endswith(f"\nnote: {note}")
    assert notes(exam_of(SEED_000_LAGS, [])) == []  # told: nothing to note


def test_records_too_large_for_the_fetch_size() -> None:
    records = {("t", 0): RecordInfo(timestamp_s=None, size_bytes=800_000)}
    found = diagnose(exam_of([5, 5], [], records), fetch_bytes=1_048_576)
    large = next(f for f in found if f.kind == "large-records")
    assert "up to 800,000 bytes" in large.text and large.text.startswith("t:0:")
    assert "max.partition.fetch.bytes" in large.fix


def test_a_healthy_group() -> None:
    exam = exam_of(
        [0, 0], [GroupDescription("g", "cooperative-sticky", "Stable", (member("a", 0, 1),))]
    )
    found = diagnose(exam)
    assert codes(found) == ["healthy"]
    assert render(exam, found).startswith("group g: 2 partitions, total lag 0, status OK")


class FrozenSource:
    """A group whose consumer died at offset 3 of 10: nothing moves."""

    def sample(self) -> list[PartitionSample]:
        return [PartitionSample("t", 0, self.now, 3, 0, 10)]

    by_lagless = False
    description = None

    def record_at(self, samples: Sequence[PartitionSample]) -> dict[tuple[str, int], RecordInfo]:
        return {s.key: RecordInfo(timestamp_s=0.0, size_bytes=2_000_000) for s in samples}

    def follow(self, partitions: object) -> None:
        """Every partition is sampled already."""

    def close(self) -> None:
        """Nothing to release."""

    now = 0.0


class NoDescribeGroups:
    """Like the embedded broker, which cannot answer DescribeGroups."""

    def describe(self, group: str) -> GroupDescription | None:
        return None


def test_examine_samples_for_the_time_asked_and_finds_a_stalled_partition() -> None:
    """Nothing moved over the whole watch, the window its status is judged over (as `lag
    --window 4` would): STALL; STOP needs longer still, or the broker saying nobody holds it."""
    source = FrozenSource()

    def sleep(seconds: float) -> None:
        source.now += seconds

    exam = examine("g", source, NoDescribeGroups(), seconds=4.0, interval_s=1.0, sleep=sleep)
    assert len(exam.history.samples[("t", 0)]) == 5
    assert exam.memberships is None
    assert exam.report.status.name == "STALL"
    assert codes(diagnose(exam)) == ["stall", "large-records"]
    assert "stuck on a record" in diagnose(exam)[0].text


def test_a_lagless_import_that_ended_is_not_called_stuck() -> None:
    """The README's first hour, step 7: a bulk import drained the topic and ended, then new
    records came. Its group (committed as lagless's) lags and its offsets stand still: the
    import is not running, which the doctor says with the fix, not "stuck on a record"; and
    an import has no members, so nothing about DescribeGroups is said."""
    source = FrozenSource()
    source.by_lagless = True

    def sleep(seconds: float) -> None:
        source.now += seconds

    exam = examine("g", source, NoDescribeGroups(), seconds=5.0, interval_s=1.0, sleep=sleep)
    assert exam.report.status.name == "STALL"
    found = diagnose(exam)
    assert codes(found) == ["stall", "large-records"]
    assert "stuck" not in found[0].text
    assert "no lagless import is committing group g now" in found[0].text
    assert "a bulk import ends at the log's end as it found it at its start" in found[0].text
    assert found[0].fix.startswith("run the same import again")
    assert notes(exam) == []
    shown = render(exam, found)
    assert "DescribeGroups" not in shown and "committed by lagless import" in shown

    # Watched for longer than the window (STOP): the same words.
    exam = Examination(exam.report, exam.history, {}, None, 5.0, by_lagless=True)
    stop = _stopped(exam)
    assert "no lagless import is committing group g now" in stop.text
    assert stop.fix == found[0].fix


def _stopped(exam: Examination) -> Finding:
    """The exam's history with its status judged over a window shorter than what it watched."""
    report = build_report("g", exam.history, 1.0, {})
    assert report.status.name == "STOP"
    stopped = Examination(report, exam.history, {}, None, exam.sampled_s, by_lagless=True)
    (finding,) = diagnose(stopped)
    assert finding.kind == "stop"
    return finding


def test_partitions_that_never_held_a_record_are_neither_drained_nor_lagging() -> None:
    """Seed 000's report counted empty partitions (end offset 0) as drained next to busy ones."""
    history = History(keep_s=10)
    for at, moved in ((0.0, 0), (1.0, 100)):
        history.add(
            [
                PartitionSample("t", 0, at, 1000 + moved, 0, 5000 + moved),
                PartitionSample("t", 1, at, None, 0, 0),
                PartitionSample("t", 2, at, None, 0, 0),
            ]
        )
    exam = Examination(build_report("g", history, 1.0), history, {}, None, 1.0)
    found = diagnose(exam)
    assert "drained-and-lagging" not in codes(found)
    assert exam.report.status.name == "OK"

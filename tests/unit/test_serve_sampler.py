"""The sampler and the views it builds, with scripted sources and a clock: broker failures and
answers at exact moments, which no live broker gives on demand. ListGroups and DescribeGroups
run live on noida-db in tests/integration/test_doctor_live.py."""

from __future__ import annotations

import time
from collections.abc import Sequence

from lagless.exceptions import BadInput, TransientError
from lagless.lag.members import GroupDescription, GroupMember
from lagless.lag.offsets import PartitionSample, RecordInfo
from lagless.lag.status import Status
from lagless.serve import api, metrics
from lagless.serve.sampler import Sampler, SamplerSettings
from tests.harness.serve import metric, parse_metrics

SETTINGS = SamplerSettings(interval_s=1.0, window_s=2.0, retention_warning_s=3600.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class StoppedGroupSource:
    """A group stopped at offset 4 of 10 whose record there was written at t=900."""

    def __init__(self, clock: Clock, retention_ms: dict[str, int | None] | None = None) -> None:
        self.clock = clock
        self.failing = False
        self.record_reads: list[list[tuple[str, int]]] = []
        self._retention_ms = retention_ms

    def sample(self) -> list[PartitionSample]:
        if self.failing:
            raise TransientError("broker down")
        return [PartitionSample("t", 0, self.clock.now, 4, 0, 10)]

    def record_at(self, samples: Sequence[PartitionSample]) -> dict[tuple[str, int], RecordInfo]:
        self.record_reads.append([s.key for s in samples])
        return {s.key: RecordInfo(timestamp_s=900.0, size_bytes=10) for s in samples}

    def retention_ms(self) -> dict[str, int | None] | None:
        return self._retention_ms

    def follow(self, partitions: object) -> None:
        """Every partition is sampled already."""

    def close(self) -> None:
        """Nothing to release."""


class Membership:
    """DescribeGroups and ListGroups as a real broker answers them."""

    def __init__(self, groups: list[str] | None, state: str | None = "EMPTY") -> None:
        self.groups = groups
        self.state = state

    def describe(self, group: str) -> GroupDescription | None:
        if self.state is None:
            return None
        members = () if self.state == "EMPTY" else (GroupMember("m", "c", (("t", 0),)),)
        return GroupDescription(group, "range", self.state, members)

    def list_groups(self) -> list[str] | None:
        return self.groups

    def close(self) -> None:
        pass


def run_rounds(sampler: Sampler, clock: Clock, rounds: int) -> None:
    for _ in range(rounds):
        sampler.sample_once()
        clock.now += 1.0


def test_a_stopped_empty_group_stays_reported_with_its_state_and_exact_time_lag() -> None:
    clock = Clock()
    source = StoppedGroupSource(clock)
    sampler = Sampler(lambda g: source, Membership(None), SETTINGS, ["g"], now=clock)
    run_rounds(sampler, clock, 5)
    (view,) = sampler.views()
    assert view.status is Status.STOP
    assert view.state == "EMPTY" and view.members == 0
    seconds, method = view.partitions[0].lag_seconds(clock.now)
    assert (seconds, method) == (clock.now - 900.0, "exact")
    assert source.record_reads == [[("t", 0)]], "one read per lagging partition and offset"

    samples = parse_metrics(metrics.render(sampler.views(), clock.now, "c"))
    assert metric(samples, "lagless_consumergroup_state", group="g", state="EMPTY") == 1
    assert metric(samples, "lagless_consumergroup_state", group="g", state="STABLE") == 0
    assert metric(samples, "lagless_consumergroup_members", group="g") == 0
    assert metric(samples, "lagless_consumergroup_status", group="g", status="STOP") == 1
    assert metric(samples, "kafka_consumergroup_group_lag_seconds", group="g") == clock.now - 900


def test_a_failing_broker_keeps_the_last_view_marked_and_recovers() -> None:
    clock = Clock()
    source = StoppedGroupSource(clock)
    sampler = Sampler(lambda g: source, Membership(None), SETTINGS, ["g"], now=clock)
    run_rounds(sampler, clock, 2)
    source.failing = True
    run_rounds(sampler, clock, 1)
    (view,) = sampler.views()
    assert view.error == "broker down"
    assert view.total_lag == 6, "the last lag seen stays"
    assert api.group_body(view, clock.now)["status"]["error"] == "broker down"
    samples = parse_metrics(metrics.render(sampler.views(), clock.now, "c"))
    assert metric(samples, "lagless_consumergroup_up", group="g") == 0
    source.failing = False
    run_rounds(sampler, clock, 1)
    assert sampler.views()[0].error is None
    samples = parse_metrics(metrics.render(sampler.views(), clock.now, "c"))
    assert metric(samples, "lagless_consumergroup_up", group="g") == 1


def test_without_groups_named_every_listed_group_with_offsets_is_sampled() -> None:
    clock = Clock()
    opened: list[str] = []

    def open_source(group: str) -> StoppedGroupSource:
        opened.append(group)
        if group == "never-committed":
            raise BadInput("group 'never-committed' has no committed offsets on any topic")
        return StoppedGroupSource(clock)

    membership = Membership(["b", "a", "never-committed"])
    sampler = Sampler(open_source, membership, SETTINGS, None, now=clock)
    run_rounds(sampler, clock, 1)
    assert [view.group for view in sampler.views()] == ["a", "b"]
    # The broker stops listing "a" (its offsets are still there): it stays reported.
    membership.groups = ["b"]
    clock.now += 60
    run_rounds(sampler, clock, 1)
    assert [view.group for view in sampler.views()] == ["a", "b"]
    assert opened.count("a") == 1


def test_retention_ms_from_describe_configs_gives_a_warning_before_the_record_goes() -> None:
    """retention.ms 120 s and the committed record written at t=900: at t=1000 it has 20 s
    left; the lookup runs in a thread, joined here by sampling until it has landed."""
    clock = Clock()
    source = StoppedGroupSource(clock, retention_ms={"t": 120_000})
    sampler = Sampler(lambda g: source, Membership(None), SETTINGS, ["g"], now=clock)
    for _ in range(50):
        sampler.sample_once()
        (view,) = sampler.views()
        risk = view.partitions[0].retention
        if risk is not None and risk.seconds_by_retention is not None:
            break
        time.sleep(0.02)
    assert risk is not None and risk.seconds_by_retention == 900 + 120 - clock.now
    assert view.findings[0].kind == "retention-risk"
    assert "at retention.ms" in view.findings[0].text
    samples = parse_metrics(metrics.render(sampler.views(), clock.now, "c"))
    where = {"group": "g", "topic": "t", "partition": 0}
    assert metric(samples, "lagless_consumergroup_retention_margin_seconds", **where,
                  basis="retention_ms") == 900 + 120 - clock.now  # fmt: skip
    assert metric(samples, "lagless_consumergroup_retention_at_risk", **where) == 1

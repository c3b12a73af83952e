"""The sampler and the views it builds, with a scripted broker and a clock: broker failures and
answers at exact moments, which no live broker gives on demand. ListGroups, DescribeGroups and
fleets of groups run live on noida-db in tests/integration/test_doctor_live.py and
tests/integration/test_serve_fleet.py."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterable, Mapping, Sequence

import pytest

from lagless.exceptions import TransientError
from lagless.kafka import TP
from lagless.kafka.cluster_info import GroupsFound
from lagless.lag.members import GroupDescription, GroupMember
from lagless.lag.offsets import RecordInfo
from lagless.lag.status import Status
from lagless.serve import api, metrics
from lagless.serve import sampler as sampler_module
from lagless.serve.sampler import LOOK_GROUPS, Sampler, SamplerSettings
from lagless.serve.service import FLEET_GC_THRESHOLDS, fleet_gc
from tests.harness.serve import metric, parse_metrics

SETTINGS = SamplerSettings(interval_s=1.0, window_s=2.0, retention_warning_s=3600.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class ScriptedFleet:
    """A broker holding topic t (one partition, offsets 0 to 10) and groups that committed 4
    there, whose record at 4 was written at t=900. `state`: what DescribeGroups says (None:
    not answered); `failing`: every request fails as a broker that is away; `breaking`: the
    next request raises an error no broker gives (a bug of lagless's)."""

    def __init__(
        self,
        committed: Mapping[str, Mapping[TP, int]],
        listed: list[str] | None = None,
        state: str | None = "EMPTY",
        retention_ms: dict[str, int | None] | None = None,
    ) -> None:
        self.committed = dict(committed)
        self.listed = listed
        self.state = state
        self.failing = False
        self.breaking = False
        self.record_reads: list[list[TP]] = []
        self.group_requests: list[list[str]] = []
        self._retention_ms = retention_ms

    def groups(
        self,
        groups: Sequence[str],
        describe: bool,
        known: Mapping[str, Sequence[TP]] | None = None,
    ) -> GroupsFound:
        self.group_requests.append(list(groups))
        if self.breaking:
            self.breaking = False
            raise ValueError("Expected non-empty list of ConfigResource objects")
        if self.failing:
            return GroupsFound(dict.fromkeys(groups, "broker down"), dict.fromkeys(groups), {})
        committed: dict[str, dict[TP, int] | str] = {
            g: dict(self.committed.get(g, {})) for g in groups
        }
        return GroupsFound(committed, {g: self._describe(g) for g in groups}, {})

    def describe(self, groups: Sequence[str]) -> dict[str, GroupDescription | None]:
        if self.failing:
            return dict.fromkeys(groups)
        return {g: self._describe(g) for g in groups}

    def _describe(self, group: str) -> GroupDescription | None:
        if self.state is None:
            return None
        members = () if self.state == "EMPTY" else (GroupMember("m", "c", (("t", 0),)),)
        return GroupDescription(group, "range", self.state, members)

    def topics(self, max_age_s: float = 0.0) -> dict[str, int]:
        if self.failing:
            raise TransientError("broker down")
        return {"t": 1}

    def log_bounds(
        self, partitions: Sequence[TP]
    ) -> tuple[dict[TP, int], dict[TP, int], dict[TP, str]]:
        if self.failing:
            return {}, {}, dict.fromkeys(partitions, "broker down")
        return dict.fromkeys(partitions, 0), dict.fromkeys(partitions, 10), {}

    def list_groups(self) -> list[str] | None:
        return self.listed

    def records_at(self, starts: Mapping[TP, int]) -> dict[TP, RecordInfo]:
        self.record_reads.append(sorted(starts))
        return {tp: RecordInfo(timestamp_s=900.0, size_bytes=10) for tp in starts}

    def retention_ms(self, topics: Iterable[str]) -> dict[str, int | None] | None:
        return self._retention_ms

    def close(self) -> None:
        """Nothing to release."""


def run_rounds(sampler: Sampler, clock: Clock, rounds: int) -> None:
    """Rounds one interval apart, each waiting for the background reads it started (records,
    retention.ms) as a live service's next round would find them landed."""
    for _ in range(rounds):
        sampler.sample_once()
        sampler.settle(timeout_s=5.0)
        clock.now += 1.0


def test_a_stopped_empty_group_stays_reported_with_its_state_and_exact_time_lag() -> None:
    clock = Clock()
    fleet = ScriptedFleet({"g": {("t", 0): 4}})
    sampler = Sampler(fleet, SETTINGS, ["g"], now=clock)
    run_rounds(sampler, clock, 5)
    (view,) = sampler.views()
    assert view.status is Status.STOP
    assert view.state == "EMPTY" and view.members == 0
    seconds, method = view.partitions[0].lag_seconds(clock.now)
    assert (seconds, method) == (clock.now - 900.0, "exact")
    assert fleet.record_reads == [[("t", 0)]], "one read per lagging partition and offset"

    samples = parse_metrics(metrics.render(sampler.views(), clock.now, "c"))
    assert metric(samples, "lagless_consumergroup_state", group="g", state="EMPTY") == 1
    assert metric(samples, "lagless_consumergroup_state", group="g", state="STABLE") == 0
    assert metric(samples, "lagless_consumergroup_members", group="g") == 0
    assert metric(samples, "lagless_consumergroup_status", group="g", status="STOP") == 1
    assert metric(samples, "kafka_consumergroup_group_lag_seconds", group="g") == clock.now - 900


def test_groups_are_asked_a_part_at_a_time_each_once_a_round_and_share_record_reads() -> None:
    """A fleet costs one request per LOOK_GROUPS groups, each group asked once a round, and
    a partition two groups wait at is read once."""
    clock = Clock()
    groups = [f"g{n:03d}" for n in range(LOOK_GROUPS + 50)]
    fleet = ScriptedFleet({group: {("t", 0): 4} for group in groups})
    sampler = Sampler(fleet, SETTINGS, groups, now=clock)
    run_rounds(sampler, clock, 3)
    assert fleet.group_requests == [groups[:LOOK_GROUPS], groups[LOOK_GROUPS:]] * 3
    assert fleet.record_reads == [[("t", 0)]]
    assert {view.group for view in sampler.views() if view.total_lag == 6} == set(groups)


def test_a_failing_broker_keeps_the_last_view_marked_and_recovers() -> None:
    clock = Clock()
    fleet = ScriptedFleet({"g": {("t", 0): 4}})
    sampler = Sampler(fleet, SETTINGS, ["g"], now=clock)
    run_rounds(sampler, clock, 2)
    fleet.failing = True
    run_rounds(sampler, clock, 1)
    (view,) = sampler.views()
    assert view.error == "broker down"
    assert view.status is Status.UNKNOWN
    assert view.total_lag == 6, "the last lag seen stays"
    assert api.group_body(view, clock.now)["status"]["error"] == "broker down"
    samples = parse_metrics(metrics.render(sampler.views(), clock.now, "c"))
    assert metric(samples, "lagless_consumergroup_up", group="g") == 0
    fleet.failing = False
    run_rounds(sampler, clock, 1)
    assert sampler.views()[0].error is None
    samples = parse_metrics(metrics.render(sampler.views(), clock.now, "c"))
    assert metric(samples, "lagless_consumergroup_up", group="g") == 1


def test_any_error_in_a_round_is_every_groups_error_and_the_next_round_recovers() -> None:
    """A round that raises what no broker error is (here the ValueError confluent_kafka gave
    for an empty DescribeConfigs): groups are UNKNOWN with that error, never a dead thread;
    the sampling thread runs on and the next round succeeds."""
    clock = Clock()
    fleet = ScriptedFleet({"g": {("t", 0): 4}, "h": {("t", 0): 10}}, state="STABLE")
    sampler = Sampler(fleet, SETTINGS, ["g", "h"], now=clock)
    fleet.breaking = True
    stop = threading.Event()
    thread = threading.Thread(target=sampler.run, args=(stop,))
    thread.start()
    try:
        for _ in range(200):
            if sampler.rounds >= 1:
                break
            stop.wait(0.01)
        first = {view.group: view for view in sampler.views()}
        for _ in range(300):
            if sampler.rounds >= 2:
                break
            stop.wait(0.01)
        assert thread.is_alive(), "the sampling thread survives"
    finally:
        stop.set()
        thread.join()
    assert {g: (v.status, v.error) for g, v in first.items()} == {
        g: (Status.UNKNOWN, "sampling failed: Expected non-empty list of ConfigResource objects")
        for g in ("g", "h")
    }
    assert {view.group: view.status for view in sampler.views()} == {
        "g": Status.OK,
        "h": Status.OK,
    }


def test_without_groups_named_every_listed_group_is_reported() -> None:
    """Every group the broker lists is shown, one that never committed as such; a group the
    broker stops listing stays reported."""
    clock = Clock()
    fleet = ScriptedFleet(
        {"a": {("t", 0): 4}, "b": {("t", 0): 10}}, listed=["b", "a", "new"], state="STABLE"
    )
    sampler = Sampler(fleet, SETTINGS, None, now=clock)
    run_rounds(sampler, clock, 1)
    assert {v.group: v.status for v in sampler.views()} == {
        "a": Status.OK,
        "b": Status.OK,
        "new": Status.NO_COMMITS,
    }
    assert [v.group for v in sampler.views()] == ["a", "b", "new"]
    fleet.listed = ["b"]
    clock.now += 60
    run_rounds(sampler, clock, 1)
    assert [view.group for view in sampler.views()] == ["a", "b", "new"]


def _sampled_with_retention() -> tuple[Sampler, Clock]:
    """retention.ms 120 s and the committed record written at t=900, after three rounds."""
    clock = Clock()
    fleet = ScriptedFleet({"g": {("t", 0): 4}}, retention_ms={"t": 120_000})
    sampler = Sampler(fleet, SETTINGS, ["g"], now=clock)
    run_rounds(sampler, clock, 2)
    sampler.sample_once()
    return sampler, clock


def test_retention_ms_from_describe_configs_gives_a_warning_before_the_record_goes() -> None:
    """retention.ms 120 s and the committed record written at t=900: at the latest sample
    (t=1002) it has 18 s left, as every reader asks it (with the time: a still partition's
    row is kept from an earlier round)."""
    sampler, clock = _sampled_with_retention()
    (view,) = sampler.views()
    risk = view.partitions[0].retention
    assert risk is not None and risk.seconds_by_retention(clock.now) == 900 + 120 - clock.now
    assert view.findings[0].kind == "retention-risk"
    assert "at retention.ms" in view.findings[0].text
    samples = parse_metrics(metrics.render(sampler.views(), clock.now, "c"))
    where = {"group": "g", "topic": "t", "partition": 0}
    assert metric(samples, "lagless_consumergroup_retention_margin_seconds", **where,
                  basis="retention_ms") == 900 + 120 - clock.now  # fmt: skip
    assert metric(samples, "lagless_consumergroup_retention_at_risk", **where) == 1


def test_a_view_that_cannot_be_built_leaves_the_last_one_unknown_and_sampling_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Even building a view may fail (a bug): the group keeps its last view, marked UNKNOWN
    with the error, and the next round that can build it shows it again."""
    clock = Clock()
    fleet = ScriptedFleet({"g": {("t", 0): 4}}, state="STABLE")
    sampler = Sampler(fleet, SETTINGS, ["g"], now=clock)
    run_rounds(sampler, clock, 1)
    assert sampler.views()[0].status is Status.OK

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(sampler_module, "group_view", broken)
    sampler.sample_once()
    (view,) = sampler.views()
    assert (view.status, view.error) == (Status.UNKNOWN, "sampling failed: division by zero")
    assert view.total_lag == 6
    monkeypatch.undo()
    sampler.sample_once()
    assert sampler.views()[0].error is None
    assert sampler.views()[0].status is not Status.UNKNOWN


def test_serving_collects_garbage_less_often_and_restores_the_collector_after() -> None:
    before = gc.get_threshold()
    with fleet_gc():
        assert gc.get_threshold() == FLEET_GC_THRESHOLDS
        assert gc.get_freeze_count() > 0  # what was built before is out of the collector's sight
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1  # a cycle made while serving is still collected
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_one_exposition_turns_a_risk_on_once_the_deletion_is_within_the_warning() -> None:
    """The risk lines are written once per view until a deletion comes within the warning:
    the same round's metrics, scraped either side of that moment, say 0 then 1."""
    sampler, _ = _sampled_with_retention()
    (view,) = sampler.views()
    risk = view.partitions[0].retention
    assert risk is not None and risk.deleted_at == 900 + 120
    exposition = metrics.Exposition(sampler.views(), "c")
    where = {"group": "g", "topic": "t", "partition": 0}
    turns = risk.deleted_at - SETTINGS.retention_warning_s
    for at, expected in ((turns - 1, 0), (turns, 0), (turns + 1, 1), (turns - 1, 0)):
        samples = parse_metrics(exposition.body(at).decode())
        assert metric(samples, "lagless_consumergroup_retention_at_risk", **where) == expected


def test_a_round_whose_look_fails_asks_no_other_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker away: the first part's look fails (each look would wait for its timeout, a
    fleet's round eight times as long), so the round's other parts are not asked; every group
    shows the reason."""
    clock = Clock()
    groups = [f"g{n:03d}" for n in range(3 * LOOK_GROUPS)]
    fleet = ScriptedFleet({group: {("t", 0): 4} for group in groups})
    sampler = Sampler(fleet, SETTINGS, groups, now=clock)
    run_rounds(sampler, clock, 1)
    looks: list[int] = []
    real_look = sampler_module.look

    def counted(*args: object, **kwargs: object) -> object:
        looks.append(1)
        return real_look(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sampler_module, "look", counted)
    fleet.failing = True
    run_rounds(sampler, clock, 1)
    assert len(looks) == 1
    assert {view.error for view in sampler.views()} == {"broker down"}
    fleet.failing = False
    run_rounds(sampler, clock, 1)
    assert len(looks) == 4, "every part asked again once the broker answers"
    assert {view.error for view in sampler.views()} == {None}

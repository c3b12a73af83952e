"""What serve keeps between rounds instead of working it out again: a steady partition's row
(report.still_phase), a group's metrics lines while it shows the same, the round's joined metrics
text, and the partitions a group's offsets are asked of. Each is checked against doing the work
afresh, on a scripted broker and clock (exact moments no live broker gives on demand)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from lagless.kafka import TP
from lagless.kafka.cluster_info import GroupsFound
from lagless.kafka.groups import GroupDescription
from lagless.lag.offsets import PartitionSample, RecordInfo
from lagless.lag.report import (
    PartitionLag,
    build_report,
    judge_partition,
    same_offsets,
    still_phase,
)
from lagless.serve import api, metrics
from lagless.serve.sampler import WHOLE_PER_ROUND, Sampler, SamplerSettings
from lagless.serve.view import GroupView, Sampled, group_view

SETTINGS = SamplerSettings(interval_s=1.0, window_s=3.0, retention_warning_s=100.0)
RETENTION_MS = 120_000


class Broker:
    """Topics of a few partitions, each with a log start and an end, and groups' commits; a
    record at offset o was written at t=o (so exact time lags are known). `known`: whether it
    answers only the partitions named, as a real broker does."""

    def __init__(self, committed: dict[str, dict[TP, int]], ends: dict[TP, int]) -> None:
        self.committed = committed
        self.ends = ends
        self.lows: dict[TP, int] = dict.fromkeys(ends, 0)
        self.failing = False
        self.asked_known: list[dict[str, Sequence[TP]]] = []

    def groups(
        self,
        groups: Sequence[str],
        describe: bool,
        known: Mapping[str, Sequence[TP]] | None = None,
    ) -> GroupsFound:
        self.asked_known.append(dict(known or {}))
        if self.failing:
            return GroupsFound(dict.fromkeys(groups, "broker down"), dict.fromkeys(groups), {})
        found: dict[str, dict[TP, int] | str] = {}
        for group in groups:
            offsets = self.committed.get(group, {})
            named = (known or {}).get(group)
            found[group] = {tp: o for tp, o in offsets.items() if named is None or tp in named}
        return GroupsFound(found, dict.fromkeys(groups), {})

    def describe(self, groups: Sequence[str]) -> dict[str, GroupDescription | None]:
        return dict.fromkeys(groups)  # DescribeGroups not answered

    def topics(self, max_age_s: float = 0.0) -> dict[str, int]:
        counts: dict[str, int] = {}
        for topic, partition in self.ends:
            counts[topic] = max(counts.get(topic, 0), partition + 1)
        return counts

    def log_bounds(
        self, partitions: Sequence[TP]
    ) -> tuple[dict[TP, int], dict[TP, int], dict[TP, str]]:
        if self.failing:
            return {}, {}, dict.fromkeys(partitions, "broker down")
        return (
            {tp: self.lows[tp] for tp in partitions},
            {tp: self.ends[tp] for tp in partitions},
            {},
        )

    def list_groups(self) -> list[str] | None:
        return sorted(self.committed)

    def records_at(self, starts: Mapping[TP, int]) -> dict[TP, RecordInfo]:
        return {
            tp: RecordInfo(timestamp_s=float(offset), size_bytes=1) for tp, offset in starts.items()
        }

    def retention_ms(self, topics: Iterable[str]) -> dict[str, int | None] | None:
        return dict.fromkeys(topics, RETENTION_MS)

    def close(self) -> None:
        """Nothing to release."""


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def fleet(groups: int = 2, partitions: int = 3) -> Broker:
    ends = {("t", p): 10 for p in range(partitions)}
    committed = {f"g{n}": {("t", p): 4 + n for p in range(partitions)} for n in range(groups)}
    return Broker(committed, ends)


def one_round(sampler: Sampler, latest: metrics.LatestExposition, clock: Clock, gap: float) -> None:
    sampler.sample_once()
    sampler.settle(timeout_s=5.0)  # the background reads landed, as at a live next round
    latest.update(sampler.views())
    clock.now += gap


def fresh_views(sampler: Sampler) -> list[GroupView]:
    """Every view judged anew from its group's history, nothing kept: what serve showed before
    it kept anything."""
    views = []
    for view in sampler.views():
        watch = sampler._watches[view.group]
        records = {
            tp: found
            for tp, offset in watch.record_starts.items()
            if (found := sampler._records.get((tp, offset))) is not None
        }
        sampled = Sampled(
            watch.history,
            records,
            watch.description,
            sampler._retention_ms,
            watch.sampled_at,
            watch.error,
            watch.error_since,
            watch.by_lagless,
        )
        report = build_report(
            view.group,
            watch.history,
            SETTINGS.window_s,
            records,
            watch.description,
            sampler._retention_ms,
        )
        views.append(
            group_view(
                view.group,
                report,
                sampled,
                SETTINGS.window_s,
                SETTINGS.retention_warning_s,
                watch.series,
            )
        )
    return views


def served(views: Sequence[GroupView], now: float) -> object:
    """Everything the API shows of the views but the series (shared, appended each round)."""
    bodies = [api.group_body(view, now)["status"] for view in views]
    for body in bodies:
        assert isinstance(body, dict)
        body.pop("series"), body.pop("totallag_history")
    return bodies


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([1.0, 1.0, 1.0, 2.5, 20.0]),  # the gap to the next round
            st.lists(st.sampled_from(["hold", "hold", "hold", "commit", "produce", "delete"])),
            st.booleans(),  # the broker fails this round
        ),
        min_size=1,
        max_size=25,
    )
)
def test_what_is_kept_shows_exactly_what_judging_afresh_shows(
    rounds: list[tuple[float, list[str], bool]],
) -> None:
    """Whatever the partitions do (hold still, commit, get records, lose records to retention),
    whatever the gaps between rounds and the broker's failures: each round's metrics body
    (cached lines, time lags at the scrape) equals a render of views judged afresh from the
    same history, as does the API, at the round and later."""
    broker, clock = fleet(), Clock()
    sampler = Sampler(broker, SETTINGS, ["g0", "g1"], now=clock)
    latest = metrics.LatestExposition("c")
    for gap, moves, failing in rounds:
        broker.failing = failing
        for n, move in enumerate(moves):
            group, tp = f"g{n % 2}", ("t", n % 3)
            if move == "commit":
                broker.committed[group][tp] = min(broker.ends[tp], broker.committed[group][tp] + 1)
            elif move == "produce":
                broker.ends[tp] += 1
            elif move == "delete":
                broker.lows[tp] = min(broker.ends[tp], broker.lows[tp] + 3)
        one_round(sampler, latest, clock, gap)
        exposition = latest.get()
        assert exposition is not None
        fresh = fresh_views(sampler)
        for later in (0.0, 7.5):
            now = clock.now + later
            assert exposition.body(now, 5.0).decode() == metrics.render(fresh, now, "c", 5.0)
            assert served(sampler.views(), now) == served(fresh, now)


def test_a_changed_group_is_judged_again_an_unchanged_one_is_not() -> None:
    broker, clock = fleet(), Clock()
    sampler = Sampler(broker, SETTINGS, ["g0", "g1"], now=clock)
    latest = metrics.LatestExposition("c")
    for _ in range(6):  # past the window: both groups steady
        one_round(sampler, latest, clock, 1.0)
    before = {view.group: metrics.rendered(view, "c") for view in sampler.views()}
    exposition = latest.get()
    one_round(sampler, latest, clock, 1.0)
    assert {g: w.judged for g, w in sampler._watches.items()} == {"g0": 0, "g1": 0}
    kept = {view.group: metrics.rendered(view, "c") for view in sampler.views()}
    assert kept == before and all(kept[g] is before[g] for g in kept), "lines kept"
    assert latest.get()._partitions is exposition._partitions  # type: ignore[union-attr]

    broker.committed["g1"][("t", 0)] += 2
    one_round(sampler, latest, clock, 1.0)
    assert {g: w.judged for g, w in sampler._watches.items()} == {"g0": 0, "g1": 1}
    after = {view.group: metrics.rendered(view, "c") for view in sampler.views()}
    assert after["g0"] is before["g0"] and after["g1"] is not before["g1"]
    body = latest.get().body(clock.now).decode()  # type: ignore[union-attr]
    assert 'group="g1",topic="t",partition="0"} 7\n' in body, "the new commit shown"


@settings(max_examples=300, deadline=None)
@given(
    committed=st.integers(0, 12),
    low=st.integers(0, 12),
    end=st.integers(0, 12),
    gone=st.booleans(),
    gaps=st.lists(st.sampled_from([0.5, 1.0, 2.0, 4.0]), min_size=1, max_size=8),
    owned=st.sampled_from([None, True, False]),
    record_at=st.sampled_from([None, 2.0]),
)
def test_a_still_row_is_the_row_judging_again_would_give(
    committed: int,
    low: int,
    end: int,
    gone: bool,
    gaps: list[float],
    owned: bool | None,
    record_at: float | None,
) -> None:
    """report.still_phase's promise: samples that hold the same offsets give the same row
    (but for when it was sampled) as one more such sample, wherever their phase is the same.
    Any offsets (lagging, caught up, lost to retention, ahead of the log, gone), any gaps."""
    samples = [PartitionSample("t", 0, 0.0, committed, low, end, gone)]
    for gap in gaps:
        later = [*samples, dataclasses.replace(samples[-1], at=samples[-1].at + gap)]
        while later[-1].at - later[0].at > SETTINGS.keep_s:  # as History forgets
            later.pop(0)
        assert all(same_offsets(s, later[-1]) for s in later)
        row = judge_partition(samples, SETTINGS.window_s, record_at, owned, RETENTION_MS)
        again = judge_partition(later, SETTINGS.window_s, record_at, owned, RETENTION_MS)
        if phase(samples) == phase(later):
            assert timeless(row) == timeless(again)
        samples = later


def phase(samples: list[PartitionSample]) -> object:
    return still_phase(samples[-1], samples[0].at, len(samples), SETTINGS.window_s)


def timeless(row: PartitionLag) -> PartitionLag:
    risk = row.retention and dataclasses.replace(row.retention, as_of=0.0)
    return dataclasses.replace(row, sampled_at=0.0, retention=risk)


def test_offsets_are_asked_of_known_partitions_and_every_group_whole_in_turn() -> None:
    """Past WHOLE_PER_ROUND groups, most are asked of the partitions they read; each is asked
    whole in turn, so a commit on a topic a group did not read before shows within a cycle."""
    groups = WHOLE_PER_ROUND + 50
    broker, clock = fleet(groups, 1), Clock()
    broker.ends[("u", 0)], broker.lows[("u", 0)] = 10, 0
    sampler = Sampler(broker, SETTINGS, None, now=clock)
    latest = metrics.LatestExposition("c")
    one_round(sampler, latest, clock, 1.0)
    assert broker.asked_known[-1] == {}, "nothing known yet: every group asked whole"
    broker.committed["g7"][("u", 0)] = 3
    named_in_turn: list[set[str]] = []
    for _ in range(3):
        one_round(sampler, latest, clock, 1.0)
        named_in_turn.append(set(broker.asked_known[-1]))
        reads = {g: v for g, v in broker.asked_known[-1].items() if g != "g7"}
        assert all(v == [("t", 0)] for v in reads.values()), "the partitions each reads"
    assert all(len(named) == 50 for named in named_in_turn)
    assert not set.intersection(*named_in_turn[:2]), "the groups asked whole rotate"
    (g7,) = [view for view in sampler.views() if view.group == "g7"]
    assert [p.key for p in g7.partitions] == [("t", 0), ("u", 0)]

"""The status evaluator and the time-lag interpolation, table-tested over plain samples."""

from __future__ import annotations

import pytest

from lagless.lag.members import GroupDescription, GroupMember, held_partitions, rebalancing
from lagless.lag.offsets import PartitionSample
from lagless.lag.status import Status, group_status, partition_status
from lagless.lag.timelag import interpolated_lag_seconds


def samples(*points: tuple[float, int | None, int]) -> list[PartitionSample]:
    """(at, committed, end) triples of partition t:0, log starting at 0."""
    return [PartitionSample("t", 0, at, committed, 0, end) for at, committed, end in points]


@pytest.mark.parametrize(
    ("points", "window_s", "expected"),
    [
        pytest.param([(0, 5, 10), (1, 7, 12), (2, 9, 14)], 5, Status.OK, id="moving, lag flat"),
        pytest.param([(0, 10, 10), (1, 10, 10), (2, 10, 10)], 5, Status.OK, id="caught up, idle"),
        pytest.param([(0, 5, 10), (1, 6, 13), (2, 7, 16)], 5, Status.WARN, id="lag grows"),
        pytest.param([(0, 5, 10), (1, 6, 13), (2, 9, 14)], 5, Status.OK, id="lag grew once"),
        pytest.param([(0, 5, 10), (1, 5, 10), (2, 5, 11)], 5, Status.STALL, id="offset stuck"),
        pytest.param([(0, None, 4), (1, None, 4)], 5, Status.STALL, id="never committed"),
        pytest.param([(0, 5, 10), (3, 5, 10), (6, 5, 10)], 5, Status.STOP, id="stuck > window"),
        pytest.param([(0, 4, 10), (3, 5, 10), (6, 5, 10)], 5, Status.STALL, id="moved in window"),
        pytest.param([(0, 8, 10), (1, 3, 10), (2, 4, 10)], 5, Status.REWIND, id="moved back"),
        pytest.param([(0, 8, 10), (9, 3, 10), (10, 10, 10)], 1, Status.REWIND, id="back, old"),
        pytest.param([(0, 5, 10)], 5, Status.OK, id="one sample"),
    ],
)
def test_partition_status(
    points: list[tuple[float, int | None, int]], window_s: float, expected: Status
) -> None:
    assert partition_status(samples(*points), window_s) is expected


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        pytest.param(PartitionSample("t", 0, 0, 5000, 0, 250), Status.AHEAD, id="past the end"),
        pytest.param(PartitionSample("t", 0, 0, 50, 100, 250), Status.LOST, id="behind the start"),
        pytest.param(PartitionSample("t", 0, 0, 10, 0, 0, gone=True), Status.GONE, id="gone"),
        pytest.param(PartitionSample("t", 0, 0, 250, 100, 250), Status.OK, id="at the end"),
        pytest.param(PartitionSample("t", 0, 0, 100, 100, 100), Status.OK, id="at the start"),
    ],
)
def test_a_broken_committed_offset_is_never_ok(sample: PartitionSample, expected: Status) -> None:
    """Whatever the window and whoever holds the partition: the offset itself is wrong."""
    for owned in (None, True, False):
        assert partition_status([sample, sample], 30, owned=owned) is expected
    assert sample.lag == (0 if expected in (Status.AHEAD, Status.GONE) else sample.lag)
    assert group_status([Status.STOP, expected]) is max(expected, Status.STOP)


def test_group_status_is_the_worst() -> None:
    assert group_status([Status.OK, Status.REWIND, Status.STALL]) is Status.REWIND
    assert group_status([Status.WARN, Status.OK]) is Status.WARN
    assert group_status([]) is Status.NO_COMMITS
    assert group_status([Status.OK], sampled=False) is Status.UNKNOWN


def test_lag_is_counted_from_the_log_start_when_never_committed() -> None:
    assert PartitionSample("t", 0, 0.0, None, 40, 100).lag == 60
    assert PartitionSample("t", 0, 0.0, 70, 40, 100).lag == 30


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        # The end was 100 at t=10 and 200 at t=20: offset 150 was written at t=15.
        pytest.param([(10, 150, 100), (20, 150, 200)], 5.0, id="interpolated"),
        # Offset 50 is older than the table: 10 records/s back from 100 at t=10 is t=5.
        pytest.param([(10, 50, 100), (20, 50, 200)], 15.0, id="extrapolated"),
        pytest.param([(10, 200, 200)], 0.0, id="caught up"),
        pytest.param([(10, 50, 100)], None, id="one sample"),
        pytest.param([(10, 50, 100), (20, 50, 100)], None, id="no production"),
    ],
)
def test_time_lag(points: list[tuple[float, int | None, int]], expected: float | None) -> None:
    assert interpolated_lag_seconds(samples(*points)) == expected


def test_a_lagging_partition_no_member_holds_is_stop_at_once() -> None:
    """Nobody is there to commit: STOP from the first samples, whatever the window."""
    moving = samples((0, 5, 10), (1, 7, 12))
    assert partition_status(moving, 30, owned=False) is Status.STOP
    assert partition_status(moving, 30, owned=True) is Status.OK
    assert partition_status(moving, 30, owned=None) is Status.OK
    caught_up = samples((0, 10, 10))
    assert partition_status(caught_up, 30, owned=False) is Status.OK


def test_who_holds_what_is_unknown_while_a_rebalance_hands_partitions_out() -> None:
    a, b = GroupMember("a", "a", (("t", 0),)), GroupMember("b", "b", ())
    assert held_partitions(GroupDescription("g", "range", "STABLE", (a, b))) == {("t", 0)}
    assert held_partitions(GroupDescription("g", "range", "EMPTY", ())) == frozenset()
    for state in ("PREPARING_REBALANCING", "COMPLETING_REBALANCING"):
        assert held_partitions(GroupDescription("g", "range", state, (a, b))) is None
    nobody_holds = GroupDescription("g", "range", "STABLE", (b, b))
    assert rebalancing(nobody_holds) and held_partitions(nobody_holds) is None
    assert held_partitions(None) is None

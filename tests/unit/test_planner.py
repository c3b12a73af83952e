"""plan_tasks: table cases in the manner of Spark's KafkaOffsetRangeCalculatorSuite, then
properties that must hold for any input."""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lagless.planner import OffsetRange, plan_tasks, record_sizes


def r(partition: int, start: int, end: int, topic: str = "t") -> OffsetRange:
    return OffsetRange(topic, partition, start, end)


CASES = [
    ("one range, one slot: unchanged", [r(0, 0, 10)], 1, {}, 1, [r(0, 0, 10)]),
    (
        "one range, three slots: pieces of the target size, the remainder last",
        [r(0, 0, 10)],
        3,
        {},
        1,
        [r(0, 0, 4), r(0, 4, 8), r(0, 8, 10)],
    ),
    (
        "a range a little over the target: one full piece and a small one, not two halves",
        [r(0, 0, 11), r(1, 0, 5), r(2, 0, 4)],
        2,
        {},
        1,
        [r(0, 0, 10), r(1, 0, 5), r(2, 0, 4), r(0, 10, 11)],
    ),
    (
        "offsets need not start at zero",
        [r(0, 100, 104)],
        2,
        {},
        1,
        [r(0, 100, 102), r(0, 102, 104)],
    ),
    ("an empty range yields no task", [r(0, 5, 5), r(1, 0, 4)], 2, {}, 1, [r(1, 0, 2), r(1, 2, 4)]),
    (
        "more ranges than slots: nothing to split",
        [r(2, 0, 5), r(0, 0, 10), r(1, 0, 5)],
        2,
        {},
        1,
        [r(0, 0, 10), r(1, 0, 5), r(2, 0, 5)],
    ),
    (
        "skewed lag: the long partition is cut to the size of the short one",
        [r(0, 0, 90), r(1, 0, 10)],
        10,
        {},
        1,
        [*(r(0, start, start + 10) for start in range(0, 90, 10)), r(1, 0, 10)],
    ),
    (
        "large records weigh more than many small ones",
        [r(0, 0, 1000), r(1, 0, 10)],
        4,
        {("t", 0): 100.0, ("t", 1): 800_000.0},
        1,
        [r(1, 0, 3), r(1, 3, 6), r(1, 6, 9), r(1, 9, 10), r(0, 0, 1000)],
    ),
    (
        "a partition without an estimate weighs the mean of the known ones",
        [r(0, 0, 10), r(1, 0, 10), r(2, 0, 10)],
        1,
        {("t", 0): 100.0, ("t", 1): 300.0},
        1,
        [r(1, 0, 10), r(2, 0, 10), r(0, 0, 10)],
    ),
    (
        "min_task_records sets the piece size; a smaller remainder joins the piece before it",
        [r(0, 0, 10)],
        10,
        {},
        4,
        [r(0, 4, 10), r(0, 0, 4)],
    ),
    (
        "a remainder of min_task_records records stays a piece of its own",
        [r(0, 0, 12)],
        3,
        {},
        4,
        [r(0, 0, 4), r(0, 4, 8), r(0, 8, 12)],
    ),
    (
        "min_task_records never drops a range shorter than itself",
        [r(0, 0, 3)],
        4,
        {},
        5,
        [r(0, 0, 3)],
    ),
    (
        "adjacent ranges of one partition stay separate tasks",
        [r(0, 0, 4), r(0, 4, 8)],
        2,
        {},
        1,
        [r(0, 0, 4), r(0, 4, 8)],
    ),
    (
        "ties are ordered by topic, partition, start",
        [r(1, 0, 5, "b"), r(0, 0, 5, "b"), r(3, 0, 5, "a")],
        3,
        {},
        1,
        [r(3, 0, 5, "a"), r(0, 0, 5, "b"), r(1, 0, 5, "b")],
    ),
]


@pytest.mark.parametrize(
    ("ranges", "slots", "bytes_per_record", "min_task_records", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_plan_tasks_table(
    ranges: list[OffsetRange],
    slots: int,
    bytes_per_record: dict[tuple[str, int], float],
    min_task_records: int,
    expected: list[OffsetRange],
) -> None:
    assert plan_tasks(ranges, slots, bytes_per_record or None, min_task_records) == expected


@pytest.mark.parametrize(
    ("ranges", "slots", "bytes_per_record", "min_task_records", "message"),
    [
        ([r(0, 0, 10)], 0, None, 1, "slots"),
        ([r(0, 0, 10)], 1, None, 0, "min_task_records"),
        ([r(0, 10, 9)], 1, None, 1, "ends before it starts"),
        ([r(0, 0, 10), r(0, 5, 15)], 1, None, 1, "overlap"),
        ([r(0, 0, 10)], 1, {("t", 0): 0.0}, 1, "positive"),
        ([r(0, 0, 10)], 1, {("t", 0): math.nan}, 1, "positive"),
    ],
)
def test_plan_tasks_rejects(
    ranges: list[OffsetRange],
    slots: int,
    bytes_per_record: dict[tuple[str, int], float] | None,
    min_task_records: int,
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        plan_tasks(ranges, slots, bytes_per_record, min_task_records)


def weighted_makespan(weights: list[float], slots: int) -> float:
    """When the last slot finishes if each task goes, in order, to the slot free first (as
    Spark hands tasks to free executors) and takes its weight in time."""
    free_at = [0.0] * slots
    for weight in weights:
        heapq.heappush(free_at, heapq.heappop(free_at) + weight)
    return max(free_at)


def list_schedule_makespan(tasks: list[OffsetRange], slots: int) -> float:
    """weighted_makespan when a record takes one unit of time."""
    return weighted_makespan([float(t.records) for t in tasks], slots)


# Seed 000: 24 partitions, 12 with ~9.4k records of lag, 4 with ~5.4k, 8 drained; 16 threads.
SEED_000_LAG = [9497, 9479, 9461, 9480, 9494, 9545, 9419, 9522, 9239, 9325, 9275, 9315]
SEED_000_LAG += [5352, 5406, 5364, 5441] + [0] * 8


def test_seed_000_unbalanced_import() -> None:
    ranges = [r(p, 22_000, 22_000 + lag) for p, lag in enumerate(SEED_000_LAG)]
    total = sum(SEED_000_LAG)

    tasks = plan_tasks(ranges, 16)

    assert max(t.records for t in tasks) < total / 16 + 1
    assert {t.partition for t in tasks} == set(range(16))
    assert len(tasks) == 12 * 2 + 4
    assert tasks[0].records == max(t.records for t in tasks)
    # The 12 full pieces fill 12 slots; the 12 remainders top up the 4 slots with a half
    # partition, so no slot idles long: within 1% of the ideal (equal halves gave 1.126x).
    makespan = list_schedule_makespan(tasks, 16)
    assert makespan < 1.01 * total / 16
    assert makespan <= list_schedule_makespan(sorted(ranges, key=lambda x: -x.records), 16)


@pytest.mark.parametrize("slots", [2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64])
def test_seed_000_on_any_number_of_slots(slots: int) -> None:
    """Pieces of total / slots alone drain seed 000 in 1.35x the ideal on 24 slots (their
    remainders pile up on the slots freed first); the planner's finer cut keeps it near 1x.
    On 3 slots no piece is worth cutting: largest-first on whole partitions gives 1.08x."""
    ranges = [r(p, 0, lag) for p, lag in enumerate(SEED_000_LAG)]
    ideal = sum(SEED_000_LAG) / slots

    tasks = plan_tasks(ranges, slots)

    assert list_schedule_makespan(tasks, slots) / ideal < (1.08 if slots == 3 else 1.03)


def test_seed_000_with_one_partition_of_large_records() -> None:
    """One partition of 800 KB records among 100 B ones: it is the one split finest."""
    ranges = [r(p, 0, lag) for p, lag in enumerate(SEED_000_LAG)]
    sizes = {("t", p): 100.0 for p in range(24)} | {("t", 12): 800_000.0}

    tasks = plan_tasks(ranges, 16, sizes)

    weights = [t.records * Fraction(sizes[t.key]) for t in tasks]
    total = sum(lag * Fraction(sizes[("t", p)]) for p, lag in enumerate(SEED_000_LAG))
    assert max(weights) < total / 16 + 800_000
    assert weights == sorted(weights, reverse=True)
    assert sum(t.partition == 12 for t in tasks) == 16
    assert all(t.partition == 12 for t in tasks[:16])


@st.composite
def plans(draw: st.DrawFn) -> tuple[list[OffsetRange], int, dict[tuple[str, int], float], int]:
    keys = draw(
        st.lists(
            st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 40)),
            unique=True,
            max_size=30,
        )
    )
    ranges = []
    for topic, partition in keys:
        start = draw(st.integers(0, 10**9))
        ranges.append(OffsetRange(topic, partition, start, start + draw(st.integers(0, 10**5))))
    sized = draw(st.lists(st.sampled_from(keys), unique=True)) if keys else []
    sizes = {key: draw(st.floats(0.5, 1e6)) for key in sized}
    return ranges, draw(st.integers(1, 64)), sizes, draw(st.integers(1, 5000))


@given(plans())
def test_plan_tasks_properties(
    plan: tuple[list[OffsetRange], int, dict[tuple[str, int], float], int],
) -> None:
    ranges, slots, bytes_per_record, min_task_records = plan

    tasks = plan_tasks(ranges, slots, bytes_per_record, min_task_records)

    by_key: defaultdict[tuple[str, int], list[OffsetRange]] = defaultdict(list)
    for task in tasks:
        by_key[task.key].append(task)
    work = {x.key: x for x in ranges if x.records > 0}
    assert by_key.keys() == work.keys()
    for key, pieces in by_key.items():
        pieces.sort()
        offsets = [work[key].start] + [p.end for p in pieces]
        assert [p.start for p in pieces] == offsets[:-1], "pieces are contiguous and disjoint"
        assert offsets[-1] == work[key].end, "pieces cover the range"
        assert all(p.records > 0 for p in pieces)
        assert len({p.records for p in pieces[:-1]}) <= 1, "all but the last have one size"
        if len(pieces) > 1:
            assert pieces[-1].records >= min_task_records, "a short remainder was merged"
            assert pieces[-1].records < pieces[0].records + min_task_records

    sizes = record_sizes(work, bytes_per_record)
    target = sum((x.records * sizes[x.key] for x in work.values()), Fraction(0)) / slots
    for task in tasks:
        weight = task.records * sizes[task.key]
        min_task_sized = task.records < 2 * min_task_records
        assert weight < target + min_task_records * sizes[task.key] or min_task_sized
    weights = [float(t.records * sizes[t.key]) for t in tasks]
    largest_record = float(max(sizes.values(), default=0))
    bound = 1.01 * (1.25 * float(target) + 2 * min_task_records * largest_record)
    assert weighted_makespan(weights, slots) <= bound * (1 + 1e-9)
    assert len(tasks) < 4 * slots + len(work) or not tasks

    order = [(-t.records * sizes[t.key], t.topic, t.partition, t.start) for t in tasks]
    assert order == sorted(order)


CAPPED_CASES = [
    (
        "maxRecordsPerPartition cuts a range into near-equal pieces",
        [r(0, 0, 10)],
        1,
        1,
        4,
        [r(0, 0, 4), r(0, 4, 7), r(0, 7, 10)],
    ),
    (
        "minPartitions halves the heaviest task until there are enough",
        [r(0, 0, 8), r(1, 0, 2)],
        1,
        4,
        None,
        [r(0, 4, 8), r(0, 0, 2), r(0, 2, 4), r(1, 0, 2)],
    ),
    (
        "minPartitions above the record count: one record per task",
        [r(0, 0, 3)],
        1,
        10,
        None,
        [r(0, 0, 1), r(0, 1, 2), r(0, 2, 3)],
    ),
    ("both off: the plan of plan_tasks without them", [r(0, 0, 10)], 3, 1, None, None),
]


@pytest.mark.parametrize(
    ("ranges", "slots", "min_tasks", "max_task_records", "expected"),
    [case[1:] for case in CAPPED_CASES],
    ids=[case[0] for case in CAPPED_CASES],
)
def test_plan_tasks_caps_table(
    ranges: list[OffsetRange],
    slots: int,
    min_tasks: int,
    max_task_records: int | None,
    expected: list[OffsetRange] | None,
) -> None:
    tasks = plan_tasks(ranges, slots, min_tasks=min_tasks, max_task_records=max_task_records)
    assert tasks == (expected if expected is not None else plan_tasks(ranges, slots))


@pytest.mark.parametrize(
    ("min_tasks", "max_task_records", "message"),
    [(0, None, "min_tasks"), (1, 0, "max_task_records")],
)
def test_plan_tasks_rejects_bad_caps(
    min_tasks: int, max_task_records: int | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        plan_tasks([r(0, 0, 10)], 1, min_tasks=min_tasks, max_task_records=max_task_records)


@settings(deadline=None)
@given(plans(), st.integers(1, 200), st.one_of(st.none(), st.integers(20, 10**5)))
def test_plan_tasks_caps_properties(
    plan: tuple[list[OffsetRange], int, dict[tuple[str, int], float], int],
    min_tasks: int,
    max_task_records: int | None,
) -> None:
    ranges, slots, bytes_per_record, min_task_records = plan

    tasks = plan_tasks(
        ranges, slots, bytes_per_record, min_task_records, min_tasks, max_task_records
    )

    work = {x.key: x for x in ranges if x.records > 0}
    by_key: defaultdict[tuple[str, int], list[OffsetRange]] = defaultdict(list)
    for task in tasks:
        by_key[task.key].append(task)
    assert by_key.keys() == work.keys()
    for key, pieces in by_key.items():
        pieces.sort()
        offsets = [work[key].start] + [p.end for p in pieces]
        assert [p.start for p in pieces] == offsets[:-1], "pieces are contiguous and disjoint"
        assert offsets[-1] == work[key].end, "pieces cover the range"
        assert all(p.records > 0 for p in pieces)
    total_records = sum(x.records for x in work.values())
    if max_task_records is not None:
        assert all(t.records <= max_task_records for t in tasks)
    assert len(tasks) >= min(min_tasks, total_records)
    per_max = total_records / max_task_records if max_task_records else 0
    assert len(tasks) < max(4 * slots + len(work) + per_max, min_tasks + 1) or not tasks

    sizes = record_sizes(work, bytes_per_record)
    target = sum((x.records * sizes[x.key] for x in work.values()), Fraction(0)) / slots
    for task in tasks:
        weight = task.records * sizes[task.key]
        min_task_sized = task.records < 2 * min_task_records
        assert weight < target + min_task_records * sizes[task.key] or min_task_sized
    weights = [float(t.records * sizes[t.key]) for t in tasks]
    assert weighted_makespan(weights, slots) <= (float(target) + max(weights, default=0)) * (
        1 + 1e-9
    )
    order = [(-t.records * sizes[t.key], t.topic, t.partition, t.start) for t in tasks]
    assert order == sorted(order)


def test_an_import_starts_no_range_for_a_remainder_of_a_few_records() -> None:
    """The small first batch of a 30M-record import on Tansu (4 slots on 2 cores): four
    partitions of ~79.5k records, three of whose records weigh a little more than the mean;
    with pieces of any size, three remainders of 375 records each started a fetch at a new
    offset (packed into one task, they held the batch for 2.4 s). lagless import plans with
    MIN_TASK_RECORDS, so a remainder that small joins its piece."""
    from lagless.importer.plan import source_options
    from lagless.importer.spec import MIN_TASK_RECORDS, ImportSpec
    from lagless.kafka.config import KafkaConfig
    from tests.harness.plans import offline_plan

    ranges = [OffsetRange("bench", p, 0, 79513 if p < 3 else 79512) for p in range(4)]
    sizes = {("bench", 0): 105.0, **{("bench", p): 105.5 for p in (1, 2, 3)}}

    any_size = plan_tasks(ranges, 4, sizes)
    assert min(piece.records for piece in any_size) < 1000  # what the import used to run
    planned = plan_tasks(ranges, 4, sizes, min_task_records=MIN_TASK_RECORDS)
    assert sorted(planned) == sorted(ranges)  # a piece per partition, nothing cut off
    options = ImportSpec(KafkaConfig("127.0.0.1:9"), ("t",), "parquet:///lake", "/tmp/c")
    source_options = source_options(offline_plan(options), slots=2)
    assert source_options["minTaskRecords"] == str(MIN_TASK_RECORDS)

"""limit_batch: how far one micro-batch reads under record and byte limits."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lagless.planner import fewest_partitions, limit_batch, record_sizes

Key = tuple[str, int]
A, B, C = ("t", 0), ("t", 1), ("t", 2)


CASES = [
    ("no limit: up to latest", {A: 0, B: 5}, {A: 100, B: 10}, None, None, {}, {A: 100, B: 10}),
    ("limit above the backlog", {A: 0, B: 5}, {A: 100, B: 10}, 500, None, {}, {A: 100, B: 10}),
    ("nothing to read", {A: 7, B: 9}, {A: 7, B: 9}, 1, None, {}, {A: 7, B: 9}),
    ("nothing to read needs no size estimate", {A: 7}, {A: 7}, None, 10, {}, {A: 7}),
    (
        "shared in proportion to backlog",
        {A: 0, B: 0, C: 50},
        {A: 300, B: 100, C: 50},
        40,
        None,
        {},
        {A: 30, B: 10, C: 50},
    ),
    (
        "records left by rounding down go to the largest remainders",
        {A: 0, B: 0, C: 0},
        {A: 1, B: 6, C: 3},
        3,
        None,
        {},
        {A: 0, B: 2, C: 1},
    ),
    (
        "equal remainders: ties go by partition",
        {A: 0, B: 0, C: 0},
        {A: 5, B: 3, C: 2},
        5,
        None,
        {},
        {A: 3, B: 1, C: 1},
    ),
    (
        "a limit below the number of partitions still reads it all",
        {A: 0, B: 0, C: 0},
        {A: 10, B: 10, C: 10},
        2,
        None,
        {},
        {A: 1, B: 1, C: 0},
    ),
    (
        "bytes: the same share of every backlog, whatever its record size",
        {A: 0, B: 0},
        {A: 100, B: 10_000},
        None,
        1_620_000,
        {A: 800_000.0, B: 100.0},
        {A: 2, B: 200},
    ),
    (
        "bytes below one record's size: one record, so the query moves",
        {A: 0, B: 0},
        {A: 3, B: 2},
        None,
        10,
        {A: 800_000.0, B: 800_000.0},
        {A: 1, B: 0},
    ),
    (
        "the tighter of the two limits wins",
        {A: 0, B: 0},
        {A: 1000, B: 1000},
        100,
        1000,
        {A: 10.0, B: 10.0},
        {A: 50, B: 50},
    ),
    (
        "a partition without an estimate counts as the mean",
        {A: 0, B: 0, C: 0},
        {A: 100, B: 100, C: 100},
        None,
        600,
        {A: 10.0, B: 30.0},
        {A: 10, B: 10, C: 10},
    ),
]


@pytest.mark.parametrize(
    ("start", "latest", "max_records", "max_bytes", "bytes_per_record", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_limit_batch_table(
    start: dict[Key, int],
    latest: dict[Key, int],
    max_records: int | None,
    max_bytes: int | None,
    bytes_per_record: dict[Key, float],
    expected: dict[Key, int],
) -> None:
    assert limit_batch(start, latest, max_records, max_bytes, bytes_per_record or None) == expected


@pytest.mark.parametrize(
    ("start", "latest", "max_records", "max_bytes", "bytes_per_record", "message"),
    [
        ({A: 0}, {A: 5, B: 5}, None, None, None, "different partitions"),
        ({A: 0, B: 0}, {A: 5}, None, None, None, "different partitions"),
        ({A: 6}, {A: 5}, None, None, None, "before start"),
        ({A: 0}, {A: 5}, 0, None, None, "max_records"),
        ({A: 0}, {A: 5}, None, 0, {A: 1.0}, "max_bytes"),
        ({A: 0}, {A: 5}, None, 100, None, "needs bytes_per_record"),
        ({A: 0}, {A: 5}, None, 100, {A: -1.0}, "positive"),
    ],
)
def test_limit_batch_rejects(
    start: dict[Key, int],
    latest: dict[Key, int],
    max_records: int | None,
    max_bytes: int | None,
    bytes_per_record: dict[Key, float] | None,
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        limit_batch(start, latest, max_records, max_bytes, bytes_per_record)


@st.composite
def batches(
    draw: st.DrawFn,
) -> tuple[dict[Key, int], dict[Key, int], int | None, int | None, dict[Key, float]]:
    keys = draw(st.lists(st.tuples(st.just("t"), st.integers(0, 40)), unique=True, max_size=30))
    start = {key: draw(st.integers(0, 10**12)) for key in keys}
    latest = {key: offset + draw(st.integers(0, 10**6)) for key, offset in start.items()}
    max_records = draw(st.none() | st.integers(1, 10**6))
    sized = draw(st.sets(st.sampled_from(keys))) if keys else set()
    sizes = {key: draw(st.floats(0.5, 1e6)) for key in sized}
    max_bytes = draw(st.none() | st.integers(1, 10**9)) if sizes else None
    return start, latest, max_records, max_bytes, sizes


@given(batches())
def test_limit_batch_properties(
    batch: tuple[dict[Key, int], dict[Key, int], int | None, int | None, dict[Key, float]],
) -> None:
    start, latest, max_records, max_bytes, bytes_per_record = batch

    end = limit_batch(start, latest, max_records, max_bytes, bytes_per_record)

    assert end.keys() == start.keys()
    assert all(start[key] <= end[key] <= latest[key] for key in end)
    taken = {key: end[key] - start[key] for key in end}
    available = sum(latest[key] - start[key] for key in end)
    total = sum(taken.values())
    assert total >= min(1, available), "a batch makes progress"
    if max_records is not None:
        assert total <= max_records
    if max_bytes is not None:
        sizes = record_sizes(end, bytes_per_record)
        assert sum(n * sizes[key] for key, n in taken.items()) <= max_bytes or total == 1
    else:
        limit = available if max_records is None else min(max_records, available)
        assert total == limit
        for key, n in taken.items():
            assert abs(n - Fraction(limit * (latest[key] - start[key]), available or 1)) < 1


@given(batches(), st.integers(1, 10**6))
def test_limit_batch_reads_more_under_a_larger_limit(
    batch: tuple[dict[Key, int], dict[Key, int], int | None, int | None, dict[Key, float]],
    more: int,
) -> None:
    start, latest, max_records, max_bytes, bytes_per_record = batch

    def batch_records(limit: int | None) -> int:
        end = limit_batch(start, latest, limit, max_bytes, bytes_per_record)
        return sum(end[key] - start[key] for key in end)

    smaller = batch_records(max_records)
    assert batch_records(None if max_records is None else max_records + more) >= smaller


@given(
    st.lists(st.integers(0, 100), min_size=1, max_size=8),
    st.integers(1, 50),
)
def test_successive_batches_advance_to_latest(backlogs: list[int], max_records: int) -> None:
    latest = {("t", p): 1000 + n for p, n in enumerate(backlogs)}
    position = {key: 1000 for key in latest}
    batches = 0
    while position != latest:
        end = limit_batch(position, latest, max_records)
        assert all(end[key] >= position[key] for key in end)
        position = end
        batches += 1
    assert batches == math.ceil(sum(backlogs) / max_records)


@given(st.lists(st.integers(0, 5), min_size=1, max_size=8), st.integers(1, 10**6))
def test_a_tiny_byte_limit_still_drains_the_backlog(backlogs: list[int], max_bytes: int) -> None:
    latest = {("t", p): n for p, n in enumerate(backlogs)}
    sizes = {key: 10.0**7 for key in latest}
    position = dict.fromkeys(latest, 0)
    for _ in range(sum(backlogs)):
        position = limit_batch(position, latest, max_bytes=max_bytes, bytes_per_record=sizes)
    assert position == latest


def test_a_driver_sink_gets_smaller_default_batches_than_an_executor_sink() -> None:
    """SQLite collects a batch of JSON values on the driver; Parquet streams it from the
    executors, and so does SQLite for raw values unless told to write from the driver."""
    from lagless.importer.plan import source_options
    from lagless.importer.spec import ImportSpec
    from lagless.kafka.config import KafkaConfig
    from tests.harness.plans import offline_plan

    def default_batch_bytes(sink_url: str, **limits: Any) -> str | None:
        spec = ImportSpec(KafkaConfig("127.0.0.1:9"), ("t",), sink_url, "/tmp/ckpt", **limits)
        return source_options(offline_plan(spec), slots=4).get("maxBytesPerBatch")

    on_driver = default_batch_bytes("sqlite:///x.db", value_format="json")
    on_executors = default_batch_bytes("parquet:///lake")
    assert on_driver is not None and on_executors is not None
    assert int(on_driver) < int(on_executors)
    assert default_batch_bytes("sqlite:///x.db") == on_executors
    assert default_batch_bytes("sqlite:///x.db?write_from=driver") == on_driver
    assert default_batch_bytes("parquet:///lake", max_bytes_per_batch=1000) == "1000"
    assert default_batch_bytes("parquet:///lake", max_records_per_batch=10) is None


def test_every_sink_starts_with_a_small_first_batch() -> None:
    """Rows show soon after the start, whatever the store; the batches after are large."""
    from lagless.importer.plan import source_options
    from lagless.importer.spec import ImportSpec
    from lagless.kafka.config import KafkaConfig
    from tests.harness.plans import offline_plan

    for sink_url in ("sqlite:///x.db", "parquet:///lake", "delta:///lake"):
        spec = ImportSpec(KafkaConfig("127.0.0.1:9"), ("t",), sink_url, "/tmp/ckpt")
        options = source_options(offline_plan(spec), slots=4)
        assert int(options["firstBatchMaxBytes"]) < int(options["maxBytesPerBatch"]), sink_url


@given(batches(), st.integers(1, 40))
def test_the_first_batch_reads_from_the_partitions_with_most_left(
    batch: tuple[dict[Key, int], dict[Key, int], int | None, int | None, dict[Key, float]],
    count: int,
) -> None:
    start, latest, *_ = batch

    end = fewest_partitions(start, latest, count)

    assert end.keys() == start.keys()
    moved = {key for key in end if end[key] != start[key]}
    assert all(end[key] == latest[key] for key in moved), "a chosen partition keeps its latest"
    left = {key: latest[key] - start[key] for key in start}
    assert len(moved) == min(count, sum(1 for n in left.values() if n > 0))
    if moved:
        assert min(left[key] for key in moved) >= max(
            (left[key] for key in start if key not in moved), default=0
        ), "none left out has more records left than one chosen"


def test_the_first_batch_chooses_by_records_left_then_by_partition() -> None:
    start = {A: 0, B: 10, C: 0}
    latest = {A: 50, B: 60, C: 40}

    assert fewest_partitions(start, latest, 1) == {A: 50, B: 10, C: 0}
    assert fewest_partitions(start, latest, 2) == {A: 50, B: 60, C: 0}
    with pytest.raises(ValueError, match="count must be at least 1"):
        fewest_partitions(start, latest, 0)

"""Profiles of test data: shapes, scaling, the embedded broker's size limit, bad input."""

from __future__ import annotations

import pytest

from lagless.exceptions import BadInput
from lagless.gen.produce import POISON_KINDS, poison_positions
from lagless.gen.profiles import (
    LARGE_RECORD_BYTES,
    PARTITION_BYTES_LIMIT,
    SEED_002_LARGE,
    Profile,
    build_profile,
    explicit,
    parse_counts,
    seed_000,
    seed_002,
    uniform,
)


def test_seed_000_has_the_shape_of_the_lag_table() -> None:
    profile = seed_000()
    assert profile.partitions == 24
    full, half, empty = profile.counts[:12], profile.counts[12:16], profile.counts[16:]
    assert all(9_200 <= count <= 9_600 for count in full)
    assert all(5_300 <= count <= 5_500 for count in half)
    assert empty == (0,) * 8
    # ~1 MB of 100 B values in a full partition
    assert 0.9e6 <= max(full) * profile.record_bytes[0] <= 1.1e6


def test_scale_multiplies_counts_and_keeps_empty_partitions_empty() -> None:
    base, doubled = seed_000(), seed_000(scale=2.0)
    assert doubled.counts[0] == 2 * base.counts[0]
    assert doubled.counts[16:] == (0,) * 8
    assert doubled.total_records == pytest.approx(2 * base.total_records, abs=24)


def test_a_tiny_scale_keeps_every_non_empty_partition_non_empty() -> None:
    tiny = seed_000(scale=1e-9)
    assert tiny.counts == (1,) * 16 + (0,) * 8


def test_seed_002_mixes_large_small_and_empty_partitions() -> None:
    profile = seed_002()
    assert profile.partitions == 24
    large = [p for p, size in enumerate(profile.record_bytes) if size == LARGE_RECORD_BYTES]
    assert large == list(SEED_002_LARGE)
    assert 0 in profile.counts
    assert all(profile.counts[p] > 0 for p in large)
    profile.check_fits("none")


def test_uniform_gives_every_partition_the_same_count() -> None:
    profile = uniform(6, scale=0.5, record_bytes=200)
    assert profile.counts == (5_000,) * 6
    assert profile.record_bytes == (200,) * 6


def test_build_profile_uses_partitions_only_for_uniform() -> None:
    assert build_profile("uniform", partitions=3).partitions == 3
    assert build_profile("seed-000", partitions=3).partitions == 24


def test_parse_counts_reads_one_count_per_partition() -> None:
    assert parse_counts("100, 200,0,50") == (100, 200, 0, 50)
    assert explicit(parse_counts("7")).counts == (7,)


@pytest.mark.parametrize("text", ["", "1,,2", "a,b", "1,-2", "1.5"])
def test_parse_counts_rejects_bad_lists(text: str) -> None:
    with pytest.raises(BadInput):
        parse_counts(text)


@pytest.mark.parametrize(
    "make",
    [
        lambda: seed_000(scale=0),
        lambda: seed_002(scale=-1),
        lambda: uniform(0),
        lambda: build_profile("nope", partitions=1),
        lambda: build_profile("uniform", partitions=1, record_bytes=0),
        lambda: Profile("x", (), ()),
        lambda: Profile("x", (1, 2), (100,)),
    ],
)
def test_bad_profiles_are_bad_input(make: object) -> None:
    with pytest.raises(BadInput):
        make()  # type: ignore[operator]


def test_a_profile_too_big_for_a_partition_is_refused_unless_compressed() -> None:
    big = seed_000(record_bytes=1_000)  # ~9.5 MB in a full partition
    with pytest.raises(BadInput, match=r"partition 5 .*--compression lz4"):
        big.check_fits("none")
    big.check_fits("lz4")
    big.check_fits("zstd")


def test_compression_allows_more_but_not_without_bound() -> None:
    count = PARTITION_BYTES_LIMIT // 100
    with pytest.raises(BadInput):
        explicit([count]).check_fits("none")
    explicit([count]).check_fits("lz4")
    with pytest.raises(BadInput, match="smaller --scale"):
        explicit([count * 10]).check_fits("lz4")


def test_an_unknown_compression_is_bad_input() -> None:
    with pytest.raises(BadInput, match="gzip"):
        explicit([1]).check_fits("gzip")


def test_poison_positions_are_an_exact_evenly_spread_share_cycling_kinds() -> None:
    positions = poison_positions(1_000, 0.1)
    assert len(positions) == 100
    assert sorted(positions)[:3] == [0, 10, 20]
    assert [positions[p] for p in sorted(positions)[:6]] == list(POISON_KINDS) * 2
    assert len(poison_positions(7, 1.0)) == 7
    assert poison_positions(1_000, 0.0) == {}


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_a_poison_share_outside_0_1_is_bad_input(share: float) -> None:
    with pytest.raises(BadInput):
        poison_positions(10, share)

"""maintenance.plan: which small files compaction merges. Property-tested: it never touches a
file at the target, never merges past it, and, applied as an import applies it (a round after
each batch), keeps the small files few at a bounded rewrite cost."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lagless.sinks.maintenance import MOST_SMALL_FILES, DataFile, Round, parse_size, plan

TARGET = 128 * 1024 * 1024
sizes = st.lists(st.integers(min_value=1, max_value=2 * TARGET), max_size=60)


def files_of(found: list[int]) -> list[DataFile]:
    return [DataFile(f"f{n}", size) for n, size in enumerate(found)]


def merged(files: list[DataFile], groups: list[list[DataFile]], name: str) -> list[DataFile]:
    """The table after a round: each group replaced by one file of its bytes, where its
    first file was."""
    gone = {f.path for g in groups for f in g}
    firsts = {
        g[0].path: DataFile(f"{name}-{n}", sum(f.size for f in g)) for n, g in enumerate(groups)
    }
    return [firsts.get(f.path, f) for f in files if f.path not in gone or f.path in firsts]


@given(sizes, st.booleans())
def test_groups_are_disjoint_small_files_of_at_most_the_target(found, thorough):
    files = files_of(found)
    groups = plan(files, TARGET, thorough)

    names = [f.path for g in groups for f in g]
    assert len(names) == len(set(names))
    assert set(names) <= {f.path for f in files}
    for group in groups:
        assert len(group) >= 2
        assert all(f.size < TARGET for f in group)
        assert sum(f.size for f in group) <= TARGET


@given(sizes)
def test_rounds_until_nothing_is_planned_leave_few_small_files_and_every_byte(found):
    files = files_of(found)
    for round_number in range(100):
        groups = plan(files, TARGET)
        if not groups:
            break
        files = merged(files, groups, f"r{round_number}")
    else:
        pytest.fail("plan never settled")
    assert sum(f.size for f in files) == sum(found)
    assert sum(f.size < TARGET for f in files) <= MOST_SMALL_FILES


@given(sizes)
def test_thorough_leaves_at_most_one_small_file_per_target_of_small_bytes_plus_one(found):
    files = files_of(found)
    groups = plan(files, TARGET, thorough=True)
    after = merged(files, groups, "m")
    small = [f.size for f in after if f.size < TARGET]
    # Packed in order, a bin closes when the next file would overflow it: two adjacent bins
    # together always exceed the target.
    assert len(small) <= 2 * sum(small) // TARGET + 1


def test_a_day_of_small_batches_keeps_few_files_at_a_few_rewrites_per_byte():
    """A continuous import's files (47 KB a batch, a round every 20 batches: every 10 s at
    lagless's half-second trigger): the small files stay under the goal (live bytes / target
    + 16) and each byte is rewritten a few times on its way up."""
    files: list[DataFile] = []
    written = rewritten = 0
    most = 0
    for batch in range(6000):
        files.append(DataFile(f"b{batch}", 47_000))
        written += 47_000
        most = max(most, len(files) - written // TARGET)
        if batch % 20:
            continue
        groups = plan(files, TARGET)
        rewritten += sum(f.size for g in groups for f in g)
        files = merged(files, groups, f"c{batch}")
    assert most <= 16 + 20
    assert rewritten / written <= 8  # log4(128 MiB / 8 MiB) tiers, and 8 MiB merged whole


def test_a_table_below_a_sixteenth_of_the_target_is_kept_one_file():
    files = files_of([300_000] + [47_000] * 5)
    groups = plan(files, TARGET)
    assert [len(g) for g in groups] == [6]
    big = files_of([TARGET // 16] + [47_000] * 5)
    assert [len(g) for g in plan(big, TARGET)] == [5]  # the tier of 47 KB files only


def test_sizes_read_with_units():
    assert parse_size("128M") == parse_size("128MiB") == parse_size("128mb") == 128 * 1024**2
    assert parse_size("4096") == 4096
    assert parse_size("1.5G") == int(1.5 * 1024**3)
    for wrong in ("12Q", "", "100", "-5M"):
        with pytest.raises(ValueError):
            parse_size(wrong)


def test_a_round_says_what_it_did_in_one_line():
    done = Round("orders", compacted_files=12, written_files=2, rewritten_bytes=3_100_000)
    done.expired_versions, done.removed_files, done.removed_bytes = 40, 35, 12_000_000
    done.seconds = 0.41
    assert done.text() == (
        "orders: 12 files compacted into 2 (3.1 MB), 40 versions expired, 35 files removed "
        "(12.0 MB) in 0.41 s"
    )
    assert Round("idle").text() == "idle: nothing to do in 0.00 s"
